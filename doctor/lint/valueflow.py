"""GPU004's value flow across functions and modules: sizes held as tensors, followed wherever the
project's own code carries them.

Inside one function the interpreter (gpudoctor.lint.pyflow) follows the values through names,
tuples, lists and dicts, subscripts and loop variables, reductions and `.item()` / `.tolist()`;
inside one file it also follows attributes of self (stored by one method, read by another) and
what the file's functions return (`Interp.run`'s rounds). Between files the values travel in
their carried form (gpudoctor.lint.pyvalues: a tensor of sizes of rank 0-2, lists and dicts of
those), and this module is the fixpoint over the project's call graph:

- each file's worker records the calls that hand sizes to the project's code (`Facts.size_calls`:
  the callee as this file names it, the slot, the carried value), what its functions return
  (`Facts.size_returns`) and the methods it rebinds (`X.attn.forward = types.MethodType(f, X.attn)`:
  `Facts.rebinds`);
- in the parent, each call is resolved to the functions it may run (through imports, relative
  ones too, the class `__init__` builds an attribute from, the class of the elements of a
  ModuleList it iterates, `super()` and `super(Cls, self)`, and every function rebound in place of
  that attribute's method), and each callee is interpreted again with that parameter seeded: one
  context per (function, parameter, carried value). What the callee computes with it is reported
  at its binding, naming the caller; what it hands on is followed in turn;
- a function that returns sizes is followed into the files that call it by name, interpreted
  again with the call's result seeded.

It is bounded: at most MAX_CONTEXTS contexts and MAX_CALLER_FILES files read for returns, each
file parsed once (the engine's loader caches). Not followed: calls through values the project
cannot name (a callable in a list, a registry, getattr), subclasses in other modules reading an
attribute stored by their base, values stored on objects other than self, and tensors of sizes
that come from outside the project's code (a library's return value).
"""
from __future__ import annotations

import ast
import re
from typing import Any, Callable

from gpudoctor.lint.model import Finding
from gpudoctor.lint.pysource import PySource, dotted
from gpudoctor.lint.pyvalues import Carried, ShapeTensorEvent, describe, materialise
from gpudoctor.lint.shapetables import cpu_only_lines

MAX_CONTEXTS = 400
MAX_CALLER_FILES = 64

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


# --- what a file says (worker side) -------------------------------------------------------------


def class_of(src: PySource) -> dict[int, ast.ClassDef]:
    """id(method node) -> its class."""
    return {id(m): cls for cls in src.classes for m in cls.body if isinstance(m, _FUNCS)}


def call_target(src: PySource, call: ast.Call, fn: ast.AST | None, classes: dict[int, ast.ClassDef]) -> tuple[str, ...] | None:
    """What a call refers to, in absolute names the project pass can look up: ("func", name),
    ("method", class, name) for self.name(...), ("attr", class, name) for self.name(...) where
    name is a submodule, ("elem", class, name) for a loop variable over self.name (a ModuleList),
    ("super", class, name); None when this file cannot tell."""
    func = call.func
    cls = classes.get(id(fn)) if fn is not None else None
    cls_name = f"{src.module}.{cls.name}" if cls is not None and src.module else None
    # a module-level function whose first parameter is self: a method bound elsewhere with
    # types.MethodType; its self is the object the project pass finds it bound to
    bound = f"{src.module}.{fn.name}" if cls is None and isinstance(fn, _FUNCS) and src.module and \
        fn.args.args and fn.args.args[0].arg == "self" and fn in src.tree.body else None  # type: ignore[union-attr]
    if isinstance(func, ast.Name):
        q = src.qualify(func.id)
        if q:
            return ("func", q)
        loop = _loop_over_self(fn, func.id) if cls_name or bound else None
        if loop:
            return ("elem", cls_name, loop) if cls_name else ("boundelem", bound, loop)  # type: ignore[return-value]
        return None
    if not isinstance(func, ast.Attribute):
        return None
    base = func.value
    if isinstance(base, ast.Name) and base.id == "self" and cls_name:
        own = any(isinstance(m, _FUNCS) and m.name == func.attr for m in cls.body)  # type: ignore[union-attr]
        return ("method" if own else "attr", cls_name, func.attr)
    if isinstance(base, ast.Name) and base.id == "self" and bound:
        return ("boundattr", bound, func.attr)
    if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
        if len(base.args) == 2 and isinstance(base.args[0], ast.Name):
            named = src.qualify(base.args[0].id)  # super(Cls, self): written where Cls is known
            return ("super", named, func.attr) if named else None
        return ("super", cls_name, func.attr) if cls_name else None
    if isinstance(base, ast.Name):
        q = src.qualify(base.id)
        if q and not q.rsplit(".", 1)[-1][:1].isupper():
            return ("func", f"{q}.{func.attr}")  # module.function
    return None


def _loop_over_self(fn: ast.AST | None, name: str) -> str | None:
    """`for block in self.blocks:` (or `enumerate(self.blocks)`) in `fn`: "blocks"."""
    if fn is None:
        return None
    found = None
    for node in ast.walk(fn):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        it, target = node.iter, node.target
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and it.args and \
                isinstance(target, ast.Tuple) and len(target.elts) == 2:
            it, target = it.args[0], target.elts[1]
        key = dotted(it) or ""
        if isinstance(target, ast.Name) and target.id == name and key.startswith("self.") and key.count(".") == 1:
            if found not in (None, key[5:]):
                return None
            found = key[5:]
    return found


def class_info(src: PySource, name: str) -> tuple[tuple[str, ...], dict[str, ast.AST], dict[str, str], dict[str, str]] | None:
    """A top-level class of this file: its bases (absolute names), its methods, the classes its
    __init__ assigns to attributes (self.attn = Attention(...)), and the classes of the elements
    of the ModuleLists it assigns (self.blocks = nn.ModuleList([Block(...) for _ in ...]))."""
    cls = next((c for c in src.tree.body if isinstance(c, ast.ClassDef) and c.name == name), None)
    if cls is None:
        return None
    bases = []
    for b in cls.bases:
        root = dotted(b) or ""
        head, _, rest = root.partition(".")
        q = src.qualify(head) if head else None
        if q:
            bases.append(f"{q}.{rest}" if rest else q)
    methods = {m.name: m for m in cls.body if isinstance(m, _FUNCS)}
    ctors: dict[str, str] = {}
    elems: dict[str, str] = {}
    init = methods.get("__init__")
    if init is not None:
        for st in src.scope_statements(init):
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call)):
                continue
            key = dotted(st.targets[0]) or ""
            if not (key.startswith("self.") and key.count(".") == 1):
                continue
            func = st.value.func
            if isinstance(func, ast.Name) and src.qualify(func.id):
                ctors[key[5:]] = src.qualify(func.id)  # type: ignore[assignment]
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id[:1].isupper() and func.attr.startswith(("from_", "load")) and src.qualify(func.value.id):
                ctors[key[5:]] = src.qualify(func.value.id)  # type: ignore[assignment]  # Model.from_pretrained(...)
            elif (dotted(func) or "").endswith(("ModuleList", "Sequential")) and st.value.args:
                made = {src.qualify(n.func.id) for n in ast.walk(st.value.args[0])
                        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id[:1].isupper()}
                if len(made) == 1 and None not in made:
                    elems[key[5:]] = made.pop()  # type: ignore[assignment]
    return tuple(bases), methods, ctors, elems


def function_node(src: PySource, name: str) -> ast.AST | None:
    return next((f for f in src.tree.body if isinstance(f, _FUNCS) and f.name == name), None)


_METHOD_TYPE = re.compile(r"MethodType\(")


def rebinds(src: PySource) -> list[tuple[str, str, str, str | None]]:
    """Methods the file replaces on objects: `block.attn.forward = types.MethodType(f, block.attn)`
    gives ("attn", "forward", f's absolute name, None): a call of that attribute may run f; for
    `self.model.forward = ...` in a method, the last item is that method's class (the class of
    self.model is then the one its __init__ builds)."""
    out: list[tuple[str, str, str, str | None]] = []
    if not _METHOD_TYPE.search(src.text):
        return out
    owners = class_of(src)
    for node, scope in src.nodes_on_lines(src.lines_matching(_METHOD_TYPE), (ast.Assign,)):
        assert isinstance(node, ast.Assign)
        value = node.value
        if not (isinstance(value, ast.Call) and (dotted(value.func) or "").endswith("MethodType") and value.args and
                isinstance(value.args[0], ast.Name)):
            continue
        fn = src.qualify_anywhere(value.args[0].id)
        cls = owners.get(id(scope))
        for target in node.targets:
            if isinstance(target, ast.Attribute):
                owner = target.value
                attr = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else None
                on_self = isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"
                if attr and fn:
                    out.append((attr, target.attr, fn, f"{src.module}.{cls.name}" if on_self and cls and src.module
                                else None))
    return out


def record(src: PySource, interp: Any, facts: Any, short: Callable[[ast.AST], str]) -> set[int]:
    """The worker's facts for the project pass: sizes handed to calls of the project's code,
    sizes the file's functions return, the methods it rebinds. Returns the ids of the argument
    nodes whose callee the project pass may follow (their caller-side findings wait for it)."""
    classes = class_of(src)
    targets: dict[tuple[int, int | str], Any] = {}
    for c in interp.calls:
        if c.seed is None and (id(c.value), c.slot) not in targets:
            target = call_target(src, c.call, c.fn, classes)
            targets[(id(c.value), c.slot)] = target
            if target is not None:
                facts.size_calls.append((target, c.slot, c.carried, c.shown or short(c.value), c.value.lineno,
                                         id(c.value)))
    if src.module:
        for key, carried in interp.returns.items():
            if carried[0] != "u":  # a tuple of a size tensor and other values: followed in the file only
                facts.size_returns[f"{src.module}.{key}"] = carried
        if facts.size_calls:
            for node in src.tree.body:
                if isinstance(node, ast.ClassDef):
                    info = class_info(src, node.name)
                    if info is not None:
                        bases, methods, ctors, elems = info
                        facts.vf_classes[f"{src.module}.{node.name}"] = (bases, frozenset(methods), ctors, elems)
            facts.vf_defs = (src.module, frozenset(n.name for n in src.tree.body if isinstance(n, _FUNCS)))
    facts.rebinds = rebinds(src)
    return {k for (k, _), t in targets.items() if t is not None}


def whatif(src: PySource, fn: ast.AST, param: str, carried: Carried, origin: str):
    """Interpret one function (and the methods of its class that read what it stores on self) as
    if `param` held `carried`, handed over by a caller described by `origin`: the GPU004 findings
    that follow (at each binding) and the calls that hand it on: [(target, slot, carried, value
    text, line, function)]."""
    from gpudoctor.lint.pyflow import Interp
    from gpudoctor.lint.pyrules import _one_per_group
    from gpudoctor.lint.pysource import short as _short
    from gpudoctor.lint.rules.gpu004_shape_tensor_arithmetic import tensor_finding as _shape_tensor_finding

    interp = Interp(src)
    interp.fn_seeds[id(fn)] = {param: materialise(carried, param, None)}
    interp.run(lambda f: f is fn)
    findings = [_shape_tensor_finding(src, ev, origin) for ev in _one_per_group(interp.events, src)
                if isinstance(ev, ShapeTensorEvent) and ev.seed == param]
    classes = class_of(src)
    onward = []
    for c in interp.calls:
        if c.seed == param:
            target = call_target(src, c.call, c.fn, classes)
            if target is not None:
                onward.append((target, c.slot, c.carried, c.shown or _short(src, c.value, 40), c.value.lineno, c.fn))
    return findings, onward


def returned_into(src: PySource, seeds: dict[str, Carried], names: set[str], origins: dict[str, str]) -> list[Finding]:
    """A caller file interpreted again with what the project's functions return seeded at their
    calls: the findings that follow from those values alone."""
    from gpudoctor.lint.pyflow import Interp
    from gpudoctor.lint.pyrules import _one_per_group
    from gpudoctor.lint.rules.gpu004_shape_tensor_arithmetic import tensor_finding as _shape_tensor_finding

    interp = Interp(src)
    interp.return_seeds = dict(seeds)
    words = tuple(n + "(" for n in names)
    interp.run(lambda f: any(w in src.scope_text(f) for w in words))
    out = []
    for ev in _one_per_group(interp.events, src):
        if isinstance(ev, ShapeTensorEvent) and ev.seed and ev.seed.startswith("return:"):
            out.append(_shape_tensor_finding(src, ev, origins.get(ev.seed[7:], "a project function's return value")))
    return out


# --- the project (parent side) -------------------------------------------------------------------


class Project:
    """The linted modules, parsed on demand, and the lookups of call targets among them."""

    def __init__(self, modules: dict[str, str], codes: dict[str, tuple[str, ...]], load: Callable[[str], Any],
                 rebinds: Callable[[], list[tuple[str, str, str, str | None]]], facts: dict[str, Any] | None = None):
        self.modules, self.codes, self.load = modules, codes, load
        # what the workers said about the files that hand sizes on (their classes and defs):
        # enough to find that a call has no target in the project without parsing the file
        self.known: dict[str, tuple] = {}
        self.defs: dict[str, frozenset[str]] = {}
        for f in (facts or {}).values():
            self.known.update(getattr(f, "vf_classes", {}) or {})
            if getattr(f, "vf_defs", None):
                self.defs[f.vf_defs[0]] = f.vf_defs[1]
        self._rebinds = rebinds  # read on the first call that a rebound method could answer
        self._rebound: dict[tuple[str, str], list[str]] | None = None
        self._bound_to: dict[str, list[tuple[str, str]]] = {}

    @property
    def rebound(self) -> dict[tuple[str, str], list[str]]:
        """(attribute, method) -> the functions bound there with types.MethodType."""
        if self._rebound is None:
            self._rebound = {}
            for attr, method, fn, owner in self._rebinds():
                self._rebound.setdefault((attr, method), []).append(fn)
                if owner is not None:
                    self._bound_to.setdefault(fn, []).append((owner, attr))
        return self._rebound

    @property
    def bound_to(self) -> dict[str, list[tuple[str, str]]]:
        """function -> (class, attribute) of the objects it is bound to as a method."""
        _ = self.rebound
        return self._bound_to

    def source(self, module: str):
        path = self.modules.get(module)
        if path is None or "GPU004" not in self.codes.get(path, ()):
            return None
        return self.load(path)

    def split(self, qual: str) -> tuple[Any, list[str]] | None:
        parts = qual.split(".")
        for i in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:i])
            if module in self.modules:
                src = self.source(module)
                return (src, parts[i:]) if src is not None else None
        return None

    def class_info(self, qual: str):
        found = self.split(qual)
        if found is None or len(found[1]) != 1:
            return None
        info = class_info(found[0], found[1][0])
        return (found[0], info) if info is not None else None

    def light(self, cls: str) -> tuple | None:
        """(bases, method names, submodule classes, element classes) of a class: from the workers'
        facts when they have it, else from its parsed module."""
        if cls in self.known:
            return self.known[cls]
        if cls.rpartition(".")[0] in self.defs:
            return None  # a module whose worker listed its top-level classes: not one of them
        found = self.class_info(cls)
        if found is None:
            return None
        bases, methods, ctors, elems = found[1]
        return bases, frozenset(methods), ctors, elems

    def defines_method(self, cls: str, name: str, skip_own: bool = False, depth: int = 0) -> bool:
        info = self.light(cls) if depth < 8 else None
        if info is None:
            return False
        return (not skip_own and name in info[1]) or any(self.defines_method(b, name, False, depth + 1) for b in info[0])

    def method(self, cls: str, name: str, skip_own: bool = False, depth: int = 0):
        """(source, function node) of `name` looked up from class `cls` through its bases."""
        if depth == 0 and not self.defines_method(cls, name, skip_own):
            return None  # known without parsing anything: no such method in the project
        found = self.class_info(cls) if depth < 8 else None
        if found is None:
            return None
        src, (bases, methods, _, _) = found
        if not skip_own and name in methods:
            return src, methods[name]
        for base in bases:
            hit = self.method(base, name, False, depth + 1)
            if hit is not None:
                return hit
        return None

    def attribute_class(self, cls: str, attr: str, elements: bool = False, depth: int = 0) -> str | None:
        found = self.light(cls) if depth < 8 else None
        if found is None:
            return None
        bases, _, ctors, elems = found
        table = elems if elements else ctors
        if attr in table:
            return table[attr]
        return next((c for c in (self.attribute_class(b, attr, elements, depth + 1) for b in bases) if c), None)

    def function(self, qual: str):
        module, _, name = qual.rpartition(".")
        if module in self.defs and name not in self.defs[module]:
            return None  # the module's worker listed its defs: not one of them
        found = self.split(qual)
        if found is None or len(found[1]) != 1:
            return None
        fn = function_node(found[0], found[1][0])
        return (found[0], fn) if fn is not None else None

    def targets(self, target: tuple[str, ...]) -> list[tuple[Any, ast.AST, int]]:
        """Every (source, function node, leading parameters the call does not pass) the call may
        run: the method its class defines and the functions rebound in its place."""
        kind = target[0]
        if kind == "func":
            hit = self.function(target[1])
            return [(hit[0], hit[1], 0)] if hit is not None else []
        out = []
        attr = None
        if kind in ("boundelem", "boundattr"):
            # self is the object the function is bound to: its class, from the binding's owner
            for owner, owner_attr in self.bound_to.get(target[1], []):  # type: ignore[misc]
                cls = self.attribute_class(owner, owner_attr)
                if cls:
                    out += self.targets(("elem" if kind == "boundelem" else "attr", cls, target[2]))
            return out
        if kind == "method":
            hit = self.method(target[1], target[2])
        elif kind == "super":
            hit = self.method(target[1], target[2], skip_own=True)
        elif kind in ("attr", "elem"):
            cls = self.attribute_class(target[1], target[2], elements=(kind == "elem"))
            hit = self.method(cls, "forward") if cls else None
            attr = target[2] if kind == "attr" else None
        else:
            return []
        if hit is not None:
            out.append((hit[0], hit[1], 0 if _static(hit[1]) else 1))  # a staticmethod has no self
        for fn_qual in self.rebound.get((attr, "forward"), []) if attr else []:
            other = self.function(fn_qual)
            if other is not None:
                out.append((other[0], other[1], 1))  # bound with types.MethodType: self is the object
        return out


def _static(fn: ast.AST) -> bool:
    return any((dotted(d) or "").endswith("staticmethod") for d in getattr(fn, "decorator_list", ()))


def _parameter(fn: Any, slot: int | str, skip: int) -> str | None:
    args = [*fn.args.posonlyargs, *fn.args.args]
    if isinstance(slot, int):
        i = slot + skip
        return args[i].arg if i < len(args) else None
    names = {a.arg for a in args[skip:]} | {a.arg for a in fn.args.kwonlyargs}
    return slot if slot in names else None


def resolve(facts: dict[str, Any], codes: dict[str, tuple[str, ...]], modules: dict[str, str],
            load: Callable[[str], Any]) -> list[Finding]:
    """GPU004's cross-function findings over the project: the fixpoint over calls (arguments),
    then the functions that return sizes into the files that call them."""
    todo = []
    for path in sorted(facts):
        if "GPU004" in codes.get(path, ()):
            for target, slot, carried, text, line, key in facts[path].size_calls:
                todo.append((target, slot, carried, f"`{text}`, {describe(carried)}, at {path}:{line}", (path, key)))
    project = Project(modules, codes, load, lambda: [r for _, found in sorted(_all_rebinds(facts, codes, load).items())
                                                      for r in found], facts)
    out: list[Finding] = []
    followed: set[tuple[str, int]] = set()
    seen: set[tuple[str, int, str, Carried]] = set()
    contexts = 0
    while todo and contexts < MAX_CONTEXTS:
        target, slot, carried, origin, key = todo.pop(0)
        for src, fn, skip in project.targets(target):
            param = _parameter(fn, slot, skip)
            if param is None:
                continue
            if key is not None:
                followed.add(key)
            mark = (src.path, fn.lineno, param, carried)
            if mark in seen:
                continue
            seen.add(mark)
            contexts += 1
            findings, onward = whatif(src, fn, param, carried, origin)
            out += findings
            cpu = cpu_only_lines(fn) if onward else set()
            for t, sl, c, text, line, where in onward:
                if line in cpu:
                    continue  # the CPU reference path (`else:` of `if value.is_cuda:`): no kernel, no sync
                name = getattr(where, "name", "?")
                todo.append((t, sl, c, f"`{text}` handed on by {name}() at {src.path}:{line}, which is {origin}", None))
    out += _returns(facts, codes, modules, load)
    for path, f in facts.items():
        for key, finding in f.size_fallbacks.items():
            if (path, key) not in followed:
                out.append(finding)
    return out


def _all_rebinds(facts: dict[str, Any], codes: dict[str, tuple[str, ...]],
                 load: Callable[[str], Any]) -> dict[str, list[tuple[str, str, str, str | None]]]:
    """The methods every linted Python file rebinds: its worker's facts, or for a file GPU004 did
    not parse (a pipeline that only wires the model up), read here when its text names MethodType."""
    out = {path: f.rebinds for path, f in facts.items() if f.rebinds}
    for path in sorted(codes):
        if path in out or "GPU004" not in codes[path]:
            continue
        try:
            from gpudoctor.lint.engine import read_bounded

            data = read_bounded(path)
            if b"MethodType" not in data or _FORWARD_REBOUND.search(data) is None:
                continue
        except OSError:
            continue
        src = load(path)
        if src is not None:
            out[path] = rebinds(src)
    return out


_FORWARD_REBOUND = re.compile(rb"\.forward[ \t]*=[ \t]*(?:types\.)?MethodType\(")


def _returns(facts: dict[str, Any], codes: dict[str, tuple[str, ...]], modules: dict[str, str],
             load: Callable[[str], Any]) -> list[Finding]:
    """Functions that return sizes, followed into the other files that call them by name."""
    returned = {q: c for f in facts.values() for q, c in f.size_returns.items()}
    if not returned:
        return []
    by_name: dict[str, list[str]] = {}
    for q in returned:
        by_name.setdefault(q.rsplit(".", 1)[-1], []).append(q)
    pattern = re.compile(rb"\b(?:%s)[ \t]*\(" % b"|".join(re.escape(n.encode()) for n in sorted(by_name)))
    paths = {p for p in modules.values()}
    out: list[Finding] = []
    read = 0
    for path in sorted(paths):
        if "GPU004" not in codes.get(path, ()) or read >= MAX_CALLER_FILES:
            continue
        try:
            from gpudoctor.lint.engine import read_bounded

            if pattern.search(read_bounded(path)) is None:
                continue
        except OSError:
            continue
        src = load(path)
        if src is None:
            continue
        read += 1
        seeds = {}
        origins = {}
        for name, quals in by_name.items():
            for q in quals:
                module = q.rsplit(".", 1)[0]
                if src.module and q.startswith(src.module + "."):
                    continue  # the file's own functions: its worker followed them
                seeds[q] = returned[q]
                where = modules.get(module) or modules.get(module.rsplit(".", 1)[0], "?")
                origins[q] = f"what {q.rsplit('.', 1)[-1]}() returns, {describe(returned[q])} ({where})"
        if seeds:
            out += returned_into(src, seeds, {q.rsplit(".", 1)[-1] for q in seeds}, origins)
    return out
