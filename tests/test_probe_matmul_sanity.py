"""Tests for the `matmul-sanity` probe: accuracy checks run for real on the CPU; broken GEMMs are
injected by wrapping `Tensor.__matmul__` for the low-precision dtypes only (the fp64 reference
stays honest)."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from gpudoctor.probes import matmul_sanity
from gpudoctor.probes.base import ProbeContext, Status

_real_matmul = torch.Tensor.__matmul__


def _run(device: str = "cpu"):
    return matmul_sanity.run(ProbeContext(torch=torch, device=device))


def test_spec_is_loadable_without_torch():
    code = (
        "import sys; import gpudoctor.probes.matmul_sanity as m; "
        "assert 'torch' not in sys.modules; print(m.SPEC.id)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "matmul-sanity"
    # No knowledge-base entry fits a broken BLAS yet: the probe promises no finding ids.
    assert matmul_sanity.SPEC.emits == ()


def test_cpu_accuracy_passes_with_fresh_inputs():
    out = _run()
    assert out.status is Status.PASS, out.summary
    cases = out.details["accuracy"]
    assert {(c["mode"], c["layout"]) for c in cases} == {
        (m, l) for m in ("fp32", "fp16", "bf16") for l in ("nn", "nt")
    }
    for c in cases:
        assert c["verdict"] == "pass"
        # Real rounding error, not zero: the inputs were random and the dtypes really differ.
        assert 0 < c["rel_error"] <= matmul_sanity.TOLERANCE[c["mode"]]
    errors = {c["mode"]: c["rel_error"] for c in cases if c["layout"] == "nn"}
    assert errors["fp32"] < errors["fp16"] < errors["bf16"]
    assert out.details["tf32"].startswith("skipped: ")
    assert out.details["throughput"]["peak_comparison"].startswith("skipped: ")
    assert out.details["throughput"]["measured"][0]["tflops"] > 0
    assert _run().details["seed"] != out.details["seed"]


def test_user_precision_setting_is_restored():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        _run()
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_per_backend_precision_setting_is_restored():
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has no per-backend fp32_precision API (torch < 2.9)")
    before = torch.get_float32_matmul_precision()
    try:
        # Set through the new API only: torch's legacy getter now raises, the probe must cope.
        matmul.fp32_precision = "tf32"
        assert _run().status is Status.PASS
        assert matmul.fp32_precision == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_blas_that_ignores_transposed_strides_fails(monkeypatch):
    def broken(a, b):
        if a.dtype != torch.float64 and not b.is_contiguous():
            # A GEMM reading a column-major operand as if it were row-major.
            b = torch.as_strided(b, b.shape, (b.shape[1], 1))
        return _real_matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", broken)
    out = _run()
    assert out.status is Status.FAIL
    assert out.findings == []
    failed = {(c["mode"], c["layout"]) for c in out.details["accuracy"] if c["verdict"] == "fail"}
    assert failed == {("fp32", "nt"), ("fp16", "nt"), ("bf16", "nt")}
    assert "fp32 nt [192, 512, 160]: rel. error" in out.summary


def test_nan_never_passes(monkeypatch):
    def nan_bf16(a, b):
        out = _real_matmul(a, b)
        if a.dtype == torch.bfloat16:
            out[0, 0] = math.nan
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", nan_bf16)
    out = _run()
    assert out.status is Status.FAIL
    bf16 = [c for c in out.details["accuracy"] if c["mode"] == "bf16"]
    assert all(math.isnan(c["rel_error"]) and c["verdict"] == "fail" for c in bf16)
    assert "rel. error nan" in out.summary


def test_relative_error():
    ref = torch.ones(4, 4, dtype=torch.float64)
    assert matmul_sanity.relative_error(torch, ref.float(), ref) == 0.0
    assert matmul_sanity.relative_error(torch, (ref * 1.01).float(), ref) == pytest.approx(0.01, rel=1e-5)
    assert math.isnan(matmul_sanity.relative_error(torch, torch.full((4, 4), math.inf), ref))


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 5090", "GeForce RTX 5090 (sm_120)"),
        ("NVIDIA B200", "B200"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ],
)
def test_peak_table_matches_device_names(name, label):
    peak = matmul_sanity.lookup_peak(name)
    assert peak is not None and peak.label == label
    assert "lead" in peak.source


def test_peak_table_unknowns_and_missing_modes():
    assert matmul_sanity.lookup_peak("NVIDIA Quadro P1000") is None
    t4 = matmul_sanity.lookup_peak("Tesla T4")
    assert t4.bf16 is None and t4.tf32 is None and t4.fp16 == 65.0
    for peak in matmul_sanity.PEAKS:
        if peak.tf32 is not None:
            assert peak.tf32 < peak.bf16  # dense TF32 is half the fp16/bf16 rate on these chips


def test_slow_gpu_warns_and_names_tf32_override(monkeypatch):
    slow = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "NVIDIA_TF32_OVERRIDE": "0",
        "peak_comparison": "done",
        "measured": [
            {"mode": "bf16", "tflops": 700.0, "nominal_tflops": 989.0, "fraction_of_nominal": 0.71, "slow": False},
            {"mode": "tf32", "tflops": 50.0, "nominal_tflops": 494.0, "fraction_of_nominal": 0.10, "slow": True},
        ],
    }
    monkeypatch.setattr(matmul_sanity, "_throughput", lambda ctx: slow)
    out = _run()
    assert out.status is Status.WARN
    assert "tf32 50 TFLOP/s = 10% of nominal 494" in out.summary
    assert "NVIDIA_TF32_OVERRIDE=0 disables TF32" in out.summary


def test_gemm_timing_events_are_on_the_probe_device():
    # Audit D5: with --device cuda:1 the events must enclose the GEMMs on device 1, not the
    # current device 0 (which gave microseconds and tens of thousands of TFLOP/s: a false pass).
    import cudasim

    # 4 GEMMs of 1024^3 in 0.016 ms: ~540 TFLOP/s, a healthy H100's share of its nominal peak.
    with cudasim.simulated(fast_gemm=True, elapsed_ms=0.004) as (sim_torch, state):
        out = matmul_sanity.run(ProbeContext(torch=sim_torch, device="cuda:1", memory_budget_bytes=64 << 20))
    records = {dev for name, dev in state.log if name == "event.record"}
    assert records == {1}
    measured = out.details["throughput"]["measured"]
    assert [m["mode"] for m in measured] == ["bf16", "fp16", "tf32"]
    assert all(m["tflops"] > 0 for m in measured)
    assert out.status is Status.PASS, out.summary


def test_zero_elapsed_time_is_an_error_entry_not_a_crash():
    import cudasim

    with cudasim.simulated(fast_gemm=True, elapsed_ms=0.0) as (sim_torch, _):
        out = matmul_sanity.run(ProbeContext(torch=sim_torch, device="cuda:0", memory_budget_bytes=64 << 20))
    measured = out.details["throughput"]["measured"]
    assert all("ZeroDivisionError" in m["error"] for m in measured)


@pytest.mark.gpu
def test_cuda_accuracy_and_peak():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    out = _run("cuda:0")
    # The audit's H100 verdict: pass (bf16/fp16 at 60-75 % of nominal, TF32 at 60-80 %).
    assert out.status is Status.PASS, out.summary
    modes = {c["mode"] for c in out.details["accuracy"]}
    assert "tf32" in modes
    assert all(m.get("tflops", 1) > 0 for m in out.details["throughput"]["measured"])
