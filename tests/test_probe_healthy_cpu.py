"""A healthy CPU machine gets a clean report, whatever the load (issue 7).

End to end through the real CLI, workers and probes: `scan --device cpu` has zero findings and
zero warnings; the default scan (device auto, no CUDA here) has exactly one warning finding,
`cuda-unavailable` from cuda-runtime, and nothing else. And every probe that runs on the CPU
reaches the same verdict and findings when each clock reading comes seconds after the last (a
machine under heavy load): no verdict may depend on timing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.probes import load_builtin  # noqa: E402
from gpudoctor.probes.base import ProbeContext, Status  # noqa: E402

# Probes that do their work on the CPU, from their specs: the others judge CUDA itself
# (`runs_on_cpu=False`) or need a package beyond torch (xformers, flash_attn) and skip here.
CPU_PROBES = tuple(m.SPEC.id for m in load_builtin() if m.SPEC.runs_on_cpu and set(m.SPEC.needs) <= {"torch"})


def _scan(*args: str) -> dict:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "scan", "--format", "json", *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _findings(report: dict) -> list[tuple[str, str, str]]:
    return [(r["probe"], f["kb_id"], f["severity"]) for r in report["results"] for f in r["findings"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_scan_device_cpu_is_clean():
    report = _scan("--device", "cpu")
    statuses = {r["probe"]: r["status"] for r in report["results"]}
    assert _findings(report) == []
    assert report["summary"]["warn"] == report["summary"]["fail"] == 0, statuses
    assert report["summary"]["crashed"] == report["summary"]["timed_out"] == 0, statuses
    assert {p for p, s in statuses.items() if s == "pass"} == set(CPU_PROBES), statuses
    assert statuses["cuda-runtime"] == "skipped"
    # What a report says names public cases, never the internal notes the probes grew from.
    assert not re.search(r"seed ?0[0-9][0-9]|field note", json.dumps(report), re.IGNORECASE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_default_scan_says_cuda_is_unavailable_once_and_nothing_else():
    report = _scan()
    assert _findings(report) == [("cuda-runtime", "cuda-unavailable", "warning")]
    statuses = {r["probe"]: r["status"] for r in report["results"]}
    assert [p for p, s in statuses.items() if s not in ("pass", "skipped")] == ["cuda-runtime"], statuses
    assert {p for p, s in statuses.items() if s == "pass"} == set(CPU_PROBES), statuses


class _LoadedTime(types.ModuleType):
    """The `time` module as a probe sees it on a machine so loaded that every clock reading is
    seconds after the previous one, by a different amount each time."""

    def __init__(self, real):
        super().__init__("time")
        self._real = real
        self._now = 0.0
        self._step = 0

    def _tick(self) -> float:
        self._step += 1
        self._now += 0.5 + (self._step * 7919 % 13)
        return self._now

    def perf_counter(self) -> float:
        return self._tick()

    def monotonic(self) -> float:
        return self._tick()

    def time(self) -> float:
        return 1.7e9 + self._tick()

    def __getattr__(self, name):
        return getattr(self._real, name)


def _verdict(outcome) -> tuple:
    return outcome.status, sorted((f.kb_id, f.severity) for f in outcome.findings)


@pytest.mark.parametrize("probe_id", CPU_PROBES)
def test_the_cpu_verdict_does_not_depend_on_machine_load(probe_id, monkeypatch):
    modules = {m.SPEC.id: m for m in load_builtin()}
    module = modules[probe_id]
    idle = module.run(ProbeContext(torch=torch, device="cpu"))
    assert idle.status is Status.PASS and idle.findings == [], idle.summary
    # Every probe module (and its helpers) reads the loaded clock.
    for name, mod in list(sys.modules.items()):
        if name.startswith("gpudoctor.probes") and isinstance(getattr(mod, "time", None), types.ModuleType):
            monkeypatch.setattr(mod, "time", _LoadedTime(mod.time))
    loaded = module.run(ProbeContext(torch=torch, device="cpu"))
    assert _verdict(loaded) == _verdict(idle), (idle.summary, loaded.summary)
