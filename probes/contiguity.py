"""Probe `contiguity`: the non-contiguous-tensor pitfalls, demonstrated on the device under test.

Two things go wrong in user code once a tensor has been transposed or permuted (seed 003):

- `.view` refuses a layout it cannot express as strides and tells the user to call `.reshape`
  (knowledge base `view-stride`);
- an extension that reads `t.data_ptr()` as a dense row-major buffer (`(half*)t.data_ptr()` in a
  C++/CUDA kernel) silently reads the storage in memory order, not the tensor's logical order
  (`noncontiguous-kernel-input`); `.contiguous()` is the fix.

These are pitfalls of user code, not faults of the install, so the probe passes when torch behaves
as documented and records what it demonstrated (exact error text, shapes, strides, numbers). It
fails only when torch itself misbehaves: `.view` silently accepting an impossible layout, `.reshape`
or `.contiguous()` giving wrong numbers, or a contiguous copy whose storage is not in logical order.
"""
from __future__ import annotations

import ctypes
from typing import Any

from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, error_text

SPEC = ProbeSpec(
    id="contiguity",
    title="Non-contiguous tensors: .view after transpose, raw data_ptr readers",
    timeout_s=30.0,
    emits=("view-stride", "noncontiguous-kernel-input"),
    needs=("torch",),
    gpu_memory_mib=16,
    description=(
        "Shows that .view on a transposed tensor raises torch's stride error while .reshape and "
        ".contiguous().view give the right numbers, and that an extension-style reader of "
        "data_ptr() sees a transposed tensor in memory order, unlike its .contiguous() copy."
    ),
)

# torch's text for an impossible `.view`, as raised by 2.x (checked on 2.13); the knowledge base
# matches on it, so the probe records whether this build still says exactly that.
VIEW_ERROR = (
    "view size is not compatible with input tensor's size and stride (at least one dimension "
    "spans across two contiguous subspaces). Use .reshape(...) instead."
)

# Attention-shaped tensors, small: (batch, seq, heads, head_dim) as flash_attn wants them.
_B, _N, _H, _D = 2, 8, 4, 16


def _shape(t: Any) -> list[int]:
    return [int(s) for s in t.shape]


def _strides(t: Any) -> list[int]:
    return [int(s) for s in t.stride()]


def read_raw(torch: Any, t: Any, n: int) -> Any:
    """Read the first `n` elements at `t.data_ptr()` in memory order, as a C++/CUDA extension
    that casts `data_ptr()` to a plain pointer does; returns a CPU float32 tensor.

    On the CPU this really dereferences the pointer through ctypes. Elsewhere the raw storage is
    reinterpreted as a dense vector with `as_strided` (the same bytes a kernel would load) and
    copied to the host."""
    if t.dtype != torch.float32:
        raise TypeError(f"read_raw reads float32 only, got {t.dtype}")
    if t.device.type == "cpu":
        buf = (ctypes.c_float * n).from_address(t.data_ptr())
        return torch.tensor(list(buf), dtype=torch.float32)
    return torch.as_strided(t, (n,), (1,)).to("cpu", copy=True)


def _view_cases(torch: Any, device: str) -> tuple[list[dict[str, Any]], list[ProbeFinding]]:
    """`.view` on transposed / permuted attention tensors, then the two documented fixes."""
    cases: list[dict[str, Any]] = []
    findings: list[ProbeFinding] = []
    base = torch.arange(_B * _N * _H * _D, dtype=torch.float32).reshape(_B, _N, _H, _D)
    x = base.to(device)
    layouts = {
        # The seed's flash_attn <-> (B, H, N, D) shuffle.
        "transpose(1, 2)": (lambda t: t.transpose(1, 2), (_B, _H, _N * _D)),
        "permute(0, 2, 3, 1)": (lambda t: t.permute(0, 2, 3, 1), (_B, _H, _D * _N)),
    }
    for name, (make, target) in layouts.items():
        y = make(x)
        case: dict[str, Any] = {
            "case": f"view after {name}",
            "kb_id": "view-stride",
            "shape": _shape(y),
            "stride": _strides(y),
            "is_contiguous": bool(y.is_contiguous()),
            "view_to": list(target),
        }
        # The truth without reshape/view: the logical elements in row-major order, assembled by
        # indexing the CPU reference one row at a time.
        y_cpu = make(base)
        expected = _rowmajor(torch, y_cpu).reshape(target)
        try:
            viewed = y.view(target)
        except RuntimeError as exc:
            message = str(exc)
            case["raised"] = error_text(exc)
            case["message_is_known_text"] = VIEW_ERROR in message
        else:
            wrong = not torch.equal(viewed.to("cpu"), expected)
            case["raised"] = None
            case["view_numbers_wrong"] = wrong
            findings.append(
                ProbeFinding(
                    kb_id="view-stride",
                    summary=f".view{tuple(target)} on a non-contiguous tensor ({name}) did not raise"
                    + (" and returned wrong numbers" if wrong else ""),
                    evidence=(f"shape={_shape(y)} stride={_strides(y)}", f"device={device}"),
                )
            )
        for key, fix_name, fix in (
            ("reshape", ".reshape", lambda t: t.reshape(target)),
            ("contiguous_view", ".contiguous().view", lambda t: t.contiguous().view(target)),
        ):
            try:
                got = fix(y).to("cpu")
                ok = torch.equal(got, expected)
                case[f"{key}_ok"] = ok
            except RuntimeError as exc:
                ok = False
                case[f"{key}_ok"] = False
                case[f"{key}_error"] = error_text(exc)
            if not ok:
                findings.append(
                    ProbeFinding(
                        kb_id="view-stride",
                        summary=f"{fix_name} of a {name} tensor gave wrong numbers on {device}",
                        evidence=(
                            f"shape={_shape(y)} stride={_strides(y)} -> {list(target)}",
                            case.get(f"{key}_error", "values differ from the row-major reference"),
                        ),
                    )
                )
        cases.append(case)
    return cases, findings


def _rowmajor(torch: Any, t: Any) -> Any:
    """The logical elements of a CPU tensor in row-major order, taken through `tolist()` (no
    view, reshape or contiguous involved), so that it can judge those functions."""
    flat: list[float] = []
    stack = [t.tolist()]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    return torch.tensor(flat, dtype=t.dtype)


def _raw_reader_case(torch: Any, device: str) -> tuple[dict[str, Any], list[ProbeFinding]]:
    """An extension-style reader fed a transposed tensor vs its `.contiguous()` copy."""
    findings: list[ProbeFinding] = []
    rows, cols = 6, 10
    # Fresh, distinct, non-zero values: a reader that returns stale memory or zeros cannot agree.
    src = torch.randn(rows, cols, dtype=torch.float32) + 3.0
    t = src.to(device).t()  # logical (cols, rows), memory still (rows, cols)
    logical = _rowmajor(torch, src.t())
    n = rows * cols
    raw_t = read_raw(torch, t, n)
    c = t.contiguous()
    raw_c = read_raw(torch, c, n)
    memory_order = src.reshape(-1)
    case: dict[str, Any] = {
        "case": "raw data_ptr reader on a transposed tensor",
        "kb_id": "noncontiguous-kernel-input",
        "reader": "ctypes" if t.device.type == "cpu" else "as_strided",
        "shape": _shape(t),
        "stride": _strides(t),
        "contiguous_stride": _strides(c),
        "transposed_reads_memory_order": bool(torch.equal(raw_t, memory_order)),
        "transposed_max_abs_diff_vs_logical": float((raw_t - logical).abs().max()),
        "contiguous_copy_reads_logical_order": bool(torch.equal(raw_c, logical)),
        "contiguous_shares_storage": int(c.data_ptr()) == int(t.data_ptr()),
    }
    if not case["transposed_reads_memory_order"]:
        findings.append(
            ProbeFinding(
                kb_id="noncontiguous-kernel-input",
                summary=f"data_ptr() of a transposed tensor does not hold its base's memory on {device}",
                evidence=(f"shape={_shape(t)} stride={_strides(t)}",),
            )
        )
    if not case["contiguous_copy_reads_logical_order"] or case["contiguous_shares_storage"]:
        findings.append(
            ProbeFinding(
                kb_id="noncontiguous-kernel-input",
                summary=f".contiguous() of a transposed tensor is not a row-major copy on {device}",
                evidence=(
                    f"shape={_shape(t)} stride={_strides(t)} contiguous stride={_strides(c)}",
                    f"shares storage={case['contiguous_shares_storage']}",
                ),
            )
        )
    return case, findings


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    view_cases, findings = _view_cases(torch, ctx.device)
    raw_case, raw_findings = _raw_reader_case(torch, ctx.device)
    findings += raw_findings
    ctx.sync()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    details = {"device": ctx.device, "cases": view_cases + [raw_case]}
    if findings:
        return Outcome(
            Status.FAIL,
            f"torch mishandles non-contiguous tensors on {ctx.device}: {findings[0].summary}",
            details,
            findings,
        )
    raised = sum(1 for c in view_cases if c.get("raised"))
    return Outcome(
        Status.PASS,
        f".view on transposed tensors raises as documented ({raised}/{len(view_cases)}), reshape and "
        f".contiguous() give the right numbers; a raw data_ptr reader sees memory order "
        f"(max diff {raw_case['transposed_max_abs_diff_vs_logical']:.3g} vs logical order)",
        details,
    )
