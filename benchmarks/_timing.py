"""Side-by-side timing helpers for the benchmark scripts: commands are run interleaved, round
after round, so machine noise hits every command alike; medians are reported with ratios."""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Sequence


def run_once(cmd: Sequence[str], stdin_path: str | None = None, env: dict | None = None) -> tuple[float, float, int]:
    """Wall seconds, child CPU seconds (user+sys) and exit code of one run."""
    before = os.times()
    start = time.perf_counter()
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as stdin:
        proc = subprocess.run(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, proc.returncode


def bytecode_env(cache_dir: str) -> dict:
    """The environment of an installed tool: Python's bytecode cache on (in `cache_dir`, for every
    command alike), even where PYTHONDONTWRITEBYTECODE is set for the shell. Without it our own
    modules are compiled from source on every run while the libraries' wheels ship their .pyc,
    which measures the compiler, not the start-up a user gets."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def compare(commands: dict[str, tuple[Sequence[str], str | None]], rounds: int, warmup: int = 2,
            env: dict | None = None) -> dict[str, dict]:
    """Median wall and CPU time per named command, measured interleaved (all in `env`)."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    for i in range(warmup + rounds):
        for name, (cmd, stdin_path) in commands.items():
            wall, cpu, code = run_once(cmd, stdin_path, env)
            if i >= warmup:
                walls[name].append(wall)
                cpus[name].append(cpu)
                codes[name].add(code)
    return {name: {"median_s": statistics.median(walls[name]), "cpu_s": statistics.median(cpus[name]),
                   "exit_codes": sorted(codes[name])} for name in commands}


def table(results: dict[str, dict], baseline: str) -> str:
    base = results[baseline]["median_s"]
    width = max(len(n) for n in results)
    lines = [f"{'command'.ljust(width)}  median_s  cpu_s   ratio_to_{baseline}"]
    for name, r in results.items():
        lines.append(f"{name.ljust(width)}  {r['median_s']:8.3f}  {r['cpu_s']:6.3f}  {r['median_s'] / base:6.2f}x"
                     f"   exit={r['exit_codes']}")
    return "\n".join(lines)
