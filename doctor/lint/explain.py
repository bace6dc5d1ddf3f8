"""`gpudoctor explain GPU003`: a lint rule's own documentation followed by its knowledge-base
entry. gpudoctor.cli calls `show_rule` only for arguments that look like lint codes."""
from __future__ import annotations

import json
import sys

from gpudoctor.lint.rules import describe


def show_rule(code: str, as_json: bool) -> int | None:
    """Print the rule and its entry; the exit code, or None when `code` is no lint rule."""
    doc = describe(code)
    if doc is None:
        return None
    from gpudoctor import kb
    from gpudoctor.explain import entry_to_dict, render_entry

    try:
        entry = kb.load_entry(doc.rule.kb_id)
    except kb.KnowledgeBaseError as exc:
        sys.stderr.write(f"gpudoctor: the knowledge base is damaged: {exc}\n")
        return 2
    if as_json:
        data = {"schema_version": "1.0", "matches": [], "rule": doc.to_dict(),
                "entry": entry_to_dict(entry) if entry else None}
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.rule import Rule

    console = Console(highlight=False)
    r = doc.rule
    console.print(Rule(f"[bold]{r.code}[/] {escape(r.name)}: {escape(r.title)}  [dim](gpudoctor lint)[/]", align="left"))
    for label, text in (("What it finds", r.what), ("Why it breaks", r.why), ("Example", r.example),
                        ("Fix", r.fix), ("Fix safety", r.fix_safety), ("Does not fire on", r.near_misses)):
        console.print(f"[bold]{label}[/]")
        console.print(escape(text), soft_wrap=label in ("Example", "Fix"))
        console.print()
    console.print(f"[dim]Suppress one line with  # gpudoctor: ignore[{r.code}]  ;  "
                  f"knowledge-base entry: {r.kb_id}[/]")
    console.print()
    if entry is not None:
        render_entry(entry, console)
    return 0
