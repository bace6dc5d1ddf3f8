"""The interpreter's sizes (a mixin of `gpudoctor.lint.pyflow.Interp`, GPU004): tensors built from
sizes (`torch.tensor(u.shape[2:], dtype=torch.long)`, a table filled in a loop), their 0-d elements
used as numbers (arithmetic, sizes of new tensors, range, slice bounds), reductions of them
(`.max()`, `.sum()`), and size tensors handed to the project's own calls (recorded for the project
pass, `gpudoctor.lint.valueflow`).
"""
from __future__ import annotations

import ast
from typing import Any

from gpudoctor.lint.pysource import kwarg
from gpudoctor.lint.pyvalues import (TV, ShapeArgEvent, ShapeTensorEvent, ShapeV, SizeCall, Sym, TupleV, _INT_DTYPES,
                                     _SHAPE_KW, _identity)
from gpudoctor.lint.shapetables import table_rank


class SizeOps:
    """Sizes held as tensors; mixed into Interp (uses `self.events`, `self.calls`, `self._fn`)."""

    def _scalar_use(self, node: ast.AST, v: TV) -> None:
        origin = v.scalar_of
        if origin is None or id(origin) in self._scalar_reported:
            return
        self._scalar_reported.add(id(origin))
        self.events.append(ShapeTensorEvent(node, origin, v.seed))

    def _note_size_args(self, node: ast.Call, args: list[Any], kws: dict[str, Any]) -> None:
        """Size tensors and rows of them handed to the project's code, for the project pass."""
        for i, (n, v) in enumerate(zip(node.args, args)):
            if isinstance(n, ast.Starred):
                return
            if isinstance(v, TV) and v.sizes and v.rank in (1, 2):
                self.calls.append(SizeCall(node, i, v.rank, n, v.seed, self._fn))
        for k in node.keywords:
            v = kws.get(k.arg) if k.arg else None
            if isinstance(v, TV) and v.sizes and v.rank in (1, 2):
                self.calls.append(SizeCall(node, k.arg, v.rank, k.value, v.seed, self._fn))  # type: ignore[arg-type]

    def _note_keyword(self, key: str, value_node: ast.AST, v: Any) -> None:
        if not isinstance(v, TV) or not v.sizes:
            return
        self.kw_sizes.setdefault(key, TV(rank=v.rank, sizes=True))
        if v.rank == 1 and isinstance(value_node, ast.Subscript) and _SHAPE_KW.search(key):
            self.events.append(ShapeArgEvent(value_node, key))  # type: ignore[arg-type]

    def _size_args(self, node: ast.AST, args: list[Any]) -> None:
        for a in args:
            items = a.items if isinstance(a, TupleV) and not a.homogeneous else (a,)
            for it in items:
                if isinstance(it, TV) and it.rank == 0 and it.scalar_of is not None:
                    self._scalar_use(node, it)

    def size_tensor(self, node: ast.Call, qual: str) -> TV:
        """torch.tensor(x.shape[2:]), torch.tensor([h, w], dtype=torch.long): a tensor of sizes."""
        data = node.args[0] if node.args else kwarg(node, "data")
        if data is None:
            return TV()
        rank = None
        if isinstance(data, (ast.List, ast.Tuple)):
            rank = 2 if data.elts and all(isinstance(e, (ast.List, ast.Tuple)) for e in data.elts) else 1
            if any(isinstance(e, ast.Starred) for e in data.elts):
                rank = None
        text = ast.dump(data)
        from_shape = "attr='shape'" in text or "attr='size'" in text
        if isinstance(data, ast.Attribute) and data.attr == "shape" or (
                isinstance(data, ast.Subscript) and isinstance(data.value, ast.Attribute) and data.value.attr == "shape"):
            rank = 1
        if isinstance(data, ast.Call) and isinstance(data.func, ast.Attribute) and data.func.attr == "size" and not data.args:
            rank = 1
        dtype = kwarg(node, "dtype")
        int_dtype = isinstance(dtype, ast.Attribute) and dtype.attr in _INT_DTYPES
        is_sizes = from_shape or int_dtype or qual.endswith(("LongTensor", "IntTensor"))
        if rank is None and int_dtype:  # a list of (h, w) filled in a loop, put on the device
            rank = table_rank(self._fn, node)
        if rank is None or not is_sizes:
            return TV(rank=rank)
        return TV(rank=rank, sizes=True, layouts=frozenset({_identity(rank)}))

    def _shape_from_args(self, nodes: list[ast.expr], vals: list[Any]) -> tuple[Sym | None, ...] | None:
        if len(vals) == 1 and isinstance(vals[0], TupleV) and not vals[0].homogeneous:
            vals = list(vals[0].items)
        elif len(vals) == 1 and isinstance(vals[0], ShapeV):
            return vals[0].dims
        if not vals or any(isinstance(n, ast.Starred) for n in nodes):
            return None
        return tuple(self._sym(v) for v in vals)
