"""The confidence `explain` states: a logistic model of how often a verdict with these features
was right on labelled real texts, fitted by tools/calibrate.py and kept as data beside this module
(`calibration.json`). The matcher's raw score (rule 5 of gpudoctor.explain.matcher) ranks matches;
this says how far to trust the one that won.

Features of a match (all read from the match and the text, none from its label):

    score            the logit of the raw score (the evidence's weights combined)
    template         an anchor matched a message template whole (the source's own words)
    fragment_only    every anchor matched only as a fragment (a message cut short or retyped)
    needs_support    an anchor that reads another entry's message, confirmed by a support
    hand_pattern     an anchor matched only a hand-written pattern (a frame, a tracker spelling)
    support          log(1 + the number of support patterns and derived facts that matched)
    generic          the entry is generic (a trailer or a wrapper's reading)
    against          a line argued against it
    rival            the raw score of the next match that is not context
    unexplained      the text holds a primary CUDA error no match explains
    platform         the text comes from another platform where this entry applies too

Only a raw score of at least `FLOOR` (0.5) is calibrated: below it the evidence is weak (a
fragment, one weak pattern) and the stated confidence is the raw score itself, never raised into
"confident" by how often strong evidence was right. A missing or unreadable `calibration.json`
leaves the raw score as the stated confidence (the tests keep the file present and current).
Standard library only.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Sequence

FEATURES = ("score", "template", "fragment_only", "needs_support", "hand_pattern", "support", "generic",
            "against", "rival", "unexplained", "platform")
PARAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration.json")
FORMAT = 1
FLOOR = 0.5  # raw scores below this are stated as they are
_EPS = 0.02


def logit(p: float) -> float:
    p = min(1.0 - _EPS, max(_EPS, p))
    return math.log(p / (1.0 - p))


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def features(score: float, anchor_kinds: frozenset[str] | set[str], support: int, generic: bool, against: bool,
             rival: float, unexplained: bool, platform: bool) -> tuple[float, ...]:
    """The feature vector of the module docstring, in FEATURES order."""
    kinds = set(anchor_kinds)
    return (
        logit(score),
        1.0 if "template" in kinds else 0.0,
        1.0 if kinds and kinds <= {"fragment"} else 0.0,
        1.0 if "needs-support" in kinds else 0.0,
        1.0 if kinds == {"pattern"} else 0.0,
        math.log1p(support),
        1.0 if generic else 0.0,
        1.0 if against else 0.0,
        rival,
        1.0 if unexplained else 0.0,
        1.0 if platform else 0.0,
    )


@functools.lru_cache(maxsize=1)
def params() -> tuple[tuple[float, ...], float] | None:
    """(weights, bias) from calibration.json, or None when it is missing or not what the fitting
    tool writes."""
    try:
        with open(PARAMS, encoding="utf-8") as f:
            data = json.load(f)
        weights = tuple(float(w) for w in data["weights"])
        if data.get("format") != FORMAT or tuple(data["features"]) != FEATURES or len(weights) != len(FEATURES):
            return None
        return weights, float(data["bias"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stated(x: Sequence[float], score: float) -> float:
    """The stated confidence for feature vector `x`, between 0.01 and 0.99 (a doctor is never
    certain); the raw `score` below FLOOR or when there are no parameters."""
    fitted = params()
    if fitted is None or score < FLOOR:
        return score
    weights, bias = fitted
    return min(0.99, max(0.01, sigmoid(bias + sum(w * v for w, v in zip(weights, x)))))
