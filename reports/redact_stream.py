"""Redaction of a stream: a child program's output, redacted line by line in bounded memory.

`StreamRedactor` (made by `Redactor.stream()`) shares its redactor's pseudonyms and learned values,
so a secret hidden in one line is hidden, as the same placeholder, in every later one.

Standard library only.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpudoctor.reports.redact_rules import _LIMIT, _PEM_END, _PEM_LAST_LINE, _PEM_MARKER

if TYPE_CHECKING:
    from gpudoctor.reports.redact import Redactor

_LINE_END = re.compile(r"\r\n|\n|\r")
_KEY_LABEL = re.compile(r"<private-key(?:-\d+)?>")
_TRAILING_END = re.compile(r"(?:\r\n|\n|\r)\Z")
_NEXT_WORD = re.compile(r"\s{0,64}['\"]?([^\s'\",;]{1,%d})" % _LIMIT)
_CUT_AT = re.compile(r"[\s,;}\])>]")
_PENDING = re.compile(
    r"(?i)(?:(?:password|passwd|passphrase|pwd|pass|secret|token|key|credentials?|cookie|auth|authorization|signature)"
    r"['\"]?\]?[ \t]{0,4}(?::=|=>|[:=])?|bearer|basic|--?[A-Za-z0-9_-]{0,40}(?:token|key|password|passwd|secret))"
    r"[ \t]{0,4}['\"]?\s*\Z"
)


class StreamRedactor:
    """Redacts text that arrives in pieces (a child's stdout) line by line, in bounded memory.

    `feed(text)` returns the redacted complete lines it could finish (lines end in "\\n" or
    "\\r": a progress bar's redraws are lines too); the complete lines of one call are redacted
    together, so feeding 64 KB reads costs about what `Redactor.text` costs on them. `flush()`
    returns the rest. Memory is bounded by `max_line`: a longer line is cut at a separator (a
    space, a comma, a bracket), and a cut right after a secret-like name masks the word that
    follows the cut. A private key block is one placeholder from its BEGIN line to its END line,
    whichever calls they come in; trailing lines that could be the body of a key (at most
    `HELD_LINES`) are held back until the next call shows whether an END follows, so a stream
    that starts inside a key does not leak the key either."""

    HELD_LINES = 200

    def __init__(self, redactor: "Redactor", max_line: int = 1 << 20) -> None:
        self.redactor = redactor
        self.max_line = max(max_line, 256)
        self._parts: list[str] = []
        self._size = 0
        self._in_key = False
        self._key_label: str | None = None  # the placeholder of the key whose body is being dropped
        self._mask_next = False
        self._held: list[str] = []

    def feed(self, text: str) -> str:
        out: list[str] = []
        batch: list[str] = []
        pos = 0
        for m in _LINE_END.finditer(text):
            self._parts.append(text[pos:m.start()])
            line = "".join(self._parts)
            self._parts, self._size = [], 0
            if len(line) > self.max_line:
                self._batch(batch, out)
                batch = []
                line = self._emit_long(line, out)
            batch.append(line + m.group())
            pos = m.end()
        self._batch(batch, out)
        rest = text[pos:]
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if self._size > self.max_line:
                line = self._emit_long("".join(self._parts), out)
                self._parts, self._size = [line], len(line)
        return "".join(out)

    def flush(self) -> str:
        out: list[str] = []
        rest = "".join(self._parts)
        self._parts, self._size = [], 0
        self._batch([self._emit_long(rest, out)] if rest else [], out, final=True)
        return "".join(out)

    def _emit_long(self, line: str, out: list[str]) -> str:
        """Emit the leading pieces of a line longer than max_line; return what is left."""
        while len(line) > self.max_line:
            window = line[: self.max_line]
            cut = self.max_line
            for m in _CUT_AT.finditer(window, self.max_line // 2):
                cut = m.end()
            head, line = line[:cut], line[cut:]
            pending = bool(_PENDING.search(head[-160:]))
            self._batch([head], out, hold=False)
            self._mask_next = pending
        return line

    def _batch(self, lines: list[str], out: list[str], *, final: bool = False, hold: bool = True) -> None:
        if self._in_key:
            for i, line in enumerate(lines):
                m = _PEM_END.search(line)
                if m is not None:
                    self._in_key = False
                    self.redactor.learn_key_lines(lines[:i] + [line[:m.start()]], self._key_label)
                    rest = line[m.end():]
                    lines = ([rest] if rest.strip() else []) + lines[i + 1:]
                    break
            else:
                # All of it is the body of a private key: dropped, and learned as that key, so
                # that a line of it shown alone later is hidden too.
                self.redactor.learn_key_lines(lines, self._key_label)
                return
        lines = self._held + lines
        self._held = []
        if hold and not final:
            k = len(lines)
            while k > 0 and len(lines) - k < self.HELD_LINES and _PEM_LAST_LINE.fullmatch(lines[k - 1].strip() or "-"):
                k -= 1
            lines, self._held = lines[:k], lines[k:]
        chunk = "".join(lines)
        if not chunk:
            return
        last = None
        for m in _PEM_MARKER.finditer(chunk):
            last = m.group(1)
        redacted = self._redact(chunk)
        if last == "BEGIN":
            # The key goes on in the next lines: they are dropped through its END.
            self._in_key = True
            labels = _KEY_LABEL.findall(redacted)
            self._key_label = labels[-1] if labels else None
            ending = _TRAILING_END.search(chunk)
            redacted += ending.group() if ending else ""
        out.append(redacted)

    def _redact(self, text: str) -> str:
        if self._mask_next:
            self._mask_next = False
            m = _NEXT_WORD.match(text)
            if m and m.group(1) and not m.group(1).startswith("<"):
                text = text[:m.start(1)] + self.redactor.pseudonym("secret", m.group(1)) + text[m.end(1):]
        return self.redactor.text(text)
