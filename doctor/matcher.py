"""Recognise known failures in pasted error text: a one-line message, a traceback, or a long log.

The rules, in order:

1. Candidate lines. Every pattern names a literal `keyword` (for a message template, its longest
   literal stretch); only lines containing it are tried, so a 100 MB log costs a few substring
   searches per chunk, not a regex per line. At most `_MAX_LINES_PER_KEYWORD` candidate lines per
   keyword and chunk are tried (a log repeating one warning a million times adds nothing after the
   first few), and a pattern sees at most `_WINDOW` characters either side of the keyword, so no
   line, however long, costs more than a bounded amount of work.
2. A pattern matches a line when its regex does and its line predicate (`when`, see
   gpudoctor.predicates) holds for the values it captured; the predicate's sentence becomes the
   deciding evidence. A message template whose regex fails on a line that holds its keyword (at
   least `_FRAGMENT_MIN` characters long) still counts, at `_FRAGMENT_FACTOR` of its weight: the
   message was wrapped or cut when it was pasted.
3. An entry matches when at least one of its `anchor` patterns matched and at least `min_support`
   of its `support` patterns or derived facts did. Support patterns alone never match anything.
4. Derived facts (the entry's `facts`) look at all values the entry captured, across lines, and
   count as one support each (an allocation larger than the GPU makes an out-of-memory an
   attention-oom; cuBLASLt dimensions that are not multiples of 16 make a cuBLAS status an FP8
   layout rule).
5. Confidence is 1 - prod(1 - weight) over the distinct patterns and facts that matched, capped
   at 0.99, then scaled by (1 - weight) for every `against` pattern that matched (a compiler frame
   beside a "must be contiguous", a DataLoader frame beside "not resizable").
6. Precedence. An entry that `supersedes` another demotes it when both match and it is at least
   as confident. A `generic` entry (the "might be asynchronously reported" trailer, a
   torch.compile failure that wraps the real error) is only context beside a confident specific
   match: its confidence is capped at `_CONTEXT_CAP`.
7. A log, not a line. Every match knows the lines it came from (counted across chunks). The
   first `sticky` error (one that poisons the CUDA context: a device-side assert, an illegal
   address) is the root cause; later sticky or `consequence` matches are demoted to context as its
   consequences. A `consequence` entry (an NCCL watchdog timeout) that follows another confident
   specific match is demoted the same way.
8. Ranking: context last, then confidence, then the entry's `specificity`, then the first line.
   Matches under `_MIN_CONFIDENCE` are dropped.

Standard library only; no torch, no rich.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Iterable

from gpudoctor.kb import Entry, Pattern, load_all
from gpudoctor.predicates import ENTRY_FACTS, LINE_PREDICATES, parse_size  # noqa: F401 (parse_size re-exported)

_MAX_LINES_PER_KEYWORD = 64
_MAX_EVIDENCE_PER_ENTRY = 6
_MAX_HITS_KEPT = 48
_MAX_LINE_CHARS = 400
_WINDOW = 2000
_FRAGMENT_MIN = 20
_FRAGMENT_FACTOR = 0.8
_CONTEXT_CAP = 0.25
_MIN_CONFIDENCE = 0.2
CONFIDENT = 0.5
_DERIVED_WEIGHT = 0.6

_ANSI = re.compile(r"\x1b\[[0-?]{0,64}[ -/]{0,16}[@-~]")
_SPACES = re.compile(r"[ \t]{2,}|\t")


@dataclass(frozen=True)
class Evidence:
    line: int  # 1-based line number in the whole input
    text: str


@dataclass(frozen=True)
class Match:
    entry: Entry
    confidence: float
    evidence: tuple[str, ...]
    captures: dict[str, str] = field(default_factory=dict)
    context_only: bool = False  # demoted: generic trailer beside a specific error, superseded, or a consequence
    lines: tuple[int, ...] = ()  # the line of each evidence item (0 for a derived fact)
    decided_by: tuple[str, ...] = ()  # the facts that chose this entry over a look-alike
    against: tuple[str, ...] = ()  # lines that argued against it
    consequence_of: tuple[str, int] | None = None  # (id, line) of the root cause this follows
    first_line: int = 0

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
            "line": self.first_line or None,
            "evidence_lines": [n or None for n in self.lines],
            "decided_by": list(self.decided_by),
            "against": list(self.against),
            "consequence_of": ({"id": self.consequence_of[0], "line": self.consequence_of[1] or None}
                               if self.consequence_of else None),
        }


@dataclass
class _Hits:
    """Per entry: which patterns matched (with the weight they earned), where, and what they
    captured."""

    weights: dict[str, float] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, int] = field(default_factory=dict)  # text -> first line
    anchor_lines: list[int] = field(default_factory=list)
    captures: dict[str, str] = field(default_factory=dict)
    decided_by: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)

    @property
    def patterns(self) -> dict[str, float]:  # the names of the patterns that matched
        return self.weights


class _LineIndex:
    """Line numbers of offsets in one chunk, built on first use (most chunks of a log never need it)."""

    def __init__(self, chunk: str, base: int) -> None:
        self.chunk = chunk
        self.base = base
        self._newlines: list[int] | None = None

    def line_of(self, offset: int) -> int:
        if self._newlines is None:
            self._newlines = [m.start() for m in re.finditer("\n", self.chunk)]
        return self.base + bisect.bisect_left(self._newlines, offset) + 1


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
        # Templates whose opening words are their keyword: a line that has those words but not
        # the rest is the same message, wrapped or cut when it was pasted (rule 2).
        self._fragmentable = {
            id(p) for e in self.entries for p in e.patterns
            if p.template is not None and len(p.keyword) >= _FRAGMENT_MIN
            and (p.template.text.lower() if p.ignore_case else p.template.text).startswith(p.keyword)
        }
        self._hits: dict[str, _Hits] = {}
        self._lines_before = 0

    def feed(self, chunk: str) -> None:
        if "\x1b" in chunk:
            chunk = _ANSI.sub("", chunk)
        # Runs of spaces become one: pasted text is re-spaced (tables, wrapped terminals), and
        # keywords hold single spaces. Newlines stay, so line numbers do not change.
        chunk = _SPACES.sub(" ", chunk)
        index = _LineIndex(chunk, self._lines_before)
        lowered: str | None = None
        for (keyword, ignore_case), users in self._by_keyword.items():
            haystack = chunk
            if ignore_case:
                if lowered is None:
                    lowered = chunk.lower()
                    if len(lowered) != len(chunk):  # U+0130 lower-cases to two characters
                        lowered = chunk.replace("\u0130", "I").lower()
                haystack = lowered
            for start, window, at in _windows_containing(haystack, chunk, keyword):
                understood = False
                fragments = []
                for entry, pattern in users:
                    # A template cannot start more than `reach` characters before its keyword.
                    m = pattern.regex.search(window, 0 if pattern.reach is None else max(0, at - pattern.reach))
                    if m is not None:
                        understood = True
                        decided = None
                        if pattern.when is not None:
                            decided = LINE_PREDICATES[pattern.when](m.groupdict())
                            if decided is None:
                                continue  # the values on this line say it is the look-alike
                        self._record(entry, pattern, pattern.weight, window, start, index, m, decided)
                    elif id(pattern) in self._fragmentable:
                        fragments.append((entry, pattern))
                if not understood:
                    # The opening words of a message without the rest: wrapped or cut (rule 2).
                    for entry, pattern in fragments:
                        self._record(entry, pattern, pattern.weight * _FRAGMENT_FACTOR, window, start, index)
        self._lines_before += chunk.count("\n")

    def _record(self, entry: Entry, pattern: Pattern, weight: float, window: str, start: int,
                index: _LineIndex, m: re.Match[str] | None = None, decided: str | None = None) -> None:
        hits = self._hits.setdefault(entry.id, _Hits())
        line = index.line_of(start)
        if weight > hits.weights.get(pattern.name, 0.0):
            hits.weights[pattern.name] = weight
            hits.roles[pattern.name] = pattern.role
        text = _evidence_text(window, pattern.keyword if not pattern.ignore_case else None)
        if pattern.role == "against":
            if text not in hits.against:
                hits.against.append(text)
            return
        if pattern.role == "anchor":
            hits.anchor_lines.append(line)
        if text not in hits.evidence and len(hits.evidence) < _MAX_HITS_KEPT:
            hits.evidence[text] = line
        if decided and decided not in hits.decided_by:
            hits.decided_by.append(decided)
        if m is not None:
            for name, value in m.groupdict().items():
                if value is not None:
                    hits.captures[name] = value.strip()  # the last occurrence wins

    def results(self) -> list[Match]:
        by_id = {e.id: e for e in self.entries}
        matches: dict[str, Match] = {}
        for entry_id, hits in self._hits.items():
            entry = by_id[entry_id]
            if not hits.anchor_lines:
                continue
            weights = [w for name, w in hits.weights.items() if hits.roles[name] != "against"]
            supports = sum(1 for name in hits.weights if hits.roles[name] == "support")
            evidence = sorted(hits.evidence.items(), key=lambda kv: kv[1])[:_MAX_EVIDENCE_PER_ENTRY]
            decided = list(hits.decided_by)
            for fact in entry.facts:
                derived = ENTRY_FACTS[fact](hits.captures)
                if derived:
                    supports += 1
                    weights.append(_DERIVED_WEIGHT)
                    evidence.append((derived, 0))
                    decided.append(derived)
            if supports < entry.min_support:
                continue
            miss = 1.0
            for w in weights:
                miss *= 1.0 - w
            confidence = min(0.99, 1.0 - miss)
            for name, w in hits.weights.items():
                if hits.roles[name] == "against":
                    confidence *= 1.0 - w
            matches[entry_id] = Match(
                entry, confidence, tuple(t for t, _ in evidence), dict(hits.captures),
                lines=tuple(n for _, n in evidence), decided_by=tuple(decided),
                against=tuple(hits.against[:3]), first_line=min(hits.anchor_lines),
            )
        _apply_precedence(matches)
        ranked = sorted(
            (m for m in matches.values() if m.confidence >= _MIN_CONFIDENCE),
            key=lambda m: (m.context_only, -m.confidence, -m.entry.specificity, m.first_line, m.id),
        )
        return ranked


def _demote(m: Match, cap: float, consequence_of: tuple[str, int] | None = None) -> Match:
    from dataclasses import replace

    return replace(m, confidence=min(m.confidence, cap), context_only=True,
                   consequence_of=consequence_of or m.consequence_of)


def _apply_precedence(matches: dict[str, Match]) -> None:
    """Rules 6 and 7 of the module docstring, in place."""
    for m in list(matches.values()):
        for loser in m.entry.supersedes:
            other = matches.get(loser)
            if other is not None and not other.context_only and m.confidence >= other.confidence * 0.9:
                matches[loser] = _demote(other, m.confidence * 0.5)
    confident = [m for m in matches.values() if not m.entry.generic and m.confidence >= CONFIDENT]
    for m in list(matches.values()):
        if m.entry.generic and confident:
            matches[m.id] = _demote(m, _CONTEXT_CAP)

    live = [m for m in matches.values() if not m.context_only]
    sticky = sorted((m for m in live if m.entry.sticky and m.confidence >= CONFIDENT), key=lambda m: m.first_line)
    if sticky:
        root = sticky[0]
        for m in live:
            if m is not root and (m.entry.sticky or m.entry.consequence or m.entry.generic) \
                    and m.first_line > root.first_line:
                matches[m.id] = _demote(m, min(m.confidence, root.confidence * 0.5), (root.id, root.first_line))
    live = [m for m in matches.values() if not m.context_only]
    roots = sorted((m for m in live if not m.entry.consequence and not m.entry.generic
                    and m.confidence >= CONFIDENT), key=lambda m: m.first_line)
    for m in live:
        if m.entry.consequence:
            earlier = [r for r in roots if r.first_line < m.first_line]
            if earlier:
                matches[m.id] = _demote(m, min(m.confidence, earlier[0].confidence * 0.5),
                                        (earlier[0].id, earlier[0].first_line))


def _windows_containing(haystack: str, original: str, keyword: str) -> Iterable[tuple[int, str, int]]:
    """(offset, text, keyword offset in text) of the line around each occurrence of `keyword` in
    `haystack` (the same text, possibly lower-cased, so offsets agree), cut to `_WINDOW`
    characters either side of the keyword, each line once, bounded in number. A carriage return ends a line too (progress bars
    redraw with it); line numbers still count newlines only."""
    start = 0
    found = 0
    while found < _MAX_LINES_PER_KEYWORD:
        i = haystack.find(keyword, start)
        if i < 0:
            return
        lo = max(0, i - _WINDOW)
        hi = min(len(haystack), i + len(keyword) + _WINDOW)
        line_start = max(haystack.rfind("\n", lo, i), haystack.rfind("\r", lo, i)) + 1 or lo
        line_end = hi
        for stop in ("\n", "\r"):
            j = haystack.find(stop, i, line_end)
            if j >= 0:
                line_end = j
        yield line_start, original[line_start:line_end], i - line_start
        found += 1
        # One candidate per line; a line cut at the window is searched again after it.
        start = line_end + 1 if line_end < hi else hi


def _evidence_text(window: str, keyword: str | None) -> str:
    """The line as evidence: stripped, and when longer than `_MAX_LINE_CHARS`, the part around
    the keyword, cut at spaces (never mid-word) and marked with an ellipsis."""
    text = window.strip()
    if len(text) <= _MAX_LINE_CHARS:
        return text
    at = text.find(keyword) if keyword else -1
    begin = max(0, min(at - _MAX_LINE_CHARS // 4, len(text) - _MAX_LINE_CHARS)) if at >= 0 else 0
    end = begin + _MAX_LINE_CHARS
    if begin > 0:
        space = text.find(" ", begin, begin + 40)
        begin = space + 1 if space >= 0 else begin
    if end < len(text):
        space = text.rfind(" ", end - 40, end)
        end = space if space > begin else end
    return ("…" if begin > 0 else "") + text[begin:end].strip() + ("…" if end < len(text) else "")


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
