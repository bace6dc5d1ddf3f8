"""Probe `flash-attn`: do Dao-AILab's kernels import against this torch, and does each one's
`flash_attn_func` compute what attention computes, in their (batch, seqlen, heads, dim) layout?

Two generations are recognised, either or both installed:

- FlashAttention-2, the `flash-attn` package: `flash_attn.flash_attn_func`, a compiled extension.
  Its cells are the top-level details (`matrix`, `counts`, `layout_pitfall`, `version`).
- FlashAttention-4, the `flash-attn-4` package: `flash_attn.cute.flash_attn_func`, written in
  NVIDIA's CuTe DSL (`nvidia-cutlass-dsl`) and JIT-compiled at the first call of each
  configuration. It installs only `flash_attn/cute/` (no `flash_attn/__init__.py`), so alone it
  makes `flash_attn` a namespace package without `flash_attn_func`. It returns `(out, lse)`, has
  autograd (its backward compiles at the first backward), and runs on CUDA only. Its cells are
  `details["fa4"]`, with the first call's time (compile included) apart from a second call's.

It also runs the layout pitfall of seed 003 on purpose: flash_attn_func given SDPA-layout
(batch, heads, seqlen, dim) tensors raises nothing and computes attention over the wrong axis; the
mismatch it shows is the evidence that a caller must transpose.
"""
from __future__ import annotations

import importlib
import os
import time
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, error_text, skipped

SPEC = ProbeSpec(
    id="flash-attn",
    title="flash-attn (Dao-AILab) kernels and layout",
    # FA4 compiles each configuration at its first call (seconds each on an H100); FA4_BUDGET_S
    # bounds that part, the rest is FA2's matrix.
    timeout_s=300.0,
    emits=("flash-attn-unsupported", *att.KERNEL_ERROR_IDS),
    needs=("torch", "flash_attn"),
    description="Runs FlashAttention-2's and FlashAttention-4's flash_attn_func against an fp64 reference "
                "on fp16/bf16 and several head dims (FA4: compile time apart from kernel time), and shows "
                "the (B, H, N, D) layout pitfall.",
    runs_on_cpu=False,
)

HEAD_DIMS = (64, 128, 256)
BATCH, SEQ, HEADS = 2, 128, 4  # SEQ != HEADS, so the wrong layout cannot coincide with the right one

# FA4's JIT compiles take seconds per configuration; cells left when this is spent are not run.
FA4_BUDGET_S = 180.0
_clock = time.perf_counter  # the timer of FA4's calls (tests give it a clock of their own)

_UNSUPPORTED = (
    "flashattention only supports ampere gpus or newer",
    "flashattention only support fp16 and bf16 data type",
    "head dimension at most",
    "head_dim",
    "headdim",
    "flash_attn_2_cuda",
    "undefined symbol",
    "flashattention only supports",
    # FlashAttention-4 (flash_attn/cute/interface.py and its kernels' constructors)
    "unsupported compute capability. supported:",
    "only sm 10.x and 11.x are supported",
    "inputs must be float16",
    "is not supported on sm90",
    "is not supported on sm100",
    # the CuTe DSL runtime FA4 is written in (nvidia-cutlass-dsl), missing or mismatched
    "no module named 'cutlass",
    "no module named 'quack",
    "no module named 'tvm_ffi",
    "no ctk flavor installed",
    "installed toolkit flavors",
)

# FA4's own input checks (AssertionError/ValueError before any kernel is built): the documented
# contract for this GPU, dtype or head dim, so a declined cell, not a broken machine.
_FA4_REFUSALS = (
    "inputs must be float16",
    "is not supported on sm90",
    "is not supported on sm100",
    "unsupported compute capability",
    "only sm 10.x and 11.x are supported",
    "head_dim must be",
)


def classify(text: str) -> str | None:
    """The knowledge-base id for a flash_attn import or call failure, or None."""
    low = text.lower()
    if any(needle in low for needle in _UNSUPPORTED):
        return "flash-attn-unsupported"
    return att.classify_kernel_error(text)


def _expected_refusal(dtype_name: str, text: str) -> bool:
    # fp32 is outside flash_attn's contract; its refusal is the documented behaviour.
    return dtype_name == "float32" and "fp16 and bf16" in text.lower()


def _fa4_refusal(text: str) -> bool:
    low = text.lower()
    return any(needle in low for needle in _FA4_REFUSALS)


def _cells(torch: Any):
    """The matrix FA2 and FA4 both run: (key, dtype, head_dim, causal) per cell, in report order."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                yield f"{att.dtype_name(dtype)}/d{head_dim}{'/causal' if causal else ''}", dtype, head_dim, causal


def _cell_inputs(torch: Any, device: str, dtype: Any, head_dim: int, causal: bool):
    """q, k, v and the output gradient of one cell in flash_attn's (B, N, H, D) layout, seeded by
    the cell so FA2 and FA4 see the same numbers, and q, k, v as leaves that collect gradients."""
    gen = torch.Generator(device="cpu").manual_seed(head_dim * 2 + causal)
    q, k, v, grad = (torch.randn(BATCH, SEQ, HEADS, head_dim, generator=gen).to(device=device, dtype=dtype)
                     for _ in range(4))
    return q, k, v, grad, [t.clone().requires_grad_(True) for t in (q, k, v)]


def _reference(torch: Any, q: Any, k: Any, v: Any, causal: bool):
    """The fp64 reference in SDPA's (B, H, N, D) layout, and its leaves for the backward."""
    leaves = [t.detach().double().transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
    return att.reference_attention(torch, *leaves, causal=causal), leaves


def run_case(torch: Any, fa: Any, device: str, dtype: Any, head_dim: int, causal: bool) -> dict[str, Any]:
    """flash_attn_func on (B, N, H, D) against the fp32 reference in SDPA's (B, H, N, D)."""
    q, k, v, grad, leaves = _cell_inputs(torch, device, dtype, head_dim, causal)
    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"dtype": dname, "head_dim": head_dim, "causal": causal}
    return att.measure_cell(torch, device, cell, lambda: fa.flash_attn_func(*leaves, causal=causal), grad, leaves,
                            lambda: _reference(torch, q, k, v, causal), True,
                            lambda text: _expected_refusal(dname, text))


def layout_pitfall(torch: Any, fa: Any, device: str, dtype: Any) -> dict[str, Any]:
    """Seed 003: pass SDPA-layout (B, H, N, D) tensors to flash_attn_func. It accepts them (it
    reads H as the sequence and N as the heads) and returns a tensor of the right shape with the
    wrong numbers. The error against the correct result is the evidence."""
    gen = torch.Generator(device="cpu").manual_seed(3)
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, 64, generator=gen).to(device=device, dtype=dtype)
               for _ in range(3))
    right = att.reference_attention(torch, q, k, v)
    result: dict[str, Any] = {"passed_shape(B,H,N,D)": [BATCH, HEADS, SEQ, 64]}
    try:
        wrong = fa.flash_attn_func(q, k, v)
        fixed = fa.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        result.update(
            wrong_layout_err=att.max_abs_error(torch, wrong, right),
            transposed_err=att.max_abs_error(torch, fixed, right),
            same_shape=list(wrong.shape) == list(right.shape),
        )
    except Exception as exc:  # noqa: BLE001
        result.update(error=error_text(exc))
        return result
    tol = att.FWD_TOL[att.dtype_name(dtype)]
    result["silently_wrong"] = result["same_shape"] and result["wrong_layout_err"] > tol
    result["transpose_fixes_it"] = result["transposed_err"] <= tol
    return result


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _import(name: str) -> tuple[Any, str, list[str]]:
    """(module, failure text, what importing it printed or warned). A module that is simply
    not there is (None, "", ...) when `name` itself (or its parent) is what is missing; any other
    failure, a missing dependency included, is the failure text."""
    with att.capture(stderr=True) as said:
        try:
            module, failure = importlib.import_module(name), ""
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            module = None
            failure = "" if missing and (name == missing or name.startswith(missing + ".")) else error_text(exc)
        except Exception as exc:  # noqa: BLE001 - an ABI mismatch is an ImportError here
            module, failure = None, error_text(exc)
    return module, failure, [t for t in said.texts if t.strip()]


def _run(ctx: ProbeContext) -> Outcome:
    fa, fa_failure, fa_said = _import("flash_attn")
    if fa is None and not fa_failure:
        return skipped("flash_attn is not installed (neither flash-attn nor flash-attn-4)")
    # flash-attn-4 alone installs flash_attn/cute/ without flash_attn/__init__.py: then
    # `flash_attn` imports as a namespace package that has no flash_attn_func. That is "no FA2".
    has_fa2 = bool(fa_failure) or hasattr(fa, "flash_attn_func")
    fa4, fa4_failure, fa4_said = (None, "", []) if fa_failure else _import("flash_attn.cute")
    if fa4 is None and not fa4_failure and not has_fa2:
        return skipped("flash_attn has no flash_attn_func and no flash_attn.cute: neither FlashAttention-2 "
                       "nor FlashAttention-4 is installed", path=[str(p) for p in getattr(fa, "__path__", [])])

    details: dict[str, Any] = {}
    findings: list[ProbeFinding] = []
    statuses: list[Status] = []
    summaries: list[str] = []
    poisoned = ""
    if has_fa2:
        outcome = _run_fa2(ctx, fa, fa_failure, fa_said)
        details.update(outcome.details)
        findings += outcome.findings
        statuses.append(outcome.status)
        summaries.append(outcome.summary)
        poisoned = details.get("context_poisoned", "")
    else:
        details["fa2"] = "not installed: flash_attn has no flash_attn_func (flash-attn-4 alone installs flash_attn.cute)"
    if fa4 is not None or fa4_failure:
        outcome = _run_fa4(ctx, fa4, fa4_failure, fa4_said, poisoned)
        details["fa4"] = outcome.details
        findings += outcome.findings
        statuses.append(outcome.status)
        summaries.append(outcome.summary)
    elif fa_failure and _fa4_on_disk():
        details["fa4"] = {"skipped": "not run: flash_attn.cute is imported through flash_attn/__init__.py, "
                                     "which failed (above)"}
    elif has_fa2:
        details["fa4"] = {"skipped": "flash_attn.cute (flash-attn-4) is not installed"}
    status = next((s for s in (Status.FAIL, Status.WARN, Status.PASS) if s in statuses), Status.SKIPPED)
    return Outcome(status, "; ".join(summaries), details, findings)


def _fa4_on_disk() -> bool:
    import sys

    return any(os.path.isfile(os.path.join(entry or ".", "flash_attn", "cute", "__init__.py"))
               for entry in sys.path if isinstance(entry, str))


def _run_fa2(ctx: ProbeContext, fa: Any, failure: str, said: list[str]) -> Outcome:
    torch = ctx.torch
    details: dict[str, Any] = {"import_messages": said}
    if failure:
        details["error"] = failure
        kb = classify(failure) or "flash-attn-unsupported"
        return Outcome(Status.FAIL, f"importing flash_attn failed: {failure.splitlines()[0][:160]}", details,
                       [ProbeFinding(kb, "flash_attn does not import against this torch",
                                (failure, f"torch {torch.__version__}"))])
    version = str(getattr(fa, "__version__", "unknown"))
    details["version"] = version
    cells = []
    matrix: dict[str, str] = {}
    poisoned = ""
    for key, dtype, head_dim, causal in _cells(torch):
        if poisoned:
            matrix[key] = f"not-run({poisoned})"
            continue
        cell = run_case(torch, fa, ctx.device, dtype, head_dim, causal)
        cells.append(cell)
        matrix[key] = _cell_text(cell)
        # A sticky CUDA error poisons the context; later launches prove nothing.
        if cell["status"] == "error":
            reason = ctx.poisoned(cell["text"])
            poisoned = f"CUDA context poisoned by {key}: {reason}" if reason else ""
    details["matrix"] = matrix
    # fp16 everywhere: flash_attn has no fp32 path, and CPU SDPA (what the fakes wrap) takes fp16.
    details["layout_pitfall"] = (layout_pitfall(torch, fa, ctx.device, torch.float16) if not poisoned
                                 else {"error": f"not run: {poisoned}"})
    freed = att.free(torch, ctx.device, poisoned)
    if poisoned:
        details["context_poisoned"] = poisoned
    if freed:
        details["empty_cache_error"] = freed

    findings = []
    seen: set[str] = set()
    for cell in cells:
        if cell["status"] != "error":
            continue
        first = cell["text"].splitlines()[0]
        kb_id = classify(cell["text"])
        if kb_id and first not in seen:
            seen.add(first)
            findings.append(ProbeFinding(kb_id, f"flash_attn_func failed: {first[:160]}",
                                    (cell["text"], f"dtype {cell['dtype']}, head_dim {cell['head_dim']}, "
                                     f"causal {cell['causal']}, shape (B,N,H,D)=({BATCH},{SEQ},{HEADS},"
                                     f"{cell['head_dim']})", f"flash_attn {version}, torch {torch.__version__}")))
    counts = {s: sum(1 for c in cells if c["status"] == s) for s in ("ok", "refused", "mismatch", "error")}
    details["counts"] = counts
    pit = details["layout_pitfall"]
    summary = (f"flash_attn {version}: {counts['ok']} ok, {counts['refused']} refused (fp32), "
               f"{counts['mismatch']} mismatched, {counts['error']} errors")
    if pit.get("silently_wrong"):
        summary += (f"; (B,H,N,D) input is silently wrong (max err {pit['wrong_layout_err']:.2f}), "
                    "transpose(1, 2) fixes it")
    status = Status.FAIL if counts["error"] or counts["mismatch"] or poisoned else Status.PASS
    return Outcome(status, summary, details, findings)



# ---------------------------------------------------------------- FlashAttention-4 (flash_attn.cute)

def _sync(torch: Any, device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def run_case_fa4(torch: Any, fa4: Any, device: str, dtype: Any, head_dim: int, causal: bool) -> dict[str, Any]:
    """flash_attn.cute.flash_attn_func on the same (B, N, H, D) cells as FA2's, against the fp64
    reference. The first call's time includes the JIT compile of this configuration; a second call
    of the same configuration is the kernel's steady-state time. Backward runs where the output
    carries an autograd graph (FA4's FlashAttnFunc), its first call compiling too."""
    q, k, v, grad, leaves = _cell_inputs(torch, device, dtype, head_dim, causal)
    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"dtype": dname, "head_dim": head_dim, "causal": causal}
    stage = "forward"
    try:
        _sync(torch, device)
        start = _clock()
        result = fa4.flash_attn_func(*leaves, causal=causal)
        _sync(torch, device)
        cell["first_s"] = round(_clock() - start, 4)
        # FA4 returns (out, lse); accept a bare tensor too, as a later release may.
        out = result[0] if isinstance(result, (tuple, list)) else result
        cell["returns"] = f"tuple of {len(result)}" if isinstance(result, (tuple, list)) else "tensor"
        stage = "second call"
        start = _clock()
        again = fa4.flash_attn_func(*leaves, causal=causal)
        _sync(torch, device)
        cell["kernel_ms"] = round((_clock() - start) * 1e3, 3)
        del again
        if getattr(out, "grad_fn", None) is not None:
            stage = "backward"
            start = _clock()
            att.backward(out, grad)
            _sync(torch, device)
            cell["bwd_first_s"] = round(_clock() - start, 4)
        stage = "compare"
        ref, ref_leaves = _reference(torch, q, k, v, causal)
        cell["fwd_err"] = att.max_abs_error(torch, out, ref.transpose(1, 2))
        if "bwd_first_s" in cell:
            att.backward(ref, grad.double().transpose(1, 2))
            grads = [x.grad for x in leaves]
            if any(g is None for g in grads):
                raise RuntimeError("FA4 backward ran but left a gradient of q, k or v unset")
            cell["bwd_err"] = max(att.max_abs_error(torch, g, r.grad.transpose(1, 2))
                                  for g, r in zip(grads, ref_leaves))
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        text = error_text(exc)
        refused = _expected_refusal(dname, text) or (dname == "float32" and "float16" in text) or _fa4_refusal(text)
        cell.update(status="refused" if refused else "error", stage=stage, text=text)
        return cell
    ok = cell["fwd_err"] <= att.FWD_TOL[dname] and cell.get("bwd_err", 0.0) <= att.BWD_TOL[dname]
    cell["status"] = "ok" if ok else "mismatch"
    return cell


def _run_fa4(ctx: ProbeContext, fa4: Any, failure: str, said: list[str], poisoned: str) -> Outcome:
    torch = ctx.torch
    details: dict[str, Any] = {"import_messages": said}
    if failure:
        details["error"] = failure
        kb = classify(failure) or "flash-attn-unsupported"
        return Outcome(Status.FAIL, f"FA4: importing flash_attn.cute failed: {failure.splitlines()[0][:160]}",
                       details, [ProbeFinding(kb, "flash_attn.cute (FlashAttention-4) does not import",
                                         (failure, f"torch {torch.__version__}"))])
    version = _fa4_version(fa4)
    details["version"] = version
    details["disk_cache"] = os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1"
    if not ctx.is_cuda:
        details["skipped"] = f"FlashAttention-4 runs on CUDA only; the device is {ctx.device}"
        return Outcome(Status.SKIPPED, f"FA4 {version}: not run ({ctx.device}: CUDA only)", details)
    if poisoned:
        details["skipped"] = f"not run: {poisoned}"
        return Outcome(Status.SKIPPED, f"FA4 {version}: not run (CUDA context poisoned)", details)
    cells, matrix, kernel_ms = [], {}, {}
    began = _clock()
    for key, dtype, head_dim, causal in _cells(torch):
        if poisoned:
            matrix[key] = f"not-run({poisoned})"
            continue
        if _clock() - began > FA4_BUDGET_S:
            matrix[key] = f"not-run(FA4 time budget of {FA4_BUDGET_S:.0f} s spent)"
            continue
        cell = run_case_fa4(torch, fa4, ctx.device, dtype, head_dim, causal)
        cells.append(cell)
        matrix[key] = _fa4_cell_text(cell)
        if "kernel_ms" in cell:
            kernel_ms[key] = cell["kernel_ms"]
        if cell["status"] == "error":
            reason = ctx.poisoned(cell["text"])
            poisoned = f"CUDA context poisoned by FA4 {key}: {reason}" if reason else ""
    details["matrix"] = matrix
    counts = {s: sum(1 for c in cells if c["status"] == s) for s in ("ok", "refused", "mismatch", "error")}
    counts["not_run"] = len(matrix) - len(cells)
    details["counts"] = counts
    details["returns"] = next((c["returns"] for c in cells if "returns" in c), None)
    details["backward"] = any("bwd_first_s" in c for c in cells)
    # The first call of a configuration compiles it: its time less the second call's is the JIT.
    compiled = [c for c in cells if "first_s" in c]
    details["compile_s"] = round(sum(c["first_s"] - c["kernel_ms"] / 1e3 for c in compiled)
                                 + sum(c.get("bwd_first_s", 0.0) for c in compiled), 3)
    details["first_call_s"] = {f"{c['dtype']}/d{c['head_dim']}{'/causal' if c['causal'] else ''}": c["first_s"]
                               for c in compiled}
    details["kernel_ms"] = kernel_ms
    details["total_s"] = round(_clock() - began, 3)
    freed = att.free(torch, ctx.device, poisoned)
    if poisoned:
        details["context_poisoned"] = poisoned
    if freed:
        details["empty_cache_error"] = freed

    findings: list[ProbeFinding] = []
    seen: set[str] = set()
    for cell in cells:
        expected_fp32 = cell["status"] == "refused" and cell["dtype"] == "float32"
        if cell["status"] not in ("error", "refused") or expected_fp32:
            continue
        first = cell["text"].splitlines()[0]
        kb_id = classify(cell["text"])
        if kb_id and first not in seen:
            seen.add(first)
            findings.append(ProbeFinding(
                kb_id, f"FA4 flash_attn_func {'declined' if cell['status'] == 'refused' else 'failed'}: {first[:160]}",
                (cell["text"], f"dtype {cell['dtype']}, head_dim {cell['head_dim']}, causal {cell['causal']}, "
                 f"shape (B,N,H,D)=({BATCH},{SEQ},{HEADS},{cell['head_dim']})",
                 f"flash_attn.cute {version}, torch {torch.__version__}"),
                severity="warning" if cell["status"] == "refused" else "error"))
    fp32_refused = sum(1 for c in cells if c["status"] == "refused" and c["dtype"] == "float32")
    other_refused = counts["refused"] - fp32_refused
    summary = (f"FA4 {version}: {counts['ok']} ok, {fp32_refused} refused (fp32)"
               + (f", {other_refused} declined (head dim or GPU)" if other_refused else "")
               + f", {counts['mismatch']} mismatched, {counts['error']} errors")
    if counts["not_run"]:
        summary += f", {counts['not_run']} not run"
    if compiled:
        fastest, slowest = min(kernel_ms.values()), max(kernel_ms.values())
        summary += (f"; first calls compile {details['compile_s']:.1f} s in all, then "
                    f"{fastest:.2f}-{slowest:.2f} ms a forward")
    if counts["error"] or counts["mismatch"] or poisoned:
        status = Status.FAIL
    elif other_refused or counts["not_run"]:
        status = Status.WARN
    else:
        status = Status.PASS
    return Outcome(status, summary, details, findings)


def _fa4_version(fa4: Any) -> str:
    # flash_attn/cute/__init__.py reads importlib.metadata.version("fa4"), which is no installed
    # distribution's name, so it says 0.0.0; the wheel's own metadata is "flash-attn-4".
    version = str(getattr(fa4, "__version__", "") or "")
    if version in ("", "0.0.0"):
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("flash-attn-4")
        except Exception:  # noqa: BLE001 - a source checkout has no distribution metadata
            version = "unknown"
    return version


def _fa4_cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] in ("ok", "mismatch"):
        bwd = f", bwd {cell['bwd_err']:.1e}" if "bwd_err" in cell else ", no backward"
        return (f"{cell['status']}(fwd {cell['fwd_err']:.1e}{bwd}; first call {cell['first_s']:.2f} s, "
                f"then {cell['kernel_ms']:.3f} ms)")
    return f"{cell['status']}({cell['stage']}: {' '.join(cell['text'].split())[:160]})"


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] in ("ok", "mismatch"):
        return f"{cell['status']}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
    return f"{cell['status']}({cell['stage']}: {' '.join(cell['text'].split())[:160]})"
