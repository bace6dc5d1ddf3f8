"""Fit the confidence `explain` states (gpudoctor.explain.calibration) on every labelled real text,
and measure it on texts it was not fitted on.

    python tools/calibrate.py            # refit: write doctor/explain/calibration.json and the
                                         # reliability table in docs/explain.md
    python tools/calibrate.py --check    # exit 1 when either is not what the data gives now
                                         # (tests/test_calibration.py runs the same check)
    python tools/calibrate.py --measure r7   # the reliability of the confidence explain states
                                         # now (calibration.json as it is) on one group alone:
                                         # the honest figure for a round it was not fitted on

The labelled texts, in groups:

    dev        tests/fixtures/dev/<id>/*.txt: the texts patterns were developed against
    new        tests/fixtures/calibration/<id>/*.txt: real texts the matcher was left unable to
               read (their README says why): the misses the stated confidence must learn from
    examples   every knowledge-base entry's [[examples]] (labelled with their entry)
    r1 ... r7  tests/fixtures/heldout/<id>/*.txt by round (names `r2-`...; round 1 has no prefix)

`none/` folders hold texts whose cause no entry covers: a verdict naming any entry there is wrong.
Round 7 (`r7-*`), drawn blind for issue 28, joined the fit once its before-figure and the
reliability of the parameters fitted without it (`--measure r7` at commit 09c3ad3, kept in
docs/explain.md as the honest table) were reported. A new round stays out of FIT_GROUPS until the
same two figures are reported for it.

Each text is matched with raw scores; its verdict (the best match that is not context) gives one
sample: the features of gpudoctor.explain.calibration and whether the verdict names the label. A
text whose verdict is no entry (a platform, an unrecognised CUDA error, nothing) states no
confidence and is counted apart. The model is a logistic regression fitted on the verdicts whose
raw score reaches the calibration's floor (weaker ones are stated as their raw score), with an L2
penalty towards "stated = raw score" (`prior`), by Newton's method (deterministic, standard
library). It is measured by leaving one group out at a
time: each group's verdicts get the confidence a model fitted on the other groups states, and the
reliability table compares that stated confidence with how often those verdicts were right.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DOCS = ROOT / "docs" / "explain.md"
FIT_GROUPS = ("dev", "new", "examples", "r1", "r2", "r3", "r4", "r5", "r6", "r7")
L2 = 3.0
BANDS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.95), (0.95, 1.0))
CONFIDENT = 0.5
MARKER = "reliability"
_ROUND = re.compile(r"^(r\d+)-")


@dataclass(frozen=True)
class Sample:
    group: str
    label: str
    name: str
    verdict: str | None  # an entry id; None when the verdict is no entry
    kind: str  # "entry", "platform", "unrecognised", "nothing"
    x: tuple[float, ...]
    right: bool

    @property
    def strong(self) -> bool:
        """A raw score the model calibrates (below the floor it is stated as it is)."""
        from gpudoctor.explain.calibration import FLOOR, sigmoid

        return bool(self.x) and sigmoid(self.x[0]) >= FLOOR - 1e-9


def round_of(path: pathlib.Path) -> str:
    m = _ROUND.match(path.name)
    return m.group(1) if m else "r1"


def texts(groups: tuple[str, ...] = FIT_GROUPS) -> list[tuple[str, str, str, str]]:
    """(group, label, name, text) for every labelled text of `groups` (FIT_GROUPS by default)."""
    from gpudoctor.knowledge import kb

    out = []
    for group, folder in (("dev", "dev"), ("new", "calibration")):
        for path in sorted((FIXTURES / folder).glob("*/*.txt")):
            out.append((group, path.parent.name, f"{folder}/{path.parent.name}/{path.stem}", _body(path)))
    for entry in kb.load_all():
        for n, example in enumerate(entry.examples):
            out.append(("examples", entry.id, f"examples/{entry.id}/{n}", example.text))
    for path in sorted((FIXTURES / "heldout").glob("*/*.txt")):
        out.append((round_of(path), path.parent.name, f"heldout/{path.parent.name}/{path.stem}", _body(path)))
    return [t for t in out if t[0] in groups]


def _body(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8").partition("\n")[2]


def sample(group: str, label: str, name: str, text: str) -> Sample:
    from gpudoctor.explain import calibration
    from gpudoctor.explain.matcher import analyse_text

    analysis = analyse_text(text, raw=True)
    verdict = analysis.verdict
    if verdict is None:
        kind = "platform" if analysis.platform else "unrecognised" if analysis.unrecognised else "nothing"
        return Sample(group, label, name, None, kind, (), False)
    live = [m for m in analysis.matches if not m.context_only and m is not verdict]
    x = calibration.features(verdict.score, verdict.anchor_kinds, verdict.support, verdict.entry.generic,
                             bool(verdict.against), max((m.score for m in live), default=0.0),
                             bool(analysis.unexplained), analysis.platform is not None)
    return Sample(group, label, name, verdict.id, "entry", x, verdict.id == label)


def collect() -> list[Sample]:
    return [sample(*t) for t in texts()]


# --- logistic regression -------------------------------------------------------------------------


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small and positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def prior() -> list[float]:
    """Where the penalty pulls the parameters: stated confidence = the raw score (the weight of
    the score's logit 1, every other weight and the bias 0). Where labelled texts are few (low
    scores, rare features) the fit stays near the matcher's own score instead of near 50%."""
    from gpudoctor.explain.calibration import FEATURES

    return [1.0 if name == "score" else 0.0 for name in FEATURES] + [0.0]


def fit(samples: list[Sample], l2: float = L2) -> tuple[list[float], float]:
    """(weights, bias) maximising the log-likelihood of `right` given the features (verdicts with
    a strong raw score), with an L2
    penalty towards `prior()`."""
    from gpudoctor.explain.calibration import sigmoid

    rows = [(s.x, 1.0 if s.right else 0.0) for s in samples if s.kind == "entry" and s.strong]
    k = len(rows[0][0]) + 1  # the bias last
    centre = prior()
    theta = centre[:]
    for _ in range(50):
        grad = [0.0] * k
        hess = [[0.0] * k for _ in range(k)]
        for x, y in rows:
            v = (*x, 1.0)
            p = sigmoid(sum(t * xi for t, xi in zip(theta, v)))
            w = p * (1.0 - p)
            for i in range(k):
                grad[i] += (p - y) * v[i]
                for j in range(k):
                    hess[i][j] += w * v[i] * v[j]
        for i in range(k):
            grad[i] += l2 * (theta[i] - centre[i])
            hess[i][i] += l2
        step = _solve(hess, grad)
        theta = [t - s for t, s in zip(theta, step)]
        if max(abs(s) for s in step) < 1e-10:
            break
    return theta[:-1], theta[-1]


def predict(params: tuple[list[float], float], x: tuple[float, ...]) -> float:
    """What gpudoctor.explain.calibration.stated says with these parameters."""
    from gpudoctor.explain.calibration import FLOOR, sigmoid

    raw = sigmoid(x[0])
    if raw < FLOOR - 1e-9:
        return raw
    weights, bias = params
    return min(0.99, max(0.01, sigmoid(bias + sum(w * v for w, v in zip(weights, x)))))


def held_out(samples: list[Sample]) -> list[tuple[Sample, float]]:
    """Every entry verdict with the confidence a model fitted without its group states."""
    out = []
    for group in FIT_GROUPS:
        train = [s for s in samples if s.group != group]
        params = fit(train)
        out += [(s, predict(params, s.x)) for s in samples if s.group == group and s.kind == "entry"]
    return out


def measured(group: str) -> str:
    """The reliability table of the stated confidence as `explain` states it now (the parameters
    in calibration.json, whatever they were fitted on) on one group's texts: on a round the
    parameters were not fitted on, the honest figure."""
    from gpudoctor.explain.matcher import analyse_text

    rows = []
    kinds = {"platform": 0, "unrecognised": 0, "nothing": 0}
    chosen = texts((group,))
    for _, label, _, text in chosen:
        analysis = analyse_text(text)
        verdict = analysis.verdict
        if verdict is None:
            kinds["platform" if analysis.platform else "unrecognised" if analysis.unrecognised else "nothing"] += 1
        else:
            rows.append((verdict.confidence, verdict.id == label, label))
    return _bands(rows) + (
        f"\n{len(chosen)} texts of {group}; {len(rows)} entry verdicts, "
        f"{sum(1 for p, _, _ in rows if p >= CONFIDENT)} confident (stated >= {CONFIDENT}), of which "
        f"{sum(1 for p, ok, _ in rows if p >= CONFIDENT and ok)} right; confident on texts whose cause no entry "
        f"covers: {sum(1 for p, _, label in rows if p >= CONFIDENT and label == 'none')}; "
        f"{kinds['platform']} answered with a platform, {kinds['unrecognised']} with an unrecognised CUDA error, "
        f"{kinds['nothing']} with nothing.\n")


def _bands(rows: list[tuple[float, bool, str]]) -> str:
    """Markdown rows: (stated confidence, right, label) counted per band of BANDS."""
    lines = ["| stated confidence | verdicts | right | precision |", "| --- | ---: | ---: | ---: |"]
    for lo, hi in BANDS:
        band = [ok for p, ok, _ in rows if lo <= p < hi or (hi == 1.0 and p == 1.0)]
        share = f"{sum(band) / len(band):.1%}" if band else "-"
        lines.append(f"| {lo:.2f}-{hi:.2f} | {len(band)} | {sum(band)} | {share} |")
    return "\n".join(lines) + "\n"


# --- outputs -------------------------------------------------------------------------------------


def params_json(samples: list[Sample]) -> str:
    from gpudoctor.explain.calibration import FEATURES, FORMAT

    weights, bias = fit(samples)
    counts = {g: sum(1 for s in samples if s.group == g and s.kind == "entry") for g in FIT_GROUPS}
    data = {"format": FORMAT, "generated_by": "tools/calibrate.py", "features": list(FEATURES),
            "weights": [round(w, 4) for w in weights], "bias": round(bias, 4), "l2": L2,
            "fitted_on": {"groups": list(FIT_GROUPS), "verdicts": counts,
                          "right": sum(s.right for s in samples), "wrong": sum(1 for s in samples
                                                                               if s.kind == "entry" and not s.right)}}
    return json.dumps(data, indent=2) + "\n"


def table(samples: list[Sample]) -> str:
    """The reliability table (Markdown) of the held-out confidences, with the counts beside it."""
    rows = held_out(samples)
    lines = _bands([(p, s.right, s.label) for s, p in rows]).rstrip("\n").split("\n")
    confident = [(s, p) for s, p in rows if p >= CONFIDENT]
    right = sum(s.right for s, _ in confident)
    negatives = [s for s in samples if s.label == "none"]
    wrong_negatives = sum(1 for s, p in rows if s.label == "none" and p >= CONFIDENT)
    kinds = {k: sum(1 for s in samples if s.kind == k) for k in ("platform", "unrecognised", "nothing")}
    per_group = ", ".join(f"{g} {sum(1 for s, p in confident if s.group == g and s.right)}/"
                          f"{sum(1 for s, p in confident if s.group == g)}" for g in FIT_GROUPS)
    lines += [
        "",
        f"Confident verdicts (stated >= {CONFIDENT}): {len(confident)}, of which {right} right "
        f"({right / max(len(confident), 1):.1%}); by group left out: {per_group}. "
        f"Texts whose cause no entry covers: {len(negatives)}, of which {wrong_negatives} got a confident "
        f"entry. {len(samples)} labelled texts in all; {kinds['platform']} answered with a platform, "
        f"{kinds['unrecognised']} with an unrecognised CUDA error, {kinds['nothing']} with nothing "
        "(no stated confidence).",
    ]
    return "\n".join(lines) + "\n"


def rewrite(text: str, body: str) -> str:
    pattern = re.compile(rf"<!-- {MARKER}:start -->\n.*<!-- {MARKER}:end -->", re.S)
    if not pattern.search(text):
        raise SystemExit(f"calibrate: the {MARKER} markers are missing from {DOCS}")
    return pattern.sub(lambda _: f"<!-- {MARKER}:start -->\n{body}<!-- {MARKER}:end -->", text)


def stale(samples: list[Sample] | None = None) -> list[str]:
    """What is not what the data gives now: the parameters file, the docs table (empty: current)."""
    from gpudoctor.explain.calibration import PARAMS

    samples = collect() if samples is None else samples
    out = []
    params = pathlib.Path(PARAMS)
    if not params.exists() or params.read_text(encoding="utf-8") != params_json(samples):
        out.append(str(params.relative_to(ROOT)))
    page = DOCS.read_text(encoding="utf-8")
    if rewrite(page, table(samples)) != page:
        out.append(f"{DOCS.relative_to(ROOT)} ({MARKER} table)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the parameters or the table are stale")
    parser.add_argument("--measure", metavar="GROUP", help="print the reliability of the confidence stated now on one "
                        "group (r7, dev, ...) and change nothing")
    args = parser.parse_args()
    if args.measure:
        print(measured(args.measure), end="")
        return
    samples = collect()
    if args.check:
        bad = stale(samples)
        for item in bad:
            print(f"calibrate: stale: {item} (python tools/calibrate.py)")
        sys.exit(1 if bad else 0)
    from gpudoctor.explain.calibration import PARAMS

    pathlib.Path(PARAMS).write_text(params_json(samples), encoding="utf-8")
    DOCS.write_text(rewrite(DOCS.read_text(encoding="utf-8"), table(samples)), encoding="utf-8")
    print(table(samples))


if __name__ == "__main__":
    main()
