"""Recognise known failures in pasted error text: a one-line message, a traceback, or a long log.

The rules, in order:

1. Candidate lines. Every pattern names a literal `keyword`; only lines containing it are tried,
   so a 100 MB log costs a few substring searches per chunk, not a regex per line. Patterns are
   line-based. At most `_MAX_LINES_PER_KEYWORD` candidate lines per keyword and chunk are tried
   (a log repeating one warning a million times adds nothing after the first few).
2. An entry matches when at least one of its `anchor` patterns matched and at least
   `min_support` of its `support` patterns (or derived facts, rule 3) did. Support patterns alone
   never match anything.
3. Derived fact: an out-of-memory text that names the requested size and the GPU's total capacity
   (`requested` and `capacity` groups) where the single allocation is larger than the whole GPU,
   or larger than `_HUGE_ALLOCATION` when the capacity is not shown, counts as one support. That is
   what makes an OOM without an attention stack still an attention-oom: no ordinary tensor asks for
   more than the card has, a materialised B*H*N*N score matrix does.
4. Confidence is 1 - prod(1 - weight) over the distinct patterns that matched, capped at 0.99.
5. Precedence. An entry that `supersedes` another demotes it below itself when both match
   (attention-oom over cuda-oom). A `generic` entry (the "might be asynchronously reported"
   trailer that CUDA appends to every kernel error) is only context when any specific entry
   matched: its confidence is capped at `_CONTEXT_CAP` and it ranks last.
6. Ranking: confidence, then the entry's `specificity`, then id. Matches under `_MIN_CONFIDENCE`
   are dropped.

Standard library only; no torch, no rich.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from gpudoctor.kb import Entry, Pattern, load_all

_MAX_LINES_PER_KEYWORD = 64
_MAX_EVIDENCE_PER_ENTRY = 6
_MAX_LINE_CHARS = 400
_CONTEXT_CAP = 0.25
_MIN_CONFIDENCE = 0.2
_DERIVED_WEIGHT = 0.6
_HUGE_ALLOCATION = 100 * 2**30  # bytes; larger than any single-GPU working set people allocate

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SIZE = re.compile(r"^\s*([\d.]+)\s*([KMGTP]?i?B|bytes)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}


def parse_size(text: str) -> int | None:
    """'112.50 GiB' -> bytes; None when it is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    unit = _UNITS.get(m.group(2).lower())
    try:
        return int(float(m.group(1)) * unit) if unit else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Match:
    entry: Entry
    confidence: float
    evidence: tuple[str, ...]
    captures: dict[str, str] = field(default_factory=dict)
    context_only: bool = False  # demoted: generic trailer beside a specific error, or superseded

    @property
    def id(self) -> str:
        return self.entry.id

    def context_lines(self) -> list[str]:
        """The entry's `context` templates filled with what was captured from the text."""
        out = []
        for template in self.entry.context:
            try:
                out.append(template.format_map(self.captures))
            except (KeyError, IndexError, ValueError):
                continue
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.entry.id,
            "title": self.entry.title,
            "confidence": round(self.confidence, 3),
            "evidence": list(self.evidence),
            "captures": dict(self.captures),
            "context_only": self.context_only,
        }


@dataclass
class _Hits:
    """Per entry: which patterns matched, on which lines, and what they captured."""

    patterns: dict[str, Pattern] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    captures: dict[str, str] = field(default_factory=dict)


class Matcher:
    """Feed text in chunks that end at line boundaries (`feed`), then `results()`."""

    def __init__(self, entries: Iterable[Entry] | None = None) -> None:
        self.entries = tuple(entries) if entries is not None else load_all()
        # keyword -> [(entry, pattern)], so each keyword is searched once per chunk.
        self._by_keyword: dict[tuple[str, bool], list[tuple[Entry, Pattern]]] = {}
        for entry in self.entries:
            for pattern in entry.patterns:
                key = (pattern.keyword, pattern.ignore_case)
                self._by_keyword.setdefault(key, []).append((entry, pattern))
        self._hits: dict[str, _Hits] = {}

    def feed(self, chunk: str) -> None:
        if "\x1b" in chunk:
            chunk = _ANSI.sub("", chunk)
        lowered: str | None = None
        for (keyword, ignore_case), users in self._by_keyword.items():
            haystack = chunk
            if ignore_case:
                if lowered is None:
                    lowered = chunk.lower()
                haystack = lowered
            for line in _lines_containing(haystack, chunk, keyword):
                for entry, pattern in users:
                    m = pattern.regex.search(line)
                    if m is None:
                        continue
                    hits = self._hits.setdefault(entry.id, _Hits())
                    hits.patterns.setdefault(pattern.name, pattern)
                    evidence = line.strip()[:_MAX_LINE_CHARS]
                    if evidence not in hits.evidence and len(hits.evidence) < _MAX_EVIDENCE_PER_ENTRY:
                        hits.evidence.append(evidence)
                    for name, value in m.groupdict().items():
                        if value is not None:
                            hits.captures[name] = value.strip()  # the last occurrence wins

    def results(self) -> list[Match]:
        by_id = {e.id: e for e in self.entries}
        matches: dict[str, Match] = {}
        for entry_id, hits in self._hits.items():
            entry = by_id[entry_id]
            anchors = [p for p in hits.patterns.values() if p.role == "anchor"]
            if not anchors:
                continue
            weights = [p.weight for p in hits.patterns.values()]
            supports = sum(1 for p in hits.patterns.values() if p.role == "support")
            evidence = list(hits.evidence)
            if entry.min_support:
                derived = _allocation_exceeds_gpu(hits.captures)
                if derived:
                    supports += 1
                    weights.append(_DERIVED_WEIGHT)
                    evidence.append(derived)
            if supports < entry.min_support:
                continue
            miss = 1.0
            for w in weights:
                miss *= 1.0 - w
            matches[entry_id] = Match(entry, min(0.99, 1.0 - miss), tuple(evidence), dict(hits.captures))

        specific = [m for m in matches.values() if not m.entry.generic]
        for m in list(matches.values()):
            for loser in m.entry.supersedes:
                if loser in matches and not matches[loser].context_only:
                    demoted = matches[loser]
                    matches[loser] = Match(demoted.entry, min(demoted.confidence, m.confidence * 0.5),
                                           demoted.evidence, demoted.captures, context_only=True)
            if m.entry.generic and specific:
                matches[m.id] = Match(m.entry, min(m.confidence, _CONTEXT_CAP), m.evidence,
                                      m.captures, context_only=True)

        ranked = sorted(
            (m for m in matches.values() if m.confidence >= _MIN_CONFIDENCE),
            key=lambda m: (m.context_only, -m.confidence, -m.entry.specificity, m.id),
        )
        return ranked


def _lines_containing(haystack: str, original: str, keyword: str) -> Iterable[str]:
    """Whole lines of `original` around each occurrence of `keyword` in `haystack` (the same text,
    possibly lower-cased, so offsets agree), each line once, bounded in number."""
    start = 0
    found = 0
    while found < _MAX_LINES_PER_KEYWORD:
        i = haystack.find(keyword, start)
        if i < 0:
            return
        line_start = haystack.rfind("\n", 0, i) + 1
        line_end = haystack.find("\n", i)
        if line_end < 0:
            line_end = len(haystack)
        yield original[line_start:line_end]
        found += 1
        start = line_end + 1


def _allocation_exceeds_gpu(captures: dict[str, str]) -> str | None:
    requested = parse_size(captures.get("requested", ""))
    if requested is None:
        return None
    capacity = parse_size(captures.get("capacity", ""))
    if capacity is not None and requested > capacity:
        return (f"a single allocation of {captures['requested']} is larger than the whole GPU "
                f"({captures['capacity']} total): a materialised attention score matrix")
    if capacity is None and requested > _HUGE_ALLOCATION:
        return (f"a single allocation of {captures['requested']} is larger than any single GPU's "
                "memory: a materialised attention score matrix")
    return None


def match_text(text: str) -> list[Match]:
    """Rank the known failures in `text`, best first (see the module docstring for the rules)."""
    matcher = Matcher()
    matcher.feed(text)
    return matcher.results()


def match_chunks(chunks: Iterable[str]) -> list[Match]:
    """The same for input read in chunks that end at line boundaries (large logs)."""
    matcher = Matcher()
    for chunk in chunks:
        matcher.feed(chunk)
    return matcher.results()
