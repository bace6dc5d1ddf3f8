"""The C++/CUDA rules: raw data_ptr reads of unchecked tensor arguments (GPU009, resolved across
files) and custom allocator mistakes (GPU010).

GPU009 is decided in two steps. Per file, `summarise` records each function's tensor
parameters, which of them it checks or makes contiguous, where it reads their raw memory, and
which functions it calls with which arguments. Over all files, `resolve_data_ptr` reports a read
unless the parameter is protected: checked in the function itself, or every caller found passes
a checked parameter, a `.contiguous()` value or a freshly created tensor. A function nobody calls
(a pybind11 / TORCH_LIBRARY entry point) protects nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

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


def resolve_data_ptr(summaries: list[FuncSummary], bound: set[str]) -> list[tuple[FuncSummary, int]]:
    """(function, parameter index) pairs whose raw reads are not protected. A function that no
    linted file calls protects nothing only if it is bound for Python (an entry point); one that
    is neither called nor bound (a header whose callers are elsewhere) is left alone."""
    callers: dict[str, list[tuple[FuncSummary, list[tuple[str, int]]]]] = {}
    for s in summaries:
        for callee, kinds in s.calls:
            callers.setdefault(callee, []).append((s, kinds))
    memo: dict[tuple[int, int], bool] = {}

    def protected(s: FuncSummary, i: int, depth: int = 0) -> bool:
        key = (id(s), i)
        if key in memo:
            return memo[key]
        if s.checked[i]:
            return True
        sites = [(c, kinds) for c, kinds in callers.get(s.name, []) if len(kinds) == len(s.params)]
        if not sites or depth > 8:
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
        memo[key] = result
        return result

    out = []
    for s in summaries:
        for i in s.reads:
            if not protected(s, i):
                out.append((s, i))
    return out


def data_ptr_finding(s: FuncSummary, i: int) -> Finding:
    line, col, read = s.reads[i]
    param = s.params[i]
    message = (f"{read}() reads the raw memory of tensor argument `{param}` of {s.name}(), which is never checked or "
               f"made contiguous (here or by its callers): a transposed, sliced or expanded tensor is read in the wrong "
               f"order; add TORCH_CHECK({param}.is_contiguous(), ...) or use {param}.contiguous()")
    return Finding(path=s.path, line=line, col=col, code="GPU009", kb_id=BY_CODE["GPU009"].kb_id, message=message,
                   fix=Fix(DISPLAY_ONLY, f"TORCH_CHECK({param}.is_contiguous(), \"{param} must be contiguous\")"),
                   end_line=line, end_col=col + len(read))


# --- GPU010 ------------------------------------------------------------------------------------

_FAMILY = {
    "malloc": "malloc", "calloc": "malloc", "realloc": "malloc", "aligned_alloc": "malloc", "posix_memalign": "malloc",
    "memalign": "malloc", "valloc": "malloc", "pvalloc": "malloc", "strdup": "malloc",
    "_aligned_malloc": "_aligned_malloc", "_aligned_realloc": "_aligned_malloc", "_aligned_offset_malloc": "_aligned_malloc",
    "cudaMalloc": "cudaMalloc", "cudaMallocManaged": "cudaMalloc", "cudaMallocAsync": "cudaMalloc",
    "cudaMallocPitch": "cudaMalloc",
    "cudaMallocHost": "cudaMallocHost", "cudaHostAlloc": "cudaMallocHost",
    "hipMalloc": "hipMalloc", "hipHostMalloc": "hipHostMalloc",
    "alloc_cpu": "alloc_cpu",
}
_FREE = {
    "free": "malloc", "_aligned_free": "_aligned_malloc", "cudaFree": "cudaMalloc", "cudaFreeAsync": "cudaMalloc",
    "cudaFreeHost": "cudaMallocHost", "hipFree": "hipMalloc", "hipHostFree": "hipHostMalloc", "free_cpu": "alloc_cpu",
}
_FREE_NAME = {"malloc": "free", "_aligned_malloc": "_aligned_free", "cudaMalloc": "cudaFree",
              "cudaMallocHost": "cudaFreeHost", "hipMalloc": "hipFree", "hipHostMalloc": "hipHostFree",
              "alloc_cpu": "c10::free_cpu", "new": "delete", "new[]": "delete[]"}
_OUT_PARAM = {"posix_memalign", "cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaMallocHost",
              "cudaHostAlloc", "hipMalloc", "hipHostMalloc", "cudaMallocPitch"}


def allocator_findings(path: str, cpp: CppFile) -> list[Finding]:
    toks = cpp.tokens
    partner = match_brackets(toks)
    out: list[Finding] = []
    fns = functions(cpp, partner)
    deleter_families: dict[str, set[str]] = {}
    for fn in fns:
        fams = set()
        for k in range(fn.body[0] + 1, fn.body[1]):
            t = toks[k]
            if t.kind == "id" and t.text in _FREE and k + 1 < len(toks) and toks[k + 1].text == "(":
                fams.add(_FREE[t.text])
            elif t.text == "delete":
                fams.add("new[]" if k + 1 < len(toks) and toks[k + 1].text == "[" else "new")
        deleter_families[fn.name] = fams
    for fn in fns:
        out += _function_allocs(path, cpp, partner, fn, deleter_families)
    return out


def _finding(path: str, cpp: CppFile, tok: Tok, message: str, fix: str) -> Finding:
    line, col = cpp.line_col(tok.start)
    return Finding(path=path, line=line, col=col, code="GPU010", kb_id=BY_CODE["GPU010"].kb_id, message=message,
                   fix=Fix(DISPLAY_ONLY, fix), end_line=line, end_col=col + len(tok.text))


def _rounding_evidence(words: list[str]) -> bool:
    text = " ".join(words)
    if re.search(r"/.*\*|&\s*~|%|>>.*<<", text):
        return True
    return any(re.search(r"align|round|ceil|pad|_up\b|up$|multiple", w, re.I) for w in words if re.match(r"[A-Za-z_]", w))


def _int(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)[uUlL]*", text)
    return int(m.group(1)) if m else None


def _function_allocs(path: str, cpp: CppFile, partner: list[int], fn, deleter_families) -> list[Finding]:
    toks = cpp.tokens
    start, end = fn.body
    out: list[Finding] = []
    families: dict[str, tuple[str, Tok]] = {}  # variable -> (family, where) of its last allocation
    every: dict[str, list[tuple[str, Tok]]] = {}  # variable -> every allocation (one per #if branch)
    definitions: dict[str, list[str]] = {}  # variable -> words of its last assignment
    percent_names: set[str] = set()
    k = start + 1
    # first pass: definitions and % checks
    while k < end:
        t = toks[k]
        if t.kind == "id" and k + 1 < end and toks[k + 1].text == "=" and (k == 0 or toks[k - 1].text != "."):
            j = k + 2
            while j < end and toks[j].text not in (";", "{", "}"):
                j += 1
            definitions[t.text] = [x.text for x in toks[k + 2:j]]
        if t.text == "%" and k > 0 and toks[k - 1].kind == "id":
            percent_names.add(toks[k - 1].text)
        k += 1
    k = start + 1
    while k < end:
        t = toks[k]
        if t.kind == "id" and k + 1 < end and toks[k + 1].text == "(" and (k == 0 or toks[k - 1].text not in (".", "->")):
            name = t.text
            close = partner[k + 1]
            if close < 0:
                k += 1
                continue
            args = split_args(toks, k + 1, close)
            if name == "aligned_alloc" and len(args) == 2:
                f = _aligned_alloc(path, cpp, t, args, definitions, percent_names)
                if f:
                    out.append(f)
            if name in _FAMILY:
                var = _assigned_var(toks, k, start)
                if name in _OUT_PARAM and args and len(args[0]) >= 2 and args[0][0].text == "&":
                    var = args[0][-1].text if args[0][-1].kind == "id" else var
                if var:
                    families[var] = (_FAMILY[name], t)
                    every.setdefault(var, []).append(families[var])
            if name in _FREE and len(args) == 1 and len(args[0]) >= 1:
                var = args[0][-1].text if args[0][-1].kind == "id" else None
                if var in families and all(f != _FREE[name] for f, _ in every.get(var, [families[var]])):
                    fam, where = families[var]
                    line, _ = cpp.line_col(where.start)
                    out.append(_finding(path, cpp, t, (
                        f"{name}({var}) releases memory that {where.text}() allocated (line {line}): memory must be freed "
                        f"by its own family's function ({_FREE_NAME[fam]}); a mismatch corrupts the heap or crashes later"),
                        f"free it with {_FREE_NAME[fam]}({var})"))
        elif t.text == "new" and k > 1 and (_assigned_var(toks, k, start) or "") != "":
            j = k + 1
            while j < end and toks[j].text not in (";", "(", "[", "{"):
                j += 1
            var = _assigned_var(toks, k, start) or ""
            families[var] = ("new[]" if j < end and toks[j].text == "[" else "new", t)
            every.setdefault(var, []).append(families[var])
        elif t.text == "delete" and k + 1 < end:
            arr = toks[k + 1].text == "["
            j = k + (3 if arr else 1)
            var = toks[j].text if j < end and toks[j].kind == "id" else None
            if var in families:
                fam, where = families[var]
                expected = "new[]" if arr else "new"
                if fam != expected:
                    line, _ = cpp.line_col(where.start)
                    out.append(_finding(path, cpp, t, (
                        f"delete{'[]' if arr else ''} {var} releases memory that {where.text} allocated (line {line}); "
                        f"release it with {_FREE_NAME.get(fam, 'the matching function')}"),
                        f"use {_FREE_NAME.get(fam, 'the matching function')}"))
        k += 1
    # DataPtr{data, ctx, &deleter, device} / return {data, data, &free, device}
    for k in range(start + 1, end):
        t = toks[k]
        if t.text == "&" and k + 1 < end and toks[k + 1].kind == "id" and toks[k - 1].text == "," \
                and k + 2 < end and toks[k + 2].text in (",", "}", ")"):
            deleter = toks[k + 1].text
            data_var = _first_brace_arg(toks, partner, k)
            if data_var not in families:
                continue
            freed = {_FREE[deleter]} if deleter in _FREE else deleter_families.get(deleter, set())
            allocations = every.get(data_var, [families[data_var]])
            for fam, where in allocations:
                if not freed or fam in freed:
                    continue
                line, _ = cpp.line_col(where.start)
                if len(allocations) > 1:  # one #if branch allocates from another family: there
                    out.append(_finding(path, cpp, where, (
                        f"{where.text}() allocates {data_var} in this branch, but the DataPtr's deleter {deleter} releases "
                        f"it with {', '.join(_FREE_NAME.get(f, f) for f in sorted(freed))}: PyTorch frees every storage "
                        f"through the deleter, so that branch needs {_FREE_NAME.get(fam, 'the matching function')}"),
                        f"release it with {_FREE_NAME.get(fam, 'the matching function')} in that branch"))
                    continue
                out.append(_finding(path, cpp, toks[k + 1], (
                    f"the DataPtr's deleter {deleter} does not release memory from {where.text}() (line {line}): PyTorch "
                    f"frees every storage through this deleter, so it must call {_FREE_NAME.get(fam, 'the matching function')}"),
                    f"use a deleter that calls {_FREE_NAME.get(fam, 'the matching function')}"))
    # raw_deleter() { return &Fn; } against allocate()'s family is checked per class by name
    if fn.name == "raw_deleter":
        for k in range(start + 1, end - 1):
            if toks[k].text == "return" and toks[k + 1].text in ("&",) and k + 2 < end and toks[k + 2].kind == "id":
                deleter = toks[k + 2].text
                alloc_fams = _allocate_families(cpp, partner)
                freed = {_FREE[deleter]} if deleter in _FREE else deleter_families.get(deleter, set())
                if alloc_fams and freed and not (alloc_fams & freed):
                    out.append(_finding(path, cpp, toks[k + 2], (
                        f"raw_deleter() returns {deleter}, which does not release what allocate() allocates "
                        f"({', '.join(sorted(alloc_fams))}): memory freed through it corrupts the heap"),
                        "return a deleter of the same family as allocate()"))
    return out


def _allocate_families(cpp: CppFile, partner: list[int]) -> set[str]:
    fams: set[str] = set()
    for fn in functions(cpp, partner):
        if fn.name != "allocate":
            continue
        for k in range(fn.body[0] + 1, fn.body[1]):
            t = cpp.tokens[k]
            if t.kind == "id" and t.text in _FAMILY and cpp.tokens[k + 1].text == "(":
                fams.add(_FAMILY[t.text])
    return fams


def _assigned_var(toks: list[Tok], k: int, start: int) -> str | None:
    """`p = malloc(`, `void* p = (float*)malloc(`, `p = static_cast<T*>(malloc(`: p."""
    j = k - 1
    while j > start and toks[j].text in ("(", ")", "*", ">", "<", "static_cast", "reinterpret_cast", "void", "char",
                                         "float", "double", "int", "uint8_t", "const") or \
            (j > start and toks[j].kind == "id" and toks[j - 1].text in ("<", "(")):
        j -= 1
    if j > start and toks[j].text in ("?", ":"):  # p = n ? new T[n] : nullptr
        while j > start and toks[j].text not in ("=", ";", "{", "}"):
            j -= 1
    if j > start and toks[j].text == "=" and toks[j - 1].kind == "id":
        return toks[j - 1].text
    return None


def _first_brace_arg(toks: list[Tok], partner: list[int], k: int) -> str | None:
    depth = 0
    j = k
    while j > 0:
        t = toks[j].text
        if t in (")", "}", "]"):
            depth += 1
        elif t in ("(", "{", "["):
            if depth == 0:
                first = toks[j + 1]
                return first.text if first.kind == "id" else None
            depth -= 1
        j -= 1
    return None


def _const_value(words: list[str], cpp: CppFile, definitions: dict[str, list[str]], depth: int = 0) -> int | None:
    """The value of an integer constant expression: literals, + - * / << >> and parentheses,
    names #define'd or assigned in the function to such expressions."""
    if depth > 4 or not words:
        return None
    out = []
    for w in words:
        if re.fullmatch(r"\d+[uUlL]*", w):
            out.append(str(_int(w)))
        elif w in ("+", "-", "*", "/", "(", ")", "<<", ">>"):
            out.append("//" if w == "/" else w)
        elif re.fullmatch(r"[A-Za-z_]\w*", w):
            if w in definitions:
                v = _const_value(definitions[w], cpp, definitions, depth + 1)
            elif w in cpp.macros:
                v = _const_value(re.findall(r"\w+|<<|>>|\S", cpp.macros[w]), cpp, definitions, depth + 1)
            else:
                v = None
            if v is None:
                return None
            out.append(str(v))
        else:
            return None
    try:
        value = eval("".join(out), {"__builtins__": {}}, {})  # digits and operators only
    except Exception:
        return None
    return value if isinstance(value, int) else None


def _constant_like(name: str) -> bool:
    """kMaxBytes, BUF_BYTES: a compile-time constant whose value is chosen, not computed."""
    return bool(re.fullmatch(r"k[A-Z]\w*|[A-Z][A-Z0-9_]+", name))


def _aligned_alloc(path: str, cpp: CppFile, tok: Tok, args: list[list[Tok]], definitions: dict[str, list[str]],
                   percent_names: set[str]) -> Finding | None:
    align_words = [t.text for t in args[0]]
    size_words = [t.text for t in args[1]]
    align = _const_value(align_words, cpp, definitions)
    size = _const_value(size_words, cpp, definitions)
    if size is not None:
        if align is None or (align and size % align == 0):
            return None
    elif _rounding_evidence(size_words):
        return None
    else:
        names = [w for w in size_words if re.match(r"^[A-Za-z_]\w*$", w) and w != "sizeof"]
        if len(names) == 1 and len(size_words) == 1 and _constant_like(names[0]) and names[0] not in definitions:
            return None
        for n in names:
            if n in percent_names or (n in definitions and _rounding_evidence(definitions[n])):
                return None
    size_text = " ".join(size_words)
    align_text = " ".join(align_words)
    return _finding(path, cpp, tok, (
        f"aligned_alloc({align_text}, {size_text}): the size must be a multiple of the alignment (C11 leaves it "
        f"undefined, C17 returns NULL; some C libraries accept it), and nothing here rounds {size_text} up"),
        f"aligned_alloc({align_text}, ({size_text} + {align_text} - 1) / {align_text} * {align_text})")


def scan(path: str, text: str, data: bytes, codes: set[str]) -> tuple[list[Finding], list[FuncSummary], set[str]]:
    if "GPU009" in codes and not is_extension_source(data):
        codes = codes - {"GPU009"}
    if not codes:
        return [], [], set()
    cpp = tokenize(text)
    findings: list[Finding] = []
    summaries: list[FuncSummary] = []
    bound: set[str] = set()
    if "GPU010" in codes:
        findings += allocator_findings(path, cpp)
    if "GPU009" in codes:
        summaries = [s for s in summarise(path, cpp) if s.reads or s.calls]
        bound = bound_names(cpp)
    return findings, summaries, bound
