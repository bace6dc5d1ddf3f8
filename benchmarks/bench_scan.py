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
from _timing import compare, table  # noqa: E402

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

BASELINE = "baseline: python -c 'import torch'"
SCAN = "gpudoctor scan"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="passed to scan --device (default cpu)")
    args = parser.parse_args()
    py = sys.executable
    extra = ["--device", args.device]
    env_bin = shutil.which("env") or "/usr/bin/env"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        results = compare({
            BASELINE: ([py, "-c", "import torch"], None),
            "python -m torch.utils.collect_env": ([py, "-m", "torch.utils.collect_env"], None),
            SCAN: ([py, "-m", "gpudoctor", "scan", "--json", out, *extra], None),
            "gpudoctor scan, no early start": (
                [env_bin, "GPUDOCTOR_NO_EARLY_START=1", py, "-m", "gpudoctor", "scan", "--json", out, *extra],
                None),
        }, rounds=args.rounds, warmup=1)
        cpu = []
        for _ in range(args.rounds):
            proc = subprocess.run([py, "-c", PARENT_CPU, out, *extra], capture_output=True, text=True)
            cpu.append(json.loads(proc.stderr.strip().splitlines()[-1])["parent_cpu_s"])
        with open(out) as f:
            report = json.load(f)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f} at the end "
          f"(ratios are measured interleaved, so load hits every command alike)\n")
    print(table(results, BASELINE))
    base = results[BASELINE]["median_s"]
    scan = results[SCAN]["median_s"]
    collect = results["python -m torch.utils.collect_env"]["median_s"]
    late = results["gpudoctor scan, no early start"]["median_s"]
    parent = statistics.median(cpu)
    probes = {r["probe"]: r["status"] for r in report["results"]}
    print(f"\nprobes: {probes}")
    print(f"scan / import torch: {scan / base:.2f}x (target <= 1.2x): {'OK' if scan / base <= 1.2 else 'MISSED'}")
    print(f"scan / collect_env: {scan / collect:.2f}x (target < 1.0x): {'OK' if scan < collect else 'MISSED'}")
    print(f"early start saves: {late - scan:+.3f} s ({late / base:.2f}x -> {scan / base:.2f}x of import torch)")
    print(f"parent CPU time: {parent:.3f} s (target < 0.3 s): {'OK' if parent < 0.3 else 'MISSED'}")


if __name__ == "__main__":
    main()
