"""Python tracebacks and torch's C++ stack traces, read out of a program's output.

`parse_tracebacks(text)` finds every `Traceback (most recent call last):` block, including blocks
whose lines carry a launcher's prefix (`[rank0]: ` from torchrun, `[default0]:`), and returns its
frames and the exception it ended in. `user_frame(tb)` is the innermost frame in the user's own
code: not in site-packages, dist-packages, the standard library or `<frozen ...>` modules. That is
the line a person reads first, and the line CUDA's asynchronous error reporting gets wrong.

`cpp_operator(text)` names the ATen operator in a C++ stack trace (`TORCH_SHOW_CPP_STACKTRACES=1`
prints one): the innermost `at::_ops::<name>::` frame, written `aten::<name>`.

Bounded: lines are cut at `_MAX_LINE` characters, a traceback keeps at most `_MAX_FRAMES` frames
(its innermost ones), and the exception message at most `_MAX_MESSAGE_LINES` lines. Standard
library only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_MAX_LINE = 2000
_MAX_FRAMES = 200
_MAX_MESSAGE_LINES = 20
_MAX_TRACEBACKS = 64

_ANSI = re.compile(r"\x1b\[[0-?]{0,64}[ -/]{0,16}[@-~]")
# A launcher's per-rank prefix; lines of different ranks interleave, so each rank is read apart.
_PREFIX = re.compile(r"^(\[(?:rank|default)\d{1,6}\]:\s?)")
_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^ {2}File "(?P<file>[^"]{1,1000})", line (?P<line>\d{1,9})(?:, in (?P<func>.{1,300}))?$')
_CARETS = re.compile(r"^\s*[~^]+\s*$")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,200})(?::\s?(?P<message>.*))?$")
_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_OP = re.compile(r"\bat::_ops::(?P<op>[A-Za-z_][A-Za-z0-9_]{0,200})::")
_LIBRARY = re.compile(
    r"(?:[/\\](?:site|dist)-packages[/\\])"
    r"|(?:[/\\]lib[/\\](?:python|pypy)\d(?:\.\d+)?[/\\])"
    r"|(?:[/\\]Lib[/\\])"
    r"|^<frozen "
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str  # the source line as printed, "" when the traceback did not show it

    @property
    def is_library(self) -> bool:
        return bool(_LIBRARY.search(self.file))

    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}


@dataclass(frozen=True)
class Traceback:
    frames: tuple[Frame, ...]
    exception: str  # "RuntimeError: CUDA error: misaligned address"
    message: tuple[str, ...]  # the exception's text, its first line included
    prefix: str = ""  # the launcher prefix its lines carried ("[rank0]: ")
    position: int = 0  # index of the exception's line in the text (orders tracebacks)

    @property
    def exception_type(self) -> str:
        m = _EXCEPTION.match(self.exception)
        return m.group("type") if m else ""

    def to_dict(self) -> dict[str, object]:
        user = user_frame(self)
        return {
            "exception": self.exception,
            "message": list(self.message),
            "prefix": self.prefix,
            "frames": [f.to_dict() for f in self.frames],
            "user_frame": user.to_dict() if user else None,
        }


def _clean_lines(text: str) -> list[str]:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return [line[:_MAX_LINE].rstrip("\r") for line in text.split("\n")]


def _streams(lines: list[str]) -> dict[str, list[tuple[int, str]]]:
    """Lines grouped by launcher prefix (the prefix removed), each with its index in the text."""
    out: dict[str, list[tuple[int, str]]] = {}
    for i, line in enumerate(lines):
        m = _PREFIX.match(line)
        prefix = m.group(1) if m else ""
        out.setdefault(prefix, []).append((i, line[len(prefix):]))
    return out


def _dedent(text: str, indent: int) -> str:
    return text[indent:] if indent and not text[:indent].strip() else text


def _parse_stream(prefix: str, lines: list[tuple[int, str]]) -> list[Traceback]:
    found: list[Traceback] = []
    n = len(lines)
    i = 0
    while i < n:
        start = lines[i][1]
        i += 1
        if start.strip() != _START:
            continue
        indent = len(start) - len(start.lstrip())  # a traceback a logger printed indented
        frames: list[Frame] = []
        while i < n:
            line = _dedent(lines[i][1], indent)
            m = _FRAME.match(line.rstrip())
            if m:
                code = ""
                nxt = _dedent(lines[i + 1][1], indent) if i + 1 < n else ""
                if nxt.startswith("    ") and not _CARETS.match(nxt):
                    code = nxt.strip()
                    i += 1
                frames.append(Frame(m.group("file"), int(m.group("line")), (m.group("func") or "").strip(), code))
                if len(frames) > _MAX_FRAMES:
                    del frames[0]
            elif not (line.startswith("    ") or line.strip().startswith("[Previous line repeated")):
                break  # carets, more source lines of one statement, and repeats are skipped
            i += 1
        if i >= n or not frames:
            continue
        position = lines[i][0]
        first = _dedent(lines[i][1], indent).rstrip()
        if first[:1].isspace() or not _EXCEPTION.match(first):
            continue
        message = [first]
        i += 1
        while i < n and len(message) < _MAX_MESSAGE_LINES:
            text = lines[i][1].rstrip()
            if not text.strip() or text.strip() == _START or text.strip() in _CHAIN:
                break
            message.append(text)
            i += 1
        found.append(Traceback(tuple(frames), first, tuple(message), prefix, position))
    return found


def parse_tracebacks(text: str) -> list[Traceback]:
    """Every Python traceback in `text`, in the order their exceptions appear (at most
    `_MAX_TRACEBACKS`, the last ones)."""
    if "Traceback" not in text:
        return []
    out: list[Traceback] = []
    for prefix, lines in _streams(_clean_lines(text)).items():
        out.extend(_parse_stream(prefix, lines))
    out.sort(key=lambda tb: tb.position)
    return out[-_MAX_TRACEBACKS:]


def user_frame(tb: Traceback) -> Frame | None:
    """The innermost frame in the user's code; the innermost frame of all when every frame is in a
    library (a failure inside `python -m pkg`)."""
    for frame in reversed(tb.frames):
        if not frame.is_library:
            return frame
    return tb.frames[-1] if tb.frames else None


def failing_traceback(tracebacks: list[Traceback], hints: tuple[str, ...] = ()) -> Traceback | None:
    """The traceback of the failure: the last one whose exception text contains one of `hints`
    (the evidence lines the matcher recognised), else the last one."""
    for tb in reversed(tracebacks):
        text = "\n".join(tb.message)
        if any(h and (h in text or text in h) for h in hints):
            return tb
    return tracebacks[-1] if tracebacks else None


def cpp_operator(text: str) -> str | None:
    """`aten::<op>` from the innermost `at::_ops::<op>::` frame of a C++ stack trace, or None."""
    m = _OP.search(text)
    return f"aten::{m.group('op')}" if m else None


def library_call(tb: Traceback) -> Frame | None:
    """The outermost library frame called from the user's innermost frame (for example
    `torch/nn/functional.py` in `linear`): what the user's line called into when it failed."""
    frames = tb.frames
    user = user_frame(tb)
    if user is None:
        return None
    index = max(i for i, f in enumerate(frames) if f is user)
    for frame in frames[index + 1:]:
        if frame.is_library:
            return frame
    return None
