"""Redaction's replacement engine: find every span on the original text, then keep and replace.

Each detector (gpudoctor.reports.redact_secrets, gpudoctor.reports.redact_machines, and the known
values of gpudoctor.reports.redact) reads the text as it was given and proposes `Span`s: where,
how strong its claim is (`rank`), and how to render the replacement. `resolve` keeps, where spans
overlap, the strongest claim (the lowest rank: a private key block, then a secret, then an
identity, then a machine, then a known name), then the longest, then the detector listed first;
`apply` renders the kept spans left to right, so placeholders are numbered in the order a reader
meets them, and a value is learned only when its span is kept.

No detector ever sees another's replacement, so the order in which they run cannot decide what
is hidden: `postgresql://alice:PW@db/x` holds credentials whether or not alice is the current
user (whose name is hidden too, with a weaker claim), and `mysql://root:PW@...` on a machine whose
home is /root is a URL, not the home folder `/root`.

Standard library only.
"""
from __future__ import annotations

import bisect
import re
from typing import Callable, Iterator, NamedTuple

RANK_KEY = 0  # a private key block
RANK_SECRET = 1
RANK_IDENTITY = 2  # homes, e-mail addresses, user@host
RANK_MACHINE = 3  # hosts, addresses, ids
RANK_NAME = 4  # a known user name as a word or path component


class Span(NamedTuple):
    start: int
    end: int
    rank: int
    render: Callable[[], str]  # the replacement, made only when the span is kept
    order: int = 0  # between detectors of one rank, claims of the same length: lower first


def resolve(spans: list[Span]) -> list[Span]:
    """The spans to replace: no two overlap; of overlapping ones the lowest rank, then the
    longest, then the lowest `order` wins. Returned sorted by start."""
    if len(spans) <= 1:
        return list(spans)
    kept: list[Span] = []
    starts: list[int] = []
    for span in sorted(spans, key=lambda s: (s.rank, s.start - s.end, s.order, s.start)):
        i = bisect.bisect_right(starts, span.start)
        if (i > 0 and kept[i - 1].end > span.start) or (i < len(kept) and kept[i].start < span.end):
            continue
        starts.insert(i, span.start)
        kept.insert(i, span)
    return kept


def apply(text: str, spans: list[Span]) -> str:
    """`text` with each of `spans` (sorted, not overlapping) replaced by its rendering."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for span in spans:
        out.append(text[pos:span.start])
        out.append(span.render())
        pos = span.end
    out.append(text[pos:])
    return "".join(out)


_FOLDED: dict[re.Pattern[str], re.Pattern[str]] = {}


def folded(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """The case-sensitive twin of a `(?i)` pattern written in lower case: run on `text.lower()` it
    finds the same matches about ten times faster (sre's case folding is slow on alternations)."""
    twin = _FOLDED.get(pattern)
    if twin is None:
        twin = _FOLDED[pattern] = re.compile(pattern.pattern.replace("(?i)", "", 1))
    return twin


Hit = tuple[int, int, Callable[[], str]]  # what a detector's handler returns: start, end, render


def scan(
    text: str, anchor: re.Pattern[str], handler: Callable[[re.Match[str], str], Hit | None],
    rank: int, order: int = 0, low: str | None = None,
) -> Iterator[Span]:
    """Spans chosen by `handler(match, text) -> (start, end, render) | None` for each match of
    `anchor`, left to right; an anchor inside the span its detector took just before is skipped.
    A case-insensitive anchor runs on the lowered text where lowering keeps every offset (ASCII);
    the handler then sees the match's positions and lower-case groups."""
    if anchor.flags & re.IGNORECASE and anchor.pattern.startswith("(?i)") and text.isascii():
        matches = folded(anchor).finditer(low if low is not None else text.lower())
    else:
        matches = anchor.finditer(text)
    pos = 0
    for m in matches:
        if m.start() < pos:
            continue
        hit = handler(m, text)
        if hit is None:
            continue
        start, end, render = hit
        if start < pos or end <= start:
            continue
        pos = end
        yield Span(start, end, rank, render, order)


def sub_spans(pattern: re.Pattern[str], text: str, decide: Callable[[re.Match[str]], Callable[[], str] | None],
              rank: int, order: int = 0) -> Iterator[Span]:
    """A span for each match of `pattern` that `decide(match)` claims: it returns the rendering
    (called only if the span is kept), or None to leave the match alone. Deciding has no side
    effects; rendering may (a pseudonym is numbered, a value learned)."""
    for m in pattern.finditer(text):
        render = decide(m)
        if render is not None:
            yield Span(m.start(), m.end(), rank, render, order)
