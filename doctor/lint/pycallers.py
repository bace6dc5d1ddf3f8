"""GPU009's Python side: the project's own calls of a C++ binding, and which tensors they pass
dense (allocated in the default contiguous layout). gpudoctor.lint.engine hands in the Python files
that name a binding; gpudoctor.lint.cpprules decides with the answers (`resolve_data_ptr`).

A tensor is dense when it is made at the call (`torch.empty`, `torch.zeros`, `.contiguous()`, a
`*_like` copy asked for `memory_format=torch.contiguous_format`), when it is a dense tensor seen
through a method that keeps density (`.view()`, `.reshape()`, `.to()`, `.float()`, ...), when it
is a name, a `d["key"]` entry or an attribute (`register_buffer("w", torch.empty(...))` too) every
assignment of which in the module is dense, or when it is a parameter of a function every one of
whose calls in these files passes a dense tensor there (followed MAX_DEPTH callers up).

Which calls are the binding's is decided by name resolution, not by the name alone: `ext.add(...)`,
`_C.add(...)`, `torch.ops.lib.add(...)` on a module (imported, or loaded with
`cpp_extension.load`) and `add(...)` imported from a module that is not one of these Python files
are the binding's; a method call on an object (`x.add(y)`) is not, and `add(...)` resolving to a
Python function of the project (a wrapper of the same name, `def forward`) is that function, whose
own calls of the binding are followed through its parameters.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 3

# Calls whose result is a new tensor in the default (contiguous) layout.
_FRESH = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "linspace", "eye", "cat",
          "stack", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "tensor", "contiguous"}
# A copy that keeps the layout of the tensor it comes from (memory_format=torch.preserve_format).
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
# Methods whose result is dense when the tensor they are called on is.
_KEEPS = {"to", "float", "half", "bfloat16", "double", "int", "long", "short", "byte", "bool", "cuda", "cpu",
          "clone", "view", "reshape", "flatten", "unsqueeze", "squeeze", "detach", "requires_grad_", "fill_", "zero_",
          "type", "view_as", "reshape_as"}
# Module-level loaders of an extension: `ext = load(name=..., sources=[...])`.
_LOADERS = {"load", "load_inline", "import_module", "__import__", "load_library"}


@dataclass
class PyCall:
    """One call of a binding in the project's Python code, with which arguments are known to be
    dense (see the module's docstring)."""
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


_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class _Module:
    """What one Python module assigns, for the freshness of a name, a dict entry or an attribute,
    and its functions, for the freshness of their parameters (from their callers: `project`)."""

    def __init__(self, src: Any, project: "_Calls") -> None:
        self.src, self.tree, self.project = src, src.tree, project
        self.globals: dict[str, list[ast.expr]] = {}
        self.keys: dict[str, list[ast.expr]] = {}
        self.attrs: dict[str, list[ast.expr]] = {}
        self.locals: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self.params: dict[ast.AST, list[str]] = {}
        self.scope_of: dict[int, ast.AST] = {}
        self._walk(self.tree, self.tree)

    def _walk(self, node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _FUNCS):
                a = child.args
                self.params[child] = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + \
                    [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                self.locals[child] = {}
                self._walk(child, child)
                continue
            if isinstance(child, ast.Call):
                self.scope_of[id(child)] = scope
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

    def fresh(self, e: ast.AST, scope: ast.AST, seen: frozenset = frozenset(), depth: int = 0) -> bool:
        if isinstance(e, ast.Constant):
            return e.value is None
        if isinstance(e, ast.IfExp):
            return self.fresh(e.body, scope, seen, depth) and self.fresh(e.orelse, scope, seen, depth)
        if isinstance(e, ast.Call):
            f = e.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            keywords = {k.arg: k.value for k in e.keywords if k.arg}
            layout = keywords.get("memory_format")
            if layout is not None and not (isinstance(layout, ast.Attribute) and layout.attr == "contiguous_format"):
                return False  # channels_last, preserve_format
            if name in _FRESH:
                return True
            if name in _LIKE:
                return layout is not None or (bool(e.args) and self.fresh(e.args[0], scope, seen, depth))
            if name in _KEEPS and isinstance(f, ast.Attribute):
                return self.fresh(f.value, scope, seen, depth)
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
                # whatever the callers pass: dense only if every call of the function does
                return self.project.param_fresh(self, scope, e.id, depth)
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
        return all(isinstance(v, ast.expr) and self.fresh(v, scope if key[0] == "name" else self._scope(v), seen, depth)
                   for v in values)

    def _scope(self, node: ast.AST) -> ast.AST:
        best: ast.AST = self.tree
        for fn in self.locals:
            if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno) and \
                    (best is self.tree or fn.lineno >= best.lineno):  # type: ignore[attr-defined]
                best = fn
        return best


class _Calls:
    """The Python files that name a binding: which calls are the binding's, and the callers of the
    project's own functions (for the freshness of their parameters)."""

    def __init__(self, sources: list) -> None:
        self.sources = sources
        self.modules = {src.path: _Module(src, self) for src in sources}
        self.by_module = {src.module: src for src in sources if getattr(src, "module", None)}
        self._param: dict[tuple[int, str], bool] = {}

    def python_def(self, src: Any, func: ast.expr) -> tuple[Any, ast.AST] | None:
        """The project's Python function a call names, if it names one of these files' functions."""
        if isinstance(func, ast.Name):
            local = _toplevel(src, func.id)
            if local is not None and func.id not in src.imports and func.id not in src.relative:
                return src, local
            q = src.qualify(func.id)
        elif isinstance(func, ast.Attribute):
            q = src.qualname(func)
        else:
            return None
        if not q or "." not in q:
            return None
        module, _, name = q.rpartition(".")
        owner = self.by_module.get(module)
        fn = _toplevel(owner, name) if owner is not None else None
        return (owner, fn) if fn is not None else None

    def is_binding(self, src: Any, call: ast.Call, name: str) -> bool:
        func = call.func
        if self.python_def(src, func) is not None:
            return False  # a Python function of the project (a wrapper of the same name)
        if isinstance(func, ast.Name):
            return True
        if not isinstance(func, ast.Attribute) or isinstance(func.value, ast.Call):
            return False
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id in ("self", "cls"):
            return False
        if root.id in src.imports or root.id in src.relative or root.id == "torch":
            return True  # ext.add(...), _C.add(...), torch.ops.lib.add(...)
        module = self.modules[src.path]
        loaded = module.globals.get(root.id, [])
        return bool(loaded) and all(isinstance(v, ast.Call) and _called(v) in _LOADERS for v in loaded)

    def param_fresh(self, module: _Module, fn: ast.AST, param: str, depth: int) -> bool:
        """A parameter every call of its function in these files passes dense (at least one)."""
        key = (id(fn), param)
        if key in self._param:
            return self._param[key]
        self._param[key] = False  # a cycle proves nothing
        if depth >= MAX_DEPTH or isinstance(fn, ast.Lambda):
            return False
        params = module.params.get(fn, [])
        owner = next((c for c in module.src.classes if fn in c.body), None)
        slot = params.index(param)
        if owner is not None and params and params[0] in ("self", "cls"):
            slot -= 1
        calls = list(self._calls_of(module, fn, owner))
        result = bool(calls)
        for caller_module, call in calls:
            arg = call.args[slot] if 0 <= slot < len(call.args) else \
                next((k.value for k in call.keywords if k.arg == param), None)
            if arg is None or any(isinstance(a, ast.Starred) for a in call.args) or \
                    not caller_module.fresh(arg, caller_module.scope_of.get(id(call), caller_module.tree), depth=depth + 1):
                result = False
                break
        self._param[key] = result
        return result

    def _calls_of(self, module: _Module, fn: ast.AST, owner: ast.ClassDef | None):
        name = fn.name  # type: ignore[attr-defined]
        for src in self.sources:
            m = self.modules[src.path]
            for node in ast.walk(src.tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if owner is not None:
                    if src is module.src and isinstance(f, ast.Attribute) and f.attr == name and \
                            isinstance(f.value, ast.Name) and f.value.id == "self":
                        yield m, node
                elif (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                    hit = self.python_def(src, f)
                    if hit is not None and hit[1] is fn:
                        yield m, node


def _toplevel(src: Any, name: str) -> ast.AST | None:
    return next((f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name),
                None)


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def python_calls(sources: list, names: dict[str, str]) -> dict[str, list[PyCall]]:
    """C++ name -> the calls of its binding in these Python files (PySource objects that mention
    it). `names`: Python-visible name -> C++ name."""
    out: dict[str, list[PyCall]] = {}
    if not names or not sources:
        return out
    calls = _Calls(sources)
    for src in sources:
        module = calls.modules[src.path]
        for node in ast.walk(src.tree):
            if not isinstance(node, ast.Call):
                continue
            py = _called(node)
            if py not in names or not calls.is_binding(src, node, py):
                continue
            scope = module.scope_of.get(id(node), module.tree)

            def arg(e: ast.expr, scope=scope, src=src) -> tuple[bool, str]:
                return module.fresh(e, scope), ast.get_source_segment(src.text, e) or ast.dump(e)[:40]

            out.setdefault(names[py], []).append(PyCall(
                src.path, node.lineno, [arg(a) for a in node.args if not isinstance(a, ast.Starred)],
                {k.arg: arg(k.value) for k in node.keywords if k.arg},
                any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)))
    return out
