"""GPU009's Python side: the project's own calls of a C++ binding, with which arguments are known
to be dense (made at the call, or held by a name, a dict entry or an attribute that every
assignment in the module makes so). gpudoctor.lint.cpprules reads the C++ side and asks here.

Standard library only (`ast`).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

# Calls whose result is a new tensor in the default (contiguous) layout.
_PY_FRESH = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "linspace", "eye", "cat",
             "stack", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "tensor", "contiguous"}
# A copy that keeps the layout of the tensor it comes from (memory_format=torch.preserve_format).
_PY_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
# Methods whose result is dense when the tensor they are called on is.
_PY_KEEPS = {"to", "float", "half", "bfloat16", "double", "int", "long", "short", "byte", "bool", "cuda", "cpu",
             "clone", "view", "detach", "requires_grad_", "fill_", "zero_", "type"}


@dataclass
class PyCall:
    """One call of a binding in the project's Python code, with which arguments are known to be
    dense: created at the call (torch.empty, torch.zeros, .contiguous(), ...), or a name, a
    `d["key"]` entry or an `obj.attr` every assignment of which in the module is."""
    path: str
    line: int
    positional: list[tuple[bool, str]]
    keywords: dict[str, tuple[bool, str]]
    starred: bool

    def arity_fits(self, params: list[str]) -> bool:
        return not self.starred and len(self.positional) + len(self.keywords) <= len(params) and \
            all(k in params[len(self.positional):] for k in self.keywords)

    def _arg(self, i: int, name: str) -> tuple[bool, str] | None:
        if i < len(self.positional):
            return self.positional[i]
        return self.keywords.get(name)

    def fresh_at(self, i: int, name: str) -> bool:
        arg = self._arg(i, name)
        return arg is None or arg[0]  # left out: a default value (pybind11 py::arg("x") = ...)

    def shown_at(self, i: int, name: str) -> str:
        arg = self._arg(i, name)
        return arg[1] if arg else name


class _Module:
    """What one Python module assigns, for the freshness of a name, a dict entry or an attribute."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.globals: dict[str, list[ast.expr]] = {}
        self.keys: dict[str, list[ast.expr]] = {}
        self.attrs: dict[str, list[ast.expr]] = {}
        self.locals: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self.params: dict[ast.AST, set[str]] = {}
        self._walk(tree, tree)

    def _walk(self, node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                self.params[child] = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | \
                    {x.arg for x in (a.vararg, a.kwarg) if x is not None}
                self.locals[child] = {}
                self._walk(child, child)
                continue
            if isinstance(child, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and child.value is not None:
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                value = child.value if not isinstance(child, ast.AugAssign) else child  # x += y: not fresh
                for t in targets:
                    self._assign(t, value, scope)
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.comprehension)):
                targets = [child.target] if hasattr(child, "target") else \
                    [i.optional_vars for i in child.items if i.optional_vars is not None]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self._bind(n.id, child, scope)  # a loop variable: unknown
            elif isinstance(child, ast.Dict):
                for k, v in zip(child.keys, child.values):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        self.keys.setdefault(k.value, []).append(v)
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                    child.func.attr in ("register_buffer", "register_parameter") and len(child.args) >= 2 and \
                    isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str):
                self.attrs.setdefault(child.args[0].value, []).append(child.args[1])
            self._walk(child, scope)

    def _bind(self, name: str, value: ast.AST, scope: ast.AST) -> None:
        table = self.globals if scope is self.tree else self.locals[scope]
        table.setdefault(name, []).append(value)  # type: ignore[arg-type]

    def _assign(self, target: ast.expr, value: ast.AST, scope: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self._bind(target.id, value, scope)
        elif isinstance(target, ast.Attribute):
            self.attrs.setdefault(target.attr, []).append(value)  # type: ignore[arg-type]
        elif isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and \
                isinstance(target.slice.value, str):
            self.keys.setdefault(target.slice.value, []).append(value)  # type: ignore[arg-type]
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._assign(elt, target, scope)  # unpacked: unknown

    def fresh(self, e: ast.AST, scope: ast.AST, seen: frozenset = frozenset()) -> bool:
        if isinstance(e, ast.Constant):
            return e.value is None
        if isinstance(e, ast.IfExp):
            return self.fresh(e.body, scope, seen) and self.fresh(e.orelse, scope, seen)
        if isinstance(e, ast.Call):
            f = e.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            keywords = {k.arg: k.value for k in e.keywords if k.arg}
            layout = keywords.get("memory_format")
            if layout is not None and not (isinstance(layout, ast.Attribute) and layout.attr == "contiguous_format"):
                return False  # channels_last, preserve_format
            if name in _PY_FRESH:
                return True
            if name in _PY_LIKE:
                return layout is not None or (bool(e.args) and self.fresh(e.args[0], scope, seen))
            if name in _PY_KEEPS and isinstance(f, ast.Attribute):
                return self.fresh(f.value, scope, seen)
            return False
        key = None
        if isinstance(e, ast.Name):
            key = ("name", e.id, id(scope))
            if key in seen:
                return False
            table = self.locals.get(scope, {})
            if e.id in table:
                values = table[e.id]
            elif e.id in self.params.get(scope, ()):
                return False  # whatever the caller passes
            else:
                values = self.globals.get(e.id, [])
                scope = self.tree
        elif isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str):
            key = ("key", e.slice.value)
            values = self.keys.get(e.slice.value, [])
        elif isinstance(e, ast.Attribute):
            key = ("attr", e.attr)
            values = self.attrs.get(e.attr, [])
        else:
            return False
        if key in seen or not values:
            return False
        seen = seen | {key}
        return all(isinstance(v, ast.expr) and self.fresh(v, scope if key[0] == "name" else self._scope_of(v), seen)
                   for v in values)

    def _scope_of(self, node: ast.AST) -> ast.AST:
        for fn in self.locals:
            if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno):  # type: ignore[attr-defined]
                best = fn
                for inner in self.locals:
                    if inner is not fn and fn.lineno <= inner.lineno and (inner.end_lineno or 0) <= (fn.end_lineno or 0) \
                            and inner.lineno <= node.lineno <= (inner.end_lineno or inner.lineno):  # type: ignore
                        best = inner
                return best
        return self.tree


def python_calls(sources: list, names: dict[str, str]) -> dict[str, list[PyCall]]:
    """C++ name -> the calls of its binding in these Python files (PySource objects that mention
    it). `names`: Python-visible name -> C++ name. A name the Python code also defines
    (`def forward`, a wrapper of the same name) cannot be told from the binding: its calls are
    not used, and the finding stands as if there were none."""
    defined = {n.name for src in sources for n in ast.walk(src.tree)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name in names}
    wanted = {py: cxx for py, cxx in names.items() if py not in defined}
    out: dict[str, list[PyCall]] = {}
    if not wanted:
        return out
    for src in sources:
        module: _Module | None = None
        stack: list[tuple[ast.AST, ast.AST]] = [(src.tree, src.tree)]
        while stack:
            node, scope = stack.pop()
            for child in ast.iter_child_nodes(node):
                inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
                stack.append((child, inner))
                if not isinstance(child, ast.Call):
                    continue
                f = child.func
                if isinstance(f, ast.Name):
                    py = f.id
                elif isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id in ("self", "cls")) \
                        and not isinstance(f.value, ast.Call):
                    py = f.attr
                else:
                    continue
                if py not in wanted:
                    continue
                if module is None:
                    module = _Module(src.tree)
                m = module

                def arg(e: ast.expr, m=m, scope=scope) -> tuple[bool, str]:
                    return m.fresh(e, scope), ast.get_source_segment(src.text, e) or ast.dump(e)[:40]

                call = PyCall(src.path, child.lineno, [arg(a) for a in child.args if not isinstance(a, ast.Starred)],
                              {k.arg: arg(k.value) for k in child.keywords if k.arg},
                              any(isinstance(a, ast.Starred) for a in child.args) or any(k.arg is None for k in child.keywords))
                out.setdefault(wanted[py], []).append(call)
    return out
