"""Rules 6 to 11 of gpudoctor.explain.matcher (its docstring states them): once every entry's
patterns have been scored, which match is the answer and which are only its context. A wrapper
gives way to the error it carries, an entry gives way to one that supersedes it, generic entries
to a confident specific one, later sticky and consequence errors to the first root cause (6, 7);
on another platform's text, entries that do not apply there are context (9); a primary CUDA error
no entry explains outranks a generic or wrapper verdict (10); and the confidence a match states
is the calibrated one (11).

Each function takes the matches by entry id and rewrites them in place (or returns new ones);
none reads text. Standard library only.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpudoctor.explain import calibration

if TYPE_CHECKING:
    from gpudoctor.explain.matcher import Match
    from gpudoctor.explain.notice import PrimaryError

CONTEXT_CAP = 0.25  # the most a match demoted to context states
MIN_CONFIDENCE = 0.2  # matches under it are dropped (rule 8)
CONFIDENT = 0.5  # a verdict at or above it is stated as confident


def _demote(m: Match, cap: float, consequence_of: tuple[str, int] | None = None) -> Match:
    return replace(m, confidence=min(m.confidence, cap), context_only=True,
                   consequence_of=consequence_of or m.consequence_of)


def apply_precedence(matches: dict[str, Match], anchor_lines: dict[str, set[int]] | None = None) -> None:
    """Rules 6 and 7 of the module docstring, in place."""
    lines = anchor_lines or {}
    for wrapper in [m for m in matches.values() if m.entry.wrapper]:
        carried = {n + d for n in lines.get(wrapper.id, {wrapper.first_line}) for d in (0, 1)}
        inner = sorted((m for m in matches.values() if m is not wrapper and not m.entry.wrapper
                        and m.confidence >= MIN_CONFIDENCE and lines.get(m.id, {m.first_line}) & carried),
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
            matches[m.id] = _demote(m, CONTEXT_CAP)

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


def apply_platform(matches: dict[str, Match], platform: str) -> None:
    """Rule 9, in place: on text from another platform, an entry that does not apply there is
    context, whatever its score."""
    for m in list(matches.values()):
        if not m.entry.applies_on(platform):
            matches[m.id] = replace(_demote(m, CONTEXT_CAP), not_on=platform)


def calibrated(ranked: list[Match], unexplained: bool, platform: bool, *, raw: bool = False) -> list[Match]:
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


def apply_primary(matches: dict[str, Match], unexplained: list[PrimaryError]) -> PrimaryError | None:
    """Rule 10, in place: a primary CUDA error that no anchor explains (trailers and wrappers
    explain nothing) outranks a generic or wrapper verdict, which becomes its context. Returns
    that error (the first such), or None when an entry explains the text."""
    if not unexplained:
        return None
    live = sorted((m for m in matches.values() if not m.context_only and m.confidence >= MIN_CONFIDENCE),
                  key=lambda m: (-m.confidence, -m.entry.specificity, m.first_line))
    if live and not (live[0].entry.generic or live[0].entry.wrapper):
        return None
    for m in live:
        if m.entry.generic or m.entry.wrapper:
            matches[m.id] = _demote(m, CONTEXT_CAP)
    return unexplained[0]
