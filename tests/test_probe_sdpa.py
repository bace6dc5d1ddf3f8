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
    skipped = set(outcome.details.get("skipped_cases", {}))  # gqa on torch 2.4
    keys = {f"{d}/{c.name}" for d in sdpa.DTYPES for c in sdpa.CASES if c.name not in skipped}
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


def test_healthy_cpu_has_no_findings_and_the_legacy_api_is_a_detail(outcome):
    # The probe's own call of the deprecated torch.backends.cuda.sdp_kernel says nothing about
    # the user's code: a fact about the build, in the details, never a finding (audit D15).
    assert outcome.findings == []
    assert "sdp-kernel-deprecated" not in sdpa.SPEC.emits
    legacy = outcome.details["legacy_sdp_kernel"]
    if hasattr(torch.backends.cuda, "sdp_kernel"):
        assert "torch.nn.attention.sdpa_kernel()" in legacy
    assert outcome.details["forced_with"] == "torch.nn.attention.sdpa_kernel"


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
    assert found[0].severity == "error"


def test_refusal_reasons_parsing():
    texts = ["Flash attention kernel not used because: (Triggered internally at x.cpp:99.)",
             "Flash attention requires q,k,v to have the same last dimension. (Triggered internally at y.cpp:21.)",
             "Memory efficient kernel not used because: Mem efficient attention requires last dimension "
             "of inputs to be divisible by 8"]
    assert att.refusal_reasons(texts) == [
        "Flash attention requires q,k,v to have the same last dimension.",
        "Mem efficient attention requires last dimension of inputs to be divisible by 8"]


def test_recommend_prefers_fused_and_priority_and_ignores_fp32():
    cells = [{"backend": b, "dtype": "float16", "case": "d64", "status": s}
             for b, s in (("FLASH_ATTENTION", "refused"), ("EFFICIENT_ATTENTION", "ok"),
                          ("CUDNN_ATTENTION", "ok"), ("MATH", "ok"))]
    assert sdpa.recommend(cells)[0] == "CUDNN_ATTENTION"
    only_math = [dict(c, status="ok" if c["backend"] == "MATH" else "refused") for c in cells]
    assert sdpa.recommend(only_math)[0] == "MATH"
    # Audit D13: on CUDA only EFFICIENT runs fp32; its fp32 cells must not outvote the kernel
    # that wins on fp16/bf16 (here FLASH, as on an H100).
    h100 = [{"backend": b, "dtype": d, "case": c, "status": s}
            for c in ("d64", "d128", "causal")
            for d, b, s in (("float16", "FLASH_ATTENTION", "ok"), ("bfloat16", "FLASH_ATTENTION", "ok"),
                            ("float16", "EFFICIENT_ATTENTION", "ok"), ("bfloat16", "EFFICIENT_ATTENTION", "refused"),
                            ("float32", "EFFICIENT_ATTENTION", "ok"), ("float32", "FLASH_ATTENTION", "refused"))]
    best, why = sdpa.recommend(h100)
    assert best == "FLASH_ATTENTION" and why == "works on 6 of 6 bfloat16/float16 cases"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matrix_has_a_fused_backend():
    # The audit's verdict on a healthy H100 with torch 2.11: pass, no finding; SDPA's default is
    # cuDNN (fp16/bf16) or memory-efficient (fp32), never a silent math fallback for fp16/bf16.
    # fp32 with grouped-query heads is MATH on a real H100 with torch 2.11 (the memory-efficient
    # kernel takes no GQA there; seen in docs/validation/h100-torch2.11.0.json), as the audit
    # foresaw; fp32 is not a fallback the probe reports.
    out = sdpa.run(ProbeContext(torch=torch, device="cuda:0"))
    assert out.status is Status.PASS, (out.summary, out.details["forced_failures"])
    assert out.findings == []
    assert out.details["recommended_backend"] != "MATH"
    assert out.details["math_fallbacks"] == []
    assert all(v.split(":")[0] != "MATH" for k, v in out.details["default_path"].items()
               if not k.endswith("/strided") and k != "float32/gqa")
    if torch.cuda.get_device_capability(0) == (9, 0) and torch.__version__.startswith("2.11"):
        assert all(v.split(":")[0] == "CUDNN_ATTENTION" for k, v in out.details["default_path"].items()
                   if k.split("/")[0] != "float32" and not k.endswith("/strided"))


# ------------------------------------------------------------------ older and simulated surfaces

_real_sdpa = torch.nn.functional.scaled_dot_product_attention
_real_choice = torch._fused_sdp_choice


def _forced() -> str | None:
    """The one backend sdpa_kernel([b]) left enabled, from torch's global flags; None when more
    than one is on (nothing forced)."""
    on = [name for name, flag in (("FLASH_ATTENTION", "flash"), ("EFFICIENT_ATTENTION", "mem_efficient"),
                                  ("MATH", "math"), ("CUDNN_ATTENTION", "cudnn"))
          if getattr(torch.backends.cuda, f"{flag}_sdp_enabled")()]
    return on[0] if len(on) == 1 else None


def test_torch_24_sdpa_without_enable_gqa_skips_the_gqa_case(monkeypatch):
    # torch 2.4.1's signatures (nn/functional.py and _VariableFunctions.pyi): no enable_gqa.
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None):
        return _real_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                          is_causal=is_causal, scale=scale)

    def _fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
        return _real_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)
    monkeypatch.setattr(torch, "_fused_sdp_choice", _fused_sdp_choice)
    out = sdpa.run(ProbeContext(torch=torch, device="cpu"))
    assert out.status is Status.PASS, out.summary
    assert out.findings == [] and out.details["counts"]["error"] == 0
    assert "enable_gqa (added in torch 2.5)" in out.details["skipped_cases"]["gqa"]
    assert not any(key.endswith("/gqa") for row in out.details["matrix"].values() for key in row)


def test_async_fault_surfaces_in_its_cell_and_the_matrix_survives(monkeypatch):
    # A kernel that faults asynchronously: the launch returns, the sticky error surfaces at the
    # next synchronize or host read (audit D1, D2). Forced MATH on float16/d128 here.
    import cudasim

    with cudasim.simulated() as (sim_torch, state):
        def scaled_dot_product_attention(q, k, v, **kwargs):
            out = _real_sdpa(q, k, v, **kwargs)
            if _forced() == "MATH" and q.dtype == torch.float16 and q.shape[-1] == 128:
                state.poison()
            return out

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)
        out = sdpa.run(ProbeContext(torch=sim_torch, device="cuda:1"))
    cell = out.details["matrix"]["MATH"]["float16/d128"]
    assert cell.startswith(f"error in synchronize({cudasim.ERROR_NAME}: CUDA error: misaligned address"), cell
    assert out.details["matrix"]["MATH"]["bfloat16/d128"].startswith("not-run(not run: CUDA context poisoned")
    assert out.details["matrix"]["FLASH_ATTENTION"]["float16/d64"].startswith("ok(")
    assert "context_poisoned" in out.details
    # empty_cache() re-raises a sticky error (cudaFree): it must not be called once poisoned.
    assert ("empty_cache", None) not in state.log
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert finding.kb_id == "misaligned-address" and "MATH float16/d128" in finding.summary


def test_attention_probes_run_under_the_probe_device_guard(monkeypatch):
    # can_use_* and getCurrentDeviceProperties follow the *current* device (audit D5).
    import cudasim

    seen = []
    with cudasim.simulated() as (sim_torch, state):
        def _fused_sdp_choice(*args, **kwargs):
            seen.append(state.current)
            return _real_choice(*args, **kwargs)

        monkeypatch.setattr(torch, "_fused_sdp_choice", _fused_sdp_choice)
        monkeypatch.setattr(sdpa, "CASES", sdpa.CASES[:1])
        out = sdpa.run(ProbeContext(torch=sim_torch, device="cuda:1"))
    assert seen and set(seen) == {1}
    assert out.status is Status.PASS, out.summary
    assert state.current == 0  # restored
    # Forced cuDNN runs on one dtype only on CUDA (graph builds), and says so.
    assert out.details["matrix"]["CUDNN_ATTENTION"]["bfloat16/d64"].startswith("not-run(not forced")
    assert out.details["cudnn_forced_dtypes"] == ["float16"]


CUDNN_PLAN_ERROR = ("RuntimeError: cuDNN Frontend error: [cudnn_frontend] Error: No execution plans "
                    "support the graph.")


def test_forced_non_default_failure_is_a_warning_not_a_fail(monkeypatch):
    # Audit D17: a backend SDPA does not pick here fails only when forced.
    def scaled_dot_product_attention(q, k, v, **kwargs):
        if _forced() == "EFFICIENT_ATTENTION" or _forced() == "MATH" and q.shape[-1] == 256:
            raise RuntimeError(CUDNN_PLAN_ERROR.split(": ", 1)[1])
        return _real_sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)
    monkeypatch.setattr(sdpa, "CASES", sdpa.CASES[:3])
    out = sdpa.run(ProbeContext(torch=torch, device="cpu"))
    assert out.status is Status.WARN, out.summary
    assert not [f for f in out.findings if f.severity == "error"]
    assert any("MATH float32/d256" in line for line in out.details["forced_failures"])


def test_default_path_error_is_classified_not_called_no_kernel(monkeypatch):
    # Audit D14: a cuDNN graph error on the default path is not "SDPA has no kernel".
    def scaled_dot_product_attention(q, k, v, **kwargs):
        if _forced() is None and q.shape[-1] == 128:
            raise RuntimeError(CUDNN_PLAN_ERROR.split(": ", 1)[1])
        return _real_sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)
    monkeypatch.setattr(sdpa, "CASES", sdpa.CASES[:2])
    out = sdpa.run(ProbeContext(torch=torch, device="cpu"))
    assert out.status is Status.FAIL
    assert not any(f.kb_id == "sdpa-no-kernel" for f in out.findings)
    assert [e["case"] for e in out.details["default_errors"]] == ["float16/d128", "bfloat16/d128", "float32/d128"]
    assert "No execution plans support the graph" in out.details["default_errors"][0]["text"]
    assert att.classify_kernel_error(CUDNN_PLAN_ERROR) is None


def test_fp32_reference_does_not_follow_a_tf32_override(monkeypatch):
    # Audit D18: with NVIDIA_TF32_OVERRIDE=1 an fp32 matmul rounds its inputs to TF32 (10
    # mantissa bits). Simulated at torch's fp32 matmul; the kernel under test is not affected.
    real = torch.Tensor.__matmul__

    def tf32(x):
        return (x.view(torch.int32) & ~0x1FFF).view(torch.float32) if x.dtype == torch.float32 else x

    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: real(tf32(a), tf32(b)))
    case = sdpa.CASES[0]
    base = sdpa._inputs(torch, case, "cpu", seed=5)
    ref = sdpa._reference(torch, case, base, torch.float32)
    cell = sdpa.run_cell(torch, SDPBackend.MATH, case, base, torch.float32, ref)
    assert cell["status"] == "ok", cell
    assert ref[0].dtype == torch.float64


def test_free_survives_a_poisoned_context():
    # Audit D1: after a sticky error cudaFree, so empty_cache(), raises it again.
    import cudasim

    with cudasim.simulated() as (sim_torch, state):
        state.poison()
        got = att.free(sim_torch, "cuda:0")
        assert got.startswith(f"{cudasim.ERROR_NAME}: CUDA error: misaligned address")
        state.log.clear()
        assert att.free(sim_torch, "cuda:0", poisoned="known") is None
        assert state.log == []  # not even tried


def test_without_sdpa_kernel_the_legacy_flags_force_one_backend(monkeypatch):
    # torch.nn.attention.sdpa_kernel is 2.3+; before it, torch.backends.cuda.sdp_kernel set the
    # global flags itself (torch 2.2's signature, below). Today's sdp_kernel wraps sdpa_kernel, so
    # the old one is stood in for.
    import contextlib

    import torch.nn.attention as attention

    cuda = torch.backends.cuda
    names = {"enable_flash": "flash", "enable_math": "math", "enable_mem_efficient": "mem_efficient"}

    @contextlib.contextmanager
    def sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True):
        wanted = {"enable_flash": enable_flash, "enable_math": enable_math,
                  "enable_mem_efficient": enable_mem_efficient}
        before = {k: getattr(cuda, f"{v}_sdp_enabled")() for k, v in names.items()}
        for k, v in names.items():
            getattr(cuda, f"enable_{v}_sdp")(wanted[k])
        try:
            yield
        finally:
            for k, v in names.items():
                getattr(cuda, f"enable_{v}_sdp")(before[k])

    monkeypatch.delattr(attention, "sdpa_kernel")
    monkeypatch.setattr(cuda, "sdp_kernel", sdp_kernel)
    force, name = sdpa.backend_forcer(torch)
    assert name.startswith("torch.backends.cuda.sdp_kernel")
    case = sdpa.Case("bad-dims")
    base = sdpa._inputs(torch, case, "cpu", seed=2)
    base["v"] = base["v"][..., :32].contiguous()  # flash refuses, math computes
    cell = sdpa.run_cell(torch, SDPBackend.FLASH_ATTENTION, case, base, torch.float32, (), force=force)
    assert cell["status"] == "refused", cell
    with force(SDPBackend.MATH):
        assert cuda.math_sdp_enabled() and not cuda.flash_sdp_enabled()
    assert cuda.flash_sdp_enabled()  # restored


def test_forced_tally_reads_as_a_sentence():
    from gpudoctor.probes._attention import forced_sentence
    from gpudoctor.probes.base import counted

    assert forced_sentence(39, 45, 0, 0) == ("39 of 84 runs match the reference, 45 are declined as unsupported "
                                             "for their input, no wrong results, no errors")
    assert forced_sentence(1, 1, 1, 1) == ("1 of 4 runs matches the reference, 1 is declined as unsupported for "
                                           "its input, 1 wrong result, 1 error")
    assert forced_sentence(2, 0, 0, 3) == "2 of 5 runs match the reference, no wrong results, 3 errors"
    assert (counted(0, "shared library", "shared libraries"), counted(1, "run"), counted(2, "run")) == \
        ("no shared libraries", "1 run", "2 runs")
