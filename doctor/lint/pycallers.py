"""GPU009's Python side: the project's own calls of a C++ binding, with which arguments are known
to be dense. gpudoctor.lint.engine hands in the Python files that call a binding's name (and a
way to get more: a wrapper's callers); gpudoctor.lint.cpprules decides with the answers
(`resolve_data_ptr`).

A call is a call of the binding only when what it calls is the extension: `_C.fwd(...)` where
`_C` is imported (`from pkg import _C`, `import ext_cuda`), loaded (`load(...)`,
`importlib.import_module(...)`) or `torch.ops.ns`; `fwd(...)` imported from such a module;
`ws.fwd(...)` on an object such a module made (`ws = _C.Workspace(n)`, a pybind11 class). A
method call on anything else (`x.add(y)` on a tensor) is not a call of the binding `add`, and a
call of a Python function that the project defines (`def fwd(...)` in a module, or imported from
one) is a call of that function.

An argument is dense when it is made at the call (`torch.empty`, `torch.zeros`, `.contiguous()`,
`torch.empty(n).view(a, b)`), or held by a name, a `d["key"]` entry or an attribute (a
`register_buffer`) that every assignment in the module makes so. A parameter of the function the
call sits in is followed to that function's own callers (a wrapper, of the same name as the
binding or not: `def fwd(x): return _C.fwd(x)`), up to three wrappers deep; it is dense when
every caller found passes a dense tensor there.

Standard library only (`ast`).
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

# Calls whose result is a new tensor in the default (contiguous) layout: factories (torch's and
# numpy's: np.zeros), `x.new(...)`, the legacy constructors (`torch.Tensor(n, m)`), and the
# gathers, whose result is allocated for the index's shape (`torch.gather`, `index_select`).
_PY_FRESH = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "linspace", "eye", "cat",
             "stack", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "tensor", "contiguous",
             "new", "Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
             "IntTensor", "ShortTensor", "ByteTensor", "CharTensor", "BoolTensor", "gather", "index_select",
             "masked_select", "take", "randperm", "ascontiguousarray", "argsort", "nonzero"}
# A copy that keeps the layout of the tensor it comes from (memory_format=torch.preserve_format).
_PY_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
# Methods whose result is dense when the tensor they are called on is.
_PY_KEEPS = {"to", "float", "half", "bfloat16", "double", "int", "long", "short", "byte", "bool", "cuda", "cpu",
             "clone", "view", "detach", "requires_grad_", "fill_", "zero_", "type", "reshape", "flatten",
             "unsqueeze", "squeeze", "view_as", "reshape_as", "normal_", "uniform_", "copy_", "mul_", "add_",
             "astype", "pin_memory", "share_memory_", "resize_"}
# Elementwise functions and methods: the result is laid out like the tensor(s) they are given
# (TensorIterator keeps a dense input's strides), so it is dense when every tensor input is.
_PY_ELEMENTWISE = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "tanh", "relu", "relu6",
                   "gelu", "silu", "mish", "elu", "selu", "leaky_relu", "softplus", "hardtanh", "hardswish", "neg",
                   "negative", "abs", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tan", "sign", "floor",
                   "ceil", "round", "trunc", "frac", "erf", "erfc", "clamp", "clip", "clamp_min", "clamp_max", "pow",
                   "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "maximum",
                   "minimum", "lerp", "nan_to_num", "logical_not", "bitwise_not"}
# Wrappers that hand back the tensor they are given: nn.Parameter(t), Variable(t),
# torch.from_numpy(a) (dense when the array is: np.zeros, .astype of one).
_PY_WRAPS = {"Parameter", "Variable", "from_numpy", "as_tensor", "asarray"}
# Calls whose result, used as an index, makes `x[idx]` advanced indexing (a new dense tensor).
_PY_INDEX = {"argsort", "nonzero", "where", "randperm", "arange", "tensor", "LongTensor", "IntTensor", "BoolTensor",
             "ones", "zeros", "ones_like", "zeros_like", "full", "sort", "topk", "unique", "multinomial", "flatten",
             "bool", "long", "int", "cumsum"}
# Modules that are never a project's extension: their functions are not its bindings.
_LIBRARIES = {"torch", "numpy", "np", "scipy", "triton", "einops", "jax", "tensorflow", "transformers", "diffusers",
              "xformers", "flash_attn", "apex", "deepspeed", "accelerate", "safetensors", "cupy", "numba",
              "F", "nn",
              # the other frameworks a project ships beside its PyTorch code (RT-DETR's Paddle
              # version calls paddle.matmul and paddle.mm: not a binding named matmul or mm)
              "paddle", "mindspore", "oneflow", "jittor", "megengine", "mxnet", "keras", "tf", "flax",
              "tilelang", "cutlass", "vllm", "sglang", "bitsandbytes", "torchvision", "torchaudio",
              "timm", "mmcv", "mmengine", "detectron2", "kornia", "sklearn", "cv2", "PIL"} | \
    set(getattr(sys, "stdlib_module_names", ()))
_LOADERS = {"load", "load_inline", "import_module", "CUDAExtension"}
_MAX_WRAPPERS = 3
_MAX_FOLLOWED = 256  # functions whose callers are looked up, per run


@dataclass
class Arg:
    """One argument of a call: dense or not, its text, and where the value that decides was
    passed when that is another call (a wrapper's caller)."""

    fresh: bool
    shown: str
    path: str | None = None
    line: int = 0


@dataclass
class PyCall:
    """One call of a binding in the project's Python code."""

    path: str
    line: int
    positional: list[Arg]
    keywords: dict[str, Arg]
    starred: bool

    def arity_fits(self, params: list[str]) -> bool:
        return not self.starred and len(self.positional) + len(self.keywords) <= len(params) and \
            all(k in params[len(self.positional):] for k in self.keywords)

    def _arg(self, i: int, name: str) -> Arg | None:
        if i < len(self.positional):
            return self.positional[i]
        return self.keywords.get(name)

    def fresh_at(self, i: int, name: str) -> bool:
        arg = self._arg(i, name)
        return arg is None or arg.fresh  # left out: a default value (pybind11 py::arg("x") = ...)

    def shown_at(self, i: int, name: str) -> str:
        arg = self._arg(i, name)
        return arg.shown if arg else name

    def where_at(self, i: int, name: str) -> tuple[str, int]:
        """The call that passes what decides argument i: this one, or a wrapper's caller."""
        arg = self._arg(i, name)
        if arg is not None and arg.path is not None:
            return arg.path, arg.line
        return self.path, self.line


@dataclass(frozen=True)
class _Saved:
    """A name unpacked from `ctx.saved_tensors` in an autograd Function's backward: the
    `index`-th tensor its forward handed to `ctx.save_for_backward`."""

    index: int


class _Module:
    """What one Python module binds: assignments (for the freshness of a name, a dict entry or an
    attribute), imports, and its module-level functions."""

    def __init__(self, src):
        self.src = src
        tree = src.tree
        self.tree = tree
        self.globals: dict[str, list[ast.AST]] = {}
        self.keys: dict[str, list[ast.expr]] = {}
        self.attrs: dict[str, list[ast.expr]] = {}
        self.locals: dict[ast.AST, dict[str, list[ast.AST]]] = {}
        self.params: dict[ast.AST, list[str]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None)
        self.functions: dict[str, ast.AST] = {}  # module-level defs
        self.defined: set[str] = set()  # every def / class name anywhere in the module
        self.calls: dict[str, list[_Site]] | None = None  # callee name -> its call sites (`_calls`)
        # names a scope asserts dense (`assert x.is_contiguous()`), per scope
        self.asserted: dict[ast.AST, set[str]] = {}
        # autograd Functions: id(method) -> its class, for the classes that subclass Function
        self.function_classes: dict[str, ast.ClassDef] = {}
        self.method_class: dict[int, ast.ClassDef] = {}
        # every class's methods (id(method) -> class), and the class whose methods bind an
        # attribute value through `self` (id(value) -> class): `self.x` read in one class is
        # not what another class of the module stores under the same name
        self.owner_class: dict[int, ast.ClassDef] = {n_id: cls for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                                                     for n_id in (id(m) for m in cls.body
                                                                  if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))}
        self.attr_class: dict[int, ast.ClassDef] = {}
        self._loops: dict[int, list[tuple[int, int]]] = {}  # per scope: the lines its loops span
        for st in tree.body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[st.name] = st
            elif isinstance(st, ast.ClassDef) and any((_dotted(b) or "").rsplit(".", 1)[-1] in ("Function", "InplaceFunction")
                                                      for b in st.bases):
                self.function_classes[st.name] = st
                for m in st.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.method_class[id(m)] = st
        self._walk(tree, tree)

    def _walk(self, node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(child.name)
                if not isinstance(node, ast.ClassDef):  # a method binds no name in its scope
                    self._bind(child.name, child, scope)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                self.params[child] = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + \
                    [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                self.locals[child] = {}
                self._walk(child, child)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    if isinstance(child, ast.Import):
                        local = alias.asname or alias.name.split(".")[0]
                        target = alias.name if alias.asname else alias.name.split(".")[0]
                        entry = (target, None)
                    else:
                        local = alias.asname or alias.name
                        entry = ("." * child.level + (child.module or ""), alias.name)
                    if scope is self.tree:
                        self.imports[local] = entry
                    self._bind(local, child, scope)
            elif isinstance(child, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and child.value is not None:
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                value = child.value if not isinstance(child, ast.AugAssign) else child  # x += y: not fresh
                saved = isinstance(value, ast.Attribute) and value.attr in ("saved_tensors", "saved_variables") and \
                    id(scope) in self.method_class
                for t in targets:
                    if saved and isinstance(t, (ast.Tuple, ast.List)):
                        for k, elt in enumerate(t.elts):
                            if isinstance(elt, ast.Name):
                                self._bind(elt.id, _Saved(k), scope)  # type: ignore[arg-type]
                        continue
                    self._assign(t, value, scope)
            elif isinstance(child, ast.Assert):
                for test in (child.test.values if isinstance(child.test, ast.BoolOp) else [child.test]):
                    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and \
                            test.func.attr == "is_contiguous" and isinstance(test.func.value, ast.Name):
                        self.asserted.setdefault(scope, set()).add(test.func.value.id)
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.comprehension)):
                targets = [child.target] if hasattr(child, "target") else \
                    [i.optional_vars for i in child.items if i.optional_vars is not None]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self._bind(n.id, child, scope)  # a loop variable: unknown
            elif isinstance(child, ast.Dict):
                for k, v in zip(child.keys, child.values):
                    key = _str_key(k)
                    if key is not None:
                        self.keys.setdefault(key, []).append(v)
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                    child.func.attr in ("register_buffer", "register_parameter") and len(child.args) >= 2 and \
                    isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str):
                self.attrs.setdefault(child.args[0].value, []).append(child.args[1])
                if isinstance(child.func.value, ast.Name) and child.func.value.id == "self" and id(scope) in self.owner_class:
                    self.attr_class[id(child.args[1])] = self.owner_class[id(scope)]
            self._walk(child, scope)

    def _bind(self, name: str, value: ast.AST, scope: ast.AST) -> None:
        table = self.globals if scope is self.tree else self.locals[scope]
        table.setdefault(name, []).append(value)

    def _assign(self, target: ast.expr, value: ast.AST, scope: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self._bind(target.id, value, scope)
        elif isinstance(target, ast.Attribute):
            self.attrs.setdefault(target.attr, []).append(value)  # type: ignore[arg-type]
            if isinstance(target.value, ast.Name) and target.value.id == "self" and id(scope) in self.owner_class:
                self.attr_class[id(value)] = self.owner_class[id(scope)]
        elif isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and \
                isinstance(target.slice.value, str):
            self.keys.setdefault(target.slice.value, []).append(value)  # type: ignore[arg-type]
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) and \
                not any(isinstance(e, ast.Starred) for e in target.elts + value.elts)
            for k, elt in enumerate(target.elts):
                # `a, b = x[i], y[i]`: each its own value; unpacked from anything else: unknown
                self._assign(elt, value.elts[k] if pairs else target, scope)  # type: ignore[union-attr]

    # --- what a name is ---------------------------------------------------------------------

    def bindings(self, name: str, scope: ast.AST) -> tuple[list[ast.AST], ast.AST, bool]:
        """(the values bound to `name` as seen from `scope`, the scope they are bound in, whether
        it is a parameter there)."""
        table = self.locals.get(scope, {})
        if name in table or name in self.params.get(scope, ()):
            return table.get(name, []), scope, name in self.params.get(scope, ())
        return self.globals.get(name, []), self.tree, False

    def is_module(self, e: ast.AST, scope: ast.AST, seen: frozenset = frozenset()) -> bool:
        """Whether `e` names an extension module: imported (not a library), loaded, torch.ops.X."""
        if isinstance(e, ast.Attribute):
            chain = _dotted(e)
            if chain is not None and (chain.startswith("torch.ops.") or chain == "torch.ops"):
                return True
            if isinstance(e.value, ast.Name) and e.value.id in ("self", "cls"):
                values = self.attrs.get(e.attr, [])
                return bool(values) and all(self._module_value(v, scope, seen) for v in values)
            return self.is_module(e.value, scope, seen)  # pkg._C: a submodule of an imported package
        if isinstance(e, ast.Name):
            if e.id in seen:
                return False
            values, where, param = self.bindings(e.id, scope)
            if param or not values:
                return False
            return all(self._module_value(v, where, seen | {e.id}) for v in values)
        return False

    def _module_value(self, v: ast.AST, scope: ast.AST, seen: frozenset) -> bool:
        if isinstance(v, ast.Import):
            return not any(a.name.split(".")[0] in _LIBRARIES for a in v.names)
        if isinstance(v, ast.ImportFrom):
            root = (v.module or "").split(".")[0]
            return v.level > 0 or root not in _LIBRARIES
        if isinstance(v, ast.Call):
            if _call_name(v) in _LOADERS:
                return True
            # an object the extension makes (`ext.Workspace(n)`): its methods are bound too
            return isinstance(v.func, ast.Attribute) and self.is_module(v.func.value, scope, seen)
        if isinstance(v, (ast.Name, ast.Attribute)):
            return self.is_module(v, scope, seen)
        return False

    # --- dense values ---------------------------------------------------------------------------

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
            if name in _PY_WRAPS and e.args:
                return self.fresh(e.args[0], scope, seen)
            if name in _PY_ELEMENTWISE:
                tensors = ([f.value] if isinstance(f, ast.Attribute) and not self._is_namespace(f.value) else []) + \
                    [a for a in e.args if not isinstance(a, ast.Starred)]
                tensors = [t for t in tensors if not _scalar(t)]
                return bool(tensors) and all(self.fresh(t, scope, seen) for t in tensors)
            if isinstance(f, ast.Name) and f.id in self.functions and ("returns", f.id) not in seen:
                return self._returns_fresh(self.functions[f.id], seen | {("returns", f.id)})
            return False
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd, ast.Invert)):
            return self.fresh(e.operand, scope, seen)
        if isinstance(e, ast.BinOp) and not isinstance(e.op, ast.MatMult):
            tensors = [t for t in (e.left, e.right) if not _scalar(t)]
            return bool(tensors) and all(self.fresh(t, scope, seen) for t in tensors)
        if isinstance(e, ast.Subscript) and self._advanced(e, scope):
            return True  # feats[indices], x[mask]: advanced indexing makes a new dense tensor
        if isinstance(e, ast.Attribute) and e.attr == "data":
            return self.fresh(e.value, scope, seen)  # x.data: the same tensor
        if isinstance(e, ast.Name) and e.id in self.asserted.get(scope, ()):
            return True  # assert x.is_contiguous() in this scope
        if isinstance(e, ast.Name):
            key: tuple = ("name", e.id, id(scope))
            values, where, param = self.bindings(e.id, scope)
            if where is scope:
                values = [v for v in values if self._reaches(v, e, scope)]
            if param:
                if not values:
                    return False  # whatever the caller passes (followed by `python_calls`, not here)
                if key in seen:
                    return False  # `x = x.view(...)` of a parameter: what the caller passed
                return all(isinstance(v, ast.expr) and self.fresh(v, where, seen | {key}) for v in values)
        elif isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str):
            key = ("key", e.slice.value)
            values = self.keys.get(e.slice.value, [])
        elif isinstance(e, ast.Attribute):
            key = ("attr", e.attr)
            values = self.attrs.get(e.attr, [])
            cls = self.owner_class.get(id(scope)) if isinstance(e.value, ast.Name) and e.value.id == "self" else None
            if cls is not None:
                values = [v for v in values if _related(self.attr_class.get(id(v)), cls)]
        else:
            return False
        if key in seen:
            return True  # `x = x.view(...)`: the other assignments decide
        if not values:
            return False
        seen = seen | {key}
        return all(isinstance(v, ast.expr) and self.fresh(v, where if key[0] == "name" else self.scope_of(v), seen)
                   for v in values)

    def _returns_fresh(self, fn: ast.AST, seen: frozenset) -> bool:
        """A module-level function of the project whose every `return` hands back a dense tensor
        (`def pack(w): ...; return q.contiguous()`): its calls make one."""
        nodes = _scope_nodes(fn)
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes):
            return False  # a generator
        found = [n.value for n in nodes if isinstance(n, ast.Return)]
        return bool(found) and all(v is not None and self.fresh(v, fn, seen) for v in found)

    def _is_namespace(self, e: ast.AST) -> bool:
        """`torch`, `F`, `np`, `torch.nn.functional`: a module whose function is called, not a tensor."""
        root = e
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and (root.id in _LIBRARIES or root.id in self.imports)

    def _reaches(self, value: Any, use: ast.AST, scope: ast.AST) -> bool:
        """Whether a binding (its value's node) can be what a name holds at `use`: made before the
        use, or after it in a loop of the scope that holds both (the next iteration reads it).
        `x = x.t()` after a call does not change what the call was given."""
        end = (getattr(value, "end_lineno", None), getattr(value, "end_col_offset", None))
        if end[0] is None or not hasattr(use, "lineno") or \
                isinstance(value, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.comprehension)):
            return True  # a loop's or with's target: bound for the body it holds
        if end <= (use.lineno, use.col_offset):  # type: ignore[attr-defined,operator]
            return True
        loops = self._loops.get(id(scope))
        if loops is None:
            loops = self._loops[id(scope)] = [
                (n.lineno, n.end_lineno or n.lineno) for n in _scope_nodes(scope)
                if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]
        line = value.lineno
        return any(a <= use.lineno <= b and a <= line <= b for a, b in loops)  # type: ignore[attr-defined]

    def _advanced(self, e: ast.Subscript, scope: ast.AST) -> bool:
        """`x[idx]` where idx is a tensor of indices or a mask (`ranks.argsort()`, `kept`, `x > 0`):
        advanced indexing, whose result is a new dense tensor; also `torch.where(mask)[0]`, one
        of the index vectors that torch.where with one argument returns."""
        v = e.value
        if isinstance(v, ast.Call) and _call_name(v) in ("where", "nonzero") and len(v.args) == 1:
            return True
        return self._index_tensor(e.slice, scope, 0)

    def _index_tensor(self, idx: ast.AST, scope: ast.AST, depth: int) -> bool:
        if depth > 3:
            return False
        if isinstance(idx, ast.Compare) or (isinstance(idx, ast.UnaryOp) and isinstance(idx.op, ast.Invert)):
            return True
        if isinstance(idx, ast.Call):
            return _call_name(idx) in _PY_INDEX
        if isinstance(idx, ast.Name):
            values, where, param = self.bindings(idx.id, scope)
            return bool(values) and not param and \
                all(isinstance(v, ast.expr) and self._index_tensor(v, where, depth + 1) for v in values)
        return False

    def scope_of(self, node: ast.AST) -> ast.AST:
        best: ast.AST = self.tree
        for fn in self.locals:
            if fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno) and \
                    (best is self.tree or best.lineno <= fn.lineno):  # type: ignore[attr-defined]
                best = fn
        return best

    def param_of(self, e: ast.AST, scope: ast.AST) -> tuple[ast.AST, int, str] | None:
        """(function, position, name) when `e` is a parameter of the module-level function the
        expression sits in, never rebound there."""
        if not isinstance(e, ast.Name) or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if self.functions.get(scope.name) is not scope and not self.is_function_forward(scope):
            return None
        params = self.params.get(scope, [])
        if e.id not in params:
            return None
        # rebound only from itself by methods that keep a dense tensor dense (`x = x.int()`):
        # still what the caller passed, as far as its layout goes
        if not all(isinstance(v, ast.expr) and _kept_from(v, e.id) for v in self.locals.get(scope, {}).get(e.id, ())):
            return None
        return scope, params.index(e.id), e.id


    def is_function_forward(self, fn: ast.AST) -> bool:
        """The forward of an autograd Function of this module (its callers call `Cls.apply`)."""
        return getattr(fn, "name", "") == "forward" and id(fn) in self.method_class

    def saved_for_backward(self, fn: ast.AST, index: int) -> list[tuple[ast.expr, ast.AST]]:
        """For a backward of an autograd Function: what its forward hands to
        `ctx.save_for_backward` at `index` (the expression and the forward it is written in)."""
        cls = self.method_class.get(id(fn))
        forward = next((m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                        m.name == "forward"), None) if cls is not None else None
        if forward is None:
            return []
        out = []
        for node in ast.walk(forward):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "save_for_backward":
                if any(isinstance(a, ast.Starred) for a in node.args) or index >= len(node.args):
                    return []
                out.append((node.args[index], forward))
        return out

    def aliases_of(self, name: str) -> set[str]:
        """Names this module binds to the function `name` (`f = a if cond else b`, one per branch
        of an if, `conv = _Fn.apply`): calls through them may call it."""
        out = set()
        for table in [self.globals, *self.locals.values()]:
            for alias, values in table.items():
                if alias != name and any(isinstance(v, ast.expr) and name in _named(v) for v in values):
                    out.add(alias)
        return out


def _scalar(e: ast.AST) -> bool:
    """A Python number (`2`, `-1.0`, `2 * 3`): no tensor, so it does not decide a layout."""
    if isinstance(e, ast.Constant):
        return isinstance(e.value, (int, float, complex)) and not isinstance(e.value, bool)
    if isinstance(e, ast.UnaryOp):
        return _scalar(e.operand)
    if isinstance(e, ast.BinOp):
        return _scalar(e.left) and _scalar(e.right)
    return False


def _related(owner: ast.ClassDef | None, cls: ast.ClassDef) -> bool:
    """An attribute value stored by `owner`'s methods (None: not through `self`) can be what
    `self.x` holds in `cls`'s methods: the same class, or one named among the other's bases."""
    if owner is None or owner is cls:
        return True
    names = lambda c: {(_dotted(b) or "").rsplit(".", 1)[-1] for b in c.bases}  # noqa: E731
    return cls.name in names(owner) or owner.name in names(cls)


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a function (or module) outside the functions and classes it defines."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _kept_from(v: ast.expr, name: str) -> bool:
    """`x.int()`, `x.float().cuda()`: `name` through methods that keep a dense tensor dense."""
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _PY_KEEPS:
        v = v.func.value
    return isinstance(v, ast.Name) and v.id == name


def _named(v: ast.expr) -> set[str]:
    """The callables an assigned value may be: `f`, `a if c else b`, `Cls.apply` (as "Cls.apply")."""
    if isinstance(v, ast.Name):
        return {v.id}
    if isinstance(v, ast.IfExp):
        return _named(v.body) | _named(v.orelse)
    if isinstance(v, ast.Attribute) and v.attr == "apply" and isinstance(v.value, ast.Name):
        return {f"{v.value.id}.apply"}
    return set()


def _str_key(k: ast.AST | None) -> str | None:
    """A dict key written as a string: "k", or an f-string with no placeholder (f"k")."""
    if isinstance(k, ast.Constant) and isinstance(k.value, str):
        return k.value
    if isinstance(k, ast.JoinedStr) and all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in k.values):
        return "".join(v.value for v in k.values)  # type: ignore[union-attr]
    return None


def _dotted(e: ast.AST) -> str | None:
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    if isinstance(e, ast.Name):
        parts.append(e.id)
        return ".".join(reversed(parts))
    return None


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


@dataclass
class _Site:
    call: ast.Call
    module: _Module
    scope: ast.AST


@dataclass
class _Project:
    modules: list[_Module] = field(default_factory=list)
    by_name: dict[str, list[_Module]] = field(default_factory=dict)  # last part of the module name -> modules


def _calls(module: _Module, names: set[str]) -> list[tuple[str, _Site]]:
    """(name called, site) for each call in the module whose callee is spelt with one of these
    names (the module's calls are indexed by name on first use)."""
    if module.calls is None:
        index: dict[str, list[_Site]] = {}
        stack: list[tuple[ast.AST, ast.AST]] = [(module.tree, module.tree)]
        while stack:
            node, scope = stack.pop()
            for child in ast.iter_child_nodes(node):
                inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
                stack.append((child, inner))
                if isinstance(child, ast.Call):
                    name = _call_name(child)
                    if name:
                        index.setdefault(name, []).append(_Site(child, module, scope))
        module.calls = index
    found = [(name, site) for name in names for site in module.calls.get(name, ())]
    found.sort(key=lambda x: (x[1].call.lineno, x[1].call.col_offset))
    return found


def _is_binding_call(site: _Site, project: _Project) -> bool:
    """The call reaches the extension (see the module docstring), not a Python function or a
    method of an object."""
    f = site.call.func
    m = site.module
    if isinstance(f, ast.Attribute):
        return m.is_module(f.value, site.scope)
    if isinstance(f, ast.Name):
        values, _, param = m.bindings(f.id, site.scope)
        if param:
            return False
        if not values:
            return f.id not in m.defined  # a star import or a name bound elsewhere: taken as the binding
        # imported from the extension (another binding of the name, such as the fallback that
        # `except ImportError: q4_matmul = error_raiser` assigns, does not change which is called
        # when the extension is there); a def, a class or an assignment alone is a Python callable
        for v in values:
            if isinstance(v, ast.ImportFrom):
                root = (v.module or "").split(".")[0]
                if (v.level > 0 or root not in _LIBRARIES) and not _defines_function(project, v, f.id):
                    return True
        return False
    return False


def _names_object(m: _Module, local: str, scope: ast.AST, obj: ast.AST, owner: _Module, name: str) -> bool:
    """Whether `local`, seen from `scope` of module m, is the class (or function) `obj` of
    module `owner`: defined there, or imported from it by its name."""
    values, _, param = m.bindings(local, scope)
    if param:
        return False
    if m is owner:
        return any(v is obj for v in values)
    owner_name = (owner.src.module or "").rsplit(".", 1)[-1]
    return any(isinstance(v, ast.ImportFrom) and (v.module or "").rsplit(".", 1)[-1] == owner_name and
               any(a.name == name and (a.asname or a.name) == local for a in v.names) for v in values)


def _defines_function(project: _Project, imp: ast.ImportFrom, name: str) -> bool:
    module = (imp.module or "").rsplit(".", 1)[-1]
    original = next((a.name for a in imp.names if (a.asname or a.name) == name), name)
    return any(original in m.functions for m in project.by_name.get(module, []))


def _is_call_of_function(site: _Site, fn: ast.AST, owner: _Module, project: _Project, depth: int = 0) -> bool:
    """Whether a call spelt with `fn`'s name (or an alias of it) calls that module-level function,
    or, for the forward of an autograd Function, its `Cls.apply`."""
    f = site.call.func
    name = fn.name  # type: ignore[attr-defined]
    m = site.module
    owner_name = (owner.src.module or "").rsplit(".", 1)[-1]
    cls = owner.method_class.get(id(fn))
    target = f"{cls.name}.apply" if cls is not None else name
    if cls is not None and isinstance(f, ast.Attribute) and f.attr == "apply" and isinstance(f.value, ast.Name):
        return _names_object(m, f.value.id, site.scope, cls, owner, cls.name)
    if isinstance(f, ast.Name):
        values, where, param = m.bindings(f.id, site.scope)
        if param:
            return False
        if f.id != (cls.name if cls is not None else name) and depth < 2:
            # an alias: `conv = _Fn.apply`, `f = f16 if half else f32`, then `conv(...)`
            for v in values:
                if isinstance(v, ast.expr) and target in _named(v) | {n + ".apply" for n in _named(v)}:
                    if cls is not None and isinstance(v, (ast.Attribute, ast.IfExp)):
                        if _names_object(m, cls.name, where, cls, owner, cls.name):
                            return True
                        continue
                    inner = _Site(ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[], keywords=[]), m, where)
                    if _is_call_of_function(inner, fn, owner, project, depth + 1):
                        return True
            return False
        if cls is not None:
            return False
        if m is owner:
            return any(v is fn for v in values)
        return any(isinstance(v, ast.ImportFrom) and (v.module or "").rsplit(".", 1)[-1] == owner_name and
                   any(a.name == name for a in v.names) for v in values)
    if isinstance(f, ast.Attribute):
        chain = _dotted(f.value)
        if chain is None or m is owner:
            return False
        values, _, _ = m.bindings(chain.split(".")[0], site.scope)
        return chain.rsplit(".", 1)[-1] == owner_name and any(isinstance(v, (ast.Import, ast.ImportFrom)) for v in values)
    return False


class _Follower:
    """Arguments of a call, with parameters followed to the callers of the function they belong to."""

    def __init__(self, project: _Project, more: Callable[[set[str]], list] | None):
        self.project = project
        self.more = more
        self.asked: set[str] = set()
        self.callers: dict[int, list[_Site]] = {}

    def _callers(self, fn: ast.AST, owner: _Module) -> list[_Site] | None:
        """The project's calls of a module-level function (by its name or a name bound to it),
        or of an autograd Function's `apply` for its forward; None past `_MAX_FOLLOWED`
        functions (a project that large is not followed further: its tensors stay unknown)."""
        key = id(fn)
        if key not in self.callers and len(self.callers) >= _MAX_FOLLOWED:
            return None
        if key not in self.callers:
            cls = owner.method_class.get(id(fn))
            name = "apply" if cls is not None else fn.name  # type: ignore[attr-defined]
            wanted = {name} | ({cls.name} if cls is not None else set())
            if self.more is not None and not wanted <= self.asked:
                self.asked |= wanted
                for src in self.more(wanted):
                    _add_module(self.project, src)
            sites = []
            for m in self.project.modules:
                names = {name}
                if m is owner or cls is None:
                    names |= m.aliases_of(f"{cls.name}.apply" if cls is not None else name)
                for _, site in _calls(m, names):
                    if _is_call_of_function(site, fn, owner, self.project):
                        sites.append(site)
            self.callers[key] = sites
        return self.callers[key]

    def arg(self, e: ast.expr, site: _Site, depth: int = 0) -> Arg:
        m = site.module
        shown = ast.get_source_segment(m.src.text, e) or ast.dump(e)[:40]
        if m.fresh(e, site.scope):
            return Arg(True, shown)
        if depth >= _MAX_WRAPPERS:
            return Arg(False, shown)
        saved = self._saved(e, site)
        if saved is not None:
            # unpacked from ctx.saved_tensors: what the forward saved, judged there
            for expr, forward in saved:
                inner = self.arg(expr, _Site(site.call, m, forward), depth + 1)
                if not inner.fresh:
                    return Arg(False, shown, inner.path, inner.line)
            return Arg(True, shown)
        param = m.param_of(e, site.scope)
        if param is None:
            return Arg(False, shown)
        fn, position, name = param
        if m.is_function_forward(fn):
            position -= 1  # forward(ctx, x, ...) is called as Cls.apply(x, ...)
            if position < 0:
                return Arg(False, shown)
        callers = self._callers(fn, m)
        if not callers:  # none found, or too many functions followed already
            return Arg(False, shown)
        defaults = _defaults(fn)
        for caller in callers:
            passed = _passed(caller.call, position, name)
            if passed is None:
                if name in defaults and m.fresh(defaults[name], m.tree):
                    continue
                return Arg(False, shown, caller.module.src.path, caller.call.lineno)
            if isinstance(passed, _Spread):
                # f(**d): what the module puts under that key in its dicts
                if _spread_fresh(caller.module, name):
                    continue
                return Arg(False, shown, caller.module.src.path, caller.call.lineno)
            if passed is _STARRED:
                return Arg(False, shown, caller.module.src.path, caller.call.lineno)
            inner = self.arg(passed, caller, depth + 1)
            if not inner.fresh:
                return Arg(False, inner.shown, inner.path or caller.module.src.path, inner.line or caller.call.lineno)
        return Arg(True, shown)

    @staticmethod
    def _saved(e: ast.expr, site: _Site) -> list[tuple[ast.expr, ast.AST]] | None:
        if not isinstance(e, ast.Name):
            return None
        m = site.module
        values, where, _ = m.bindings(e.id, site.scope)
        if not values or not all(isinstance(v, _Saved) for v in values):
            return None
        out = []
        for v in values:
            found = m.saved_for_backward(where, v.index)  # type: ignore[union-attr]
            if not found:
                return None
            out += found
        return out


_STARRED = ast.Constant(value=None)


@dataclass(frozen=True)
class _Spread:
    """An argument that can only come from `**d` at the call."""

    value: ast.expr


def _passed(call: ast.Call, position: int, name: str) -> ast.expr | _Spread | None:
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            return _STARRED
        if i == position:
            return a
    spread = None
    for k in call.keywords:
        if k.arg == name:
            return k.value
        if k.arg is None:
            spread = k.value
    return _Spread(spread) if spread is not None else None


def _spread_fresh(m: _Module, key: str) -> bool:
    """Whether every value the module gives `key` in a dict (`{"kv": self.buf}`,
    `d["kv"] = ...`) is dense: what a `**d` of the module's own dicts passes under that name."""
    values = m.keys.get(key, [])
    return bool(values) and all(isinstance(v, ast.expr) and m.fresh(v, m.scope_of(v)) for v in values)


def _defaults(fn: ast.AST) -> dict[str, ast.expr]:
    a = fn.args  # type: ignore[attr-defined]
    positional = a.posonlyargs + a.args
    out = {p.arg: d for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)}
    out.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    return out


def _add_module(project: _Project, src) -> None:
    if any(m.src.path == src.path for m in project.modules):
        return
    m = _Module(src)
    project.modules.append(m)
    last = (src.module or "").rsplit(".", 1)[-1]
    project.by_name.setdefault(last, []).append(m)


def python_calls(sources: list, names: dict[str, str],
                 more: Callable[[set[str]], list] | None = None) -> dict[str, list[PyCall]]:
    """C++ name -> the calls of its binding in these Python files (PySource objects that mention
    it). `names`: Python-visible name -> C++ name. `more(names)`: further PySources of the
    project that call one of these names (a wrapper's callers), or None to look at `sources`
    only."""
    project = _Project()
    for src in sources:
        _add_module(project, src)
    follower = _Follower(project, more)
    out: dict[str, list[PyCall]] = {}
    for m in list(project.modules):
        for py, site in _calls(m, set(names)):
            if not _is_binding_call(site, project):
                continue
            call = site.call
            positional = [follower.arg(a, site) for a in call.args if not isinstance(a, ast.Starred)]
            keywords = {k.arg: follower.arg(k.value, site) for k in call.keywords if k.arg}
            starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
            out.setdefault(names[py], []).append(PyCall(m.src.path, call.lineno, positional, keywords, starred))
    return out
