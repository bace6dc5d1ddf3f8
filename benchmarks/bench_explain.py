"""Benchmark `gpudoctor explain` against the import of its own UI libraries, side by side.

    python benchmarks/bench_explain.py [--rounds 15]

Targets: explain by id at most 1.5x `python -c "import typer, rich.console"` (issues 2 and 20); a
pasted error at most 2.0x (issue 20); a 10 MB log through `explain --json -` in under 1 s.

A pasted error reads only the entries it can match, found in the keyword index that
gpudoctor.knowledge.kbcache keeps in the user cache directory. The index is written by the first run; the
benchmark times both: with the index cached (every run after the first) and with no usable cache
directory (a read-only home: every entry is read, as before the index existed). Every command runs with Python's bytecode cache on
(`_timing.bytecode_env`), as an installed gpudoctor does.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

PASTED = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
          "capacity of 31.36 GiB of which 20.11 GiB is free.")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import bytecode_env, compare, table  # noqa: E402


def make_log(path: str, size: int = 10 * 1024 * 1024) -> None:
    """A realistic training log: progress lines, warnings, a traceback with an OOM at the end."""
    rnd = random.Random(0)
    noise = [
        "[rank0]:[W1122 10:{m:02d}:{s:02d}] step {i} loss={l:.4f} lr=1.0e-04 grad_norm={g:.3f} tokens/s=51234",
        "UserWarning: TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only storage class.",
        "  0%|          | {i}/5000 [00:{s:02d}<10:00,  8.21it/s]",
        "INFO:root:saving checkpoint to /data/ckpt/step_{i}.pt",
    ]
    with open(path, "w") as f:
        written = 0
        i = 0
        while written < size:
            line = rnd.choice(noise).format(i=i, m=i % 60, s=i % 60, l=rnd.random(), g=rnd.random()) + "\n"
            f.write(line)
            written += len(line)
            i += 1
        f.write('  File "models/attention.py", line 351, in _attention\n'
                "    attention_scores = torch.baddbmm(\n"
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
                "capacity of 31.36 GiB of which 20.11 GiB is free.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "train.log")
        make_log(log)
        env = bytecode_env(os.path.join(tmp, "pycache"))
        env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # a fresh cache: the first run fills it
        no_cache = os.path.join(tmp, "not-a-folder")
        open(no_cache, "w").close()  # a cache folder that cannot be made, as in a read-only home
        uncached = [py, "-c", "import os, sys, runpy; os.environ['XDG_CACHE_HOME'] = sys.argv.pop(1); "
                    "runpy.run_module('gpudoctor', run_name='__main__')", no_cache]
        results = compare({
            "baseline: import typer, rich.console": ([py, "-c", "import typer, rich.console"], None),
            "gpudoctor explain misaligned-address": ([py, "-m", "gpudoctor", "explain", "misaligned-address"], None),
            'gpudoctor explain "<pasted error>"': ([py, "-m", "gpudoctor", "explain", PASTED], None),
            'gpudoctor explain "<pasted error>", no cache': ([*uncached, "explain", PASTED], None),
            "gpudoctor explain --json - < 10 MB log": ([py, "-m", "gpudoctor", "explain", "--json", "-"], log),
        }, rounds=args.rounds, env=env)
    print(table(results, "baseline: import typer, rich.console"))
    base = results["baseline: import typer, rich.console"]["median_s"]
    by_id = results["gpudoctor explain misaligned-address"]["median_s"] / base
    pasted = results['gpudoctor explain "<pasted error>"']["median_s"] / base
    cold = results['gpudoctor explain "<pasted error>", no cache']["median_s"] / base
    log_s = results["gpudoctor explain --json - < 10 MB log"]["median_s"]
    print(f"\nexplain by id: {by_id:.2f}x baseline (target <= 1.5x): {'OK' if by_id <= 1.5 else 'MISSED'}")
    print(f"explain a pasted error: {pasted:.2f}x baseline (target <= 2.0x): {'OK' if pasted <= 2.0 else 'MISSED'}")
    print(f"explain a pasted error with no cache directory: {cold:.2f}x baseline (no target: the first run)")
    print(f"10 MB log: {log_s:.3f} s (target < 1 s): {'OK' if log_s < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
