"""Probe `device-conformance`: a micro-suite that holds the device under test to the CPU's answers.

Written for people who build custom device backends (PrivateUse1) or allocators (seed 004: a
backend whose allocator was blamed for `masked_fill_` failures on attention masks). Every check
runs the same small workload on `ctx.device` and on the CPU and compares exactly:

- allocation of odd sizes (1..4097 bytes, many dtypes), values round-tripped and filled on the
  device, neighbouring allocations that must not overlap, and the `data_ptr` alignment observed
  (the CPU allocator aligns to 64 bytes, c10's gAlignment; CUDA's caching allocator hands out
  512-byte blocks; plain malloc gives 16);
- zero-size tensors;
- non-contiguous copies both ways (transposed, sliced, strided, offset, expanded views);
- `masked_fill_` with attention masks, and causal-mask construction as the seed wrote it;
- a few hundred alloc/free cycles, values checked each time, memory back to baseline on CUDA.

Every transfer and allocation goes through the small functions `empty`, `to_device` and `to_cpu`,
so that tests can inject a faulty "device" by replacing one of them. Any difference is a
`custom-allocator` finding naming the check that failed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, error_text

SPEC = ProbeSpec(
    id="device-conformance",
    title="Device backend conformance: allocation, alignment, strided copies, masks",
    timeout_s=60.0,
    emits=("custom-allocator",),
    needs=("torch",),
    gpu_memory_mib=64,
    description=(
        "Runs allocation, alignment, zero-size, non-contiguous copy, masked_fill_ and causal-mask "
        "checks on the device and compares them with the CPU; for custom backends and allocators."
    ),
)

# Sizes in bytes around the usual rounding boundaries, up to 4097 (one past a page).
BYTE_SIZES = (1, 2, 3, 7, 15, 17, 63, 64, 65, 127, 129, 255, 511, 513, 1023, 1025, 4095, 4096, 4097)

ALLOC_CYCLES = 300


# --- the seams: every device allocation and transfer goes through these ------------------------


def empty(torch: Any, shape: tuple[int, ...], dtype: Any, device: str) -> Any:
    """A fresh allocation on the device."""
    return torch.empty(shape, dtype=dtype, device=device)


def to_device(t: Any, device: str) -> Any:
    """Host -> device copy. `copy=True` keeps a real copy even when the device is the CPU, and
    keeps the source's strides (preserve_format), so the strided copy path is what runs."""
    return t.to(device, copy=True)


def to_cpu(t: Any) -> Any:
    """Device -> host copy, strides preserved as above."""
    return t.to("cpu", copy=True)


# --- checks --------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def expect(self, condition: bool, problem: str) -> None:
        if not condition:
            self.ok = False
            if len(self.problems) < 8:  # the evidence stays readable
                self.problems.append(problem)


def _pattern(torch: Any, numel: int, dtype: Any) -> Any:
    """Distinct, non-zero, exactly representable values (a device that returns zeros or stale
    memory cannot match)."""
    values = torch.arange(1, numel + 1, dtype=torch.int64)
    if dtype == torch.bool:
        return values % 3 != 0
    if dtype.is_floating_point:
        limit = 256 if dtype in (torch.float16, torch.bfloat16) else 1 << 20  # exact in 8/11 bits
        return ((values % limit) + 1).to(dtype)
    info = torch.iinfo(dtype)
    return (values % min(info.max, 1 << 20) + 1).to(dtype)


def _dtypes(torch: Any) -> list[Any]:
    return [torch.bool, torch.uint8, torch.int16, torch.int32, torch.int64,
            torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _alignment(ptr: int) -> int:
    """The largest power of two dividing the address (capped at 4096)."""
    if ptr == 0:
        return 4096
    return min(ptr & -ptr, 4096)


def _same(torch: Any, got: Any, want: Any) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and bool(torch.equal(got, want))


def check_alloc_sizes(torch: Any, device: str) -> CheckResult:
    res = CheckResult("alloc-sizes")
    alignments: list[int] = []
    for dtype in _dtypes(torch):
        itemsize = torch.empty((), dtype=dtype).element_size()
        for nbytes in BYTE_SIZES:
            numel = max(1, nbytes // itemsize)
            want = _pattern(torch, numel, dtype)
            d = empty(torch, (numel,), dtype, device)
            alignments.append(_alignment(int(d.data_ptr())))
            d.copy_(to_device(want, device))
            res.expect(_same(torch, to_cpu(d), want), f"{dtype} numel={numel}: round trip differs")
            # Write the last element on the device: an allocation that is too short shows here.
            d[-1] = want[0]
            tail = to_cpu(d)
            res.expect(bool(tail[-1] == want[0]) and _same(torch, tail[:-1], want[:-1]),
                       f"{dtype} numel={numel}: last-element write differs")
            fill = True if dtype == torch.bool else 7
            res.expect(_same(torch, to_cpu(empty(torch, (numel,), dtype, device).fill_(fill)),
                             torch.full((numel,), fill, dtype=dtype)),
                       f"{dtype} numel={numel}: fill_ differs")
            del d
    res.data["min_alignment_bytes"] = min(alignments)
    return res


def check_alignment(torch: Any, device: str, observed: int | None) -> CheckResult:
    """Judges the minimum data_ptr alignment seen by check_alloc_sizes."""
    res = CheckResult("alignment")
    kind = torch.device(device).type
    # What torch's own allocators guarantee; custom backends are held to 16 bytes (what plain
    # malloc gives and what vectorised 128-bit loads need).
    required = {"cpu": 64, "cuda": 256}.get(kind, 16)
    res.data.update(observed_bytes=observed, required_bytes=required)
    if observed is None:
        res.expect(False, "no allocation was observed (alloc-sizes failed before allocating)")
    else:
        res.expect(observed >= required,
                   f"fresh allocations only {observed}-byte aligned on {device}; {kind} needs {required}")
    return res


def check_alloc_overlap(torch: Any, device: str) -> CheckResult:
    """Many odd-sized live allocations, each filled with its own value: none may clobber another."""
    res = CheckResult("alloc-overlap")
    live = []
    for i, nbytes in enumerate(BYTE_SIZES * 2):
        t = empty(torch, (max(1, nbytes // 4),), torch.int32, device)
        live.append(t)
        t.fill_(i + 1)
    for i, t in enumerate(live):
        got = to_cpu(t)
        res.expect(bool((got == i + 1).all()), f"allocation {i} ({t.numel()} x int32) was overwritten")
    spans = sorted((int(t.data_ptr()), int(t.data_ptr()) + t.numel() * 4) for t in live)
    overlaps = sum(1 for (a0, a1), (b0, _) in zip(spans, spans[1:]) if b0 < a1)
    res.data["overlapping_pointer_ranges"] = overlaps
    res.expect(overlaps == 0, f"{overlaps} live allocations share address ranges")
    return res


def check_zero_size(torch: Any, device: str) -> CheckResult:
    res = CheckResult("zero-size")
    for shape in ((0,), (0, 4), (3, 0), (2, 0, 5)):
        host = torch.empty(shape, dtype=torch.float32)
        d = to_device(host, device)
        res.expect(tuple(d.shape) == shape and d.numel() == 0, f"{shape}: device tensor has shape {tuple(d.shape)}")
        back = to_cpu(d)
        res.expect(tuple(back.shape) == shape, f"{shape}: round trip gives shape {tuple(back.shape)}")
        res.expect(float(to_cpu(d.sum())) == 0.0, f"{shape}: sum of an empty tensor is not 0")
    base = to_device(torch.arange(1, 7, dtype=torch.float32), device)
    cat = to_cpu(torch.cat([base, empty(torch, (0,), torch.float32, device)]))
    res.expect(_same(torch, cat, torch.arange(1, 7, dtype=torch.float32)), "cat with an empty tensor differs")
    return res


def _views() -> dict[str, Callable[[Any], Any]]:
    return {
        "transpose": lambda t: t.transpose(0, 1),
        "column slice [:, 1::2]": lambda t: t[:, 1::2],
        "strided [::2, ::3]": lambda t: t[::2, ::3],
        "offset narrow [3:, 2:9]": lambda t: t[3:, 2:9],
        "permute 3d": lambda t: t.reshape(4, 6, 9).permute(2, 0, 1),
        "expand (stride 0)": lambda t: t[:1].expand(5, t.shape[1]),
        "transposed slice": lambda t: t.t()[1::3, :7],
    }


def _grid(torch: Any) -> Any:
    return torch.arange(1, 24 * 9 + 1, dtype=torch.float32).reshape(24, 9)


def check_noncontiguous_copy_to_cpu(torch: Any, device: str) -> CheckResult:
    """Views made on the device, copied to the host."""
    res = CheckResult("noncontiguous-copy-to-cpu")
    host = _grid(torch)
    d = to_device(host, device)
    for name, make in _views().items():
        view = make(d)
        want = make(host)
        got = to_cpu(view)
        res.expect(_same(torch, got, want),
                   f"{name}: shape={list(view.shape)} stride={list(view.stride())} "
                   f"offset={view.storage_offset()} differs after device->cpu")
    return res


def check_noncontiguous_copy_to_device(torch: Any, device: str) -> CheckResult:
    """Views made on the host, copied to the device, made contiguous there, copied back."""
    res = CheckResult("noncontiguous-copy-to-device")
    host = _grid(torch)
    for name, make in _views().items():
        view = make(host)
        d = to_device(view, device)
        got = to_cpu(d.contiguous())
        res.expect(_same(torch, got, view.contiguous()),
                   f"{name}: shape={list(view.shape)} stride={list(view.stride())} "
                   f"offset={view.storage_offset()} differs after cpu->device")
    return res


def check_masked_fill(torch: Any, device: str) -> CheckResult:
    res = CheckResult("masked-fill")
    b, h, n = 2, 3, 10
    scores = torch.arange(b * h * n * n, dtype=torch.float32).reshape(b, h, n, n) / 7
    lengths = torch.tensor([6, 10])
    pad = torch.arange(n)[None, :] >= lengths[:, None]  # (B, N) key padding, True = masked
    cases = {
        "key padding (B,1,1,N) -inf": lambda s, m: s.masked_fill_(m[:, None, None, :], float("-inf")),
        "bool mask on a transposed view": lambda s, m: s.transpose(-1, -2).masked_fill_(m[:, None, None, :], 0.0),
        "int64 attention_mask == 0": lambda s, m: s.masked_fill_((~m).long()[:, None, :, None] == 0, -1e4),
    }
    for name, apply in cases.items():
        want = scores.clone()
        apply(want, pad)
        got = to_device(scores, device)
        apply(got, to_device(pad, device))
        res.expect(_same(torch, to_cpu(got), want), f"{name}: masked_fill_ differs from the CPU")
    return res


def check_causal_mask(torch: Any, device: str) -> CheckResult:
    res = CheckResult("causal-mask")
    b, n = 1, 10

    def seed_mask(dev: str) -> Any:
        # Seed 004's construction, verbatim apart from the device.
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev))
        combined = torch.full((b, 1, n, n), float("-inf"), device=dev)
        return combined.masked_fill_(causal.unsqueeze(0).unsqueeze(0), 0.0)

    def triu_mask(dev: str) -> Any:
        return torch.triu(torch.full((n, n), float("-inf"), device=dev), diagonal=1)

    for name, make in (("tril + full(-inf).masked_fill_", seed_mask), ("triu(full(-inf), 1)", triu_mask)):
        want = make("cpu")
        got = to_cpu(make(device))
        res.expect(_same(torch, got, want), f"{name}: mask differs from the CPU")
    scores = torch.arange(n * n, dtype=torch.float32).reshape(1, 1, n, n) / 13
    want = torch.softmax(scores + seed_mask("cpu"), dim=-1)
    got = to_cpu(torch.softmax(to_device(scores, device) + seed_mask(device), dim=-1))
    res.expect(bool(torch.isfinite(got).all()), "softmax over the causal mask gives NaN/Inf")
    res.expect(got.shape == want.shape and bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6)),
               "softmax over the causal mask differs from the CPU")
    return res


def _memory_allocated(torch: Any, device: str) -> int | None:
    kind = torch.device(device).type
    backend = getattr(torch, kind, None)
    fn = getattr(backend, "memory_allocated", None) if kind != "cpu" else None
    try:
        return int(fn(device)) if fn else None
    except (RuntimeError, TypeError, AttributeError):
        return None


def check_alloc_free_cycles(torch: Any, device: str) -> CheckResult:
    res = CheckResult("alloc-free-cycles")
    before = _memory_allocated(torch, device)
    for i in range(ALLOC_CYCLES):
        numel = BYTE_SIZES[i % len(BYTE_SIZES)] + i  # never the same size twice in a row
        d = empty(torch, (numel,), torch.float32, device)
        d.fill_(float(i))
        d[numel // 2] = -1.0
        got = to_cpu(d)
        want = torch.full((numel,), float(i))
        want[numel // 2] = -1.0
        ok = _same(torch, got, want)
        res.expect(ok, f"cycle {i}: {numel} floats read back wrong")
        del d, got
    after = _memory_allocated(torch, device)
    res.data.update(cycles=ALLOC_CYCLES, memory_allocated_before=before, memory_allocated_after=after)
    if before is None:
        res.data["memory_check"] = f"skipped: no memory_allocated() counter for {device}"
    else:
        res.expect(after == before, f"memory_allocated went from {before} to {after} bytes after free")
    return res


CHECKS: tuple[Callable[[Any, str], CheckResult], ...] = (
    check_alloc_sizes,
    check_alloc_overlap,
    check_zero_size,
    check_noncontiguous_copy_to_cpu,
    check_noncontiguous_copy_to_device,
    check_masked_fill,
    check_causal_mask,
    check_alloc_free_cycles,
)


def check_name(check: Callable[..., CheckResult]) -> str:
    """The kebab-case name a check reports under: its function name without `check_`."""
    return check.__name__.removeprefix("check_").replace("_", "-")


def _run_check(check: Callable[..., CheckResult], ctx: ProbeContext, *args: Any) -> CheckResult:
    name = check_name(check)
    try:
        res = check(ctx.torch, ctx.device, *args)
        ctx.sync()
        return res
    except Exception as exc:  # noqa: BLE001 - an operator a backend lacks is a result, not a crash
        failed = CheckResult(name, ok=False)
        failed.problems.append(f"raised {error_text(exc)}")
        return failed


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    results = [_run_check(check, ctx) for check in CHECKS]
    sizes = results[0]
    results.insert(1, _run_check(check_alignment, ctx, sizes.data.get("min_alignment_bytes")))
    if ctx.is_cuda:
        torch.cuda.empty_cache()

    details = {
        "device": ctx.device,
        "reference": "cpu",
        "checks": [
            {"check": r.name, "ok": r.ok, "problems": list(r.problems), **r.data} for r in results
        ],
        "min_alignment_bytes": sizes.data.get("min_alignment_bytes"),
    }
    failed = [r for r in results if not r.ok]
    if not failed:
        return Outcome(
            Status.PASS,
            (f"all {len(results)} checks of tensor behaviour on {ctx.device} agree with the CPU"
             if ctx.device != "cpu" else f"all {len(results)} checks of tensor behaviour pass on the CPU")
            + f" (smallest data_ptr alignment {details['min_alignment_bytes']} bytes)",
            details,
        )
    findings = [
        ProbeFinding(
            kb_id="custom-allocator",
            summary=f"{r.name}: {ctx.device} differs from the CPU",
            evidence=tuple(r.problems),
        )
        for r in failed
    ]
    return Outcome(
        Status.FAIL,
        f"{len(failed)} of {len(results)} conformance checks fail on {ctx.device}: "
        + ", ".join(r.name for r in failed),
        details,
        findings,
    )
