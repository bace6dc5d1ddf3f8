"""Measure `explain` on a folder of labelled real error texts (tests/fixtures/heldout by default).

    python tools/heldout_report.py [FOLDER] [--misses] [--round r1|r2|r3|r4]

Each text lives in FOLDER/<expected-id>/<name>.txt, first line `# source: <url>`; `none/` holds
texts whose cause is outside the knowledge base. Prints top-1 accuracy on the labelled texts and
the number of confident matches (confidence >= 0.5) on `none/` texts and of confident wrong
answers on labelled ones. Run it against another checkout's code with PYTHONPATH to compare.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

CONFIDENT = 0.5
ROUNDS = ("r1", "r2", "r3", "r4", "r5", "r6", "r7")
LATER_ROUNDS = tuple(f"{r}-" for r in ROUNDS[1:])  # name prefixes; round 1 has none
ROOT = pathlib.Path(__file__).resolve().parents[1]


def cases(folder: pathlib.Path, round_: str | None = None) -> list[tuple[str, pathlib.Path]]:
    """Texts named `r2-*` to `r6-*` were drawn in the later rounds; the first round's
    names have no prefix (see tests/fixtures/heldout/README.md)."""
    found = sorted((p.parent.name, p) for p in folder.glob("*/*.txt"))
    if round_ is None:
        return found
    if round_ == "r1":
        return [(e, p) for e, p in found if not p.name.startswith(LATER_ROUNDS)]
    return [(e, p) for e, p in found if p.name.startswith(f"{round_}-")]


def body(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8").partition("\n")[2]


def measure(folder: pathlib.Path, round_: str | None = None) -> dict[str, object]:
    from gpudoctor.explain.matcher import match_text

    rows = []
    for expected, path in cases(folder, round_):
        matches = match_text(body(path))
        top = matches[0] if matches else None
        rows.append({
            "case": f"{expected}/{path.stem}",
            "expected": expected,
            "got": top.id if top else None,
            "confidence": round(top.confidence, 2) if top else 0.0,
            "ok": (top is None or top.confidence < CONFIDENT) if expected == "none" else (top is not None and top.id == expected),
        })
    known = [r for r in rows if r["expected"] != "none"]
    unknown = [r for r in rows if r["expected"] == "none"]
    return {
        "rows": rows,
        "known": len(known),
        "top1": sum(r["ok"] for r in known),
        "unknown": len(unknown),
        "false_confident_unknown": sum(not r["ok"] for r in unknown),
        "confident_wrong_known": sum(1 for r in known if not r["ok"] and r["got"] and r["confidence"] >= CONFIDENT),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "tests" / "fixtures" / "heldout"))
    parser.add_argument("--misses", action="store_true", help="list every miss")
    parser.add_argument("--round", choices=ROUNDS, help="only one draw")
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


if __name__ == "__main__":
    sys.exit(main())
