"""Tests for the `contiguity` probe: it runs fully on the CPU, records torch's exact `.view` error,
and fails when torch (or the raw reader) is made to misbehave."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gpudoctor.probes import contiguity
from gpudoctor.probes.base import ProbeContext, Status


def _run(device: str = "cpu"):
    return contiguity.run(ProbeContext(torch=torch, device=device))


def test_spec_is_loadable_without_torch():
    code = (
        "import sys; import gpudoctor.probes.contiguity as m; "
        "assert 'torch' not in sys.modules, 'probe imported torch at module level'; "
        "print(m.SPEC.id)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "contiguity"
    assert set(contiguity.SPEC.emits) == {"view-stride", "noncontiguous-kernel-input"}
    assert "cuda" not in contiguity.SPEC.needs


def test_passes_on_cpu_and_records_torch_view_error():
    out = _run()
    assert out.status is Status.PASS, out.summary
    assert out.findings == []
    view_cases = [c for c in out.details["cases"] if c["kb_id"] == "view-stride"]
    assert len(view_cases) == 2
    for case in view_cases:
        assert case["is_contiguous"] is False
        assert case["raised"] == f"RuntimeError: {contiguity.VIEW_ERROR}"
        assert case["message_is_known_text"] is True
        assert case["reshape_ok"] is True and case["contiguous_view_ok"] is True
    transpose = view_cases[0]
    assert transpose["shape"] == [2, 4, 8, 16] and transpose["stride"] == [512, 16, 64, 1]


def test_raw_reader_sees_memory_order_not_logical_order():
    (raw,) = [c for c in _run().details["cases"] if c["kb_id"] == "noncontiguous-kernel-input"]
    assert raw["reader"] == "ctypes"
    assert raw["transposed_reads_memory_order"] is True
    assert raw["contiguous_copy_reads_logical_order"] is True
    assert raw["contiguous_shares_storage"] is False
    # Values are randn + 3, distinct: reading in the wrong order must differ visibly.
    assert raw["transposed_max_abs_diff_vs_logical"] > 0.1


def test_read_raw_dereferences_the_pointer():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert contiguity.read_raw(torch, base.t(), 12).tolist() == list(range(12))
    assert contiguity.read_raw(torch, base.t().contiguous(), 12).tolist() == base.t().flatten().tolist()
    # A slice starts at its own data_ptr (storage offset), as an extension would see it.
    assert contiguity.read_raw(torch, base[1], 4).tolist() == [4.0, 5.0, 6.0, 7.0]
    with pytest.raises(TypeError):
        contiguity.read_raw(torch, base.double(), 12)


def test_fails_when_reshape_ignores_strides(monkeypatch):
    def broken_reshape(self, *shape):
        # What a buggy reshape would do: reinterpret the storage as if it were contiguous.
        return torch.as_strided(self, self.shape, _dense_strides(self.shape)).view(*shape)

    monkeypatch.setattr(torch.Tensor, "reshape", broken_reshape)
    out = _run()
    assert out.status is Status.FAIL
    assert {f.kb_id for f in out.findings} == {"view-stride"}
    assert any(f.summary.startswith(".reshape of a transpose(1, 2) tensor") for f in out.findings)
    assert all(c.get("reshape_ok", True) is False for c in out.details["cases"] if c["kb_id"] == "view-stride")


def test_fails_when_contiguous_copy_is_not_row_major(monkeypatch):
    # A reader that follows strides cannot show the pitfall: the probe must say torch's storage
    # does not look the way extensions rely on.
    monkeypatch.setattr(contiguity, "read_raw", lambda torch_, t, n: t.flatten().to("cpu"))
    out = _run()
    assert out.status is Status.FAIL
    assert [f.kb_id for f in out.findings] == ["noncontiguous-kernel-input"]
    assert "transposed tensor does not hold its base's memory" in out.findings[0].summary


def _dense_strides(shape):
    strides, acc = [], 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= size
    return tuple(strides)


@pytest.mark.gpu
def test_passes_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    out = _run("cuda:0")
    assert out.status is Status.PASS, out.summary
    (raw,) = [c for c in out.details["cases"] if c["kb_id"] == "noncontiguous-kernel-input"]
    assert raw["reader"] == "as_strided" and raw["transposed_reads_memory_order"] is True
