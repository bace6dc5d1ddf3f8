"""The patch for the user's own code (gpudoctor.patch builds it), as `explain` and `run` print it:
its JSON shape, and renderers for the terminal and Markdown shared by both.

The shape (`code_patch` in `explain --format json` from schema 1.2, `diagnosis.code_patch` in
`run.json` from schema 1.3; null when no frame of the traceback is the user's code on this
machine):

    {"status": "found" | "no-match" | "no-rules" | "timed-out" | "error",
     "entry": "misaligned-address", "rules": ["GPU004", "GPU009"],
     "root": "." | null, "scope": "project" | "traceback" | null, "files_checked": 12,
     "traceback_files": ["model/attention.py", ...],
     "stops_at": {"file", "line", "code"},          the innermost frame in the user's code
     "note": "...",                                  one sentence when nothing was found
     "no_patch": "..." | null,                       the entry's reason why its fixes are by hand
     "patches": [{"file", "lines": [first, last], "rule", "rule_name",
                  "applicability": "safe" | "unsafe" | "display-only",
                  "message", "fix", "fix_safety", "where",
                  "findings": [{"file", "lines", "message"}, ...],
                  "diff": "unified diff" | null, "files": [...], "command": "gpudoctor lint --fix ..." | null}]}

Every string in it came from the user's files or paths and is printed as text (gpudoctor.safetext,
gpudoctor.reports.markdown), never as markup. Standard library only, plus rich where a console is
given.
"""
from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, Mapping

from gpudoctor.safetext import visible

if TYPE_CHECKING:
    from rich.console import Console

_LINE = 1000  # a line of code or a path as printed
_DIFF = 20_000  # a diff as printed (the JSON keeps it whole)


def _wrapped(console: "Console", label: str, body: str, indent: int = 2, style: str = "") -> None:
    from rich.text import Text

    width = max(20, (console.width or 80) - indent)
    lines: list[str] = []
    for paragraph in visible(body, 4000).split("\n"):
        lines += textwrap.wrap(paragraph, width - len(label), break_long_words=False, break_on_hyphens=False) or [""]
    for i, line in enumerate(lines):
        out = Text(" " * indent)
        out.append(label if i == 0 else " " * len(label), style="bold" if i == 0 and label else "")
        out.append(line, style=style)
        console.print(out, soft_wrap=True)


def _diff_text(console: "Console", diff: str) -> Any:
    from rich.text import Text

    shown = visible(diff.rstrip("\n"), _DIFF)
    if console.color_system is None:
        return Text(shown)
    from pygments.lexers.diff import DiffLexer
    from rich.syntax import Syntax

    text = Syntax(shown, DiffLexer(), theme="ansi_dark", background_color="default").highlight(shown)
    text.rstrip()
    return text


def shows(code_patch: Mapping[str, Any] | None) -> bool:
    """Whether the renderers print anything for it: not for no local frames (None), nor for an
    entry without lint rules (its JSON still says so)."""
    return bool(code_patch) and code_patch.get("status") != "no-rules" and \
        bool(code_patch.get("patches") or code_patch.get("note"))


def render_text(code_patch: Mapping[str, Any] | None, console: "Console") -> bool:
    """The patches (or why there is none) for a terminal; False when there is nothing to print."""
    from rich.text import Text

    if not shows(code_patch):
        return False
    patches = code_patch.get("patches") or []
    if not patches:
        note = code_patch.get("note") or ""
        if note:
            _wrapped(console, "Your code: ", note, 0, style="dim")
        return bool(note)
    by_hand = False
    for n, p in enumerate(patches):
        if n:
            console.print()
        head = Text()
        rule = f"{p.get('rule')} {p.get('rule_name')}, {p.get('applicability')}"
        if p.get("diff"):
            head.append("Patch for ", style="bold")
            head.append(visible(", ".join(p.get("files") or [p.get("file", "")]), _LINE), style="bold")
        else:
            by_hand = True
            head.append("Fix by hand: ", style="bold")
            head.append(visible(f"{p.get('file')}:{(p.get('lines') or [0])[0]}", _LINE), style="bold")
        head.append(f"  ({visible(rule, 200)})", style="dim")
        console.print(head, soft_wrap=True)
        if p.get("where"):
            _wrapped(console, "", p["where"])
        if p.get("diff"):
            console.print(_diff_text(console, p["diff"]), soft_wrap=True)
            console.print(Text("  Apply it: ", style="bold") + Text(visible(p.get("command") or "", _LINE)),
                          soft_wrap=True)
            if p.get("applicability") == "unsafe" and p.get("fix_safety"):
                _wrapped(console, "", p["fix_safety"], style="dim")
        else:
            _wrapped(console, "", p.get("message") or "")
            _wrapped(console, "Change: ", p.get("fix") or "")
    if by_hand and code_patch.get("no_patch"):
        _wrapped(console, "No edit is made: ", code_patch["no_patch"], 2, style="dim")
    return True


def render_markdown(code_patch: Mapping[str, Any] | None, heading: str = "###") -> list[str]:
    """The same as Markdown lines (empty when there is nothing to say)."""
    from gpudoctor.reports import markdown as md

    if not shows(code_patch):
        return []
    patches = code_patch.get("patches") or []
    if not patches:
        return [f"**Your code:** {md.text(code_patch.get('note') or '')}"] if code_patch.get("note") else []
    out: list[str] = []
    by_hand = False
    for p in patches:
        rule = f"{md.code_span(p.get('rule'), 20)} {md.text(p.get('rule_name'), 80)}, {md.text(p.get('applicability'), 20)}"
        if p.get("diff"):
            files = ", ".join(md.code_span(f, _LINE) for f in p.get("files") or [p.get("file", "")])
            out += [f"{heading} Patch for {files} ({rule})", ""]
        else:
            by_hand = True
            where = md.code_span(f"{p.get('file')}:{(p.get('lines') or [0])[0]}", _LINE)
            out += [f"{heading} Fix by hand: {where} ({rule})", ""]
        if p.get("where"):
            out += [md.text(p["where"]), ""]
        if p.get("diff"):
            out += [md.fence(p["diff"].rstrip("\n"), "diff", _DIFF), "",
                    f"Apply it: {md.code_span(p.get('command') or '', _LINE)}", ""]
            if p.get("applicability") == "unsafe" and p.get("fix_safety"):
                out += [md.text(p["fix_safety"]), ""]
        else:
            out += [md.text(p.get("message") or ""), "", f"Change: {md.text(p.get('fix') or '')}", ""]
    if by_hand and code_patch.get("no_patch"):
        out += [f"No edit is made: {md.text(code_patch['no_patch'])}", ""]
    return out[:-1] if out and out[-1] == "" else out
