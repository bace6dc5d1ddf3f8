"""Tests for the `device-conformance` probe: the CPU as the device under test passes; a faulty
"device" (strided copies that ignore strides, a malloc-aligned allocator, overlapping allocations,
a missing operator) is emulated by replacing the probe's seams, and must fail with
`custom-allocator` findings that name the failing check."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gpudoctor.probes import device_conformance as dc
from gpudoctor.probes.base import ProbeContext, Status


def _run(device: str = "cpu"):
    return dc.run(ProbeContext(torch=torch, device=device))


def _failed(out) -> set[str]:
    return {c["check"] for c in out.details["checks"] if not c["ok"]}


def _dense(t):
    """What a stride-blind backend copy reads: the storage from the view's offset, in memory order."""
    return torch.as_strided(t, t.shape, _contiguous_strides(t.shape))


def _contiguous_strides(shape):
    strides, acc = [], 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= max(size, 1)
    return tuple(strides)


def test_spec_is_loadable_without_torch():
    code = (
        "import sys; import gpudoctor.probes.device_conformance as m; "
        "assert 'torch' not in sys.modules; print(m.SPEC.id)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "device-conformance"
    assert dc.SPEC.emits == ("custom-allocator",)
    assert "cuda" not in dc.SPEC.needs


def test_cpu_passes_every_check():
    out = _run()
    assert out.status is Status.PASS, out.summary
    assert out.findings == []
    names = [c["check"] for c in out.details["checks"]]
    assert names == [
        "alloc-sizes", "alignment", "alloc-overlap", "zero-size", "noncontiguous-copy-to-cpu",
        "noncontiguous-copy-to-device", "masked-fill", "causal-mask", "alloc-free-cycles",
    ]
    assert names == [dc.check_name(f) for f in (dc.check_alloc_sizes, dc.check_alignment)] + [
        dc.check_name(f) for f in dc.CHECKS[1:]
    ]
    # Seed 004's truth: the CPU allocator aligns to 64 bytes (c10 gAlignment), not malloc's 16.
    assert out.details["min_alignment_bytes"] >= 64
    cycles = out.details["checks"][-1]
    assert cycles["cycles"] == dc.ALLOC_CYCLES
    assert cycles["memory_check"].startswith("skipped: ")


def test_stride_blind_device_to_cpu_copy_is_caught(monkeypatch):
    monkeypatch.setattr(dc, "to_cpu", lambda t: _dense(t).to("cpu", copy=True))
    out = _run()
    assert out.status is Status.FAIL
    assert _failed(out) == {"noncontiguous-copy-to-cpu"}
    (finding,) = out.findings
    assert finding.kb_id == "custom-allocator"
    assert finding.summary == "noncontiguous-copy-to-cpu: cpu differs from the CPU"
    assert "transpose: shape=[9, 24] stride=[1, 9] offset=0 differs after device->cpu" in finding.evidence
    assert "noncontiguous-copy-to-cpu" in out.summary


def test_stride_blind_cpu_to_device_copy_is_caught(monkeypatch):
    monkeypatch.setattr(dc, "to_device", lambda t, device: _dense(t).to(device, copy=True))
    out = _run()
    assert out.status is Status.FAIL
    assert "noncontiguous-copy-to-device" in _failed(out)
    assert all(f.kb_id == "custom-allocator" for f in out.findings)
    (finding,) = [f for f in out.findings if f.summary.startswith("noncontiguous-copy-to-device")]
    assert any(e.startswith("strided [::2, ::3]:") for e in finding.evidence)


def test_malloc_aligned_allocator_is_caught(monkeypatch):
    def malloc16(torch_, shape, dtype, device):
        # A plain-malloc backend: 16-byte aligned, never 64.
        itemsize = torch_.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= s
        raw = torch_.empty(numel * itemsize + 64, dtype=torch_.uint8, device=device)
        return raw[16: 16 + numel * itemsize].view(dtype).reshape(shape)

    monkeypatch.setattr(dc, "empty", malloc16)
    out = _run()
    assert out.status is Status.FAIL
    assert _failed(out) == {"alignment"}
    assert out.details["min_alignment_bytes"] == 16
    (finding,) = out.findings
    assert finding.evidence == ("fresh allocations only 16-byte aligned on cpu; cpu needs 64",)


def test_overlapping_allocator_is_caught(monkeypatch):
    arena = torch.zeros(4096, dtype=torch.uint8)

    def arena_alloc(torch_, shape, dtype, device):
        # Every allocation starts at the same address: an allocator that forgot its free list.
        itemsize = torch_.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= s
        return arena[: numel * itemsize].view(dtype).reshape(shape)

    monkeypatch.setattr(dc, "empty", arena_alloc)
    out = _run()
    assert out.status is Status.FAIL
    assert "alloc-overlap" in _failed(out)
    overlap = next(c for c in out.details["checks"] if c["check"] == "alloc-overlap")
    assert overlap["overlapping_pointer_ranges"] > 0
    assert any("was overwritten" in p for p in overlap["problems"])


def test_missing_operator_is_a_result_not_a_crash(monkeypatch):
    message = "Could not run 'aten::masked_fill_.Scalar' with arguments from the 'PrivateUse1' backend."

    def missing(self, *args, **kwargs):
        raise NotImplementedError(message)

    monkeypatch.setattr(torch.Tensor, "masked_fill_", missing)
    out = _run()
    assert out.status is Status.FAIL
    assert _failed(out) == {"masked-fill", "causal-mask"}
    for finding in out.findings:
        assert finding.evidence == (f"raised NotImplementedError: {message}",)


@pytest.mark.gpu
def test_cuda_conforms():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    out = _run("cuda:0")
    assert out.status is Status.PASS, out.summary
    # The caching allocator hands out 512-byte blocks.
    assert out.details["min_alignment_bytes"] >= 512
    cycles = out.details["checks"][-1]
    assert cycles["memory_allocated_before"] == cycles["memory_allocated_after"]
