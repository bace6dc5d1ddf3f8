"""`gpudoctor explain` and `gpudoctor list`: the result object and its renderers.

The public JSON shape (schema version EXPLAIN_SCHEMA_VERSION) is

    {"schema_version": "1.0",
     "matches": [{"id", "title", "confidence", "evidence", "captures", "context_only"}, ...],
     "entry": {...the best match's full entry...} | null}

with `matches` best first and empty when nothing known matched. Renderers write to the rich
Console they are given; they decide nothing about exit codes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudoctor.kb import Entry

if TYPE_CHECKING:
    from rich.console import Console

    from gpudoctor.matcher import Match

EXPLAIN_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class Explanation:
    """What explain found: ranked matches for text, or the one entry asked for by id."""

    matches: tuple[Match, ...]
    entry: Entry | None  # the best match's entry, or the entry named by id

    @property
    def best(self) -> Match | None:
        return self.matches[0] if self.matches else None


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "title": entry.title,
        "aliases": list(entry.aliases),
        "what": entry.what,
        "why": list(entry.why),
        "fix": list(entry.fix),
        "patch": entry.patch,
        "patch_lang": entry.patch_lang,
        "applicability": entry.applicability,
        "fix_safety": entry.fix_safety,
        "probes": list(entry.probes),
        "corrections": [{"claim": c.claim, "truth": c.truth} for c in entry.corrections],
        "references": [{"title": r.title, "url": r.url, "seed": r.seed} for r in entry.references],
    }


def to_json(explanation: Explanation) -> str:
    data = {
        "schema_version": EXPLAIN_SCHEMA_VERSION,
        "matches": [m.to_dict() for m in explanation.matches],
        "entry": entry_to_dict(explanation.entry) if explanation.entry else None,
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def list_json(entries: tuple[Entry, ...]) -> str:
    return json.dumps(
        {"schema_version": EXPLAIN_SCHEMA_VERSION,
         "entries": [{"id": e.id, "title": e.title, "aliases": list(e.aliases)} for e in entries]},
        indent=2,
    )


def render_matches(matches: tuple[Match, ...], console: Console) -> None:
    from rich.table import Table

    table = Table(title="Known failures in this text", title_justify="left", expand=False)
    table.add_column("#", justify="right")
    table.add_column("id", style="bold")
    table.add_column("confidence", justify="right")
    table.add_column("evidence", overflow="fold")
    for rank, m in enumerate(matches, 1):
        label = f"{m.confidence:.0%}" + (" (context)" if m.context_only else "")
        table.add_row(str(rank), m.id, label, "\n".join(m.evidence[:3]))
    console.print(table)


def _lexer(name: str):
    """The two lexers patches use, imported directly: looking a lexer up by name loads
    Pygments' whole lexer registry, which costs more start-up than the rest of `explain ID`."""
    if name == "diff":
        from pygments.lexers.diff import DiffLexer

        return DiffLexer()
    if name == "python":
        from pygments.lexers.python import PythonLexer

        return PythonLexer()
    return name


def render_entry(entry: Entry, console: Console, match: Match | None = None) -> None:
    """An entry in full: what, why, fix, patch (highlighted), safety, corrections, references."""
    from rich.markup import escape
    from rich.rule import Rule

    console.print(Rule(f"[bold]{escape(entry.title)}[/]  [dim]({entry.id})[/]", align="left"))
    console.print(escape(entry.what))
    if match is not None:
        found = match.context_lines()
        if found:
            console.print()
            console.print("[bold]In your text[/]")
            for line in found:
                console.print(f"  • {escape(line)}")
    console.print()
    console.print("[bold]Why[/]")
    for cause in entry.why:
        console.print(f"  • {escape(cause)}")
    console.print()
    console.print("[bold]Fix[/]")
    for n, step in enumerate(entry.fix, 1):
        console.print(f"  {n}. {escape(step)}")
    console.print()
    safety = entry.applicability + (f": {entry.fix_safety}" if entry.fix_safety else "")
    console.print(f"[bold]Patch[/] [dim]({escape(safety)})[/]")
    if console.color_system is None:
        # No colour (a pipe, a file, NO_COLOR): highlighting would be thrown away, skip the lexer.
        console.print(escape(entry.patch), soft_wrap=True)
    else:
        from rich.syntax import Syntax

        console.print(Syntax(entry.patch, _lexer(entry.patch_lang), theme="ansi_dark",
                             background_color="default", word_wrap=True))
    if entry.corrections:
        console.print()
        console.print("[bold]Corrections to the field notes[/]")
        for c in entry.corrections:
            console.print(f"  • [dim]Claim:[/] {escape(c.claim)}")
            console.print(f"    [dim]True:[/] {escape(c.truth)}")
    console.print()
    console.print("[bold]References[/]")
    for r in entry.references:
        where = r.url or f"field note {r.seed}"
        console.print(f"  • {escape(r.title)}: {escape(where)}")
    if entry.probes:
        probes = " ".join(f"--probe {p}" for p in entry.probes)
        console.print(f"\n[dim]Check this machine: gpudoctor scan {probes}[/]")
