"""What the matcher notices beside the entries: the platform a text comes from, and the primary
CUDA errors in it (gpudoctor.explain.matcher decides, in its rules 9 and 10, what they change).

- A platform (gpudoctor.knowledge.notices: ROCm/HIP, ZLUDA, Apple MPS, Intel XPU, Ascend NPU,
  Gaudi, MUSA, MLU, Tenstorrent) is recognised by its markers: a literal keyword on a line, then
  the marker's regex on that line, unless one of the platform's `unless` regexes matches it (an
  environment dump that names every platform). When several platforms show, the one with the
  highest priority wins (ZLUDA, which runs on HIP, over ROCm), then the earliest line.
- A primary CUDA error is the line that names what failed: `CUDA error: <message>` (torch's
  C10_CUDA_CHECK), `CUDA driver error: <message>`,
  `Triton Error [CUDA]: <message>`, or a bare `CUDA_ERROR_*` / `cudaError*` name. Its message is
  cut where a trailer printed on the same line begins ("CUDA kernel errors might be...", "Search
  for `cudaError...`", "For debugging consider...").

The scan runs inside the matcher's one pass over the text: its keywords join the matcher's
keyword index, so a large log costs no extra scan. Standard library only.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Iterable

from gpudoctor.knowledge.notices import Notice, platforms

if TYPE_CHECKING:
    from gpudoctor.knowledge.notices import Marker

_MAX_PRIMARY = 16  # primary error lines kept per input: the first ones decide
_MAX_MESSAGE = 160

# keyword -> the regex that reads the failing call's message on a line holding it
_PRIMARY: dict[str, re.Pattern[str]] = {
    "CUDA error: ": re.compile(r"CUDA error: (?P<msg>[^\n]{1,400})"),
    "CUDA driver error: ": re.compile(r"CUDA driver error: (?P<msg>[^\n]{1,400})"),
    "Triton Error [CUDA]: ": re.compile(r"Triton Error \[CUDA\]: (?P<msg>[^\n]{1,400})"),
    "CUDA_ERROR_": re.compile(r"\b(?P<msg>CUDA_ERROR_[A-Z_]{3,60})\b"),
    "cudaError": re.compile(r"\b(?P<msg>cudaError[A-Z][A-Za-z]{2,60})\b"),
}
# Where the message stops: a trailer or pointer printed on the same line (one-line pastes), a
# source location, or the end of a quoted call.
_MESSAGE_END = re.compile(r"\s+(?:CUDA kernel errors might|Search for [`'\"]?cudaError|For debugging consider"
                          r"|Compile with [`'\"]?TORCH_USE_CUDA_DSA|Device-side assertion|Exception raised from"
                          r"|HIP kernel errors)|\s+at /|\s+\(code #|\s*(?:\\n|\*\*|`|\"|')\s*$")
_POINTER = re.compile(r"Search for [`'\"]?$")
# Messages that are not a failing call's own words.
_NOT_A_MESSAGE = re.compile(r"^(?:CUBLAS_STATUS_|CUDNN_STATUS_|cudaErrorMemoryAllocation$|cudaSuccess)")


class PlatformFinding:
    """The platform a text comes from: its notice, and the first line that says so. (Plain
    classes here and below, not dataclasses: `explain` builds them on every run, and creating a
    dataclass costs start-up time.)"""

    __slots__ = ("notice", "line", "evidence")

    def __init__(self, notice: Notice, line: int, evidence: str) -> None:
        self.notice, self.line, self.evidence = notice, line, evidence

    @property
    def id(self) -> str:
        return self.notice.id

    def with_evidence(self, evidence: str) -> PlatformFinding:
        return PlatformFinding(self.notice, self.line, evidence)

    def to_dict(self, *, cuda_entries_apply: bool) -> dict[str, Any]:
        return {
            "id": self.notice.id,
            "name": self.notice.name,
            "line": self.line or None,
            "evidence": self.evidence,
            "cuda_entries_apply": cuda_entries_apply,
            "summary": self.notice.summary,
            "steps": list(self.notice.steps),
            "references": [{"title": r.title, "url": r.url} for r in self.notice.references],
        }

    def __repr__(self) -> str:
        return f"PlatformFinding({self.notice.id!r}, line {self.line})"


class PrimaryError:
    """A line that names the CUDA call's failure: `message` as the runtime printed it."""

    __slots__ = ("message", "line", "evidence")

    def __init__(self, message: str, line: int, evidence: str) -> None:
        self.message, self.line, self.evidence = message, line, evidence

    def __repr__(self) -> str:
        return f"PrimaryError({self.message!r}, line {self.line})"


def clean_message(raw: str) -> str:
    """The failing call's message from the text after `CUDA error: `: cut where a trailer on the
    same line begins, without closing quotes, Markdown emphasis or a final full stop."""
    m = _MESSAGE_END.search(raw)
    text = raw[:m.start()] if m else raw
    text = text.strip().strip("`'\"*").strip()
    text = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    return text[:_MAX_MESSAGE].strip()


class NoticeScan:
    """Collects platform markers and primary CUDA errors from the lines the matcher hands it.
    `keys()` are the (keyword, ignore_case) pairs to look for; `try_line` is called with each
    line holding one of them. `notices`: the platforms to look for (all of them by default; a
    pasted text only those whose marker keywords it holds, gpudoctor.knowledge.kbcache)."""

    def __init__(self, notices: Iterable[Notice] | None = None) -> None:
        self._notices = tuple(platforms() if notices is None else notices)
        self._markers: dict[tuple[str, bool], list[tuple[Notice, Marker]]] = {}
        self._found: dict[str, tuple[int, str]] = {}  # platform id -> (line, evidence)
        self.primary: list[PrimaryError] = []
        for notice in self._notices:
            for marker in notice.markers:
                self._markers.setdefault((marker.keyword, marker.ignore_case), []).append((notice, marker))

    def keys(self) -> list[tuple[str, bool]]:
        return [*self._markers, *((k, False) for k in _PRIMARY)]

    def try_line(self, key: tuple[str, bool], window: str, line: int, quote: Callable[[], str]) -> None:
        """`window`: the line (as the matcher searches it); `line`: its number; `quote()`: the
        line as the user wrote it, for the evidence."""
        for notice, marker in self._markers.get(key, ()):
            if notice.id in self._found and self._found[notice.id][0] <= line:
                continue
            if marker.regex.search(window) and not (notice.unless_regex and notice.unless_regex.search(window)):
                self._found[notice.id] = (line, quote())
        if not key[1] and key[0] in _PRIMARY and len(self.primary) < _MAX_PRIMARY:
            for m in _PRIMARY[key[0]].finditer(window):
                if _POINTER.search(window, max(0, m.start() - 16), m.start()):
                    continue  # "Search for `cudaErrorLaunchFailure' in ...": a pointer to the docs
                message = clean_message(m.group("msg"))
                if message and not _NOT_A_MESSAGE.match(message) \
                        and not any(p.line == line and p.message == message for p in self.primary):
                    self.primary.append(PrimaryError(message, line, quote()))

    def platform(self) -> PlatformFinding | None:
        """The platform with the highest priority among those found, then the earliest line."""
        best = None
        for notice in self._notices:
            if notice.id in self._found:
                line, evidence = self._found[notice.id]
                if best is None or notice.priority > best.notice.priority or (
                        notice.priority == best.notice.priority and line < best.line):
                    best = PlatformFinding(notice, line, evidence)
        return best
