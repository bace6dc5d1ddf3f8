"""`gpudoctor lint` on the labelled corpus of real projects' code (tests/fixtures/lint_corpus, drawn
and labelled before the linter changed): recall and precision stay above their floors, and the
cases issue 21 names are found (their reproductions), with none of their near misses.

The linter runs in this process, once per case with the case folder as the working directory, as
tools/lint_corpus_report.py runs it (that tool prints the same figures per rule)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from gpudoctor.lint import engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "lint_corpus"
RECALL_FLOOR, PRECISION_FLOOR = 0.85, 0.90

# Occurrences the linter does not reach yet, each for a reason the README's lint section gives:
# a transposed tensor handed to another module's view(), and the rank of a GRU's hidden state.
# (The forward replaced with types.MethodType, InfiniteTalk's xdit_context_parallel.py:60, is
# followed since the value flow of issue 33.)
# And one given up on purpose: a CPU table's elements used directly as repeat() sizes (skyreels),
# which the fresh corpus labels a near miss in the same construction (lightx2v): __index__ turns
# them into ints with no kernel and no sync (the README says why the two labels contradict).
KNOWN_MISSES = {
    ("view_on_parameters", "GPU003", "seq2seq/attention.py", 20),
    ("view_on_parameters", "GPU003", "seq2seq/model.py", 21),
    ("skyreels_v2", "GPU004", "skyreels_v2_infer/modules/transformer.py", 121),
}


def _tool():
    spec = importlib.util.spec_from_file_location("lint_corpus_report", ROOT / "tools" / "lint_corpus_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


TOOL = _tool()
CASES = sorted(p for p in CORPUS.iterdir() if (p / "labels.toml").is_file())


def _run(case_dir: pathlib.Path, monkeypatch, unfiltered: bool = False) -> tuple[dict, list, dict]:
    meta, labels = TOOL.load_labels(case_dir)
    monkeypatch.chdir(case_dir)
    result, _, _ = engine.lint(["."], isolated=True, jobs=1, unfiltered=unfiltered)
    findings = [TOOL.Finding(case_dir.name, f.code, f.path.replace("\\", "/"), f.line, f.message)
                for f in result.findings]
    return meta, labels, TOOL.compare(labels, findings)


@pytest.fixture(scope="module")
def measured():
    mp = pytest.MonkeyPatch()
    try:
        return {case.name: _run(case, mp) for case in CASES}
    finally:
        mp.undo()


def test_the_corpus_is_the_one_measured_before():
    assert len(CASES) == 20
    labels = [lb for case in CASES for lb in TOOL.load_labels(case)[1]]
    assert sum(lb.kind == "real" for lb in labels) == 77


def test_recall_and_precision_floors(measured):
    real = [lb for _, labels, _ in measured.values() for lb in labels if lb.kind == "real"]
    hit = set().union(*(r["hit"] for _, _, r in measured.values()))
    true_pos = sum(len(r["true_pos"]) for _, _, r in measured.values())
    false_pos = [(f.case, f.code, f.path, f.line) for _, _, r in measured.values() for f, _ in r["false_pos"]]
    recall = len(hit) / len(real)
    precision = true_pos / (true_pos + len(false_pos))
    assert recall >= RECALL_FLOOR, f"recall {len(hit)}/{len(real)}"
    assert precision >= PRECISION_FLOOR, f"precision {true_pos}/{true_pos + len(false_pos)}: {false_pos}"


@pytest.mark.parametrize("case", [c.name for c in CASES if "issue21" in TOOL.load_labels(c)[0]])
def test_the_cases_issue_21_names(case, measured):
    """Each case issue 21 names: its real occurrences found (but the known misses), no finding
    anywhere else, none of its near misses fired. A near miss labelled on the very line of a
    real occurrence of the same rule (lora_trainer's models/layer_weights.py:14, whose anchor is
    the fixed form on line 21) cannot be told apart and is not counted."""
    _, labels, result = measured[case]
    missed = {(case, lb.rule, lb.file, lb.line) for lb in labels if lb.kind == "real" and lb not in result["hit"]}
    assert missed <= KNOWN_MISSES, sorted(missed - KNOWN_MISSES)
    assert result["false_pos"] == []
    real_places = {(lb.rule, place) for lb in labels if lb.kind == "real" for place in lb.places()}
    fired = [lb for lb in result["fired_near"] if (lb.rule, (lb.file, lb.line)) not in real_places]
    assert fired == []


def test_known_misses_are_still_misses(measured):
    """When one of them is found, move it out of KNOWN_MISSES (and the README's list)."""
    found = {(case, lb.rule, lb.file, lb.line) for case, (_, _, r) in measured.items() for lb in r["hit"]}
    assert not (KNOWN_MISSES & found)


UNSEEN = ROOT / "tests" / "fixtures" / "lint_corpus_unseen"
# FITTED floors: measured once before any change (recall 28/43, precision 28/35), then the GPU009,
# GPU006 and GPU001 families were fixed with its cases in view (35/43, 35/35), then GPU004,
# GPU005 and GPU011 (39/43, 39/39), then issue 33's value flow (42/43, 42/42); the floors are
# that fitted level minus a margin, so they guard the fixes, not generalisation.
UNSEEN_RECALL_FLOOR, UNSEEN_PRECISION_FLOOR = 0.85, 0.95


def test_unseen_corpus_floors_fitted(monkeypatch):
    cases = sorted(p for p in UNSEEN.iterdir() if (p / "labels.toml").is_file())
    assert len(cases) == 20
    runs = [_run(case, monkeypatch) for case in cases]
    real = [lb for _, labels, _ in runs for lb in labels if lb.kind == "real"]
    hit = set().union(*(r["hit"] for _, _, r in runs))
    true_pos = sum(len(r["true_pos"]) for _, _, r in runs)
    false_pos = [(f.case, f.code, f.path, f.line) for _, _, r in runs for f, _ in r["false_pos"]]
    near = [(lb.file, lb.line, lb.rule) for _, _, r in runs for lb in r["fired_near"]]
    assert len(real) == 43
    assert len(hit) / len(real) >= UNSEEN_RECALL_FLOOR, f"recall {len(hit)}/{len(real)}"
    assert true_pos / max(1, true_pos + len(false_pos)) >= UNSEEN_PRECISION_FLOOR, f"false positives {false_pos}"
    assert near == [], near


FRESH = ROOT / "tests" / "fixtures" / "lint_corpus_fresh"
MIRRORS = pathlib.Path("/work/.mirror")
# FITTED floors: the fresh corpus (real files of 25 public projects at pinned commits, read from
# local mirrors; labelled blind) measured 35/53 recall, 43/78 precision on main 6e48044 before any
# change, 37/53 and 45/80 after issue 33's general work (neither helper had seen it), then the
# GPU009, GPU004 and GPU006 families were fixed with it in view: 53/53, 58/62. The floors are that
# fitted level minus a margin; they guard the fixes, they do not measure generalisation.
FRESH_RECALL_FLOOR, FRESH_PRECISION_FLOOR = 0.90, 0.90


def _materialised_fresh(tmp_path_factory) -> pathlib.Path:
    spec = importlib.util.spec_from_file_location("lint_corpus_materialize", ROOT / "tools" / "lint_corpus_materialize.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)  # type: ignore[union-attr]
    cases = sorted(p for p in FRESH.iterdir() if (p / "source.toml").is_file())
    try:
        for case in cases:
            repo = tool.read_source(case)[0]
            tool.find_git_dir(MIRRORS, repo, tool.read_source(case)[1])
    except Exception as exc:  # noqa: BLE001 (a missing mirror or commit: this machine cannot measure it)
        pytest.skip(f"the fresh corpus needs the git mirrors under {MIRRORS}: {exc}")
    out = tmp_path_factory.mktemp("lint_corpus_fresh")
    if tool.main([str(FRESH), str(out), "--mirrors", str(MIRRORS)]) != 0:
        pytest.skip("the fresh corpus could not be written out from the mirrors")
    return out


def test_fresh_corpus_floors_fitted(tmp_path_factory, monkeypatch):
    if not MIRRORS.is_dir():
        pytest.skip(f"the fresh corpus is read from git mirrors under {MIRRORS} (CI has none)")
    out = _materialised_fresh(tmp_path_factory)
    cases = sorted(p for p in out.iterdir() if (p / "labels.toml").is_file())
    assert len(cases) == 26
    runs = [_run(case, monkeypatch) for case in cases]
    real = [lb for _, labels, _ in runs for lb in labels if lb.kind == "real"]
    hit = set().union(*(r["hit"] for _, _, r in runs))
    true_pos = sum(len(r["true_pos"]) for _, _, r in runs)
    false_pos = [(f.case, f.code, f.path, f.line) for _, _, r in runs for f, _ in r["false_pos"]]
    assert len(real) == 53
    assert len(hit) / len(real) >= FRESH_RECALL_FLOOR, f"recall {len(hit)}/{len(real)}"
    assert true_pos / max(1, true_pos + len(false_pos)) >= FRESH_PRECISION_FLOOR, f"false positives {false_pos}"


def _found(runs) -> list:
    return sorted((f.case, f.code, f.path, f.line) for _, _, r in runs
                  for f in r["true_pos"] + [f for f, _ in r["false_pos"]])


@pytest.mark.slow
def test_the_prefilters_lose_nothing_on_the_corpora(tmp_path_factory, monkeypatch):
    """Every corpus case linted with the prefilters and trigger words off gives the same findings
    (the fresh corpus too where its mirrors exist)."""
    corpora = [CORPUS, UNSEEN]
    if MIRRORS.is_dir():
        try:
            corpora.append(_materialised_fresh(tmp_path_factory))
        except pytest.skip.Exception:
            pass
    for corpus in corpora:
        cases = sorted(p for p in corpus.iterdir() if (p / "labels.toml").is_file())
        normal = [_run(case, monkeypatch) for case in cases]
        unfiltered = [_run(case, monkeypatch, unfiltered=True) for case in cases]
        assert _found(unfiltered) == _found(normal), corpus.name
