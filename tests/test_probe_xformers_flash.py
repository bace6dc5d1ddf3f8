"""Tests of the xformers and flash-attn probes. Neither package is installed here, so: the skip
path for real; the classifiers on real texts from their trackers; and the workloads for real
against fake modules that wrap torch SDPA (so the layout handling and comparisons really run)."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from gpudoctor.probes import flash_attn_kernels as fak
from gpudoctor.probes import xformers_kernels as xk
from gpudoctor.probes.base import ProbeContext, Status

CPU = ProbeContext(torch=torch, device="cpu")

# facebookresearch/xformers import warning, as users paste it (a ROCm torch and a CPU torch).
XF_MISMATCH = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
               "    PyTorch 2.1.0+cu121 with CUDA 1201 (you have 2.2.0+cpu)\n"
               "    Python  3.8.18 (you have 3.8.10)\n"
               "  Please reinstall xformers (see https://github.com/facebookresearch/xformers#installing-xformers)\n"
               "  Memory-efficient attention, SwiGLU, sparse and more won't be available.\n"
               "  Set XFORMERS_MORE_DETAILS=1 for more details")
XF_INVALID = ("CUDA error (C:/a/xformers/xformers/third_party/flash-attention/hopper\\"
              "flash_fwd_launch_template.h:188): invalid argument")
XF_TOO_NEW = ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
              "     query       : shape=(1, 4096, 8, 40) (torch.float16)\n"
              "`cutlassF-pt` is not supported because:\n"
              "    requires device with capability <= (9, 0) but your GPU has capability (12, 0) (too new)")
XF_TOO_OLD = ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
              "`fa2F@2.5.7-pt` is not supported because:\n"
              "    requires device with capability >= (8, 0) but your GPU has capability (7, 5) (too old)")
# A forced op on sm_120, as xformers 0.0.35 raises it (fmha/__init__.py through
# dispatch._ensure_op_supports_or_raise; cutlass.FwOp.CUDA_MAXIMUM_COMPUTE_CAPABILITY = (9, 0)).
XF_FORCED_TOO_NEW = ("ValueError: Operator `memory_efficient_attention` does not support inputs:\n"
                     "     query       : shape=(2, 128, 4, 64) (torch.float16)\n"
                     "     key         : shape=(2, 128, 4, 64) (torch.float16)\n"
                     "     value       : shape=(2, 128, 4, 64) (torch.float16)\n"
                     "     attn_bias   : <class 'NoneType'>\n"
                     "     p           : 0.0\n"
                     "`cutlassF-pt` is not supported because:\n"
                     "    requires device with capability <= (9, 0) but your GPU has capability (12, 0) (too new)")
# xformers 0.0.35 fmha/flash.py with a flash_attn outside its range: `import xformers.ops` fails.
XF_FLASH_RANGE = "Requires Flash-Attention version >=2.7.1,<=2.8.4 but got 2.8.5."
FA_AMPERE = "RuntimeError: FlashAttention only supports Ampere GPUs or newer."
FA_DTYPE = "RuntimeError: FlashAttention only support fp16 and bf16 data type"
FA_SYMBOL = ("ImportError: /opt/lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: "
             "undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")


# ---------------------------------------------------------------- classifiers on real texts

@pytest.mark.parametrize("text, kb_id", [
    (XF_MISMATCH, "xformers-build-mismatch"),
    ("RuntimeError: CUDA error: invalid argument", "xformers-flash-invalid-argument"),
    (XF_INVALID, "xformers-flash-invalid-argument"),
    (XF_TOO_NEW, "xformers-flash-invalid-argument"),
    ("`cutlassF` is not supported because:\n    operator wasn't built - see `python -m xformers.info`",
     "xformers-build-mismatch"),
    ("RuntimeError: CUDA error: misaligned address", "misaligned-address"),
])
def test_xformers_classify(text, kb_id):
    assert xk.classify(text) == kb_id


def test_xformers_build_parse_and_refusals():
    assert xk.parse_build_mismatch(XF_MISMATCH) == {
        "built_for_torch": "2.1.0+cu121", "built_for_cuda": "1201", "installed_torch": "2.2.0+cpu"}
    assert xk.parse_build_mismatch("PyTorch 1.13.1+rocm5.2 with CUDA None") is None
    assert xk.parse_build_mismatch(
        "xFormers was built for:PyTorch 1.13.1+rocm5.2 with CUDA None (you have 1.13.1+rocm5.2)"
    )["built_for_cuda"] == "None"
    # Capability refusals decline the inputs before any kernel runs: refused, not failed (D6).
    assert xk.is_refusal(XF_TOO_OLD) and xk.is_refusal(XF_TOO_NEW) and xk.is_refusal(XF_FORCED_TOO_NEW)
    assert not xk.is_refusal("RuntimeError: CUDA error: invalid argument")


@pytest.mark.parametrize("text", [FA_AMPERE, FA_DTYPE, FA_SYMBOL,
                                  "RuntimeError: FlashAttention forward only supports head dimension at most 256"])
def test_flash_classify(text):
    assert fak.classify(text) == "flash-attn-unsupported"


# ---------------------------------------------------------------- skip paths (real: absent here)

@pytest.mark.skipif("xformers" in sys.modules or __import__("importlib").util.find_spec("xformers"),
                    reason="xformers is installed")
def test_xformers_absent_skips():
    out = xk.run(CPU)
    assert out.status is Status.SKIPPED and "not installed" in out.summary


@pytest.mark.skipif(__import__("importlib").util.find_spec("flash_attn") is not None,
                    reason="flash_attn is installed")
def test_flash_absent_skips():
    out = fak.run(CPU)
    assert out.status is Status.SKIPPED and "not installed" in out.summary


# ---------------------------------------------------------------- fake xformers wrapping SDPA

def _fake_xformers(broken_flash: str | None = None, wrong: bool = False, refuse_cutlass: str | None = None,
                   dispatcher: str | None = None, dispatch_fail: str | None = None) -> dict[str, types.ModuleType]:
    """A fake xformers over torch SDPA. `dispatcher` names the op that op=None picks (None: a
    working one); `dispatch_fail` is what op=None raises instead."""
    class LowerTriangularMask:
        pass

    def memory_efficient_attention(q, k, v, attn_bias=None, p=0.0, scale=None, *, op=None):
        fw = op[0] if isinstance(op, tuple) else op
        if fw is None and dispatch_fail:
            raise NotImplementedError(dispatch_fail)
        if fw is None and dispatcher:
            fw = {"flash": flash.FwOp, "cutlass": cutlass.FwOp}[dispatcher]
        if getattr(fw, "refuse", None):
            raise ValueError(fw.refuse)
        if getattr(fw, "fail", None):
            raise RuntimeError(fw.fail)
        # xformers layout (B, M, H, K) -> SDPA layout (B, H, M, K) and back.
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=isinstance(attn_bias, LowerTriangularMask))
        out = out.transpose(1, 2)
        return out * 1.1 if wrong else out

    def op(name, fail=None, refuse=None):
        return type(name, (), {"NAME": name, "fail": fail, "refuse": refuse,
                               "is_available": classmethod(lambda cls: True)})

    cutlass = types.ModuleType("xformers.ops.fmha.cutlass")
    cutlass.FwOp, cutlass.BwOp = op("cutlassF-pt", refuse=refuse_cutlass), op("cutlassB-pt")
    flash = types.ModuleType("xformers.ops.fmha.flash")
    flash.FwOp, flash.BwOp = op("fa2F@2.5.7-pt", broken_flash), op("fa2B@2.5.7-pt")
    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.cutlass, fmha.flash = cutlass, flash
    ops = types.ModuleType("xformers.ops")
    ops.fmha, ops.memory_efficient_attention, ops.LowerTriangularMask = fmha, memory_efficient_attention, LowerTriangularMask
    root = types.ModuleType("xformers")
    root.__version__, root.ops = "0.0.32.post2", ops
    return {"xformers": root, "xformers.ops": ops, "xformers.ops.fmha": fmha,
            "xformers.ops.fmha.cutlass": cutlass, "xformers.ops.fmha.flash": flash}


def test_xformers_workload_against_sdpa(monkeypatch):
    for name, mod in _fake_xformers().items():
        monkeypatch.setitem(sys.modules, name, mod)
    out = xk.run(CPU)
    assert out.status is Status.PASS, out.summary
    assert [o["name"] for o in out.details["operators"]] == ["fa2F@2.5.7-pt", "cutlassF-pt"]
    row = out.details["matrix"]["cutlassF-pt"]
    assert set(row) == {"float32/K=64", "float32/K=64/causal", "float32/K=128", "float32/K=128/causal"}
    assert all(v.startswith("ok(") for v in row.values())


def test_xformers_wrong_numbers_are_caught(monkeypatch):
    for name, mod in _fake_xformers(wrong=True).items():
        monkeypatch.setitem(sys.modules, name, mod)
    out = xk.run(CPU)
    assert out.status is Status.FAIL and out.details["counts"]["mismatch"] == 8


def test_xformers_invalid_argument_maps_to_seed_001_fix(monkeypatch):
    # xformers 0.0.30-0.0.32 on a Blackwell GPU: the dispatcher itself picks the failing flash op.
    for name, mod in _fake_xformers(broken_flash="CUDA error: invalid argument", dispatcher="flash").items():
        monkeypatch.setitem(sys.modules, name, mod)
    out = xk.run(CPU)
    assert out.status is Status.FAIL
    found = [f for f in out.findings if f.kb_id == "xformers-flash-invalid-argument"]
    assert found[0].summary.startswith("xformers dispatcher (op=None) failed") and found[0].severity == "error"
    assert any("fa2F@2.5.7-pt" in f.summary for f in found)
    assert "AttnProcessor2_0" in out.details["fix"]
    assert all(v.startswith("ok(") for v in out.details["matrix"]["cutlassF-pt"].values())


def test_forced_failure_the_dispatcher_avoids_is_a_warning(monkeypatch):
    for name, mod in _fake_xformers(broken_flash="CUDA error: invalid argument").items():
        monkeypatch.setitem(sys.modules, name, mod)
    out = xk.run(CPU)
    assert out.status is Status.WARN, out.summary
    assert [f.severity for f in out.findings] == ["warning"] * len(out.findings) and out.findings


def test_too_new_refusal_of_a_forced_op_is_refused_not_failed(monkeypatch):
    # Audit D6: on sm_120 xformers 0.0.35 refuses cutlassF "(too new)" when forced, while its
    # dispatcher serves the GPU with fa2: a working install, no finding.
    import cudasim

    for name, mod in _fake_xformers(refuse_cutlass=XF_FORCED_TOO_NEW.split(": ", 1)[1]).items():
        monkeypatch.setitem(sys.modules, name, mod)
    with cudasim.simulated(capability=(12, 0), name="NVIDIA GeForce RTX 5090") as (sim_torch, _):
        out = xk.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    assert out.status is Status.PASS, out.summary
    assert out.findings == []
    assert all(v.startswith("refused(forward: ValueError: Operator `memory_efficient_attention`")
               for v in out.details["matrix"]["cutlassF-pt"].values())
    assert all(v.startswith("ok(") for v in out.details["matrix"]["fa2F@2.5.7-pt"].values())
    assert set(out.details["default_dispatch"]) == {"float16/K=64", "bfloat16/K=64"}


def test_dispatcher_with_no_operator_for_the_gpu_fails(monkeypatch):
    # What user code meets on sm_120 when every operator is refused: the finding's fix applies.
    import cudasim

    for name, mod in _fake_xformers(dispatch_fail=XF_TOO_NEW.split(": ", 1)[1]).items():
        monkeypatch.setitem(sys.modules, name, mod)
    with cudasim.simulated(capability=(12, 0)) as (sim_torch, _):
        out = xk.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    assert out.status is Status.FAIL
    found = {f.kb_id for f in out.findings if f.severity == "error"}
    assert found == {"xformers-flash-invalid-argument"}
    assert "AttnProcessor2_0" in out.details["fix"]


def test_flash_attn_outside_xformers_range_is_not_a_build_mismatch(tmp_path, monkeypatch):
    pkg = tmp_path / "xformers"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.35'\n")
    (pkg / "ops" / "__init__.py").write_text(f"raise ImportError({XF_FLASH_RANGE!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("xformers")]:
        monkeypatch.delitem(sys.modules, name)
    out = xk.run(CPU)
    assert out.status is Status.FAIL
    assert not any(f.kb_id == "xformers-build-mismatch" for f in out.findings)
    assert out.details["flash_attn_range"] == {"required": ">=2.7.1,<=2.8.4", "found": "2.8.5"}
    assert "install a flash-attn in xformers' range (>=2.7.1,<=2.8.4)" in out.summary


def test_build_mismatch_is_never_a_silent_skip(tmp_path, monkeypatch):
    # The extensions did not load: every operator "wasn't built", so nothing runs on any device;
    # the warning is still the finding, with its fix.
    refusal = "`cutlassF-pt` is not supported because:\n    operator wasn't built - see `python -m xformers.info` for more info"
    for name, mod in _fake_xformers(dispatch_fail="No operator found for `memory_efficient_attention_forward` "
                                    "with inputs:\n" + refusal).items():
        monkeypatch.setitem(sys.modules, name, mod)
    for module in ("xformers.ops.fmha.cutlass", "xformers.ops.fmha.flash"):
        sys.modules[module].FwOp.refuse = refusal
    monkeypatch.setattr(xk, "_import_xformers", lambda: (sys.modules["xformers"], sys.modules["xformers.ops"],
                                                          [XF_MISMATCH], ""))
    out = xk.run(CPU)
    assert out.status is Status.FAIL, out.summary
    (finding,) = [f for f in out.findings if f.kb_id == "xformers-build-mismatch"]
    assert any(e.startswith("fix: reinstall xformers built for this torch") for e in finding.evidence)
    assert finding.steps == xk.build_mismatch_steps(str(torch.__version__), out.details["build"])


def test_build_mismatch_steps_keep_the_users_torch():
    # Seen on an H100 with torch 2.11.0+cu130 and the PyPI xformers 0.0.35 (built for 2.10.0+cu128):
    # the fix is the xformers for this torch from its own CUDA index, never another torch.
    build = {"built_for_torch": "2.10.0+cu128", "built_for_cuda": "1208", "installed_torch": "2.11.0+cu130"}
    first, second = xk.build_mismatch_steps("2.11.0+cu130", build)
    assert "`pip install -U xformers --index-url https://download.pytorch.org/whl/cu130`" in first
    assert "built for torch 2.10.0+cu128" in first and "torch==2.11.0" in first
    assert "torch==2.8" not in first + second and "uninstall xformers" in second
    (first, _) = xk.build_mismatch_steps("2.11.0", None)
    assert "--index-url" not in first and "keeps this torch" in first


def test_xformers_import_warning_is_a_build_mismatch(tmp_path, monkeypatch):
    pkg = tmp_path / "xformers"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import logging\n__version__ = '0.0.23'\n"
        f"logging.getLogger('xformers').warning({XF_MISMATCH!r})\n")
    (pkg / "ops" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("xformers")]:
        monkeypatch.delitem(sys.modules, name)
    out = xk.run(CPU)
    found = [f for f in out.findings if f.kb_id == "xformers-build-mismatch"]
    assert found and "built for torch 2.1.0+cu121 with CUDA 1201; installed torch 2.2.0+cpu" in found[0].evidence
    assert out.details["build"]["built_for_torch"] == "2.1.0+cu121"
    assert out.status is Status.FAIL


# ---------------------------------------------------------------- fake flash_attn wrapping SDPA

def _fake_flash(fail: str | None = None) -> types.ModuleType:
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        if fail:
            raise RuntimeError(fail)
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        # flash_attn reads (batch, seqlen, heads, dim) whatever the caller meant.
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal)
        return out.transpose(1, 2)

    mod = types.ModuleType("flash_attn")
    mod.__version__, mod.flash_attn_func = "2.8.3", flash_attn_func
    return mod


def test_flash_workload_and_layout_pitfall(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash())
    out = fak.run(CPU)
    assert out.status is Status.PASS, out.summary
    m = out.details["matrix"]
    assert m["float16/d128/causal"].startswith("ok(") and m["bfloat16/d256"].startswith("ok(")
    assert m["float32/d64"].startswith("refused(") and "fp16 and bf16" in m["float32/d64"]
    assert out.details["counts"] == {"ok": 12, "refused": 6, "mismatch": 0, "error": 0}
    pit = out.details["layout_pitfall"]
    assert pit["same_shape"] and pit["silently_wrong"] and pit["transpose_fixes_it"]
    assert pit["wrong_layout_err"] > 0.1 and pit["transposed_err"] < 1e-2
    assert "silently wrong" in out.summary


def test_flash_old_gpu_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash(fail="FlashAttention only supports Ampere GPUs or newer."))
    out = fak.run(CPU)
    assert out.status is Status.FAIL
    assert [f.kb_id for f in out.findings] == ["flash-attn-unsupported"]
    assert "Ampere" in out.findings[0].evidence[0]


def test_flash_abi_import_error(tmp_path, monkeypatch):
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"raise ImportError({FA_SYMBOL.split(': ', 1)[1]!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    out = fak.run(CPU)
    assert out.status is Status.FAIL and out.findings[0].kb_id == "flash-attn-unsupported"
    assert "undefined symbol" in out.findings[0].evidence[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_real_packages_do_not_crash():
    # The audit's verdicts on a healthy H100: skipped without the packages; with xformers 0.0.35
    # and flash-attn 2.8.3 built for this torch, pass (fa3F and cutlassF-blackwell refused). An
    # xformers built for another torch (the PyPI 0.0.35 wheel is built for 2.10.0+cu128: seen on
    # an H100 with torch 2.11.0+cu130) is a FAIL with one build-mismatch finding and its fix.
    for probe in (xk, fak):
        out = probe.run(ProbeContext(torch=torch, device="cuda:0"))
        build = out.details.get("build") if probe is xk else None
        if build and build["built_for_torch"] != str(torch.__version__):
            assert out.status is Status.FAIL, out.summary
            (finding,) = out.findings
            assert finding.kb_id == "xformers-build-mismatch" and finding.steps
            continue
        assert out.status in (Status.PASS, Status.SKIPPED), (probe.SPEC.id, out.summary)
        assert all(f.severity != "error" for f in out.findings)


def test_flash_sticky_fault_keeps_the_matrix(monkeypatch):
    # An asynchronous misaligned-address fault in bf16/d128: it surfaces at the synchronize, the
    # rest is "not run", empty_cache is not called on the poisoned context (audit D1).
    import cudasim

    with cudasim.simulated() as (sim_torch, state):
        inner = _fake_flash()

        def flash_attn_func(q, k, v, causal=False, **kwargs):
            out = inner.flash_attn_func(q, k, v, causal=causal, **kwargs)
            if q.dtype == torch.bfloat16 and q.shape[-1] == 128:
                state.poison()
            return out

        fake = types.ModuleType("flash_attn")
        fake.__version__, fake.flash_attn_func = "2.8.3", flash_attn_func
        monkeypatch.setitem(sys.modules, "flash_attn", fake)
        out = fak.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    m = out.details["matrix"]
    assert m["bfloat16/d128"].startswith(f"error(synchronize: {cudasim.ERROR_NAME}: CUDA error: misaligned address")
    assert m["float32/d64"].startswith("not-run(CUDA context poisoned by bfloat16/d128")
    assert m["float16/d256/causal"].startswith("ok(")
    assert out.status is Status.FAIL
    assert [f.kb_id for f in out.findings] == ["misaligned-address"]
    assert ("empty_cache", None) not in state.log
