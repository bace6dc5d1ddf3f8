"""GPU004 helpers for size tables built at run time: `spatial_shapes.append((h, w))` in a loop,
then `torch.as_tensor(spatial_shapes, dtype=torch.long, device=x.device)` (deformable attention,
GroundingDINO / Deformable-DETR). The table is on the device only when a device other than the CPU
is named; a table left on the CPU costs no kernel launch and no sync, and is left alone. Calls made
only on the CPU path (`else:` of `if value.is_cuda:`) are not followed.
"""
from __future__ import annotations

import ast

from gpudoctor.lint.pysource import dotted, kwarg


def on_device(node: ast.Call) -> bool:
    """A device other than the CPU is named (`device=x.device`, `device=\"cuda\"`)."""
    device = kwarg(node, "device")
    if device is None:
        return False
    if isinstance(device, ast.Constant):
        return isinstance(device.value, str) and not device.value.startswith("cpu")
    if isinstance(device, ast.Call) and device.args and isinstance(device.args[0], ast.Constant):
        return not str(device.args[0].value).startswith("cpu")  # torch.device("cuda")
    return True  # x.device, device: where the activations are


def table_rank(fn: ast.AST | None, node: ast.Call) -> int | None:
    """The rank of `torch.as_tensor(name, dtype=<int>, device=<not cpu>)` where `name` is a list this
    function fills with `name.append((h, w))` (2) or `name.append(n)` (1); None otherwise."""
    data = node.args[0] if node.args else kwarg(node, "data")
    if fn is None or not isinstance(data, ast.Name) or not on_device(node):
        return None
    ranks = set()
    tuples: dict[str, set[bool]] = {}  # `spatial_shape = (h, w)`, then `spatial_shapes.append(spatial_shape)`
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            tuples.setdefault(n.targets[0].id, set()).add(isinstance(n.value, (ast.Tuple, ast.List)))
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" and \
                dotted(n.func.value) == data.id and len(n.args) == 1:
            item = n.args[0]
            if isinstance(item, ast.Name) and tuples.get(item.id) == {True}:
                ranks.add(2)
            else:
                ranks.add(2 if isinstance(item, (ast.Tuple, ast.List)) else 1)
    return ranks.pop() if len(ranks) == 1 else None


def cpu_only_lines(fn: ast.AST) -> set[int]:
    """Lines of `fn` that run only when a tensor is not on a CUDA device: the `else:` of
    `if ... x.is_cuda:`, the body of `if not x.is_cuda:`."""
    out: set[int] = set()
    for n in ast.walk(fn):
        if not isinstance(n, ast.If):
            continue
        negated = isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not)
        test = n.test.operand if negated else n.test
        if not any(isinstance(t, ast.Attribute) and t.attr == "is_cuda" for t in ast.walk(test)):
            continue
        if isinstance(test, ast.BoolOp) and not isinstance(test.op, ast.And):
            continue
        for st in (n.body if negated else n.orelse):
            out.update(range(st.lineno, (st.end_lineno or st.lineno) + 1))
    return out
