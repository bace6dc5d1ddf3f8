"""Measure `explain` on a folder of labelled real error texts (tests/fixtures/heldout by default).

    python tools/heldout_report.py [FOLDER] [--misses] [--round r1|r2|...]

Each text lives in FOLDER/<expected-id>/<name>.txt, first line `# source: <url>`; `none/` holds
texts whose cause is outside the knowledge base. The verdict is what `explain` answers: an entry
(the best match that no rule demoted to context), the platform the text comes from when no entry
applies there, an unrecognised CUDA error, or nothing. Prints top-1 accuracy on the labelled
texts, the confident wrong entries on them (stated confidence >= 0.5), the confident entries on
`none/` texts, and how many `none/` texts got a platform or an unrecognised-error answer. Rounds
are read from the names (`r2-...`, `r7-...`; round 1 has no prefix). Run it against another
checkout's code with PYTHONPATH to compare.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

CONFIDENT = 0.5
ROOT = pathlib.Path(__file__).resolve().parents[1]
_ROUND = re.compile(r"^(r\d+)-")


def round_of(path: pathlib.Path) -> str:
    m = _ROUND.match(path.name)
    return m.group(1) if m else "r1"


def cases(folder: pathlib.Path, round_: str | None = None) -> list[tuple[str, pathlib.Path]]:
    """Texts named `r2-*`, `r3-*`... were drawn in the later rounds; the first round's names have
    no prefix (see tests/fixtures/heldout/README.md)."""
    found = sorted((p.parent.name, p) for p in folder.glob("*/*.txt"))
    return found if round_ is None else [(e, p) for e, p in found if round_of(p) == round_]


def body(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8").partition("\n")[2]


def verdict(text: str) -> tuple[str | None, float, str]:
    """(what `explain` names: an entry id, `platform:<id>`, `unrecognised`, or None; the stated
    confidence of an entry, else 0; the kind)."""
    try:
        from gpudoctor.explain.matcher import analyse_text
    except ImportError:  # an older checkout (PYTHONPATH): the best match is the verdict
        from gpudoctor.explain.matcher import match_text

        matches = match_text(text)
        top = matches[0] if matches else None
        return (top.id, top.confidence, "entry") if top else (None, 0.0, "nothing")
    analysis = analyse_text(text)
    best = analysis.verdict
    if best is not None:
        return best.id, best.confidence, "entry"
    if analysis.platform is not None:
        return f"platform:{analysis.platform.id}", 0.0, "platform"
    if analysis.unrecognised is not None:
        return "unrecognised", 0.0, "unrecognised"
    return None, 0.0, "nothing"


def measure(folder: pathlib.Path, round_: str | None = None) -> dict[str, object]:
    rows = []
    for expected, path in cases(folder, round_):
        got, confidence, kind = verdict(body(path))
        entry = kind == "entry"
        rows.append({
            "case": f"{expected}/{path.stem}",
            "expected": expected,
            "got": got,
            "kind": kind,
            "confidence": round(confidence, 2),
            "ok": (not entry or confidence < CONFIDENT) if expected == "none" else got == expected,
        })
    known = [r for r in rows if r["expected"] != "none"]
    unknown = [r for r in rows if r["expected"] == "none"]
    return {
        "rows": rows,
        "known": len(known),
        "top1": sum(r["ok"] for r in known),
        "unknown": len(unknown),
        "false_confident_unknown": sum(not r["ok"] for r in unknown),
        "confident_wrong_known": sum(1 for r in known if not r["ok"] and r["kind"] == "entry"
                                     and r["confidence"] >= CONFIDENT),
        "unknown_platform": sum(1 for r in unknown if r["kind"] == "platform"),
        "unknown_unrecognised": sum(1 for r in unknown if r["kind"] == "unrecognised"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "tests" / "fixtures" / "heldout"))
    parser.add_argument("--misses", action="store_true", help="list every miss")
    parser.add_argument("--round", help="only one draw (r1, r2, ...)")
    args = parser.parse_args()
    result = measure(pathlib.Path(args.folder), args.round)
    if args.misses:
        for r in result["rows"]:
            if not r["ok"]:
                print(f"  MISS {r['case']:55} got {r['got']} ({r['confidence']})")
    known, unknown = result["known"], result["unknown"]
    print(f"texts: {known + unknown} ({known} with a known cause, {unknown} outside the knowledge base)")
    print(f"top-1 on known causes: {result['top1']}/{known} = {result['top1'] / max(known, 1):.1%}")
    print(f"confident wrong on known causes: {result['confident_wrong_known']}")
    print(f"confident match on unknown causes: {result['false_confident_unknown']}/{unknown}")
    print(f"unknown causes answered with a platform: {result['unknown_platform']}, "
          f"with an unrecognised CUDA error: {result['unknown_unrecognised']}")


if __name__ == "__main__":
    sys.exit(main())
