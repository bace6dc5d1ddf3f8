"""GPU012, a transposed or permuted view handed to a kernel that checks its layout.

A kernel that asserts that its input is contiguous refuses a strided view at the call that hands
it one: `assert x.is_contiguous()` in a Triton launcher (a Python function of the project), or
TORCH_CHECK(x.is_contiguous()) / CHECK_INPUT(x) in a C++ extension function bound for Python. The
finding is at that call's argument, and its fix makes the argument dense there:
`kernel(v.contiguous())`.

Which arguments are strided views (a local value flow, narrow on purpose):
  - made at the call: x.transpose(i, j), x.permute(...), x.t(), x.T, x.mT, x.mH, x.H,
    x.movedim(...), x.moveaxis(...), x.swapaxes(...), x.swapdims(...), x.adjoint() and the
    torch.<same>(x, ...) functions (not an identity: transpose(1, 1), permute(0, 1, 2));
  - kept through methods that keep strides (.to(...), .float(), .half(), .bfloat16(), .double(),
    .detach(), .clone(), .cuda(), .cpu(), .requires_grad_(), .type(...)); .contiguous(), a
    memory_format= and anything else end it;
  - a name whose definition reaching the call in straight-line code is one of those
    (`v = v.transpose(1, 2)` and then `kernel(q, k, v)`, `q, k, v = q.t(), k.t(), v.t()`); a name
    assigned in a branch, a loop or a `with` on the way, a parameter, an unpacked iterable are
    not known, so they are never reported.
Which calls check (the callee):
  - a module-level function of the project that asserts the parameter's contiguity at the top
    level of its body before rebinding it: `assert x.is_contiguous()` (or a conjunct of the
    assertion, or `all(t.is_contiguous() for t in (q, k, v))`), `if not x.is_contiguous(): raise`;
  - a binding of a C++ extension function that checks the parameter, as GPU009 reads it
    (gpudoctor.lint.cpprules: TORCH_CHECK(x.is_contiguous()), a macro or helper whose body does);
  - a module-level function that hands a parameter on unchanged to a position one of those checks
    (a wrapper), up to `_MAX_WRAPPERS` deep.
Calls are resolved as GPU009's Python callers are (gpudoctor.lint.pycallers): by name in the
module, imported from a project module, `module.f(...)`, an extension module's `_C.f(...)`.
Methods, `autograd.Function.apply` and functions held in variables are not followed.

Per file (in the worker): `checking_functions(src)`, the functions of a file that mentions
`is_contiguous` which check a parameter. The project step (`resolve`, from gpudoctor.lint.engine's
cross-file step) starts from those and from the checking bindings, and reads only the files that
call them (and, for wrappers, the files that call the wrappers): nothing else is parsed.
Standard library only (`ast`).
"""
from __future__ import annotations

import ast
import bisect
import re
import warnings
from typing import Callable

from gpudoctor.lint import pycallers as pc
from gpudoctor.lint.model import UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.pysource import PySource, finding

_VIEWS = {"transpose", "permute", "t", "movedim", "moveaxis", "swapaxes", "swapdims", "adjoint"}
_VIEW_ATTRS = {"T", "mT", "mH", "H"}
_KEEPS = {"to", "float", "half", "bfloat16", "double", "detach", "clone", "cuda", "cpu", "requires_grad_", "type"}
_MAX_WRAPPERS = 3
_MAX_NAMES = 8  # names followed back through assignments, per argument


# --- strided views ------------------------------------------------------------------------------


def _identity(call: ast.Call, name: str) -> bool:
    """transpose(1, 1), permute(0, 1, 2): a view in the same order."""
    args = [pc_int(a) for a in call.args]
    if name in ("transpose", "swapaxes", "swapdims", "movedim", "moveaxis") and len(args) >= 2:
        return args[-2] is not None and args[-2] == args[-1]
    if name == "permute" and args and all(a is not None for a in args):
        dims = args if len(args) > 1 or not isinstance(call.args[0], (ast.Tuple, ast.List)) else \
            [pc_int(e) for e in call.args[0].elts]  # type: ignore[attr-defined]
        return dims == list(range(len(dims)))
    return False


def pc_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int):
        return -node.operand.value
    return None


def view_of(e: ast.AST) -> ast.AST | None:
    """The layout operation that makes expression `e` a strided view (itself, or the view a chain
    of stride-keeping methods starts from), or None."""
    for _ in range(16):
        if isinstance(e, ast.Attribute) and e.attr in _VIEW_ATTRS and isinstance(e.ctx, ast.Load):
            return e
        if not isinstance(e, ast.Call) or not isinstance(e.func, ast.Attribute):
            return None
        name = e.func.attr
        if name in _VIEWS:
            return None if _identity(e, name) else e
        if name not in _KEEPS or any(k.arg == "memory_format" for k in e.keywords):
            return None
        e = e.func.value
    return None


def _binds(st: ast.AST, name: str) -> bool:
    """Whether statement `st` (re)binds `name` in its own scope."""
    stack = [st]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
            if node is not st:
                continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and \
                any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _contains(root: ast.AST, node: ast.AST) -> bool:
    if not (getattr(root, "lineno", 0) <= getattr(node, "lineno", 0) <= (getattr(root, "end_lineno", 0) or 0)):
        return False
    return any(n is node for n in ast.walk(root))


def _chain(body: list[ast.stmt], node: ast.AST, owner: ast.AST | None = None) -> list | None:
    """[(statement list, index, the compound statement owning the list)], outermost first, down to
    the statement that holds `node`; None when `body` does not hold it."""
    for i, st in enumerate(body):
        if not _contains(st, node):
            continue
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None  # another scope
        lists = [getattr(st, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(st, f, None), list)]
        lists += [h.body for h in getattr(st, "handlers", ()) or ()]
        lists += [c.body for c in getattr(st, "cases", ()) or ()]
        for inner in lists:
            if inner and isinstance(inner[0], ast.stmt):
                sub = _chain(inner, node, st)
                if sub is not None:
                    return [(body, i, owner), *sub]
        return [(body, i, owner)]
    return None


def _reaching(name: str, node: ast.AST, body: list[ast.stmt]) -> ast.expr | None:
    """The value assigned to `name` that reaches `node` in straight-line code, or None when it is
    not known (no assignment, a parameter, one inside a branch or a loop on the way)."""
    chain = _chain(body, node)
    if not chain:
        return None
    holder = chain[-1][0][chain[-1][1]]
    for inner in ast.walk(holder):  # a comprehension or lambda around the call that binds the name
        if isinstance(inner, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and \
                _contains(inner, node):
            targets = [g.target for g in getattr(inner, "generators", ())]
            bound = {a.arg for a in inner.args.args} if isinstance(inner, ast.Lambda) else \
                {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if name in bound:
                return None
    for stmts, index, owner in reversed(chain):
        if isinstance(owner, (ast.For, ast.AsyncFor, ast.While)) and any(_binds(s, name) for s in owner.body):
            return None  # a value from the previous iteration may reach the call
        for prev in reversed(stmts[:index]):
            if not _binds(prev, name):
                continue
            return _assigned(prev, name)
        if owner is not None and not isinstance(owner, ast.If) and _header_binds(owner, name):
            return None  # for x in ..., with ... as x, except ... as x
    return None


def _header_binds(owner: ast.AST, name: str) -> bool:
    heads = [getattr(owner, "target", None)] + [i.optional_vars for i in getattr(owner, "items", ()) or ()]
    return any(isinstance(n, ast.Name) and n.id == name for h in heads if h is not None for n in ast.walk(h))


def _assigned(st: ast.stmt, name: str) -> ast.expr | None:
    """The value `st` assigns to `name`: `name = value`, `name: T = value`, or one element of
    `a, name = x, value`; None for any other binding."""
    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
        return st.value
    if not isinstance(st, ast.Assign) or len(st.targets) != 1:
        return None
    target, value = st.targets[0], st.value
    if isinstance(target, ast.Name):
        return value
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and \
            len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
        for t, v in zip(target.elts, value.elts):
            if isinstance(t, ast.Name) and t.id == name:
                return v
    return None


def _body_of(scope: ast.AST) -> list[ast.stmt] | None:
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        return scope.body
    return None  # a lambda: only a view made at the call


def strided(e: ast.AST, scope: ast.AST, depth: int = 0) -> ast.AST | None:
    """The view operation that makes argument `e` (in `scope`: a function or the module) a strided
    view, or None when it is not known to be one."""
    view = view_of(e)
    if view is not None:
        return view
    base = e
    while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr in _KEEPS and \
            not any(k.arg == "memory_format" for k in base.keywords):
        base = base.func.value
    if not isinstance(base, ast.Name) or depth >= _MAX_NAMES:
        return None
    body = _body_of(scope)
    if body is None:
        return None
    value = _reaching(base.id, base, body)
    return strided(value, scope, depth + 1) if value is not None else None


# --- which functions check ------------------------------------------------------------------------


class Check:
    """A parameter that a callee checks for contiguity: its position (None when keyword-only),
    its name, and how (`why`, for the message; `where`, path and line)."""

    __slots__ = ("position", "name", "why", "where")

    def __init__(self, position: int | None, name: str, why: str, where: tuple[str, int]) -> None:
        self.position, self.name, self.why, self.where = position, name, why, where


def _params(fn: ast.AST) -> tuple[list[str], list[str]]:
    a = fn.args  # type: ignore[attr-defined]
    return [p.arg for p in a.posonlyargs + a.args], [p.arg for p in a.kwonlyargs]


def _contig_test(e: ast.AST) -> list[str]:
    """The names `e` asserts contiguous: x.is_contiguous(), all(t.is_contiguous() for t in (a, b))."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "is_contiguous" and \
            isinstance(e.func.value, ast.Name) and not e.args and \
            all(k.arg == "memory_format" and getattr(k.value, "attr", "") == "contiguous_format" for k in e.keywords):
        return [e.func.value.id]
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "all" and len(e.args) == 1 and \
            isinstance(e.args[0], (ast.GeneratorExp, ast.ListComp)) and len(e.args[0].generators) == 1:
        gen = e.args[0]
        g = gen.generators[0]
        if isinstance(g.target, ast.Name) and not g.ifs and isinstance(g.iter, (ast.Tuple, ast.List)) and \
                _contig_test(gen.elt) == [g.target.id]:
            return [n.id for n in g.iter.elts if isinstance(n, ast.Name)]
    return []


def _parts(e: ast.AST, op: type) -> list[ast.AST]:
    return list(e.values) if isinstance(e, ast.BoolOp) and isinstance(e.op, op) else [e]


def _raises(body: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Raise) for s in body)


def direct_checks(fn: ast.AST, shown: str) -> list[Check]:
    """The parameters a function asserts contiguous at the top level of its body, before it
    rebinds them (`shown`: the path as a finding names it)."""
    positional, keyword_only = _params(fn)
    body = list(fn.body)  # type: ignore[attr-defined]
    out: list[Check] = []
    seen: set[str] = set()
    for k, st in enumerate(body):
        if not isinstance(st, (ast.Assert, ast.If)):
            continue
        names: list[str] = []
        if isinstance(st, ast.Assert):
            names = [n for part in _parts(st.test, ast.And) for n in _contig_test(part)]
        elif isinstance(st, ast.If) and _raises(st.body):
            for part in _parts(st.test, ast.Or):
                if isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
                    names += [n for inner in _parts(part.operand, ast.And) for n in _contig_test(inner)]
        for n in names:
            if n in seen or (n not in positional and n not in keyword_only):
                continue
            seen.add(n)
            if any(_binds(prev, n) for prev in body[:k]):
                continue  # rebound before the check: the check is not about what the caller passed
            position = positional.index(n) if n in positional else None
            how = "asserts" if isinstance(st, ast.Assert) else "raises unless"
            out.append(Check(position, n, f"{how} `{n}.is_contiguous()` ({shown}:{st.lineno})", (shown, st.lineno)))
    return out


_TOP_LEVEL = re.compile(r"^(?:(?:async[ \t]+)?def[ \t]|class[ \t]|@)", re.M)


def checking_functions_in_text(text: str, path: str) -> tuple[str, ...] | None:
    """`checking_functions` for a file nothing else needs parsed, from a first look: only the
    module-level functions whose text has `is_contiguous` are parsed, each from its `def` at
    column 0 to the next column-0 `def`, `class` or decorator. None when a piece does not parse
    (a column-0 `def` inside a string, say): the caller parses the whole file. A name found here
    that the whole file would not give costs nothing (the cross-file step reads the function
    again from the whole file before it trusts it); a function it would give is found here or the
    piece fails to parse."""
    if "is_contiguous" not in text:
        return ()
    starts = [m.start() for m in _TOP_LEVEL.finditer(text)] + [len(text)]
    found: set[str] = set()
    at = text.find("is_contiguous")
    while at >= 0:
        i = bisect.bisect_right(starts, at) - 1
        if i < 0:
            at = text.find("is_contiguous", starts[0])
            continue
        piece = text[starts[i]:starts[i + 1]]
        if piece.startswith(("def", "async")):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(piece, filename=path)
            except (SyntaxError, ValueError):
                return None
            found.update(st.name for st in tree.body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and direct_checks(st, ""))
        at = text.find("is_contiguous", starts[i + 1])
    return tuple(sorted(found))


def checking_functions(src: PySource) -> tuple[str, ...]:
    """The module-level functions of a file that check a parameter's contiguity (the worker's
    side: the project step starts from these)."""
    return tuple(sorted(st.name for st in src.tree.body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and "is_contiguous" in src.scope_text(st) and direct_checks(st, "")))


class _Callee:
    """A function or binding that checks, by the name calls spell it: the module-level function
    (`owner`, `fn`) or None for a binding, and the parameters it checks."""

    __slots__ = ("owner", "fn", "checks")

    def __init__(self, owner: pc._Module | None, fn: ast.AST | None, checks: list[Check]) -> None:
        self.owner, self.fn, self.checks = owner, fn, checks

    def called_by(self, site: pc._Site, project: pc._Project) -> bool:
        if self.fn is None:
            return pc._is_binding_call(site, project)
        return pc._is_call_of_function(site, self.fn, self.owner, project)


def resolve(checkers: dict[str, tuple[str, ...]], load: Callable[[str], PySource | None],
            calling: Callable[[set[str]], list], bindings: dict[str, list[Check]],
            shown: Callable[[str], str]) -> list[Finding]:
    """GPU012's findings. `checkers`: path -> the checking functions a worker found there;
    `load(path)`: its PySource; `calling(names)`: the project's PySources that call one of these
    names; `bindings`: Python name of a binding -> the parameters its C++ function checks;
    `shown(path)`: a path as a message names it. From the callees to their callers: a call that
    passes a strided view at a checked place is a finding; one that passes a parameter of the
    module-level function it sits in, unchanged, makes that function a callee too (a wrapper),
    whose callers are read next, up to `_MAX_WRAPPERS` deep."""
    project = pc._Project()

    def module(src: PySource) -> pc._Module:
        pc._add_module(project, src)
        return next(m for m in project.modules if m.src.path == src.path)

    callees: dict[str, list[_Callee]] = {}
    for path, names in sorted(checkers.items()):
        src = load(path)
        if src is None:
            continue
        m = module(src)
        for name in names:
            fn = m.functions.get(name)
            checks = direct_checks(fn, shown(path)) if fn is not None else []
            if checks:
                callees.setdefault(name, []).append(_Callee(m, fn, checks))
    for name, checks in bindings.items():
        callees.setdefault(name, []).append(_Callee(None, None, checks))
    out: list[Finding] = []
    done: set[tuple[str, int, int, str]] = set()
    frontier, asked = set(callees), set()
    for depth in range(_MAX_WRAPPERS + 1):
        if not frontier:
            break
        for src in calling(frontier - asked):
            module(src)
        asked |= frontier
        wrappers: set[str] = set()
        for m in list(project.modules):
            for name, site in pc._calls(m, frontier):
                key = (m.src.path, site.call.lineno, site.call.col_offset, name)
                if key in done:
                    continue
                done.add(key)
                callee = next((c for c in callees.get(name, ()) if c.called_by(site, project)), None)
                if callee is None:
                    continue
                for check in callee.checks:
                    arg = pc._passed(site.call, check.position if check.position is not None else -1, check.name)
                    if arg is None or arg is pc._STARRED:
                        continue
                    view = strided(arg, site.scope)
                    if view is not None:
                        out.append(_finding(m.src, arg, view, f"{name}()", check))
                        continue
                    param = m.param_of(arg, site.scope) if depth < _MAX_WRAPPERS else None
                    if param is not None:
                        fn, position, pname = param
                        wrapper = _wrapper(callees, m, fn)
                        if all(c.name != pname for c in wrapper.checks):
                            wrapper.checks.append(Check(position, pname, f"hands `{pname}` to {name}(), which "
                                                                          f"{check.why}", check.where))
                            wrappers.add(fn.name)  # type: ignore[attr-defined]
        frontier = wrappers
    return out


def _wrapper(callees: dict[str, list[_Callee]], owner: pc._Module, fn: ast.AST) -> _Callee:
    name = fn.name  # type: ignore[attr-defined]
    for c in callees.setdefault(name, []):
        if c.fn is fn:
            return c
    made = _Callee(owner, fn, [])
    callees[name].append(made)
    return made


def _finding(src: PySource, arg: ast.expr, view: ast.AST, callee: str, check: Check) -> Finding:
    shown = " ".join(src.segment(arg).split())
    shown = shown if len(shown) <= 40 else shown[:39] + "…"
    op = view.attr if isinstance(view, ast.Attribute) else pc._call_name(view) + "()"  # type: ignore[arg-type]
    made = "" if _contains(arg, view) else f" (line {view.lineno})"  # type: ignore[attr-defined]
    message = (f"`{shown}` is a strided view{made} made by .{op}, not contiguous, and {callee} {check.why}, so "
               f"this call fails there; pass `{shown}.contiguous()`")
    start, end = src.span(arg)
    if isinstance(arg, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        edits: tuple[Edit, ...] = (Edit(end, end, ".contiguous()"),)
    else:
        edits = (Edit(start, start, "("), Edit(end, end, ").contiguous()"))
    return finding(src, arg, "GPU012", message,
                   Fix(UNSAFE, f"pass a dense copy: `{shown}.contiguous()`", edits))
