"""Benchmark `gpudoctor explain` against the import of its own UI libraries, side by side, in an
editable install (this checkout) and in a wheel install (built from this checkout into a
temporary virtual environment by the benchmark).

    python benchmarks/bench_explain.py [--rounds 15] [--no-wheel]

Targets (issues 2, 20 and 28), per install, against `python -c "import typer, rich.console"` run
by the same interpreter:

- `gpudoctor explain misaligned-address` (an id) at most 1.5x;
- the two-line pasted error `RuntimeError: CUDA error: misaligned address` + `CUDA kernel errors
  might be asynchronously reported at some other API call` at most 2.0x;
- a 10 MB log through `explain --json -` in under 1 s (editable install only).

Every command runs interleaved with the others, round after round (medians of `--rounds`
alternating runs after two warm-up rounds), so machine noise hits every command alike. A pasted
error reads only the entries it can match, found in the keyword index that
gpudoctor.knowledge.kbcache keeps in the user cache directory: the index is written by the
first (warm-up) run; the benchmark also times a run with no usable cache directory (a read-only
home: every entry is read), which has no target. Every command runs with Python's bytecode cache
on (`_timing.bytecode_env`), as an installed gpudoctor does.

The wheel is built with `pip wheel --no-deps --no-build-isolation` from a copy of the sources and
installed with `pip install` (its dependencies from the configured index) into a fresh virtual
environment; where that fails the benchmark says so and measures the editable install alone.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BY_ID = "misaligned-address"
PASTED = ("RuntimeError: CUDA error: misaligned address\n"
          "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
          "below might be incorrect.")
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
       "capacity of 31.36 GiB of which 20.11 GiB is free.")
BASELINE_CODE = "import typer, rich.console"
TARGET_ID, TARGET_PASTED = 1.5, 2.0

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
                "    attention_scores = torch.baddbmm(\n" + OOM + "\n")


def wheel_python(tmp: str) -> tuple[str | None, str]:
    """A virtual environment with gpudoctor installed from a wheel built from this checkout:
    (its python, what happened). None when the build or the install failed."""
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    for name in ("doctor", "probes", "reports"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(src, name),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = os.path.join(tmp, "wheels")
    venv = os.path.join(tmp, "venv")
    py = os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")
    steps = [
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, src],
        [sys.executable, "-m", "venv", venv],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"`{' '.join(step[:4])} ...` failed: {done.stderr.strip()[-300:]}"
    wheel = next((os.path.join(wheels, n) for n in os.listdir(wheels) if n.endswith(".whl")), None)
    if wheel is None:
        return None, "pip wheel wrote no wheel"
    done = subprocess.run([py, "-m", "pip", "install", "-q", wheel], capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"pip install of the wheel failed: {done.stderr.strip()[-300:]}"
    return py, f"wheel {os.path.basename(wheel)} in {venv}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-wheel", action="store_true", help="measure the editable install only")
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
        installs = {"editable": py}
        if not args.no_wheel:
            wpy, said = wheel_python(tmp)
            print(f"wheel install: {said}")
            if wpy is not None:
                installs["wheel"] = wpy
        commands: dict[str, tuple[list[str], str | None]] = {}
        for install, python in installs.items():
            commands[f"{install}: baseline: {BASELINE_CODE}"] = ([python, "-c", BASELINE_CODE], None)
            commands[f"{install}: explain {BY_ID}"] = ([python, "-m", "gpudoctor", "explain", BY_ID], None)
            commands[f"{install}: explain <misaligned address + trailer>"] = (
                [python, "-m", "gpudoctor", "explain", PASTED], None)
        commands["editable: explain <attention OOM>"] = ([py, "-m", "gpudoctor", "explain", OOM], None)
        commands["editable: explain <misaligned + trailer>, no cache"] = ([*uncached, "explain", PASTED], None)
        commands["editable: explain --json - < 10 MB log"] = ([py, "-m", "gpudoctor", "explain", "--json", "-"], log)
        results = compare(commands, rounds=args.rounds, env=env)
    print(table(results, f"editable: baseline: {BASELINE_CODE}"))
    print()
    failed = [name for name, r in results.items() if r["exit_codes"] != [0]]
    for name in failed:  # a command that failed measured an error path, not explain
        print(f"FAILED: {name} exited {results[name]['exit_codes']}; its timing says nothing")
    for install in installs:
        base = results[f"{install}: baseline: {BASELINE_CODE}"]["median_s"]
        by_id = results[f"{install}: explain {BY_ID}"]["median_s"] / base
        pasted = results[f"{install}: explain <misaligned address + trailer>"]["median_s"] / base
        print(f"{install}: explain by id: {by_id:.2f}x its baseline (target <= {TARGET_ID}x): "
              f"{'OK' if by_id <= TARGET_ID else 'MISSED'}")
        print(f"{install}: explain the pasted misaligned address: {pasted:.2f}x its baseline "
              f"(target <= {TARGET_PASTED}x): {'OK' if pasted <= TARGET_PASTED else 'MISSED'}")
    base = results[f"editable: baseline: {BASELINE_CODE}"]["median_s"]
    oom = results["editable: explain <attention OOM>"]["median_s"] / base
    cold = results["editable: explain <misaligned + trailer>, no cache"]["median_s"] / base
    log_s = results["editable: explain --json - < 10 MB log"]["median_s"]
    print(f"editable: explain the pasted attention OOM: {oom:.2f}x its baseline (no target)")
    print(f"editable: a pasted error with no cache directory: {cold:.2f}x (no target: the first run)")
    print(f"10 MB log: {log_s:.3f} s (target < 1 s): {'OK' if log_s < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
