"""GPU004 (shape-tensor-arithmetic): shape values held as tensors are used in arithmetic before int() / .tolist().

Its documentation (what `gpudoctor explain GPU004` prints, and its row in docs/lint.md) and its
prefilter, as data; and the findings it makes of the size tensors the dataflow of
gpudoctor.lint.pyflow reports (`tensor_finding`, `arg_finding`, called by gpudoctor.lint.pyrules
and gpudoctor.lint.valueflow).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudoctor.lint.model import DISPLAY_ONLY, UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, finding, short
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyvalues import ShapeArgEvent, ShapeTensorEvent

# GPU004: a tensor built from sizes.
SIZE_TENSOR = rb"ensor\([^\n]*(?:\.shape|\.size\(|torch\.(?:long|int)|_sizes?\b)"  # torch.tensor / LongTensor
# GPU004: a tuple unpacked from, or a for loop over, a (subscripted) name; or a shape= keyword
# given a subscript.
_UNPACK = (rb"^[ \t]*(?:for[ \t]+(?:\w+[ \t]*,[ \t]*)?\(?)?\w+[ \t]*,[ \t]*\w+(?:[ \t]*,[ \t]*\w+)*\)?[ \t]*"
           rb"(?:=|in)[ \t]*(?:enumerate\()?[\w.]+(?:\[[^\]\n]*\])?\)?[ \t]*:?[ \t]*(?:#.*)?$"
           rb"|(?:shape|size|sizes)[ \t]*=[ \t]*[\w.]+\[",
           # a reduction of one (`seq_lens.max()`), or one element picked (`pages = pages[0]`)
           rb"\.(?:max|min|sum|prod|amax|amin)\(\)",
           rb"^[ \t]*(\w+)[ \t]*=[ \t]*\1\[-?\d+\][ \t]*(?:#.*)?$",
           # sizes put in a dict of keyword arguments for `**kwargs` (`dict(grid_sizes=...)`, `{"grid_sizes": ...}`)
           rb"(?:sizes|shapes)[\"']?[ \t]*[=:][ \t]*[\w\"'(]",
           # or returned to the caller
           rb"^[ \t]*return[ \t]+(?:torch\.(?:stack|tensor|as_tensor)\(|\w*(?:size|shape|grid|lens)\w*[ \t]*$)")

RULE = Rule(
    code="GPU004",
    name="shape-tensor-arithmetic",
    kb_id="misaligned-address",
    level="warning",
    title="shape values held as tensors are used in arithmetic before int() / .tolist()",
    kinds=(PYTHON,),
    prefilter=((b"torch.tensor(", b"as_tensor(", b"LongTensor(", b"IntTensor(", b"new_tensor(", b"torch.stack("),
               (b".shape", b".size()", b"torch.long", b"torch.int")),
    pattern=(SIZE_TENSOR, _UNPACK),
    what=(
        "Names unpacked from (or iterated over) a 1-D tensor of sizes, such as "
        "`N_t, N_h, N_w = grid_sizes[0]` where grid_sizes = torch.stack([torch.tensor(u.shape[2:]) ...]), "
        "or a reduction of one (`seq_lens.max()`, `.sum()`), then multiplied, added or used as sizes "
        "(a new tensor's, range(), a slice bound) before int(), .item() or .tolist(), reported at the "
        "binding or the reduction (one finding per group of bindings). The sizes are followed through "
        "lists and dicts of them, per-sample subscripts and loop variables (`f, h, w = sizes[i]`), "
        "attributes of self (stored in __init__, read in forward), what the project's functions return, "
        "and into the functions of other modules they are handed to (imports, submodule classes, the "
        "elements of a ModuleList, `**kwargs`, super(), forwards rebound with types.MethodType); the "
        "finding there names the caller. A shape= argument given a row of such a tensor is reported at "
        "the call only where the callee cannot be followed."
    ),
    why=(
        "Each element is a 0-d tensor: on a CUDA tensor every operation on it is a kernel launch and "
        "int() synchronises with the GPU, so an error left by an earlier asynchronous kernel (a "
        "misaligned address in an FP8/FP4 or attention kernel) is reported at this innocent line; "
        "the shape arithmetic itself cannot misalign anything. It also costs a sync per op and "
        "breaks torch.compile graphs."
    ),
    example=("grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])\n"
             "N_t, N_h, N_w = grid_sizes[0]\nexpected_tokens = int(N_t * N_h * N_w)"),
    fix="N_t, N_h, N_w = grid_sizes[0].tolist()   # Python ints\nexpected_tokens = N_t * N_h * N_w",
    fix_safety=(
        "unsafe: the values become Python numbers (.tolist() where the tensor is unpacked; where "
        "another module passes it, `N_t, N_h, N_w = (int(v) for v in shape)` at the binding, which "
        "also accepts the ints other callers pass); code that later needs the values as tensors (a "
        "torch op on them, .item(), .to()) would change, so check the uses. Re-run with "
        "CUDA_LAUNCH_BLOCKING=1 to find the kernel that really failed."
    ),
    near_misses=(
        "Unpacking x.shape (ints), iterating grid_sizes.tolist(), converting with int() or .item() "
        "before any arithmetic, comparing a reduction (assert seq_lens.max() <= seq_len), unpacking "
        "tuples of tensors (torch.chunk), integer tensors that are not sizes (token ids), and callees "
        "in other modules that convert what they receive (shape.tolist()) or receive x.shape (ints) do "
        "not fire."
    ),
)


def tolist_fix(src: PySource, node: ast.AST, description: str) -> Fix:
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        _, end = src.span(node)
        return Fix(UNSAFE, description, (Edit(end, end, ".tolist()"),))
    return Fix(DISPLAY_ONLY, description)


def tensor_finding(src: PySource, ev: ShapeTensorEvent, origin: str | None = None) -> Finding:
    """At the binding (the place to change: `.tolist()` goes there), naming the first use; with
    `origin`, the caller in another function or module that passes the tensor."""
    tensor = short(src, ev.unpacked, 40)
    use = short(src, ev.use, 40)
    where = f" (line {ev.use.lineno})" if ev.use.lineno != ev.unpacked.lineno else ""  # type: ignore[attr-defined]
    reduced = isinstance(ev.unpacked, ast.Call) and call_name(ev.unpacked) in _reductions()
    if reduced and origin is None:
        message = (f"`{tensor}` reduces a tensor of sizes to a 0-d tensor: `{use}`{where} uses it as a number (on CUDA "
                   f"a kernel, and converting it synchronises, which is where an earlier asynchronous error such as "
                   f"'misaligned address' gets reported); take it as a Python int once with .item()")
        fix = Fix(UNSAFE, f"`{tensor}.item()` (a Python int)", (Edit(src.span(ev.unpacked)[1], src.span(ev.unpacked)[1],
                                                                     ".item()"),))
        return finding(src, ev.unpacked, "GPU004", message, fix)
    if origin is None:
        message = (f"shape values taken from the tensor `{tensor}` are 0-d tensors: `{use}`{where} runs tensor ops "
                   f"(on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
                   f"such as 'misaligned address' gets reported); convert them to Python ints first with .tolist()")
        return finding(src, ev.unpacked, "GPU004", message,
                        tolist_fix(src, ev.unpacked, f"unpack `{tensor}.tolist()` (Python ints) instead of tensor elements"))
    message = (f"`{tensor}` is {origin}: the values taken from it here are 0-d tensors, so `{use}`{where} runs tensor "
               f"ops (on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
               f"such as 'misaligned address' gets reported); pass Python ints there (.tolist()) or convert here")
    from gpudoctor.lint import autofix  # the conversion at the binding, where its shape allows one

    return finding(src, ev.unpacked, "GPU004", message, autofix.shape_values(
        src, ev.unpacked, "pass .tolist() where the tensor of sizes is handed on, or convert it here"))


def arg_finding(src: PySource, ev: ShapeArgEvent) -> Finding:
    value = short(src, ev.value, 40)
    message = (f"{ev.keyword}= gets `{value}`, a row of a tensor of sizes: the callee unpacks 0-d tensors, so its "
               f"shape arithmetic runs tensor ops (and syncs on CUDA, where an earlier asynchronous error such "
               f"as 'misaligned address' gets reported); pass `{value}.tolist()`")
    return finding(src, ev.value, "GPU004", message, tolist_fix(src, ev.value, f"pass `{value}.tolist()`"))


def _reductions() -> set[str]:
    from gpudoctor.lint.pyvalues import REDUCTIONS  # the dataflow's, loaded with it

    return REDUCTIONS
