"""The interpreter's library calls (a mixin of `gpudoctor.lint.pyflow.Interp`): what torch functions
(`function`) and tensor methods (`method`) return for abstract arguments, dispatching to the layout,
attention and size operations.
"""
from __future__ import annotations

import ast
from dataclasses import replace
from typing import Any

from gpudoctor.lint.pysource import int_const, kwarg
from gpudoctor.lint.pyvalues import (TV, DictV, IterV, Named, ShapeV, Sym, TupleV, _CREATE, _ELEMENTWISE, _FLASH,
                                     _INT_DTYPES, REDUCTIONS, _as_tv, _identity, _norm, export, join_values)


# torch.<f>(x, ...) that keeps x's shape, elementwise.
_TORCH_ELEMENTWISE = {"clamp", "clip", "clamp_min", "clamp_max", "exp", "tanh", "sigmoid", "abs", "neg", "mul", "div",
                      "add", "sub", "nan_to_num", "masked_fill", "pow", "square", "sqrt", "rsqrt"}


def _int_dtype(dtype: Any) -> bool:
    return isinstance(dtype, ast.Attribute) and dtype.attr in _INT_DTYPES


def _on_cpu_after(name: str, node: ast.Call, was: bool) -> bool:
    """Whether a tensor is on the CPU after `.cuda()` (no), `.cpu()` (yes), `.to(...)` (no when a
    device or another tensor is named, what it was for a dtype alone), `.long()` (unchanged)."""
    if name == "cuda":
        return False
    if name == "cpu":
        return True
    if name != "to":
        return was
    targets = list(node.args) + [k.value for k in node.keywords if k.arg in ("device", "other")]
    for t in targets:
        if isinstance(t, ast.Constant) and isinstance(t.value, str):
            return t.value.startswith("cpu")
        if not (isinstance(t, ast.Attribute) and (t.attr in _INT_DTYPES or t.attr.startswith(("float", "bfloat")))):
            return False  # .to(device), .to(x.device), .to(x)
    return was


class CallOps:
    """torch functions and tensor methods on abstract values; mixed into Interp."""

    def function(self, qual: str, name: str, node: ast.Call, args: list[Any], kws: dict[str, Any]) -> Any:
        q = qual
        if name in ("int", "float", "round") and len(args) == 1:
            v = args[0]
            if isinstance(v, (Sym, Named)):
                return self._sym(v)
            return Sym.named("<%s>" % ast.dump(node.args[0])) if node.args else None
        if name == "range":
            self._size_args(node, args)
            return None
        if name == "enumerate" and args:
            elem = self._elem(args[0])
            if isinstance(elem, TV) and elem.sizes and elem.rank == 1:
                elem = replace(elem, scalar_of=node.args[0])
            return IterV(TupleV((None, elem)))
        if name == "len":
            return Sym.named("<%s>" % ast.dump(node))
        if name == "dict" and qual == "dict":  # the builtin: dict(grid_sizes=..., **base)
            base = args[0] if len(args) == 1 and isinstance(args[0], DictV) else DictV()
            for k, v in kws.items():
                if export(v) is not None:
                    base = base.set(k, v)
            return base
        if name == "zip" and qual == "zip" and args:
            return IterV(TupleV(tuple(self._elem(a) for a in args)))
        if name in ("max", "min", "sum") and qual == name and len(args) == 1 and isinstance(args[0], TV) and \
                args[0].sizes and args[0].rank == 1:
            return TV(rank=0, scalar_of=node, seed=args[0].seed, cpu=args[0].cpu)  # max(seq_lens): the largest 0-d tensor
        if q.startswith("torch.") and name in REDUCTIONS | {"cumsum"} and args and isinstance(args[0], TV) and \
                args[0].sizes:
            return self.reduce(name, args[0], node, node.args[1:])
        if q.endswith("scaled_dot_product_attention"):
            qv = args[0] if args else kws.get("query")
            vv = args[2] if len(args) > 2 else kws.get("value")
            return self.sdpa(_as_tv(qv), _as_tv(vv), node)
        if name in _FLASH:
            self.flash(name, node, args, kws)
            return TV(rank=4) if name == "flash_attn_func" else None
        if q in ("torch.matmul", "torch.bmm", "torch.mm") and len(args) >= 2:
            return self.product(args[0], args[1], node, node.args[0], node.args[1])
        if q in ("torch.baddbmm", "torch.addbmm") and len(args) >= 3:
            return self.product(args[1], args[2], node, node.args[1], node.args[2])
        if q == "torch.einsum" and node.args:
            ops = args[1:]
            if len(ops) == 1 and isinstance(ops[0], TupleV) and not ops[0].homogeneous:
                ops = list(ops[0].items)
            if len(ops) == 2:
                out = self.product(ops[0], ops[1], node, None, None)
                spec = node.args[0]
                if isinstance(spec, ast.Constant) and isinstance(spec.value, str) and "->" in spec.value:
                    rhs = spec.value.split("->")[1].replace(" ", "")
                    if rhs.isalpha():
                        out = replace(out, rank=len(rhs), layouts=frozenset({_identity(len(rhs))}))
                return out
            return None
        if "softmax" in name.lower() and "log" not in name.lower() and "gumbel" not in name.lower():
            return self.softmax(args[0] if args else None)
        if q in ("torch.transpose", "torch.swapaxes", "torch.swapdims") and len(args) == 3:
            i, j = int_const(node.args[1]), int_const(node.args[2])
            if i is not None and j is not None:
                return self.transpose(_as_tv(args[0]), i, j, node)
            return TV()
        if q == "torch.permute" and len(node.args) >= 2:
            dims = self._int_list(node.args[1:])
            return self.permute(_as_tv(args[0]), dims, node) if dims else TV()
        if q == "torch.reshape" and len(node.args) == 2:
            return self.reshape(_as_tv(args[0]), node, node.args[1:], args[1:], view=False)
        if q == "torch.flatten" and node.args:
            return self.method("flatten", _as_tv(args[0]), args[0], node, args[1:], kws, {})
        if q in ("torch.tensor", "torch.as_tensor", "torch.LongTensor", "torch.IntTensor") or \
                (q.startswith("torch.") and name in ("LongTensor", "IntTensor")):
            return self.size_tensor(node, q)
        if q in ("torch.stack",) and args:
            elem = self._elem(args[0])
            if isinstance(elem, TV) and elem.rank is not None:
                d = int_const(node.args[1]) if len(node.args) > 1 else int_const(kwarg(node, "dim"))
                d = 0 if d is None and len(node.args) < 2 and kwarg(node, "dim") is None else d
                roles = None
                if d is not None and elem.roles and -elem.rank - 1 <= d <= elem.rank:
                    d = d + elem.rank + 1 if d < 0 else d
                    roles = elem.roles[:d] + (None,) + elem.roles[d:]  # the stacked tensors keep their roles
                return TV(rank=elem.rank + 1, sizes=elem.sizes, layouts=frozenset({_identity(elem.rank + 1)}),
                          roles=roles, cpu=elem.sizes and elem.cpu)
            return TV()
        if q == "torch.cat" and args:
            elem = self._elem(args[0])
            if isinstance(elem, TV) and elem.rank is not None:
                return TV(rank=elem.rank, sizes=elem.sizes, layouts=frozenset({_identity(elem.rank)}),
                          cpu=elem.sizes and elem.cpu)
            sized = self._sizes_among(args[0])
            if sized is not None:
                return sized  # torch.cat((sizes.new_zeros((1,)), sizes.prod(1).cumsum(0)[:-1])): offsets
            return TV()
        if q.startswith("torch.") and name in _CREATE:
            self._size_args(node, args)
            if name.endswith("_like") or name in ("arange", "randint"):
                return TV()
            dims = self._shape_from_args(node.args, args)
            if dims is not None:
                return TV(rank=len(dims), dims=dims, layouts=frozenset({_identity(len(dims))}))
            return TV()
        if q == "torch.where" and len(args) == 3:
            for v in args[1:]:
                if isinstance(v, TV) and v.attn:
                    return TV(rank=v.rank, attn=v.attn, attn_origin=v.attn_origin)
            return TV()
        if (q.endswith("einops.rearrange") or name == "rearrange") and len(node.args) >= 2:
            return self.rearrange(_as_tv(args[0]), node, kws)
        if "drop" in name.lower() and args and isinstance(args[0], TV):
            return args[0]
        if q.startswith("torch.nn.functional.") and name in _ELEMENTWISE | {"dropout", "relu", "gelu"} and args:
            return args[0] if isinstance(args[0], TV) else TV()
        if q.startswith("torch.") and q.count(".") == 1 and name in _TORCH_ELEMENTWISE and args and \
                isinstance(args[0], TV) and args[0].attn:
            a = args[0]  # torch.clamp(scores, ...): the same score matrix, its values bounded
            return TV(rank=a.rank, dims=a.dims, layouts=a.layouts, origin=a.origin, origin_kind=a.origin_kind,
                      roles=a.roles, attn=a.attn, attn_origin=a.attn_origin, cond=a.cond)
        return None

    @staticmethod
    def _sizes_among(v: Any) -> TV | None:
        """The tensors a cat joins, when some hold sizes and the others are tensors of no known
        rank or that rank (zeros padding a table of offsets): a tensor of sizes of that rank."""
        if not isinstance(v, TupleV) or v.homogeneous or not v.items or not all(isinstance(i, TV) for i in v.items):
            return None
        sized = [i for i in v.items if i.sizes]
        ranks = {i.rank for i in sized}
        if not sized or len(ranks) != 1 or None in ranks:
            return None
        rank = ranks.pop()
        if any(i.rank not in (None, rank) or i.attn for i in v.items):
            return None
        return TV(rank=rank, sizes=True, seed=next((i.seed for i in sized if i.seed), None),
                  cpu=all(i.cpu for i in sized))

    @staticmethod
    def _elem(v: Any) -> Any:
        if isinstance(v, TupleV):
            if v.homogeneous:
                return v.items[0]
            if v.items and all(i == v.items[0] for i in v.items):
                return v.items[0]
            ranks = {i.rank for i in v.items if isinstance(i, TV)}
            if len(ranks) == 1 and all(isinstance(i, TV) for i in v.items):
                roles = {i.roles for i in v.items}
                return TV(rank=ranks.pop(), sizes=all(i.sizes for i in v.items),
                          roles=roles.pop() if len(roles) == 1 else None,
                          cpu=all(i.sizes and i.cpu for i in v.items))
        if isinstance(v, TV) and v.rank:
            return TV(rank=v.rank - 1, sizes=v.sizes, seed=v.seed, cpu=v.cpu)  # enumerate(sizes) keeps where it came from
        return None

    def method(self, name: str, tv: Any, raw: Any, node: ast.Call, args: list[Any], kws: dict[str, Any],
               env: dict[str, Any]) -> Any:
        if isinstance(tv, ShapeV):
            if name in ("numel",):
                return None
            return None
        recv_name = node.func.value.id if isinstance(node.func.value, ast.Name) else None  # type: ignore[attr-defined]
        if isinstance(raw, TupleV):
            if recv_name and name in ("append", "insert", "extend") and args:
                item = self._elem(args[-1]) if name == "extend" else args[-1]
                if export(item) is not None:  # sizes.append(torch.tensor(u.shape[1:])): a list of size tensors
                    env[recv_name] = join_values([raw, TupleV((item,), homogeneous=True)])
            return None
        if isinstance(raw, DictV):
            if name == "update" and recv_name:
                new = raw
                for k, v in ((args[0].items if args and isinstance(args[0], DictV) else ()) + tuple(kws.items())):
                    if export(v) is not None:
                        new = new.set(k, v)
                env[recv_name] = new
                return None
            if name == "copy":
                return raw
            if name in ("get", "pop") and node.args and isinstance(node.args[0], ast.Constant):
                return raw.get(node.args[0].value)
            return None
        if isinstance(tv, TupleV):
            return None
        if tv.sizes and (name in REDUCTIONS or name == "cumsum"):
            return self.reduce(name, tv, node, node.args)
        if name in ("transpose", "swapaxes", "swapdims") and len(node.args) == 2:
            i, j = int_const(node.args[0]), int_const(node.args[1])
            return self.transpose(tv, i, j, node) if i is not None and j is not None else TV()
        if name == "permute" and node.args:
            dims = self._int_list(node.args)
            return self.permute(tv, dims, node) if dims else TV()
        if name == "t" and not node.args:
            if tv.rank is None:  # .t() is for 2-D tensors (on 1-D it does nothing, and nobody writes it)
                tv = replace(tv, rank=2, dims=None, layouts=None)
            return self.transpose(tv, 0, 1, node) if tv.rank == 2 else tv
        if name in ("contiguous",):
            r = tv.rank
            return replace(tv, layouts=frozenset({_identity(r)}) if r is not None else None, origin=None,
                           origin_kind="")
        if name in ("view", "reshape") and (node.args or "shape" in kws or "size" in kws):
            return self.reshape(tv, node, node.args, args, view=(name == "view"))
        if name == "flatten":
            return self.flatten(tv, node)
        if name == "unflatten" and len(node.args) == 2:
            return self.unflatten(tv, node, args)
        if name == "size":
            if node.args:
                i = int_const(node.args[0])
                if i is not None and tv.dims is not None:
                    d = _norm(i, len(tv.dims))
                    return tv.dims[d] if d is not None else None
                if i is not None:
                    owner = node.func.value.id if isinstance(node.func.value, ast.Name) else "?"  # type: ignore[attr-defined]
                    d = _norm(i, tv.rank) if tv.rank is not None else i
                    return Sym.named(f"{owner}.shape[{d}]")
                return None
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None  # type: ignore[attr-defined]
            return ShapeV(tv, owner, tv.dims)
        if name in ("item", "dim", "ndimension", "numel", "tolist", "element_size", "nelement"):
            return None
        if name in ("unbind",) or (name in ("chunk", "split", "tensor_split") and node.args):
            if name == "unbind":
                d = int_const(node.args[0]) if node.args else int_const(kwarg(node, "dim")) or 0
                if d is not None and tv.rank is not None and _norm(d, tv.rank) is not None:
                    return TupleV((self._drop_dim(tv, _norm(d, tv.rank)),), homogeneous=True)  # type: ignore[arg-type]
                return TupleV((TV(),), homogeneous=True)
            return TupleV((TV(rank=tv.rank, attn=tv.attn, attn_origin=tv.attn_origin),), homogeneous=True)
        if name in ("matmul", "bmm", "mm") and node.args:
            return self.product(tv, args[0], node, node.func.value, node.args[0])  # type: ignore[attr-defined]
        if name == "baddbmm" and len(node.args) >= 2:
            return self.product(args[0], args[1], node, node.args[0], node.args[1])
        if "softmax" in name.lower() and "log" not in name.lower() and "gumbel" not in name.lower():
            operand = args[0] if args and isinstance(args[0], TV) and args[0].attn else tv
            return self.softmax(operand)
        if name in ("unsqueeze", "squeeze"):
            return self.squeeze(tv, name, node)
        if name in _ELEMENTWISE:
            if name in ("to", "type") and not node.args and not kws:
                return tv
            if isinstance(raw, (Named, type(None))) and not isinstance(raw, TV):
                return TV(attn=tv.attn)
            keep = tv.sizes and name in ("to", "cuda", "cpu", "long", "int")
            return replace(tv, sizes=keep, cpu=keep and _on_cpu_after(name, node, tv.cpu))
        if name in ("long", "int") and tv.sizes:
            return tv
        if name in ("expand", "expand_as") and tv.sizes:
            return tv  # the same sizes, broadcast
        if name == "sum" and not tv.sizes and _int_dtype(kwarg(node, "dtype")) and \
                (node.args or kwarg(node, "dim") is not None) and tv.rank in (None, 2):
            # attention_mask.sum(dim=-1, dtype=torch.int32): a count per row, the sequence lengths
            return TV(rank=1, sizes=True, seed=tv.seed)
        if name in ("expand", "expand_as", "narrow", "select", "diagonal", "unfold", "as_strided"):
            return TV(rank=tv.rank if name in ("expand", "expand_as", "unfold") else None)
        if name in ("repeat", "repeat_interleave", "new_zeros", "new_ones", "new_empty", "new_full"):
            self._size_args(node, args)
            return TV()
        if "drop" in name.lower() and args and isinstance(args[0], TV):
            return args[0]
        if name in ("new_tensor",) and node.args:
            return self.size_tensor(node, "new_tensor")
        if "softmax" in name.lower():
            return TV()
        return None
