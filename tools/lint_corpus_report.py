"""Measure `gpudoctor lint` on the labelled corpus of real-project reproductions
(tests/fixtures/lint_corpus by default).

    python tools/lint_corpus_report.py [FOLDER] [--case NAME] [--misses] [--json] [--check-labels]

Each case is a folder holding a small project and its `labels.toml` (the format is in
tests/fixtures/lint_corpus/README.md). The linter runs once per case, as `gpudoctor lint .
--format json --isolated` with the case folder as the working directory, so the case is the
project root. A finding is a true positive when its code, file and line match a real
occurrence (its line or one of its `alt` lines); anything else is a false positive, on a near
miss or on an unlabelled line. Recall counts occurrences found at least once; precision counts
findings. Labels whose `anchor` text is no longer on their line are refused (exit 2), so an
edited fixture cannot silently shift the measurement. Run it against another checkout's code
with PYTHONPATH, or with that checkout's interpreter.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = ROOT / "tests" / "fixtures" / "lint_corpus"
RULES = tuple(f"GPU{n:03d}" for n in range(1, 13))  # GPU001..GPU012


class LabelError(Exception):
    """A labels.toml that cannot be read, or whose anchors moved."""


@dataclasses.dataclass(frozen=True)
class Label:
    case: str
    kind: str  # "real" or "near_miss"
    rule: str
    file: str
    line: int
    why: str
    source: str
    alt: tuple[tuple[str, int], ...] = ()

    def places(self) -> tuple[tuple[str, int], ...]:
        return ((self.file, self.line),) + self.alt


@dataclasses.dataclass(frozen=True)
class Finding:
    case: str
    code: str
    path: str
    line: int
    message: str


def _check_anchor(case_dir: pathlib.Path, file: str, line: int, anchor: str, where: str) -> None:
    path = case_dir / file
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LabelError(f"{where}: cannot read {file}: {exc.strerror}") from None
    if not 1 <= line <= len(lines) or anchor not in lines[line - 1]:
        raise LabelError(f"{where}: {file}:{line} does not contain {anchor!r}")


def load_labels(case_dir: pathlib.Path) -> tuple[dict, list[Label]]:
    name = case_dir.name
    try:
        data = tomllib.loads((case_dir / "labels.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LabelError(f"{name}/labels.toml: {exc}") from None
    labels = []
    for kind in ("real", "near_miss"):
        for i, entry in enumerate(data.get(kind, []), 1):
            where = f"{name}/labels.toml {kind} #{i}"
            missing = [k for k in ("rule", "file", "line", "anchor", "why", "source") if k not in entry]
            if missing:
                raise LabelError(f"{where}: missing {', '.join(missing)}")
            if entry["rule"] not in RULES:
                raise LabelError(f"{where}: unknown rule {entry['rule']!r}")
            _check_anchor(case_dir, entry["file"], entry["line"], entry["anchor"], where)
            alt = []
            for a in entry.get("alt", []):
                _check_anchor(case_dir, a["file"], a["line"], a["anchor"], where + " alt")
                alt.append((a["file"], a["line"]))
            labels.append(Label(name, kind, entry["rule"], entry["file"], entry["line"],
                                entry["why"], entry["source"], tuple(alt)))
    return data.get("case", {}), labels


def lint_case(case_dir: pathlib.Path) -> tuple[list[Finding], list[dict]]:
    """Findings of `gpudoctor lint` with the case folder as the project root."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "lint", ".", "--format", "json", "--isolated"],
        cwd=case_dir, capture_output=True, text=True, timeout=300,
    )
    if proc.returncode not in (0, 1, 2) or not proc.stdout.strip():
        raise RuntimeError(f"{case_dir.name}: gpudoctor lint exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    report = json.loads(proc.stdout)
    findings = [Finding(case_dir.name, f["code"], f["path"].removeprefix("./"), f["line"], f["message"])
                for f in report["findings"]]
    return findings, report.get("errors", [])


def compare(labels: list[Label], findings: list[Finding]) -> dict:
    real = [lb for lb in labels if lb.kind == "real"]
    near = [lb for lb in labels if lb.kind == "near_miss"]
    by_place: dict[tuple[str, str, int], list[Label]] = {}
    for lb in real:
        for file, line in lb.places():
            by_place.setdefault((lb.rule, file, line), []).append(lb)
    near_places = {(lb.file, lb.line): lb for lb in near}
    real_places = {place for lb in real for place in lb.places()}

    hit: set[Label] = set()
    true_pos, false_pos = [], []
    for f in findings:
        matched = by_place.get((f.code, f.path, f.line))
        if matched:
            true_pos.append(f)
            hit.update(matched)
            continue
        if (f.path, f.line) in near_places:
            kind = f"near miss ({near_places[(f.path, f.line)].rule})"
        elif (f.path, f.line) in real_places:
            kind = "real occurrence of another rule"
        else:
            kind = "unlabelled line"
        false_pos.append((f, kind))
    fired_near = [lb for lb in near if any((f.path, f.line) == (lb.file, lb.line) for f in findings)]
    return {"real": real, "near": near, "hit": hit, "true_pos": true_pos, "false_pos": false_pos,
            "fired_near": fired_near}


def measure(folder: pathlib.Path, only: str | None = None) -> dict:
    cases = sorted(p for p in folder.iterdir() if (p / "labels.toml").is_file())
    if only:
        cases = [p for p in cases if p.name == only]
        if not cases:
            raise LabelError(f"no case named {only!r} in {folder}")
    totals = {"real": [], "near": [], "hit": set(), "true_pos": [], "false_pos": [], "fired_near": []}
    per_case, errors = [], []
    for case_dir in cases:
        meta, labels = load_labels(case_dir)
        findings, lint_errors = lint_case(case_dir)
        errors += [f"{case_dir.name}: {e.get('path')}: {e.get('message')}" for e in lint_errors]
        result = compare(labels, findings)
        per_case.append((case_dir.name, meta, result))
        for key in ("real", "near", "true_pos", "false_pos", "fired_near"):
            totals[key] += result[key]
        totals["hit"] |= result["hit"]
    return {"cases": per_case, "totals": totals, "errors": errors}


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "n/a"


def summary(result: dict) -> dict:
    t = result["totals"]
    findings = len(t["true_pos"]) + len(t["false_pos"])
    rules = {}
    for rule in RULES:
        occ = [lb for lb in t["real"] if lb.rule == rule]
        tp = [f for f in t["true_pos"] if f.code == rule]
        fp = [f for f, _ in t["false_pos"] if f.code == rule]
        near = [lb for lb in t["near"] if lb.rule == rule]
        rules[rule] = {"occurrences": len(occ), "found": len([lb for lb in occ if lb in t["hit"]]),
                       "findings": len(tp) + len(fp), "true_positives": len(tp), "false_positives": len(fp),
                       "near_misses": len(near), "near_misses_fired": len([lb for lb in t["fired_near"] if lb.rule == rule])}
    return {
        "cases": len(result["cases"]),
        "recall": {"found": len(t["hit"]), "occurrences": len(t["real"])},
        "precision": {"true_positives": len(t["true_pos"]), "findings": findings},
        "near_misses": {"fired": len(t["fired_near"]), "total": len(t["near"])},
        "rules": rules,
        "misses": [{"case": lb.case, "rule": lb.rule, "file": lb.file, "line": lb.line, "why": lb.why}
                   for lb in t["real"] if lb not in t["hit"]],
        "false_positives": [{"case": f.case, "code": f.code, "file": f.path, "line": f.line, "kind": kind,
                             "message": f.message} for f, kind in t["false_pos"]],
        "lint_errors": result["errors"],
    }


def render(s: dict, show_misses: bool) -> str:
    rec, prec = s["recall"], s["precision"]
    out = [f"{s['cases']} cases, {rec['occurrences']} real occurrences, {s['near_misses']['total']} near misses",
           f"recall {rec['found']}/{rec['occurrences']} ({_pct(rec['found'], rec['occurrences'])}), "
           f"precision {prec['true_positives']}/{prec['findings']} ({_pct(prec['true_positives'], prec['findings'])}), "
           f"near misses fired on {s['near_misses']['fired']}/{s['near_misses']['total']}",
           "",
           "rule    found/occurrences  true/findings  near misses fired"]
    for rule, r in s["rules"].items():
        out.append(f"{rule}  {r['found']:>6}/{r['occurrences']:<11} {r['true_positives']:>5}/{r['findings']:<8} "
                   f"{r['near_misses_fired']:>3}/{r['near_misses']}")
    if s["lint_errors"]:
        out += ["", "lint errors (files skipped):"] + [f"  {e}" for e in s["lint_errors"]]
    if show_misses:
        out += ["", f"misses ({len(s['misses'])}):"]
        out += [f"  {m['case']}: {m['rule']} {m['file']}:{m['line']}  {m['why']}" for m in s["misses"]]
        out += ["", f"false positives ({len(s['false_positives'])}):"]
        out += [f"  {f['case']}: {f['code']} {f['file']}:{f['line']} [{f['kind']}]  {f['message'][:160]}"
                for f in s["false_positives"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=DEFAULT_FOLDER)
    parser.add_argument("--case", help="measure one case folder only")
    parser.add_argument("--misses", action="store_true", help="list missed occurrences and false positives")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check-labels", action="store_true",
                        help="only validate every labels.toml (anchors on their lines); do not run the linter")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"lint_corpus_report: {args.folder} is not a folder", file=sys.stderr)
        return 2
    try:
        if args.check_labels:
            cases = sorted(p for p in args.folder.iterdir() if (p / "labels.toml").is_file())
            labels = [lb for case in cases for lb in load_labels(case)[1]]
            real = sum(lb.kind == "real" for lb in labels)
            print(f"{len(cases)} cases: {real} real occurrences, {len(labels) - real} near misses; labels valid")
            return 0
        s = summary(measure(args.folder, args.case))
    except (LabelError, RuntimeError) as exc:
        print(f"lint_corpus_report: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(s, indent=2) if args.json else render(s, args.misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
