"""GPU011's value flow: which objects hold a model cast to a lower precision, and what is added to
one afterwards.

One scope (a function, or the module body) is read statement by statement; a cast on any path
counts (branches are not joined: `if args.bf16: model = model.half()` makes the bf16 run fail).
The state is a map from access paths (`model`, `self.pipe`, `self.pipe.dit`) to where they were
cast; a sub-path of a cast path is cast (a submodule of a cast model is). It comes from:

- conversions: `X.to(torch.bfloat16)`, `X.half()`, `X.bfloat16()` (in place for a module, and
  their result), `from_pretrained(..., torch_dtype=...)` / `load_*(..., torch_dtype=...)`, a
  constructor given `torch_dtype=torch.bfloat16` (a pipeline that loads its models so);
- names: an alias of a cast path, `X.eval()` / `.train()` / `.requires_grad_()` / `.cuda()` of one,
  and `X = f(..., X, ...)` (a call handed the cast object and assigned back to its name);
  any other assignment ends it (`X.float()` too);
- attributes of self: what one method of a class stores cast on self is cast when another method
  of the class starts (`gpudoctor.lint.rules.gpu011_module_after_cast` runs the class's methods twice);
- the project's functions: what a function returns when it returns a cast object (`returns`),
  and a parameter whose every caller the project pass finds passes one (`entry`: the project
  pass, `resolve`, asks for it only for functions that call a late creator on a parameter).

What the scan reports: a module or parameter added to a cast object by any means (an attribute,
`model[3] = ...`, `append`, `insert`, `extend`, `add_module`, `register_module`,
`register_parameter`, `update`, `setattr`) and never converted afterwards in the scope; and every
call of a method on a cast object (`pipe.dit.enable_x()`), which the project pass pairs with the
methods that create float32 modules late (`Facts.creators`).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Callable

from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, kwarg, walk

# Tensor and Module methods that change dtype or device (GPU005, GPU011)
CASTS = {"to", "half", "float", "double", "bfloat16", "cuda", "cpu", "type", "type_as"}
_LOW_PRECISION = {"bfloat16", "float16", "half", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
# Methods that return the module they are called on.
_SAME_OBJECT = {"eval", "train", "requires_grad_", "cuda", "cpu", "to", "half", "bfloat16", "share_memory", "apply"}
# Ways of adding a module or parameter to an object: method -> which argument is the new one
# (-1: the last positional one; "*": every element of the argument).
_ADDERS = {"append": -1, "insert": -1, "add_module": 1, "register_module": 1, "register_parameter": 1,
           "extend": "*", "update": "*"}
_SIMPLE = (ast.Assign, ast.Expr, ast.AugAssign, ast.AnnAssign, ast.Return)
_CONVERT_TEXT = re.compile(r"\.(to|half|bfloat16|float|type|cuda)\(|dtype|device")
# Methods never taken for late builders: dunders, forward, loading and resetting.
NEVER_LATE = ("__", "forward", "extra_repr", "load", "_load", "from_", "reset", "_reset")


@dataclass(frozen=True)
class Cast:
    line: int  # where it was cast, in the scope's file
    root: str  # the cast path as the scope spells it
    how: str = ""  # how the cast reached this scope from elsewhere (a caller, a function's return)


def dtype_like(node: ast.AST | None) -> bool:
    """torch.bfloat16 / torch.float16 / dtype / self.dtype / weight.dtype (not float32)."""
    if node is None:
        return False
    if isinstance(node, ast.IfExp):  # torch_dtype=(torch.bfloat16 if args.bf16 else None)
        return dtype_like(node.body) or dtype_like(node.orelse)
    if isinstance(node, ast.Attribute):
        if node.attr in _LOW_PRECISION:
            return True
        return node.attr == "dtype" or node.attr.endswith("_dtype")
    if isinstance(node, ast.Name):
        return "dtype" in node.id.lower()
    return False


def cast_event(node: ast.AST) -> str | None:
    """The receiver of `X.to(bf16)`, `X.half()`, `X.bfloat16()`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    method = node.func.attr
    recv = dotted(node.func.value)
    if not recv:
        return None
    if method in ("half", "bfloat16") and not node.args:
        return recv
    if method == "to" and (any(dtype_like(a) for a in node.args) or dtype_like(kwarg(node, "dtype"))):
        return recv
    return None


def loaded_cast(node: ast.AST) -> bool:
    """`X.from_pretrained(..., torch_dtype=...)`, `load_model(..., torch_dtype=...)`, or a class
    built with `torch_dtype=torch.bfloat16` (a pipeline that loads its models in that dtype)."""
    if not isinstance(node, ast.Call):
        return False
    td = kwarg(node, "torch_dtype")
    name = call_name(node)
    if name.startswith(("from_", "load")):
        return dtype_like(td) or (name.startswith("from_") and dtype_like(kwarg(node, "dtype")))
    if name[:1].isupper() and td is not None:
        return dtype_like(td)
    return False


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
    if isinstance(node, ast.Subscript):
        inner = receiver(node.value)
        return f"{inner}[]" if inner else None
    return None


def _name(src: PySource, node: ast.AST) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else f"<{src.segment(node)}>"


def _prefixes(path: str) -> list[str]:
    parts = re.split(r"(?=[.\[])", path)
    return ["".join(parts[:n]) for n in range(len(parts), 0, -1)]


class Scan:
    """One scope of one file, read in order. `entry`: paths cast when the scope starts (its
    parameters, attributes of self); `returns`: (callee) -> Cast for the project's functions
    known to return a cast object; `on_call(call, scan)`: called at every call, for the project
    pass's questions ("is this argument cast here?")."""

    def __init__(self, src: PySource, scope: ast.AST, creates: Callable[[ast.AST], bool],
                 entry: dict[str, Cast] | None = None, returns: Callable[[ast.Call], Cast | None] | None = None,
                 on_call: Callable[[ast.Call, "Scan"], None] | None = None) -> None:
        self.src, self.scope, self.creates = src, scope, creates
        self.cast: dict[str, Cast] = dict(entry or {})
        self.returns_of = returns
        self.on_call = on_call
        self.pending: list[tuple[str, ast.stmt, Cast, str]] = []  # (key, statement, owner's cast, verb)
        # calls of methods on cast objects: (method, line, col, cast root, cast line, receiver, how)
        self.after: list[tuple[str, int, int, str, int, str, str]] = []
        self.stores: dict[str, Cast] = {}  # self.attr -> the cast it was assigned
        self.returned: Cast | None = None
        self.results: dict[str, ast.Call] = {}  # name -> the project call it was assigned from

    # state

    def lookup(self, path: str | None) -> Cast | None:
        if not path:
            return None
        for p in _prefixes(path):
            if p in self.cast:
                return self.cast[p]
        return None

    def state(self, node: ast.AST | None, line: int) -> Cast | None:
        if node is None:
            return None
        if isinstance(node, ast.IfExp):
            return self.state(node.body, line) or self.state(node.orelse, line)
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
            return self.lookup(receiver(node))
        if not isinstance(node, ast.Call):
            return None
        recv = cast_event(node)
        if recv is not None:
            return Cast(line, recv)
        if loaded_cast(node):
            return Cast(line, "")
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr == "float" or (func.attr == "to" and any(
                    isinstance(a, ast.Attribute) and a.attr in ("float32", "float") for a in node.args)):
                return None
            if func.attr in _SAME_OBJECT:
                return self.state(func.value, line)
        if self.returns_of is not None:
            return self.returns_of(node)
        return None

    def _kill(self, path: str) -> None:
        for p in [p for p in self.cast if p == path or p.startswith(path + ".") or p.startswith(path + "[")]:
            del self.cast[p]

    # the scan

    def run(self) -> list[Finding]:
        for s in self.src.scope_statements(self.scope):
            if isinstance(s, _SIMPLE):
                self.statement(s)
            elif self.on_call is not None and isinstance(s, (ast.If, ast.While, ast.For, ast.With)):
                for header in (getattr(s, "test", None), getattr(s, "iter", None)):
                    for c in walk([header]) if header is not None else ():
                        if isinstance(c, ast.Call):
                            self.on_call(c, self)
        return self.findings()

    def statement(self, s: ast.stmt) -> None:
        value = getattr(s, "value", None)
        if self.on_call is not None:
            for c in walk([s]):
                if isinstance(c, ast.Call):
                    self.on_call(c, self)
        # conversions resolve pending additions (X.to(...), X.sub.to(...), X.half())
        if self.pending and _CONVERT_TEXT.search(self.src.segment(s)):
            for c in walk([s]):
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in CASTS:
                    recv = receiver(c.func.value) or ""
                    self.pending = [p for p in self.pending if not (
                        p[0] == recv or p[0].startswith((recv + ".", recv + "[")) or recv.startswith(p[0] + "."))]
        self._addition(s)
        if isinstance(s, ast.Expr) and isinstance(value, ast.Call):
            recv = cast_event(value)
            if recv is not None:  # model.half(): in place
                self.cast[recv] = Cast(s.lineno, recv)
        if isinstance(s, (ast.Expr, ast.Assign)) and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            self._late_call(value, s)
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            self._assign(s.targets[0], value, s)
        if isinstance(s, ast.Return) and value is not None:
            state = self.state(value, s.lineno)
            if state is not None and self.returned is None:
                self.returned = state

    def _assign(self, target: ast.expr, value: Any, s: ast.stmt) -> None:
        path = receiver(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
        if not path:
            return
        state = self.state(value, s.lineno)
        if state is None and isinstance(value, ast.Call) and any(receiver(a) == path for a in value.args):
            state = self.lookup(path)  # pipe = self.split_units(task, pipe): handed the object, returns it
        self._kill(path)
        if state is not None:
            state = Cast(state.line, state.root or path, state.how)
            self.cast[path] = state
            if path.startswith("self.") and path.count(".") == 1:
                self.stores[path] = state
        elif isinstance(value, ast.Call) and isinstance(target, ast.Name):
            self.results[target.id] = value

    def _late_call(self, c: ast.Call, s: ast.stmt) -> None:
        func = c.func
        assert isinstance(func, ast.Attribute)
        if func.attr.startswith(NEVER_LATE) or func.attr in _SAME_OBJECT or func.attr in CASTS:
            return
        recv = receiver(func.value) or ""
        state = self.lookup(recv)
        if state is None or state.line >= s.lineno and not state.how:
            return
        root = next(p for p in _prefixes(recv) if p in self.cast)
        col = self.src.char_col(func.end_lineno, func.end_col_offset - len(func.attr)) + 1  # type: ignore[arg-type]
        self.after.append((func.attr, func.end_lineno, col, root, state.line, recv, state.how))  # type: ignore[arg-type]

    def _addition(self, s: ast.stmt) -> None:
        """A module or parameter added to a cast object."""
        owner = key = verb = None
        new: list[ast.AST] = []
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            target = s.targets[0]
            if isinstance(target, ast.Attribute):
                owner, key, verb = receiver(target.value), receiver(target), "assigned"
            elif isinstance(target, ast.Subscript):
                owner = receiver(target.value)
                key, verb = (f"{owner}[{self.src.segment(target.slice)}]" if owner else None), "stored"
            new = [s.value]
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            c = s.value
            if isinstance(c.func, ast.Attribute) and c.func.attr in _ADDERS:
                owner = receiver(c.func.value)
                slot = _ADDERS[c.func.attr]
                if slot == "*" and c.args:
                    arg = c.args[0]
                    new = list(arg.elts) if isinstance(arg, (ast.List, ast.Tuple)) else \
                        list(arg.values) if isinstance(arg, ast.Dict) else [arg]  # type: ignore[arg-type]
                elif isinstance(slot, int) and len(c.args) > (slot if slot >= 0 else 0):
                    new = [c.args[slot]]
                else:
                    new = [k.value for k in c.keywords if k.arg in ("module", "param")]
                verb, key = c.func.attr, owner
                if c.func.attr in ("add_module", "register_module", "register_parameter") and c.args and owner:
                    key = f"{owner}.{_name(self.src, c.args[0])}"
            elif isinstance(c.func, ast.Name) and c.func.id == "setattr" and len(c.args) == 3:
                owner = receiver(c.args[0])
                key, verb, new = f"{owner}.{_name(self.src, c.args[1])}" if owner else None, "setattr", [c.args[2]]
        if not owner or not key or not new:
            return
        state = self.lookup(owner)
        if state is None or (state.line >= s.lineno and not state.how):
            return
        if any(self.creates(n) for n in new):
            self.pending.append((key, s, state, verb))  # type: ignore[arg-type]

    def findings(self) -> list[Finding]:
        out = []
        for key, s, state, verb in self.pending:
            owner = state.root
            where = f"line {state.line}" if not state.how else f"line {state.line}, {state.how}"
            if verb in ("assigned", "setattr"):
                what = f"{key} is created after {owner} was cast ({where}) and never converted"
            elif verb == "stored":
                what = f"a new module is stored in {key} after {owner} was cast ({where}) and never converted"
            elif verb in ("add_module", "register_module", "register_parameter"):
                what = f"{key} is added with {verb}() after {owner} was cast ({where}) and never converted"
            else:
                what = f"{key}.{verb}(...) adds a new module after {owner} was cast ({where}) and it is never converted"
            out.append(finding(self.src, s, "GPU011", (
                f"{what}: new modules are float32, so their matmuls with the cast model's activations fail with "
                f"'mat1 and mat2 must have the same dtype'; create it with dtype= or convert it (.to(dtype=..., "
                f"device=...))"),
                Fix(DISPLAY_ONLY, f"convert what is added: .to(dtype=..., device=...) (those of {owner}), or cast "
                                  f"{owner} again once everything is added")))
        return out


def scopes_with(src: PySource, pattern: re.Pattern[str]) -> list[ast.AST]:
    """The module body and the functions whose own text matches `pattern`."""
    out: list[ast.AST] = []
    if pattern.search(src.text):
        out.append(src.tree)
        out += [fn for fn in src.functions if pattern.search(src.scope_text(fn))]
    return out


# --- the project pass: casts that reach a late call through a parameter or a return value -----------

MAX_FILES = 64  # files the project pass reads for GPU011's questions
MAX_DEPTH = 2  # callers of callers


class _Project:
    """Demand-driven questions about the project's functions, each answered once: is this
    parameter given a cast object by some caller, does this function return one."""

    def __init__(self, codes: dict[str, tuple[str, ...]], load: Callable[[str], Any]) -> None:
        from gpudoctor.lint.project import module_name

        self.codes, self.load = codes, load
        self.paths = sorted(p for p, c in codes.items() if "GPU011" in c)
        self.modules: dict[str, str] = {}
        for path in self.paths:
            name = module_name(path)[0]
            if name:
                self.modules.setdefault(name, path)
        self.read = 0
        self._texts: dict[str, bytes] = {}
        self._returns: dict[str, Cast | None] = {}

    def text(self, path: str) -> bytes:
        if path not in self._texts:
            try:
                with open(path, "rb") as fh:
                    self._texts[path] = fh.read()
            except OSError:
                self._texts[path] = b""
        return self._texts[path]

    def source(self, path: str):
        if self.read >= MAX_FILES:
            return None
        self.read += 1
        return self.load(path)

    def returned(self, src: PySource, call: ast.Call) -> Cast | None:
        """What a call of one of the project's top-level functions returns, when it is cast."""
        if not isinstance(call.func, ast.Name):
            return None
        q = src.qualify(call.func.id)
        if not q or q.startswith(("torch.", "transformers.", "diffusers.")):
            return None
        if q not in self._returns:
            self._returns[q] = None
            module, _, name = q.rpartition(".")
            path = self.modules.get(module)
            fsrc = self.source(path) if path else None
            fn = next((f for f in fsrc.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and f.name == name), None) if fsrc is not None else None
            if fn is not None:
                scan = Scan(fsrc, fn, lambda n: False, returns=lambda c, s=fsrc: self.returned(s, c))
                scan.run()
                if scan.returned is not None:
                    self._returns[q] = Cast(scan.returned.line, "", f"returned by {name}() at {path}:{scan.returned.line}")
        found = self._returns[q]
        return Cast(call.lineno, "", found.how) if found is not None else None

    def callers(self, src: PySource, fn: ast.AST, param: str, depth: int = 0) -> list[Cast]:
        """Casts the callers of `fn` pass as `param`: [Cast(caller line, ..., how)]. A method is
        looked for in its own file (self.name(...)); a function in the files that name its
        module (they import it) and its own."""
        name = fn.name  # type: ignore[attr-defined]
        if name.startswith("__"):
            return []
        owner = next((c for c in src.classes if fn in c.body), None)
        module_word = (src.module or "").rsplit(".", 1)[-1].encode()
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]  # type: ignore[attr-defined]
        if owner is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        slot = params.index(param) if param in params else None
        qual = f"{src.module}.{name}" if src.module and owner is None else None
        word = re.compile(rb"\b%s[ \t]*\(" % re.escape(name.encode()))
        found: list[Cast] = []
        for path in self.paths:
            if path != src.path and (owner is not None or not module_word or module_word not in self.text(path)):
                continue
            if not word.search(self.text(path)):
                continue
            csrc = src if path == src.path else self.source(path)
            if csrc is None:
                continue
            for scope in [s for s in [csrc.tree, *csrc.functions]
                          if f"{name}(" in (csrc.text if s is csrc.tree else csrc.scope_text(s))]:
                if scope is fn:
                    continue

                def hook(call: ast.Call, scan: Scan, csrc=csrc, scope=scope) -> None:
                    f = call.func
                    hit = (isinstance(f, ast.Name) and (csrc.qualify(f.id) == qual if qual else False)) or \
                        (owner is not None and csrc is src and isinstance(f, ast.Attribute) and f.attr == name and
                         dotted(f.value) == "self" and any(scope in c.body for c in src.classes if c is owner)) or \
                        (qual is not None and isinstance(f, ast.Attribute) and csrc.qualname(f) == qual)
                    if not hit:
                        return
                    arg = call.args[slot] if slot is not None and slot < len(call.args) else kwarg(call, param)
                    state = scan.state(arg, call.lineno)
                    where = f"{csrc.path}:{call.lineno}"
                    if state is not None:
                        found.append(Cast(state.line, "", f"passed as {param} by {where}, cast at line {state.line}"))
                    elif depth < MAX_DEPTH and isinstance(arg, ast.Name) and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and arg.id in {a.arg for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]}:
                        for up in self.callers(csrc, scope, arg.id, depth + 1):
                            found.append(Cast(up.line, "", f"passed as {param} by {where}, {up.how}"))

                Scan(csrc, scope, lambda n: False, returns=lambda c, s=csrc: self.returned(s, c), on_call=hook).run()
        return found


def late_creators(facts: dict[str, Any]) -> set[str]:
    """Methods that create float32 weights for sure, or through a class or builder the project's
    class table says creates them (gpudoctor.lint.project.weighted)."""
    from gpudoctor.lint.project import weighted

    table: set[str] | None = None
    out = set()
    for f in facts.values():
        for name, created in f.creators.items():
            for _, foreign in created:
                if foreign is not None:
                    table = weighted(facts) if table is None else table
                if foreign is None or foreign in table:  # type: ignore[operator]
                    out.add(name)
                    break
    return out


def resolve(facts: dict[str, Any], codes: dict[str, tuple[str, ...]], load: Callable[[str], Any]) -> list[tuple[str, tuple]]:
    """Calls of the project's late creators (`pipe.dit.enable_x()`) on an object the scope did not
    cast itself: a parameter some caller passes cast, or the result of a project function that
    returns one. Returns (path, after_cast entry) pairs for gpudoctor.lint.project."""
    creators = sorted(late_creators(facts))
    if not creators:
        return []
    project = _Project(codes, load)
    word = re.compile(rb"\.(?:%s)[ \t]*\(" % b"|".join(re.escape(m.encode()) for m in creators))
    wanted = set(creators)
    out: list[tuple[str, tuple]] = []
    for path in project.paths:
        if not word.search(project.text(path)):
            continue
        src = project.source(path)
        if src is None:
            continue
        for scope in [src.tree, *src.functions]:
            text = src.text if scope is src.tree else src.scope_text(scope)
            if not any(f".{m}(" in text for m in wanted):
                continue
            calls: list[tuple[ast.Call, str, dict[str, ast.Call]]] = []

            def hook(call: ast.Call, scan: Scan, calls=calls) -> None:
                f = call.func
                if isinstance(f, ast.Attribute) and f.attr in wanted:
                    recv = receiver(f.value) or ""
                    if recv and scan.lookup(recv) is None:
                        calls.append((call, recv, dict(scan.results)))

            scan = Scan(src, scope, lambda n: False, returns=lambda c, s=src: project.returned(s, c), on_call=hook)
            scan.run()
            out += [(path, entry) for entry in scan.after if entry[0] in wanted]  # cast by a function it called
            params = {a.arg for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]} \
                if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
            for call, recv, results in calls:
                root = re.split(r"[.\[]", recv, 1)[0]
                if root in params and root not in ("self", "cls"):
                    casts = project.callers(src, scope, root)
                elif root in results:
                    got = project.returned(src, results[root])
                    casts = [got] if got is not None else []
                else:
                    casts = []
                func = call.func
                assert isinstance(func, ast.Attribute)
                col = src.char_col(func.end_lineno, func.end_col_offset - len(func.attr)) + 1  # type: ignore[arg-type]
                for cast in casts[:1]:
                    out.append((path, (func.attr, func.end_lineno, col, root, cast.line, recv, cast.how)))
    return out
