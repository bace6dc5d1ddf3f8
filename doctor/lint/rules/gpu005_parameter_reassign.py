"""GPU005 (parameter-reassign): an nn.Parameter is assigned a plain tensor (.to(), .half(), a computed tensor) or converted and thrown away.

Its documentation (what `gpudoctor explain GPU005` prints, and its row in docs/lint.md) and its
prefilter, as data; and its check (`check`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from gpudoctor.lint.castflow import CASTS
from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, short, walk
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyrules import Facts

RULE = Rule(
    code="GPU005",
    name="parameter-reassign",
    kb_id="parameter-reassign",
    title="an nn.Parameter is assigned a plain tensor (.to(), .half(), a computed tensor) or converted and thrown away",
    kinds=(PYTHON,),
    prefilter=((b"Parameter", b".weight", b".bias"),),
    pattern=((rb"^[ \t]*([\w.]+)[ \t]*=[ \t]*\1\.(?:to|half|float|double|bfloat16|cuda|cpu|type|type_as)\(",
              rb"Parameter\(.*\)\.(?:to|half|float|double|bfloat16|cuda|cpu)\(",
              # a conversion of an attribute as a statement of its own, its result thrown away
              rb"^[ \t]*\w+\.\w+(?:\.\w+)*\.(?:to|half|float|double|bfloat16|cuda|cpu|type)\([^\n]*\)[ \t]*(?:#[^\n]*)?$",
              # self.p = f(... self.p ...): a tensor computed from the parameter
              rb"^[ \t]*(self\.\w+)[ \t]*=[ \t]*[^\n=]*\b\1\b"),),
    what=(
        "`self.p = self.p.to(...)` (or .half() / .float() / .cuda() / ...) where self.p is an "
        "nn.Parameter (created with nn.Parameter / register_parameter in the same class, or the "
        "weight / bias of a standard nn module); `self.p = nn.Parameter(t).to(...)`; "
        "`self.p = F.softmax(self.p)` or any other tensor computed from the parameter, assigned "
        "back to its name outside __init__; and `self.p.half()` / `self.p.to(...)` as a statement "
        "of its own, whose result is thrown away."
    ),
    why=(
        "Parameter.to() returns a plain Tensor whenever it converts, and so does every operation "
        "on a parameter. nn.Module.__setattr__ refuses a plain tensor for a registered parameter: "
        "TypeError: cannot assign 'torch.cuda.BFloat16Tensor' as parameter 'p' (torch.nn.Parameter "
        "or None expected). It only works while the conversion is a no-op, so it breaks on the "
        "first machine where dtype or device differ. `nn.Parameter(t).to(device)` assigned for the "
        "first time silently registers nothing: the attribute is a plain tensor, missing from "
        "parameters(), the optimizer and the state dict. And unlike Module.to() / .half(), which "
        "convert a module in place, a parameter's conversion never changes the parameter: "
        "`self.p.half()` alone does nothing, the parameter stays float32 next to a half model."
    ),
    example="self.token = nn.Parameter(torch.zeros(1, dim))\n...\nself.token = self.token.to(dtype=dtype, device=device)",
    fix="self.token.data = self.token.data.to(dtype=dtype, device=device)   # or convert the module: self.to(dtype=..., device=...)",
    fix_safety=(
        "safe: assigning .data converts the parameter in place; it stays the same registered "
        "nn.Parameter (requires_grad and optimizer references kept). For "
        "nn.Parameter(t).to(x) the fix moves the conversion inside: nn.Parameter(t.to(x)). A "
        "thrown-away conversion gets an unsafe fix (self.p.data = self.p.data.half(): the dtype the "
        "code meant, which it never had); a computed tensor a display-only one (use a local name)."
    ),
    near_misses=(
        "`self.m = self.m.to(dtype)` and `self.m.half()` on a submodule (Module.to converts in place "
        "and returns the module), `self.p.data = self.p.data.to(...)`, `w = F.softmax(self.p)` into "
        "a local name, `self.p.to(x) + y` inside an expression, buffers and attributes not known "
        "to be parameters do not fire."
    ),
)


_STD_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm[123]d|InstanceNorm[123]d|Embedding|EmbeddingBag|PReLU)$")


def _is_parameter_call(src: PySource, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    q = src.qualname(node.func) or ""
    return q.endswith(".Parameter") or q == "Parameter"


def _cast_of(node: ast.AST) -> tuple[ast.Call, str, ast.expr] | None:
    """`recv.to(...)` / `recv.half()`: (call, method, receiver)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CASTS:
        if node.func.attr in ("to", "type") and not node.args and not node.keywords:
            return None
        return node, node.func.attr, node.func.value
    return None


def check(src: PySource, facts: Facts | None = None) -> list[Finding]:
    out: list[Finding] = []
    assigns = [st for st, _ in src.stmts if isinstance(st, ast.Assign) and len(st.targets) == 1]
    # parameters and standard modules per class, by attribute name on self
    for cls in src.classes:
        params: set[str] = set()
        modules: set[str] = set()
        stmts = [st for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for st in src.scope_statements(m)]
        for node in stmts:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = dotted(node.targets[0])
                if key and key.startswith("self.") and key.count(".") == 1:
                    if _is_parameter_call(src, node.value):
                        params.add(key)
                    elif isinstance(node.value, ast.Call):
                        q = src.qualname(node.value.func) or ""
                        if q.startswith("torch.nn.") and _STD_WEIGHTED.match(q.rsplit(".", 1)[-1]):
                            modules.add(key)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                c = node.value
                if call_name(c) == "register_parameter" and c.args and isinstance(c.args[0], ast.Constant) and \
                        isinstance(c.args[0].value, str) and isinstance(c.func, ast.Attribute) and \
                        dotted(c.func.value) == "self":
                    params.add("self." + c.args[0].value)
        known = params | {f"{m}.weight" for m in modules} | {f"{m}.bias" for m in modules}
        for base in cls.bases:  # class LayerNorm2d(nn.LayerNorm): self.weight is the parent's Parameter
            q = src.qualname(base) or ""
            if q.startswith("torch.nn.") and _STD_WEIGHTED.match(q.rsplit(".", 1)[-1]):
                known |= {"self.weight", "self.bias"}
        if known:
            for m in cls.body:
                if not isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in src.scope_statements(m):
                    f = None
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        f = _reassign(src, node, known)
                        if f is None and m.name != "__init__":
                            f = _computed(src, node, known)
                    elif isinstance(node, ast.Expr):
                        f = _thrown_away(src, node, known)
                    if f:
                        out.append(f)
    # module level and plain functions: `m.p = nn.Parameter(...)` then `m.p = m.p.to(...)`
    for scope in [src.tree, *src.functions]:
        known = set()
        for node in src.scope_statements(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = dotted(node.targets[0])
                if key and "." in key and not key.startswith("self.") and _is_parameter_call(src, node.value):
                    known.add(key)
                elif key in known:
                    f = _reassign(src, node, known)
                    if f:
                        out.append(f)
            elif known and isinstance(node, ast.Expr):
                f = _thrown_away(src, node, known)
                if f:
                    out.append(f)
    # `x.p = nn.Parameter(t).to(...)`
    for node in assigns:
        if isinstance(node.targets[0], ast.Attribute):
            cast = _cast_of(node.value)
            if cast and _is_parameter_call(src, cast[2]):
                out.append(_parameter_then_cast(src, node, cast))
    from gpudoctor.lint.pyparams import foreign_parameter_casts

    out += foreign_parameter_casts(src)  # m.bias = m.bias.float() on a module typed nn.Linear
    unique = {(f.line, f.col): f for f in out}
    return list(unique.values())


_THROWN = {"to", "half", "float", "double", "bfloat16", "cuda", "cpu", "type"}


def _thrown_away(src: PySource, node: ast.Expr, known: set[str]) -> Finding | None:
    """`self.p.half()` as a statement: a parameter's conversion returns a new tensor, which is
    dropped; the parameter keeps its dtype (a module's .half() converts in place, this does not)."""
    c = node.value
    if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _THROWN):
        return None
    if c.func.attr in ("to", "type") and not c.args and not c.keywords:
        return None
    key = dotted(c.func.value)
    if key not in known:
        return None
    method = c.func.attr
    spelt = src.segment(c.func.value)
    start, _ = src.span(c)
    _, recv_end = src.span(c.func.value)
    fix = Fix(UNSAFE, f"convert in place: {spelt}.data = {spelt}.data.{method}(...)",
              (Edit(start, start, f"{spelt}.data = "), Edit(recv_end, recv_end, ".data")))
    message = (f"{key}.{method}(...) returns a converted copy of the nn.Parameter and drops it: unlike a module's "
               f".{method}(), a parameter's conversion is not in place, so {key} keeps its old dtype/device (a "
               f"float32 parameter next to a half-precision model: 'expected scalar type' / 'mat1 and mat2 must "
               f"have the same dtype'); convert in place: {spelt}.data = {spelt}.data.{method}(...)")
    return finding(src, node, "GPU005", message, fix)


def _computed(src: PySource, node: ast.Assign, known: set[str]) -> Finding | None:
    """`self.p = F.softmax(self.p, dim=0)`: a tensor computed from the parameter, assigned back to
    its name, which nn.Module refuses (TypeError) once it is a registered parameter."""
    key = dotted(node.targets[0])
    value = node.value
    if key not in known or _is_parameter_call(src, value):
        return None
    if not any(isinstance(n, (ast.Attribute, ast.Name)) and dotted(n) == key for n in walk([value])):
        return None
    if isinstance(value, ast.Call):
        q = src.qualname(value.func) or ""
        if isinstance(value.func, ast.Attribute) and (dotted(value.func.value) or "").split(".")[0] == "self" \
                and dotted(value.func.value) != key:
            return None  # self.helper(self.p): it may return a Parameter
        if not (q.startswith("torch.") or (isinstance(value.func, ast.Attribute) and dotted(value.func.value) == key)):
            return None
    elif not isinstance(value, ast.BinOp):
        return None
    shown = short(src, value, 50)
    local = key.rsplit(".", 1)[-1]
    message = (f"{key} is an nn.Parameter, and `{shown}` is a plain Tensor computed from it: assigning it to the "
               f"parameter's name raises TypeError: cannot assign ... as parameter (torch.nn.Parameter or None "
               f"expected) (and would replace the learned values with a computed copy on every call); keep it in "
               f"a local name: {local} = {shown}")
    return finding(src, node, "GPU005", message,
                    Fix(DISPLAY_ONLY, f"assign the computed tensor to a local name ({local} = ...) and use that"))


def _reassign(src: PySource, node: ast.Assign, known: set[str]) -> Finding | None:
    key = dotted(node.targets[0])
    cast = _cast_of(node.value)
    if not key or key not in known or not cast or dotted(cast[2]) != key:
        return None
    call, method, recv = cast
    target = node.targets[0]
    _, tend = src.span(target)
    _, rend = src.span(recv)
    fix = Fix(SAFE, f"convert in place: {key}.data = {key}.data.{method}(...)",
              (Edit(tend, tend, ".data"), Edit(rend, rend, ".data")))
    message = (f"{key} is an nn.Parameter, but {key}.{method}(...) returns a plain Tensor whenever it converts: the "
               f"assignment raises TypeError: cannot assign ... as parameter (torch.nn.Parameter or None expected); "
               f"convert in place ({key}.data = {key}.data.{method}(...)) or convert the module")
    return finding(src, node, "GPU005", message, fix)


def _parameter_then_cast(src: PySource, node: ast.Assign, cast: tuple[ast.Call, str, ast.expr]) -> Finding:
    call, method, param_call = cast
    key = dotted(node.targets[0]) or "the attribute"
    assert isinstance(param_call, ast.Call)
    _, pend = src.span(param_call)
    _, cend = src.span(call)
    suffix = src.text[pend:cend]  # ".to(device)"
    fix = Fix(DISPLAY_ONLY, f"convert the data inside: nn.Parameter(t{suffix.strip()})")
    if len(param_call.args) >= 1 and not isinstance(param_call.args[0], ast.Starred):
        data = param_call.args[0]
        ds, de = src.span(data)
        simple = isinstance(data, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        edits = [Edit(pend, cend, "")]
        if simple:
            edits.append(Edit(de, de, suffix))
        else:
            edits += [Edit(ds, ds, "("), Edit(de, de, ")" + suffix)]
        fix = Fix(SAFE, f"convert the data inside: nn.Parameter(data{suffix.strip()})", tuple(sorted(edits)))
    message = (f"nn.Parameter(...){suffix.split('(')[0]}(...) is a plain Tensor whenever the conversion happens, so "
               f"{key} is not registered as a parameter (missing from parameters(), the optimizer and the state "
               f"dict); convert the data first: nn.Parameter(data{suffix.split('(')[0]}(...))")
    return finding(src, node, "GPU005", message, fix)
