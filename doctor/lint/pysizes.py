"""The interpreter's sizes (a mixin of `gpudoctor.lint.pyflow.Interp`, GPU004): tensors built from
sizes (`torch.tensor(u.shape[2:], dtype=torch.long)`, a table filled in a loop), their 0-d elements
used as numbers (arithmetic, sizes of new tensors, range, slice bounds), reductions of them
(`.max()`, `.sum()`), and size tensors handed to the project's own calls (recorded for the project
pass, `gpudoctor.lint.valueflow`).
"""
from __future__ import annotations

import ast
from typing import Any

import re

from gpudoctor.lint.pysource import dotted, kwarg
from gpudoctor.lint.pyvalues import (TV, DictV, ShapeArgEvent, ShapeTensorEvent, ShapeV, SizeCall, Sym, TupleV,
                                     _INT_DTYPES, _SHAPE_KW, _identity, export)
from gpudoctor.lint.shapetables import on_device, table_rank


# a collection of sizes by its name: shapes, grid_sizes, spatial_shapes, image_sizes
_SIZES_NAME = re.compile(r"(^|_)(shapes|sizes|grid_size|grid_sizes)$")


class SizeOps:
    """Sizes held as tensors; mixed into Interp (uses `self.events`, `self.calls`, `self._fn`)."""

    def _scalar_use(self, node: ast.AST, v: TV, arithmetic: bool = False) -> None:
        """A 0-d element of a tensor of sizes used as a number. Used directly as a size (a new
        tensor's, a view's, range(), a slice bound) an element of a CPU table is turned into an int
        by __index__, with no kernel and no sync: left alone; arithmetic makes a tensor either way."""
        origin = v.scalar_of
        if origin is None or id(origin) in self._scalar_reported or (v.cpu and not arithmetic):
            return
        self._scalar_reported.add(id(origin))
        self.events.append(ShapeTensorEvent(node, origin, v.seed))

    def _note_size_args(self, node: ast.Call, args: list[Any], kws: dict[str, Any],
                        spread: list[tuple[str, Any, ast.expr]] = ()) -> None:  # type: ignore[assignment]
        """Sizes held as tensors (a table, a row, a list or dict of them) handed to the project's
        code, for the project pass; `spread`: the entries of a `**kwargs` dict."""
        for i, (n, v) in enumerate(zip(node.args, args)):
            if isinstance(n, ast.Starred):
                break
            c = _carried_arg(v)
            if c is not None:
                self.calls.append(SizeCall(node, i, c, n, _seed_of(v), self._fn))
        for k in node.keywords:
            v = kws.get(k.arg) if k.arg else None
            c = _carried_arg(v)
            if c is not None:
                self.calls.append(SizeCall(node, k.arg, c, k.value, _seed_of(v), self._fn))  # type: ignore[arg-type]
        for key, v, n in spread:
            c = _carried_arg(v)
            if c is not None:
                shown = f"{ast.unparse(n)}[{key!r}]" if isinstance(n, (ast.Name, ast.Attribute)) else None
                self.calls.append(SizeCall(node, key, c, n, _seed_of(v), self._fn, shown))

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

    def reduce(self, name: str, tv: TV, node: ast.Call, dim_args: list[ast.expr]) -> TV | None:
        """`seq_lens.max()`, `torch.sum(sizes)`: a 0-d tensor, reported where it is used as a
        number (at the reduction: `.item()` goes there); along a dim, a row of sizes; `cumsum`
        keeps a tensor of sizes (cu_seqlens)."""
        dim = dim_args[0] if dim_args else kwarg(node, "dim")
        if name == "cumsum":
            return TV(rank=tv.rank, sizes=True, seed=tv.seed, cpu=tv.cpu)
        if dim is None:
            return TV(rank=0, scalar_of=node, seed=tv.seed, cpu=tv.cpu)
        if tv.rank == 2 and name not in ("max", "min"):  # max(dim) returns (values, indices)
            return TV(rank=1, sizes=True, seed=tv.seed, cpu=tv.cpu)
        return None

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
        elif isinstance(data, (ast.ListComp, ast.GeneratorExp)):
            # [u.size(1) for u in x]: one size per item; [list(u.shape[2:]) for u in x]: a row each
            elt = data.elt
            rowlike = isinstance(elt, (ast.List, ast.Tuple)) or \
                (isinstance(elt, ast.Attribute) and elt.attr == "shape") or \
                (isinstance(elt, ast.Subscript) and isinstance(elt.slice, ast.Slice)) or \
                (isinstance(elt, ast.Call) and isinstance(elt.func, ast.Name) and elt.func.id in ("list", "tuple"))
            rank = 2 if rowlike else 1
            source = dotted(data.generators[0].iter) or ""
            if not ("attr='shape'" in ast.dump(elt) or "attr='size'" in ast.dump(elt) or
                    (isinstance(elt, ast.Call) and isinstance(elt.func, ast.Name) and elt.func.id == "len") or
                    _SIZES_NAME.search(source.rsplit(".", 1)[-1])):
                return TV(rank=rank)  # token ids, labels: integers, not sizes
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
        return TV(rank=rank, sizes=True, layouts=frozenset({_identity(rank)}), cpu=not on_device(node))

    def _shape_from_args(self, nodes: list[ast.expr], vals: list[Any]) -> tuple[Sym | None, ...] | None:
        if len(vals) == 1 and isinstance(vals[0], TupleV) and not vals[0].homogeneous:
            vals = list(vals[0].items)
        elif len(vals) == 1 and isinstance(vals[0], ShapeV):
            return vals[0].dims
        if not vals or any(isinstance(n, ast.Starred) for n in nodes):
            return None
        return tuple(self._sym(v) for v in vals)


def _carried_arg(v: Any) -> Any:
    """What of an argument the project pass follows: tensors of sizes, rows of them, and lists
    or dicts of those (a 0-d element alone is reported where it is used, in the caller)."""
    c = export(v)
    return None if c is None or c in (("t", 0), ("c", 0)) else c


def _seed_of(v: Any) -> str | None:
    """The seeded parameter a value came from (the project pass), or None for one made here."""
    if isinstance(v, TV):
        return v.seed
    if isinstance(v, TupleV) and v.items:
        return _seed_of(v.items[0])
    if isinstance(v, DictV):
        return next((s for s in (_seed_of(i) for _, i in v.items) if s), None)
    return None
