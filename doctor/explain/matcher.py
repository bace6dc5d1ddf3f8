"""Recognise known failures in pasted error text: a one-line message, a traceback, or a long log.

The rules, in order:

1. Candidate lines. Every pattern names a literal `keyword` (for a message template, its opening
   words or longest literal stretch); only lines containing it are tried. Most keywords are found
   in one regex pass per chunk over a trie of short "needles" that start with a character rare in
   ordinary text, so a 100 MB log costs a few scans, not a regex per line per keyword; each
   candidate line (once per shape: lines differing only in digits are tried once) is then
   checked for the keywords whose needles it holds. At most
   `_MAX_LINES_PER_KEYWORD` lines per keyword and chunk are tried (a log repeating one warning a
   million times adds nothing after the first few), and a pattern sees at most `_WINDOW`
   characters either side of its keyword, so no line, however long, costs more than a bounded
   amount of work. A pasted error (one chunk up to `_LAZY_CHARS`) is matched against only the
   entries with a keyword in it (`entries_for`, through the keyword index of gpudoctor.knowledge.kbcache),
   and the platform notices with a marker keyword in it, which ranks it exactly as all entries
   would: an entry without a keyword in the text has no line to match.
2. A pattern matches a line when its regex does and its line predicate (`when`, see
   gpudoctor.knowledge.predicates) holds for the values it captured; the predicate's sentence becomes the
   deciding evidence. When no pattern of a keyword matches a line that holds it, a message
   template still counts, at `_FRAGMENT_FACTOR` of its weight, if the line ends inside it (the
   message cut short: at least 60% of its literal text, at least 20 characters, and its predicate
   still holds) or if the keyword is the template's opening words and at least `_FRAGMENT_MIN`
   characters long (the message wrapped onto the next line, or retyped), unless another
   template matches that line whole (a look-alike message that shares the opening words).
3. An entry matches when at least one of its `anchor` patterns matched and at least `min_support`
   of its `support` patterns or derived facts did. Support patterns alone never match anything.
   An anchor marked `needs_support` (a reading of a message that another entry owns, such as a
   bare cuBLAS status read as an FP8 layout rule, or a CUDA error read as a forked worker's)
   counts only beside a fact or a support pattern of its entry: alone it matches nothing, so it
   can neither lead nor demote the entry that owns the message.
4. Derived facts (the entry's `facts`) look at all values the entry captured, across lines, and
   count as one support each (an allocation larger than the GPU makes an out-of-memory an
   attention-oom; cuBLASLt dimensions that are not multiples of 16 make a cuBLAS status an FP8
   layout rule).
5. Confidence is 1 - prod(1 - weight) over the distinct patterns and facts that matched, capped
   at 0.99, then scaled by (1 - weight) for every `against` pattern that matched (a compiler frame
   beside a "must be contiguous", a DataLoader frame beside "not resizable").
6. Precedence. A `wrapper` (an NCCL watchdog that terminated with a CUDA error) that carries
   another match on its line or on the line after it is that error's context: the inner error
   decides, even when it is generic. An entry that `supersedes` another (a more specific reading of the same message)
   demotes it when both match and it is confident, or nearly as confident. A `generic` entry
   (the "might be asynchronously reported" trailer, a torch.compile failure that wraps the real
   error) is only context beside a confident specific match: its confidence is capped at
   `_CONTEXT_CAP`.
7. A log, not a line. Every match knows the lines it came from (counted across chunks). The
   first `sticky` error (one that poisons the CUDA context: a device-side assert, an illegal
   address) is the root cause; later sticky or `consequence` matches are demoted to context as its
   consequences. A `consequence` entry (an NCCL watchdog timeout) that follows another confident
   specific match is demoted the same way; among consequence entries alone, the first one is the
   root of the later ones.
8. Ranking: context last, then the raw score, then the entry's `specificity`, then the first
   line. Matches under `_MIN_CONFIDENCE` are dropped.
9. Another platform. When the text says it comes from PyTorch on another platform (ROCm/HIP,
   ZLUDA, MPS, XPU, NPU...: gpudoctor.explain.notice reads the markers of
   gpudoctor.knowledge.notices), an entry that does not apply there (its `platforms`) is only
   context, whatever its score; the platform is the verdict when no entry that applies is left.
10. The primary error decides. A primary CUDA error line (`CUDA error: <message>`, `cuda runtime
   error (N) : ...`, `CUDA_ERROR_*`) that no anchor explains (a `trailer` template explains
   nothing, nor does a `wrapper` entry) outranks a generic or wrapper verdict: that verdict
   becomes context and the matcher reports the error as unrecognised. Rule 10 applies only where
   rule 9 found no platform.
11. Stated confidence. Every match keeps its raw score (rule 5) as `score`, which the rules above
   compare; a match that is not context states the calibrated confidence of
   gpudoctor.explain.calibration (fitted on labelled texts by tools/calibrate.py), context its
   capped score.

Standard library only; no torch, no rich.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace
from typing import Iterable

from gpudoctor.knowledge.kb import Entry, Pattern, load_all
from gpudoctor.explain import calibration
from gpudoctor.explain.notice import NoticeScan, PlatformFinding, PrimaryError
from gpudoctor.explain.pasted import join_wrapped, normalise as normalise_pasted
from gpudoctor.knowledge.notices import Notice
from gpudoctor.knowledge.predicates import ENTRY_FACTS, LINE_PREDICATES

_MAX_LINES_PER_KEYWORD = 64
_MAX_CANDIDATE_LINES = 8192  # lines holding a needle, per chunk
_MAX_SHAPES = 100_000
_NEEDLE_CHARS = 12
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
_LAZY_CHARS = 64 * 1024  # one chunk up to this size reads only the entries it can match
_JOIN_CHARS = 64 * 1024  # gutters and wrapped lines are undone in chunks up to this size (pasted text)
_WRAP_LINES = 3  # a message hard-wrapped when it was pasted is looked for across this many more lines

_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")
_ANSI = re.compile(r"\x1b\[[0-?]{0,64}[ -/]{0,16}[@-~]")


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
    score: float = 0.0  # the raw score (rule 5) the rules compare; `confidence` is what is stated
    anchor_kinds: frozenset[str] = frozenset()  # how its anchors matched (rule 11's features)
    support: int = 0  # how many patterns and facts, besides anchors, matched
    not_on: str | None = None  # the platform of the text, where this entry does not apply (rule 9)

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
            "not_on_platform": self.not_on,
        }


@dataclass
class _Hits:
    """Per entry: which patterns matched (with the weight they earned), where, and what they
    captured."""

    weights: dict[str, float] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    # line -> (the text quoted for it, quoted by an anchor, how many input lines it joins): one quote
    # per line, an anchor's first, or the anchor that read the message across the most lines
    evidence: dict[int, tuple[str, bool, int]] = field(default_factory=dict)
    anchor_lines: list[int] = field(default_factory=list)
    explaining: set[int] = field(default_factory=set)  # lines an anchor explains (not a trailer)
    anchor_kinds: set[str] = field(default_factory=set)  # template, pattern, fragment, support-needing
    captures: dict[str, str] = field(default_factory=dict)
    decided_by: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)
    free_anchor: bool = False  # an anchor that needs no support matched


class _LineIndex:
    """Line numbers of offsets in one chunk, built on first use (most chunks of a log never need it),
    and the chunk's lines as the user wrote them (`original`: the same lines before the pasted
    forms were undone, gpudoctor.explain.pasted), which the evidence quotes."""

    def __init__(self, chunk: str, base: int, original: str | None = None,
                 spans: dict[int, int] | None = None) -> None:
        self.chunk = chunk
        self.base = base
        self.original = original
        self.spans = spans or {}  # line index in the chunk -> input lines joined into it
        self._newlines: list[int] | None = None
        self._original_newlines: list[int] | None = None

    def line_of(self, offset: int) -> int:
        if self._newlines is None:
            self._newlines = [m.start() for m in re.finditer("\n", self.chunk)]
        return self.base + bisect.bisect_left(self._newlines, offset) + 1

    def original_lines(self, first: int, count: int) -> str | None:
        """Lines `first` (a line number from `line_of`) and the `count - 1` after it as the user
        wrote them, joined by a space; None when the chunk was not changed."""
        if self.original is None:
            return None
        if self._original_newlines is None:
            self._original_newlines = [-1] + [m.start() for m in re.finditer("\n", self.original)]
        marks = self._original_newlines
        i = first - self.base - 1
        wanted: list[int] = []
        for k in range(i, i + count):
            wanted += [n for n in range(k, k + self.spans.get(k, 1)) if n not in wanted]
        lines = []
        for k in wanted:
            if k >= len(marks):
                break
            end = marks[k + 1] if k + 1 < len(marks) else len(self.original)
            piece = self.original[marks[k] + 1:end]
            cut = piece.find("\r") if len(wanted) > 1 else -1  # a carriage return ends a line too
            lines.append((piece if cut < 0 else piece[:cut]).strip())
        return " ".join(line for line in lines if line)

    def following(self, end: int, count: int) -> list[str]:
        """Up to `count` lines of the chunk after the line that ends at offset `end`."""
        out = []
        pos = end
        while len(out) < count and pos < len(self.chunk) and self.chunk[pos] in "\r\n":
            nxt = self.chunk.find("\n", pos + 1, pos + 1 + _WINDOW)
            line = self.chunk[pos + 1:nxt if nxt >= 0 else min(len(self.chunk), pos + 1 + _WINDOW)]
            if not line.strip():
                break
            out.append(line.strip())
            if nxt < 0:
                break
            pos = nxt
        return out


class Matcher:
    """Feed text in chunks that end at line boundaries (`feed`), then `results()`."""

    def __init__(self, entries: Iterable[Entry] | None = None, platforms: Iterable[Notice] | None = None) -> None:
        self.entries = tuple(entries) if entries is not None else load_all()
        # keyword -> [(entry, pattern)], so each keyword is searched once per chunk.
        self._by_keyword: dict[tuple[str, bool], list[tuple[Entry, Pattern]]] = {}
        for entry in self.entries:
            for pattern in entry.patterns:
                key = (pattern.keyword, pattern.ignore_case)
                self._by_keyword.setdefault(key, []).append((entry, pattern))
        # The platform markers and primary-error keywords (gpudoctor.explain.notice) are found in
        # the same pass (rules 9 and 10).
        self._scan = NoticeScan(platforms)
        self._side = set(self._scan.keys())
        for key in self._side:
            self._by_keyword.setdefault(key, [])
        # Most keywords are found by one regex pass per chunk over a trie of their "needles" (a
        # stretch of each keyword that starts with a character rare in ordinary text), so the
        # search skips most positions at C speed; the rest (and case-insensitive keywords) are
        # searched one by one (rule 1).
        self._by_needle: dict[str, list[tuple[str, bool]]] = {}
        self._plain: list[tuple[str, bool]] = []
        self._order = {key: n for n, key in enumerate(self._by_keyword)}
        for key in self._by_keyword:
            needle = None if key[1] else _needle(key[0])
            if needle is None:
                self._plain.append(key)
            else:
                self._by_needle.setdefault(needle, []).append(key)
        self._trigger = re.compile(_trie(list(self._by_needle))) if self._by_needle else None
        # Templates whose opening words are their keyword: a line that has those words but not
        # the rest is the same message, wrapped or cut when it was pasted (rule 2).
        self._fragmentable = {
            id(p) for e in self.entries for p in e.patterns
            if p.template is not None and len(p.keyword) >= _FRAGMENT_MIN
            and (p.template.text.lower() if p.ignore_case else p.template.text).startswith(p.keyword)
        }
        self._hits: dict[str, _Hits] = {}
        self._deferred: list[tuple[Entry, Pattern, float, str, int, _LineIndex]] = []
        self._whole_lines: set[int] = set()  # offsets (in the chunk) of lines a template matched whole
        self._shapes: set[str] = set()  # candidate lines already tried, digits made 0
        self._lines_before = 0
        self.raw = False  # True: state the raw score, not the calibrated confidence (tools/calibrate.py)
        self.platform: PlatformFinding | None = None  # set by results() (rule 9)
        self.unrecognised: PrimaryError | None = None  # set by results() (rule 10)
        self.unexplained: tuple[PrimaryError, ...] = ()  # every primary error no anchor explains

    def feed(self, chunk: str) -> None:
        chunk, original, spans = _prepared(chunk)
        index = _LineIndex(chunk, self._lines_before, original, spans)
        lines_seen = dict.fromkeys(self._by_keyword, 0)
        if self._trigger is not None:
            # One pass finds every line holding a needle; each line (once per distinct text) is
            # then checked for every keyword.
            done = self._shapes
            if len(done) > _MAX_SHAPES:
                done.clear()
            for start, window, _ in _windows_matching(chunk, self._trigger, _MAX_CANDIDATE_LINES):
                shape = window.translate(_DIGITS_TO_ZERO)  # a cascade repeats one message shape
                if shape in done:
                    continue
                done.add(shape)
                for key in self._keywords_in(window):
                    if lines_seen[key] < _MAX_LINES_PER_KEYWORD:
                        at = window.find(key[0])
                        if at >= 0:
                            lines_seen[key] += 1
                            self._try_line(self._by_keyword[key], window, start, index, at)
                            if key in self._side:
                                self._notice(key, window, start, index)
        lowered: str | None = None
        for key in self._plain:
            keyword, folded = key
            haystack = chunk
            if folded:
                if lowered is None:
                    lowered = chunk.lower()
                    if len(lowered) != len(chunk):  # U+0130 lower-cases to two characters
                        lowered = chunk.replace("\u0130", "I").lower()
                haystack = lowered
            for start, window, at in _windows_containing(haystack, chunk, keyword, _MAX_LINES_PER_KEYWORD):
                self._try_line(self._by_keyword[key], window, start, index, at)
                if key in self._side:
                    self._notice(key, window, start, index)
        for entry, pattern, weight, window, start, idx in self._deferred:
            if start not in self._whole_lines:
                self._record(entry, pattern, weight, window, start, idx)
        self._deferred.clear()
        self._whole_lines.clear()
        self._lines_before += chunk.count("\n")

    def _notice(self, key: tuple[str, bool], window: str, start: int, index: _LineIndex) -> None:
        line = index.line_of(start)

        def quote() -> str:
            return _evidence_text(index.original_lines(line, 1) or window, None)

        self._scan.try_line(key, window, line, quote)

    def _keywords_in(self, window: str) -> list[tuple[str, bool]]:
        """The keywords whose needle occurs in `window`, in knowledge-base order. The trie finds
        the longest needle at each position; the shorter needles it passes through count too."""
        found: set[tuple[str, bool]] = set()
        pos = 0
        assert self._trigger is not None
        while (m := self._trigger.search(window, pos)) is not None:
            text = m.group(0)
            for end in range(4, len(text) + 1):
                found.update(self._by_needle.get(text[:end], ()))
            pos = m.start() + 1
        return sorted(found, key=self._order.__getitem__)

    def _try_line(self, users: list[tuple[Entry, Pattern]], window: str, start: int,
                  index: _LineIndex, at: int) -> None:
        """Every pattern of one keyword against one line (`at`: where the keyword is)."""
        understood = False
        fragments = []
        for entry, pattern in users:
            # A template cannot start more than `reach` characters before its keyword.
            m = pattern.regex.search(window, 0 if pattern.reach is None else max(0, at - pattern.reach))
            if m is not None:
                understood = True
                if pattern.template is not None and pattern.role == "anchor":
                    self._whole_lines.add(start)
                decided = None
                if pattern.when is not None:
                    decided = LINE_PREDICATES[pattern.when](m.groupdict())
                    if decided is None:
                        continue  # the values on this line say it is the look-alike
                self._record(entry, pattern, pattern.weight, window, start, index, m, decided)
            elif pattern.cut is not None or id(pattern) in self._fragmentable:
                fragments.append((entry, pattern))
        # A message cut short by the end of the line, or its opening words without the rest:
        # wrapped onto the next lines when it was pasted (then it matches them joined, at its
        # full weight), or cut, which counts only when no pattern understood the line (rule 2).
        for entry, pattern in fragments:
            if not self._record_wrapped(entry, pattern, window, start, index, at) and not understood:
                self._record_fragment(entry, pattern, window, start, index, at)

    def _record_wrapped(self, entry: Entry, pattern: Pattern, window: str, start: int,
                        index: _LineIndex, at: int) -> bool:
        """A template whose line ends inside it, matched by the line joined with the next
        `_WRAP_LINES` lines (by a space, or by nothing where a terminal broke a word)."""
        if pattern.cut is None:
            return False
        begin = 0 if pattern.reach is None else max(0, at - pattern.reach)
        head = window.rstrip()
        if pattern.cut[0].search(head, begin) is None:
            return False
        following = index.following(start + len(window), _WRAP_LINES)
        for n in range(1, len(following) + 1):
            rest = " ".join(following[:n])
            for glue in (" ", ""):
                joined = head + glue + rest
                m = pattern.regex.search(joined, begin)
                if m is None or m.end() <= len(head):
                    continue
                decided = None
                if pattern.when is not None:
                    decided = LINE_PREDICATES[pattern.when](m.groupdict())
                    if decided is None:
                        return True  # the whole message says it is the look-alike
                self._record(entry, pattern, pattern.weight, joined, start, index, m, decided, lines=n + 1)
                return True
        return False

    def _record_fragment(self, entry: Entry, pattern: Pattern, window: str, start: int,
                         index: _LineIndex, at: int) -> None:
        weight = pattern.weight * _FRAGMENT_FACTOR
        if pattern.cut is not None:
            regex, fewest = pattern.cut
            m = regex.search(window, 0 if pattern.reach is None else max(0, at - pattern.reach))
            # The message cut short is the one at the keyword that selected the line, not a
            # look-alike start of it elsewhere ("... PyTorch installation." is no cut-short
            # "PyTorch 2.1 with CUDA 12.1 (you have ...)").
            if m is not None and len(m.group(0).rstrip()) >= fewest and m.start() <= at \
                    and m.end() >= at + len(pattern.keyword):
                decided = None
                if pattern.when is not None:
                    decided = LINE_PREDICATES[pattern.when](m.groupdict())
                    if decided is None:
                        return
                self._record(entry, pattern, weight, window, start, index, m, decided)
                return
        if id(pattern) in self._fragmentable:
            # Opening words whose line goes on differently: a wrapped message, unless another
            # entry's template matches that line whole (a look-alike sharing the opening words,
            # such as two cuBLAS calls): decided once the whole chunk is read.
            self._deferred.append((entry, pattern, weight, window, start, index))

    def _record(self, entry: Entry, pattern: Pattern, weight: float, window: str, start: int,
                index: _LineIndex, m: re.Match[str] | None = None, decided: str | None = None,
                lines: int = 1) -> None:
        hits = self._hits.setdefault(entry.id, _Hits())
        line = index.line_of(start)
        if weight > hits.weights.get(pattern.name, 0.0):
            hits.weights[pattern.name] = weight
            hits.roles[pattern.name] = pattern.role
        # The evidence quotes the user's own line(s), as pasted (quote marks, entities and all).
        quoted = index.original_lines(line, lines)
        text = _evidence_text(window if quoted is None else quoted,
                              pattern.keyword if not pattern.ignore_case else None)
        if pattern.role == "against":
            if text not in hits.against:
                hits.against.append(text)
            return
        if pattern.role == "anchor":
            hits.anchor_lines.append(line)
            hits.free_anchor = hits.free_anchor or not pattern.needs_support
            if not pattern.trailer and not entry.wrapper:
                hits.explaining.add(line)
            hits.anchor_kinds.add("fragment" if weight < pattern.weight else "needs-support" if pattern.needs_support
                                  else "template" if pattern.template is not None else "pattern")
        anchor = pattern.role == "anchor"
        known = hits.evidence.get(line)
        if (known is None and len(hits.evidence) < _MAX_HITS_KEPT) or (
                known is not None and anchor and (not known[1] or lines > known[2])):
            hits.evidence[line] = (text, anchor, lines)
        if decided and decided not in hits.decided_by:
            hits.decided_by.append(decided)
        if m is not None:
            for name, value in m.groupdict().items():
                if value is not None:
                    hits.captures[name] = value.strip()  # the last occurrence wins

    def results(self) -> list[Match]:
        by_id = {e.id: e for e in self.entries}
        matches: dict[str, Match] = {}
        anchor_lines: dict[str, set[int]] = {}
        for entry_id, hits in self._hits.items():
            entry = by_id[entry_id]
            if not hits.anchor_lines:
                continue
            weights = [w for name, w in hits.weights.items() if hits.roles[name] != "against"]
            supports = sum(1 for name in hits.weights if hits.roles[name] == "support")
            # The line the verdict rests on (its first anchor) first, then the others in order.
            first = min(hits.anchor_lines)
            evidence = sorted(((text, line) for line, (text, _, _) in hits.evidence.items()),
                              key=lambda tl: (tl[1] != first, tl[1]))[:_MAX_EVIDENCE_PER_ENTRY]
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
            if not hits.free_anchor and supports == 0:
                continue  # rule 3: a reading of another entry's message, alone, is no match
            for name, w in hits.weights.items():
                if hits.roles[name] == "against":
                    confidence *= 1.0 - w
            matches[entry_id] = Match(
                entry, confidence, tuple(t for t, _ in evidence), dict(hits.captures),
                lines=tuple(n for _, n in evidence), decided_by=tuple(decided),
                against=tuple(hits.against[:3]), first_line=first,
                anchor_kinds=frozenset(hits.anchor_kinds), support=supports,
            )
            anchor_lines[entry_id] = set(hits.anchor_lines)
        _apply_precedence(matches, anchor_lines)
        self.platform = self._scan.platform()
        self.unrecognised = None
        explained = set().union(*(self._hits[i].explaining for i, m in matches.items()
                                  if m.confidence >= _MIN_CONFIDENCE or m.context_only))
        unexplained = [p for p in self._scan.primary if p.line not in explained]
        self.unexplained = tuple(unexplained)
        if self.platform is not None:
            _apply_platform(matches, self.platform.id)
        else:
            self.unrecognised = _apply_primary(matches, unexplained)
        ranked = sorted(
            (m for m in matches.values() if m.confidence >= _MIN_CONFIDENCE),
            key=lambda m: (m.context_only, -m.confidence, -m.entry.specificity, m.first_line, m.id),
        )
        return _calibrated(ranked, bool(unexplained), self.platform is not None, raw=self.raw)


def _demote(m: Match, cap: float, consequence_of: tuple[str, int] | None = None) -> Match:
    return replace(m, confidence=min(m.confidence, cap), context_only=True,
                   consequence_of=consequence_of or m.consequence_of)


def _apply_precedence(matches: dict[str, Match], anchor_lines: dict[str, set[int]] | None = None) -> None:
    """Rules 6 and 7 of the module docstring, in place."""
    lines = anchor_lines or {}
    for wrapper in [m for m in matches.values() if m.entry.wrapper]:
        carried = {n + d for n in lines.get(wrapper.id, {wrapper.first_line}) for d in (0, 1)}
        inner = sorted((m for m in matches.values() if m is not wrapper and not m.entry.wrapper
                        and m.confidence >= _MIN_CONFIDENCE and lines.get(m.id, {m.first_line}) & carried),
                       key=lambda m: (-m.confidence, m.first_line))
        if inner:
            matches[wrapper.id] = _demote(wrapper, min(wrapper.confidence, inner[0].confidence * 0.5),
                                          (inner[0].id, inner[0].first_line))
    for m in list(matches.values()):
        for loser in m.entry.supersedes:
            other = matches.get(loser)
            if other is not None and not other.context_only and (m.confidence >= CONFIDENT or m.confidence >= other.confidence * 0.9):
                matches[loser] = _demote(other, m.confidence * 0.5)
    confident = [m for m in matches.values() if not m.entry.generic and not m.context_only
                 and m.confidence >= CONFIDENT]
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
    # Without such a root, the first confident consequence-type error is the root of later ones
    # (an NCCL error, then the watchdog timeout it causes).
    firsts = sorted((m for m in live if m.entry.consequence and m.confidence >= CONFIDENT),
                    key=lambda m: m.first_line)
    for m in live:
        if m.entry.consequence:
            earlier = [r for r in roots if r.first_line < m.first_line] \
                or [r for r in firsts if r.first_line < m.first_line]
            if earlier:
                matches[m.id] = _demote(m, min(m.confidence, earlier[0].confidence * 0.5),
                                        (earlier[0].id, earlier[0].first_line))


def _apply_platform(matches: dict[str, Match], platform: str) -> None:
    """Rule 9, in place: on text from another platform, an entry that does not apply there is
    context, whatever its score."""
    for m in list(matches.values()):
        if not m.entry.applies_on(platform):
            matches[m.id] = replace(_demote(m, _CONTEXT_CAP), not_on=platform)


def _calibrated(ranked: list[Match], unexplained: bool, platform: bool, *, raw: bool = False) -> list[Match]:
    """Rule 11: every match keeps its raw score as `score`; a match that is not context states
    the calibrated confidence (gpudoctor.explain.calibration), a context match its capped score."""
    live = [m for m in ranked if not m.context_only]
    out = []
    for m in ranked:
        stated = m.confidence
        if not m.context_only and not raw:
            rival = max((o.confidence for o in live if o is not m), default=0.0)
            x = calibration.features(m.confidence, m.anchor_kinds, m.support, m.entry.generic, bool(m.against),
                                     rival, unexplained, platform)
            stated = calibration.stated(x, m.confidence)
        out.append(replace(m, confidence=stated, score=m.confidence))
    return out


def _apply_primary(matches: dict[str, Match], unexplained: list[PrimaryError]) -> PrimaryError | None:
    """Rule 10, in place: a primary CUDA error that no anchor explains (trailers and wrappers
    explain nothing) outranks a generic or wrapper verdict, which becomes its context. Returns
    that error (the first such), or None when an entry explains the text."""
    if not unexplained:
        return None
    live = sorted((m for m in matches.values() if not m.context_only and m.confidence >= _MIN_CONFIDENCE),
                  key=lambda m: (-m.confidence, -m.entry.specificity, m.first_line))
    if live and not (live[0].entry.generic or live[0].entry.wrapper):
        return None
    for m in live:
        if m.entry.generic or m.entry.wrapper:
            matches[m.id] = _demote(m, _CONTEXT_CAP)
    return unexplained[0]


def _windows_containing(haystack: str, original: str, keyword: str,
                        limit: int = 64) -> Iterable[tuple[int, str, int]]:
    """(offset, text, keyword offset in text) of the line around each occurrence of `keyword` in
    `haystack` (the same text, possibly lower-cased, so offsets agree), cut to `_WINDOW`
    characters either side of the keyword, each line once, at most `limit` lines."""
    pos = 0
    found = 0
    while found < limit:
        i = haystack.find(keyword, pos)
        if i < 0:
            return
        start, window, at, pos = _window_at(haystack, original, i, len(keyword))
        yield start, window, at
        found += 1


def _window_at(haystack: str, original: str, i: int, length: int) -> tuple[int, str, int, int]:
    """The line around offset `i` (a carriage return ends a line too: progress bars redraw with
    it; line numbers still count newlines only), cut to `_WINDOW` characters either side, and
    where to search next: after the line, or after the window when the line was cut."""
    lo = max(0, i - _WINDOW)
    hi = min(len(haystack), i + length + _WINDOW)
    line_start = haystack.rfind("\n", lo, i) + 1 or lo
    back = haystack.rfind("\r", line_start, i)
    if back >= 0:
        line_start = back + 1
    line_end = haystack.find("\n", i, hi)
    if line_end < 0:
        line_end = hi
    ahead = haystack.find("\r", i, line_end)
    if ahead >= 0:
        line_end = ahead
    following = line_end + 1 if line_end < hi else hi
    return line_start, original[line_start:line_end], i - line_start, following


def _single_spaced(chunk: str) -> str:
    """Runs of spaces and tabs become one space: pasted text is re-spaced (tables, wrapped
    terminals) and keywords hold single spaces. Newlines stay, so line numbers do not change.
    (str.replace passes, several times faster than a regex over a large chunk.)"""
    if "\t" in chunk:
        chunk = chunk.replace("\t", " ")
    while "  " in chunk:
        chunk = chunk.replace("    ", " ").replace("  ", " ")
    return chunk


_RARE_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ_([`<'bfgjkpqvwxyz")


def _needle(keyword: str) -> str | None:
    """The stretch of `keyword` (up to `_NEEDLE_CHARS`, at least 4 characters) that starts at its
    first character rare in ordinary text (upper case, `_`, brackets, quotes, uncommon letters), or
    None when it has none: the trigger regex only tries positions holding such a character."""
    for i, ch in enumerate(keyword):
        if ch in _RARE_START and len(keyword) - i >= 4:
            return keyword[i:i + _NEEDLE_CHARS]
    return None


def _trie(words: list[str]) -> str:
    """A regex matching any of `words`, as a trie of nested alternatives: at each position the
    engine follows one path, so the cost is the needle length, not the number of needles."""
    root: dict = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if "" in node:  # a needle ends here: anything longer is optional
            return "(?:" + "|".join(branches) + ")?" if branches else ""
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return build(root)


def _windows_matching(text: str, regex: re.Pattern[str], limit: int) -> Iterable[tuple[int, str, int]]:
    """As `_windows_containing`, for the lines where `regex` matches."""
    pos = 0
    found = 0
    while found < limit:
        m = regex.search(text, pos)
        if m is None:
            return
        start, window, at, pos = _window_at(text, text, m.start(), m.end() - m.start())
        yield start, window, at
        found += 1


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


def _prepared(chunk: str) -> tuple[str, str | None, dict[int, int]]:
    """(the chunk as `Matcher.feed` searches it, the chunk as the user wrote it or None when that
    is the same, the wrapped lines joined {line index: input lines}): colours removed, pasted
    forms undone (gpudoctor.explain.pasted; gutters and wrapped lines only in chunks up to `_JOIN_CHARS`,
    pasted text rather than a program's log), runs of spaces made one. Every line keeps its
    number."""
    if "\x1b" in chunk:
        chunk = _ANSI.sub("", chunk)
    original = chunk
    pasted = len(chunk) <= _JOIN_CHARS
    chunk = normalise_pasted(chunk, pasted=pasted)
    spans: dict[int, int] = {}
    if pasted:
        chunk, spans = join_wrapped(chunk)
    chunk = _single_spaced(chunk)
    return chunk, (None if chunk == original else original), spans


def entries_for(text: str) -> tuple[Entry, ...]:
    """The entries `text` can match: those with a pattern whose keyword occurs in it (rule 1),
    found in the knowledge base's keyword index (gpudoctor.knowledge.kbcache) and read alone. A matcher
    over them ranks `text` exactly as one over every entry does."""
    from gpudoctor.knowledge.kb import load_entries

    return load_entries(_ids_for(text)[0])


def platforms_for(text: str) -> tuple[Notice, ...]:
    """The platform notices whose marker keywords occur in `text` (as `entries_for` finds the
    entries), read alone: the same platform as with every notice, at the cost of those files."""
    from gpudoctor.knowledge.notices import load

    return tuple(load(i) for i in sorted(_ids_for(text)[1]))


def _ids_for(text: str) -> tuple[set[str], set[str]]:
    """(entry ids, platform ids) with a keyword in `text`, from the cached index."""
    from gpudoctor.knowledge.kbcache import catalogue_index

    index = catalogue_index()
    text = _prepared(text)[0]
    lowered: str | None = None
    ids: set[str] = set()
    for keyword, folded, users in index.keywords:
        if folded:
            if lowered is None:
                lowered = text.lower()
                if len(lowered) != len(text):
                    lowered = text.replace("\u0130", "I").lower()
            if keyword in lowered:
                ids.update(users)
        elif keyword in text:
            ids.update(users)
    platforms: set[str] = set()
    for keyword, folded, platform in index.markers:
        if platform in platforms:
            continue
        if folded:
            if lowered is None:
                lowered = text.replace("\u0130", "I").lower()
            if keyword in lowered:
                platforms.add(platform)
        elif keyword in text:
            platforms.add(platform)
    return ids, platforms


class Analysis:
    """Everything the matcher concluded about a text: the ranked matches, the platform the text
    comes from (rule 9) and the primary CUDA error no entry explains (rule 10). (A plain class:
    creating a dataclass costs start-up time.)"""

    __slots__ = ("matches", "platform", "unrecognised", "unexplained")

    def __init__(self, matches: tuple[Match, ...], platform: PlatformFinding | None = None,
                 unrecognised: PrimaryError | None = None, unexplained: tuple[PrimaryError, ...] = ()) -> None:
        self.matches, self.platform, self.unrecognised, self.unexplained = matches, platform, unrecognised, unexplained

    @property
    def verdict(self) -> Match | None:
        """The best match when it is the answer: not context (demoted by a rule)."""
        best = self.matches[0] if self.matches else None
        return best if best is not None and not best.context_only else None


def match_text(text: str) -> list[Match]:
    """Rank the known failures in `text`, best first (see the module docstring for the rules)."""
    return match_chunks([text])


def analyse_text(text: str, *, raw: bool = False) -> Analysis:
    """`match_text` with the platform and the unexplained primary error (`raw`: state the raw
    scores, as tools/calibrate.py reads them)."""
    return analyse_chunks([text], raw=raw)


def match_chunks(chunks: Iterable[str]) -> list[Match]:
    """The ranked matches of `analyse_chunks`."""
    return list(analyse_chunks(chunks).matches)


def analyse_chunks(chunks: Iterable[str], *, raw: bool = False) -> Analysis:
    """Rank the known failures in input read in chunks that end at line boundaries (a pasted
    error is one chunk; a large log many), and say which platform it comes from and which
    primary CUDA error no entry explains (rules 9 and 10). Chunks that
    know the input's line number of their first line (`gpudoctor.explain.textinput.Chunks.first_line`,
    set once the first chunk is read: a piped log whose head was dropped) are numbered from it,
    so the lines named as evidence are the log's own.

    Input of one chunk up to `_LAZY_CHARS` (a pasted error, a short log) is matched against
    only the entries it can match (`entries_for`), so that the rest are never read; a larger
    input against every entry, whose keywords the needle trie finds faster than one search
    per keyword."""
    source = iter(chunks)
    first = next(source, None)
    if first is None:
        return Analysis(())
    second = next(source, None)
    if second is None and len(first) <= _LAZY_CHARS:
        from gpudoctor.knowledge.kb import load_entries
        from gpudoctor.knowledge.notices import load

        ids, platform_ids = _ids_for(first)
        matcher = Matcher(load_entries(ids), tuple(load(i) for i in sorted(platform_ids)))
    else:
        matcher = Matcher()
    matcher._lines_before = (getattr(chunks, "first_line", None) or 1) - 1
    matcher.raw = raw
    matcher.feed(first)
    if second is not None:
        matcher.feed(second)
        for chunk in source:
            matcher.feed(chunk)
    matches = tuple(matcher.results())
    return Analysis(matches, matcher.platform, matcher.unrecognised, matcher.unexplained)
