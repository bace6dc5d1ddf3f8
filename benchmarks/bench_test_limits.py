"""The speed claims that used to be timing asserts in the tests, measured side by side as ratios.

    python benchmarks/bench_test_limits.py [--rounds 5]

Tests assert behaviour only (they must pass on a loaded 2-core machine); what they once timed is
measured here, each against a baseline run in the same rounds:

- sdpa-backends on the CPU (was `test_probe_is_fast_on_cpu`, < 5 s) against `import torch`;
- reading a 0.9 GiB sparse fatbinary's headers (was < 2 s) against reading the whole file;
- `safetext.visible` on hostile escape-sequence soup (was < 30 s CPU) at n and 2n characters, and
  against plain text of the same length: linear means the 2n/n ratio stays near 2;
- a hanging interpreter and a wedged NVML cut off by their timeouts (were < 10 s and < 2 s) against
  the timeout itself.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def median_of(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(name: str, seconds: float, base: float, base_name: str) -> str:
    return f"  {name:<44} {seconds:8.3f} s  {seconds / base:7.2f}x {base_name}"


def bench_sdpa(rounds: int) -> None:
    import torch

    from gpudoctor.probes import sdpa_backends
    from gpudoctor.probes.base import ProbeContext

    ctx = ProbeContext(torch=torch, device="cpu")
    probe = median_of(lambda: sdpa_backends.run(ctx), rounds)
    imp = median_of(lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True), rounds)
    print("sdpa-backends on cpu")
    print(row("python -c 'import torch'", imp, imp, "import torch"))
    print(row("sdpa_backends.run(cpu) (in process)", probe, imp, "import torch"))


def bench_fatbin(rounds: int) -> None:
    import pathlib

    from test_fatbin import write_big_fatbin  # the test's own fixture

    from gpudoctor.scan.fatbin import read_fatbin

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "libbig.so")
        write_big_fatbin(pathlib.Path(path))

        def read_all() -> None:
            with open(path, "rb") as fh:
                while fh.read(1 << 24):
                    pass

        whole = median_of(read_all, rounds)
        headers = median_of(lambda: read_fatbin(path), rounds)
    print("fatbinary headers of a 0.9 GiB sparse library")
    print(row("read the whole file", whole, whole, "whole file"))
    print(row("read_fatbin (headers only)", headers, whole, "whole file"))


def bench_safetext(rounds: int) -> None:
    from gpudoctor.safetext import visible

    def hostile(n: int) -> str:
        unit = ("\x1b[" + "1;" * 40) + "\x1b]"
        return (unit * (n // len(unit) + 1))[:n]

    n = 2_000_000
    plain = "x" * n
    t_plain = median_of(lambda: visible(plain), rounds)
    t_n = median_of(lambda: visible(hostile(n)), rounds)
    t_2n = median_of(lambda: visible(hostile(2 * n)), rounds)
    print("safetext.visible on escape-sequence soup")
    print(row(f"plain text, {n / 1e6:.0f} M chars", t_plain, t_plain, "plain"))
    print(row(f"hostile, {n / 1e6:.0f} M chars", t_n, t_plain, "plain"))
    print(row(f"hostile, {2 * n / 1e6:.0f} M chars", t_2n, t_plain, "plain"))
    print(f"  2n/n ratio: {t_2n / t_n:.2f} (linear: about 2)")


def bench_cutoffs(rounds: int) -> None:
    import types

    from gpudoctor.scan.environment import collect_environment, nvml_info

    with tempfile.TemporaryDirectory() as tmp:
        python = os.path.join(tmp, "python")
        with open(python, "w") as fh:
            fh.write("#!/bin/sh\nexec sleep 30\n")
        os.chmod(python, 0o755)
        hang = median_of(lambda: collect_environment(python, timeout=0.5), max(1, rounds // 2))

    def wedged() -> None:
        fake = types.ModuleType("pynvml")
        fake.nvmlInit = lambda: time.sleep(3)
        sys.modules["pynvml"] = fake
        try:
            nvml_info(timeout=0.2)
        finally:
            del sys.modules["pynvml"]

    nvml = median_of(wedged, max(1, rounds // 2))
    print("cut-offs against their own timeouts")
    print(row("hanging interpreter, timeout 0.5 s", hang, 0.5, "timeout"))
    print(row("wedged NVML, timeout 0.2 s", nvml, 0.2, "timeout"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds\n")
    bench_safetext(args.rounds)
    bench_cutoffs(args.rounds)
    bench_fatbin(args.rounds)
    bench_sdpa(args.rounds)


if __name__ == "__main__":
    main()
