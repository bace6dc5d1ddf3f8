"""Edits for findings whose checker can only say what to change: the cases where the right edit is
known from the code around the finding, so `gpudoctor lint --fix --unsafe-fixes` (and the patch
that `explain` and `run` print for a traceback) can make it.

- GPU004 across modules: a function unpacks shape values that another module passes as a tensor
  (`N_t, N_h, N_w = shape` where a caller passes `shape=grid_sizes[0]`). The values are converted
  where they are unpacked, `N_t, N_h, N_w = (int(v) for v in shape)`, which gives Python ints for
  a tuple of ints, a tuple of 0-d tensors and a 1-D tensor alike, so every caller keeps working.
  (A `.tolist()` there would break callers that pass tuples.)
- GPU011 in a late method: `self.x = Module(...)` (or an `nn.Parameter`) created in float32 by a
  method that runs after the model was cast. The method first takes a reference to the weights it
  already has, `ref_param = next(self.parameters())`, and every module it creates is converted to
  their dtype and device: `Module(...).to(device=ref_param.device, dtype=ref_param.dtype)`; a
  parameter's data is converted inside `nn.Parameter(...)`, which keeps it a registered parameter.
  The reference line is one edit shared by every finding of the method, so it is written once.

Both are graded unsafe: they change a dtype or a type the later code may rely on (tensor ops on
the shape values; weights rounded to the model's precision, and a model without parameters would
have no reference). Anything these shapes do not cover stays display-only, as the checker said.

Standard library only; the nodes come from the checkers' `ast` trees.
"""
from __future__ import annotations

import ast

from gpudoctor.lint.model import DISPLAY_ONLY, UNSAFE, Edit, Fix
from gpudoctor.lint.pysource import PySource, walk

_REF_NAMES = ("ref_param", "ref_weight", "ref_tensor")
_SIMPLE_EXPR = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


def _statement_of(src: PySource, node: ast.AST) -> ast.stmt | None:
    """The statement whose value is `node` (an assignment), found by identity."""
    line = getattr(node, "lineno", 0)
    for st in walk([src.tree]):
        if isinstance(st, ast.Assign) and st.value is node and st.lineno <= line:
            return st
    return None


def shape_values(src: PySource, unpacked: ast.AST, description: str) -> Fix:
    """GPU004 across modules: convert the unpacked values to Python ints at the binding."""
    st = _statement_of(src, unpacked)
    if st is None or len(st.targets) != 1:
        return Fix(DISPLAY_ONLY, description)
    target = st.targets[0]
    start, end = src.span(unpacked)
    text = src.text[start:end]
    if "\n" in text:
        return Fix(DISPLAY_ONLY, description)
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, (ast.Name, ast.Starred)) for e in target.elts):
        new = f"(int(v) for v in {text})"
    elif isinstance(target, ast.Name) and isinstance(unpacked, ast.Subscript):
        new = f"int({text})"
    else:
        return Fix(DISPLAY_ONLY, description)
    return Fix(UNSAFE, f"convert the shape values to Python ints where they are unpacked: {new}",
               (Edit(start, end, new),))


def _body_start(src: PySource, fn: ast.AST) -> tuple[int, str] | None:
    """(offset of the line that starts the function's first statement after its docstring, its
    indentation); None when that statement shares a line with the `def` or another statement."""
    body = list(fn.body)  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        body = body[1:]
    first = body[0]
    line_start = src.starts[first.lineno - 1]
    indent = src.text[line_start:src.offset(first.lineno, first.col_offset)]
    if indent.strip() or first.lineno <= fn.lineno:  # type: ignore[attr-defined]
        return None
    return line_start, indent


def _ref_name(src: PySource, fn: ast.AST) -> str | None:
    used = {n.id for n in walk([fn]) if isinstance(n, ast.Name)} | \
        {a.arg for a in walk([fn]) if isinstance(a, ast.arg)}
    return next((name for name in _REF_NAMES if name not in used), None)


def _extends(st: ast.stmt) -> bool:
    return isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
        isinstance(st.value.func, ast.Attribute) and st.value.func.attr == "extend"


def late_module(src: PySource, method: ast.AST, st: ast.stmt, value: ast.AST, is_param: bool,
                description: str) -> Fix:
    """GPU011 in a late method (or a helper method it calls): take the dtype and device of the
    weights the module already has (at the top of the method, before anything new exists) and
    convert what statement `st` adds to self (`value`: assigned, appended, inserted, registered,
    set with setattr) to them. A list handed to `extend(...)` stays display-only: one conversion
    would cover its first element only."""
    start = _body_start(src, method)
    name = _ref_name(src, method)
    if start is None or name is None or not isinstance(value, ast.Call) or _extends(st):
        return Fix(DISPLAY_ONLY, description)
    offset, indent = start
    ref = Edit(offset, offset, f"{indent}{name} = next(self.parameters())  # the dtype and device of the "
                               f"weights the model already has\n")
    convert = f".to(device={name}.device, dtype={name}.dtype)"
    if is_param:
        if not value.args or any(k.arg in ("data",) for k in value.keywords):
            return Fix(DISPLAY_ONLY, description)
        data = value.args[0]
        d_start, d_end = src.span(data)
        if isinstance(data, _SIMPLE_EXPR):
            edits = (ref, Edit(d_end, d_end, convert))
        else:
            edits = (ref, Edit(d_start, d_start, "("), Edit(d_end, d_end, ")" + convert))
        what = "create the parameter's data in the dtype and device of the existing weights"
    else:
        _, v_end = src.span(value)
        edits = (ref, Edit(v_end, v_end, convert))
        what = "convert the new module to the dtype and device of the existing weights"
    return Fix(UNSAFE, f"{what} ({name} = next(self.parameters()) at the top of the method)", edits)
