"""Shared pieces of the attention probes: capturing what a kernel says when it refuses, comparing
outputs against a reference, and classifying the error texts attention kernels raise.

Worker-side code: standard library only; torch arrives as an argument, never imported here.
"""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from gpudoctor.probes.base import counted, error_text

# TORCH_WARN appends the C++ location; it differs between builds and says nothing to a user.
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")

# Per-dtype absolute tolerances for outputs whose magnitude is about 1 (attention over randn values
# is a convex combination of them). Low-precision kernels accumulate in fp32 but round inputs and
# outputs; backward sums over the sequence, so it gets a looser bound.
FWD_TOL = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-4, "float64": 1e-8}
BWD_TOL = {"float16": 4e-2, "bfloat16": 1.5e-1, "float32": 5e-4, "float64": 1e-7}


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def clean_message(text: str) -> str:
    """A warning or error text without the build-specific C++ location TORCH_WARN appends."""
    return _TRIGGERED.sub("", str(text)).strip()


@dataclass
class Captured:
    """Everything a call said besides its return value: warnings, log records, stderr."""

    warnings: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    stderr: str = ""

    @property
    def texts(self) -> list[str]:
        return [*self.warnings, *self.logs, *([self.stderr] if self.stderr.strip() else [])]


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


@contextlib.contextmanager
def capture(loggers: tuple[str, ...] = (), stderr: bool = False) -> Iterator[Captured]:
    """Record warnings (each one, not once per location), records of the named loggers and,
    optionally, Python-level stderr, so that a refusal's reasons become evidence."""
    got = Captured()
    handler = _ListHandler(got.logs)
    attached = [logging.getLogger(name) for name in loggers]
    for logger in attached:
        logger.addHandler(handler)
    buffer = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            with contextlib.redirect_stderr(buffer) if stderr else contextlib.nullcontext():
                yield got
    finally:
        for logger in attached:
            logger.removeHandler(handler)
        got.warnings.extend(clean_message(r.message) for r in records)
        got.categories.extend(r.category.__name__ for r in records)
        got.stderr = buffer.getvalue()


def refusal_reasons(messages: list[str]) -> list[str]:
    """The reasons out of SDPA's refusal warnings. The CPU path warns the header ("Flash attention
    kernel not used because:") and each reason separately; CUDA builds may join them."""
    reasons = []
    for text in messages:
        text = clean_message(text)
        if not text or "numpy" in text.lower():
            continue
        head, sep, rest = text.partition("not used because:")
        if sep and not rest.strip():
            continue
        reasons.append(rest.strip() if sep else text)
    return reasons


def max_abs_error(torch: Any, out: Any, ref: Any) -> float:
    """Largest elementwise difference in fp64; NaN or inf anywhere counts as infinitely wrong.
    On CUDA this reads the result back to the host: it is where an asynchronous kernel fault
    surfaces, so callers keep it inside their `try`."""
    diff = (out.detach().double() - ref.detach().double()).abs()
    if not diff.numel():
        return 0.0
    # max() propagates NaN and keeps inf: one reduction says both "how wrong" and "not finite".
    worst = float(diff.max().item())
    return worst if math.isfinite(worst) else float("inf")


def backward(out: Any, grad: Any) -> None:
    """out.backward(grad), computed as (out * grad).sum().backward(): the same gradients, but
    torch's explicit-gradient path imports sympy on first use (~0.3 s of a scan)."""
    (out * grad).sum().backward()


@contextlib.contextmanager
def cpu_threads(torch: Any, device: str, threads: int = 1) -> Iterator[None]:
    """Run the block with `threads` intra-op threads on the CPU (restored afterwards; a no-op on
    other devices). The probes' CPU tensors are tiny: waking a thread pool for each of hundreds of
    small ops costs more than it saves (sdpa-backends: 0.19 s with 2 threads, 0.12 s with one,
    measured on this project's 2-core machine), and a loaded machine makes it worse. The
    numbers checked do not depend on it."""
    if str(device).startswith("cuda") or not hasattr(torch, "get_num_threads"):
        yield
        return
    before = torch.get_num_threads()
    if before <= threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def free(torch: Any, device: str, poisoned: bool | str | None = False) -> str | None:
    """Return what the probe held: collect cycles and give cached CUDA blocks back. Only the young
    generations: the probe's own objects are there, and a full collection after `import torch`
    walks every module's objects (~80 ms a call).

    After a sticky CUDA error `empty_cache()` raises it again (the caching allocator's `cudaFree`
    returns it), which would turn a probe's measured matrix into a crash: it is skipped when the
    caller knows the context is poisoned, and any error it raises is returned, never raised."""
    gc.collect(1)
    if poisoned or not str(device).startswith("cuda"):
        return None
    try:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - a poisoned context: the caller's result stands
        return error_text(exc)
    return None


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


# Texts every attention probe may meet, most specific first. The knowledge base's matcher is the
# authority for `explain`; this short list lets a probe name its finding without importing it.
_KERNEL_ERRORS: tuple[tuple[str, str], ...] = (
    ("no kernel image is available", "no-kernel-image"),
    ("misaligned address", "misaligned-address"),
    ("illegal memory access", "illegal-memory-access"),
    ("device-side assert", "device-side-assert"),
    ("out of memory", "cuda-oom"),
    ("no available kernel", "sdpa-no-kernel"),
)


# What classify_kernel_error may return: every probe using it lists these in its SPEC.emits.
KERNEL_ERROR_IDS = tuple(dict.fromkeys(kb for _, kb in _KERNEL_ERRORS))


def classify_kernel_error(text: str) -> str | None:
    """The knowledge-base id for a generic CUDA/SDPA failure text, or None."""
    low = text.lower()
    for needle, kb_id in _KERNEL_ERRORS:
        if needle in low:
            return kb_id
    return None


def reference_attention(torch: Any, q: Any, k: Any, v: Any, *, causal: bool = False,
                        attn_mask: Any = None) -> Any:
    """Attention written out in fp64 (B, H, N, D), independent of every SDPA backend, so that a
    backend is never checked against itself. Key/value heads are repeated for GQA. fp64, not fp32:
    fp32 matmuls follow TF32 overrides (NVIDIA_TF32_OVERRIDE=1, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)
    and would turn an accurate fp32 kernel into a mismatch against a TF32 reference."""
    q, k, v = q.double(), k.double(), v.double()
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        n, m = scores.shape[-2], scores.shape[-1]
        keep = torch.ones(n, m, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.double()
    return scores.softmax(dim=-1) @ v


def forced_sentence(ok: int, refused: int, mismatch: int, error: int) -> str:
    """What forcing each backend (or operator) in turn gave, in words: `39 of 84 runs match the
    reference, 45 are declined as unsupported for their input, no wrong results, no errors`."""
    total = ok + refused + mismatch + error
    parts = [f"{ok} of {counted(total, 'run')} {'matches' if ok == 1 else 'match'} the reference"]
    if refused:
        parts.append(f"{refused} {'is' if refused == 1 else 'are'} declined as unsupported for "
                     f"{'its' if refused == 1 else 'their'} input")
    parts += [counted(mismatch, "wrong result"), counted(error, "error")]
    return ", ".join(parts)


def measure_cell(torch: Any, device: str, cell: dict[str, Any], forward: Callable[[], Any], grad: Any,
                 leaves: list[Any], reference: Callable[[], tuple[Any, list[Any]]], with_backward: bool,
                 refused: Callable[[str], bool]) -> dict[str, Any]:
    """One attention kernel on one cell in (B, N, H, D) against the fp64 reference in SDPA's
    (B, H, N, D) (`reference()`: it and its leaves): forward, backward (`with_backward`), a
    synchronize on CUDA, then the comparison, all inside the `try`, since reading the result back
    is where an asynchronous fault surfaces. `cell` gets the errors and a status (ok, mismatch),
    or the stage that failed, its text and refused / error."""
    dname = cell["dtype"]
    stage = "forward"
    try:
        out = forward()
        if with_backward:
            stage = "backward"
            backward(out, grad)
        if str(device).startswith("cuda"):
            stage = "synchronize"
            torch.cuda.synchronize(device)
        stage = "compare"
        ref, ref_leaves = reference()
        cell["fwd_err"] = max_abs_error(torch, out, ref.transpose(1, 2))
        cell["bwd_err"] = 0.0
        if with_backward:
            backward(ref, grad.double().transpose(1, 2))
            cell["bwd_err"] = max(max_abs_error(torch, x.grad, r.grad.transpose(1, 2))
                                  for x, r in zip(leaves, ref_leaves))
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        text = error_text(exc)
        cell.update(status="refused" if refused(text) else "error", stage=stage, text=text)
        return cell
    ok = cell["fwd_err"] <= FWD_TOL[dname] and cell["bwd_err"] <= BWD_TOL[dname]
    cell["status"] = "ok" if ok else "mismatch"
    return cell
