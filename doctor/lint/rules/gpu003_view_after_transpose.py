"""GPU003 (view-after-transpose): .view() merges dimensions of a transposed, permuted or SDPA-output tensor.

Its documentation (what `gpudoctor explain GPU003` prints, and its row in docs/lint.md) and its
prefilter, as data; and the finding it makes of a view the dataflow of gpudoctor.lint.pyflow
reports (`finding_for`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudoctor.lint.model import SAFE, Edit, Finding, Fix
from gpudoctor.lint.pysource import PySource, finding, short
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyvalues import ViewEvent

# GPU003: something that makes a tensor non-contiguous (`.T`, not `.Tensor`).
NONCONTIGUOUS = (rb"\.(?:transpose|permute|swapaxes|swapdims)\(|\.mT\b|\.t\(\)|\.T\b|scaled_dot_product_attention"
                 rb"|rearrange\(")

RULE = Rule(
    code="GPU003",
    name="view-after-transpose",
    kb_id="view-stride",
    title=".view() merges dimensions of a transposed, permuted or SDPA-output tensor",
    kinds=(PYTHON,),
    prefilter=((b".view(",), (b"transpose", b"permute", b"swap", b".mT", b".t()", b".T", b"scaled_dot_product_attention",
                              b"rearrange")),
    pattern=NONCONTIGUOUS,
    what=(
        "x.view(...) where x is, in the same function, the result of transpose / permute / .t() / "
        ".mT / .T or of F.scaled_dot_product_attention (or a value derived from one of those "
        "without a copy), and the view merges dimensions whose memory is not adjacent. The linter "
        "follows names through the function (reassignment and .contiguous() end the tracking) and "
        "matches the view's sizes against the tensor's symbolic shape to tell merging from splitting. "
        "A parameter transposed here counts too: y.transpose(1, 2).view(y.size(0), -1) merges the two "
        "swapped dimensions whatever y's rank; .t(), comparisons (eq) and basic slices keep a "
        "tensor's layout (pred.t().eq(target)[:k].view(-1))."
    ),
    why=(
        "view() never copies, so it can only merge dimensions that are adjacent in memory; after a "
        "transpose they are not, and view raises 'view size is not compatible with input tensor's "
        "size and stride'. SDPA's output layout depends on the backend: the memory-efficient and "
        "flash kernels return (B, H, N, D) tensors laid out as (B, N, H, D), the math kernel (CPU) a "
        "contiguous one, so a view that works on one machine fails on another."
    ),
    example="out = (attn @ v).transpose(1, 2).view(B, N, C)",
    fix="out = (attn @ v).transpose(1, 2).reshape(B, N, C)   # or .contiguous().view(B, N, C)",
    fix_safety=(
        "safe: reshape returns the same values, as a view when one is possible (so it never copies "
        "where view would have worked) and a copy otherwise. If the code writes through the result "
        "expecting to modify the original tensor, that never worked here (view raised), so there is "
        "nothing to keep."
    ),
    near_misses=(
        "A view that only splits a dimension (x.transpose(1, 2).view(B, N, H, 2, D // 2)), a view "
        "that merges dimensions still adjacent in memory (x.permute(0, 2, 3, 1).view(B, H * W, C)), "
        "a view after .contiguous() or after reassigning the name, x.view(dtype), and views of "
        "tensors whose origin the linter cannot see do not fire."
    ),
)


def finding_for(src: PySource, ev: ViewEvent) -> Finding | None:
    func = ev.call.func
    if not isinstance(func, ast.Attribute):
        return None
    end = src.offset(func.end_lineno, func.end_col_offset)  # type: ignore[arg-type]
    start = end - len("view")
    if src.text[start:end] != "view":
        return None
    line = func.end_lineno
    byte_col = func.end_col_offset - len("view")  # type: ignore[operator]
    where = f"line {ev.origin.lineno}"  # type: ignore[attr-defined]
    if ev.origin_kind == "sdpa":
        what = (f"the scaled_dot_product_attention output ({where}), whose layout depends on the backend "
                f"(memory-efficient and flash return (B, N, H, D) memory, math a contiguous tensor)")
    elif ev.origin_kind == "rearrange":
        what = f"a tensor that einops.rearrange ({where}) permuted without copying"
    else:
        what = f"a tensor made non-contiguous by {short(src, ev.origin, 40)} ({where})"
    message = (f".view() merges dimensions of {what}; view cannot merge dimensions that are not adjacent "
               f"in memory ('view size is not compatible with input tensor's size and stride'): use .reshape()")
    fix = Fix(SAFE, "replace .view( with .reshape(", (Edit(start, end, "reshape"),))
    f = finding(src, ev.call, "GPU003", message, fix, line=line, byte_col=byte_col)
    return f
