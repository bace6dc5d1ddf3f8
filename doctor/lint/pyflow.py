"""A small abstract interpreter for tensor code, one function at a time, shared by the rules
that need to know what a name holds: naive attention (GPU001), view after a transpose (GPU003),
shape values held as tensors (GPU004) and flash_attn's layout (GPU008).

Each name is bound to an abstract value. For a tensor (`TV`) that is its rank and symbolic sizes
when known (`B, N, C = x.shape`, `x.view(B, N, H, C // H)`), the candidate memory orders of its
dimensions (`layouts`: one tuple per possible layout, giving each dimension's rank in memory,
outermost 0; transpose and permute permute it, SDPA's output has two candidates because its
layout depends on the backend), the role of each dimension (heads, head_dim) where names or
einops patterns say so, whether it is an attention score / probability matrix, and whether it
holds sizes.

The analysis is flow-sensitive in straight-line code and joins branches conservatively: a name
whose value differs between two paths becomes unknown, and unknown values never produce
findings. Precision comes first: every verdict needs positive evidence (a transpose seen in this
function, a view whose sizes prove a merge of non-adjacent dimensions).

The values and events live in `gpudoctor.lint.pyvalues`; this module is the interpreter
(`Interp`), one class of about 1,150 lines on purpose: each statement and expression form is a
method over the same environment, and splitting them would scatter one evaluation order over
several files.
"""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from typing import Any

from gpudoctor.lint.shapetables import table_rank
from gpudoctor.lint.pysource import PySource, call_name, dotted, int_const, kwarg
from gpudoctor.lint.pyvalues import (AttentionEvent, FlashLayoutEvent, IterV, Named, PROBS_HELPERS, ShapeArgEvent,
                                     ShapeTensorEvent, ShapeV, SizeCall, Sym, TV, TupleV, ViewEvent, WILD,
                                     match_groups, prod, _CREATE, _ELEMENTWISE, _FLASH, _INT_DTYPES, _LIBRARIES,
                                     _MISSING, _NOT_HELPERS, _SHAPE_KEEPING, _SHAPE_KW, _as_tv, _blank, _identity,
                                     _join_tv, _merge_ok, _norm, _regroup_layout, _relabel, _role_of_name)


# --- the interpreter ---------------------------------------------------------------------------


class Interp:
    """Runs over every function (and the module body) of one file; collects events."""

    def __init__(self, src: PySource, param_seeds: dict[str, TV] | None = None) -> None:
        self.src = src
        self.events: list[Any] = []
        self.kw_sizes: dict[str, TV] = {}  # keyword name -> size tensor passed under it
        self.param_seeds = param_seeds or {}
        self.fn_seeds: dict[int, dict[str, TV]] = {}  # id(function node) -> its seeded parameters
        self.calls: list[SizeCall] = []  # size tensors passed to calls of the project's code
        self._fn: ast.AST | None = None
        # functions of this file that return a softmax of scores (get_attention_scores), and the
        # names to treat that way on a second run
        self.returns_probs: set[str] = set()
        self.returns_scores: set[str] = set()
        self.probs_funcs: set[str] = set(PROBS_HELPERS)
        self._current = ""
        self._scalar_reported: set[int] = set()
        self._attn_reported: set[int] = set()

    # entry points

    def run(self, want=None) -> None:
        """Interpret the module body and every function (those `want(fn)` accepts)."""
        tree = self.src.tree
        self.block(tree.body, {})
        for node in self.src.functions:
            if want is None or want(node):
                self._current = node.name
                self._fn = node
                env: dict[str, Any] = {}
                a = node.args
                seeds = self.fn_seeds.get(id(node), {})
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    seed = seeds.get(arg.arg) or self.param_seeds.get(arg.arg)
                    if seed is not None:
                        env[arg.arg] = seed
                self.block(node.body, env)
                self._fn = None

    # statements

    def block(self, stmts: list[ast.stmt], env: dict[str, Any]) -> None:
        for s in stmts:
            self.stmt(s, env)

    def stmt(self, s: ast.stmt, env: dict[str, Any]) -> None:
        if isinstance(s, ast.Assign):
            v = self.ev(s.value, env)
            for t in s.targets:
                self.bind(t, v, s.value, env)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.bind(s.target, self.ev(s.value, env), s.value, env)
        elif isinstance(s, ast.AugAssign):
            cur = self.ev(s.target, env) if isinstance(s.target, ast.Name) else None
            other = self.ev(s.value, env)
            if isinstance(s.target, ast.Name):
                env[s.target.id] = self.binop(cur, other, s.op, s)
        elif isinstance(s, (ast.Expr, ast.Return)):
            if s.value is not None:
                v = self.ev(s.value, env)
                if isinstance(s, ast.Return) and isinstance(v, TV) and v.attn and not v.cond and self._current:
                    (self.returns_probs if v.attn == "probs" else self.returns_scores).add(self._current)
        elif isinstance(s, ast.If):
            self.ev(s.test, env)
            a, b = dict(env), dict(env)
            self.block(s.body, a)
            self.block(s.orelse, b)
            self._join_into(env, a, b)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            it = self.ev(s.iter, env)
            body = dict(env)
            self.bind_iter(s.target, it, s.iter, body)
            self.block(s.body, body)
            self.block(s.orelse, body)
            self._join_into(env, dict(env), body)
        elif isinstance(s, ast.While):
            self.ev(s.test, env)
            body = dict(env)
            self.block(s.body, body)
            self.block(s.orelse, body)
            self._join_into(env, dict(env), body)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.ev(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, None, env)
            self.block(s.body, env)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            start = dict(env)
            body = dict(env)
            self.block(s.body, body)  # type: ignore[attr-defined]
            self.block(s.orelse, body)  # type: ignore[attr-defined]
            paths = [body]
            for h in s.handlers:  # type: ignore[attr-defined]
                he = dict(start)
                if h.name:
                    he[h.name] = None
                self.block(h.body, he)
                paths.append(he)
            self._join_into(env, *paths)
            self.block(s.finalbody, env)  # type: ignore[attr-defined]
        elif isinstance(s, ast.Match):
            self.ev(s.subject, env)
            paths = []
            for case in s.cases:
                ce = dict(env)
                self.block(case.body, ce)
                paths.append(ce)
            self._join_into(env, dict(env), *paths)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            env[s.name] = None  # bodies are analysed on their own
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    env.pop(t.id, None)
        elif isinstance(s, ast.Assert):
            self.ev(s.test, env)
        elif isinstance(s, ast.Raise) and s.exc is not None:
            self.ev(s.exc, env)

    @staticmethod
    def _join_into(env: dict[str, Any], *paths: dict[str, Any]) -> None:
        first, rest = paths[0], paths[1:]
        joined = {}
        for k, v in first.items():
            others = [p.get(k, _MISSING) for p in rest]
            if all(o == v for o in others):
                joined[k] = v
            else:
                merged = _join_tv([v, *others])
                if merged is not None:
                    joined[k] = merged
        env.clear()
        env.update(joined)

    # binding

    def bind(self, target: ast.AST, v: Any, value_node: ast.AST | None, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = v
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            self._target_names = [e.id if isinstance(e, ast.Name) and e.id != "_" else None for e in elts]
            if any(isinstance(e, ast.Starred) for e in elts):
                for e in elts:
                    self.bind(e.value if isinstance(e, ast.Starred) else e, None, None, env)
                return
            items = self._unpack(v, len(elts), value_node, env)
            if isinstance(value_node, (ast.Tuple, ast.List)) and len(value_node.elts) == len(elts):
                for e, item, vn in zip(elts, items, value_node.elts):
                    self.bind(e, item, vn, env)
            else:
                for e, item in zip(elts, items):
                    self.bind(e, item, None, env)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, None, None, env)
        # attribute / subscript targets: the value was evaluated, nothing is bound

    def _unpack(self, v: Any, n: int, value_node: ast.AST | None, env: dict[str, Any]) -> list[Any]:
        if isinstance(v, TupleV):
            if v.homogeneous:
                return [v.items[0]] * n
            if len(v.items) == n:
                return list(v.items)
            return [None] * n
        if isinstance(v, ShapeV):
            if v.dims is not None and len(v.dims) == n:
                return list(v.dims)
            # `B, N, C = x.shape`: the names become x's symbolic sizes.
            if value_node is not None and v.owner_name and (v.owner.rank in (None, n)):
                names = self._target_names
                dims = tuple(Sym.named(nm) if nm else Sym.named(f"{v.owner_name}.shape[{i}]")
                             for i, nm in enumerate(names[:n] + [None] * (n - len(names))))
                env[v.owner_name] = replace(v.owner, rank=n, dims=dims)
                return list(dims)
            return [None] * n
        if isinstance(v, TV):
            if v.sizes and v.rank == 1:
                return [TV(rank=0, scalar_of=value_node, seed=v.seed)] * n
            if v.sizes and v.rank and v.rank > 1:
                return [TV(rank=v.rank - 1, sizes=True, seed=v.seed)] * n
            if v.rank:
                return [self._index_dim0(v)] * n
        return [None] * n

    _target_names: list[str | None] = []

    def bind_iter(self, target: ast.AST, it: Any, iter_node: ast.AST, env: dict[str, Any]) -> None:
        elem: Any = None
        if isinstance(it, IterV):
            elem = it.elem
        elif isinstance(it, TupleV):
            elem = it.items[0] if it.homogeneous else None
        elif isinstance(it, TV) and it.rank:
            elem = TV(rank=it.rank - 1, sizes=True, seed=it.seed) if it.sizes else self._index_dim0(it)
            if it.sizes and it.rank == 1:
                elem = TV(rank=0, scalar_of=iter_node, seed=it.seed)
            elif it.sizes and it.rank == 2:
                # rows of a size tensor: unpacking a row gives 0-d tensors
                elem = TV(rank=1, sizes=True, scalar_of=iter_node, seed=it.seed)
        self._bind_elem(target, elem, iter_node, env)

    def _bind_elem(self, target: ast.AST, elem: Any, iter_node: ast.AST, env: dict[str, Any]) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(elem, TV) and elem.sizes and elem.rank == 1:
                for e in target.elts:
                    self.bind(e, TV(rank=0, scalar_of=elem.scalar_of or iter_node, seed=elem.seed), None, env)
            elif isinstance(elem, TupleV) and not elem.homogeneous and len(elem.items) == len(target.elts):
                for e, item in zip(target.elts, elem.items):
                    self._bind_elem(e, item, iter_node, env)
            else:
                self.bind(target, elem, None, env)
            return
        if isinstance(elem, TV) and elem.scalar_of is not None and elem.rank == 1:
            elem = replace(elem, scalar_of=None)  # a row bound to one name: unpacking it names it
        self.bind(target, elem, None, env)

    # expressions

    def ev(self, node: ast.AST | None, env: dict[str, Any]) -> Any:
        if node is None:
            return None
        t = type(node)
        if t is ast.Name:
            if node.id in env:  # type: ignore[attr-defined]
                return env[node.id]  # type: ignore[attr-defined]
            return Named(node.id)  # type: ignore[attr-defined]
        if t is ast.Constant:
            value = node.value  # type: ignore[attr-defined]
            return Sym(value) if type(value) is int else None
        if t is ast.Attribute:
            return self.attribute(node, env)  # type: ignore[arg-type]
        if t is ast.Call:
            return self.call(node, env)  # type: ignore[arg-type]
        if t is ast.Subscript:
            return self.subscript(node, env)  # type: ignore[arg-type]
        if t is ast.BinOp:
            left = self.ev(node.left, env)  # type: ignore[attr-defined]
            right = self.ev(node.right, env)  # type: ignore[attr-defined]
            return self.binop(left, right, node.op, node, node.left, node.right)  # type: ignore[attr-defined]
        if t is ast.UnaryOp:
            v = self.ev(node.operand, env)  # type: ignore[attr-defined]
            if isinstance(v, Sym) and isinstance(node.op, ast.USub):  # type: ignore[attr-defined]
                return Sym(-v.coef, v.factors)
            return v if isinstance(v, TV) else None
        if t in (ast.Tuple, ast.List):
            return TupleV(tuple(self.ev(e, env) for e in node.elts))  # type: ignore[attr-defined]
        if t in (ast.ListComp, ast.GeneratorExp, ast.SetComp):
            inner = dict(env)
            for gen in node.generators:  # type: ignore[attr-defined]
                it = self.ev(gen.iter, inner)
                self.bind_iter(gen.target, it, gen.iter, inner)
                for cond in gen.ifs:
                    self.ev(cond, inner)
            return TupleV((self.ev(node.elt, inner),), homogeneous=True)  # type: ignore[attr-defined]
        if t is ast.DictComp:
            return None
        if t is ast.IfExp:
            self.ev(node.test, env)  # type: ignore[attr-defined]
            a = self.ev(node.body, env)  # type: ignore[attr-defined]
            b = self.ev(node.orelse, env)  # type: ignore[attr-defined]
            return a if a == b else None
        if t is ast.Dict:
            for k, v in zip(node.keys, node.values):  # type: ignore[attr-defined]
                val = self.ev(v, env)
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    self._note_keyword(k.value, v, val)
            return None
        if t is ast.NamedExpr:
            v = self.ev(node.value, env)  # type: ignore[attr-defined]
            self.bind(node.target, v, node.value, env)  # type: ignore[attr-defined]
            return v
        if t in (ast.Compare, ast.BoolOp):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.ev(child, env)
            return None
        if t in (ast.Starred, ast.Await):
            return self.ev(node.value, env)  # type: ignore[attr-defined]
        if t is ast.JoinedStr or t is ast.Lambda:
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.ev(child, env)
        return None

    def attribute(self, node: ast.Attribute, env: dict[str, Any]) -> Any:
        if self._is_module(node.value):
            return Named(self.src.qualname(node) or node.attr)
        recv = self.ev(node.value, env)
        attr = node.attr
        if attr == "shape":
            tv = _as_tv(recv)
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            return ShapeV(tv, owner, tv.dims)
        if isinstance(recv, TV):
            if attr in ("mT", "mH"):
                return self.transpose(recv, -2, -1, node)
            if attr in ("T", "H"):
                r = recv.rank if recv.rank is not None else 2
                return self.permute(recv, list(reversed(range(r))), node)
            if attr == "data":
                return recv
            return None
        key = dotted(node)
        return Named(key) if key else None

    def _is_module(self, node: ast.AST) -> bool:
        """A name (chain) that refers to an imported module: torch, F, torch.nn.functional."""
        while isinstance(node, ast.Attribute):
            node = node.value
        if not isinstance(node, ast.Name):
            return False
        q = self.src.imports.get(node.id)
        if q is not None:
            return not q[:1].isupper() and not q.rsplit(".", 1)[-1][:1].isupper()
        return node.id in ("torch", "F", "nn", "einops", "xformers", "xops", "math")

    # subscripts

    def subscript(self, node: ast.Subscript, env: dict[str, Any]) -> Any:
        recv = self.ev(node.value, env)
        sl = node.slice
        if isinstance(sl, ast.Slice):
            for part in (sl.lower, sl.upper, sl.step):
                self.ev(part, env)
        elif not isinstance(sl, ast.Tuple):
            self.ev(sl, env)
        else:
            for e in sl.elts:
                if not isinstance(e, ast.Slice):
                    self.ev(e, env)
        if _blank(recv):
            return None
        index = int_const(sl)
        if isinstance(recv, ShapeV):
            if index is not None and recv.dims is not None:
                d = _norm(index, len(recv.dims))
                return recv.dims[d] if d is not None else None
            if index is not None:
                key = recv.owner_name or "?"
                rank = recv.owner.rank
                d = _norm(index, rank) if rank is not None else index
                return Sym.named(f"{key}.shape[{d}]")
            if isinstance(sl, ast.Slice) and recv.dims is not None:
                lo, hi = int_const(sl.lower), int_const(sl.upper)
                if sl.step is None and (sl.lower is None or lo is not None) and (sl.upper is None or hi is not None):
                    return TupleV(recv.dims[lo:hi])
            return None
        if isinstance(recv, TupleV):
            if index is not None and not recv.homogeneous and -len(recv.items) <= index < len(recv.items):
                return recv.items[index]
            if recv.homogeneous and index is not None:
                return recv.items[0]
            return None
        if isinstance(recv, TV):
            if recv.sizes and recv.rank is not None and index is not None:
                if recv.rank == 1:
                    return TV(rank=0, scalar_of=node, seed=recv.seed)
                return TV(rank=recv.rank - 1, sizes=True, seed=recv.seed)
            if index is not None and recv.rank:
                return self._index_dim0(recv)
            return self._index(recv, sl)
        return None

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

    # arithmetic

    def binop(self, left: Any, right: Any, op: ast.operator, node: ast.AST,
              lnode: ast.AST | None = None, rnode: ast.AST | None = None) -> Any:
        if isinstance(op, ast.MatMult):
            return self.product(left, right, node, lnode, rnode)
        for side in (left, right):
            if isinstance(side, TV) and side.scalar_of is not None and side.rank == 0:
                self._scalar_use(node, side)
                return TV(rank=0, scalar_of=side.scalar_of, seed=side.seed)
        lt, rt = isinstance(left, TV) and not _blank(left), isinstance(right, TV) and not _blank(right)
        if not lt and not rt:
            ls, rs = self._sym(left), self._sym(right)
            if ls is not None and rs is not None:
                if isinstance(op, ast.Mult):
                    return ls * rs
                if isinstance(op, (ast.FloorDiv, ast.Div)):
                    return ls / rs
            if isinstance(op, (ast.Add, ast.Sub, ast.Mod, ast.Pow)) and lnode is not None:
                return Sym.named("<%s>" % ast.dump(node))
            return None
        if lt and rt:
            a, b = left, right
            layouts = a.layouts if a.layouts == b.layouts else None
            origin = a.origin if layouts is not None else None
            rank = max(a.rank, b.rank) if a.rank is not None and b.rank is not None else None
            attn = a.attn or b.attn
            return TV(rank=rank, layouts=layouts, origin=origin, origin_kind=a.origin_kind if origin else "",
                      dims=a.dims if a.rank == rank and a.dims == b.dims else None,
                      roles=a.roles if a.rank == rank else None,
                      attn=attn, attn_origin=a.attn_origin if a.attn else b.attn_origin)
        tv = left if lt else right
        return replace(tv, src=None, sizes=False) if tv.src or tv.sizes else tv

    @staticmethod
    def _sym(v: Any) -> Sym | None:
        if isinstance(v, Sym):
            return v
        if isinstance(v, Named):
            return Sym.named(v.key)
        return None  # a tensor, an opaque call result, nothing known

    def _scalar_use(self, node: ast.AST, v: TV) -> None:
        origin = v.scalar_of
        if origin is None or id(origin) in self._scalar_reported:
            return
        self._scalar_reported.add(id(origin))
        self.events.append(ShapeTensorEvent(node, origin, v.seed))

    def product(self, a: Any, b: Any, node: ast.AST, anode: ast.AST | None, bnode: ast.AST | None) -> TV:
        a, b = _as_tv(a), _as_tv(b)
        if _blank(a) and a.attn_origin is not None and not self._weightish(bnode):
            # probabilities @ values, if the helper returns probabilities
            a = replace(a, attn="probs", cond=(a.opaque, "probs"))  # type: ignore[arg-type]
        probs = a if a.attn == "probs" else b if b.attn == "probs" else None
        if probs is not None and self._weightish(bnode if probs is a else anode):
            probs = None  # probabilities times a parameter: a classifier, not attention
        rank = max(a.rank, b.rank) if a.rank is not None and b.rank is not None and min(a.rank, b.rank) >= 2 else None
        dims = None
        if rank is not None and a.dims and b.dims and a.rank == b.rank:
            dims = a.dims[:-1] + (b.dims[-1],)
        roles = None
        if rank is not None and b.roles and a.roles and a.rank == b.rank:
            roles = b.roles[:-2] + (a.roles[-2], b.roles[-1])
        out = TV(rank=rank, dims=dims, layouts=frozenset({_identity(rank)}) if rank else None, roles=roles)
        if probs is not None:
            origin = probs.attn_origin
            if origin is not None and id(origin) not in self._attn_reported:
                if probs.cond is None:
                    self._attn_reported.add(id(origin))
                self.events.append(AttentionEvent(origin, node, probs.cond))
            return out
        if self._weightish(anode) or self._weightish(bnode):
            return out
        return replace(out, attn="scores", attn_origin=node)

    @staticmethod
    def _weightish(node: ast.AST | None) -> bool:
        """self.weight, self.proj.weight (also transposed or cast): a module's parameter, not an
        activation."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("t", "transpose", "to", "float", "half", "type_as", "permute"):
            node = node.func.value
        if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
            node = node.value
        if not isinstance(node, ast.Attribute):
            return False
        key = dotted(node)
        return bool(key) and key.startswith("self.")  # type: ignore[union-attr]

    # calls

    def call(self, node: ast.Call, env: dict[str, Any]) -> Any:
        func = node.func
        name = call_name(node)
        is_method = isinstance(func, ast.Attribute) and not self._is_module(func.value)
        recv = self.ev(func.value, env) if is_method else None  # type: ignore[union-attr]
        if not is_method and isinstance(func, ast.Attribute):
            pass  # a module function: nothing to evaluate in the module path
        elif not is_method:
            self.ev(func, env) if not isinstance(func, ast.Name) else None
        args = [self.ev(a, env) for a in node.args]
        kws: dict[str, Any] = {}
        # keywords can reach this file's own functions only through a local call: a method of
        # an object, a name defined or bound here, dict(...); not torch.* or an imported function
        local = is_method or (isinstance(func, ast.Name) and func.id not in self.src.imports)
        for k in node.keywords:
            v = self.ev(k.value, env)
            if k.arg:
                kws[k.arg] = v
                if local:
                    self._note_keyword(k.arg, k.value, v)
        qual = self.src.qualname(func) if not is_method else None
        if qual and isinstance(func, ast.Name):
            name = qual.rsplit(".", 1)[-1]  # `from flash_attn import flash_attn_func as faf`: faf is flash_attn_func
        if name in self.probs_funcs:
            return TV(attn="probs", attn_origin=node)

        if is_method or (isinstance(func, ast.Name) and not (qual or "").startswith(_LIBRARIES)):
            self._note_size_args(node, args, kws)
        if is_method:
            out = self.method(name, _as_tv(recv) if not isinstance(recv, (ShapeV, TupleV)) else recv,
                              recv, node, args, kws, env)
        else:
            out = self.function(qual or name, name, node, args, kws)
        if out is None and args and isinstance(args[0], TV) and args[0].rank and _SHAPE_KEEPING.search(name):
            return replace(args[0], src=None, sizes=False)  # rotary(q), apply_rope(k): same layout, same roles
        if out is None and name and name not in _NOT_HELPERS and not (qual or "").startswith(_LIBRARIES):
            # a call this file cannot see into: the project pass may know what it returns
            return TV(opaque=name, attn_origin=node)
        return out

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
                          roles=roles)
            return TV()
        if q == "torch.cat" and args:
            elem = self._elem(args[0])
            if isinstance(elem, TV) and elem.rank is not None:
                return TV(rank=elem.rank, sizes=elem.sizes, layouts=frozenset({_identity(elem.rank)}))
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
        return None

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
                          roles=roles.pop() if len(roles) == 1 else None)
        if isinstance(v, TV) and v.rank:
            return TV(rank=v.rank - 1, sizes=v.sizes, seed=v.seed)  # enumerate(sizes) keeps where it came from
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

    @staticmethod
    def _int_list(nodes: list[ast.expr]) -> list[int] | None:
        if len(nodes) == 1 and isinstance(nodes[0], (ast.Tuple, ast.List)):
            nodes = list(nodes[0].elts)
        out = [int_const(n) for n in nodes]
        return out if out and all(o is not None for o in out) else None  # type: ignore[return-value]

    # tensor methods

    def method(self, name: str, tv: Any, raw: Any, node: ast.Call, args: list[Any], kws: dict[str, Any],
               env: dict[str, Any]) -> Any:
        if isinstance(tv, ShapeV):
            if name in ("numel",):
                return None
            return None
        if isinstance(tv, TupleV):
            return None
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
            return replace(tv, sizes=tv.sizes and name in ("to", "cuda", "cpu", "long", "int"))
        if name in ("long", "int") and tv.sizes:
            return tv
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

    # layout operations

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
        if isinstance(node, ast.Attribute):
            return node.attr in ("float16", "bfloat16", "float32", "float64", "half", "float", "double", "int8",
                                 "uint8", "int16", "int32", "int64", "long", "int", "bool", "complex64",
                                 "float8_e4m3fn", "float8_e5m2", "uint16", "uint32") or "dtype" in node.attr
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

    def softmax(self, v: Any) -> TV:
        tv = _as_tv(v)
        if tv.attn == "scores":
            return TV(rank=tv.rank, dims=tv.dims, roles=tv.roles, attn="probs", attn_origin=tv.attn_origin,
                      cond=tv.cond)
        if _blank(tv) and tv.attn_origin is not None:
            # the softmax of a helper's result: probabilities if the helper returns scores
            return TV(attn="probs", attn_origin=tv.attn_origin, cond=(tv.opaque, "scores"))  # type: ignore[arg-type]
        return TV(rank=tv.rank, dims=tv.dims, roles=tv.roles)

    def sdpa(self, q: TV, v: TV, node: ast.Call) -> TV:
        r = q.rank
        dims = None
        if q.dims and v.dims and r:
            dims = q.dims[:-1] + (v.dims[-1],)
        if r is None:
            return TV(roles=q.roles)
        layouts = {_identity(r)}
        if r == 4:
            layouts.add((0, 2, 1, 3))  # memory-efficient: always (B, N, H, D) memory
        if q.layouts:
            layouts |= set(q.layouts)  # flash and cuDNN: the output is laid out like the query
        return TV(rank=r, dims=dims, layouts=frozenset(layouts), origin=node, origin_kind="sdpa", roles=q.roles)

    # einops

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
                  origin_kind="" if contiguous else "rearrange", roles=roles if any(roles) else None)

    # flash_attn

    def flash(self, name: str, node: ast.Call, args: list[Any], kws: dict[str, Any]) -> None:
        params = _FLASH[name]
        vals = []
        for i, p in enumerate(params):
            n = node.args[i] if i < len(node.args) else kwarg(node, p)
            vals.append((p, n, args[i] if i < len(args) else kws.get(p)))
        for p, n, v in vals:
            packed = p in ("qkv", "kv")
            if isinstance(v, TV) and v.rank == (5 if packed else 4) and v.roles and v.roles[1] == "heads" and \
                    n is not None:
                what = ("(batch, heads, 3, seqlen, head_dim)" if p == "qkv" else "(batch, heads, 2, seqlen, head_dim)") \
                    if packed else "(batch, heads, seqlen, head_dim) (the SDPA layout)"
                wants = "(batch, seqlen, 3, heads, head_dim): stack (b, s, h, d) tensors on dim 2" if p == "qkv" else \
                    "(batch, seqlen, 2, heads, head_dim)" if p == "kv" else "(batch, seqlen, heads, head_dim)"
                self.events.append(FlashLayoutEvent(node, n, f"{p} is laid out {what}; {name} wants {wants}"))
                return
        if name == "flash_attn_func" and len(vals) == 3:
            tvs = [v if isinstance(v, TV) else None for _, _, v in vals]
            dims = [t.dims if t is not None and t.rank == 4 and t.dims and all(t.dims) else None for t in tvs]
            if all(dims) and len(set(dims)) == 2:
                # q, k, v built with the same sizes, one of them transposed on the way
                for i, d in enumerate(dims):
                    others = {x for j, x in enumerate(dims) if j != i}
                    if len(others) == 1 and d == (lambda o: (o[0], o[2], o[1], o[3]))(next(iter(others))) and \
                            tvs[i].t12 % 2 == 1:  # type: ignore[union-attr]
                        p, n, _ = vals[i]
                        kept = [q for j, (q, _, _) in enumerate(vals) if j != i]
                        self.events.append(FlashLayoutEvent(
                            node, n, f"only {p} went through transpose(1, 2), not {', '.join(kept)}: {name} wants "
                                     f"all of q, k, v in (batch, seqlen, heads, head_dim)"))
                        return
        if name == "flash_attn_func" and len(vals) == 3 and all(isinstance(n, ast.Name) for _, n, _ in vals):
            tvs = [_as_tv(v) for _, _, v in vals]
            if all(t.src for t in tvs) and len({t.t12 % 2 for t in tvs}) > 1:
                moved = [p for (p, _, _), t in zip(vals, tvs) if t.t12 % 2]
                kept = [p for (p, _, _), t in zip(vals, tvs) if not t.t12 % 2]
                where = next(n for (p, n, _), t in zip(vals, tvs) if t.t12 % 2)
                self.events.append(FlashLayoutEvent(
                    node, where, f"only {', '.join(moved)} went through transpose(1, 2), not "
                                 f"{', '.join(kept)}: {name} wants all of q, k, v in (batch, seqlen, "
                                 f"heads, head_dim)"))


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
