"""The `shape-sync` probe: what shape values passed as device tensors really cost.

Field note 000 blames `int(N_t * N_h * N_w)` on device tensors for a "misaligned address" under
FP8/FP4. What can be measured is narrower: arithmetic on 0-d device tensors launches tiny kernels,
and `int()` copies the result to the host, which synchronises with the device. A sync cannot cause a
misaligned address; it is where an earlier asynchronous error (from an FP8 kernel, say) gets
reported, so the traceback names the `int()` line. This probe measures three ways to compute the
token count: the note's original (tensor arithmetic, then `int`), the note's fix (`int` on each
tensor, then Python arithmetic: one sync per value, more than the original) and plain Python ints
(what the caller should pass: `x.shape[i]` already is one). It counts tensor operations and host
conversions with a TorchFunctionMode, counts CUDA syncs with `torch.cuda.set_sync_debug_mode("warn")`,
and times each variant, on CUDA also behind a queue of real work, where a sync waits for all of it.

The measurement is information, not a finding: `int()` on a device tensor always syncs, on every
healthy GPU, so the probe passes. It fails only when shape arithmetic gives wrong values. The
verdict and the summary come from counts (ops, conversions, syncs), which are the same on an idle
and on a loaded machine; the timings are details only, for the reader.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

from gpudoctor.probes.base import Outcome, ProbeContext, ProbeSpec, Status, counted

SPEC = ProbeSpec(
    id="shape-sync",
    title="Shape values as device tensors: syncs and their cost",
    timeout_s=60.0,
    emits=(),
    needs=("torch",),
    gpu_memory_mib=128,
    description=(
        "Counts the tensor ops, host conversions and CUDA syncs that shape arithmetic on device "
        "tensors causes, against plain Python ints, and times them."
    ),
)

SHAPE = (7, 96, 96)  # (N_t, N_h, N_w) of the field note, scaled down
SYNC_WARNING = "called a synchronizing CUDA operation"
HOST_CONVERSIONS = frozenset({"__int__", "__index__", "__float__", "__bool__", "item", "tolist"})
BUSY_SIZE, BUSY_MATMULS = 2048, 8  # the queued work on CUDA: a few milliseconds on any recent GPU


def tensor_arithmetic(n_t: Any, n_h: Any, n_w: Any) -> int:
    """Field note 000, before: arithmetic on the tensors, one conversion at the end."""
    return int(n_t * n_h * n_w)


def int_each(n_t: Any, n_h: Any, n_w: Any) -> int:
    """Field note 000, after: one conversion per value, then Python arithmetic."""
    return int(n_t) * int(n_h) * int(n_w)


def python_ints(n_t: int, n_h: int, n_w: int) -> int:
    """What the caller should pass in the first place."""
    return n_t * n_h * n_w


VARIANTS: tuple[tuple[str, Callable[..., int], bool], ...] = (
    ("tensor-arithmetic", tensor_arithmetic, True),
    ("int-each", int_each, True),
    ("python-ints", python_ints, False),
)


def count_calls(torch: Any, fn: Callable[[], Any]) -> dict[str, Any]:
    """Run `fn` under a TorchFunctionMode; return the torch calls it made, split into tensor
    operations (kernels on the device) and host conversions (a device-to-host copy on CUDA)."""
    from torch.overrides import TorchFunctionMode

    names: list[str] = []

    class _Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with _Count():
        fn()
    host = [n for n in names if n in HOST_CONVERSIONS]
    return {"calls": names, "tensor_ops": len(names) - len(host), "host_conversions": len(host)}


def count_syncs(torch: Any, fn: Callable[[], Any]) -> int:
    """CUDA syncs `fn` causes, from the sync debug mode's warnings; the previous mode is restored."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum(SYNC_WARNING in str(w.message) for w in caught)


def _time_per_call_us(fn: Callable[[], Any], calls: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def _blocked_ms(torch: Any, device: str, fn: Callable[[], Any]) -> float:
    """Host time of one call made right after queueing a few milliseconds of matmuls."""
    a = torch.randn(BUSY_SIZE, BUSY_SIZE, device=device)
    torch.cuda.synchronize(device)
    out = a
    for _ in range(BUSY_MATMULS):
        out = a @ a
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize(device)
    del a, out
    return elapsed * 1e3


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    cuda = ctx.is_cuda
    as_tensors = tuple(torch.tensor(v, device=ctx.device) for v in SHAPE)
    expected = SHAPE[0] * SHAPE[1] * SHAPE[2]
    # Timings are details only (see the docstring): a few hundred calls give a stable best-of-3.
    calls = 200

    variants: dict[str, dict[str, Any]] = {}
    for name, fn, on_tensors in VARIANTS:
        args = as_tensors if on_tensors else SHAPE

        def call(fn=fn, args=args) -> int:
            return fn(*args)

        value = call()
        entry = count_calls(torch, call)
        entry.update(value=value, correct=value == expected, per_call_us=_time_per_call_us(call, calls))
        if cuda:
            entry["syncs"] = count_syncs(torch, call)
            entry["blocked_behind_queue_ms"] = _blocked_ms(torch, ctx.device, call)
        variants[name] = entry
    del as_tensors
    ctx.sync()

    base = variants["python-ints"]
    worst_name = max(("tensor-arithmetic", "int-each"), key=lambda n: variants[n]["per_call_us"])
    extra_us = variants[worst_name]["per_call_us"] - base["per_call_us"]
    details: dict[str, Any] = {
        "device": ctx.device,
        "shape": list(SHAPE),
        "variants": variants,
        "extra_us_per_call": extra_us,
        "note": (
            "shape arithmetic on device tensors forces device-to-host syncs; it cannot itself cause "
            "a misaligned address, but an earlier asynchronous kernel error surfaces at the first "
            "sync, so the traceback points at the int() line. Converting each value first (the "
            "fix often suggested) makes one sync per value; passing Python ints (x.shape[i]) makes none"
        ),
    }
    if not all(v["correct"] for v in variants.values()):
        wrong = [n for n, v in variants.items() if not v["correct"]]
        return Outcome(Status.FAIL, f"shape arithmetic gave wrong values: {', '.join(wrong)}",
                       details)

    syncs = {n: v.get("syncs", 0) for n, v in variants.items()}
    # Counts only: the summary must read the same on an idle and on a loaded machine.
    arith, each = variants["tensor-arithmetic"], variants["int-each"]

    def synced(name: str) -> str:
        return f" ({counted(syncs[name], 'GPU sync')})" if cuda else ""

    numbers = (
        f"multiplying them takes {counted(arith['tensor_ops'], 'tensor operation')} and "
        f"{counted(arith['host_conversions'], 'conversion')} to int{synced('tensor-arithmetic')}; "
        f"calling int() on each first takes {counted(each['host_conversions'], 'conversion')}"
        f"{synced('int-each')}; plain Python ints (x.shape[i]) take "
        f"{counted(base['tensor_ops'] + base['host_conversions'], 'torch call')}{synced('python-ints')}"
    )
    details["timing"] = (
        f"per call: tensor arithmetic {variants['tensor-arithmetic']['per_call_us']:.1f} us, int each "
        f"{variants['int-each']['per_call_us']:.1f} us, python ints {base['per_call_us']:.2f} us "
        "(best of 3; machine load changes these, never the verdict)"
    )
    details["fix"] = ("pass Python ints for shapes (x.shape[i] already is one); a traceback that "
                      "ends at such an int() line reports an earlier asynchronous kernel error")
    if cuda:
        details["blocked_behind_queue"] = (
            "behind queued work one call blocks the host "
            f"{variants['tensor-arithmetic']['blocked_behind_queue_ms']:.2f} ms (tensor arithmetic), "
            f"{variants['int-each']['blocked_behind_queue_ms']:.2f} ms (int each) vs "
            f"{base['blocked_behind_queue_ms']:.3f} ms (python ints)"
        )
    # Always the same on a healthy device (int() on a device tensor syncs by definition): a
    # measurement for the reader, not something wrong with this machine.
    return Outcome(Status.PASS, f"a token count from shape values held as {ctx.device} tensors: {numbers}",
                   details)
