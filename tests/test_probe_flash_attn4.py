"""FlashAttention-4 (`flash-attn-4`, imported as `flash_attn.cute`) in the flash-attn probe.

Neither flash-attn package is installed here, so FA4 is faked as the FA2 tests fake FA2: a module
whose `flash_attn_func` computes attention with torch's CPU SDPA (numbers are real), returning
`(out, lse)` as flash_attn/cute/interface.py's FlashAttnFunc does. FA4 runs on CUDA only, so its
cells run on the simulated CUDA device of tests/cudasim.py; its first call per configuration is
"compiled" on a clock the test owns, never a sleep, so the compile-time split is checked exactly.
"""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

import cudasim
from gpudoctor.probes import flash_attn_kernels as fak
from gpudoctor.probes.base import ProbeContext, Status

# These tests take about 100 s in all on 2 cores.
pytestmark = pytest.mark.slow

CPU = ProbeContext(torch=torch, device="cpu")

# FA4's own texts, as flash_attn/cute/interface.py (fa4-v4.0.0.beta27, 2026-08-15) builds them.
FA4_DTYPE = "AssertionError: inputs must be float16, bfloat16, fp8 e4m3fn, or fp8 e5m2"
FA4_HDIM_SM100 = ("AssertionError: (head_dim, head_dim_v)=(512, 512) is not supported on SM100/SM110. "
                  "head_dim and head_dim_v must be between 8 and 128 and divisible by 8, or (192, 128) "
                  "for DeepSeek, or (256, 256) for hd256.")
FA4_ARCH = "AssertionError: Unsupported compute capability. Supported: 8.x, 9.x, 10.x, 11.x, 12.x"
COMPILE_S, KERNEL_S = 2.5, 0.0005


class Clock:
    """A clock only the fake kernels move: a first call of a configuration costs COMPILE_S
    (FA4's JIT), every call KERNEL_S."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fake_fa4(clock: Clock, *, refuse_head_dim: int | None = None, wrong: bool = False,
              returns_tuple: bool = True, arch_text: str | None = None) -> types.ModuleType:
    compiled: set[tuple] = set()

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, **kwargs):
        if arch_text:
            raise AssertionError(arch_text.split(": ", 1)[1])
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise AssertionError(FA4_DTYPE.split(": ", 1)[1])
        d = q.shape[-1]
        if refuse_head_dim is not None and d == refuse_head_dim:
            raise AssertionError(f"(head_dim, head_dim_v)=({d}, {d}) is not supported on SM100/SM110. "
                                 "head_dim and head_dim_v must be between 8 and 128 and divisible by 8, "
                                 "or (192, 128) for DeepSeek, or (256, 256) for hd256.")
        key = (q.dtype, d, causal)
        if key not in compiled:
            compiled.add(key)
            clock.now += COMPILE_S
        clock.now += KERNEL_S
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal).transpose(1, 2)
        if wrong:
            out = out * 1.5  # a kernel that scales wrongly: shape and dtype right, numbers wrong
        lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return (out, lse) if returns_tuple else out

    cute = types.ModuleType("flash_attn.cute")
    cute.__version__ = "0.0.0"  # what flash_attn/cute/__init__.py reads from the metadata of "fa4"
    cute.flash_attn_func = flash_attn_func
    return cute


def _fake_fa2() -> types.ModuleType:
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal).transpose(1, 2)

    mod = types.ModuleType("flash_attn")
    mod.__version__, mod.flash_attn_func = "2.8.3", flash_attn_func
    return mod


@pytest.fixture(autouse=True)
def _forget_flash_attn():
    """What a test imported under the name flash_attn (a namespace package from tmp_path) must not
    outlive it: the FA2 tests' "not installed" path imports the name again."""
    before = {name: sys.modules[name] for name in ("flash_attn", "flash_attn.cute") if name in sys.modules}
    yield
    for name in ("flash_attn", "flash_attn.cute"):
        sys.modules.pop(name, None)
    sys.modules.update(before)


def _install(monkeypatch, cute: types.ModuleType | None, fa2: bool = False) -> None:
    # flash-attn-4 alone: `flash_attn` is a namespace package (no __init__.py, no flash_attn_func).
    parent = _fake_fa2() if fa2 else types.ModuleType("flash_attn")
    if not fa2:
        parent.__path__ = []
    if cute is not None:
        parent.cute = cute
        monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    else:
        monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.setitem(sys.modules, "flash_attn", parent)


def _run_cuda(monkeypatch, clock: Clock) -> object:
    monkeypatch.setattr(fak, "_clock", clock)
    with cudasim.simulated() as (sim_torch, _state):
        return fak.run(ProbeContext(torch=sim_torch, device="cuda:0"))


# ---------------------------------------------------------------- FA4 alone

def test_fa4_alone_runs_forward_and_backward_and_splits_compile_from_kernel_time(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock))
    out = _run_cuda(monkeypatch, clock)
    assert out.status is Status.PASS, out.summary
    fa4 = out.details["fa4"]
    assert fa4["counts"] == {"ok": 12, "refused": 6, "mismatch": 0, "error": 0, "not_run": 0}
    assert fa4["matrix"]["bfloat16/d256/causal"].startswith("ok(fwd ")
    assert "bwd " in fa4["matrix"]["float16/d64"]  # the output had a graph: backward was checked
    assert fa4["matrix"]["float32/d128"].startswith("refused(forward: AssertionError: inputs must be float16")
    assert fa4["returns"] == "tuple of 2" and fa4["backward"] is True
    # Twelve first calls, each one compile plus one kernel; the second call is the kernel alone.
    assert fa4["first_call_s"]["float16/d128"] == pytest.approx(COMPILE_S + KERNEL_S)
    assert len(fa4["kernel_ms"]) == 12
    assert all(ms == pytest.approx(KERNEL_S * 1e3) for ms in fa4["kernel_ms"].values())
    assert fa4["compile_s"] == pytest.approx(12 * COMPILE_S, abs=1e-3)
    # flash_attn.cute says 0.0.0 (it asks the metadata of "fa4", no distribution's name); without
    # flash-attn-4's metadata (none here) the version is unknown rather than that.
    assert fa4["version"] == "unknown"
    # FA2's keys are absent, not faked: FA2 is simply not installed.
    assert "matrix" not in out.details and "not installed" in out.details["fa2"]
    assert out.summary.startswith("FA4 ") and "12 ok" in out.summary and "compile 30.0 s" in out.summary


def test_fa4_alone_on_the_cpu_is_skipped_with_its_reason(monkeypatch):
    _install(monkeypatch, _fake_fa4(Clock()))
    out = fak.run(CPU)
    assert out.status is Status.SKIPPED
    assert "CUDA only" in out.details["fa4"]["skipped"] and "CUDA only" in out.summary


def test_fa4_returning_a_bare_tensor_is_read_too(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock, returns_tuple=False))
    out = _run_cuda(monkeypatch, clock)
    assert out.status is Status.PASS and out.details["fa4"]["returns"] == "tensor"


# ---------------------------------------------------------------- FA2 and FA4 together

def test_fa2_and_fa4_both_run_and_fa2_keys_stay_where_they_were(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock), fa2=True)
    out = _run_cuda(monkeypatch, clock)
    assert out.status is Status.PASS, out.summary
    assert out.details["counts"] == {"ok": 12, "refused": 6, "mismatch": 0, "error": 0}  # FA2, top level
    assert out.details["layout_pitfall"]["silently_wrong"]
    assert out.details["fa4"]["counts"]["ok"] == 12
    assert out.summary.startswith("flash_attn 2.8.3: 12 ok") and "; FA4 " in out.summary


def test_fa2_and_fa4_on_the_cpu_run_fa2_and_skip_fa4(monkeypatch):
    _install(monkeypatch, _fake_fa4(Clock()), fa2=True)
    out = fak.run(CPU)
    assert out.status is Status.PASS and out.details["counts"]["ok"] == 12
    assert "CUDA only" in out.details["fa4"]["skipped"]


def test_fa2_without_fa4_says_fa4_is_not_installed(monkeypatch):
    _install(monkeypatch, None, fa2=True)
    out = fak.run(CPU)
    assert out.status is Status.PASS
    assert out.details["fa4"] == {"skipped": "flash_attn.cute (flash-attn-4) is not installed"}


# ---------------------------------------------------------------- FA4's failures

def test_fa4_import_failure_without_the_cute_dsl_is_a_finding(tmp_path, monkeypatch):
    # A real package on disk, as flash-attn-4 lays it out (flash_attn/cute/, no flash_attn/__init__.py),
    # whose import fails the way it does when nvidia-cutlass-dsl's packages are not on sys.path.
    cute = tmp_path / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'cutlass'\", name='cutlass')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    out = fak.run(CPU)
    assert out.status is Status.FAIL, out.summary
    (finding,) = out.findings
    assert finding.kb_id == "flash-attn-unsupported" and "No module named 'cutlass'" in finding.evidence[0]
    assert "FA4: importing flash_attn.cute failed" in out.summary
    assert out.details["fa4"]["error"] == "ModuleNotFoundError: No module named 'cutlass'"


def test_fa4_refusing_a_head_dim_is_declined_not_broken(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock, refuse_head_dim=256))
    out = _run_cuda(monkeypatch, clock)
    fa4 = out.details["fa4"]
    assert fa4["matrix"]["float16/d256"].startswith("refused(forward: AssertionError: (head_dim, head_dim_v)=(256, 256)")
    assert fa4["counts"] == {"ok": 8, "refused": 10, "mismatch": 0, "error": 0, "not_run": 0}
    assert out.status is Status.WARN, out.summary
    (finding,) = out.findings
    assert finding.kb_id == "flash-attn-unsupported" and finding.severity == "warning"
    assert "not supported on SM100/SM110" in finding.evidence[0]
    assert "4 declined (head dim or GPU)" in out.summary


def test_fa4_refusing_the_gpu_is_declined_everywhere(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock, arch_text=FA4_ARCH))
    out = _run_cuda(monkeypatch, clock)
    assert out.status is Status.WARN and out.details["fa4"]["counts"]["refused"] == 18
    assert [f.kb_id for f in out.findings] == ["flash-attn-unsupported"]


def test_fa4_wrong_numbers_are_caught(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock, wrong=True))
    out = _run_cuda(monkeypatch, clock)
    assert out.status is Status.FAIL
    fa4 = out.details["fa4"]
    assert fa4["counts"]["mismatch"] == 12 and fa4["counts"]["ok"] == 0
    assert fa4["matrix"]["float16/d64"].startswith("mismatch(fwd ")
    assert "12 mismatched" in out.summary


def test_fa4_budget_leaves_later_cells_not_run(monkeypatch):
    clock = Clock()
    _install(monkeypatch, _fake_fa4(clock))
    monkeypatch.setattr(fak, "FA4_BUDGET_S", 3 * COMPILE_S + 0.1)  # spent during the 4th cell
    out = _run_cuda(monkeypatch, clock)
    fa4 = out.details["fa4"]
    assert fa4["counts"]["ok"] == 4 and fa4["counts"]["not_run"] == 14
    assert fa4["matrix"]["float32/d256/causal"].startswith("not-run(FA4 time budget")
    assert out.status is Status.WARN and "14 not run" in out.summary


# ---------------------------------------------------------------- classify on FA4's texts

@pytest.mark.parametrize("text", [
    FA4_DTYPE, FA4_HDIM_SM100, FA4_ARCH,
    "AssertionError: Unsupported compute capability. Supported: 9.x, 10.x",
    "AssertionError: Only SM 10.x and 11.x are supported",
    "ModuleNotFoundError: No module named 'cutlass'",
    "ModuleNotFoundError: No module named 'cutlass.cute'",
    "ModuleNotFoundError: No module named 'tvm_ffi'",
    "RuntimeError: No CTK flavor installed: expected one or more of /x/_cutlass_ir.cu{N}.cpython-...so .",
])
def test_fa4_texts_classify(text):
    assert fak.classify(text) == "flash-attn-unsupported"


def test_unrelated_texts_do_not_classify_as_flash_attn():
    assert fak.classify("ModuleNotFoundError: No module named 'einops'") is None
    assert fak.classify("AssertionError: shapes differ") is None


# ---------------------------------------------------------------- the knowledge base on FA4's texts

_FA4_IMPORT_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/venv/lib/python3.12/site-packages/flash_attn/cute/interface.py", line 17, in <module>\n'
    "    import cutlass.cute as cute\n"
    "ModuleNotFoundError: No module named 'cutlass.cute'\n")


@pytest.mark.parametrize("text", [
    FA4_HDIM_SM100, FA4_ARCH, FA4_DTYPE, _FA4_IMPORT_TRACE,
    "RuntimeError: None of the installed toolkit flavors (cu13) are compatible with the CUDA driver "
    "(driver supports up to CUDA 12.8). Install a compatible flavor (e.g. `pip install nvidia-cutlass-dsl` "
    "for cu12) or update the driver.",
])
def test_explain_names_fa4_failures(text):
    from gpudoctor.explain.matcher import match_text

    matches = match_text(text)
    assert matches and matches[0].id == "flash-attn-unsupported", [(m.id, m.confidence) for m in matches[:3]]


def test_a_missing_cutlass_outside_flash_attn_is_not_called_flash_attn():
    # CUTLASS's Python DSL has users besides FA4: without a flash_attn frame the text is not FA4's.
    from gpudoctor.explain.matcher import match_text

    text = ('  File "/venv/lib/python3.12/site-packages/mykernels/gemm.py", line 3, in <module>\n'
            "    import cutlass.cute as cute\nModuleNotFoundError: No module named 'cutlass.cute'\n")
    assert all(m.id != "flash-attn-unsupported" for m in match_text(text))
