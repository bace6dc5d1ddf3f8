"""GPU005 on modules the function did not create: `module.bias = module.bias.float()` where
`module` is a standard torch.nn module (annotated `module: nn.Linear`, checked with
`isinstance(m, nn.Linear)`, built here with `nn.Linear(...)`, a submodule `self.proj` that
`__init__` builds so, or a local alias of one of those). Its `weight` / `bias` are Parameters, and
`nn.Module.__setattr__` refuses the plain tensor a conversion returns ("cannot assign
'torch.cuda.FloatTensor' as parameter 'bias'"). pyrules handles `self.<param>` itself; this
module handles every other receiver. A receiver of unknown type is left alone: `weight` and `bias`
are often buffers (quantised layers register them so) and reassigning a buffer is fine.
"""
from __future__ import annotations

import ast
import re

from gpudoctor.lint.model import UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.castflow import CASTS
from gpudoctor.lint.pysource import PySource, dotted, finding

_STD_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm[123]d|InstanceNorm[123]d|Embedding|EmbeddingBag)$")
_PARAMS = ("weight", "bias")


def _std_class(src: PySource, node: ast.AST | None) -> str | None:
    """`nn.Linear` / `torch.nn.Conv2d` (a name, a dotted name or a string annotation): its class name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if node is None or not isinstance(node, (ast.Name, ast.Attribute)):
        return None
    q = src.qualname(node) or ""
    last = q.rsplit(".", 1)[-1]
    return last if q.startswith("torch.nn.") and _STD_WEIGHTED.match(last) else None


def _isinstance_classes(src: PySource, call: ast.Call) -> tuple[str, str] | None:
    """`isinstance(m, nn.Linear)` / `isinstance(m, (nn.Linear, nn.Conv2d))`: (m, a class name) when
    every class checked is a standard weighted one."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "isinstance" and len(call.args) == 2):
        return None
    name = dotted(call.args[0])
    kinds = call.args[1].elts if isinstance(call.args[1], ast.Tuple) else [call.args[1]]
    names = [_std_class(src, k) for k in kinds]
    if not name or "." in name or not names or not all(names):
        return None
    return name, names[0]  # type: ignore[return-value]


def _self_modules(src: PySource, cls: ast.ClassDef) -> dict[str, str]:
    """self.<attr> -> class name, for standard weighted modules a method of the class builds."""
    out: dict[str, str] = {}
    for m in cls.body:
        if not isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for st in src.scope_statements(m):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call):
                key = dotted(st.targets[0]) or ""
                kind = _std_class(src, st.value.func)
                if kind and key.startswith("self.") and key.count(".") == 1:
                    out[key] = kind
    return out


def foreign_parameter_casts(src: PySource) -> list[Finding]:
    """`m.weight = m.weight.half()` for a receiver known to be a standard nn module."""
    out: list[Finding] = []
    owner = {id(m): cls for cls in src.classes for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    members: dict[int, dict[str, str]] = {}
    for fn in src.functions:
        known: dict[str, str] = {}  # local name -> "an nn.Linear (annotated at line 3)"
        a = fn.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            kind = _std_class(src, arg.annotation)
            if kind:
                known[arg.arg] = f"annotated {kind} at line {arg.lineno}"
        cls = owner.get(id(fn))
        if cls is not None and id(cls) not in members:
            members[id(cls)] = _self_modules(src, cls)
        own = members.get(id(cls), {}) if cls is not None else {}
        for st in src.scope_statements(fn):
            for node in ast.walk(st.test) if isinstance(st, (ast.If, ast.While, ast.Assert)) else ():
                if isinstance(node, ast.Call):
                    hit = _isinstance_classes(src, node)
                    if hit:
                        known[hit[0]] = f"checked to be an {hit[1]} at line {node.lineno}"
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
                continue
            target, value = st.targets[0], st.value
            if isinstance(target, ast.Name):
                source = dotted(value)
                kind = _std_class(src, value.func) if isinstance(value, ast.Call) else None
                if kind:
                    known[target.id] = f"an {kind} built at line {st.lineno}"
                elif source in known:
                    known[target.id] = f"{source}, {known[source]}"
                elif source in own:
                    known[target.id] = f"{source}, the {own[source]} of this class"
                else:
                    known.pop(target.id, None)
                continue
            f = _cast_back(src, st, known)
            if f is not None:
                out.append(f)
    return out


def _cast_back(src: PySource, st: ast.Assign, known: dict[str, str]) -> Finding | None:
    target, value = st.targets[0], st.value
    if not (isinstance(target, ast.Attribute) and target.attr in _PARAMS and isinstance(target.value, ast.Name)):
        return None
    module = target.value.id
    if module not in known or module == "self":
        return None
    key = f"{module}.{target.attr}"
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in CASTS
            and dotted(value.func.value) == key):
        return None
    method = value.func.attr
    if method in ("to", "type") and not value.args and not value.keywords:
        return None
    _, tend = src.span(target)
    _, rend = src.span(value.func.value)
    message = (f"{key} is an nn.Parameter ({module} is {known[module]}), and {key}.{method}(...) returns a plain "
               f"Tensor whenever it converts: nn.Module refuses the assignment with TypeError: cannot assign "
               f"'torch.cuda.FloatTensor' as parameter '{target.attr}' (torch.nn.Parameter or None expected); keep "
               f"the converted tensor in a local name ({target.attr} = {key}.{method}(...)) or convert in place "
               f"({key}.data = {key}.data.{method}(...), which changes the caller's module)")
    fix = Fix(UNSAFE, f"convert in place: {key}.data = {key}.data.{method}(...) (changes the caller's module)",
              (Edit(tend, tend, ".data"), Edit(rend, rend, ".data")))

    return finding(src, st, "GPU005", message, fix)
