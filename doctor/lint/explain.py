"""`gpudoctor explain GPU003`: a lint rule's own documentation followed by its knowledge-base
entry. gpudoctor.cli calls `show_rule` only for arguments that look like lint codes; what it
writes follows the CLI's output convention (`gpudoctor.output`: --format text|json|md, -o)."""
from __future__ import annotations

import json
import sys
from typing import Any

from gpudoctor.lint.rules import describe


def show_rule(code: str, output: Any) -> int | None:
    """Write the rule and its entry to `output` (a `gpudoctor.output.Output`). Returns the exit
    code, or None when `code` is no lint rule."""
    doc = describe(code)
    if doc is None:
        return None
    from gpudoctor.knowledge import kb
    from gpudoctor.output import Format, emit, emit_text

    try:
        entry = kb.load_entry(doc.rule.kb_id)
    except kb.KnowledgeBaseError as exc:
        sys.stderr.write(f"gpudoctor: the knowledge base is damaged: {exc}\n")
        return 2
    if output.fmt is Format.json:
        from gpudoctor.explain.explanation import Explanation, to_dict

        # `explain ID`'s JSON (the same schema version and fields) plus the rule.
        data = {**to_dict(Explanation((), entry)), "rule": doc.to_dict()}
        emit_text(output, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    elif output.fmt is Format.md:
        emit_text(output, _markdown(doc, entry))
    else:
        emit(output, lambda console: _text(doc, entry, console))
    return 0


_SECTIONS = (("What it finds", "what"), ("Why it breaks", "why"), ("Example", "example"), ("Fix", "fix"),
             ("Fix safety", "fix_safety"), ("Does not fire on", "near_misses"))


def _text(doc: Any, entry: Any, console: Any) -> None:
    from rich.markup import escape
    from rich.rule import Rule

    from gpudoctor.explain.explanation import render_entry

    r = doc.rule
    console.print(Rule(f"[bold]{r.code}[/] {escape(r.name)}: {escape(r.title)}  [dim](gpudoctor lint)[/]", align="left"))
    for label, field in _SECTIONS:
        console.print(f"[bold]{label}[/]")
        console.print(escape(getattr(r, field)), soft_wrap=label in ("Example", "Fix"))
        console.print()
    console.print(f"[dim]Suppress one line with  # gpudoctor: ignore[{r.code}]  ;  "
                  f"knowledge-base entry: {r.kb_id}[/]")
    console.print()
    if entry is not None:
        render_entry(entry, console)


def _markdown(doc: Any, entry: Any) -> str:
    from gpudoctor.explain.explanation import Explanation, render_markdown
    from gpudoctor.reports.markdown import fence

    r = doc.rule
    out = [f"## `{r.code}` {r.name}: {r.title} (gpudoctor lint)", ""]
    for label, field in _SECTIONS:
        text = getattr(r, field)
        out += [f"### {label}", "", fence(text, "cpp" if "cpp" in r.kinds else "python") if field == "example" else text, ""]
    out += [f"Suppress one line with `# gpudoctor: ignore[{r.code}]`; knowledge-base entry: `{r.kb_id}`.", ""]
    if entry is not None:
        out.append(render_markdown(Explanation((), entry)))
    return "\n".join(out).rstrip("\n") + "\n"
