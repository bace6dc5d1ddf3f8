"""Which frames of a traceback are the user's own code on this machine, and the project around them.

A frame is the user's when its file is not in site-packages or dist-packages, not in a Python
installation's standard library (`lib/python3.X/`, `Lib\\`), not frozen or generated (`<frozen
...>`, `<string>`, `<stdin>`, a notebook cell), not inside the torch package (a source checkout
counts as torch, not as the user's), and is a Python file that exists here. A relative path is
read from the folder the command ran in (`run`) or `explain` runs in.

The project is the nearest folder above the frames' common folder (at most `_UP` levels) that
holds a project marker (pyproject.toml, setup.py, setup.cfg, .git), else that common folder
itself; never the file system's root or the home folder, where the traceback's files alone are
checked. Standard library only, and cheap: it decides whether lint is imported at all.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable

_LIBRARY = re.compile(
    r"(?:[/\\](?:site|dist)-packages[/\\])"
    r"|(?:[/\\]lib(?:64)?[/\\](?:python|pypy)\d(?:\.\d+)?[/\\])"
    r"|(?:[/\\]Lib[/\\])"
    r"|^<"
)
_FRAME = re.compile(r'^[ \t]*File "(?P<file>[^"\n]{1,1000})", line (?P<line>\d{1,9})(?:, in (?P<func>[^\n]{1,300}))?[ \t]*$',
                    re.M)
_FILE = re.compile(r'File "(?P<file>[^"\n]{1,1000})", line \d{1,9}')  # unanchored: one fast pass
_TAIL_CHARS = 4 * 1024 * 1024
_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_UP = 4
_MAX_SITES = 64


@dataclass(frozen=True)
class Site:
    """A traceback frame in the user's code, on this machine."""

    file: str  # as the traceback printed it
    path: str  # the file here (absolute)
    line: int
    function: str
    code: str  # the source line as the traceback printed it ("" when it did not)


def is_library(path: str) -> bool:
    """Site-packages, the standard library, frozen and generated code, or the torch package."""
    if _LIBRARY.search(path):
        return True
    parts = re.split(r"[/\\]", path)
    for i, part in enumerate(parts[:-1]):
        if part == "torch" and os.path.isfile(os.path.join(os.sep.join(parts[:i + 1]) or os.sep, "__init__.py")):
            return True
    return False


def names_local_files(text: str, cwd: str | None = None, limit: int = 256) -> bool:
    """Whether any `File "..."` line of `text` names a file of the user's here: the cheap test
    (one regex pass, at most `limit` distinct names looked up) before a traceback is parsed."""
    cwd = cwd or os.getcwd()
    seen: set[str] = set()
    for m in _FILE.finditer(text):
        file = m.group("file")
        if file in seen or not file.endswith(".py") or is_library(file):
            continue
        seen.add(file)
        try:
            if os.path.isfile(file if os.path.isabs(file) else os.path.join(cwd, file)):
                return True
        except (OSError, ValueError):
            pass
        if len(seen) >= limit:
            break
    return False


def user_sites(frames: Iterable[Any], cwd: str | None = None) -> list[Site]:
    """The frames (objects with `file`, `line`, `function`, `code`, outermost first) that are the
    user's Python code and exist here, in the traceback's order; at most the innermost
    `_MAX_SITES`."""
    cwd = cwd or os.getcwd()
    out: list[Site] = []
    for frame in list(frames)[-_MAX_SITES:]:
        file = str(getattr(frame, "file", "") or "")
        if not file.endswith(".py") or is_library(file):
            continue
        path = file if os.path.isabs(file) else os.path.join(cwd, file)
        try:
            if not os.path.isfile(path):
                continue
        except (OSError, ValueError):  # a NUL in a pasted path, a name too long
            continue
        path = os.path.realpath(path)
        if is_library(path):
            continue
        out.append(Site(file, path, int(getattr(frame, "line", 0) or 0), str(getattr(frame, "function", "") or ""),
                        str(getattr(frame, "code", "") or "")))
    return out


def project_root(sites: list[Site], home: str | None = None) -> str | None:
    """The folder whose code is checked with the traceback's files (module docstring), or None
    when the frames have no folder narrower than the home folder or the root in common."""
    if not sites:
        return None
    home = os.path.realpath(home or os.path.expanduser("~"))
    try:
        common = os.path.commonpath([os.path.dirname(s.path) for s in sites])
    except ValueError:  # different drives
        return None
    stop = {os.path.realpath(os.sep), home, os.path.dirname(home)}
    if common in stop:
        return None
    folder = common
    for _ in range(_UP + 1):
        if any(os.path.exists(os.path.join(folder, m)) for m in _MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder or parent in stop:
            break
        folder = parent
    return common


def shown(path: str, cwd: str | None = None) -> str:
    """A path as the user should type it: relative to the folder they are in when it is below it,
    else as it is."""
    cwd = cwd or os.getcwd()
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str


def loose_frames(text: str) -> list[Frame]:
    """The `File "...", line N, in f` lines of a traceback pasted without its first line (issue
    trackers and notes often quote only the frames), with the source line under each: the last
    run of them in `text`, outermost first. For a whole traceback gpudoctor.ticket.pytrace is
    the reader; this is the fallback when it finds none."""
    if 'File "' not in text:
        return []
    runs: list[list[Frame]] = []
    current: list[Frame] | None = None
    code_next = False
    for line in text.split("\n"):
        m = _FRAME.match(line[:1400])
        if m:
            if current is None:
                current = []
                runs.append(current)
            current.append(Frame(m.group("file"), int(m.group("line")), (m.group("func") or "").strip(), ""))
            code_next = True
        elif current is not None and line[:1].isspace() and line.strip():
            if code_next and line.strip().strip("^~ "):  # not the carets under it
                last = current[-1]
                current[-1] = Frame(last.file, last.line, last.function, line.strip()[:300])
            code_next = False
        else:
            current, code_next = None, False
    return runs[-1][-_MAX_SITES:] if runs else []


class TextTail:
    """An iterator of text chunks (gpudoctor.explain.textinput's `Chunks`) passed through
    unchanged that keeps the last `_TAIL_CHARS` characters it saw: the traceback the patch
    search reads, without reading the input twice. `first_line` is the wrapped chunks'."""

    def __init__(self, chunks: Iterable[str], limit: int = _TAIL_CHARS) -> None:
        self._chunks = chunks
        self._source = iter(chunks)
        self._kept: list[str] = []
        self._size = 0
        self._limit = limit

    @property
    def first_line(self) -> Any:
        return getattr(self._chunks, "first_line", None)

    def __iter__(self) -> "TextTail":
        return self

    def __next__(self) -> str:
        chunk = next(self._source)
        self._kept.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._kept[0]) >= self._limit and len(self._kept) > 1:
            self._size -= len(self._kept.pop(0))
        return chunk

    def text(self) -> str:
        joined = "".join(self._kept)
        return joined[-self._limit:]
