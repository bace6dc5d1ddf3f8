"""GPU010 in C++/CUDA: a custom allocator (a PrivateUse1 backend's, or any extension's) whose
`aligned_alloc(alignment, size)` size is not provably a multiple of the alignment, or whose memory
is released by another allocation family (`_aligned_malloc` memory with `free`, `cudaMalloc`
memory with `free`, `new` with `free`; a `c10::Allocator` whose deleter does not match its
allocate()).

Split out of gpudoctor.lint.cpprules (GPU009), whose `scan` calls `allocator_findings` per file.
Standard library only.
"""
from __future__ import annotations

import re

from gpudoctor.lint.cpp import CppFile, Tok, functions, match_brackets, split_args
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.rules import BY_CODE


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
