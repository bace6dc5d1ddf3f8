"""Probe `matmul-sanity`: GEMM accuracy per dtype against an fp64 reference, and a short
throughput measurement compared with the GPU's nominal peak.

Accuracy: fp32, TF32 (CUDA only), fp16 and bf16 matmuls of fresh random inputs, in two operand
layouts (plain and a transposed right operand, which takes a different BLAS path), judged by the
relative Frobenius error against fp64 on the CPU computed from the *same rounded inputs*. NaN never
passes. A broken math library (wrong cuBLAS/oneDNN/MKL, a bad driver, a miscompiled build) shows up
here as a numeric failure.

Throughput: on CUDA, a square GEMM large enough to fill the chip is timed with CUDA events after a
warm-up, median of several runs, and compared with a table of nominal dense peaks; below a quarter
of nominal the GPU is throttled, power-capped, shared or misconfigured (NVIDIA_TF32_OVERRIDE=0
turns TF32 into plain fp32). On other devices a tiny GEMM is timed with perf_counter and the peak
comparison is skipped with its reason.

No knowledge-base entry covers wrong GEMM results yet, so a numeric failure is reported as status
`fail` with its evidence in the summary and details, and no finding.
"""
from __future__ import annotations

import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.probes.base import Outcome, ProbeContext, ProbeSpec, Status, error_text

SPEC = ProbeSpec(
    id="matmul-sanity",
    title="GEMM accuracy (fp32, TF32, fp16, bf16) and throughput against nominal peak",
    timeout_s=60.0,
    emits=(),
    needs=("torch",),
    gpu_memory_mib=512,
    description=(
        "Multiplies fresh random matrices in fp32, TF32, fp16 and bf16 and compares them with an "
        "fp64 reference; on CUDA times a large GEMM and compares it with the GPU's nominal peak."
    ),
)

# Relative Frobenius error allowed per mode at K=512. Measured on a healthy CPU: fp32 ~3e-7,
# fp16 ~2e-4, bf16 ~1.7e-3. TF32 rounds inputs to 10 mantissa bits: ~3e-4 with round-to-nearest,
# ~8e-4 when the conversion truncates, hence 2e-3 rather than 1e-3.
TOLERANCE: dict[str, float] = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 3e-3, "bf16": 1e-2}

# Accuracy shape (M, K, N): not square, so a swapped or transposed operand cannot pass by symmetry.
ACCURACY_SHAPE = (192, 512, 160)

# Below this fraction of the nominal dense peak, a chip-filling GEMM is considered too slow.
SLOW_FRACTION = 0.25


@dataclass(frozen=True)
class GpuPeak:
    """Nominal dense (no sparsity) tensor-core peaks in TFLOP/s, fp16/bf16 with fp32 accumulate
    (what torch's half GEMMs use) and TF32. These are leads from NVIDIA datasheets and
    whitepapers, not measurements: the source says which."""

    pattern: str  # regex searched in torch.cuda.get_device_name()
    label: str
    fp16: float | None
    bf16: float | None
    tf32: float | None
    source: str


# Ordered most specific first: "H100 PCIe" before "H100", "L40S" before "L4".
PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak(r"\bB200\b", "B200", 2250.0, 2250.0, 1125.0, "HGX B200 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bH200 NVL\b", "H200 NVL", 835.0, 835.0, 418.0, "H200 NVL datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bH200\b", "H200 SXM", 989.0, 989.0, 494.0, "H200 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bGH200\b", "GH200", 989.0, 989.0, 494.0, "GH200 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bH100 PCIe\b", "H100 PCIe", 756.0, 756.0, 378.0, "H100 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bH100 NVL\b", "H100 NVL", 835.0, 835.0, 418.0, "H100 NVL datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bH100\b", "H100 SXM", 989.0, 989.0, 494.0, "H100 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bA100\b", "A100", 312.0, 312.0, 156.0, "A100 datasheet (lead)"),
    GpuPeak(r"\bL40S\b", "L40S", 362.0, 362.0, 183.0, "L40S datasheet (lead)"),
    GpuPeak(r"\bL4\b", "L4", 121.0, 121.0, 60.0, "L4 datasheet, dense = sparse / 2 (lead)"),
    GpuPeak(r"\bA10\b", "A10", 125.0, 125.0, 62.5, "A10 datasheet (lead)"),
    GpuPeak(r"RTX 5090\b", "GeForce RTX 5090 (sm_120)", 209.5, 209.5, 104.8,
            "RTX Blackwell whitepaper, fp32 accumulate (lead)"),
    GpuPeak(r"RTX 4090\b", "GeForce RTX 4090", 165.2, 165.2, 82.6, "Ada whitepaper, fp32 accumulate (lead)"),
    GpuPeak(r"RTX 3090\b", "GeForce RTX 3090", 71.0, 71.0, 35.6, "Ampere GA102 whitepaper, fp32 accumulate (lead)"),
    GpuPeak(r"\bT4\b", "T4", 65.0, None, None, "T4 datasheet, no bf16 or TF32 tensor cores (lead)"),
    GpuPeak(r"\bV100-PCIE\b", "V100 PCIe", 112.0, None, None, "V100 datasheet, no bf16 or TF32 (lead)"),
    GpuPeak(r"\bV100\b", "V100 SXM2", 125.0, None, None, "V100 datasheet, no bf16 or TF32 (lead)"),
)


def lookup_peak(name: str) -> GpuPeak | None:
    """The nominal peaks for a `torch.cuda.get_device_name()` string, or None if unknown."""
    for peak in PEAKS:
        if re.search(peak.pattern, name, flags=re.IGNORECASE):
            return peak
    return None


def relative_error(torch: Any, got: Any, ref: Any) -> float:
    """||got - ref||_F / ||ref||_F in fp64; NaN when `got` has NaN/Inf, so it never passes."""
    got64 = got.to("cpu", torch.float64)
    if not bool(torch.isfinite(got64).all()):
        return math.nan
    return float(torch.linalg.norm(got64 - ref) / torch.linalg.norm(ref))


def _dtype(torch: Any, mode: str) -> Any:
    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[mode]


class _Precision:
    """Sets torch's fp32 matmul precision for one block ("highest" = IEEE fp32 everywhere, "high"
    = TF32 on CUDA) and restores the user's setting afterwards, whatever happens.

    torch >= 2.9 keeps the setting per backend (`torch.backends.<backend>.matmul.fp32_precision`)
    and its legacy getter raises once those were set apart; then the per-backend values are what
    is saved and restored. Otherwise the legacy value is, so that the legacy getter keeps working."""

    _BACKENDS = ("cuda", "mkldnn")

    def __init__(self, torch: Any, value: str) -> None:
        self.torch, self.value = torch, value
        self.saved: dict[str, str] = {}
        self.saved_legacy: str | None = None

    def _matmul(self, backend: str) -> Any:
        module = getattr(self.torch.backends, backend, None)
        matmul = getattr(module, "matmul", None)
        return matmul if hasattr(matmul, "fp32_precision") else None

    def __enter__(self) -> None:
        try:
            self.saved_legacy = self.torch.get_float32_matmul_precision()
        except RuntimeError:
            # The user set backends through the new API, differently: restore each of them.
            for backend in self._BACKENDS:
                matmul = self._matmul(backend)
                if matmul is not None:
                    self.saved[backend] = matmul.fp32_precision
        self.torch.set_float32_matmul_precision(self.value)

    def __exit__(self, *exc: object) -> None:
        if self.saved_legacy is not None:
            self.torch.set_float32_matmul_precision(self.saved_legacy)
        for backend, value in self.saved.items():
            self._matmul(backend).fp32_precision = value


def _accuracy_case(ctx: ProbeContext, mode: str, layout: str, generator: Any) -> dict[str, Any]:
    torch = ctx.torch
    m, k, n = ACCURACY_SHAPE
    dtype = _dtype(torch, mode)
    # Fresh inputs every run (randn is never all zeros), rounded to the dtype on the CPU so that
    # the fp64 reference sees exactly the numbers the device multiplies.
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    if layout == "nt":
        b = b.t().contiguous().t()  # same values, column-major storage: the transposed BLAS path
    case: dict[str, Any] = {
        "mode": mode,
        "layout": layout,
        "shape": [m, k, n],
        "dtype": str(dtype).replace("torch.", ""),
        "tolerance": TOLERANCE[mode],
    }
    ref = a.to(torch.float64) @ b.to(torch.float64)
    precision = "high" if mode == "tf32" else "highest"
    try:
        with _Precision(torch, precision):
            da, db = a.to(ctx.device), b.to(ctx.device)
            out = da @ db
            ctx.sync()
        case["rel_error"] = relative_error(torch, out, ref)
        del da, db, out
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        case["error"] = error_text(exc)
        # Older CPU builds have no fp16/bf16 GEMM ("not implemented for 'Half'"): a limit of the
        # build, not a broken install. On a GPU a failing half GEMM is a real failure.
        unsupported = not ctx.is_cuda and "not implemented" in str(exc).lower()
        case["verdict"] = "unsupported" if unsupported else "fail"
        return case
    err = case["rel_error"]
    case["verdict"] = "pass" if err <= TOLERANCE[mode] else "fail"  # NaN compares false: fail
    if mode == "fp32" and case["verdict"] == "fail" and 1e-4 < err < 5e-3:
        case["hint"] = "fp32 error has the size of TF32 rounding: TF32 is on despite precision 'highest'"
    return case


def _time_cuda(ctx: ProbeContext, size: int, mode: str) -> float:
    """Median milliseconds of one size^3 GEMM, timed with CUDA events after a warm-up."""
    torch = ctx.torch
    dtype = _dtype(torch, mode)
    a = torch.randn(size, size, device=ctx.device, dtype=dtype)
    b = torch.randn(size, size, device=ctx.device, dtype=dtype)
    with _Precision(torch, "high" if mode == "tf32" else "highest"):
        # Warm-up long enough for clocks to ramp and cuBLAS heuristics to settle.
        deadline = time.perf_counter() + 0.15
        while time.perf_counter() < deadline:
            for _ in range(4):
                a @ b
            ctx.sync()
        samples = []
        # Events record on the given stream: the probe device's, not whichever device is current
        # (with --device cuda:1 events on device 0 would enclose no work: a false pass).
        stream = torch.cuda.current_stream(ctx.device)
        for _ in range(7):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(4):
                a @ b
            end.record(stream)
            end.synchronize()
            samples.append(start.elapsed_time(end) / 4)
    del a, b
    return statistics.median(samples)


def _time_host(ctx: ProbeContext, size: int) -> float:
    """Median milliseconds of a small fp32 GEMM with perf_counter (any non-CUDA device)."""
    torch = ctx.torch
    a = torch.randn(size, size).to(ctx.device)
    b = torch.randn(size, size).to(ctx.device)
    a @ b
    ctx.sync()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        ctx.sync()
        samples.append((time.perf_counter() - start) * 1e3)
    del a, b
    return statistics.median(samples)


def _throughput(ctx: ProbeContext) -> dict[str, Any]:
    torch = ctx.torch
    tf32_override = os.environ.get("NVIDIA_TF32_OVERRIDE")
    if not ctx.is_cuda:
        size = 256
        ms = _time_host(ctx, size)
        return {
            "measured": [{"mode": "fp32", "size": size, "median_ms": ms, "tflops": 2 * size**3 / ms / 1e9}],
            "peak_comparison": "skipped: nominal peaks are known for NVIDIA GPUs only "
            f"(device {ctx.device}); the timing is informative",
        }
    name = torch.cuda.get_device_name(ctx.device)
    peak = lookup_peak(name)
    # 3 square matrices must fit well inside the budget; 4096 fills every GPU in the table
    # (hundreds of output tiles for ~100-150 SMs).
    size = 4096
    while size > 1024 and 3 * size * size * 4 > ctx.memory_budget_bytes // 2:
        size //= 2
    measured = []
    for mode in ("bf16", "fp16", "tf32"):
        nominal = getattr(peak, mode) if peak else None
        if peak is not None and nominal is None:
            measured.append({"mode": mode, "skipped": f"{peak.label} has no {mode} tensor cores"})
            continue
        try:
            ms = _time_cuda(ctx, size, mode)
            if not ms > 0:
                raise ZeroDivisionError(f"CUDA events measured {ms} ms for {4} GEMMs of {size}^3")
        except (RuntimeError, ZeroDivisionError) as exc:
            measured.append({"mode": mode, "error": error_text(exc)})
            continue
        tflops = 2 * size**3 / ms / 1e9
        entry: dict[str, Any] = {"mode": mode, "size": size, "median_ms": ms, "tflops": tflops}
        if nominal:
            entry["nominal_tflops"] = nominal
            entry["fraction_of_nominal"] = tflops / nominal
            entry["slow"] = tflops < SLOW_FRACTION * nominal
        measured.append(entry)
    torch.cuda.empty_cache()
    out: dict[str, Any] = {"gpu": name, "measured": measured, "NVIDIA_TF32_OVERRIDE": tf32_override}
    if peak is None:
        out["peak_comparison"] = f"skipped: no nominal peak known for {name!r}"
    else:
        out["peak_comparison"] = "done"
        out["peak_source"] = peak.source
        out["peak_label"] = peak.label
    return out


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    seed = int.from_bytes(os.urandom(4), "little")
    generator = torch.Generator().manual_seed(seed)
    modes = ["fp32", "tf32", "fp16", "bf16"] if ctx.is_cuda else ["fp32", "fp16", "bf16"]
    cases = [_accuracy_case(ctx, mode, layout, generator) for mode in modes for layout in ("nn", "nt")]
    details: dict[str, Any] = {"device": ctx.device, "seed": seed, "accuracy": cases}
    if not ctx.is_cuda:
        details["tf32"] = "skipped: TF32 is a CUDA tensor-core mode"
    details["throughput"] = _throughput(ctx)

    failed = [c for c in cases if c["verdict"] == "fail"]
    if failed:
        parts = []
        for c in failed:
            what = c.get("error") or f"rel. error {c['rel_error']:.3g} > {c['tolerance']:g}"
            parts.append(f"{c['mode']} {c['layout']} {c['shape']}: {what}")
        return Outcome(Status.FAIL, f"matmul gives wrong results on {ctx.device}: " + "; ".join(parts), details)

    slow = [m for m in details["throughput"]["measured"] if m.get("slow")]
    worst = ", ".join(f"{c['mode']} {c['rel_error']:.1e}" for c in cases if c["layout"] == "nn" and "rel_error" in c)
    if slow:
        parts = [
            f"{m['mode']} {m['tflops']:.0f} TFLOP/s = {100 * m['fraction_of_nominal']:.0f}% of "
            f"nominal {m['nominal_tflops']:g}"
            for m in slow
        ]
        summary = f"GEMMs are accurate but slow on {details['throughput']['gpu']}: " + "; ".join(parts)
        summary += " (throttled, power-capped, shared or misconfigured GPU?"
        if any(m["mode"] == "tf32" for m in slow) and details["throughput"]["NVIDIA_TF32_OVERRIDE"] == "0":
            summary += " NVIDIA_TF32_OVERRIDE=0 disables TF32"
        summary += ")"
        return Outcome(Status.WARN, summary, details)
    unsupported = [c["mode"] for c in cases if c["verdict"] == "unsupported"]
    summary = f"GEMMs match fp64 within tolerance on {ctx.device} ({worst})"
    if unsupported:
        summary += f"; not supported by this build: {', '.join(sorted(set(unsupported)))}"
    return Outcome(Status.PASS, summary, details)
