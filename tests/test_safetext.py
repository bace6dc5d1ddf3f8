"""Untrusted text is shown as text: no escape sequence reaches the terminal, no markup is parsed."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpudoctor.safetext import as_text, visible


@pytest.mark.parametrize("hostile, shown", [
    ("\x1b]0;owned\x07title", "\\x1b]0;owned\\x07title"),                # OSC window title
    ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),               # OSC 52 clipboard write
    ("\x1b]8;;https://evil/\x1b\\click\x1b]8;;\x1b\\", "\\x1b]8;;https://evil/\\x1b\\click\\x1b]8;;\\x1b\\"),
    ("\x1bPq#0;2;0;0;0\x1b\\", "\\x1bPq#0;2;0;0;0\\x1b\\"),              # DCS (sixel)
    ("a\x08\x08b", "a\\x08\\x08b"),                                       # backspaces
    ("\u202eevil\u202c", "\\u202eevil\\u202c"),                           # bidi override
    ("\x9d0;t\x9c", "\\x9d0;t\\x9c"),                                     # 8-bit OSC
])
def test_control_sequences_become_visible(hostile, shown):
    assert visible(hostile) == shown
    assert "\x1b" not in visible(hostile)


def test_colour_sequences_are_removed_and_layout_kept():
    assert visible("\x1b[31;1mRuntimeError\x1b[0m: x\tok\n") == "RuntimeError: x\tok\n"
    assert visible("10%\r50%\r100%\r\ndone") == "10%\n50%\n100%\ndone"


def test_limit_marks_what_was_cut():
    out = visible("x" * 1000, limit=100)
    assert out.startswith("x" * 100) and "900 more characters cut" in out
    assert visible("short", limit=100) == "short"
    # Escaping can lengthen text; the cap still holds.
    assert len(visible("\x07" * 100, limit=50).partition(" …")[0]) == 50


def test_markup_and_emoji_codes_print_literally():
    console = Console(file=io.StringIO(), width=200, color_system=None)
    hostile = "[rank0]: [/] [link=https://evil]x[/link] :warning: [bold]"
    console.print(as_text(hostile))
    assert console.file.getvalue() == hostile + "\n"


def test_linear_on_huge_hostile_input():
    # Unterminated sequences and many ESC bytes: must not backtrack.
    text = ("\x1b[" + "1;" * 40) * 20000 + "\x1b]" * 200000
    out = visible(text)  # linear time: measured in benchmarks/bench_test_limits.py
    assert "\x1b" not in out
