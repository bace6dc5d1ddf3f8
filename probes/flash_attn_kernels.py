"""Probe `flash-attn`: does the installed flash_attn import against this torch, and does
`flash_attn_func` compute what torch's SDPA computes, in flash_attn's (batch, seqlen, heads, dim)
layout?

It also runs the layout pitfall of seed 003 on purpose: flash_attn_func given SDPA-layout
(batch, heads, seqlen, dim) tensors raises nothing and computes attention over the wrong axis; the
mismatch it shows is the evidence that a caller must transpose.
"""
from __future__ import annotations

import importlib
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import Finding, Outcome, ProbeContext, ProbeSpec, Status, error_text, skipped

SPEC = ProbeSpec(
    id="flash-attn",
    title="flash-attn (Dao-AILab) kernels and layout",
    timeout_s=90.0,
    emits=("flash-attn-unsupported", *att.KERNEL_ERROR_IDS),
    needs=("torch", "flash_attn"),
    description="Runs flash_attn_func against torch SDPA on fp16/bf16 and several head dims, and shows "
                "the (B, H, N, D) layout pitfall.",
)

HEAD_DIMS = (64, 128, 256)
BATCH, SEQ, HEADS = 2, 128, 4  # SEQ != HEADS, so the wrong layout cannot coincide with the right one

_UNSUPPORTED = (
    "flashattention only supports ampere gpus or newer",
    "flashattention only support fp16 and bf16 data type",
    "head dimension at most",
    "head_dim",
    "headdim",
    "flash_attn_2_cuda",
    "undefined symbol",
    "flashattention only supports",
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


def run_case(torch: Any, fa: Any, device: str, dtype: Any, head_dim: int, causal: bool) -> dict[str, Any]:
    """flash_attn_func on (B, N, H, D) against the fp32 reference in SDPA's (B, H, N, D)."""
    gen = torch.Generator(device="cpu").manual_seed(head_dim * 2 + causal)
    q, k, v, grad = (torch.randn(BATCH, SEQ, HEADS, head_dim, generator=gen).to(device=device, dtype=dtype)
                     for _ in range(4))
    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"dtype": dname, "head_dim": head_dim, "causal": causal}
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    stage = "forward"
    try:
        out = fa.flash_attn_func(*leaves, causal=causal)
        stage = "backward"
        att.backward(out, grad)
        if str(device).startswith("cuda"):
            stage = "synchronize"
            torch.cuda.synchronize(device)
        # Compared inside the try: reading the result back is where an asynchronous fault surfaces.
        stage = "compare"
        ref_leaves = [t.detach().double().transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
        ref = att.reference_attention(torch, *ref_leaves, causal=causal)
        att.backward(ref, grad.double().transpose(1, 2))
        cell["fwd_err"] = att.max_abs_error(torch, out, ref.transpose(1, 2))
        cell["bwd_err"] = max(att.max_abs_error(torch, x.grad, r.grad.transpose(1, 2))
                              for x, r in zip(leaves, ref_leaves))
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        text = error_text(exc)
        cell.update(status="refused" if _expected_refusal(dname, text) else "error", stage=stage, text=text)
        return cell
    ok = cell["fwd_err"] <= att.FWD_TOL[dname] and cell["bwd_err"] <= att.BWD_TOL[dname]
    cell["status"] = "ok" if ok else "mismatch"
    return cell


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


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    with att.capture(stderr=True) as said:
        try:
            fa = importlib.import_module("flash_attn")
            failure = ""
        except Exception as exc:  # noqa: BLE001 - an ABI mismatch is an ImportError here
            fa, failure = None, error_text(exc)
    if failure and "No module named 'flash_attn'" in failure:
        return skipped("flash_attn is not installed", error=failure)
    details: dict[str, Any] = {"import_messages": [t for t in said.texts if t.strip()]}
    if failure:
        details["error"] = failure
        kb = classify(failure) or "flash-attn-unsupported"
        return Outcome(Status.FAIL, f"importing flash_attn failed: {failure.splitlines()[0][:160]}", details,
                       [Finding(kb, "flash_attn does not import against this torch",
                                (failure, f"torch {torch.__version__}"))])
    version = str(getattr(fa, "__version__", "unknown"))
    details["version"] = version
    cells = []
    matrix: dict[str, str] = {}
    poisoned = ""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                key = f"{att.dtype_name(dtype)}/d{head_dim}{'/causal' if causal else ''}"
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
            findings.append(Finding(kb_id, f"flash_attn_func failed: {first[:160]}",
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


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] in ("ok", "mismatch"):
        return f"{cell['status']}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
    return f"{cell['status']}({cell['stage']}: {' '.join(cell['text'].split())[:160]})"
