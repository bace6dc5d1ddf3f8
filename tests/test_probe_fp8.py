"""Tests for the `fp8-matmul` probe: the real rule table on the CPU (eager and meta/compile paths)
and, where a GPU exists, on CUDA."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.probes import fp8_matmul  # noqa: E402
from gpudoctor.probes.base import ProbeContext, Status  # noqa: E402

def _cpu_kernel() -> bool:
    """torch 2.4 declares _scaled_mm but has no CPU kernel for it (2.5 and later do)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    call, _ = fp8_matmul.scaled_mm_caller(torch)
    one = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        call(one, one.t(), torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.bfloat16)
    except NotImplementedError:
        return False
    return True


needs_fp8 = pytest.mark.skipif(not _cpu_kernel(),
                               reason="this torch has no torch._scaled_mm kernel for the CPU")


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
def test_missing_out_dtype_is_documented_float8_not_wrong(cpu_outcome):
    # Audit D12: without out_dtype the result is float8_e4m3fn, as documented; its error (~0.03
    # of the largest value) is float8 rounding, judged at float8's tolerance.
    case = _case(cpu_outcome, "no-out-dtype")
    eager = case["eager"]
    assert eager["out_dtype"] == "float8_e4m3fn"
    assert fp8_matmul._TOLERANCE["bfloat16"] < eager["rel_error"] <= fp8_matmul._TOLERANCE["float8_e4m3fn"]
    assert eager["outcome"] == "correct" and case["verdict"] == "documented"


@needs_fp8
def test_cpu_scan_has_no_findings_for_cuda_only_rules(cpu_outcome):
    # CPU _scaled_mm accepting layouts cuBLASLt rejects is how the CPU kernel is, not something
    # to fix on this machine: details, never a warning.
    accepted = [c["case"] for c in cpu_outcome.details["cases"] if c.get("verdict") == "accepted"]
    assert accepted  # the facts are still recorded
    assert cpu_outcome.status is Status.PASS and cpu_outcome.findings == []
    assert "although torch.compile refuses" in cpu_outcome.summary


def test_summary_tallies_the_rules_in_plain_words():
    """The summary a user reads on a healthy scan names what happened, not the details' verdict
    keys (`runs-eagerly`, `documented`, `cryptic`), with singular and plural right."""
    rules = [{"verdict": v} for v in ("runs-eagerly", "runs-eagerly", "documented", "enforced", "cryptic",
                                      "cryptic", "cryptic", "wrong")]
    text = fp8_matmul._rules_sentence(rules, "cuda:0")
    assert text == ("of 8 layout rules broken on purpose, 3 are refused with a bare cuBLASLt or CUDA status "
                    "(no word about FP8), 2 run on cuda:0 (torch.compile's stricter check not tried), "
                    "1 returns a float8 result as documented (no out_dtype), 1 is refused with a clear error "
                    "and 1 gives silently wrong numbers")
    assert set(fp8_matmul._VERDICT_WORDS) >= {"enforced", "cryptic", "wrong", "accepted", "not-run", "documented",
                                              "poisons", "tolerated", "runs-eagerly"}
    one = fp8_matmul._rules_sentence([{"verdict": "accepted"}], "cpu")
    assert one == "of 1 layout rule broken on purpose, 1 runs on cpu although torch.compile refuses it"


def test_only_silently_wrong_or_poisoning_rules_are_findings():
    def entry(name, eager, verdict_contract="ok"):
        c = {"case": name, "rule": "r", "fix": "f", "eager": eager,
             "compile_contract": {"outcome": verdict_contract}}
        c["verdict"] = fp8_matmul._verdict(c)
        return c

    assert entry("x", {"outcome": "error", "kind": "cublas-status",
                       "error": "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED"})["verdict"] == "cryptic"
    sticky = {"outcome": "error", "kind": "cuda-error",
              "error": "AcceleratorError: CUDA error: misaligned address"}
    assert entry("x", sticky)["verdict"] == "poisons"


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


# torch 2.4.1's declaration (native_functions.yaml; _VariableFunctions.pyi:865): keyword scales and
# an (out, amax) tuple; the positional scales and the single tensor came with pytorch#128683 (2.5).
SCHEMA_241 = ("aten::_scaled_mm(Tensor self, Tensor mat2, *, Tensor? bias=None, ScalarType? out_dtype=None, "
              "Tensor? scale_a=None, Tensor? scale_b=None, Tensor? scale_result=None, "
              "bool use_fast_accum=False) -> (Tensor, Tensor)")
NO_CPU_KERNEL_24 = ("Could not run 'aten::_scaled_mm' with arguments from the 'CPU' backend. This could be "
                    "because the operator doesn't exist for this backend, or was omitted during the "
                    "selective/custom build process (if using custom build). 'aten::_scaled_mm' is only "
                    "available for these backends: [CUDA, Meta, BackendSelect, Python, Functionalize].")


class Torch24:
    """torch as 2.4.1 declares _scaled_mm; everything else is the real torch."""

    def __init__(self, kernel=None):
        real = torch._scaled_mm

        def _scaled_mm(input, mat2, *, bias=None, out_dtype=None, scale_a=None, scale_b=None,
                       scale_result=None, use_fast_accum=False):
            if kernel is not None:
                return kernel(input)
            out = real(input, mat2, scale_a, scale_b, bias=bias, out_dtype=out_dtype)
            return out, torch.empty((), dtype=torch.float32)

        schema = torch._C.parse_schema(SCHEMA_241)
        self._scaled_mm = _scaled_mm
        self.ops = type("Ops", (), {"aten": type("Aten", (), {"_scaled_mm": type(
            "Op", (), {"default": type("Overload", (), {"_schema": schema})})})})
        self.__version__ = "2.4.1"

    def __getattr__(self, name):
        return getattr(torch, name)


@needs_fp8
def test_torch_24_scaled_mm_signature_is_detected():
    # Audit D8: the >= 2.5 call raised TypeError on 2.4 and the probe failed with fp8-layout.
    out = fp8_matmul.run(ProbeContext(torch=Torch24(), device="cpu"))
    assert out.status is Status.PASS, out.summary
    assert out.details["scaled_mm_form"].startswith("torch 2.4")
    assert _case(out, "aligned")["eager"]["outcome"] == "correct"
    assert _case(out, "aligned")["eager"]["out_dtype"] == "bfloat16"


@needs_fp8
def test_torch_24_without_a_cpu_kernel_skips():
    def no_kernel(_):
        raise NotImplementedError(NO_CPU_KERNEL_24)

    out = fp8_matmul.run(ProbeContext(torch=Torch24(kernel=no_kernel), device="cpu"))
    assert out.status is Status.SKIPPED and "no torch._scaled_mm kernel for cpu" in out.summary
    assert out.findings == []


CUBLAS_STATUS = ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul with "
                 "transpose_mat1 1 transpose_mat2 0 m 48 n 32 k 64 mat1_ld 64 mat2_ld 64 result_ld 48 "
                 "computeType 68 scaleType 0")


@needs_fp8
def test_a_cublas_status_does_not_poison_the_rest(monkeypatch):
    # Audit D4: "CUDA error: CUBLAS_STATUS_..." is not sticky; the later rules still run, and a
    # rule enforced with a cryptic status is a detail on a healthy GPU.
    import cudasim

    real = torch._scaled_mm

    def scaled_mm(a, b, scale_a, scale_b, **kwargs):
        if b.shape[1] == fp8_matmul.UNALIGNED and getattr(a, "_sim_cuda", False):
            raise RuntimeError(CUBLAS_STATUS.split(": ", 1)[1])
        return real(a, b, scale_a, scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    with cudasim.simulated() as (sim_torch, state):
        out = fp8_matmul.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    assert _case(out, "n-not-16")["verdict"] == "cryptic"
    assert not any(c["eager"]["outcome"] == "not-run" for c in out.details["cases"])
    assert out.status is Status.PASS and out.findings == [], out.summary
    assert [c["case"] for c in out.details["cases"]][-1] == "mat1-storage-offset"


@needs_fp8
def test_a_sticky_fault_in_the_last_case_is_one_warning(monkeypatch):
    import cudasim

    real = torch._scaled_mm
    with cudasim.simulated() as (sim_torch, state):
        def scaled_mm(a, b, scale_a, scale_b, **kwargs):
            if a.storage_offset() and getattr(a, "_sim_cuda", False):
                state.poison()
                raise cudasim.CudaError(state.poisoned)
            return real(a, b, scale_a, scale_b, **kwargs)

        monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
        out = fp8_matmul.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    assert _case(out, "mat1-storage-offset")["verdict"] == "poisons"
    assert out.details["scaled_mm_v2"]["outcome"] == "not-run"
    assert out.status is Status.WARN
    (finding,) = out.findings
    assert finding.kb_id == "fp8-layout" and "mat1-storage-offset (poisons)" in finding.summary


def test_gpu_without_fp8_is_skipped_unless_asked():
    import cudasim

    with cudasim.simulated(capability=(8, 0), name="NVIDIA A100-SXM4-80GB") as (sim_torch, _):
        out = fp8_matmul.run(ProbeContext(torch=sim_torch, device="cuda:0"))
        assert out.status is Status.SKIPPED and "no FP8 tensor cores" in out.summary
        asked = fp8_matmul.run(ProbeContext(torch=sim_torch, device="cuda:0",
                                            options={"requested_probes": ["fp8-matmul"]}))
    assert asked.status is Status.WARN
    assert [f.kb_id for f in asked.findings] == ["fp8-unsupported-gpu"]


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
        assert outcome.status is Status.SKIPPED and outcome.findings == []
    else:
        # The audit's H100 verdict with torch 2.11: the size and layout rules and the scale rules
        # enforced with torch's own texts, no out_dtype documented float8; no finding.
        assert _case(outcome, "aligned")["eager"]["outcome"] == "correct"
        assert _case(outcome, "m-not-16")["eager"]["outcome"] == "correct"
        for name in ("k-not-16", "n-not-16", "mat2-row-major", "mat1-transposed", "scale-fp16", "scale-shape-m"):
            assert _case(outcome, name)["verdict"] == "enforced", _case(outcome, name)
        assert _case(outcome, "no-out-dtype")["verdict"] == "documented"
        assert outcome.status is Status.PASS and outcome.findings == [], outcome.summary
