"""Untrusted text made safe to show: pasted logs, probe output, exception messages, other people's
reports. Everything gpudoctor prints that it did not write itself goes through here.

`visible(text)` removes terminal formatting (CSI sequences such as colours and cursor moves) and
turns every other control character into a visible escape (`\\x1b`, `\\x07`, `\\u202e`), so an OSC
window-title, clipboard (OSC 52) or hyperlink (OSC 8) sequence, a bell, a backspace or a bidi
override is shown as text instead of acting on the terminal. Tabs and newlines stay; a carriage
return becomes a newline (progress bars redraw with it, and a bare CR would let a line overwrite
the one before it). `limit` caps the result, marking what was cut.

`json_text(text)` is for JSON that gpudoctor prints or writes: JSON escapes the C0 controls, but
lets DEL, the C1 controls (U+009B is a one-byte CSI to many terminals) and the bidi and invisible
format characters through raw, so a report viewed with `cat` or `less -r`, or pasted into a
ticket, could act on the terminal or read differently from what it holds. They are written as
`\\uXXXX` escapes, which decode to the same strings: the JSON means exactly what it meant.

`as_text(text)` is the same as a `rich.text.Text`: rich parses neither markup (`[/]`, `[link=…]`,
`[rank0]:`) nor emoji codes (`:warning:`) in a Text, whereas `console.print(str, markup=False)`
still replaces emoji codes.

Standard library only at import; rich is imported by `as_text` alone.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# CSI: ESC [ (or the 8-bit CSI) parameters, intermediates, final byte. Bounded classes with no
# overlap, so matching is linear in the length of the text.
_CSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]{0,64}[ -/]{0,16}[@-~]")
_CRLF = re.compile(r"\r\n?")
# C0 controls except tab and newline, DEL, C1 controls, and the Unicode bidi / invisible-format
# characters that can make text read differently from what it is (Trojan Source, CVE-2021-42574).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e"
                      r"\u2060-\u2064\u2066-\u2069\ufeff]")
CUT_MARK = " …[{n} more characters cut]"


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, limit: int | None = None) -> str:
    """`text` with terminal sequences removed and control characters shown as escapes, at most
    `limit` characters (plus a note of how many were cut)."""
    if not isinstance(text, str):
        text = str(text)
    cut = 0
    if limit is not None and len(text) > limit:
        # Cut before cleaning so that a huge input costs O(limit), then cut again after (escapes
        # make the text longer).
        cut = len(text) - limit
        text = text[:limit]
    if "\x1b" in text or "\x9b" in text:
        text = _CSI.sub("", text)
    if "\r" in text:
        text = _CRLF.sub("\n", text)
    text = _CONTROL.sub(_escape, text)
    if limit is not None and len(text) > limit:
        cut += len(text) - limit
        text = text[:limit]
    return text + CUT_MARK.format(n=cut) if cut else text


# What JSON leaves raw that must not be: DEL, C1, and the bidi / invisible format characters.
_JSON_RAW = re.compile(r"[\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def json_text(text: str) -> str:
    """JSON text with DEL, C1 controls and bidi/format characters written as \\u escapes (valid
    JSON text holds them only inside strings, where the escape means the same character)."""
    if text.isascii():
        return text.replace("\x7f", "\\u007f") if "\x7f" in text else text
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def as_text(text: str, style: str = "", limit: int | None = None) -> "Text":
    """`visible(text)` as a rich Text: printed literally, never parsed as markup or emoji codes."""
    from rich.text import Text

    return Text(visible(text, limit), style=style)
