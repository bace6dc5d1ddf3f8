"""The C++/CUDA rules: raw data_ptr reads of unchecked tensor arguments (GPU009, resolved across
files, with the project's own Python calls of a binding as callers); `scan` also runs the custom
allocator rule (GPU010, in gpudoctor.lint.cppalloc) on each file.

GPU009 is decided in two steps. Per file, `summarise` records each function's tensor
parameters, which of them it checks or makes contiguous, where it reads their raw memory, and
which functions it calls with which arguments. Over all files, `resolve_data_ptr` reports a read
unless the parameter is protected: checked in the function itself, or every caller found passes
a checked parameter, a `.contiguous()` value or a freshly created tensor. A function nobody calls
(a pybind11 / TORCH_LIBRARY entry point) protects nothing.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from gpudoctor.lint import cppalloc
from gpudoctor.lint.cpp import CppFile, Tok, functions, match_brackets, split_args, tokenize
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.rules import BY_CODE

_READS = {"data_ptr", "mutable_data_ptr", "const_data_ptr", "data"}
_STRIDE_AWARE = {"is_contiguous", "contiguous", "expect_contiguous", "stride", "strides", "packed_accessor",
                 "packed_accessor32", "packed_accessor64", "generic_packed_accessor", "accessor",
                 "is_non_overlapping_and_dense", "suggest_memory_format", "sym_strides", "sym_stride"}
_ASSERTS = {"TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "TORCH_CHECK_EQ", "TORCH_CHECK_NE", "AT_ASSERT", "assert",
            "AT_ASSERTM", "CHECK", "TORCH_INTERNAL_ASSERT_DEBUG_ONLY", "C10_CUDA_CHECK", "static_assert"}
_FRESH = {"empty", "zeros", "ones", "empty_like", "zeros_like", "ones_like", "full", "randn", "rand", "arange",
          "empty_strided", "clone", "contiguous", "cat", "stack"}
_EXTENSION_MARKERS = (b"torch/extension.h", b"torch/torch.h", b"torch/all.h", b"torch/python.h", b"torch/script.h",
                      b"torch/library.h", b"torch/types.h", b"PYBIND11_MODULE", b"TORCH_LIBRARY")


def is_extension_source(data: bytes) -> bool:
    """Extension code (rather than PyTorch's own sources): it includes the torch extension
    headers, binds functions, spells torch::Tensor, or launches kernels on at::Tensor data."""
    if any(m in data for m in _EXTENSION_MARKERS) or b"torch::Tensor" in data:
        return True
    return b"<<<" in data and b"at::Tensor" in data


# --- GPU009 facts -------------------------------------------------------------------------------


@dataclass
class FuncSummary:
    name: str
    path: str
    params: list[str]  # parameter names, tensor or not
    tensor: list[bool]
    checked: list[bool]
    reads: dict[int, tuple[int, int, str]]  # param index -> (line, col, the read text)
    calls: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)
    # per call: callee name, and per argument ("param", i) | ("fresh", 0) | ("other", 0)
    # calls inside a check (TORCH_CHECK(same_layout(a, b)), if (...)): callee, per argument the
    # parameter index or -1; a helper of this file that reads both arguments' strides ties their
    # layouts, so a parameter compared with a checked one is checked too
    compared: list[tuple[str, list[int]]] = field(default_factory=list)


def _call_name_before(toks: list[Tok], open_paren: int) -> str:
    if open_paren > 0 and toks[open_paren - 1].kind == "id":
        return toks[open_paren - 1].text
    return ""


def _macro_checks(cpp: CppFile, name: str, seen: set[str] | None = None) -> bool:
    """A macro of this file whose expansion checks or forces contiguity (CHECK_INPUT ->
    CHECK_CONTIGUOUS -> is_contiguous)."""
    seen = seen or set()
    if name in seen:
        return False
    seen.add(name)
    body = cpp.macros.get(name)
    if body is None:
        return False
    if re.search(r"contiguous|CONTIG", body):
        return True
    return any(_macro_checks(cpp, m, seen) for m in re.findall(r"[A-Za-z_]\w*", body) if m in cpp.macros)


def _checking_call(cpp: CppFile, name: str) -> bool:
    if not name:
        return False
    if re.search(r"contig", name, re.I) or name in ("CHECK_INPUT", "CHECK_INPUTS", "CHECK_TENSOR", "CHECK_ARG"):
        return True
    if name in cpp.macros:
        return _macro_checks(cpp, name)
    # a helper such as check_inputs(q, k, v): taken as a check (precision first)
    return "check" in name.lower() and name not in _ASSERTS and name not in ("CHECK_CUDA", "CHECK_DEVICE")


def summarise(path: str, cpp: CppFile) -> list[FuncSummary]:
    toks = cpp.tokens
    partner = match_brackets(toks)
    out: list[FuncSummary] = []
    for fn in functions(cpp, partner):
        names = [p for _, p in fn.params]
        tensor = [_is_tensor_type(words) for words, _ in fn.params]
        index = {p: i for i, p in enumerate(names)}
        checked = [False] * len(names)
        reads: dict[int, tuple[int, int, str]] = {}
        start, end = fn.body
        # innermost enclosing call name for each token, to ignore reads inside TORCH_CHECK(...)
        stack: list[str] = []
        all_checked = False
        fresh_locals: set[str] = set()
        calls: list[tuple[str, list[tuple[str, int]]]] = []
        compared: list[tuple[str, list[int]]] = []
        k = start + 1
        while k < end:
            t = toks[k]
            if t.kind == "op" and t.text == "(":
                stack.append(_call_name_before(toks, k))
                callee = stack[-1]
                close = partner[k]
                if callee and close > k:
                    args = split_args(toks, k, close)
                    arg_names = [a[0].text for a in args if len(a) == 1 and a[0].kind == "id"]
                    if _checking_call(cpp, callee):
                        for a in arg_names:
                            if a in index:
                                checked[index[a]] = True
                    if callee in ("checkContiguous", "checkAllContiguous", "TensorIteratorConfig", "TensorIterator"):
                        all_checked = True
                    if toks[k - 2].text not in (".", "->") and any(c in _ASSERTS or c == "if" for c in stack[:-1]):
                        compared.append((callee, [index.get(a[0].text, -1) if len(a) == 1 else -1 for a in args]))
                    prev = toks[k - 2].text if k >= 2 else ""
                    if prev not in (".", "->") and callee not in _ASSERTS and not callee.isupper():
                        kinds = []
                        for a in args:
                            if len(a) == 1 and a[0].kind == "id" and a[0].text in index:
                                kinds.append(("param", index[a[0].text]))
                            elif len(a) == 1 and a[0].kind == "id" and a[0].text in fresh_locals:
                                kinds.append(("fresh", 0))
                            elif any(x.text in ("contiguous",) for x in a):
                                kinds.append(("fresh", 0))
                            else:
                                kinds.append(("other", 0))
                        calls.append((callee, kinds))
            elif t.kind == "op" and t.text == ")":
                if stack:
                    stack.pop()
            elif t.kind == "id":
                nxt = toks[k + 1].text if k + 1 < end else ""
                if t.text in ("TensorIterator", "TensorIteratorConfig"):
                    all_checked = True
                # `auto y = x.contiguous();` / `torch::empty(...)`: a dense local
                if nxt == "=" and k + 2 < end:
                    j = k + 2
                    stmt_end = j
                    while stmt_end < end and toks[stmt_end].text != ";":
                        stmt_end += 1
                    words = {x.text for x in toks[j:stmt_end]}
                    if words & _FRESH and t.text not in index:
                        fresh_locals.add(t.text)
                if t.text in index and nxt in (".", "->") and k + 2 < end:
                    member = toks[k + 2].text
                    if member == "template" and k + 3 < end:
                        member = toks[k + 3].text
                    i = index[t.text]
                    if member in _STRIDE_AWARE:
                        checked[i] = True
                    elif member in ("numel", "dim") and stack and stack[-1] in _ASSERTS and \
                            _equals_after_call(toks, k + 3, end, "1" if member == "numel" else "0"):
                        checked[i] = True  # TORCH_CHECK(x.numel() == 1): one element is dense whatever its strides
                    elif member in _READS and tensor[i]:
                        after = toks[k + 3].text if k + 3 < end else ""
                        if member == "data" and after != "<":
                            pass
                        elif stack and stack[-1] in _ASSERTS:
                            pass
                        elif _comparison_near(toks, k, end, partner):
                            pass
                        elif i not in reads:
                            line, col = cpp.line_col(t.start)
                            reads[i] = (line, col, f"{t.text}.{member}")
            k += 1
        if all_checked:
            checked = [True] * len(names)
        out.append(FuncSummary(fn.name, path, names, tensor, checked, reads, calls, compared))
    _same_layout(out)
    return out


def _same_layout(summaries: list[FuncSummary]) -> None:
    """TORCH_CHECK(has_same_layout(dy, x)) with x checked: dy is checked too, when the helper is a
    function of this file that reads the strides of both arguments (it compares layouts). A
    comparison of sizes alone (dy.sizes() == x.sizes()) says nothing about strides."""
    helpers = {s.name: s.checked for s in summaries if sum(s.checked) >= 2}
    for s in summaries:
        links = []
        for callee, args in s.compared:
            strided = helpers.get(callee)
            if strided is None or callee == s.name:
                continue
            tied = [i for pos, i in enumerate(args) if i >= 0 and pos < len(strided) and strided[pos]]
            if len(tied) >= 2:
                links.append(tied)
        changed = bool(links)
        while changed:
            changed = False
            for tied in links:
                if any(s.checked[i] for i in tied) and not all(s.checked[i] for i in tied):
                    for i in tied:
                        s.checked[i] = True
                    changed = True


def _equals_after_call(toks: list[Tok], j: int, end: int, value: str) -> bool:
    """`( ) == value` from token j (after `x.numel`)."""
    return j + 3 < end and toks[j].text == "(" and toks[j + 1].text == ")" and toks[j + 2].text == "==" and \
        toks[j + 3].text == value


def _comparison_near(toks: list[Tok], k: int, end: int, partner: list[int]) -> bool:
    """x.data_ptr() == y.data_ptr(), reinterpret_cast<uintptr_t>(x.data_ptr()) % 16: a pointer
    compared or tested for alignment, not read."""
    before = toks[k - 1].text if k > 0 else ""
    if before in ("==", "!=", "%"):
        return True
    j = k + 3 if toks[k + 2].text != "template" else k + 4
    if j < end and toks[j].text == "<":  # data_ptr<float>
        depth = 0
        while j < end:
            if toks[j].text == "<":
                depth += 1
            elif toks[j].text == ">":
                depth -= 1
                if depth == 0:
                    break
            elif toks[j].text == ">>":
                depth -= 2
                if depth <= 0:
                    break
            j += 1
        j += 1
    if j < end and toks[j].text == "(" and partner[j] > j:
        j = partner[j] + 1
    while j < end and toks[j].text == ")":
        j += 1
    return j < end and toks[j].text in ("==", "!=", "%", "<", ">", "<=", ">=")


def _is_tensor_type(words: list[str]) -> bool:
    if "Tensor" not in words:
        return False
    text = " ".join(words)
    return "<" not in text and not re.search(r"\bTensor(List|Options|Arg|Iterator)", text)


_BINDERS = {"def", "impl", "TORCH_FN", "op", "def_static", "TORCH_SELECTIVE_NAME"}


def bound_names(cpp: CppFile) -> set[str]:
    """Functions handed to pybind11 (m.def("f", &f)) or the dispatcher (m.impl("f", &f),
    TORCH_FN(f)): the entry points Python calls."""
    toks = cpp.tokens
    out: set[str] = set()
    partner = None
    for k, t in enumerate(toks):
        if t.kind == "id" and t.text in _BINDERS and k + 1 < len(toks) and toks[k + 1].text == "(":
            if partner is None:
                partner = match_brackets(toks)
            close = partner[k + 1]
            if close < 0:
                continue
            for arg in split_args(toks, k + 1, close):
                words = [x for x in arg if x.text not in ("&", "::") and x.kind == "id"]
                if words and all(x.kind == "id" or x.text in ("&", "::") for x in arg):
                    out.add(words[-1].text)
    return out


def python_names(cpp: CppFile) -> dict[str, str]:
    """Python-visible name -> C++ function of each binding: m.def("forward", &ns::fwd),
    m.impl("gather", TORCH_FN(gather_cuda)); the name of a TORCH_LIBRARY schema is the identifier
    before its "(" (m.def("gather(Tensor x) -> Tensor", &gather))."""
    toks = cpp.tokens
    out: dict[str, str] = {}
    partner = None
    for k, t in enumerate(toks):
        if t.kind != "id" or t.text not in ("def", "impl", "def_static") or k + 1 >= len(toks) or \
                toks[k + 1].text != "(" or k == 0 or toks[k - 1].text not in (".", "->"):
            continue
        if partner is None:
            partner = match_brackets(toks)
        close = partner[k + 1]
        if close < 0:
            continue
        args = split_args(toks, k + 1, close)
        if len(args) < 2 or len(args[0]) != 1 or args[0][0].kind != "str":
            continue
        m = re.match(r'^[A-Za-z]*"(?:\w+::)?([A-Za-z_]\w*)', args[0][0].text)
        if not m:
            continue
        for arg in args[1:]:
            words = [x for x in arg if x.kind == "id" and x.text != "TORCH_FN"]
            if words and all(x.kind == "id" or x.text in ("&", "::", "(", ")") for x in arg):
                out[m.group(1)] = words[-1].text
                break
    return out


def resolve_data_ptr(summaries: list[FuncSummary], bound: set[str],
                     python: dict[str, list[PyCall]] | None = None) -> list[tuple[FuncSummary, int, PyCall | None]]:
    """(function, parameter index, a Python call that passes it unprotected or None) for the raw
    reads that are not protected. A function that no linted file calls protects nothing only if
    it is bound for Python (an entry point); one that is neither called nor bound (a header whose
    callers are elsewhere) is left alone. `python`: C++ name -> the project's own Python calls of
    its binding (`python_calls`); a bound function is protected when every C++ caller and every
    one of those calls passes a protected tensor."""
    python = python or {}
    callers: dict[str, list[tuple[FuncSummary, list[tuple[str, int]]]]] = {}
    for s in summaries:
        for callee, kinds in s.calls:
            callers.setdefault(callee, []).append((s, kinds))
    memo: dict[tuple[int, int], bool] = {}
    blame: dict[tuple[int, int], PyCall] = {}

    def protected(s: FuncSummary, i: int, depth: int = 0) -> bool:
        key = (id(s), i)
        if key in memo:
            return memo[key]
        if s.checked[i]:
            return True
        sites = [(c, kinds) for c, kinds in callers.get(s.name, []) if len(kinds) == len(s.params)]
        py_sites = [c for c in python.get(s.name, ()) if c.arity_fits(s.params)] if s.name in bound else []
        if (not sites and not py_sites) or depth > 8:
            memo[key] = depth > 8 or s.name not in bound
            return memo[key]
        memo[key] = True  # assume protected inside a cycle
        result = True
        for caller, kinds in sites:
            kind, j = kinds[i]
            if kind == "fresh":
                continue
            if kind == "param" and caller.tensor[j] and protected(caller, j, depth + 1):
                continue
            result = False
            break
        if result:
            for call in py_sites:
                if not call.fresh_at(i, s.params[i]):
                    blame[key] = call
                    result = False
                    break
        memo[key] = result
        return result

    def culprit(s: FuncSummary, i: int, depth: int = 0) -> PyCall | None:
        """The Python call that passes this tensor unprotected, through the C++ callers."""
        if (id(s), i) in blame or depth > 8:
            return blame.get((id(s), i))
        for caller, kinds in callers.get(s.name, []):
            if len(kinds) == len(s.params) and kinds[i][0] == "param" and not memo.get((id(caller), kinds[i][1]), True):
                found = culprit(caller, kinds[i][1], depth + 1)
                if found is not None:
                    return found
        return None

    out = []
    for s in summaries:
        for i in s.reads:
            if not protected(s, i):
                out.append((s, i, culprit(s, i)))
    return out


def data_ptr_finding(s: FuncSummary, i: int, call: PyCall | None = None) -> Finding:
    line, col, read = s.reads[i]
    param = s.params[i]
    where = ""
    if call is not None:
        where = f"; {call.path}:{call.line} passes `{call.shown_at(i, param)}`, not known to be contiguous"
    message = (f"{read}() reads the raw memory of tensor argument `{param}` of {s.name}(), which is never checked or "
               f"made contiguous (here or by its callers{where}): a transposed, sliced or expanded tensor is read in "
               f"the wrong order; add TORCH_CHECK({param}.is_contiguous(), ...) or use {param}.contiguous()")
    return Finding(path=s.path, line=line, col=col, code="GPU009", kb_id=BY_CODE["GPU009"].kb_id, message=message,
                   fix=Fix(DISPLAY_ONLY, f"TORCH_CHECK({param}.is_contiguous(), \"{param} must be contiguous\")"),
                   end_line=line, end_col=col + len(read))


# --- GPU009: the project's own Python calls of a binding ---------------------------------------

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


def scan(path: str, text: str, data: bytes,
         codes: set[str]) -> tuple[list[Finding], list[FuncSummary], set[str], dict[str, str]]:
    """Findings (GPU010), and GPU009's facts: summaries, bound C++ names, Python name -> C++ name."""
    if "GPU009" in codes and not is_extension_source(data):
        codes = codes - {"GPU009"}
    if not codes:
        return [], [], set(), {}
    cpp = tokenize(text)
    findings: list[Finding] = []
    summaries: list[FuncSummary] = []
    bound: set[str] = set()
    aliases: dict[str, str] = {}
    if "GPU010" in codes:
        findings += cppalloc.allocator_findings(path, cpp)
    if "GPU009" in codes:
        summaries = [s for s in summarise(path, cpp) if s.reads or s.calls]
        bound = bound_names(cpp)
        aliases = python_names(cpp)
        bound |= set(aliases.values())
    return findings, summaries, bound, aliases
