"""Markdown that untrusted text cannot break out of, for tickets and reports pasted into GitHub or
GitLab: inline code for a value in a sentence or a table cell, a fenced block for output.

Both pick a backtick run longer than any inside the text, so a log line holding ``` cannot close
the block early, and make terminal sequences and control characters visible (`safetext.visible`).
Standard library only.
"""
from __future__ import annotations

from typing import Any

from gpudoctor.safetext import visible


def _longest_backticks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def code_span(text: Any, limit: int = 300) -> str:
    """`text` as inline code on one line, safe in a table cell (pipes escaped, newlines joined)."""
    text = visible(str(text), limit).replace("\n", " ").replace("|", "\\|")
    ticks = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(text: str, lang: str = "") -> str:
    """`text` as a fenced code block (the caller makes untrusted text visible first)."""
    ticks = "`" * max(3, _longest_backticks(text) + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"
