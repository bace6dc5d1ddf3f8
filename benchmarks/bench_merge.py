"""Benchmark the fleet layer, side by side in one run.

    python benchmarks/bench_merge.py [--nodes 1000] [--rounds 3] [--ranks 4] [--skip-torchrun]
                                     [--baseline DIR]

1. `gpudoctor merge` of N synthetic 8-GPU node reports (tests/fleet_synth.py: a real scan's
   per-device results for cuda:0..7, ~330 KB of pretty JSON each, with a straggler, drift and a
   missing node injected), against the floor a merge that parses every report pays: `json.load`
   of every file with the standard library. Target: under 2 s for 1,000 reports.

   The size is realistic: every built-in probe is per device, so `scan --device all` on 8 GPUs
   writes 8 x 12 results; run on a simulated CUDA device (tests/cudasim.py) the probes' results
   weigh ~35 KB per device, 85-90 % of it probe `details` (sdpa-backends and fp8-matmul ~10 KB
   each), which the merge never reads except matmul-sanity's throughput. The merge cuts those
   before parsing (gpudoctor.fleet.merge._skim) and reads files in a process per core; what is
   left is reading the bytes, finding the cuts, parsing ~26 % of them, then merging and
   redacting. The rows with one process and without redaction show where the time goes.
   `--baseline DIR` adds the same merge by another gpudoctor (`pip install --no-deps --target DIR
   <checkout>`), in the same rounds: a before/after under the same load.
2. A 4-rank `torchrun ... gpudoctor scan --distributed --device cpu` against the same torchrun
   running plain `gpudoctor scan` on every rank, interleaved; and, inside the distributed run,
   rank 0's total against the slowest rank's own scan (what the distributed layer adds:
   rendezvous, collectives, exchange, merge). Target: under 1 s beyond the slowest scan.

Timings on a shared machine are noisy: rounds are interleaved and medians reported, with the load
average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from _timing import compare, table  # noqa: E402

from gpudoctor.fleet.readers import _idle_cores  # noqa: E402


def write_fleet(folder: str, nodes: int) -> int:
    import fleet_synth as fs

    total = 0
    template = json.dumps(fs.node_report(0, nodes=nodes), indent=2)
    for i in range(nodes):
        if i == nodes // 2:
            continue  # a missing node
        if i in (3, 7):
            text = json.dumps(fs.node_report(i, nodes=nodes, tflops={5: 350.0} if i == 3 else None,
                                             torch="2.12.0+cu130" if i == 7 else "2.13.0+cu130"), indent=2)
        else:
            # Same content as node 0 but its own rank, node id and host name (cheap to generate).
            text = (template.replace('"rank": 0,', f'"rank": {i},').replace('"node_index": 0,', f'"node_index": {i},')
                    .replace('"node_id": 0,', f'"node_id": {i},').replace('"proc_id": 0,', f'"proc_id": {i},')
                    .replace("gpu000", f"gpu{i:03d}"))
        path = os.path.join(folder, f"scan-gpu{i:04d}.json")
        with open(path, "w") as fh:
            fh.write(text)
        total += len(text)
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, distributed: bool, out: str) -> tuple[float, dict | None]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(free_port()), "-m", "gpudoctor", "scan", "--device", "cpu", "--json", out]
    if distributed:
        cmd.insert(cmd.index("--device"), "--distributed")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=900)
    wall = time.perf_counter() - start
    data = None
    if distributed and os.path.exists(out):
        with open(out) as fh:
            data = json.load(fh)
    return wall, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--baseline", metavar="DIR", help="another gpudoctor installed with pip --target DIR")
    args = parser.parse_args()
    py = sys.executable
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "scans")
        os.mkdir(folder)
        size = write_fleet(folder, args.nodes)
        print(f"{args.nodes - 1} node reports, {size / 1e6:.0f} MB of JSON ({size / (args.nodes - 1) / 1e3:.0f} KB each); "
              f"merge read processes now: {_idle_cores()} (the cores the load average leaves idle)")
        floor = (f"import glob, json\nfor f in glob.glob({folder!r} + '/*.json'):\n"
                 "    json.load(open(f, 'rb'))")
        commands = {
            "floor: json.load every report": ([py, "-c", floor], None),
            "gpudoctor merge (1 process)": ([py, "-c", "import os, sys; os.environ['GPUDOCTOR_MERGE_JOBS'] = '1'; "
                                             "from gpudoctor.cli import main; sys.argv = ['gpudoctor', 'merge', "
                                             f"{folder!r}, '--format', 'json', '-o', os.devnull, '-q']; main()"], None),
            "gpudoctor merge, terminal text (1 process)": (
                [py, "-c", "import os, sys; os.environ['GPUDOCTOR_MERGE_JOBS'] = '1'; os.environ['COLUMNS'] = '120'; "
                 "from gpudoctor.cli import main; sys.argv = ['gpudoctor', 'merge', "
                 f"{folder!r}, '--format', 'text', '-o', os.devnull]; main()"], None),
            "gpudoctor merge --no-redact": ([py, "-m", "gpudoctor", "merge", folder, "--no-redact", "--format", "json",
                                             "-o", os.devnull, "-q"], None),
            "gpudoctor merge": ([py, "-m", "gpudoctor", "merge", folder, "--format", "json", "-o", os.devnull, "-q"], None),
        }
        if args.baseline:
            commands["baseline merge (1 process)"] = (
                [py, "-c", f"import os, sys; sys.path.insert(0, {args.baseline!r}); os.environ['GPUDOCTOR_MERGE_JOBS'] = '1'; "
                 "from gpudoctor.cli import main; sys.argv = ['gpudoctor', 'merge', "
                 f"{folder!r}, '--format', 'json', '-o', os.devnull, '-q']; main()"], None)
            commands["baseline merge, terminal text (1 process)"] = (
                [py, "-c", f"import os, sys; sys.path.insert(0, {args.baseline!r}); os.environ['GPUDOCTOR_MERGE_JOBS'] = '1'; "
                 "os.environ['COLUMNS'] = '120'; from gpudoctor.cli import main; sys.argv = ['gpudoctor', 'merge', "
                 f"{folder!r}, '--format', 'text', '-o', os.devnull]; main()"], None)
            commands["baseline merge"] = (
                [py, "-c", f"import sys; sys.path.insert(0, {args.baseline!r}); from gpudoctor.cli import main; "
                 f"sys.argv = ['gpudoctor', 'merge', {folder!r}, '--format', 'json', '-o', '/dev/null', '-q']; main()"], None)
        results = compare(commands, rounds=args.rounds, warmup=1)
        print(table(results, "floor: json.load every report"))
        merge_s = results["gpudoctor merge"]["median_s"]
        print(f"merge of {args.nodes - 1} reports: {merge_s:.2f} s (target < 2 s): {'MET' if merge_s < 2 else 'NOT MET'}")

        if args.skip_torchrun:
            print(f"load average after: {os.getloadavg()[0]:.2f}")
            return
        print()
        plain, dist, overhead, layer = [], [], [], []
        for _ in range(args.rounds):
            wall, _ = torchrun(args.ranks, False, os.path.join(tmp, "plain.json"))
            plain.append(wall)
            wall, data = torchrun(args.ranks, True, os.path.join(tmp, "fleet.json"))
            dist.append(wall)
            timing = (data or {}).get("distributed") or {}
            if timing.get("slowest_scan_s"):
                extra = timing["rank0_total_s"] - timing["slowest_scan_s"]
                overhead.append(extra)
                layer.append(extra - (timing.get("rank0_collectives_s") or 0))
        print(f"torchrun x{args.ranks}, plain scan on every rank:     median {statistics.median(plain):6.2f} s")
        print(f"torchrun x{args.ranks}, scan --distributed:            median {statistics.median(dist):6.2f} s "
              f"({statistics.median(dist) / statistics.median(plain):.2f}x)")
        if overhead:
            print(f"rank 0 beyond the slowest rank's own scan:          median {statistics.median(overhead):6.2f} s "
                  f"(target < 1 s): {'MET' if statistics.median(overhead) < 1 else 'NOT MET'}")
            print(f"  of which not measuring collectives (agent, rendezvous, exchange, merge): "
                  f"median {statistics.median(layer):6.2f} s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
