"""Probe `attention-memory`: how the memory of naive attention (baddbmm, softmax, bmm, as diffusion
code of the SD1.x era writes it) and of SDPA grows with sequence length, and whether the naive path
fits this device for the user's shape (`--attn-shape B,H,N,D`).

Peaks are measured on a few small sequence lengths and fitted as a power law: naive attention holds
(B*H, N, N) score matrices, so it grows as N^2; SDPA's fused kernels grow as N. On CUDA the peak is
`max_memory_allocated` above the baseline; on CPU there is no peak counter, so the peak is the sum
of the storages of the tensors each step keeps alive (the fused kernel's internal workspace is not
visible that way; the details say which method was used).
"""
from __future__ import annotations

import math
import os
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, error_text

SPEC = ProbeSpec(
    id="attention-memory",
    title="Attention memory: naive score matrix vs SDPA",
    timeout_s=60.0,
    emits=("attention-oom", *att.KERNEL_ERROR_IDS),
    gpu_memory_mib=256,
    description="Measures how naive and SDPA attention memory grows with sequence length and predicts "
                "whether the naive path fits for --attn-shape.",
)

SEQ_LENS = (256, 512, 1024)
# On the CPU the peak is computed from storage sizes, exact at any length: shorter sequences prove
# the same N^2-vs-N growth for a quarter of the work (the largest shape dominates it). On CUDA
# the allocator's 2 MiB granularity needs the longer ones.
CPU_SEQ_LENS = (128, 256, 512)
BATCH_HEADS = 4  # B*H of the measured shapes
HEAD_DIM = 64


def _storage(t: Any) -> int:
    return int(t.untyped_storage().nbytes())


def naive_attention(torch: Any, q: Any, k: Any, v: Any, track: list[int]) -> Any:
    """Attention as seed 001's `_attention` writes it, on (B*H, N, D). After each step `track`
    gets the bytes of the intermediates alive at that point (inputs excluded)."""
    scale = q.shape[-1] ** -0.5
    empty = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(empty, q, k.transpose(-1, -2), beta=0, alpha=scale)
    track.append(_storage(empty) + _storage(scores))
    probs = scores.softmax(dim=-1)
    track.append(_storage(empty) + _storage(scores) + _storage(probs))
    out = torch.bmm(probs.to(v.dtype), v)
    track.append(_storage(empty) + _storage(scores) + _storage(probs) + _storage(out))
    return out


def sdpa_attention(torch: Any, q: Any, k: Any, v: Any, track: list[int]) -> Any:
    out = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    track.append(_storage(out))
    return out


def warm_up(torch: Any, device: str, dtype: Any) -> None:
    """One GEMM and one SDPA on the device before any peak is measured. cuBLAS allocates its
    per-(handle, stream) workspace from the caching allocator at the first GEMM (32 MiB on sm_90,
    about 8 MiB elsewhere: CublasHandlePool.cpp) and `empty_cache()` never returns it; counted in
    the first measured step it bends the growth fit (N^-0.2 instead of N^2 on an H100). Only the
    persistent workspace is moved out of the measurement: SDPA's own per-call workspace is freed
    after each call and stays in the measured peaks."""
    x = torch.zeros(1, 16, HEAD_DIM, device=device, dtype=dtype)
    torch.baddbmm(torch.empty(1, 16, 16, device=device, dtype=dtype), x, x.transpose(-1, -2), beta=0)
    torch.bmm(x, x.transpose(-1, -2))
    # SDPA on the first measured shape: a cuDNN backend builds (and caches) its graph here, once,
    # instead of for a warm-up shape of its own.
    q = torch.zeros(1, BATCH_HEADS, SEQ_LENS[0], HEAD_DIM, device=device, dtype=dtype)
    torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.cuda.synchronize(device)


def inputs(torch: Any, device: str, n: int, dtype: Any) -> tuple[Any, Any, Any]:
    """q, k, v of one sequence length, (B*H, N, D), the same for every attention function."""
    gen = torch.Generator(device="cpu").manual_seed(n)
    return tuple(torch.randn(BATCH_HEADS, n, HEAD_DIM, generator=gen).to(device=device, dtype=dtype)
                 for _ in range(3))  # type: ignore[return-value]


def measure(torch: Any, device: str, fn: Any, q: Any, k: Any, v: Any) -> tuple[int, Any]:
    """(peak bytes above the inputs, output) of one attention function."""
    track: list[int] = []
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn(torch, q, k, v, track)
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device) - base)
    else:
        out = fn(torch, q, k, v, track)
        peak = max(track)
    return peak, out


def fit_power(ns: list[int], peaks: list[int]) -> float:
    """Least-squares exponent p of peak ~ c * N^p on a log-log scale."""
    xs = [math.log(n) for n in ns]
    ys = [math.log(max(p, 1)) for p in peaks]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def score_matrix_bytes(shape: tuple[int, int, int, int], itemsize: int) -> int:
    """Bytes of one (B*H, N, N) score matrix: what the naive path must allocate at once."""
    b, h, n, _ = shape
    return b * h * n * n * itemsize


def device_memory(torch: Any, device: str) -> tuple[int, str]:
    if str(device).startswith("cuda"):
        return int(torch.cuda.get_device_properties(device).total_memory), "cuda total_memory"
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "physical RAM (sysconf)"
    except (ValueError, OSError, AttributeError):
        return 0, "unknown"


def parse_shape(value: Any) -> tuple[int, int, int, int] | None:
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    shape = tuple(int(p) for p in parts)
    if len(shape) != 4 or min(shape) <= 0:
        raise ValueError(f"attn_shape must be four positive integers B,H,N,D, got {value!r}")
    return shape  # type: ignore[return-value]


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    dtype = torch.float16 if ctx.is_cuda else torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    method = ("torch.cuda.max_memory_allocated above baseline" if ctx.is_cuda else
              "analytic: sum of live intermediate tensors' untyped_storage().nbytes() "
              "(no CPU peak counter; fused-kernel workspace not visible)")
    peaks: dict[str, list[int]] = {"naive": [], "sdpa": []}
    seq_lens = SEQ_LENS if ctx.is_cuda else CPU_SEQ_LENS
    errors: dict[str, float] = {}
    findings: list[ProbeFinding] = []
    try:
        if ctx.is_cuda:
            warm_up(torch, ctx.device, dtype)
        for n in seq_lens:
            q, k, v = inputs(torch, ctx.device, n, dtype)
            outs = {}
            for name, fn in (("naive", naive_attention), ("sdpa", sdpa_attention)):
                peak, outs[name] = measure(torch, ctx.device, fn, q, k, v)
                peaks[name].append(peak)
            # One fp64 reference per length, computed after the measured peaks.
            ref = att.reference_attention(torch, q, k, v)
            for name, out in outs.items():
                errors[f"{name}/N={n}"] = att.max_abs_error(torch, out, ref)
            errors[f"naive_vs_sdpa/N={n}"] = att.max_abs_error(torch, outs["naive"], outs["sdpa"])
            del outs, ref, q, k, v
            att.free(torch, ctx.device)
    except Exception as exc:  # noqa: BLE001 - an OOM on a small shape is itself the diagnosis
        text = error_text(exc)
        att.free(torch, ctx.device, ctx.poisoned(text))
        kb_id = att.classify_kernel_error(text) or "cuda-oom"
        return Outcome(Status.FAIL, f"attention workload failed: {text.splitlines()[0]}",
                       {"error": text, "method": method}, [ProbeFinding(kb_id, text.splitlines()[0], (text,))])

    ns = list(seq_lens)
    exponents = {name: round(fit_power(ns, p), 3) for name, p in peaks.items()}
    # Doubling N: x4 for a quadratic term, x2 for a linear one.
    ratios = {name: round(p[-1] / p[-2], 3) for name, p in peaks.items() if p[-2]}
    # Bytes per element of B*H*N^2 that the naive path keeps alive at its peak.
    n2_buffers = peaks["naive"][-1] / (BATCH_HEADS * ns[-1] ** 2 * itemsize)
    tol = att.FWD_TOL[att.dtype_name(dtype)]
    mismatched = {k: e for k, e in errors.items() if e > tol}
    total, total_source = device_memory(torch, ctx.device)
    details: dict[str, Any] = {
        "method": method,
        "dtype": att.dtype_name(dtype),
        "measured_shape": f"B*H={BATCH_HEADS}, D={HEAD_DIM}",
        "seq_lens": ns,
        "peak_bytes": peaks,
        "growth_exponent": exponents,
        "doubling_ratio": ratios,
        "naive_score_buffers_at_peak": round(n2_buffers, 3),
        "max_abs_error": {k: float(f"{e:.3g}") for k, e in errors.items()},
        "tolerance": tol,
        "device_memory_bytes": total,
        "device_memory_source": total_source,
    }
    shape = parse_shape(ctx.options.get("attn_shape"))
    status = Status.PASS
    if shape is not None:
        b, h, n, d = shape
        pred_itemsize = int(ctx.options.get("attn_itemsize") or 2)  # fp16/bf16 unless told
        scores = score_matrix_bytes(shape, pred_itemsize)
        naive_peak = int(n2_buffers * scores)
        io = 4 * b * h * n * d * pred_itemsize  # q, k, v and the output
        sdpa_linear = peaks["sdpa"][-1] / ns[-1] / BATCH_HEADS / itemsize * pred_itemsize
        details["prediction"] = {
            "attn_shape": list(shape),
            "itemsize": pred_itemsize,
            "score_matrix_bytes": scores,
            "score_matrix": att.fmt_bytes(scores),
            "naive_peak_bytes": naive_peak + io,
            "naive_peak": att.fmt_bytes(naive_peak + io),
            "sdpa_peak_bytes": int(sdpa_linear * n * b * h) + io,
            "sdpa_peak": att.fmt_bytes(int(sdpa_linear * n * b * h) + io),
            "fits": bool(total and naive_peak + io <= total),
        }
        if total and naive_peak + io > total:
            status = Status.WARN
            findings.append(ProbeFinding(
                "attention-oom",
                f"naive attention for B,H,N,D={b},{h},{n},{d} needs ~{att.fmt_bytes(naive_peak + io)}; "
                f"this device has {att.fmt_bytes(total)}",
                (f"score matrix B*H*N*N*itemsize = {b}*{h}*{n}*{n}*{pred_itemsize} = {scores} bytes "
                 f"({att.fmt_bytes(scores)})",
                 f"naive peak holds {n2_buffers:.2f} score-sized buffers (measured), growth N^{exponents['naive']}",
                 f"SDPA would need ~{details['prediction']['sdpa_peak']} (growth N^{exponents['sdpa']})",
                 f"device memory {total} bytes ({total_source})"),
                severity="warning",
            ))
    if mismatched:
        status = Status.FAIL
    summary = (f"peak memory of naive attention grows as N^{exponents['naive']:.2f} in the sequence length N "
               f"(x{ratios.get('naive', 0):.1f} each time N doubles), SDPA's as N^{exponents['sdpa']:.2f}")
    if shape is not None:
        summary += f"; attn_shape score matrix {details['prediction']['score_matrix']}, " + (
            "naive path fits" if details["prediction"]["fits"] else "naive path does NOT fit")
    if mismatched:
        summary += f"; outputs disagree: {mismatched}"
    return Outcome(status, summary, details, findings)
