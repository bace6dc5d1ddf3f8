"""`gpudoctor lint` on the installed torch package's own sources (all rules on), side by side with
`ruff check --select ALL --no-cache` on the same tree, interleaved round after round so machine
noise hits both alike. Reports median and best wall time (on a machine shared with other work
the best of several runs is the one least disturbed by it), CPU time (user+sys of the process
tree), peak memory of the whole process tree (sampled from /proc: parent plus workers), files per
second and the ratios of medians and of bests.

    python benchmarks/bench_lint.py [--rounds 3] [--tree PATH] [--jobs N] [--baseline PYTHON]

`--baseline PYTHON` adds the same two gpudoctor rows run by another interpreter (another
checkout's venv: `--baseline ../main/.venv/bin/python`), so a change is measured before and after
in one run, under the same load.

ruff is not a dependency of gpudoctor: install it into the environment for this comparison
(`pip install ruff`); without it the ruff rows are skipped. Files are counted the way each tool
reads them: ruff lints the .py/.pyi files; gpudoctor lints .py files and also reads C++/CUDA
headers and build files (reported separately).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time


def _tree_rss(root_pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, todo, seen = 0, [root_pid], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def run(cmd: list[str]) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds of the process tree, peak tree RSS bytes, exit code."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            done.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    code = proc.wait()
    wall = time.perf_counter() - start
    done.set()
    t.join()
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, peak, code


def count_files(tree: str) -> dict[str, int]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from gpudoctor.lint import engine

    counts = {"python": 0, "cpp": 0, "build": 0, "pyi": 0}
    for _, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in engine.DEFAULT_EXCLUDE]
        for name in files:
            kind = engine.classify(name)
            if kind:
                counts[kind[0]] += 1
            elif name.endswith(".pyi"):
                counts["pyi"] += 1
    return counts


def main() -> int:
    import torch  # noqa: F401  (only to find the tree; the benchmarked commands never import it)

    default_tree = os.path.dirname(sys.modules["torch"].__file__)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", default=default_tree)
    ap.add_argument("--jobs", type=int, default=None, help="gpudoctor lint --jobs (default: every core)")
    ap.add_argument("--baseline", default=None, help="another interpreter whose gpudoctor to run beside this one")
    args = ap.parse_args()

    counts = count_files(args.tree)
    gd = [sys.executable, "-m", "gpudoctor", "lint", args.tree, "-q", "--isolated", "--format", "json", "-o", os.devnull]
    if args.jobs:
        gd += ["--jobs", str(args.jobs)]
    commands = {
        "gpudoctor lint (all files)": gd,
        # the C++ rules off: no C++/CUDA file is read, as with ruff
        "gpudoctor lint (Python rules)": gd + ["--ignore", "GPU009,GPU010"],
    }
    if args.baseline:
        base = [args.baseline] + gd[1:]
        commands["baseline lint (all files)"] = base
        commands["baseline lint (Python rules)"] = base + ["--ignore", "GPU009,GPU010"]
    # the interpreter's own environment first: a venv used without activating it
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff:
        commands["ruff check --select ALL --no-cache"] = [ruff, "check", "--select", "ALL", "--no-cache", "-q",
                                                          "--exit-zero", args.tree]
    results: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            results[name].append(run(cmd))

    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    print(f"tree: {args.tree}")
    print(f"files: {counts['python']} .py, {counts['pyi']} .pyi, {counts['cpp']} C++/CUDA, {counts['build']} build files; "
          f"cores: {os.cpu_count()}; load average before/after: {load[0]:.1f}; rounds: {args.rounds}")
    print(f"{'command':40s} {'wall_s':>7s} {'best_s':>7s} {'cpu_s':>7s} {'peak_MB':>8s} {'py files/s':>11s}  runs (wall)")
    medians, bests = {}, {}
    for name, rows in results.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        peak = max(r[2] for r in rows) / 1e6
        medians[name] = wall
        bests[name] = min(r[0] for r in rows)
        codes = sorted({r[3] for r in rows})
        print(f"{name:40s} {wall:7.2f} {bests[name]:7.2f} {cpu:7.2f} {peak:8.0f} {counts['python'] / wall:11.0f}  "
              f"{' '.join(f'{r[0]:.2f}' for r in rows)}  exit={codes}")
    if args.baseline:
        print(f"baseline: {args.baseline}")
        for kind in ("all files", "Python rules"):
            print(f"ratio gpudoctor lint ({kind}) / baseline: {medians[f'gpudoctor lint ({kind})'] / medians[f'baseline lint ({kind})']:.2f}x "
                  f"(medians), {bests[f'gpudoctor lint ({kind})'] / bests[f'baseline lint ({kind})']:.2f}x (bests)")
    if ruff:
        base = medians["ruff check --select ALL --no-cache"]
        for name in [n for n in commands if n.startswith(("gpudoctor", "baseline"))]:
            print(f"ratio {name} / ruff: {medians[name] / base:.2f}x (medians), "
                  f"{bests[name] / bests['ruff check --select ALL --no-cache']:.2f}x (bests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
