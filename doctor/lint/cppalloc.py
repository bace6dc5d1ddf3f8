"""GPU010 in C++/CUDA: a custom allocator (a PrivateUse1 backend's, or any extension's) whose
`aligned_alloc(alignment, size)` size is not provably a multiple of the alignment, or whose memory
is released by another allocation family (`_aligned_malloc` memory with `free`, `cudaMalloc`
memory with `free`, `new` with `free`; a `c10::Allocator` whose deleter does not match its
allocate()).

Split out of gpudoctor.lint.cpprules (GPU009), whose `scan` calls `allocator_findings` per file
(parsed by gpudoctor.lint.cpp). The function bodies are read in source order: the allocation a
variable holds is the last one written before the release.
"""
from __future__ import annotations

import re

from gpudoctor.lint.cpp import CppFile, Function, Node, arguments, callee, declarator_name, text_of, walk, words
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


# Function bodies worth walking (a byte search, in C): they allocate, free or delete.
_ALLOCATES = re.compile(rb"alloc|Alloc|new|memalign")
_RELEASES = re.compile(rb"free|Free|delete")


def allocator_findings(path: str, cpp: CppFile) -> list[Finding]:
    out: list[Finding] = []
    fns = cpp.functions()
    deleter_families: dict[str, set[str]] = {}
    for fn in fns:
        if not _RELEASES.search(fn.body.text):
            continue
        fams = set()
        for n in walk(fn.body):
            if n.type == "call_expression":
                name, member = callee(n)
                if name in _FREE and not member:
                    fams.add(_FREE[name])
            elif n.type == "delete_expression":
                fams.add("new[]" if _is_array_delete(n) else "new")
        deleter_families.setdefault(fn.name, set()).update(fams)
    allocate = None
    for fn in fns:
        if fn.name == "raw_deleter" and allocate is None:
            allocate = _allocate_families(fns)
        if fn.name == "raw_deleter" or _ALLOCATES.search(fn.body.text):
            out += _function_allocs(path, cpp, fn, deleter_families, allocate or set())
    return out


def _is_array_delete(n: Node) -> bool:
    return any(c.type == "[" for c in n.children)


def _finding(path: str, cpp: CppFile, node: Node, message: str, fix: str) -> Finding:
    line, col = cpp.pos(node)
    return Finding(path=path, line=line, col=col, code="GPU010", kb_id=BY_CODE["GPU010"].kb_id, message=message,
                   fix=Fix(DISPLAY_ONLY, fix), end_line=line, end_col=col + len(text_of(node)))


def _rounding_evidence(words: list[str]) -> bool:
    text = " ".join(words)
    if re.search(r"/.*\*|&\s*~|%|>>.*<<", text):
        return True
    return any(re.search(r"align|round|ceil|pad|_up\b|up$|multiple", w, re.I) for w in words if re.match(r"[A-Za-z_]", w))


def _int(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)[uUlL]*", text)
    return int(m.group(1)) if m else None


def _name_node(call: Node) -> Node:
    """The node that names a call's callee (where a finding about the call points)."""
    fn = call.child_by_field_name("function")
    while fn is not None and fn.type in ("qualified_identifier", "template_function"):
        fn = fn.child_by_field_name("name")
    return fn if fn is not None else call


def _function_allocs(path: str, cpp: CppFile, fn: Function, deleter_families: dict[str, set[str]],
                     allocate: set[str]) -> list[Finding]:
    out: list[Finding] = []
    families: dict[str, tuple[str, Node]] = {}  # variable -> (family, where) of its last allocation
    every: dict[str, list[tuple[str, Node]]] = {}  # variable -> every allocation (one per #if branch)
    definitions: dict[str, list[str]] = {}  # variable -> words of its last assignment
    percent_names: set[str] = set()
    nodes = list(walk(fn.body))
    # first pass: definitions and % checks
    for n in nodes:
        if n.type in ("init_declarator", "assignment_expression"):
            target = n.child_by_field_name("declarator" if n.type == "init_declarator" else "left")
            value = n.child_by_field_name("value" if n.type == "init_declarator" else "right")
            if target is not None and value is not None and target.type == "identifier":
                definitions[text_of(target)] = words(value)
        elif n.type == "binary_expression":
            op = n.child_by_field_name("operator")
            left = n.child_by_field_name("left")
            if op is not None and op.type == "%" and left is not None and left.type == "identifier":
                percent_names.add(text_of(left))
    for n in nodes:
        if n.type == "call_expression":
            name, member = callee(n)
            if member or not name:
                continue
            args = arguments(n)
            where = _name_node(n)
            if name == "aligned_alloc" and len(args) == 2:
                f = _aligned_alloc(path, cpp, where, args, definitions, percent_names)
                if f:
                    out.append(f)
            if name in _FAMILY:
                var = _assigned_var(n)
                if name in _OUT_PARAM and args and args[0].type == "pointer_expression":
                    inner = args[0].child_by_field_name("argument")
                    if inner is not None and inner.type == "identifier":
                        var = text_of(inner)
                if var:
                    families[var] = (_FAMILY[name], where)
                    every.setdefault(var, []).append(families[var])
            if name in _FREE and len(args) == 1:
                var = _last_identifier(args[0])
                if var in families and all(f != _FREE[name] for f, _ in every.get(var, [families[var]])):
                    fam, at = families[var]
                    line, _ = cpp.pos(at)
                    out.append(_finding(path, cpp, where, (
                        f"{name}({var}) releases memory that {text_of(at)}() allocated (line {line}): memory must be freed "
                        f"by its own family's function ({_FREE_NAME[fam]}); a mismatch corrupts the heap or crashes later"),
                        f"free it with {_FREE_NAME[fam]}({var})"))
        elif n.type == "new_expression":
            var = _assigned_var(n)
            if var:
                array = any(c.type == "new_declarator" for c in n.children)
                keyword = n.children[0] if n.children and n.children[0].type == "new" else n
                families[var] = ("new[]" if array else "new", keyword)
                every.setdefault(var, []).append(families[var])
        elif n.type == "delete_expression":
            arr = _is_array_delete(n)
            operand = n.named_children[-1] if n.named_children else None
            var = text_of(operand) if operand is not None and operand.type == "identifier" else None
            if var in families:
                fam, at = families[var]
                expected = "new[]" if arr else "new"
                if fam != expected:
                    line, _ = cpp.pos(at)
                    keyword = n.children[0] if n.children else n
                    out.append(_finding(path, cpp, keyword, (
                        f"delete{'[]' if arr else ''} {var} releases memory that {text_of(at)} allocated (line {line}); "
                        f"release it with {_FREE_NAME.get(fam, 'the matching function')}"),
                        f"use {_FREE_NAME.get(fam, 'the matching function')}"))
    # DataPtr{data, ctx, &deleter, device} / return {data, data, &free, device}
    for n in nodes:
        if n.type != "pointer_expression" or n.parent is None or n.parent.type not in ("initializer_list", "argument_list"):
            continue
        operand = n.child_by_field_name("argument")
        op = n.child_by_field_name("operator")
        if operand is None or operand.type != "identifier" or op is None or op.type != "&":
            continue
        elements = [c for c in n.parent.named_children if c.type != "comment"]
        if not elements or elements[0] == n or elements[0].type != "identifier":
            continue
        deleter = text_of(operand)
        data_var = text_of(elements[0])
        if data_var not in families:
            continue
        freed = {_FREE[deleter]} if deleter in _FREE else deleter_families.get(deleter, set())
        allocations = every.get(data_var, [families[data_var]])
        for fam, at in allocations:
            if not freed or fam in freed:
                continue
            line, _ = cpp.pos(at)
            if len(allocations) > 1:  # one #if branch allocates from another family: there
                out.append(_finding(path, cpp, at, (
                    f"{text_of(at)}() allocates {data_var} in this branch, but the DataPtr's deleter {deleter} releases "
                    f"it with {', '.join(_FREE_NAME.get(f, f) for f in sorted(freed))}: PyTorch frees every storage "
                    f"through the deleter, so that branch needs {_FREE_NAME.get(fam, 'the matching function')}"),
                    f"release it with {_FREE_NAME.get(fam, 'the matching function')} in that branch"))
                continue
            out.append(_finding(path, cpp, operand, (
                f"the DataPtr's deleter {deleter} does not release memory from {text_of(at)}() (line {line}): PyTorch "
                f"frees every storage through this deleter, so it must call {_FREE_NAME.get(fam, 'the matching function')}"),
                f"use a deleter that calls {_FREE_NAME.get(fam, 'the matching function')}"))
    # raw_deleter() { return &Fn; } against allocate()'s family
    if fn.name == "raw_deleter":
        for n in nodes:
            if n.type != "return_statement":
                continue
            value = n.named_children[0] if n.named_children else None
            if value is None or value.type != "pointer_expression":
                continue
            operand = value.child_by_field_name("argument")
            if operand is None or operand.type != "identifier":
                continue
            deleter = text_of(operand)
            freed = {_FREE[deleter]} if deleter in _FREE else deleter_families.get(deleter, set())
            if allocate and freed and not (allocate & freed):
                out.append(_finding(path, cpp, operand, (
                    f"raw_deleter() returns {deleter}, which does not release what allocate() allocates "
                    f"({', '.join(sorted(allocate))}): memory freed through it corrupts the heap"),
                    "return a deleter of the same family as allocate()"))
    return out


def _allocate_families(fns: list[Function]) -> set[str]:
    fams: set[str] = set()
    for fn in fns:
        if fn.name != "allocate":
            continue
        for n in walk(fn.body):
            if n.type == "call_expression":
                name, member = callee(n)
                if name in _FAMILY and not member:
                    fams.add(_FAMILY[name])
    return fams


def _last_identifier(node: Node) -> str | None:
    """`p`, `(void*)p`, `static_cast<void*>(p)`: the variable an argument passes."""
    ids = [n for n in walk(node) if n.type == "identifier"]
    return text_of(ids[-1]) if ids else None


def _assigned_var(node: Node) -> str | None:
    """`p = malloc(`, `void* p = (float*)malloc(`, `p = static_cast<T*>(malloc(`,
    `p = n ? new T[n] : nullptr`: p."""
    n = node
    while n.parent is not None:
        p = n.parent
        if p.type in ("parenthesized_expression", "cast_expression", "conditional_expression"):
            n = p
            continue
        if p.type == "argument_list" and p.parent is not None and p.parent.type == "call_expression" and \
                callee(p.parent)[0] in ("static_cast", "reinterpret_cast", "const_cast"):
            n = p.parent
            continue
        if p.type == "init_declarator" and p.child_by_field_name("value") == n:
            return declarator_name(p.child_by_field_name("declarator")) or None
        if p.type == "assignment_expression" and p.child_by_field_name("right") == n:
            left = p.child_by_field_name("left")
            return text_of(left) if left is not None and left.type == "identifier" else None
        return None
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
            elif w in cpp.macros and cpp.macros[w].params is None:
                v = _const_value(cpp.macros[w].words(), cpp, definitions, depth + 1)
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


def _aligned_alloc(path: str, cpp: CppFile, where: Node, args: list[Node], definitions: dict[str, list[str]],
                   percent_names: set[str]) -> Finding | None:
    align_words = words(args[0])
    size_words = words(args[1])
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
    return _finding(path, cpp, where, (
        f"aligned_alloc({align_text}, {size_text}): the size must be a multiple of the alignment (C11 leaves it "
        f"undefined, C17 returns NULL; some C libraries accept it), and nothing here rounds {size_text} up"),
        f"aligned_alloc({align_text}, ({size_text} + {align_text} - 1) / {align_text} * {align_text})")
