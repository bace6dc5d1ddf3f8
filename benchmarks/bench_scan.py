"""Benchmark `gpudoctor scan` against `python -c "import torch"` and `python -m torch.utils.collect_env`,
side by side in one run (interleaved, round after round), and measure the parent's own CPU time
(the worker excluded).

    python benchmarks/bench_scan.py [--rounds 5] [--device cpu]

Targets (issue 7): on a machine without a GPU, `gpudoctor scan` costs at most 1.2x
`python -c "import torch"` and less than collect_env; parent CPU time (excluding the worker) under
0.3 s. The same scan with the CLI's early worker start turned off (GPUDOCTOR_NO_EARLY_START=1) is
measured beside it, to show what starting the worker before the CLI's own imports buys.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import run_once  # noqa: E402

# Runs the CLI in-process and reports the process's own CPU time: RUSAGE_SELF excludes children,
# so this is the parent's cost with the worker left out.
PARENT_CPU = r"""
import json, resource, sys
from gpudoctor.cli import main
sys.argv = ["gpudoctor", "scan", "--json", sys.argv[1]] + sys.argv[2:]
try:
    main()
except SystemExit:
    pass
u = resource.getrusage(resource.RUSAGE_SELF)
sys.stderr.write(json.dumps({"parent_cpu_s": u.ru_utime + u.ru_stime}) + "\n")
"""

BASELINE = "python -c 'import torch'"
COLLECT = "python -m torch.utils.collect_env"
SCAN = "gpudoctor scan"
LATE = "gpudoctor scan, no early start"


def measure(commands: dict[str, list[str]], rounds: int, warmup: int = 1) -> dict[str, dict]:
    """Wall and CPU seconds per command, interleaved round after round so that machine noise hits
    every command alike; median and best (min) of the rounds. The best is the least disturbed run
    on a loaded machine, the median the typical one."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    for i in range(warmup + rounds):
        for name, cmd in commands.items():
            wall, cpu, code = run_once(cmd)
            if i >= warmup:
                walls[name].append(wall)
                cpus[name].append(cpu)
                codes[name].add(code)
    return {name: {"median_s": statistics.median(walls[name]), "min_s": min(walls[name]),
                   "cpu_s": statistics.median(cpus[name]), "exit_codes": sorted(codes[name])}
            for name in commands}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="passed to scan --device (default cpu)")
    args = parser.parse_args()
    py = sys.executable
    extra = ["--device", args.device]
    env_bin = shutil.which("env") or "/usr/bin/env"
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        results = measure({
            BASELINE: [py, "-c", "import torch"],
            COLLECT: [py, "-m", "torch.utils.collect_env"],
            SCAN: [py, "-m", "gpudoctor", "scan", "--json", out, *extra],
            LATE: [env_bin, "GPUDOCTOR_NO_EARLY_START=1", py, "-m", "gpudoctor", "scan", "--json", out, *extra],
        }, rounds=args.rounds)
        cpu = []
        for _ in range(args.rounds):
            proc = subprocess.run([py, "-c", PARENT_CPU, out, *extra], capture_output=True, text=True)
            cpu.append(json.loads(proc.stderr.strip().splitlines()[-1])["parent_cpu_s"])
        with open(out) as f:
            report = json.load(f)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load_before:.2f} before, {load_after:.2f} after; "
          f"{args.rounds} interleaved rounds\n")
    base = results[BASELINE]
    width = max(map(len, results))
    print(f"{'command'.ljust(width)}  median_s  min_s   cpu_s   median/base  min/base  cpu/base")
    for name, r in results.items():
        print(f"{name.ljust(width)}  {r['median_s']:8.3f}  {r['min_s']:6.3f}  {r['cpu_s']:6.3f}  "
              f"{r['median_s'] / base['median_s']:10.2f}x  {r['min_s'] / base['min_s']:7.2f}x  "
              f"{r['cpu_s'] / base['cpu_s']:7.2f}x   exit={r['exit_codes']}")
    scan, collect, late = results[SCAN], results[COLLECT], results[LATE]
    parent = statistics.median(cpu)
    probes = {r["probe"]: r["status"] for r in report["results"]}
    print(f"\nprobes: {probes}")
    for label, key in (("median", "median_s"), ("best", "min_s")):
        ratio = scan[key] / base[key]
        print(f"{label}: scan / import torch {ratio:.2f}x (target <= 1.2x): {'OK' if ratio <= 1.2 else 'MISSED'}; "
              f"scan / collect_env {scan[key] / collect[key]:.2f}x (target < 1.0x): "
              f"{'OK' if scan[key] < collect[key] else 'MISSED'}; early start saves {late[key] - scan[key]:+.3f} s")
    print(f"parent CPU time: {parent:.3f} s (target < 0.3 s): {'OK' if parent < 0.3 else 'MISSED'}")


if __name__ == "__main__":
    main()
