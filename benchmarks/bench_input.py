"""Benchmark reading big inputs and redacting text, each side by side with a baseline in one run.

    python benchmarks/bench_input.py [--mib 120] [--rounds 3]

1. Standard input over the 100 MiB cap: `textinput.iter_stream` reading a pipe to its end (keeping
   the last 100 MiB) against `cat` copying the same pipe to /dev/null; peak memory (VmHWM) of the
   reader against the cap.
2. Redaction: `Redactor.text` over a 10 MB training log, and the same log line by line through
   `Redactor.stream()`, against one plain `re.sub` pass (IPv4-shaped) over the same text.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import compare, table  # noqa: E402

_READER = (
    "import sys\nfrom gpudoctor.explain.textinput import iter_stream, MAX_BYTES\n"
    "n = sum(len(c) for c in iter_stream(sys.stdin.buffer, name='stdin'))\n"
    "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
    "print(int(hwm) * 1024, n, MAX_BYTES, file=sys.stderr)\n"
)


def make_log(path: str, size: int, secrets: bool = False) -> None:
    rnd = random.Random(0)
    noise = [
        "[rank0]:[W1122 10:{m:02d}:{s:02d}] step {i} loss={l:.4f} lr=1.0e-04 grad_norm={g:.3f} tokens/s=51234",
        "UserWarning: TypedStorage is deprecated. It will be removed in the future.",
        "  0%|          | {i}/5000 [00:{s:02d}<10:00,  8.21it/s]",
        "INFO:root:saving checkpoint to /data/ckpt/step_{i}.pt on gpu-node-{m} (10.0.{s}.7)",
        "gpu-node-{m}:1234:1234 [0] NCCL INFO Channel {s:02d}/32 : 0 1 2 3",
    ]
    if secrets:
        noise.append("wandb: W&B API key is configured. HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz{i:08d}")
    with open(path, "w") as f:
        written = i = 0
        while written < size:
            line = rnd.choice(noise).format(i=i, m=i % 60, s=i % 60, l=rnd.random(), g=rnd.random()) + "\n"
            f.write(line)
            written += len(line)
            i += 1


def bench_stdin(mib: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "big.log")
        make_log(log, mib * 2**20)
        commands = {
            "cat": (["cat"], log),
            "iter_stream": ([sys.executable, "-c", _READER], log),
        }
        # stdin from a pipe, not a file: a file would be read from its tail by a seek.
        piped = {name: (["sh", "-c", f"cat {shlex.quote(log)} | {shlex.join(cmd)}"], None) for name, (cmd, _) in commands.items()}
        print(f"standard input of {mib} MiB through a pipe (machine may be loaded by others):")
        print(table(compare(piped, rounds=rounds, warmup=1), baseline="cat"))
        reader = shlex.join([sys.executable, "-c", _READER])
        proc = subprocess.run(f"cat {shlex.quote(log)} | {reader}", shell=True, capture_output=True, text=True, check=True)
        peak, n, cap = map(int, proc.stderr.split())
        print(f"iter_stream kept {n / 2**20:.1f} MiB; peak memory {peak / 2**20:.1f} MiB = {peak / cap:.2f}x the cap\n")


def bench_redaction(rounds: int) -> None:
    from gpudoctor.reports.redact import Redactor

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "train.log")
        make_log(log, 10 * 2**20, secrets=True)
        text = open(log).read()
    ipv4 = re.compile(r"(?<![\w.-])(?:\d{1,3}\.){3}\d{1,3}(?![\w.-])")

    def one_regex() -> None:
        ipv4.sub("<ip>", text)

    def whole() -> None:
        Redactor(environ={}).text(text)

    def streamed() -> None:
        # As `gpudoctor run` would feed it: 64 KB reads of the child's output.
        stream = Redactor(environ={}).stream()
        for i in range(0, len(text), 65536):
            stream.feed(text[i:i + 65536])
        stream.flush()

    results: dict[str, list[float]] = {"one re.sub": [], "Redactor.text": [], "stream, 64 KB": []}
    for _ in range(rounds):
        for name, fn in zip(results, (one_regex, whole, streamed)):
            started = time.process_time()
            fn()
            results[name].append(time.process_time() - started)
    base = statistics.median(results["one re.sub"])
    print(f"redacting a {len(text) / 2**20:.0f} MiB log (CPU seconds, median of {rounds}):")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"  {name:15s} {med:7.3f} s  {len(text) / 2**20 / med:6.1f} MiB/s  {med / base:6.1f}x one re.sub")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench_stdin(args.mib, args.rounds)
    bench_redaction(args.rounds)


if __name__ == "__main__":
    main()
