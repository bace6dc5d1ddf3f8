"""Benchmark `gpudoctor scan` against `python -c "import torch"` and `python -m torch.utils.collect_env`,
side by side in one run (interleaved, round after round), and measure the parent's own CPU time
(the worker excluded).

    python benchmarks/bench_scan.py [--rounds 5] [--device cpu] [--level quick|deep|both]

Targets (issue 7): on a machine without a GPU, `gpudoctor scan` costs at most 1.2x
`python -c "import torch"` and less than collect_env; parent CPU time (excluding the worker) under
0.3 s. The same scan with the CLI's early worker start turned off (GPUDOCTOR_NO_EARLY_START=1) is
measured beside it, to show what starting the worker before the CLI's own imports buys.

`--level` (issue 18) picks the scan level measured: `quick` (the scan's default), `deep`, or `both`,
which adds `gpudoctor scan --level deep` to the same interleaved rounds and prints each probe's
time at each level and deep/quick. Each command's very first run (the warm-up round, not in the
median) is printed as `first_s`: on a machine just booted, the first command's first run is the
cold scan (cuDNN graphs compiled, libraries read from disk); later ones find caches warm, so
measure a cold deep scan with `--level deep` on a fresh machine of its own.
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
DEEP = "gpudoctor scan --level deep"


def measure(commands: dict[str, list[str]], rounds: int, warmup: int = 1) -> dict[str, dict]:
    """Wall and CPU seconds per command, interleaved round after round so that machine noise hits
    every command alike; median and best (min) of the rounds. The best is the least disturbed run
    on a loaded machine, the median the typical one."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    first: dict[str, float] = {}
    for i in range(warmup + rounds):
        for name, cmd in commands.items():
            wall, cpu, code = run_once(cmd)
            first.setdefault(name, wall)
            if i >= warmup:
                walls[name].append(wall)
                cpus[name].append(cpu)
                codes[name].add(code)
    return {name: {"median_s": statistics.median(walls[name]), "min_s": min(walls[name]),
                   "cpu_s": statistics.median(cpus[name]), "exit_codes": sorted(codes[name]),
                   "first_s": first[name]}
            for name in commands}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="passed to scan --device (default cpu)")
    parser.add_argument("--level", choices=("quick", "deep", "both"), default="quick",
                        help="scan level measured (both: quick and deep side by side)")
    args = parser.parse_args()
    py = sys.executable
    level = "deep" if args.level == "deep" else "quick"
    extra = ["--device", args.device, "--level", level]
    env_bin = shutil.which("env") or "/usr/bin/env"
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        out_deep = os.path.join(tmp, "report-deep.json")
        # The scan first: on a fresh machine its first run is the cold scan.
        commands = {
            SCAN: [py, "-m", "gpudoctor", "scan", "--json", out, *extra],
            BASELINE: [py, "-c", "import torch"],
            COLLECT: [py, "-m", "torch.utils.collect_env"],
            LATE: [env_bin, "GPUDOCTOR_NO_EARLY_START=1", py, "-m", "gpudoctor", "scan", "--json", out, *extra],
        }
        if args.level == "both":
            commands[DEEP] = [py, "-m", "gpudoctor", "scan", "--json", out_deep, "--device", args.device,
                              "--level", "deep"]
        results = measure(commands, rounds=args.rounds)
        cpu = []
        for _ in range(args.rounds):
            proc = subprocess.run([py, "-c", PARENT_CPU, out, *extra], capture_output=True, text=True)
            cpu.append(json.loads(proc.stderr.strip().splitlines()[-1])["parent_cpu_s"])
        with open(out) as f:
            report = json.load(f)
        deep_report = None
        if args.level == "both":
            with open(out_deep) as f:
                deep_report = json.load(f)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load_before:.2f} before, {load_after:.2f} after; "
          f"{args.rounds} interleaved rounds\n")
    base = results[BASELINE]
    width = max(map(len, results))
    print(f"scan level: {level}" + (" (and deep beside it)" if deep_report else ""))
    print(f"{'command'.ljust(width)}  first_s  median_s  min_s   cpu_s   median/base  min/base  cpu/base")
    for name, r in results.items():
        print(f"{name.ljust(width)}  {r['first_s']:7.3f}  {r['median_s']:8.3f}  {r['min_s']:6.3f}  {r['cpu_s']:6.3f}  "
              f"{r['median_s'] / base['median_s']:10.2f}x  {r['min_s'] / base['min_s']:7.2f}x  "
              f"{r['cpu_s'] / base['cpu_s']:7.2f}x   exit={r['exit_codes']}")
    scan, collect, late = results[SCAN], results[COLLECT], results[LATE]
    parent = statistics.median(cpu)
    probes = {r["probe"]: r["status"] for r in report["results"]}
    print(f"\nprobes: {probes}")
    if deep_report is not None:
        deep = results[DEEP]
        print(f"deep / quick: median {deep['median_s'] / scan['median_s']:.2f}x, first run "
              f"{deep['first_s'] / scan['first_s']:.2f}x (the first deep run follows the first quick one)")
        deep_by = {(r["probe"], r.get("device")): r for r in deep_report["results"]}
        print(f"{'probe'.ljust(20)}  quick_s  deep_s  quick verdict / deep verdict (last round)")
        for r in report["results"]:
            d = deep_by.get((r["probe"], r.get("device")), {})
            same = "" if d.get("status") == r["status"] else "   <- VERDICTS DIFFER"
            print(f"{r['probe'].ljust(20)}  {r.get('duration_s', 0):7.3f}  {d.get('duration_s', 0):6.3f}  "
                  f"{r['status']} / {d.get('status', '-')}{same}")
    for label, key in (("median", "median_s"), ("best", "min_s")):
        ratio = scan[key] / base[key]
        print(f"{label}: scan / import torch {ratio:.2f}x (target <= 1.2x): {'OK' if ratio <= 1.2 else 'MISSED'}; "
              f"scan / collect_env {scan[key] / collect[key]:.2f}x (target < 1.0x): "
              f"{'OK' if scan[key] < collect[key] else 'MISSED'}; early start saves {late[key] - scan[key]:+.3f} s")
    print(f"parent CPU time: {parent:.3f} s (target < 0.3 s): {'OK' if parent < 0.3 else 'MISSED'}")


if __name__ == "__main__":
    main()
