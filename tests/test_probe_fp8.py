"""Tests for the `fp8-matmul` probe: the real rule table on the CPU (eager and meta/compile paths)
and, where a GPU exists, on CUDA."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.probes import fp8_matmul  # noqa: E402
from gpudoctor.probes.base import ProbeContext, Status  # noqa: E402

needs_fp8 = pytest.mark.skipif(
    not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"),
    reason="this torch has no torch._scaled_mm / float8_e4m3fn",
)


@pytest.fixture(scope="module")
def cpu_outcome():
    return fp8_matmul.run(ProbeContext(torch=torch, device="cpu", options={"fp8_compile_contract": True}))


def _case(outcome, name):
    return next(c for c in outcome.details["cases"] if c["case"] == name)


def test_spec_is_well_formed():
    spec = fp8_matmul.SPEC
    assert spec.id == "fp8-matmul"
    assert set(spec.emits) == {"fp8-layout", "fp8-unsupported-gpu"}
    assert "cuda" not in spec.needs  # device-agnostic: it must run on the CPU too


@needs_fp8
def test_aligned_case_gives_correct_numbers_on_cpu(cpu_outcome):
    aligned = _case(cpu_outcome, "aligned")
    assert aligned["eager"]["outcome"] == "correct"
    assert aligned["eager"]["out_dtype"] == "bfloat16"
    assert aligned["eager"]["rel_error"] < 1.6e-2
    assert aligned["compile_contract"]["outcome"] == "ok"
    assert cpu_outcome.status in (Status.PASS, Status.WARN)


@needs_fp8
def test_every_rule_case_is_recorded_with_fix(cpu_outcome):
    cases = cpu_outcome.details["cases"]
    assert [c["case"] for c in cases] == [c.name for c in fp8_matmul.CASES]
    for c in cases:
        assert c["eager"]["outcome"] in ("correct", "wrong", "error")
        if c["rule"]:
            assert c["fix"]
    # The whole outcome travels as JSON from the worker.
    json.dumps(cpu_outcome.to_dict())


@needs_fp8
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("k-not-16", "Expected self.size(1) to be divisible by 16, but got self.size(1)=40"),
        ("n-not-16", "Expected both dimensions of mat2 to be divisible by 16"),
        ("mat2-row-major", "mat2 must be col_major, got stride (48, 1)"),
        ("mat1-transposed", "self must be row_major, got stride (1, 32)"),
        ("scale-fp16", "scale_b must be float (fp32)"),
    ],
)
def test_compile_contract_rejects_unaligned_layouts_with_exact_text(cpu_outcome, name, message):
    contract = _case(cpu_outcome, name)["compile_contract"]
    assert contract["outcome"] == "error"
    assert message in contract["error"]


@needs_fp8
def test_layout_case_inputs_really_have_the_defect(cpu_outcome):
    # The layout is built on the device: a strided view must survive, not be copied away.
    assert "stride (1, 32)" in _case(cpu_outcome, "mat1-transposed")["eager"]["inputs"]
    assert "mat2 (64, 48) stride (48, 1)" in _case(cpu_outcome, "mat2-row-major")["eager"]["inputs"]
    assert f"offset {fp8_matmul.OFFSET_BYTES}" in _case(cpu_outcome, "mat1-storage-offset")["eager"]["inputs"]


@needs_fp8
def test_wrong_scale_shape_is_an_error_on_cpu(cpu_outcome):
    eager = _case(cpu_outcome, "scale-shape-m")["eager"]
    assert eager["outcome"] == "error"
    assert "Invalid scaling configuration" in eager["error"]
    assert _case(cpu_outcome, "scale-shape-m")["verdict"] == "enforced"


@needs_fp8
def test_missing_out_dtype_gives_float8_and_coarse_numbers(cpu_outcome):
    eager = _case(cpu_outcome, "no-out-dtype")["eager"]
    assert eager["outcome"] in ("wrong", "error")
    if eager["outcome"] == "wrong":
        assert eager["out_dtype"].startswith("float8")
        assert eager["rel_error"] > fp8_matmul._TOLERANCE["bfloat16"]


@needs_fp8
def test_silently_accepted_rules_become_one_warning(cpu_outcome):
    accepted = [c["case"] for c in cpu_outcome.details["cases"] if c.get("verdict") == "accepted"]
    layout = [f for f in cpu_outcome.findings if f.kb_id == "fp8-layout"]
    if accepted:
        assert cpu_outcome.status is Status.WARN
        assert len(layout) == 1 and layout[0].severity == "warning"
        for name in accepted:
            assert name in layout[0].summary
            assert any(line.startswith(f"{name}:") for line in layout[0].evidence)
        assert any("b.t().contiguous().t()" in line for line in layout[0].evidence)
    assert all(f.kb_id in fp8_matmul.SPEC.emits for f in cpu_outcome.findings)


def test_verdicts_from_measured_entries():
    base = {"rule": "r", "compile_contract": {"outcome": "error", "error": "x"}}
    cublas = {"outcome": "error", "error": "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling "
              "cublasLtMatmul", "kind": fp8_matmul._error_kind("CUBLAS_STATUS_NOT_SUPPORTED")}
    assert fp8_matmul._verdict({**base, "eager": cublas}) == "cryptic"
    layout = fp8_matmul._error_kind(
        "RuntimeError: Only multiplication of row-major and column-major matrices is supported by "
        "cuBLASLt"
    )
    assert layout == "cublaslt-layout"
    assert fp8_matmul._verdict({**base, "eager": {"outcome": "error", "kind": layout}}) == "enforced"
    assert fp8_matmul._verdict({**base, "eager": {"outcome": "correct"}}) == "accepted"
    ok_meta = {**base, "compile_contract": {"outcome": "ok"}}
    assert fp8_matmul._verdict({**ok_meta, "eager": {"outcome": "correct"}}) == "tolerated"
    assert fp8_matmul._verdict({**ok_meta, "eager": {"outcome": "wrong"}}) == "wrong"


def test_skips_without_scaled_mm():
    class NoFp8:
        __version__ = "1.13.0"

    outcome = fp8_matmul.run(ProbeContext(torch=NoFp8(), device="cpu"))
    assert outcome.status is Status.SKIPPED and "_scaled_mm" in outcome.summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rule_table():
    outcome = fp8_matmul.run(ProbeContext(torch=torch, device="cuda:0"))
    cap = torch.cuda.get_device_capability(0)
    if cap < fp8_matmul.MIN_CAPABILITY:
        assert any(f.kb_id == "fp8-unsupported-gpu" for f in outcome.findings)
        assert outcome.status is Status.WARN
    else:
        assert _case(outcome, "aligned")["eager"]["outcome"] == "correct"
        # Row-major mat2 and a transposed mat1 never give silently wrong numbers on CUDA.
        for name in ("mat2-row-major", "mat1-transposed"):
            assert _case(outcome, name)["eager"]["outcome"] in ("error", "correct")
