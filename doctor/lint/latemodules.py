"""GPU011, modules created after a cast: a method other than `__init__` that builds float32
submodules (`nn.Linear(...)` without dtype=, or through a project function that returns one:
`self.mm_projector = build_vision_projector(self.config)` in LLaVA's `initialize_vision_modules()`)
and is called on the model after it was loaded or cast to bf16/fp16. `module_after_cast` records a
file's facts (`Facts.creators`, `Facts.builders`, `Facts.after_cast`, which imported function a
late method calls); gpudoctor.lint.project pairs them over the project, as it does for classes.

Split out of gpudoctor.lint.pyrules, whose `check` calls `module_after_cast`.
"""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from gpudoctor.lint import autofix
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, kwarg, walk

if TYPE_CHECKING:
    from gpudoctor.lint.pyrules import Facts


# Tensor and Module methods that change dtype or device (GPU005, GPU011)
CASTS = {"to", "half", "float", "double", "bfloat16", "cuda", "cpu", "type", "type_as"}
_LOW_PRECISION = {"bfloat16", "float16", "half", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
_BUILDER = ("__", "_init", "init", "build", "_build", "setup", "_setup", "reset", "_reset", "create", "_create",
            "make", "_make", "construct", "_construct", "forward", "extra_repr", "load", "_load", "from_")


def imported_function(src: PySource, node: ast.Call) -> str | None:
    """The name of a lower-case function this file imports (absolutely or relatively) and calls
    without dtype=: whether it returns a float32 module only the project can say."""
    func = node.func
    if not isinstance(func, ast.Name) or not func.id[:1].islower():
        return None
    if func.id not in src.imports and func.id not in src.relative and func.id not in src._conflicts:
        return None
    q = src.qualify(func.id) or src.imports.get(func.id, "")
    if q.startswith(("torch.", "copy.", "deepcopy")) or func.id in ("deepcopy", "getattr"):
        return None
    return func.id


def builders(src: PySource, creates) -> set[str]:
    """Top-level functions of the file that return a new float32 module on some path:
    `return nn.Linear(a, b)`, or a name assigned one (`proj = nn.Sequential(nn.Linear(...)); return
    proj`). `creates(node)`: pyrules' test of one expression."""
    out: set[str] = set()
    for fn in src.tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        made: set[str] = set()
        for st in src.scope_statements(fn):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and \
                    creates(st.value):
                made.add(st.targets[0].id)
            elif isinstance(st, ast.Return) and st.value is not None and \
                    (creates(st.value) or (isinstance(st.value, ast.Name) and st.value.id in made)):
                out.add(fn.name)
                break
    return out


def receiver(node: ast.AST) -> str | None:
    """A receiver written as a chain through calls: `model.get_model()` (LLaVA's
    `model.get_model().initialize_vision_modules(...)`); its leading names are the cast object."""
    plain = dotted(node)
    if plain:
        return plain
    if isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute):
        inner = receiver(node.func.value)
        return f"{inner}.{node.func.attr}()" if inner else None
    if isinstance(node, ast.Attribute):
        inner = receiver(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


# Methods never taken for late builders: dunders, forward, loading and resetting.
NEVER_LATE = ("__", "forward", "extra_repr", "load", "_load", "from_", "reset", "_reset")


def late_method(name: str, builder_named: bool, text: str) -> bool:
    """Whether a method that creates modules can run after the model was cast. Builder names
    (`initialize_vision_modules`, `build_projector`) count only when the file never calls them on
    self (a constructor would); the call after the cast is the rest of the evidence."""
    if name.startswith(NEVER_LATE):
        return False
    return not builder_named or f"self.{name}(" not in text


# --- GPU011: modules created after a cast -----------------------------------------------------


def _dtype_like(node: ast.AST | None) -> bool:
    """torch.bfloat16 / torch.float16 / dtype / self.dtype / weight.dtype (not float32)."""
    if node is None:
        return False
    if isinstance(node, ast.IfExp):  # torch_dtype=(torch.bfloat16 if args.bf16 else None)
        return _dtype_like(node.body) or _dtype_like(node.orelse)
    if isinstance(node, ast.Attribute):
        if node.attr in _LOW_PRECISION:
            return True
        return node.attr == "dtype" or node.attr.endswith("_dtype")
    if isinstance(node, ast.Name):
        return "dtype" in node.id.lower()
    return False


def _cast_event(node: ast.AST) -> str | None:
    """The receiver of `X.to(bf16)`, `X.half()`, `X.bfloat16()`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    method = node.func.attr
    recv = dotted(node.func.value)
    if not recv:
        return None
    if method in ("half", "bfloat16") and not node.args:
        return recv
    if method == "to" and (any(_dtype_like(a) for a in node.args) or _dtype_like(kwarg(node, "dtype"))):
        return recv
    return None


_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|Embedding|EmbeddingBag|"
                       r"LayerNorm|GroupNorm|RMSNorm|BatchNorm[123]d|InstanceNorm[123]d|MultiheadAttention|LSTM|GRU|"
                       r"RNN|PReLU|Transformer\w*)$")
_WEIGHTS_TEXT = re.compile(r"(?:nn|torch\.nn)\.(?:Linear|Bilinear|Conv\w*|Embedding\w*|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm\w*|InstanceNorm\w*|MultiheadAttention|Transformer\w*|LSTM|GRU|RNN|PReLU|Parameter)\("
                           r"|\bParameter\(")
_CASTS_INPUTS = re.compile(r"\.to\([^)\n]*dtype|\.type_as\(|autocast\(")


def _creates_module(src: PySource, node: ast.AST, local_modules) -> bool:
    """A new float32 module with weights: nn.Linear(...) / a local module class that creates
    weights and does not cast its inputs to them / nn.Parameter(torch.randn(...)); no dtype,
    not cast."""
    if not isinstance(node, ast.Call):
        return False
    q = src.qualname(node.func) or ""
    last = q.rsplit(".", 1)[-1]
    if any(k.arg in ("dtype",) or k.arg is None for k in node.keywords):
        return False
    if "dtype" in src.segment(node):
        return False
    if last == "Parameter":
        # nn.Parameter(torch.randn(1, dim) * 0.02): data made here, in float32
        data = node.args[0] if node.args else kwarg(node, "data")
        while isinstance(data, ast.BinOp):
            data = data.left if isinstance(data.left, (ast.Call, ast.BinOp)) else data.right
        if not isinstance(data, ast.Call):
            return False
        dq = src.qualname(data.func) or ""
        return dq.startswith("torch.") and call_name(data) in ("randn", "zeros", "ones", "empty", "rand", "full", "tensor")
    if q.startswith("torch.nn.") and _WEIGHTED.match(last):
        return True
    if last in ("ModuleList", "Sequential", "ModuleDict") and q.startswith("torch.nn."):
        return any(_creates_module(src, n, local_modules) for n in walk([node]) if n is not node)
    info = local_modules.get(last) if isinstance(node.func, ast.Name) else None
    return bool(info) and info[0] and not info[1]


def _local_modules(src: PySource) -> dict[str, tuple[bool, bool]]:
    """nn.Module subclasses of this file: name -> (creates weights, casts its inputs to them)."""
    classes = {c.name: c for c in src.classes}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            for b in cls.bases:
                q = src.qualname(b) or ""
                last = q.rsplit(".", 1)[-1]
                if last in found or last in ("Module", "ModelMixin", "PreTrainedModel"):
                    found.add(name)
                    changed = True
                    break
    texts = {name: src.scope_text(classes[name]) for name in found}
    weights = {name for name in found if _WEIGHTS_TEXT.search(texts[name])}
    changed = True
    while changed:  # a class built from weighted local classes has weights too
        changed = False
        for name in found - weights:
            if any(re.search(r"\b%s\(" % other, texts[name]) for other in weights):
                weights.add(name)
                changed = True
    return {name: (name in weights, bool(_CASTS_INPUTS.search(texts[name]))) for name in found}


_CAST_TEXT = re.compile(r"\.(half|bfloat16)\(\)|\.to\([^)\n]*(dtype|bfloat16|float16|half)|torch_dtype\s*=")
_CONVERT_TEXT = re.compile(r"\.(to|half|bfloat16|float|type|cuda)\(|dtype|device")
_SIMPLE = (ast.Assign, ast.Expr, ast.AugAssign, ast.AnnAssign, ast.Return)


def module_after_cast(src: PySource, facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    local = _local_modules(src)
    for scope in [src.tree, *src.functions]:
        text = src.text if scope is src.tree else src.scope_text(scope)
        if not _CAST_TEXT.search(text):
            continue
        cast_at: dict[str, int] = {}
        pending: dict[str, tuple[ast.Assign, str]] = {}
        for s in src.scope_statements(scope):
            if not isinstance(s, _SIMPLE):
                continue
            value = getattr(s, "value", None)
            # conversions resolve pending modules (X.to(...), X.sub.to(...), X.half())
            if pending and _CONVERT_TEXT.search(src.segment(s)):
                for c in walk([s]):
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                            c.func.attr in CASTS:
                        recv = dotted(c.func.value) or ""
                        for key in list(pending):
                            if key == recv or key.startswith(recv + ".") or recv.startswith(key + "."):
                                del pending[key]
            # a cast of X (as a statement or X = X.to(...))
            recv = _cast_event(value) if isinstance(s, (ast.Expr, ast.Assign)) else None
            if recv:
                cast_at[recv] = s.lineno
                cast_at.setdefault(recv.split(".")[0], s.lineno)
            # X.attr = nn.Linear(...) after a cast of X
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute):
                key = dotted(s.targets[0])
                owner = dotted(s.targets[0].value)
                if key and owner and owner in cast_at and cast_at[owner] < s.lineno and \
                        _creates_module(src, s.value, local):
                    pending[key] = (s, owner)
            # calls on a cast object: candidates for the cross-file part
            if isinstance(s, (ast.Expr, ast.Assign)) and isinstance(value, ast.Call) and \
                    isinstance(value.func, ast.Attribute):
                c = value
                recv_name = receiver(c.func.value) or ""
                # the longest cast prefix: self.pipe.dit.enable_x() after self.pipe was loaded cast
                parts = recv_name.split(".") if recv_name else []
                root = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in cast_at), "")
                if root and cast_at[root] < s.lineno and not c.func.attr.startswith(NEVER_LATE):
                    col = src.char_col(c.func.end_lineno, c.func.end_col_offset - len(c.func.attr)) + 1  # type: ignore[arg-type]
                    facts.after_cast.append((c.func.attr, c.func.end_lineno, col, root, cast_at[root], recv_name))  # type: ignore[arg-type]
            # `pipe = Pipeline.from_pretrained(..., torch_dtype=torch.bfloat16)` loads cast weights
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(value, ast.Call) and \
                    call_name(value).startswith(("from_", "load")):
                target = dotted(s.targets[0])
                td = kwarg(value, "torch_dtype")
                if target and td is not None and _dtype_like(td):
                    cast_at[target] = s.lineno
        for key, (s, owner) in pending.items():
            out.append(finding(src, s, "GPU011", (
                f"{key} is created after {owner} was cast (line {cast_at[owner]}) and never converted: new modules "
                f"are float32, so their matmuls with the cast model's activations fail with 'mat1 and mat2 must "
                f"have the same dtype'; create it with dtype= or convert it (.to(dtype=..., device=...))"),
                Fix(DISPLAY_ONLY, f"convert it: {key} = {key}.to(dtype=..., device=...) (those of {owner})")))
    # cross-file summaries: methods (not __init__ or its helpers) that add float32 modules, and
    # every class of the file (for creators in other modules)
    for cls in src.classes:
        facts.classes[cls.name] = _class_summary(src, cls)
    facts.builders = builders(src, lambda node: _creates_module(src, node, local))
    for cls in src.classes:  # mixins too (LLaVA's LlavaMetaModel): the call after a cast is the evidence
        methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        from_init = _called_from(src, methods, "__init__")
        for name, m in methods.items():
            if name in from_init or not late_method(name, name.startswith(_BUILDER), src.text):
                continue
            created = _created_in(src, m, local)
            if created:
                facts.creators[name] = created
    return out


_FOREIGN = re.compile(r"[A-Z]\w*$")


def _class_summary(src: PySource, cls: ast.ClassDef) -> tuple[tuple[str, ...], bool, bool, tuple[str, ...]]:
    text = src.scope_text(cls)
    bases = tuple((src.qualname(b) or "").rsplit(".", 1)[-1] for b in cls.bases)
    builds = tuple(sorted(set(re.findall(r"\b([A-Z]\w*)\(", text)) - {cls.name}))
    return bases, bool(_WEIGHTS_TEXT.search(text)), bool(_CASTS_INPUTS.search(text)), builds


def _creation(src: PySource, node: ast.AST, local) -> tuple[bool, str | None] | None:
    """(it creates float32 weights for sure, or the class name only the project can judge) for
    the value of `self.x = ...`; None when it creates nothing new in float32."""
    if _creates_module(src, node, local):
        return True, None
    if not isinstance(node, ast.Call) or any(k.arg == "dtype" or k.arg is None for k in node.keywords) or \
            "dtype" in src.segment(node):
        return None
    q = src.qualname(node.func) or ""
    last = q.rsplit(".", 1)[-1]
    if last in ("ModuleList", "Sequential", "ModuleDict") and q.startswith("torch.nn."):
        for n in walk([node]):
            if n is not node and isinstance(n, ast.Call):
                inner = _creation(src, n, local)
                if inner is not None:
                    return inner
        return None
    if isinstance(node.func, ast.Name) and _FOREIGN.match(node.func.id) and node.func.id not in local and \
            not q.startswith("torch."):
        return False, node.func.id  # a class of another module: the project pass decides
    builder = imported_function(src, node)
    return (False, builder) if builder else None  # build_projector(cfg) of another module: the same


_CONVERTS = {"to", "half", "bfloat16", "float", "double", "type", "cuda"}


def _created_in(src: PySource, m: ast.AST, local) -> list[tuple[Finding, str | None]]:
    """What method `m` assigns to self that creates float32 weights and never converts later in
    the method: module.to() / .half() converts a module in place, a Parameter's does not (its
    result is thrown away: GPU005); self.to(...) converts everything."""
    stmts = src.scope_statements(m)
    out = []
    for i, s in enumerate(stmts):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and (dotted(s.targets[0]) or "").startswith("self.")):
            continue
        made = _creation(src, s.value, local)
        if made is None:
            continue
        key = dotted(s.targets[0]) or ""
        is_param = isinstance(s.value, ast.Call) and (src.qualname(s.value.func) or "").endswith("Parameter")
        if _converted_later(stmts[i + 1:], key, is_param):
            continue
        sure, foreign = made
        what = "an nn.Parameter" if is_param else f"a {foreign or call_name(s.value) or 'module'}"
        what = f"the new module {foreign}() returns" if foreign and foreign[:1].islower() else what
        f = finding(src, s, "GPU011", (
            f"{key} is {what} created in float32 in {m.name}() and never converted; {{caller}}: float32 "  # type: ignore[attr-defined]
            f"weights meeting the cast model's activations fail with 'mat1 and mat2 must have the same dtype'; "
            f"create it with dtype=/device= of the existing weights or convert it at the end of {m.name}()"),  # type: ignore[attr-defined]
            autofix.late_module(src, m, s, is_param,  # the conversion, where the method's shape allows one
                                f"{key} = {key}.to(dtype=ref.dtype, device=ref.device) with ref = next(self.parameters())"
                                if not is_param else f"{key}.data = {key}.data.to(dtype=ref.dtype, device=ref.device)"))
        out.append((f, foreign))
    return out


def _converted_later(stmts: list[ast.stmt], key: str, is_param: bool) -> bool:
    for s in stmts:
        for node in walk([s]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CONVERTS:
                recv = dotted(node.func.value) or ""
                if recv == "self":
                    return True  # self.to(...): every submodule and parameter
                if recv == key and not is_param:
                    return True  # a module converts in place
            if isinstance(node, ast.Assign) and any(dotted(t) in (key, key + ".data") for t in node.targets):
                return True  # reassigned (a Parameter reassigned from .to() is GPU005's finding)
            if isinstance(node, (ast.For, ast.AsyncFor)) and not is_param and \
                    any(dotted(e) == key for e in walk([node.iter])):
                loop_var = dotted(node.target)
                if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _CONVERTS
                       and dotted(c.func.value) == loop_var for c in walk(node.body)):
                    return True  # for module in [self.a, self.b]: module.to(...)
    return False


_SELF_CREATE = re.compile(rb"^([ \t]*)self\.\w+[ \t]*=[ \t]*(?:[\w.]*\.)?(?:[A-Z]\w*|Parameter|\w*(?:build|make|create)_\w*)\(",
                          re.M)
_OTHER_CREATE = re.compile(rb"^[ \t]*(?!self\.)[A-Za-z_]\w*(?:\.\w+)+[ \t]*=[ \t]*(?:[\w.]*\.)?[A-Z]\w*\(", re.M)
_SELF_CAST = re.compile(rb"self\.(?:half|bfloat16|to)\(")
_DEF = re.compile(rb"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


def may_create_late(data: bytes) -> bool:
    """Whether GPU011 can find anything in this file itself, read from the text before parsing:
    an attribute of another object assigned a new module (model.head = nn.Linear(...)), the
    object cast with self.half() / self.to(), or self.x = SomeModule(...) in a method that is not
    __init__ or a builder. False means the file matters to GPU011 only for its calls after a cast
    (the engine defers it)."""
    if _OTHER_CREATE.search(data) or _SELF_CAST.search(data):
        return True
    defs = None
    for m in _SELF_CREATE.finditer(data):
        if defs is None:
            defs = [(d.start(), len(d.group(1)), d.group(2).decode("ascii", "replace")) for d in _DEF.finditer(data)]
        indent = len(m.group(1))
        name = next((n for start, ind, n in reversed(defs) if start < m.start() and ind < indent), None)
        if name is None or late_method(name, name.startswith(_BUILDER), data.decode("latin-1")):
            return True
    return False


def _called_from(src: PySource, methods: dict[str, ast.AST], root: str) -> set[str]:
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        m = methods.get(name)
        if m is None or name in seen:
            continue
        seen.add(name)
        todo += re.findall(r"self\.(\w+)\(", src.scope_text(m))
    return seen
