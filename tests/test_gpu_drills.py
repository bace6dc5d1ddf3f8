"""Fault drills on a real GPU (issue 8): probe files that trigger an illegal memory access, a
device-side assert, a kernel that never returns, and an allocation past the card, each run in a
scan beside a healthy probe. The scan must survive every one with the other results intact and
no process left behind; the GPU is never reset. On a machine without CUDA the drills skip with
their reason, which is checked here too, so the fixtures stay loadable in CI."""
from __future__ import annotations

import pathlib

import pytest

from gpudoctor.probes.base import Status
from gpudoctor.scan.runner import ScanOptions, run_scan

from test_scan_hardening import FAKES, tag, tagged  # noqa: F401  (tag is a fixture)

DRILLS = pathlib.Path(__file__).parent / "fixtures" / "gpu_drills"
ORDER = ("illegal_address", "device_assert", "kernel_hang", "alloc_past_card")


def _scan(device: str) -> dict[str, list]:
    # The healthy probe comes after every drill: it must run, and pass, in a fresh usable worker.
    files = tuple(str(DRILLS / f"{name}.py") for name in ORDER) + (str(FAKES / "torch_ok.py"),)
    report = run_scan(ScanOptions(probe_files=files, builtin=False, entry_points=False,
                                  collect_environment=False, device=device))
    by_id: dict[str, list] = {}
    for result in report.results:
        by_id.setdefault(result.probe, []).append(result)
    return by_id


@pytest.mark.torch
@pytest.mark.slow  # tens of seconds on 2 cores: left out by -m "not slow"
def test_drills_skip_with_their_reason_without_cuda(tag):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU test below runs the drills for real")
    by_id = _scan("cpu")
    for probe in ("drill-illegal-address", "drill-device-assert", "drill-kernel-hang", "drill-alloc-past-card"):
        [result] = by_id[probe]
        assert result.status is Status.SKIPPED and "CUDA" in result.summary, (probe, result.summary)
    assert [r.status for r in by_id["fake-torch"]] == [Status.PASS]
    assert tagged(tag) == []


@pytest.mark.gpu
def test_every_drill_costs_only_itself_on_a_real_gpu(tag):
    by_id = _scan("cuda:0")
    illegal = by_id["drill-illegal-address"][0]
    assert illegal.status is Status.CRASHED, illegal.summary
    assert "illegal memory access" in (illegal.summary + (illegal.stderr_tail or "")), illegal.summary
    asserted = by_id["drill-device-assert"][0]
    assert asserted.status is Status.CRASHED and "device-side assert" in asserted.summary, asserted.summary
    hung = by_id["drill-kernel-hang"][0]
    assert hung.status is Status.TIMED_OUT, hung.summary
    oom = by_id["drill-alloc-past-card"][0]
    assert oom.status is Status.CRASHED and "OutOfMemoryError" in oom.summary, oom.summary
    # The healthy probe ran and passed in a usable context after the drills.
    assert [r.status for r in by_id["fake-torch"]] == [Status.PASS]
    assert tagged(tag) == []
