"""Tests of the sdpa-backends probe, run for real on the CPU: the matrix, the captured refusal
reasons, the default-choice record, the deprecation check and the helpers on real torch texts."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from gpudoctor.probes import _attention as att
from gpudoctor.probes import sdpa_backends as sdpa
from gpudoctor.probes.base import ProbeContext, Status


@pytest.fixture(scope="module")
def outcome():
    return sdpa.run(ProbeContext(torch=torch, device="cpu"))


def test_cpu_matrix(outcome):
    assert outcome.status is Status.PASS, outcome.summary
    m = outcome.details["matrix"]
    assert set(m) == set(sdpa.BACKENDS)
    keys = {f"{d}/{c.name}" for d in sdpa.DTYPES for c in sdpa.CASES}
    assert all(set(row) == keys for row in m.values())
    # Math and the CPU flash kernel really run and agree with the fp32 reference...
    for backend in ("MATH", "FLASH_ATTENTION"):
        for key in keys - {f"{d}/strided" for d in sdpa.DTYPES}:
            assert m[backend][key].startswith("ok("), (backend, key, m[backend][key])
    # ...while memory-efficient and cuDNN have no CPU kernel.
    assert all(v.startswith("unavailable(") for v in m["EFFICIENT_ATTENTION"].values())
    assert outcome.details["recommended_backend"] == "FLASH_ATTENTION"
    assert outcome.details["counts"]["mismatch"] == 0


def test_refusal_reason_is_captured(outcome):
    cell = outcome.details["matrix"]["FLASH_ATTENTION"]["float16/strided"]
    assert cell.startswith("refused(") and "last dimension of the input to have stride 1" in cell
    assert "Triggered internally" not in cell
    assert outcome.details["matrix"]["MATH"]["float16/strided"].startswith("ok(")
    # The default path silently picks math for these inputs; _fused_sdp_choice makes it visible.
    assert outcome.details["default_choice"]["float32/strided"] == "MATH"
    assert outcome.details["default_choice"]["float32/d64"] == "FLASH_ATTENTION"


def test_deprecated_sdp_kernel_is_information_only(outcome):
    found = [f for f in outcome.findings if f.kb_id == "sdp-kernel-deprecated"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "torch.nn.attention.sdpa_kernel()" in found[0].evidence[0]
    assert set(f.kb_id for f in outcome.findings) <= set(sdpa.SPEC.emits)


def test_cell_detects_wrong_numbers():
    case = sdpa.CASES[0]
    base = sdpa._inputs(torch, case, "cpu", seed=1)
    ref = list(sdpa._reference(torch, case, base, torch.float32))
    ref[0] = ref[0] + 0.5  # a kernel that is off by 0.5 everywhere
    cell = sdpa.run_cell(torch, SDPBackend.MATH, case, base, torch.float32, tuple(ref))
    assert cell["status"] == "mismatch" and cell["fwd_err"] == pytest.approx(0.5, abs=1e-4)
    assert sdpa.cell_text(cell).startswith("mismatch(fwd 5.0e-01")


def test_no_kernel_cell_with_real_cpu_text():
    case = sdpa.Case("bad-dims", head_dim=64)
    base = sdpa._inputs(torch, case, "cpu", seed=2)
    base["v"] = base["v"][..., :32].contiguous()  # value head dim differs: flash must refuse
    cell = sdpa.run_cell(torch, SDPBackend.FLASH_ATTENTION, case, base, torch.float32, ())
    assert cell["status"] == "refused"
    assert "No available kernel.  Aborting execution." in cell["text"]  # CPU: two spaces
    assert any("same last dimension" in r for r in cell["reasons"])
    assert att.classify_kernel_error(cell["text"]) == "sdpa-no-kernel"
    assert att.classify_kernel_error("RuntimeError: No available kernel. Aborting execution.") == "sdpa-no-kernel"


def test_default_path_without_kernel_fails_with_sdpa_no_kernel(monkeypatch):
    # Disabling every backend globally is how user code ends up with no kernel on the default path.
    flags = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in ("flash", "math")}
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    monkeypatch.setattr(sdpa, "CASES", sdpa.CASES[:1])
    monkeypatch.setattr(sdpa, "DTYPES", ("float32",))
    try:
        out = sdpa.run(ProbeContext(torch=torch, device="cpu"))
    finally:
        torch.backends.cuda.enable_flash_sdp(flags["flash"])
        torch.backends.cuda.enable_math_sdp(flags["math"])
    assert out.status is Status.FAIL
    found = [f for f in out.findings if f.kb_id == "sdpa-no-kernel"]
    assert found and "flash=off" in found[0].evidence[-1] and "math=off" in found[0].evidence[-1]


def test_refusal_reasons_parsing():
    texts = ["Flash attention kernel not used because: (Triggered internally at x.cpp:99.)",
             "Flash attention requires q,k,v to have the same last dimension. (Triggered internally at y.cpp:21.)",
             "Memory efficient kernel not used because: Mem efficient attention requires last dimension "
             "of inputs to be divisible by 8"]
    assert att.refusal_reasons(texts) == [
        "Flash attention requires q,k,v to have the same last dimension.",
        "Mem efficient attention requires last dimension of inputs to be divisible by 8"]


def test_recommend_prefers_fused_and_priority():
    cells = [{"backend": b, "dtype": "float16", "case": "d64", "status": s}
             for b, s in (("FLASH_ATTENTION", "refused"), ("EFFICIENT_ATTENTION", "ok"),
                          ("CUDNN_ATTENTION", "ok"), ("MATH", "ok"))]
    assert sdpa.recommend(cells)[0] == "CUDNN_ATTENTION"
    only_math = [dict(c, status="ok" if c["backend"] == "MATH" else "refused") for c in cells]
    assert sdpa.recommend(only_math)[0] == "MATH"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matrix_has_a_fused_backend():
    out = sdpa.run(ProbeContext(torch=torch, device="cuda:0"))
    assert out.status in (Status.PASS, Status.WARN), out.summary
    assert out.details["recommended_backend"] != "MATH"
