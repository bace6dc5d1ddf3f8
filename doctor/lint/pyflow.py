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

The values and events live in `gpudoctor.lint.pyvalues`. This module holds the interpreter's core
(`Interp`: statements, binding, expressions, the call dispatch); the operations are mixins by
concern: `pylayout` (transpose, view, reshape, einops), `pyattention` (products, softmax, SDPA,
flash_attn), `pysizes` (tensors of sizes, GPU004) and `pycalls` (what torch functions and tensor
methods return).
"""
from __future__ import annotations

import ast
from dataclasses import replace
from typing import Any

from gpudoctor.lint.pyattention import AttentionOps
from gpudoctor.lint.pycalls import CallOps
from gpudoctor.lint.pylayout import LayoutOps
from gpudoctor.lint.pysizes import SizeOps
from gpudoctor.lint.pysource import PySource, call_name, dotted, int_const
from gpudoctor.lint.pyvalues import (Carried, DictV, IterV, Named, PROBS_HELPERS, ShapeV, SizeCall, Sym, TV, TupleV,
                                     _LIBRARIES, _MISSING, _NOT_HELPERS, _SHAPE_KEEPING, _as_tv, _blank, _norm, export,
                                     join_values, materialise)


# --- the interpreter ---------------------------------------------------------------------------


class Interp(CallOps, LayoutOps, AttentionOps, SizeOps):
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
        # Values that cross functions inside the file (sizes only: see pyvalues.export):
        # attributes of self, by (class, attribute), as every method reads them, and what each
        # method stores there; and what this file's functions return ("f", "Class.m").
        self.fields: dict[tuple[str, str], Any] = {}
        self.field_stores: dict[tuple[str, str], Any] = {}
        self.returns: dict[str, Carried] = {}
        self._returns_seen: dict[str, Carried] = {}
        # functions of other modules known to return sizes (qualified name -> carried value),
        # from the project pass
        self.return_seeds: dict[str, Carried] = {}
        self._cls: ast.ClassDef | None = None
        self._class_of: dict[int, ast.ClassDef] = {}
        self._classes: dict[str, ast.ClassDef] = {}
        for cls in src.classes:
            self._classes.setdefault(cls.name, cls)
            for m in cls.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._class_of[id(m)] = cls
        self._toplevel = {f.name: f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self._through: dict[tuple[int, bool], int | None] = {}
        self._submodules: dict[tuple[str, str], str] | None = None

    # entry points

    # How many times the functions that read a changed attribute or call a function whose return
    # value changed are interpreted again: the values are a small lattice (a tensor of sizes of
    # rank 0-2, lists and dicts of those), so this converges in two or three rounds.
    ROUNDS = 3

    def run(self, want=None) -> None:
        """Interpret the module body and every function (those `want(fn)` accepts); then again the
        functions that read an attribute of self a method stored sizes in, or call a function of
        the file that returns sizes, until nothing changes."""
        tree = self.src.tree
        self.block(tree.body, {})
        todo = [fn for fn in self.src.functions if want is None or want(fn)]
        for _ in range(self.ROUNDS + 1):
            for node in todo:
                self.interpret(node)
            fields = {k: v for k, v in self.field_stores.items() if self.fields.get(k) != v}
            returns = {k: v for k, v in self.returns.items() if self._returns_seen.get(k) != v}
            if not fields and not returns:
                break
            self.fields.update(fields)
            self._returns_seen.update(returns)
            words = {f"self.{attr}" for _, attr in fields} | {k.rsplit(".", 1)[-1] + "(" for k in returns}
            words |= {f"self.{attr}(" for (_, attr), cls in self.submodules().items() if f"{cls}.forward" in returns}
            todo = [fn for fn in self.src.functions if any(w in self.src.scope_text(fn) for w in words)]

    def interpret(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._current = node.name
        self._fn = node
        self._cls = self._class_of.get(id(node))
        env: dict[str, Any] = {}
        a = node.args
        seeds = self.fn_seeds.get(id(node), {})
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            seed = seeds.get(arg.arg) or self.param_seeds.get(arg.arg)
            if seed is not None:
                env[arg.arg] = seed
        self.block(node.body, env)
        self._fn = None
        self._cls = None

    # Methods that keep a value what it is (its elements shifted, scaled, masked, re-viewed).
    _KEEP = frozenset({"view", "reshape", "contiguous", "to", "float", "half", "bfloat16", "type_as", "masked_fill",
                       "masked_fill_", "add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_", "clamp", "clamp_",
                       "view_as", "reshape_as"})

    def _passed_through(self, func: ast.expr, arithmetic: bool = False) -> int | None:
        """Which argument a function of this file returns, shifted, scaled, masked or re-viewed
        (`def add_rel_pos(attn, q, ...): attn = attn.view(...) + bias; return attn`): its index
        among the call's arguments, or None."""
        if isinstance(func, ast.Name) and func.id in self._toplevel:
            fn, skip = self._toplevel[func.id], 0
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" and \
                self._cls is not None:
            fn = next((m for m in self._cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and m.name == func.attr), None)
            skip = 1
            if fn is None:
                return None
        else:
            return None
        key = (id(fn), arithmetic)
        if key not in self._through:
            self._through[key] = _through(fn, arithmetic)
        i = self._through[key]
        return i - skip if i is not None and i >= skip else None

    def _fn_key(self, fn: ast.AST) -> str:
        cls = self._class_of.get(id(fn))
        return f"{cls.name}.{fn.name}" if cls is not None else fn.name  # type: ignore[attr-defined]

    def _field(self, attr: str) -> Any:
        """What `self.attr` holds in the current method: stored by a method of its class or of a
        base class of this file."""
        cls, seen = self._cls, 0
        while cls is not None and seen < 8:
            v = self.fields.get((cls.name, attr))
            if v is not None:
                return v
            base = next((b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in self._classes), None)
            cls = self._classes.get(base) if base else None
            seen += 1
        return None

    def _store_field(self, attr: str, v: Any) -> None:
        if self._cls is None or export(v) is None:
            return
        key = (self._cls.name, attr)
        old = self.field_stores.get(key)
        self.field_stores[key] = v if old is None else join_values([old, v])

    def submodules(self) -> dict[tuple[str, str], str]:
        """(class, attribute) -> the class of this file its __init__ builds there
        (`self.encoder = Encoder(...)`): a call of `self.encoder(...)` runs Encoder.forward."""
        if self._submodules is None:
            self._submodules = {}
            for cls in self._classes.values():
                init = next((m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                             m.name == "__init__"), None)
                if init is None:
                    continue
                for st in ast.walk(init):
                    if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call) and \
                            isinstance(st.value.func, ast.Name) and st.value.func.id in self._classes:
                        key = dotted(st.targets[0]) or ""
                        if key.startswith("self.") and key.count(".") == 1:
                            self._submodules[(cls.name, key[5:])] = st.value.func.id
        return self._submodules

    def _returned(self, func: ast.expr, node: ast.Call) -> Any:
        """The value a call of a function of this file (or of the project, from the project
        pass) returns, when it returns sizes: a function, a method of the class, the forward of
        a submodule whose class is in this file."""
        key = None
        if isinstance(func, ast.Name) and func.id in self._toplevel:
            key = func.id
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" and \
                self._cls is not None:
            key = f"{self._cls.name}.{func.attr}"
            if key not in self._returns_seen:
                sub = self.submodules().get((self._cls.name, func.attr))
                if sub is not None:
                    key = f"{sub}.forward"
        elif self.return_seeds:
            q = self.src.qualify(func.id) if isinstance(func, ast.Name) else \
                self.src.qualname(func) if self._is_module(func) else None
            c = self.return_seeds.get(q) if q else None
            return materialise(c, f"return:{q}", node) if c is not None else None
        c = self._returns_seen.get(key) if key else None
        return materialise(c, None, node) if c is not None else None

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
                if isinstance(s, ast.Return) and self._fn is not None:
                    c = export(v)
                    if c is not None:
                        key = self._fn_key(self._fn)
                        old = self.returns.get(key)
                        self.returns[key] = c if old is None or old == c else self.returns[key]
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
                merged = join_values([v, *others])
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
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                self._store_field(target.attr, v)  # read by the class's other methods (run's rounds)
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            # d["grid_sizes"] = sizes: the dict holds it; sizes_list[i] = row: the list does
            held = env.get(target.value.id)
            key = target.slice
            if isinstance(held, DictV) and isinstance(key, ast.Constant) and isinstance(key.value, str):
                env[target.value.id] = held.set(key.value, v)
            elif isinstance(held, TupleV) and export(v) is not None:
                env[target.value.id] = join_values([held, TupleV((v,), homogeneous=True)])

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
                return [TV(rank=0, scalar_of=value_node, seed=v.seed, cpu=v.cpu)] * n
            if v.sizes and v.rank and v.rank > 1:
                return [TV(rank=v.rank - 1, sizes=True, seed=v.seed, cpu=v.cpu)] * n
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
            elem = TV(rank=it.rank - 1, sizes=True, seed=it.seed, cpu=it.cpu) if it.sizes else self._index_dim0(it)
            if it.sizes and it.rank == 1:
                elem = TV(rank=0, scalar_of=iter_node, seed=it.seed, cpu=it.cpu)
            elif it.sizes and it.rank == 2:
                # rows of a size tensor: unpacking a row gives 0-d tensors
                elem = TV(rank=1, sizes=True, scalar_of=iter_node, seed=it.seed, cpu=it.cpu)
        self._bind_elem(target, elem, iter_node, env)

    def _bind_elem(self, target: ast.AST, elem: Any, iter_node: ast.AST, env: dict[str, Any]) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(elem, TV) and elem.sizes and elem.rank == 1:
                for e in target.elts:
                    self.bind(e, TV(rank=0, scalar_of=elem.scalar_of or iter_node, seed=elem.seed, cpu=elem.cpu), None,
                              env)
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
            items = []
            for k, v in zip(node.keys, node.values):  # type: ignore[attr-defined]
                val = self.ev(v, env)
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    self._note_keyword(k.value, v, val)
                    if export(val) is not None:
                        items.append((k.value, val))
                elif k is None and isinstance(val, DictV):  # {**base, ...}
                    items += list(val.items)
            return DictV(tuple(items))
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
        if self.fields and isinstance(node.value, ast.Name) and node.value.id == "self" and "self" not in env:
            stored = self._field(node.attr)
            if stored is not None:
                return stored
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
        parts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        picker = None
        for e in parts:
            if isinstance(e, ast.Slice):
                for bound in (e.lower, e.upper, e.step):
                    b = self.ev(bound, env)
                    if isinstance(b, TV) and b.rank == 0 and b.scalar_of is not None:
                        self._scalar_use(node, b)  # x[:, :n] with n a 0-d tensor: __index__, a sync
            else:
                picker = self.ev(e, env)
        if _blank(recv):
            return None
        index = int_const(sl)
        # sizes[i], rows[k]: any index that is not a slice picks one element
        picked = not isinstance(sl, (ast.Slice, ast.Tuple)) and \
            (index is not None or not (isinstance(sl, ast.Constant) or isinstance(sl, ast.Starred)))
        if isinstance(recv, DictV):
            return recv.get(sl.value) if isinstance(sl, ast.Constant) and isinstance(sl.value, str) else None
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
            if recv.homogeneous and picked:
                return recv.items[0]
            return None
        if isinstance(recv, TV):
            if recv.sizes and recv.rank and picked and not isinstance(picker, TV):  # sizes[mask]: advanced indexing
                if recv.rank == 1:
                    return TV(rank=0, scalar_of=node, seed=recv.seed, cpu=recv.cpu)
                return TV(rank=recv.rank - 1, sizes=True, seed=recv.seed, cpu=recv.cpu)
            if index is not None and recv.rank:
                return self._index_dim0(recv)
            if recv.sizes and recv.rank and isinstance(sl, ast.Slice):
                return recv  # offsets[:-1]: fewer rows of the same sizes
            return self._index(recv, sl)
        return None

    # arithmetic

    def binop(self, left: Any, right: Any, op: ast.operator, node: ast.AST,
              lnode: ast.AST | None = None, rnode: ast.AST | None = None) -> Any:
        if isinstance(op, ast.MatMult):
            return self.product(left, right, node, lnode, rnode)
        for side in (left, right):
            if isinstance(side, TV) and side.scalar_of is not None and side.rank == 0:
                self._scalar_use(node, side, arithmetic=True)
                return TV(rank=0, scalar_of=side.scalar_of, seed=side.seed, cpu=side.cpu)
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
        other = right if lt else left
        if tv.sizes and tv.rank and (isinstance(other, (Sym, Named)) or (other is None and lnode is not None)) and \
                isinstance(op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
            # (lengths + page - 1) // page, lengths % page: sizes still, element by element
            return replace(tv, src=None, scalar_of=None)
        return replace(tv, src=None, sizes=False) if tv.src or tv.sizes else tv

    @staticmethod
    def _sym(v: Any) -> Sym | None:
        if isinstance(v, Sym):
            return v
        if isinstance(v, Named):
            return Sym.named(v.key)
        return None  # a tensor, an opaque call result, nothing known

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
        spread: list[tuple[str, Any, ast.expr]] = []  # f(**kwargs): the dict's entries, as keywords
        for k in node.keywords:
            v = self.ev(k.value, env)
            if k.arg:
                kws[k.arg] = v
                if local:
                    self._note_keyword(k.arg, k.value, v)
            elif isinstance(v, DictV):
                for key, item in v.items:
                    kws.setdefault(key, item)
                    spread.append((key, item, k.value))
                    if local:
                        self._note_keyword(key, k.value, item)
        qual = self.src.qualname(func) if not is_method else None
        if qual and isinstance(func, ast.Name):
            name = qual.rsplit(".", 1)[-1]  # `from flash_attn import flash_attn_func as faf`: faf is flash_attn_func
        if name in self.probs_funcs:
            return TV(attn="probs", attn_origin=node)

        if is_method or (isinstance(func, ast.Name) and not (qual or "").startswith(_LIBRARIES)):
            self._note_size_args(node, args, kws, spread)
        if is_method and name == "register_buffer" and len(args) >= 2 and isinstance(func.value, ast.Name) and \
                func.value.id == "self" and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            # self.register_buffer("lens", sizes): self.lens, moved with the module (model.cuda())
            buf = args[1]
            self._store_field(node.args[0].value, replace(buf, cpu=False) if isinstance(buf, TV) else buf)
        if is_method:
            out = self.method(name, _as_tv(recv) if not isinstance(recv, (ShapeV, TupleV, DictV)) else recv,
                              recv, node, args, kws, env)
        else:
            out = self.function(qual or name, name, node, args, kws)
        if out is None and (self._returns_seen or self.return_seeds):
            out = self._returned(func, node)
        if out is None and args and any(isinstance(a, TV) and a.attn for a in args):
            through = self._passed_through(func)
            if through is not None and through < len(args) and isinstance(args[through], TV) and args[through].attn:
                a = args[through]  # add_rel_pos(attn, ...): the scores, biased, come back
                return TV(attn=a.attn, attn_origin=a.attn_origin, cond=a.cond)
        if out is None and any(isinstance(a, TV) and a.sizes and a.rank for a in args):
            through = self._passed_through(func, arithmetic=True)
            if through is not None and through < len(args) and isinstance(args[through], TV) and \
                    args[through].sizes and args[through].rank:
                return replace(args[through], scalar_of=None)  # page_count(lengths): sizes, computed element by element
        if out is None and args and isinstance(args[0], TV) and args[0].rank and _SHAPE_KEEPING.search(name):
            return replace(args[0], src=None, sizes=False)  # rotary(q), apply_rope(k): same layout, same roles
        if out is None and name and name not in _NOT_HELPERS and not (qual or "").startswith(_LIBRARIES):
            # a call this file cannot see into: the project pass may know what it returns
            return TV(opaque=name, attn_origin=node)
        return out


def _through(fn: ast.AST, arithmetic: bool = False) -> int | None:
    """The index of the parameter `fn` returns kept what it is (see Interp._passed_through): every
    return returns that parameter's name, and every assignment to it rebuilds it from itself
    through arithmetic, subscripts and the methods of Interp._KEEP. With `arithmetic`, the one
    return may be such an expression itself (`return (length + self.page - 1) // self.page`)."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]  # type: ignore[attr-defined]
    if arithmetic:
        returns_ = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
        if len(returns_) != 1 or returns_[0].value is None:
            return None
        value = returns_[0].value
        used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} & (set(params) - {"self", "cls"})
        if len(used) != 1 or not _rebuilt_from(value, next(iter(used))):
            return None
        name = used.pop()
        for n in ast.walk(fn):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target)):
                return None
        return params.index(name)
    returns: list[ast.expr | None] = []
    assigned: list[ast.expr] = []
    stack = list(fn.body)  # type: ignore[attr-defined]
    name = None
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return):
            returns.append(node.value)
        stack.extend(ast.iter_child_nodes(node))
    if not returns or not all(isinstance(r, ast.Name) for r in returns) or len({r.id for r in returns}) != 1:  # type: ignore[union-attr]
        return None
    name = returns[0].id  # type: ignore[union-attr]
    if name not in params:
        return None
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                if not all(isinstance(t, ast.Name) for t in targets) or node.value is None:
                    return None
                assigned.append(node.value)
    return params.index(name) if all(_rebuilt_from(v, name) for v in assigned) else None


def _rebuilt_from(e: ast.AST, name: str) -> bool:
    """`attn.view(...) + bias[..., None]`, `attn * scale`, `attn.masked_fill(mask, -inf)`: built
    from `name` by arithmetic and keeping methods only."""
    if isinstance(e, ast.Name):
        return e.id == name
    if isinstance(e, ast.BinOp):
        return _rebuilt_from(e.left, name) or _rebuilt_from(e.right, name)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in Interp._KEEP:
        return _rebuilt_from(e.func.value, name)
    return False
