"""The interpreter's layout operations (a mixin of `gpudoctor.lint.pyflow.Interp`): indexing that
drops or slices dimensions, transpose, permute, (un)squeeze, view / reshape (with the symbolic
sizes that tell a merge from a split), flatten / unflatten and einops' rearrange. Each takes an
abstract tensor (`TV`) and returns the tensor it becomes: its rank, symbolic sizes, the candidate
memory orders of its dimensions and what made it non-contiguous (GPU003's evidence).
"""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from typing import Any

from gpudoctor.lint.pysource import dotted, int_const, kwarg
from gpudoctor.lint.pyvalues import (TV, WILD, Named, ShapeV, Sym, TupleV, ViewEvent, _identity, _merge_ok, _norm,
                                     _regroup_layout, _relabel, _role_of_name, match_groups, prod)


_DTYPE_NAME = re.compile(r"(?:b?float|u?int|complex|q?u?int|bits)\d")


class LayoutOps:
    """Layout operations on abstract tensors; mixed into Interp (uses `self.events`, `self._sym`,
    `self._size_args`)."""

    def _index_dim0(self, v: TV) -> TV:
        return self._drop_dim(v, 0)

    def _drop_dim(self, v: TV, d: int) -> TV:
        if v.rank is None or not 0 <= d < v.rank:
            return TV()
        dims = v.dims[:d] + v.dims[d + 1:] if v.dims else None
        roles = v.roles[:d] + v.roles[d + 1:] if v.roles else None
        layouts = None
        if v.layouts is not None:
            layouts = frozenset(_relabel([float(p) for i, p in enumerate(L) if i != d]) for L in v.layouts)
        return TV(rank=v.rank - 1, dims=dims, layouts=layouts, origin=v.origin, origin_kind=v.origin_kind,
                  roles=roles, attn=v.attn, attn_origin=v.attn_origin)

    def _index(self, v: TV, sl: ast.AST) -> TV:
        """x[:, 0], x[..., None], x[:k]: slices and ints are followed (basic slicing keeps the
        order of the dimensions in memory; sizes of sliced dimensions become unknown)."""
        if v.rank is not None and isinstance(sl, ast.Slice):
            sl = ast.Tuple(elts=[sl])
        if v.rank is None or not isinstance(sl, ast.Tuple):
            return TV(attn=v.attn, attn_origin=v.attn_origin)
        result, d = v, 0
        for e in sl.elts:
            if isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None:
                d += 1
            elif isinstance(e, ast.Slice) and (e.step is None or int_const(e.step) == 1) and d < (result.rank or 0):
                dims = result.dims[:d] + (None,) + result.dims[d + 1:] if result.dims else None
                result = replace(result, dims=dims, src=None, t12=0)
                d += 1
            elif int_const(e) is not None:
                result = self._drop_dim(result, d)
            else:
                return TV(attn=v.attn, attn_origin=v.attn_origin)
        return result

    def transpose(self, tv: TV, i: int, j: int, node: ast.AST) -> TV:
        r = tv.rank
        if r is None:
            # Unknown rank: only a transpose of two non-negative dims can be followed (the rank is
            # at least j + 1 but unknown, so layouts are not tracked).
            t12 = tv.t12 + 1 if {i, j} == {1, 2} else tv.t12
            src = tv.src if {i, j} == {1, 2} else None
            return TV(src=src, t12=t12, origin=node, origin_kind="transpose")
        a, b = _norm(i, r), _norm(j, r)
        if a is None or b is None:
            return TV()
        perm = list(range(r))
        perm[a], perm[b] = perm[b], perm[a]
        out = self.permute(tv, perm, node, kind="transpose")
        if {a, b} == {1, 2}:
            return replace(out, src=tv.src, t12=tv.t12 + 1)
        return out

    def permute(self, tv: TV, perm: list[int], node: ast.AST, kind: str = "permute") -> TV:
        r = len(perm)
        if tv.rank is not None and tv.rank != r:
            return TV()
        perm = [p + r if p < 0 else p for p in perm]
        if sorted(perm) != list(range(r)):
            return TV()
        base = tv.layouts or frozenset({_identity(r)})
        layouts = frozenset(tuple(L[p] for p in perm) for L in base)
        dims = tuple(tv.dims[p] for p in perm) if tv.dims else None
        roles = tuple(tv.roles[p] for p in perm) if tv.roles else None
        contiguous = layouts == frozenset({_identity(r)})
        if contiguous:
            origin, okind = None, ""
        elif tv.origin is not None and tv.origin_kind == "sdpa":
            origin, okind = tv.origin, "sdpa"  # still "the SDPA output" for the message
        else:
            origin, okind = node, kind
        return TV(rank=r, dims=dims, layouts=layouts, roles=roles, origin=origin, origin_kind=okind,
                  attn=tv.attn, attn_origin=tv.attn_origin)

    def squeeze(self, tv: TV, name: str, node: ast.Call) -> TV:
        if tv.rank is None or not node.args:
            return TV(attn=tv.attn, attn_origin=tv.attn_origin)
        d = int_const(node.args[0])
        if d is None:
            return TV()
        if name == "unsqueeze":
            d = d + tv.rank + 1 if d < 0 else d
            if not 0 <= d <= tv.rank:
                return TV()
            dims = tv.dims[:d] + (Sym(1),) + tv.dims[d:] if tv.dims else None
            roles = tv.roles[:d] + (None,) + tv.roles[d:] if tv.roles else None
            layouts = None
            if tv.layouts is not None:
                layouts = frozenset(_relabel([float(p) for p in L[:d]] + [len(L) + 0.5] + [float(p) for p in L[d:]])
                                    for L in tv.layouts)
            return replace(tv, rank=tv.rank + 1, dims=dims, roles=roles, layouts=layouts, src=None, sizes=False)
        nd = _norm(d, tv.rank)
        if nd is None:
            return TV()
        return self._drop_dim(tv, nd)

    def _view_target(self, nodes: list[ast.expr], vals: list[Any], kws: dict[str, Any] | None = None) -> list[Any] | None:
        if len(nodes) == 1 and not isinstance(nodes[0], ast.Starred):
            v = vals[0]
            if isinstance(v, TupleV) and not v.homogeneous:
                nodes_ = nodes[0].elts if isinstance(nodes[0], (ast.Tuple, ast.List)) else [None] * len(v.items)
                return [WILD if int_const(n) == -1 else self._sym(i) if not isinstance(i, TV) else None
                        for n, i in zip(nodes_, v.items)]
            if isinstance(v, ShapeV):
                return list(v.dims) if v.dims is not None else None
            if isinstance(v, (Sym, Named)) or int_const(nodes[0]) is not None:
                return [WILD if int_const(nodes[0]) == -1 else self._sym(v)]
            return None
        if any(isinstance(n, ast.Starred) for n in nodes):
            return None
        out = []
        for n, v in zip(nodes, vals):
            if int_const(n) == -1:
                out.append(WILD)
            elif isinstance(v, TV):
                key = dotted(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
                if key is None or v.rank not in (None, 0):
                    return None
                out.append(Sym.named(key))
            else:
                out.append(self._sym(v))
        return out

    @staticmethod
    def _is_dtype(node: ast.AST) -> bool:
        """x.view(torch.float4_e2m1fn_x2), x.view(self.dtype): a dtype, not sizes (every torch dtype
        is named float*, bfloat*, int*, uint*, complex*, bool, qint* / quint*, or half / double / ...)."""
        if isinstance(node, ast.Attribute):
            return node.attr in ("half", "float", "double", "long", "int", "bool", "short", "cfloat", "cdouble") or \
                "dtype" in node.attr or (isinstance(node.value, ast.Name) and node.value.id == "torch" and
                                         _DTYPE_NAME.match(node.attr) is not None)
        if isinstance(node, ast.Name):
            return "dtype" in node.id.lower()
        return False

    def reshape(self, tv: TV, node: ast.Call, nodes: list[ast.expr], vals: list[Any], view: bool) -> TV:
        if len(nodes) == 1 and self._is_dtype(nodes[0]):
            return TV()
        self._size_args(node, vals)
        tgt = self._view_target(list(nodes), vals)
        roles = None
        if tgt is not None and len(nodes) == len(tgt):
            roles = tuple(_role_of_name(dotted(n) if isinstance(n, (ast.Name, ast.Attribute)) else None) for n in nodes)
            hd = [self._role_from_expr(n) for n in nodes]
            roles = tuple(r or h for r, h in zip(roles, hd))
            if not any(roles):
                roles = None
        if tgt is None:
            return TV(attn=tv.attn, attn_origin=tv.attn_origin)
        rank = len(tgt)
        base = tv.layouts or (frozenset({_identity(tv.rank)}) if tv.rank is not None else None)
        groups = match_groups(tv.dims, tgt) if tv.dims is not None and tv.rank == len(tv.dims) else None
        dims = None
        if groups is not None or tv.dims is None:
            dims = tuple(t if t is not WILD else None for t in tgt)
            if groups is not None and WILD in tgt and tv.dims:
                rest = prod(t for t in tgt if t is not WILD)
                dims = tuple(prod(tv.dims) / rest if t is WILD else t for t in tgt)  # type: ignore[arg-type]
        verdict_layouts: set[tuple[int, ...]] = set()
        illegal = False
        unknown = base is None
        if base is not None and tv.dims is not None and groups is not None:
            ones = {i for i, s in enumerate(tv.dims) if s is not None and s.is_one()}
            for L in base:
                merges = [s for s, t in groups if len(s) > 1]
                if all(_merge_ok(s, L, ones) for s in merges):
                    verdict_layouts.add(_regroup_layout(L, groups, ones, rank))
                else:
                    illegal = True
                    verdict_layouts.add(_identity(rank))
        elif base is not None and tv.rank is not None:
            # Sizes unknown: a view to fewer dims merges something; it is illegal for sure when
            # no two neighbouring dims are adjacent in memory.
            for L in base:
                if L == _identity(tv.rank):
                    continue
                if rank == 1 and not _merge_ok(list(range(tv.rank)), L, set()):
                    illegal = True  # view(-1) merges every dimension
                elif rank < tv.rank and not any(L[d + 1] == L[d] + 1 for d in range(tv.rank - 1)):
                    illegal = True
            unknown = True
        else:
            unknown = True
        if tv.rank is None and tv.src and tv.t12 % 2 == 1 and tgt is not None and len(tgt) == 2 and tgt[1] is WILD \
                and tgt[0] == Sym.named(f"{tv.src}.shape[0]"):
            # y.transpose(1, 2).view(y.size(0), -1): whatever y's rank (at least 3 for dims 1 and 2),
            # the -1 merges dims 1 and 2, which the transpose left out of order in memory
            illegal = True
        if illegal and view and tv.origin is not None:
            self.events.append(ViewEvent(node, tv.origin, tv.origin_kind))
        if unknown and not illegal:
            if base is not None and all(L == _identity(tv.rank) for L in base if tv.rank is not None):
                return TV(rank=rank, dims=dims, layouts=frozenset({_identity(rank)}), roles=roles,
                          attn=tv.attn, attn_origin=tv.attn_origin)
            return TV(rank=rank, dims=dims, roles=roles, attn=tv.attn, attn_origin=tv.attn_origin)
        if illegal:
            return TV(rank=rank, dims=dims, layouts=frozenset({_identity(rank)}), roles=roles)
        layouts = frozenset(verdict_layouts)
        contiguous = layouts == frozenset({_identity(rank)})
        return TV(rank=rank, dims=dims, layouts=layouts, roles=roles or self._carry_roles(tv, groups, rank),
                  origin=None if contiguous else tv.origin, origin_kind="" if contiguous else tv.origin_kind,
                  attn=tv.attn, attn_origin=tv.attn_origin)

    def _role_from_expr(self, n: ast.AST) -> str | None:
        # C // heads, dim // num_heads: a head dim
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Div)):
            if _role_of_name(dotted(n.right) if isinstance(n.right, (ast.Name, ast.Attribute)) else None) == "heads":
                return "hdim"
        return None

    @staticmethod
    def _carry_roles(tv: TV, groups, rank: int) -> tuple[str | None, ...] | None:
        if not tv.roles or not groups:
            return None
        roles: list[str | None] = [None] * rank
        for s, t in groups:
            if len(s) == 1 and len(t) == 1:
                roles[t[0]] = tv.roles[s[0]]
        return tuple(roles) if any(roles) else None

    def flatten(self, tv: TV, node: ast.Call) -> TV:
        if tv.rank is None:
            return TV()
        start = int_const(node.args[0]) if node.args else int_const(kwarg(node, "start_dim"))
        end = int_const(node.args[1]) if len(node.args) > 1 else int_const(kwarg(node, "end_dim"))
        start = 0 if start is None and not node.args and kwarg(node, "start_dim") is None else start
        end = -1 if end is None and len(node.args) < 2 and kwarg(node, "end_dim") is None else end
        if start is None or end is None:
            return TV()
        s, e = _norm(start, tv.rank), _norm(end, tv.rank)
        if s is None or e is None or e < s:
            return TV()
        groups = [([d], [d]) for d in range(s)] + [(list(range(s, e + 1)), [s])] + \
                 [([d], [d - (e - s)]) for d in range(e + 1, tv.rank)]
        rank = tv.rank - (e - s)
        dims = None
        if tv.dims:
            dims = tv.dims[:s] + (prod(tv.dims[s:e + 1]) if all(tv.dims[s:e + 1]) else None,) + tv.dims[e + 1:]
        base = tv.layouts or frozenset({_identity(tv.rank)})
        out = set()
        for L in base:
            if _merge_ok(list(range(s, e + 1)), L, set()):
                out.add(_regroup_layout(L, groups, set(), rank))
            else:
                out.add(_identity(rank))
        layouts = frozenset(out)
        contiguous = layouts == frozenset({_identity(rank)})
        return TV(rank=rank, dims=dims, layouts=layouts, origin=None if contiguous else tv.origin,
                  origin_kind="" if contiguous else tv.origin_kind, attn=tv.attn, attn_origin=tv.attn_origin)

    def unflatten(self, tv: TV, node: ast.Call, args: list[Any]) -> TV:
        d = int_const(node.args[0])
        sizes = args[1]
        if tv.rank is None or d is None or not isinstance(sizes, TupleV) or sizes.homogeneous:
            return TV()
        nd = _norm(d, tv.rank)
        if nd is None:
            return TV()
        k = len(sizes.items)
        rank = tv.rank + k - 1
        groups = [([i], [i]) for i in range(nd)] + [([nd], list(range(nd, nd + k)))] + \
                 [([i], [i + k - 1]) for i in range(nd + 1, tv.rank)]
        base = tv.layouts or frozenset({_identity(tv.rank)})
        layouts = frozenset(_regroup_layout(L, groups, set(), rank) for L in base)
        contiguous = layouts == frozenset({_identity(rank)})
        return TV(rank=rank, layouts=layouts, origin=None if contiguous else tv.origin,
                  origin_kind="" if contiguous else tv.origin_kind)

    def rearrange(self, tv: TV, node: ast.Call, kws: dict[str, Any]) -> TV:
        pattern = node.args[1]
        if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str) and "->" in pattern.value):
            return TV()
        lhs, rhs = pattern.value.split("->", 1)
        left, right = _einops_side(lhs), _einops_side(rhs)
        if left is None or right is None:
            return TV()
        if tv.rank is not None and tv.rank != len(left):
            return TV()
        elem_in = [a for g in left for a in g]
        elem_out = [a for g in right for a in g]
        if sorted(a for a in elem_in if a != "1") != sorted(a for a in elem_out if a != "1") or \
                len(set(a for a in elem_in if a != "1")) != len([a for a in elem_in if a != "1"]):
            return TV()
        names = set(elem_in)
        base = tv.layouts or frozenset({_identity(len(left))})
        out_layouts = set()
        for L in base:
            keys: dict[str, float] = {}
            for g, group in enumerate(left):
                for k, a in enumerate(group):
                    if a != "1":
                        keys[a] = L[g] + k / (len(group) + 1)
            merged_ok = True
            for group in right:
                live = [a for a in group if a != "1"]
                if len(live) > 1:
                    order = sorted(keys, key=keys.get)  # type: ignore[arg-type]
                    idx = [order.index(a) for a in live]
                    if any(b != a + 1 for a, b in zip(idx, idx[1:])):
                        merged_ok = False
            if not merged_ok:
                out_layouts.add(_identity(len(right)))
                continue
            group_keys = []
            for group in right:
                live = [a for a in group if a != "1"]
                group_keys.append(keys[live[0]] if live else 10.0 ** 6)
            out_layouts.add(_relabel(group_keys))
        layouts = frozenset(out_layouts)
        rank = len(right)
        contiguous = layouts == frozenset({_identity(rank)})
        roles = tuple(_einops_role(g, names) for g in right)
        return TV(rank=rank, layouts=layouts, origin=None if contiguous else node,
                  origin_kind="" if contiguous else "rearrange", roles=roles if any(roles) else None,
                  attn=tv.attn, attn_origin=tv.attn_origin, cond=tv.cond)  # a permuted score matrix still is one

    @staticmethod
    def _int_list(nodes: list[ast.expr]) -> list[int] | None:
        if len(nodes) == 1 and isinstance(nodes[0], (ast.Tuple, ast.List)):
            nodes = list(nodes[0].elts)
        out = [int_const(n) for n in nodes]
        return out if out and all(o is not None for o in out) else None  # type: ignore[return-value]


def _einops_side(text: str) -> list[list[str]] | None:
    groups: list[list[str]] = []
    current: list[str] | None = None
    for tok in re.findall(r"\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+|\.\.\.|\S", text):
        if tok == "(":
            if current is not None:
                return None
            current = []
        elif tok == ")":
            if current is None:
                return None
            groups.append(current)
            current = None
        elif tok == "..." or (tok.isdigit() and tok != "1") or not (tok[0].isalpha() or tok[0] == "_" or tok == "1"):
            return None
        elif current is not None:
            current.append(tok)
        else:
            groups.append([tok])
    return groups if current is None else None


def _einops_role(group: list[str], names: set[str]) -> str | None:
    if len(group) != 1:
        return None
    a = group[0].lower()
    if a in ("h", "nh", "heads", "head", "n_heads", "num_heads") and ("w" not in names and "W" not in names):
        return "heads"
    if a in ("d", "hd", "dh", "head_dim", "c") and len(names) > 2:
        return "hdim" if a != "c" else None
    return None
