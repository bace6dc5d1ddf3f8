"""What `explain` says when the answer is not a knowledge-base entry: the platform a text comes
from (ROCm/HIP, ZLUDA, Apple MPS, Intel XPU, Ascend NPU, Gaudi, MUSA, MLU, Tenstorrent), and a
primary CUDA error that no entry explains. Data, one TOML file per notice in `notices/`:

    id          kebab-case, equals the file name (`unrecognised-cuda-error` is the one notice that
                is not a platform)
    name        what the platform is called, in a few words
    priority    which platform wins when a text shows several (ZLUDA runs on HIP: 90 beats 50)
    summary     one or two sentences: what the text comes from and why the CUDA entries do not apply
    steps       what applies instead, in order (the platform's own variables and tools)
    references  [{title, url}] public references
    [[markers]] keyword (a literal the line must contain), optional regex (searched on that line,
                the keyword itself when absent) and ignore_case: a line that says this platform
    [[unless]]  regex: a line that holds a marker but says nothing about the platform (the
                environment dumps that print "ROCM used to build PyTorch: N/A" on every machine)

Entries name the platforms they apply on (`platforms` in gpudoctor.knowledge.kb); an entry that
lists none applies on all of them. Loading is lazy and cached; nothing is read on import.
Standard library only (and tomli before Python 3.11).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any

from gpudoctor.knowledge.kb import ID_RE, KnowledgeBaseError, Reference, tomllib

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notices")
UNRECOGNISED = "unrecognised-cuda-error"
CUDA = "cuda"  # the platform every entry is written for; not a notice of its own


class Marker:
    """A line that says a platform: `keyword` (lower-case when ignore_case) and the regex searched
    on that line (compiled on first use)."""

    def __init__(self, keyword: str, source: str, ignore_case: bool) -> None:
        self.keyword, self.source, self.ignore_case = keyword, source, ignore_case
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        if self._regex is None:
            # ASCII words, as the knowledge base's patterns read them (gpudoctor.knowledge.kb)
            self._regex = re.compile(self.source, re.ASCII | (re.IGNORECASE if self.ignore_case else 0))
        return self._regex


class Notice:
    """One notice file (the module docstring). Plain classes, not dataclasses: `explain` reads a
    notice on every run that names its platform, and start-up time counts."""

    def __init__(self, id: str, name: str, summary: str, steps: tuple[str, ...], references: tuple[Reference, ...],
                 priority: int = 0, markers: tuple[Marker, ...] = (), unless: tuple[str, ...] = ()) -> None:
        self.id, self.name, self.summary, self.steps, self.references = id, name, summary, steps, references
        self.priority, self.markers, self.unless = priority, markers, unless
        self._unless: re.Pattern[str] | None = None

    @property
    def unless_regex(self) -> re.Pattern[str] | None:
        if self._unless is None and self.unless:
            self._unless = re.compile("|".join(f"(?:{u})" for u in self.unless), re.ASCII)
        return self._unless

    def __repr__(self) -> str:
        return f"Notice({self.id!r})"


def _parse(data: dict[str, Any], where: str) -> Notice:
    def text(key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise KnowledgeBaseError(f"{where}: field {key!r} must be a non-empty string")
        return " ".join(value.split())

    notice_id = text("id")
    if not ID_RE.match(notice_id):
        raise KnowledgeBaseError(f"{where}: id {notice_id!r} is not kebab-case")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() for s in steps):
        raise KnowledgeBaseError(f"{where}: steps must be a non-empty list of strings")
    references = []
    for r in data.get("references", []):
        if not isinstance(r, dict) or not str(r.get("url", "")).startswith("https://"):
            raise KnowledgeBaseError(f"{where}: every reference needs an https url")
        references.append(Reference(str(r.get("title", r["url"])), r["url"]))
    markers = []
    for i, m in enumerate(data.get("markers", [])):
        keyword = m.get("keyword") if isinstance(m, dict) else None
        if not isinstance(keyword, str) or len(keyword) < 3:
            raise KnowledgeBaseError(f"{where}: markers[{i}]: keyword must be a literal of 3 characters or more")
        folded = bool(m.get("ignore_case", False))
        source = m.get("regex", re.escape(keyword))
        if not isinstance(source, str):
            raise KnowledgeBaseError(f"{where}: markers[{i}]: regex must be a string")
        # Compiled on first use (`Marker.regex`); tests/test_explain_notices.py compiles them all.
        markers.append(Marker(keyword.lower() if folded else keyword, source, folded))
    unless = tuple(u["regex"] for u in data.get("unless", []) if isinstance(u, dict) and isinstance(u.get("regex"), str))
    return Notice(notice_id, text("name"), text("summary"), tuple(" ".join(s.split()) for s in steps),
                  tuple(references), int(data.get("priority", 0)), tuple(markers), unless)


@functools.lru_cache(maxsize=None)
def load(notice_id: str) -> Notice:
    """One notice by id; raises KnowledgeBaseError when its file is missing or malformed."""
    name = f"{notice_id}.toml"
    try:
        with open(os.path.join(FOLDER, name), "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KnowledgeBaseError(f"notices/{name}: {exc}") from None
    notice = _parse(data, f"notices/{name}")
    if notice.id != notice_id:
        raise KnowledgeBaseError(f"notices/{name}: file name must be {notice.id}.toml")
    return notice


def platform_ids() -> list[str]:
    """Every platform notice's id, from the file names alone."""
    try:
        names = os.listdir(FOLDER)
    except OSError as exc:
        raise KnowledgeBaseError(f"cannot read the notices at {FOLDER}: {exc.strerror}") from None
    return sorted(n[:-5] for n in names if n.endswith(".toml") and n[:-5] != UNRECOGNISED)


@functools.lru_cache(maxsize=1)
def platforms() -> tuple[Notice, ...]:
    """Every platform notice, highest priority first."""
    return tuple(sorted((load(i) for i in platform_ids()), key=lambda n: (-n.priority, n.id)))


def marker_keywords() -> list[tuple[str, bool, str]]:
    """(keyword, ignore_case, platform id) of every marker: what gpudoctor.knowledge.kbcache keeps,
    so that a pasted text reads only the notices whose keywords it holds."""
    return [(m.keyword, m.ignore_case, n.id) for n in platforms() for m in n.markers]


def fingerprint() -> list[list[object]]:
    """Name, size and modification time of every notice file and of this module: anything cached
    from the notices is valid only for the same fingerprint."""
    out: list[list[object]] = []
    names = sorted(n for n in os.listdir(FOLDER) if n.endswith(".toml")) if os.path.isdir(FOLDER) else []
    for path in [*(os.path.join(FOLDER, n) for n in names), os.path.abspath(__file__)]:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise KnowledgeBaseError(f"cannot read {path}: {exc.strerror}") from None
        out.append(["notices/" + os.path.basename(path), st.st_size, st.st_mtime_ns])
    return out
