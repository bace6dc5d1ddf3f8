"""Text as people paste it, made into the text the error messages were: what the matcher searches.

Error texts reach `gpudoctor explain` through issue trackers, chats, e-mails and editors, which
change them on the way. Each form below is undone line by line, so that the result has exactly
the lines of the input, each at its own line number, and the evidence can quote the user's own
line (gpudoctor.explain.matcher keeps the original beside the normalised text):

- Markdown quotes: `> ` (or `>`, nested `> > `) before every line of a quoted reply.
- Line-number gutters: `12 | text`, `12: text` or `12  text` from an editor, a CI log viewer or
  a code view, recognised when the numbers count up line by line (in pasted text only: a
  program's log has no gutter, and looking for one in a large log costs time).
- HTML entities: `&quot;`, `&#39;`, `&lt;`, `&gt;`, `&amp;` from text copied out of a web page
  or an e-mail.
- URL encoding: `libtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister` from a search
  link or a tracker's URL, on lines with at least two escapes of spaces and punctuation (never
  a new line).
- Full-width and typographic punctuation from an input method or a word processor: `：（）＂`,
  the ideographic space, curly quotes. Prose in another language around the message stays as it
  is; only these characters, which sources never print, become their ASCII forms.

A message hard-wrapped over several lines (by a terminal, an editor or an e-mail client) is
joined back by `join_wrapped`, for pasted text (gpudoctor.explain.matcher applies it to inputs up to
64 KB): a line that continues the one before it (it starts at the margin with a lower-case
letter, a parenthesis or a quote, and is not a new record such as `pkg.SomeError:`) is appended to
it, the lines it came from are left empty, and the spans say which lines each joined line holds.
A terminal that broke words at a fixed width (most long lines exactly that long) is joined
without a space. Lines that continue with a capital letter are left to the matcher, which joins
them when a message template ends inside a line (gpudoctor.explain.matcher, rule 2).

Each step looks for its marker in the whole chunk first (substring tests at C speed), so a
large log that holds none of them costs a few scans. Standard library only.
"""
from __future__ import annotations

import re

# `> ` quote markers (nested quotes repeat them), at most three spaces before, as Markdown has.
_QUOTED = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+", re.MULTILINE)
_QUOTE_MARKS = ("\n>", "\n >", "\n  >", "\n   >", "\n\t>")  # substring tests: C speed on a large log
# A gutter: a line number, then a bar, a colon or two spaces (one space after a bar).
_GUTTER_SEP = r"(?:[ \t]?[|\u2502\u2503:][ \t]?|[ \t]{2,8}|\t)"
_GUTTER = re.compile(r"^[ \t]{0,8}(\d{1,7})" + _GUTTER_SEP)
_TWO_GUTTERS = re.compile(r"^[ \t]{0,8}\d{1,7}" + _GUTTER_SEP + r"[^\n]*\n[ \t]{0,8}\d{1,7}" + _GUTTER_SEP,
                          re.MULTILINE)
_MIN_GUTTER_RUN = 3
# %20 (space) and the punctuation error messages hold: ! " # $ % & ' ( ) * + , - . / : ; = ? [ ] _ { }
_PERCENT = re.compile(r"%(?:2[0-9A-Fa-f]|3[AaBbDdFf]|5[BbDdFf]|7[BbDd])")
_PERCENT_TWICE = re.compile(_PERCENT.pattern + r"[^\n%]{0,200}" + _PERCENT.pattern)
_PERCENT_LINE = re.compile(r"[^\n]*" + _PERCENT.pattern + r"[^\n]{0,200}?" + _PERCENT.pattern + r"[^\n]*")
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]{2,8});")
_WIDE = re.compile("[\u3000\uff01-\uff5e\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2032\u2033"
                   "\u2010\u2011\u2012\u2013\u2014\u2212\u00a0\u2007\u202f\u200b\ufeff]")
_WIDE_TABLE = {**{chr(c): chr(c - 0xFEE0) for c in range(0xFF01, 0xFF5F)},
               "\u3000": " ", "\u00a0": " ", "\u2007": " ", "\u202f": " ", "\u200b": "", "\ufeff": "",
               "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
               "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
               "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-"}


def normalise(chunk: str, *, pasted: bool = True) -> str:
    """`chunk` with the pasted forms of the module docstring undone, line for line: the result
    has the same number of lines (no newline is added or removed). Gutters are looked for only
    in `pasted` text (a log file written by a program has none)."""
    if chunk[:4].lstrip(" \t")[:1] == ">" or any(mark in chunk for mark in _QUOTE_MARKS):
        chunk = _QUOTED.sub("", chunk)
    if pasted and _TWO_GUTTERS.search(chunk):
        chunk = _strip_gutters(chunk)
    if "%" in chunk and _PERCENT_TWICE.search(chunk):
        chunk = _PERCENT_LINE.sub(lambda m: _PERCENT.sub(lambda e: chr(int(e.group(0)[1:], 16)), m.group(0)), chunk)
    if "&" in chunk and _ENTITY.search(chunk):
        chunk = _unescape(chunk)
    if not chunk.isascii() and _WIDE.search(chunk):
        chunk = _WIDE.sub(lambda m: _WIDE_TABLE[m.group(0)], chunk)
    return chunk


def _unescape(chunk: str) -> str:
    import html

    def one(m: re.Match[str]) -> str:
        text = html.unescape(m.group(0))
        return m.group(0) if "\n" in text or "\r" in text else text  # never a new line

    return _ENTITY.sub(one, chunk)


def _strip_gutters(chunk: str) -> str:
    """Remove line-number gutters from runs of at least `_MIN_GUTTER_RUN` lines whose numbers
    count up by one (a run may skip blank lines, which have no number in some viewers)."""
    lines = chunk.split("\n")
    out = list(lines)
    run: list[tuple[int, int]] = []  # (line index, gutter length)
    last = None
    changed = False

    def flush() -> None:
        nonlocal changed
        if len(run) >= _MIN_GUTTER_RUN:
            for i, width in run:
                out[i] = lines[i][width:]
            changed = True
        run.clear()

    for i, line in enumerate(lines):
        m = _GUTTER.match(line)
        if m is None:
            if line.strip():
                flush()
                last = None
            continue
        n = int(m.group(1))
        if last is not None and n != last + 1:
            flush()
        run.append((i, m.end()))
        last = n
    flush()
    return "\n".join(out) if changed else chunk


_CONTINUES = re.compile(r"[a-z(`'\"]")
# Lines that start a record of their own although they start in lower case: `pkg.mod.SomeError`,
# `path/file.py:12`, `error: ...` / `note: ...` from a compiler, `(pid=12)` / `(Worker pid=12)`
# from Ray.
_NEW_RECORD = re.compile(r"[a-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit)\b|[a-z_][\w.]*\.py[:\"]"
                         r"|[a-z][\w+.\-]*:(?:\s|$)|\([\w ,=.:-]*pid=\d")
_MIN_WRAPPED = 40  # a line shorter than this was not wrapped
_MAX_SOFT_WIDTH = 120  # nor one longer than an editor, a chat or an e-mail client wraps at
_RAGGED = 30  # a terminal's width: a line it wrapped at a word ends at most this far before it
_MAX_JOINED_LINES = 6


def join_wrapped(text: str) -> tuple[str, dict[int, int]]:
    """(text with wrapped lines joined, {line index: how many input lines it now holds}); the
    lines joined into the one before them are left empty, so every line keeps its number."""
    lines = text.split("\n")
    if len(lines) < 2:
        return text, {}
    width = _hard_wrap_width(lines)
    out = list(lines)
    spans: dict[int, int] = {}
    i = 0
    while i < len(lines) - 1:
        head = lines[i].rstrip("\r")
        j = i
        joined = head
        while (j + 1 < len(lines) and j - i + 1 < _MAX_JOINED_LINES
               and _continues(lines[j].rstrip("\r"), lines[j + 1].rstrip("\r"), width)):
            prev, nxt = lines[j].rstrip("\r"), lines[j + 1].rstrip("\r")
            glue = "" if (width and len(prev) == width and prev[-1:].isalnum() and nxt[:1].isalnum()) else " "
            joined = joined.rstrip() + glue + nxt.strip()
            out[j + 1] = ""
            j += 1
        if j > i:
            out[i] = joined
            spans[i] = j - i + 1
        i = j + 1
    return ("\n".join(out), spans) if spans else (text, {})


def _continues(prev: str, nxt: str, width: int | None) -> bool:
    """`nxt` carries on the sentence `prev` was cut in. `prev` must be as long as a wrapped line
    is: near the width a terminal broke lines at, or, where no such width shows, no longer than
    an editor or e-mail client wraps (a 170-character log line was printed whole, and the
    lower-case line after it, `terminate called after throwing ...`, is a record of its own)."""
    n = len(prev.rstrip())
    too_long_or_short = (n > width or n < width - _RAGGED) if width else n > _MAX_SOFT_WIDTH
    if n < _MIN_WRAPPED or too_long_or_short:
        return False
    return nxt[:1] != "" and _CONTINUES.match(nxt) is not None and _NEW_RECORD.match(nxt) is None


def _hard_wrap_width(lines: list[str]) -> int | None:
    """The width a terminal broke lines at: the length most long lines share exactly (at least
    two, and at least half of the lines that long), or None."""
    counts: dict[int, int] = {}
    for line in lines:
        n = len(line.rstrip("\r"))
        if n >= 60:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return None
    width, seen = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    longest = sum(c for n, c in counts.items() if n >= width)
    return width if seen >= 2 and seen * 2 >= longest else None
