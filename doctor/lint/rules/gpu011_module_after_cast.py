"""GPU011 (module-after-cast): modules created after a cast. Its documentation (what
`gpudoctor explain GPU011` prints, its row in docs/lint.md) and its check (`check`, called by
gpudoctor.lint.pyrules).

The rule finds a method other than `__init__` that builds float32
submodules (`nn.Linear(...)` without dtype=, or through a project function that returns one:
`self.mm_projector = build_vision_projector(self.config)` in LLaVA's `initialize_vision_modules()`)
and is called on the model after it was loaded or cast to bf16/fp16. `module_after_cast` records a
file's facts (`Facts.creators`, `Facts.builders`, `Facts.after_cast`, which imported function a
late method calls); gpudoctor.lint.project pairs them over the project, as it does for classes.
"""
from __future__ import annotations

import ast
import bisect
import re
from typing import TYPE_CHECKING

from gpudoctor.lint import autofix
from gpudoctor.lint.castflow import CASTS, NEVER_LATE, Cast, Scan, receiver
from gpudoctor.lint.model import Finding
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, kwarg, walk
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyrules import Facts

RULE = Rule(
    code="GPU011",
    name="module-after-cast",
    kb_id="dtype-mismatch",
    title="a submodule or parameter is created after the model was cast and is never converted",
    kinds=(PYTHON,),
    prefilter=((b"nn.", b"Module", b"Parameter", b"dtype", b".half()", b".bfloat16()"),),
    # a cast (the cross-file call site) or an nn module assigned to self (the creators)
    pattern=((rb"self\.\w+\s*=\s*(?:nn|torch\.nn)\.[A-Z]", rb"torch_dtype\s*=", rb"\.(?:half|bfloat16)\(\)",
              rb"\.to\([^)\n]*(?:dtype|bfloat16|float16|half)",
              # a builder function of the project (build_projector) and a method that calls one
              rb"return[ \t]+(?:nn|torch\.nn)\.[A-Z]", rb"self\.\w+\s*=\s*\w*(?:build|make|create)_\w*\("),),
    what=(
        "After a module was cast (`.to(dtype)`, `.half()`, `.bfloat16()`, from_pretrained(torch_dtype=...); "
        "also when it arrives through a parameter, an attribute of self or a project function's return), "
        "a new nn module or nn.Parameter without dtype= is added to it by any means (an attribute, "
        "model[3] = ..., append, insert, extend, add_module, register_module, register_parameter, update, "
        "setattr) and never converted. Also a method other than __init__ (and not called from it) that adds "
        "float32 submodules or parameters to self (an enable_*_mode(), with the helpers it calls), when "
        "another module calls it on an object after casting it: reported at each creation, naming the call "
        "and the cast. Classes of other modules count by the project's class table (weights of their own, "
        "of a base or of a class they build; not a class that casts its inputs to its weights)."
    ),
    why=(
        "New modules are created in float32. Next to a bfloat16 / float16 model their matmuls get "
        "mixed operands and fail: RuntimeError: mat1 and mat2 must have the same dtype, but got "
        "BFloat16 and Float."
    ),
    example="model.to(torch.bfloat16)\nmodel.head = nn.Linear(1024, 10)",
    fix=("model.head = nn.Linear(1024, 10).to(dtype=torch.bfloat16)   # or one model.to(...) after every module exists\n"
         "# in a late method: ref_param = next(self.parameters()) first, then\n"
         "self.head = Head(dim).to(device=ref_param.device, dtype=ref_param.dtype)"),
    fix_safety=(
        "unsafe: in a late method, its first line takes the weights the model already has (ref_param = "
        "next(self.parameters())) and each module it creates is converted to their dtype and device, a "
        "parameter's data inside nn.Parameter(...); new weights are rounded to the model's precision, and "
        "a model without parameters has no reference. Display-only elsewhere: the right dtype and device "
        "are those of the model the module joins."
    ),
    near_misses=(
        "Modules converted later with module.to(...) (in place, or item by item: "
        "self.blocks[i] = block.to(...)), Parameters converted through .data, classes that cast their "
        "inputs to their weights (a class casting one of its own parameters to the input still "
        "fires), classes without weights, objects reassigned to something else after the cast, "
        "modules created in __init__ or in a builder it calls, modules created with dtype=/device=, "
        "modules converted later in the same function, and casts to float32 do not fire."
    ),
)


__all__ = ["RULE", "check", "CASTS", "NEVER_LATE", "receiver", "module_after_cast", "may_create_late", "late_method", "builders",
           "imported_function"]

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


def late_method(name: str, builder_named: bool, text: str) -> bool:
    """Whether a method that creates modules can run after the model was cast. Builder names
    (`initialize_vision_modules`, `build_projector`) count only when the file never calls them on
    self (a constructor would); the call after the cast is the rest of the evidence."""
    if name.startswith(NEVER_LATE):
        return False
    return not builder_named or f"self.{name}(" not in text


# --- GPU011: modules created after a cast -----------------------------------------------------


_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|Embedding|EmbeddingBag|"
                       r"LayerNorm|GroupNorm|RMSNorm|BatchNorm[123]d|InstanceNorm[123]d|MultiheadAttention|LSTM|GRU|"
                       r"RNN|PReLU|Transformer\w*)$")
# A text that creates weights: `nn.Linear(` (also as `torch.nn.Linear(`) and the like, or
# `Parameter(`. Two regexes, each starting with its literal (one alternation of both is several
# times slower: the engine tries it at every position).
_WEIGHTS_TEXTS = (re.compile(r"nn\.(?:Linear|Bilinear|Conv\w*|Embedding\w*|LayerNorm|GroupNorm|RMSNorm|"
                             r"BatchNorm\w*|InstanceNorm\w*|MultiheadAttention|Transformer\w*|LSTM|GRU|RNN|PReLU)\("),
                  re.compile(r"\bParameter\("))


def _creates_weights(text: str) -> bool:
    return any(p.search(text) for p in _WEIGHTS_TEXTS)
# A class that casts its inputs to its own weights (`x.to(self.fc.weight.dtype)`, `x.type_as(self.w)`,
# autocast): new float32 instances of it work beside a cast model. Casting one of its own
# parameters to the input (`self.modulation.to(dtype=t.dtype)`) covers that parameter only.
_RECEIVER = re.compile(r"([A-Za-z_][\w.]*)(?:\([^()\n]*\))?$")


def _casts_inputs(text: str) -> bool:
    if "autocast(" in text:
        return True
    for word in (".to(", ".type_as("):
        at = text.find(word)
        while at >= 0:
            line_start = text.rfind("\n", 0, at) + 1
            end = text.find(")", at)
            newline = text.find("\n", at)
            args = text[at + len(word): end if end >= 0 and (newline < 0 or end < newline) else newline]
            m = _RECEIVER.search(text, line_start, at)
            recv = m.group(1) if m else ""
            if recv and not recv.startswith("self.") and recv != "self" and "self." in args and \
                    (word == ".type_as(" or "dtype" in args):
                return True
            at = text.find(word, at + 1)
    return False


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
    weights = {name for name in found if _creates_weights(texts[name])}
    changed = True
    while changed:  # a class built from weighted local classes has weights too
        changed = False
        for name in found - weights:
            if any(re.search(r"\b%s\(" % other, texts[name]) for other in weights):
                weights.add(name)
                changed = True
    return {name: (name in weights, _casts_inputs(texts[name])) for name in found}


# A cast in a scope's text: `.half()`, `.bfloat16()`, `.to(... dtype ...)`, `torch_dtype=`. Two
# regexes, each starting with a literal (the engine skips to it), searched once per file.
_CAST_TEXT = (re.compile(r"\.(?:(?:half|bfloat16)\(\)|to\([^)\n]*(?:dtype|bfloat16|float16|half))"),
              re.compile(r"torch_dtype\s*="))


def _casting_scopes(src: PySource) -> list[ast.AST]:
    """The module and the functions whose text has a cast (`_CAST_TEXT`): the file searched once,
    each function judged by whether a match starts within its lines."""
    hits = sorted(m.start() for p in _CAST_TEXT for m in p.finditer(src.text))
    if not hits:
        return []
    starts = src.starts

    def has(node: ast.AST) -> bool:
        i = bisect.bisect_left(hits, starts[node.lineno - 1])  # type: ignore[attr-defined]
        return i < len(hits) and hits[i] < starts[min(node.end_lineno, len(starts) - 1)]  # type: ignore[attr-defined]

    return [src.tree, *(fn for fn in src.functions if has(fn))]
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def module_after_cast(src: PySource, facts: Facts) -> list[Finding]:
    """GPU011 in one file: the scopes that cast (gpudoctor.lint.castflow.Scan), twice for a class
    whose methods store a cast object on self (the other methods start with it cast), with what
    the file's own functions return; then the file's summaries for the project pass."""
    out: list[Finding] = []
    local = _local_modules(src)

    def creates(node: ast.AST) -> bool:
        return _creates_module(src, node, local)

    owner = {id(m): cls for cls in src.classes for m in cls.body if isinstance(m, _FUNCS)}
    scopes = _casting_scopes(src)
    returned: dict[str, Cast] = {}

    def returns(call: ast.Call) -> Cast | None:
        func = call.func
        key = func.id if isinstance(func, ast.Name) else \
            f"self.{func.attr}" if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
            func.value.id == "self" else None
        return returned.get(key) if key else None

    # what the file's functions return cast (a loader: `return model.to(dtype=torch_dtype)`)
    for fn in scopes:
        if fn is not src.tree and any(isinstance(n, ast.Return) and n.value is not None for n in walk(fn.body)):  # type: ignore[attr-defined]
            scan = Scan(src, fn, creates)
            scan.run()
            if scan.returned is not None:
                key = fn.name if id(fn) not in owner else f"self.{fn.name}"  # type: ignore[attr-defined]
                returned[key] = Cast(scan.returned.line, "", f"returned by {fn.name}() (line {fn.lineno})")  # type: ignore[attr-defined]
                if id(fn) not in owner and src.module and fn in src.tree.body:
                    facts.cast_returns[f"{src.module}.{fn.name}"] = scan.returned.line  # type: ignore[attr-defined]
    seen: set[tuple[int, int]] = set()
    after: set[tuple[str, int, int]] = set()

    def keep(scan: Scan) -> None:
        for f in scan.run():
            if (f.line, f.col) not in seen:
                seen.add((f.line, f.col))
                out.append(f)
        for entry in scan.after:
            if entry[:3] not in after:
                after.add(entry[:3])
                facts.after_cast.append(entry)

    stores: dict[str, dict[str, tuple[Cast, str]]] = {}  # class -> self.attr -> (cast, storing method)
    for scope in scopes:
        scan = Scan(src, scope, creates, returns=returns)
        keep(scan)
        cls = owner.get(id(scope))
        if cls is not None:
            for path, cast in scan.stores.items():
                stores.setdefault(cls.name, {}).setdefault(path, (cast, scope.name))  # type: ignore[attr-defined]
    # attributes of self: stored cast by one method, used by the others
    for cls in src.classes:
        fields = stores.get(cls.name)
        if not fields:
            continue
        for m in cls.body:
            if not isinstance(m, _FUNCS) or any(storer == m.name for _, storer in fields.values()):
                continue
            text = src.scope_text(m)
            entry = {path: Cast(cast.line, path, f"stored on self by {storer}()") for path, (cast, storer) in fields.items()
                     if path + "." in text or path + "[" in text}
            if entry:
                keep(Scan(src, m, creates, entry=entry, returns=returns))
    # cross-file summaries: methods (not __init__ or its helpers) that add float32 modules, and
    # every class of the file (for creators in other modules)
    for cls in src.classes:
        facts.classes[cls.name] = _class_summary(src, cls)
    facts.builders = builders(src, lambda node: _creates_module(src, node, local))
    for cls in src.classes:  # mixins too (LLaVA's LlavaMetaModel): the call after a cast is the evidence
        methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        from_init = _called_from(src, methods, "__init__")
        containers: set[str] | None = None
        for name, m in methods.items():
            if name in from_init or not late_method(name, name.startswith(_BUILDER), src.text):
                continue
            if containers is None:
                containers = _module_containers(src, m)
            created = _created_in(src, m, local, methods, containers=containers)
            if created:
                facts.creators[name] = [(f, foreign) for f, foreign, _ in created]
    return out


_FOREIGN = re.compile(r"[A-Z]\w*$")


def _class_summary(src: PySource, cls: ast.ClassDef) -> tuple[tuple[str, ...], bool, bool, tuple[str, ...]]:
    text = src.scope_text(cls)
    bases = tuple((src.qualname(b) or "").rsplit(".", 1)[-1] for b in cls.bases)
    builds = tuple(sorted(set(re.findall(r"\b([A-Z]\w*)\(", text)) - {cls.name}))
    return bases, _creates_weights(text), _casts_inputs(text), builds


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


def _self_creations(src: PySource, s: ast.stmt) -> tuple[str, ast.AST, bool] | None:
    """(key, the new value, whether it is a parameter) when statement `s` adds something to self:
    `self.x = ...`, `self.blocks[i] = ...`, `self.blocks["k"] = ...`, `self.layers.append(...)`
    (`insert`, `extend`), `self.add_module("x", ...)`, `self.register_module("x", ...)`,
    `self.register_parameter("p", ...)`, `setattr(self, "x", ...)`."""
    if isinstance(s, ast.Assign) and len(s.targets) == 1:
        target = s.targets[0]
        key = dotted(target) or ""
        if key.startswith("self.") and isinstance(target, ast.Attribute):
            return key, s.value, _is_parameter(src, s.value)
        if isinstance(target, ast.Subscript) and (dotted(target.value) or "").startswith("self."):
            return dotted(target.value), s.value, False  # type: ignore[return-value]
        return None
    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
        return None
    c = s.value
    func = c.func
    if isinstance(func, ast.Name) and func.id == "setattr" and len(c.args) == 3 and dotted(c.args[0]) == "self":
        return f"self.{_name_of(src, c.args[1])}", c.args[2], _is_parameter(src, c.args[2])
    if not isinstance(func, ast.Attribute):
        return None
    recv = dotted(func.value) or ""
    if recv == "self" and func.attr in ("add_module", "register_module", "register_parameter") and len(c.args) == 2:
        return f"self.{_name_of(src, c.args[0])}", c.args[1], func.attr == "register_parameter"
    if recv.startswith("self.") and func.attr in ("append", "insert", "extend") and c.args:
        new = c.args[-1]
        if func.attr == "extend" and isinstance(new, (ast.List, ast.Tuple)) and new.elts:
            new = new.elts[0]
        return recv, new, False
    return None


def _name_of(src: PySource, node: ast.AST) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else f"<{src.segment(node)}>"


def _is_parameter(src: PySource, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (src.qualname(node.func) or "").endswith("Parameter")


def _created_in(src: PySource, m: ast.AST, local, methods: dict[str, ast.AST] | None = None, late: str | None = None,
                depth: int = 0, containers: set[str] | None = None) -> list[tuple[Finding, str | None, str]]:
    """What method `m` adds to self that creates float32 weights and never converts later in the
    method (module.to() / .half() converts a module in place, a Parameter's does not: its result
    is thrown away, GPU005; self.to(...) converts everything), with what the helper methods of
    the class it calls add the same way. Each: (finding, the class or builder only the project
    can judge, the key)."""
    stmts = src.scope_statements(m)
    out = []
    late = late or m.name  # type: ignore[attr-defined]
    containers = _module_containers(src, m) if containers is None else containers
    for i, s in enumerate(stmts):
        helper = _self_call(s)
        if helper and methods and helper in methods and methods[helper] is not m and depth < 3:
            for f, foreign, key in _created_in(src, methods[helper], local, methods, late, depth + 1, containers):
                if not _converted_later(stmts[i + 1:], key, f.message.startswith(f"{key} is an nn.Parameter")):
                    out.append((f, foreign, key))
            continue
        added = _self_creations(src, s)
        if added is None:
            continue
        key, value, is_param = added
        made = _creation(src, value, local)
        if made is None:
            continue
        itemwise = isinstance(s, ast.Expr) or (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Subscript))
        if itemwise and not made[0] and not (key in containers or _call_attr(s) in ("add_module", "register_module")):
            # appended or stored item by item: a module for sure, or a class of another module put
            # into a ModuleList / ModuleDict / Sequential (a plain list of objects is not)
            continue
        if _converted_later(stmts[i + 1:], key, is_param):
            continue
        sure, foreign = made
        what = "an nn.Parameter" if is_param else f"a {foreign or call_name(value) or 'module'}"
        what = f"the new module {foreign}() returns" if foreign and foreign[:1].islower() else what
        where = f"{m.name}()" if m.name == late else f"{m.name}() (called by {late}())"  # type: ignore[attr-defined]
        f = finding(src, s, "GPU011", (
            f"{key} is {what} created in float32 in {where} and never converted; {{caller}}: float32 "
            f"weights meeting the cast model's activations fail with 'mat1 and mat2 must have the same dtype'; "
            f"create it with dtype=/device= of the existing weights or convert it at the end of {late}()"),
            autofix.late_module(src, m, s, value, is_param,  # the conversion, where the method's shape allows one
                                f"{key} = {key}.to(dtype=ref.dtype, device=ref.device) with ref = next(self.parameters())"
                                if not is_param else f"{key}.data = {key}.data.to(dtype=ref.dtype, device=ref.device)"))
        out.append((f, foreign, key))
    return out


def _module_containers(src: PySource, m: ast.AST) -> set[str]:
    """self.<attr> that the class of method `m` assigns an nn.ModuleList / ModuleDict / Sequential."""
    cls = next((c for c in src.classes if m in c.body), None)
    out: set[str] = set()
    if cls is None or not any(w in src.scope_text(cls) for w in ("ModuleList", "ModuleDict", "Sequential")):
        return out
    for n in walk(cls.body):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call):
            q = src.qualname(n.value.func) or ""
            if q.rsplit(".", 1)[-1] in ("ModuleList", "ModuleDict", "Sequential"):
                out.add(dotted(n.targets[0]) or "")
    return out


def _call_attr(s: ast.stmt) -> str | None:
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Attribute):
        return s.value.func.attr
    return None


def _self_call(s: ast.stmt) -> str | None:
    """`self.helper(...)` as a statement: the helper's name."""
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Attribute) and \
            dotted(s.value.func.value) == "self":
        return s.value.func.attr
    return None


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
                loop_vars = {n.id for n in walk([node.target]) if isinstance(n, ast.Name)}
                for c in walk(node.body):
                    # for module in [self.a, self.b]: module.to(...); for i, b in enumerate(self.blocks):
                    # self.blocks[i] = b.to(...)
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _CONVERTS \
                            and dotted(c.func.value) in loop_vars:
                        return True
    return False


_SELF_CREATE = re.compile(rb"^([ \t]*)self\.\w+[ \t]*=[ \t]*(?:[\w.]*\.)?(?:[A-Z]\w*|Parameter|\w*(?:build|make|create)_\w*)\(",
                          re.M)
_OTHER_CREATE = (
    re.compile(rb"^[ \t]*(?!self\.)[A-Za-z_]\w*(?:(?:\.\w+)+(?:\[[^\]\n]+\])?|\[[^\]\n]+\])[ \t]*=[ \t]*"
               rb"(?:[\w.]*\.)?[A-Z]\w*\(", re.M),
    # model.append(nn.Linear(...)), add_module, register_parameter, ...; setattr(model, "x", nn.Linear(...))
    re.compile(rb"\.(?:append|insert|extend|add_module|register_module|register_parameter|update)\([^\n]*"
               rb"(?:\bnn\.[A-Z]|Parameter\()"),
    re.compile(rb"\bsetattr\([^\n]*(?:\bnn\.[A-Z]|Parameter\()"),
)
_SELF_CAST = re.compile(rb"self\.(?:half|bfloat16|to)\(")
_DEF = re.compile(rb"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


def may_create_late(data: bytes) -> bool:
    """Whether GPU011 can find anything in this file itself, read from the text before parsing:
    an attribute of another object assigned a new module (model.head = nn.Linear(...)), the
    object cast with self.half() / self.to(), or self.x = SomeModule(...) in a method that is not
    __init__ or a builder. False means the file matters to GPU011 only for its calls after a cast
    (the engine defers it)."""
    if any(p.search(data) for p in _OTHER_CREATE) or _SELF_CAST.search(data):
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


def check(src: PySource, facts: Facts) -> list[Finding]:
    """GPU011 on one file: its findings, and its facts for the project pass."""
    return module_after_cast(src, facts)
