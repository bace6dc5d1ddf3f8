"""Benchmark `gpudoctor run`'s passthrough against running the command directly, side by side.

    python benchmarks/bench_run.py [--rounds 7] [--mib 256]

Three commands, interleaved round after round: a program writing MiB of output directly; the same
through `gpudoctor run -q` (pipes: output relayed and recorded); and a program that exits at once,
directly and through gpudoctor (the start-up cost of the wrapper). It also reports gpudoctor's peak
memory while relaying (VmHWM), which must stay flat as the output grows: the record is bounded.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import compare, table  # noqa: E402

WRITER = """\
import sys
line = (b"x" * 1023) + b"\\n"
out = sys.stdout.buffer
for _ in range({mib} * 1024):
    out.write(line)
"""

# Runs the CLI in-process and prints its peak resident memory at exit (VmHWM, this process only).
PEAK = """\
import atexit, sys
def peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            sys.stderr.write('PEAK ' + line.split()[1] + '\\n')
atexit.register(peak)
sys.argv = ['gpudoctor'] + sys.argv[1:]
from gpudoctor.cli import main
main()
"""


def peak_kib(args: list[str]) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True)
    for line in done.stderr.splitlines():
        if line.startswith("PEAK "):
            return int(line.split()[1])
    return -1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    gpudoctor = [sys.executable, "-m", "gpudoctor", "run", "-q", "--"]
    with tempfile.TemporaryDirectory() as tmp:
        writer = os.path.join(tmp, "writer.py")
        with open(writer, "w") as fh:
            fh.write(WRITER.format(mib=args.mib))
        quick = [sys.executable, "-c", "pass"]
        results = compare({
            f"direct {args.mib} MiB": ([sys.executable, writer], None),
            f"gpudoctor run {args.mib} MiB": ([*gpudoctor, sys.executable, writer], None),
            "direct: exits at once": (quick, None),
            "gpudoctor run: exits at once": ([*gpudoctor, *quick], None),
        }, rounds=args.rounds)
        print(table(results, baseline=f"direct {args.mib} MiB"))
        quick_ratio = results["gpudoctor run: exits at once"]["median_s"] / results["direct: exits at once"]["median_s"]
        print(f"start-up: gpudoctor run / direct = {quick_ratio:.2f}x")
        small = os.path.join(tmp, "small.py")
        with open(small, "w") as fh:
            fh.write(WRITER.format(mib=1))
        low = peak_kib(["run", "-q", "--", sys.executable, small])
        high = peak_kib(["run", "-q", "--", sys.executable, writer])
        print(f"peak memory of gpudoctor: {low / 1024:.1f} MiB relaying 1 MiB, {high / 1024:.1f} MiB relaying "
              f"{args.mib} MiB ({high / max(low, 1):.2f}x)")


if __name__ == "__main__":
    main()
