"""GPU006 in Python: the architecture flags a `setup.py` or a `torch.utils.cpp_extension` call
passes to nvcc (`-gencode`, `-arch`, `extra_compile_args`, `TORCH_CUDA_ARCH_LIST` set in the
environment), collected from string literals, lists built and concatenated in the file, and the
defaults a build picks by CUDA toolkit version; gpudoctor.lint.archflags judges the tokens.

Split out of gpudoctor.lint.pyrules (the other Python rules), which calls `arch_flags`.
Standard library only.
"""
from __future__ import annotations

import ast
import re

from gpudoctor.lint import archflags
from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, walk


# --- GPU006: arch flags in Python -------------------------------------------------------------


def _str_const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _parents(roots: list[ast.AST]) -> dict[int, ast.AST]:
    parents: dict[int, ast.AST] = {}
    for root in roots:
        for node in walk([root]):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
    return parents


def arch_flags(src: PySource) -> list[Finding]:
    out: list[Finding] = []
    verdicts: list[tuple[archflags.Verdict, ast.AST]] = []
    # 1. flag lists, on the lines that mention nvcc architecture flags
    hint_lines = src.lines_matching(archflags.FLAG_HINT)
    lists = [(n, sc) for n, sc in src.nodes_on_lines(hint_lines, (ast.List, ast.Tuple))
             if any(archflags.FLAG_HINT.search(x) for x in map(_str_const, n.elts) if x)]  # type: ignore[attr-defined]
    # `cc_flag = []` filled by `cc_flag.append("-gencode")`, `cc_flag.append("arch=...")` (mmcv, mamba)
    appended: dict[tuple[str, int], int] = {}
    for node, sc in src.nodes_on_lines(hint_lines, (ast.Call,)):
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend", "insert") and \
                any(archflags.FLAG_HINT.search(x) for a in node.args for x in
                    ([_str_const(a)] + [_str_const(e) for e in getattr(a, "elts", [])]) if x):
            name = dotted(node.func.value)
            if name:
                appended.setdefault((name, id(sc)), node.lineno)
    if appended:
        have = {id(n) for n, _ in lists}
        for st, sc in src.stmts:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and id(st.value) not in have and \
                    (isinstance(st.value, (ast.List, ast.Tuple)) or _empty_list_call(st.value)):
                line = appended.get((dotted(st.targets[0]) or "", id(sc)))
                if line is not None and st.lineno < line:
                    lists.append((st.value, sc))
                    have.add(id(st.value))
    if lists:
        roots = [st for st, _ in src.stmts if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and any(st.lineno <= n.lineno <= st.end_lineno for n, _ in lists)]  # type: ignore[operator]
        parents = _parents(roots)
        for node, scope in lists:
            if isinstance(parents.get(id(node)), (ast.List, ast.Tuple)):
                continue
            group = _flag_group(src, node, parents, scope)
            if group is None:
                continue
            verdict = archflags.judge(archflags.nvcc_targets(group), "these nvcc flags",
                                      archflags.python_branch(src.tree, src.text, node))
            if verdict:
                verdicts.append((verdict, node))
    # 2. TORCH_CUDA_ARCH_LIST set from Python (unless every extension the file builds passes its
    # own arch flags to nvcc: torch then ignores the list)
    values, unknown = _torch_arch_values(src)
    if values and not unknown and (len({v.text for v, _ in values}) == 1 or _toolkit_alternatives(src, values)) \
            and not _extensions_choose_their_arch(src):
        for tok, node in values:
            verdict = archflags.judge(archflags.torch_arch_targets([tok]), "TORCH_CUDA_ARCH_LIST",
                                      archflags.python_branch(src.tree, src.text, node))
            if verdict:
                verdicts.append((verdict, node))
    shown: set[tuple] = set()
    for verdict, node in verdicts:
        start = verdict.anchor.start
        # one group reached from two of its lists (`[...] + macros + arch_flags`, and
        # `arch_flags = []` filled by appends) is one finding
        key = (start, node.lineno if start is None else None, verdict.message)  # type: ignore[attr-defined]
        if key in shown:
            continue
        shown.add(key)
        if start is not None:
            import bisect

            line = bisect.bisect_right(src.starts, start)
            col = start - src.starts[line - 1]
            byte_col = len(src.lines[line - 1][:col].encode("utf-8"))
        else:
            line, byte_col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        fix = Fix(SAFE, "add PTX for the newest target", verdict.edits) if verdict.edits else \
            Fix(DISPLAY_ONLY, verdict.hint)
        out.append(finding(src, node, "GPU006", verdict.message, fix, line=line, byte_col=byte_col))
    return out


def _string_toks(src: PySource, node: ast.AST) -> list[archflags.Tok] | None:
    """The whitespace-separated words of a string literal with their file offsets (offsets only
    where the literal spells its text verbatim)."""
    value = _str_const(node)
    if value is None:
        return None
    seg_start, seg_end = src.span(node)
    seg = src.text[seg_start:seg_end]
    toks = []
    exact = "\\" not in seg and value in seg and seg.count(value) == 1
    base = seg_start + seg.find(value) if exact else None
    for m in re.finditer(r"\S+", value):
        toks.append(archflags.Tok(m.group(), base + m.start() if base is not None else None))
    return toks


def _flag_group(src: PySource, lst: ast.AST, parents: dict[int, ast.AST], scope: ast.AST) \
        -> list[archflags.Tok] | None:
    """The flag words of a list literal plus everything concatenated with it or appended to the
    name it is assigned to (in the same scope); None when any of that is not a literal."""
    toks: list[archflags.Tok] = []
    resolving: set[str] = set()

    def add_literal(node: ast.AST) -> bool:
        if isinstance(node, (ast.List, ast.Tuple)):
            return all(add_literal(e) for e in node.elts)
        if _empty_list_call(node):
            return True  # `list()`: an empty list, filled by the appends that follow
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            # `[...] + generator_flag + cc_flag`: every part adds its words
            return add_literal(node.left) and add_literal(node.right)
        if isinstance(node, ast.Name) and node.id not in resolving:
            # `[...] + version_macros + cc_flag`: a list name of this scope, bound to a literal
            # (and appended to) before this use, adds its words
            resolving.add(node.id)
            try:
                return _named_list(src, node.id, node.lineno, scope, add_literal) or \
                    _parameter_list(src, node.id, scope, add_literal)
            finally:
                resolving.discard(node.id)
        words = _string_toks(src, node)
        if words is not None:
            toks.extend(words)
            return True
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            return not archflags.FLAG_HINT.search(text) and "sm_" not in text and "compute_" not in text
        if isinstance(node, ast.Constant):
            return True
        return False  # a name or call: could add architectures

    if not add_literal(lst):
        return None
    parent = parents.get(id(lst))
    # `flags + [...]`, `[...] + other`: everything concatenated belongs to the group
    while isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add):
        for side in (parent.left, parent.right):
            if side is not lst and not _contains(side, lst) and not add_literal(side):
                return None
        lst, parent = parent, parents.get(id(parent))
    name = None
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        name = dotted(parent.targets[0])
    elif isinstance(parent, ast.AugAssign):
        return None
    if not name:
        return toks
    scope_lines = set(range(scope.lineno, scope.end_lineno + 1)) if hasattr(scope, "end_lineno") else None  # type: ignore[attr-defined]
    pattern = re.compile(r"(?<![\w.])%s\b" % re.escape(name))
    lines = src.lines_matching(pattern)
    if scope_lines is not None:
        lines &= scope_lines
    for node, sc in src.nodes_on_lines(lines, (ast.Call, ast.AugAssign, ast.Assign, ast.BinOp, ast.Starred)):
        if sc is not scope and scope is not src.tree:
            continue
        if node is parent:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                dotted(node.func.value) == name and node.func.attr in ("append", "extend", "insert", "__iadd__"):
            for a in node.args[1:] if node.func.attr == "insert" else node.args:
                if not add_literal(a):
                    return None
        elif isinstance(node, ast.AugAssign) and dotted(node.target) == name:
            if not add_literal(node.value):
                return None
        elif isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets):
            if not _is_self_concat(node.value, name, add_literal):
                return None
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
                name in (dotted(node.left), dotted(node.right)):
            other = node.right if dotted(node.left) == name else node.left
            if not add_literal(other):
                return None
        elif isinstance(node, ast.Starred) and dotted(node.value) == name:
            return None
    return toks


def _named_list(src: PySource, name: str, line: int, scope: ast.AST, add_literal) -> bool:
    """Add the words of list `name` as it stands at `line`: its last assignment before the line in
    this scope (a literal list) and the appends / extends / += after it; False when that
    assignment is not a literal, is not found, or something else changes the list in between."""
    pattern = re.compile(r"(?<![\w.])%s\b" % re.escape(name))
    lines = {ln for ln in src.lines_matching(pattern) if ln < line}
    start = None
    for node, sc in src.nodes_on_lines(lines, (ast.Assign,)):
        if sc is scope and node.lineno < line and any(dotted(t) == name for t in node.targets) and \
                (start is None or node.lineno > start.lineno):
            start = node
    if start is None or not (isinstance(start.value, (ast.List, ast.Tuple)) or _empty_list_call(start.value)):
        return False
    if not add_literal(start.value):
        return False
    for node, sc in src.nodes_on_lines({ln for ln in lines if ln > start.end_lineno},  # type: ignore[operator]
                                       (ast.Call, ast.AugAssign, ast.Assign)):
        if sc is not scope or not (start.end_lineno < node.lineno < line):  # type: ignore[operator]
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and dotted(node.func.value) == name:
            if node.func.attr not in ("append", "extend") or not all(add_literal(a) for a in node.args):
                return False
        elif isinstance(node, ast.AugAssign) and dotted(node.target) == name:
            if not add_literal(node.value):
                return False
        elif isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets):
            return False
    return True


def _parameter_list(src: PySource, name: str, scope: ast.AST, add_literal) -> bool:
    """`def make_ext(..., extra_args=[]): nvcc = extra_args + ["-gencode=..."]`: a parameter of the
    enclosing function adds its default's words when every call of the function in the file leaves
    it out or passes a literal list with no architecture flag in it (`extra_args=["-w"]`)."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
            any(isinstance(n, (ast.Assign, ast.AugAssign)) and any(dotted(t) == name for t in
                (n.targets if isinstance(n, ast.Assign) else [n.target])) for n in ast.walk(scope)):
        return False
    a = scope.args
    positional = a.posonlyargs + a.args
    names = [p.arg for p in positional]
    defaults = dict(zip(names[len(names) - len(a.defaults):], a.defaults))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    default = defaults.get(name)
    if not isinstance(default, (ast.List, ast.Tuple)):
        return False
    index = names.index(name) if name in names else None
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == scope.name):
            continue
        if any(isinstance(x, ast.Starred) for x in node.args) or any(k.arg is None for k in node.keywords):
            return False
        passed = next((k.value for k in node.keywords if k.arg == name), None)
        if passed is None and index is not None and index < len(node.args):
            passed = node.args[index]
        if passed is None:
            continue
        if not isinstance(passed, (ast.List, ast.Tuple)) or \
                not all(isinstance(v, str) and not archflags.FLAG_HINT.search(v) for v in map(_str_const, passed.elts)):
            return False
    return add_literal(default)


_EXTENSIONS = {"CUDAExtension": "extra_compile_args", "load": "extra_cuda_cflags", "load_inline": "extra_cuda_cflags"}


def _extensions_choose_their_arch(src: PySource) -> bool:
    """Whether the file builds CUDA extensions and every one passes nvcc a flag with `arch` in it
    (`-gencode arch=compute_90,code=sm_90`, `-arch=sm_80`, `--gpu-architecture`): torch's
    cpp_extension then adds no architecture flags of its own (`_get_cuda_arch_flags` returns none
    when a flag of the extension's nvcc list contains 'arch'), so TORCH_CUDA_ARCH_LIST decides
    nothing for them. An extension whose nvcc flags cannot be read counts as not choosing."""
    calls = [n for n in ast.walk(src.tree) if isinstance(n, ast.Call) and _builds_extension(src, n)]
    return bool(calls) and all(_nvcc_flags_have_arch(src, c) for c in calls)


def _builds_extension(src: PySource, call: ast.Call) -> bool:
    """CUDAExtension(...), or torch's `load` / `load_inline` (not json.load: it is named through
    cpp_extension or given sources)."""
    name = call_name(call)
    return name == "CUDAExtension" or name in _EXTENSIONS and (
        "cpp_extension" in (src.qualname(call.func) or "") or
        any(k.arg in ("sources", "cuda_sources", "extra_cuda_cflags") for k in call.keywords))


def _nvcc_flags_have_arch(src: PySource, call: ast.Call) -> bool:
    keyword = _EXTENSIONS[call_name(call)]
    value = next((k.value for k in call.keywords if k.arg == keyword), None)
    if value is None:
        return False
    if keyword == "extra_compile_args":
        if isinstance(value, ast.Name):
            value = _last_dict(src, value.id)
        if not isinstance(value, ast.Dict):
            return False
        value = next((v for k, v in zip(value.keys, value.values) if k is not None and _str_const(k) == "nvcc"), None)
        if value is None:
            return False
    return _has_arch(src, value, set())


def _last_dict(src: PySource, name: str) -> ast.AST | None:
    found = None
    for st, _ in src.stmts:
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
            found = st.value
    return found


def _has_arch(src: PySource, value: ast.AST, seen: set[str]) -> bool:
    """A string with `arch` in the expression, or in what a list name it uses is bound or
    appended to anywhere in the file."""
    for node in ast.walk(value):
        text = _str_const(node)
        if text is not None and "arch" in text:
            return True
        if isinstance(node, ast.Name) and node.id not in seen:
            seen.add(node.id)
            for st, _ in src.stmts:
                if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in st.targets) \
                        or isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name) and st.target.id == node.id:
                    if _has_arch(src, st.value, seen):
                        return True
                elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                        isinstance(st.value.func, ast.Attribute) and st.value.func.attr in ("append", "extend", "insert") \
                        and isinstance(st.value.func.value, ast.Name) and st.value.func.value.id == node.id:
                    if any(_has_arch(src, a, seen) for a in st.value.args):
                        return True
    return False


def _empty_list_call(node: ast.AST) -> bool:
    """`list()`: an empty list spelt as a call."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list" and \
        not node.args and not node.keywords


def _contains(tree: ast.AST, node: ast.AST) -> bool:
    return any(n is node for n in walk([tree]))


def _is_self_concat(value: ast.AST, name: str, add_literal) -> bool:
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        left, right = dotted(value.left), dotted(value.right)
        if left == name:
            return add_literal(value.right)
        if right == name:
            return add_literal(value.left)
    return False


_TOOLKIT_TEST = re.compile(r"cuda\w*version|version\w*cuda|bare_metal|nvcc|CUDA_VERSION|version\.cuda|cuda_major|"
                           r"cuda_minor", re.I)
_DEVICE_TEST = re.compile(r"capabilit|device_name|get_device|gpu_name|nvidia-smi|\bsm_?\d|\barch\b", re.I)


def _toolkit_alternatives(src: PySource, values: list[tuple[archflags.Tok, ast.AST]]) -> bool:
    """Different TORCH_CUDA_ARCH_LIST values picked by the CUDA toolkit's version (apex's
    cross-compile defaults: `if bare_metal_major == 11: ... else: ...`) are each what a build gets
    with that toolkit, whatever GPU it later runs on: each is judged. Values picked by the GPU
    (`get_device_capability()`) are alternatives for the machine at hand and are left alone."""
    tests: list[str] = []
    for node in ast.walk(src.tree):
        if isinstance(node, ast.If) and any(node.body[0].lineno <= v.lineno <= node.end_lineno  # type: ignore
                                            for _, v in values):
            tests.append(ast.get_source_segment(src.text, node.test) or "")
    return any(_TOOLKIT_TEST.search(t) for t in tests) and not any(_DEVICE_TEST.search(t) for t in tests)


def _torch_arch_values(src: PySource) -> tuple[list[tuple[archflags.Tok, ast.AST]], bool]:
    key = "TORCH_CUDA_ARCH_LIST"
    values: list[tuple[archflags.Tok, ast.AST]] = []
    unknown = False

    def take(node: ast.AST) -> None:
        nonlocal unknown
        toks = _string_toks(src, node)
        if toks is None:
            unknown = True
            return
        value = _str_const(node) or ""
        start = toks[0].start - value.find(toks[0].text) if toks and toks[0].start is not None else None
        values.append((archflags.Tok(value, start), node))

    for node, _ in src.nodes_on_lines(src.lines_matching(key), (ast.Assign, ast.Call, ast.Dict)):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and _str_const(t.slice) == key:
                    take(node.value)
        elif isinstance(node, ast.Call):
            name = call_name(node)
            if name in ("setdefault", "putenv") and len(node.args) == 2 and _str_const(node.args[0]) == key:
                take(node.args[1])
            for kw in node.keywords:
                if kw.arg == key:
                    take(kw.value)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if k is not None and _str_const(k) == key:
                    take(v)
    return values, unknown
