"""Markdown that untrusted text cannot break out of: the one module every Markdown renderer uses
(the scan report, the ticket, the diff, `explain`'s page, the fleet report), for text pasted into
GitHub or GitLab.

- `text(s)`: untrusted text as one line of inert Markdown: `<`, `>` and `&` as HTML entities (so
  no tag or entity of the text's own survives, in any renderer), every other character that is
  syntax in running text backslash-escaped (emphasis, code, links and images, table pipes,
  strikethrough, @-mentions, #-references); `start=True` where the text begins a block,
  where `#`, `-`, `>` or `1.` would be syntax too. `cell(s)` is the same for a table cell, which
  must not be empty.
- `code_span(s)`: inline code for an id, a command or a value in a sentence; `table=True` in a
  table, where GitHub needs `\\|` even inside code (outside a table the backslash would show).
- `fence(s, lang)`: a fenced block for output, logs and patches.
- `prose(s)`: the knowledge base's own prose (trusted, written with `code` spans) kept as
  Markdown, with `<` escaped outside code spans so that "<your version>" is not swallowed as an
  HTML tag.

Each makes terminal sequences and control characters visible (`safetext.visible`) and is bounded
by `limit`; code spans and fences use a backtick run longer than any inside the text, so a log
line holding ``` cannot close them early. Standard library only.
"""
from __future__ import annotations

import re
from typing import Any

from gpudoctor.safetext import visible

_ESCAPED = {**{ch: "\\" + ch for ch in "\\`*_[]|~@#"}, "<": "&lt;", ">": "&gt;", "&": "&amp;"}
_BLOCK_START = re.compile(r"^(?:[+=-]|\d+[.)])")  # "#" and ">" are escaped everywhere already
_CODE_SPANS = re.compile(r"(`[^`]*`)")


def _one_line(value: Any, limit: int) -> str:
    return " ".join(visible(str(value), limit).split())


def _longest_backticks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def text(value: Any, limit: int = 2000, *, start: bool = False) -> str:
    """Untrusted text as one line of inert Markdown (module docstring)."""
    line = "".join(_ESCAPED.get(ch, ch) for ch in _one_line(value, limit))
    found = _BLOCK_START.match(line) if start else None
    if found:
        end = found.end()
        line = line[: end - 1] + "\\" + line[end - 1:]
    return line


def cell(value: Any, limit: int = 2000) -> str:
    """`text` for a table cell: never empty, which would shift the row's columns."""
    return text(value, limit) or " "


def code_span(value: Any, limit: int = 300, *, table: bool = False) -> str:
    """`value` as inline code on one line; `table`: inside a table row (pipes escaped)."""
    body = visible(str(value), limit).replace("\n", " ")
    if table:
        body = body.replace("|", "\\|")
    ticks = "`" * (_longest_backticks(body) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def fence(value: str, lang: str = "", limit: int | None = None) -> str:
    """`value` as a fenced code block, made visible first."""
    body = visible(value, limit)
    ticks = "`" * max(3, _longest_backticks(body) + 1)
    return f"{ticks}{lang}\n{body}\n{ticks}"


def prose(value: Any, limit: int = 20000) -> str:
    """The knowledge base's own prose, kept as Markdown on one line, `<` escaped outside code spans."""
    return "".join(part if len(part) > 1 and part.startswith("`") and part.endswith("`") else part.replace("<", "\\<")
                   for part in _CODE_SPANS.split(_one_line(value, limit)))
