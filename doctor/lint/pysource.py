"""A parsed Python file for the rules: the decoded text, the tree, positions in characters (ast
gives UTF-8 byte columns), name resolution through the file's imports, and a statement index.

Walking every expression of a large file costs more than parsing it, so the rules do not: the
index lists statements only (in source order, each with its enclosing function), and a rule that
looks for a call or a literal first finds the lines whose text mentions it, then walks just the
statements on those lines (`nodes_on_lines`). The dataflow rules run per function, and only on
functions whose own text has what they look for.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator

from gpudoctor.lint.model import Finding, Fix

# Names that mean these modules even where the file never imports them (snippets, notebooks
# exported to .py, star imports).
_CONVENTIONAL = {
    "torch": "torch",
    "F": "torch.nn.functional",
    "nn": "torch.nn",
    "xformers": "xformers",
    "xops": "xformers.ops",
    "einops": "einops",
}
# What `from M import *` brings that the rules look for (the modules' __all__ or public names).
# A star import binds nothing else we could know without reading M.
_STAR_EXPORTS = {
    "torch.backends.cuda": frozenset({"sdp_kernel"}),
    "torch.nn.functional": frozenset({"scaled_dot_product_attention", "softmax"}),
    "torch.nn": frozenset({"Parameter", "Module", "Linear", "Conv2d", "LayerNorm", "Embedding"}),
    "flash_attn": frozenset({"flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
                             "flash_attn_with_kvcache", "flash_attn_varlen_func"}),
    "flash_attn.flash_attn_interface": frozenset({"flash_attn_func", "flash_attn_kvpacked_func",
                                                  "flash_attn_qkvpacked_func", "flash_attn_with_kvcache",
                                                  "flash_attn_varlen_func"}),
    "xformers.ops": frozenset({"memory_efficient_attention"}),
}
_BODIES = ("body", "orelse", "finalbody")
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
             ast.With, ast.AsyncWith, ast.Try, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_SKIP = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)

Scope = ast.AST  # a FunctionDef / AsyncFunctionDef, or the Module


class PySource:
    def __init__(self, path: str, text: str, tree: ast.Module, module: str | None = None,
                 is_package: bool = False) -> None:
        self.path = path
        self.text = text
        self.tree = tree
        # the dotted module name (gpudoctor.lint.project.module_name), for relative imports and
        # the project pass; None when the file is not inside a package
        self.module = module
        self.is_package = is_package
        self.relative: dict[str, str] = {}  # local name -> absolute name of a relative import
        self.local_relative: dict[str, str] = {}  # the same, for relative imports inside functions
        self.lines = text.splitlines(keepends=True)
        self.newline = "\r\n" if "\r\n" in text[:4096] else "\n"
        self._starts: list[int] | None = None
        self.imports: dict[str, str] = {}  # local name -> qualified name (imports and module-level aliases)
        self.shadowed: set[str] = set()  # module-level names the file binds itself (def, class, assignment)
        self.star_modules: list[str] = []  # `from M import *`
        self._conflicts: set[str] = set()
        # imports inside functions bind names in that function only: (function, {local: qual})
        self._scoped: list[tuple[ast.AST, dict[str, str]]] = []
        self._scoped_names: set[str] = set()
        self.import_nodes: list[ast.stmt] = []  # top-level import statements, in order
        self.stmts: list[tuple[ast.stmt, Scope]] = []  # every statement, source order
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.classes: list[ast.ClassDef] = []
        self._index(tree.body, tree)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.import_nodes.append(node)
        self._bind_module_names(tree)

    def _index(self, body: list[ast.stmt], scope: Scope) -> None:
        for s in body:
            self.stmts.append((s, scope))
            t = type(s)
            if t is ast.Import:
                for a in s.names:  # type: ignore[attr-defined]
                    if a.asname:
                        self._bind_import(a.asname, a.name, scope)
                    else:
                        top = a.name.split(".")[0]
                        self.imports.setdefault(top, top)
            elif t is ast.ImportFrom:
                if s.module and not s.level:  # type: ignore[attr-defined]
                    for a in s.names:  # type: ignore[attr-defined]
                        if a.name != "*":
                            self._bind_import(a.asname or a.name, f"{s.module}.{a.name}", scope)  # type: ignore[attr-defined]
                        else:
                            self.star_modules.append(s.module)  # type: ignore[attr-defined]
                else:  # a relative import: a module of this project, known only to the project pass
                    base = self._relative_base(s.level, s.module)  # type: ignore[attr-defined]
                    for a in s.names:  # type: ignore[attr-defined]
                        if a.name != "*":
                            self._conflicts.add(a.asname or a.name)
                            if base is not None and scope is self.tree:
                                self.relative[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
                            elif base is not None:  # inside a function (an optional import)
                                self.local_relative.setdefault(a.asname or a.name, f"{base}.{a.name}" if base else a.name)
            elif t in (ast.FunctionDef, ast.AsyncFunctionDef):
                self.functions.append(s)  # type: ignore[arg-type]
                self._index(s.body, s)  # type: ignore[attr-defined]
                continue
            elif t is ast.ClassDef:
                self.classes.append(s)  # type: ignore[arg-type]
                self._index(s.body, scope)  # type: ignore[attr-defined]
                continue
            if isinstance(s, _COMPOUND):
                for name in _BODIES:
                    inner = getattr(s, name, None)
                    if inner:
                        self._index(inner, scope)
                for h in getattr(s, "handlers", ()) or ():
                    self._index(h.body, scope)
                for case in getattr(s, "cases", ()) or ():
                    self._index(case.body, scope)

    def _relative_base(self, level: int, name: str | None) -> str | None:
        """The absolute package a `from ..x import y` imports from, or None outside a package."""
        if not self.module:
            return None
        parts = self.module.split(".")
        if not self.is_package:
            parts = parts[:-1]
        if level - 1 > len(parts):
            return None
        parts = parts[:len(parts) - (level - 1)]
        return ".".join(parts + ([name] if name else []))

    def qualify(self, name: str) -> str | None:
        """The absolute name of a module-level name of this file: its own def or class, or what it
        imports (absolutely or relatively); None for anything else."""
        if name in self.relative:
            return self.relative[name]
        if name in self.imports and name not in self.shadowed:
            return self.imports[name]
        if self.module and any(getattr(n, "name", None) == name for n in self.tree.body
                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))):
            return f"{self.module}.{name}"
        return None

    def qualify_anywhere(self, name: str) -> str | None:
        """`qualify`, or else what a relative import inside one of the file's functions binds the
        name to (`from .distributed import sp_forward` under `if use_sp:`)."""
        return self.qualify(name) or self.local_relative.get(name)

    def _bind_import(self, local: str, qual: str, scope: Scope) -> None:
        """Two imports of one name (try: from flash_attn.flash_attn_interface import f / except:
        from flash_attn import f) agree when they name the same function; otherwise the name is
        not followed, except inside a function that imports it itself."""
        if scope is not self.tree:
            if not self._scoped or self._scoped[-1][0] is not scope:
                self._scoped.append((scope, {}))
            self._scoped[-1][1][local] = qual
            self._scoped_names.add(local)
        old = self.imports.get(local)
        if old is not None and old != qual and old.rsplit(".", 1)[-1] != qual.rsplit(".", 1)[-1]:
            self._conflicts.add(local)
        self.imports.setdefault(local, qual)

    def _bind_module_names(self, tree: ast.Module) -> None:
        """Names as Python binds them at module level, before any rule looks at a call: a def,
        class or assignment shadows an import of the same name (the name is not followed), a
        constant assigned in a fallback (`flash_attn_func = None` when the import fails) does
        not, and a name assigned once from a dotted name (`attention = F.scaled_dot_product_attention`,
        `F = torch.nn.functional`) is an alias of what that name refers to."""
        bound: dict[str, int] = {}
        aliases: dict[str, list[ast.expr]] = {}
        stack: list[ast.stmt] = list(tree.body)

        def names(target: ast.AST) -> list[str]:
            if isinstance(target, ast.Name):
                return [target.id]
            if isinstance(target, (ast.Tuple, ast.List)):
                return [n for e in target.elts for n in names(e)]
            if isinstance(target, ast.Starred):
                return names(target.value)
            return []

        while stack:
            st = stack.pop()
            t = type(st)
            if t in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
                bound[st.name] = bound.get(st.name, 0) + 1  # type: ignore[attr-defined]
                continue
            if t is ast.Assign:
                for target in st.targets:  # type: ignore[attr-defined]
                    value = st.value  # type: ignore[attr-defined]
                    if isinstance(target, ast.Name) and isinstance(value, (ast.Attribute, ast.Name)):
                        aliases.setdefault(target.id, []).append(value)
                    elif not (isinstance(target, ast.Name) and isinstance(value, ast.Constant)):
                        for n in names(target):
                            bound[n] = bound.get(n, 0) + 1
            elif t in (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor):
                for n in names(st.target):  # type: ignore[attr-defined]
                    bound[n] = bound.get(n, 0) + 1
            elif t in (ast.With, ast.AsyncWith):
                for item in st.items:  # type: ignore[attr-defined]
                    for n in names(item.optional_vars) if item.optional_vars is not None else ():
                        bound[n] = bound.get(n, 0) + 1
            for field in _BODIES:
                stack.extend(getattr(st, field, None) or ())
            for h in getattr(st, "handlers", ()) or ():
                stack.extend(h.body)
            for case in getattr(st, "cases", ()) or ():
                stack.extend(case.body)
        self.shadowed = set(bound) | self._conflicts
        for name in self.shadowed:
            self.imports.pop(name, None)
        for _ in range(2):  # an alias of an alias
            for name, values in aliases.items():
                if name in self.shadowed or len(values) != 1 or name in self.imports:
                    continue
                root = values[0]
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and (root.id in self.imports or root.id in _CONVENTIONAL) and \
                        root.id not in self.shadowed and root.id != name:
                    self.imports[name] = self.qualname(values[0]) or ""
        for name, values in aliases.items():
            if name not in self.imports:
                self.shadowed.add(name)

    def spellings(self, qual: str) -> set[str]:
        """The names this file may call `qual` by: its last part (through any module alias) and
        every local name bound to exactly it."""
        return {qual.rsplit(".", 1)[-1]} | {n for n, q in self.imports.items() if q == qual} | \
            {n for _, table in self._scoped for n, q in table.items() if q == qual}

    def scope_statements(self, scope: Scope) -> list[ast.stmt]:
        """The statements of one function (or of the module outside functions), in order."""
        if not hasattr(self, "_by_scope"):
            by: dict[int, list[ast.stmt]] = {}
            for st, sc in self.stmts:
                by.setdefault(id(sc), []).append(st)
            self._by_scope = by
        return self._by_scope.get(id(scope), [])

    # --- text ------------------------------------------------------------------------------

    def lines_matching(self, pattern: re.Pattern[str] | str) -> set[int]:
        """1-based numbers of the lines where `pattern` (a regex or a plain string) matches."""
        if isinstance(pattern, str):
            if pattern not in self.text:
                return set()
            pattern = re.compile(re.escape(pattern))
        import bisect

        starts = self.starts
        return {bisect.bisect_right(starts, m.start()) for m in pattern.finditer(self.text)}

    def scope_text(self, node: ast.AST) -> str:
        start = node.lineno - 1  # type: ignore[attr-defined]
        end = node.end_lineno  # type: ignore[attr-defined]
        return "".join(self.lines[start:end])

    # --- targeted walks --------------------------------------------------------------------

    def nodes_on_lines(self, lines: set[int], types: tuple[type, ...]) -> Iterator[tuple[ast.AST, Scope]]:
        """Nodes of these types in the statements that overlap these lines (a compound
        statement contributes its header: the test, the iterable, the with-items, decorators),
        each with the enclosing scope."""
        if not lines:
            return
        lo, hi = min(lines), max(lines)
        for s, scope in self.stmts:
            if s.end_lineno < lo or s.lineno > hi:  # type: ignore[operator]
                continue
            if isinstance(s, _COMPOUND):
                header_end = s.body[0].lineno - 1 if getattr(s, "body", None) else s.end_lineno  # type: ignore[attr-defined]
                if not any(s.lineno <= ln <= header_end for ln in lines):  # type: ignore[operator]
                    continue
                roots = [getattr(s, f) for f in s._fields if f not in _BODIES + ("handlers", "cases")]
            else:
                if not any(s.lineno <= ln <= s.end_lineno for ln in lines):  # type: ignore[operator]
                    continue
                roots = [s]
            for node in walk(roots):
                if isinstance(node, types):
                    yield node, scope


    # --- positions -------------------------------------------------------------------------

    @property
    def starts(self) -> list[int]:
        if self._starts is None:
            starts, pos = [], 0
            for line in self.lines:
                starts.append(pos)
                pos += len(line)
            starts.append(pos)
            self._starts = starts
        return self._starts

    def char_col(self, lineno: int, byte_col: int) -> int:
        """0-based character column of a UTF-8 byte column on a 1-based line."""
        if lineno < 1 or lineno > len(self.lines):
            return byte_col
        line = self.lines[lineno - 1]
        if line.isascii():
            return byte_col
        return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def offset(self, lineno: int, byte_col: int) -> int:
        """Character offset in the text of a (1-based line, UTF-8 byte column) position."""
        if lineno > len(self.lines):
            return len(self.text)
        return self.starts[lineno - 1] + self.char_col(lineno, byte_col)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    # --- names -----------------------------------------------------------------------------

    def qualname(self, node: ast.AST) -> str | None:
        """`torch.backends.cuda.sdp_kernel` for an expression spelling it through any import
        alias; None for anything that is not a dotted name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        name = node.id
        root = self.imports.get(name)
        if name in self._scoped_names:
            line = getattr(node, "lineno", 0)
            inner = None
            for fn, table in self._scoped:
                if name in table and fn.lineno <= line <= fn.end_lineno and \
                        (inner is None or fn.lineno > inner[0].lineno):  # type: ignore[attr-defined]
                    inner = (fn, table)
            if inner is not None:
                root = inner[1][name]
        if root is None and name not in self.shadowed:
            root = _CONVENTIONAL.get(name)
            if root is None and self.star_modules:
                root = next((f"{m}.{name}" for m in self.star_modules if name in _STAR_EXPORTS.get(m, ())), None)
        return ".".join([root or name, *reversed(parts)])


def walk(roots) -> Iterator[ast.AST]:
    """Every node under these roots (a faster ast.walk that skips operator and context nodes)."""
    stack = [r for r in roots if isinstance(r, ast.AST)] + [x for r in roots if isinstance(r, list)
                                                             for x in r if isinstance(x, ast.AST)]
    while stack:
        node = stack.pop()
        yield node
        for name in node._fields:
            v = getattr(node, name, None)
            if type(v) is list:
                for x in v:
                    if isinstance(x, ast.AST) and not isinstance(x, _SKIP):
                        stack.append(x)
            elif isinstance(v, ast.AST) and not isinstance(v, _SKIP):
                stack.append(v)


def dotted(node: ast.AST) -> str | None:
    """`self.attn.heads` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def call_name(call: ast.Call) -> str:
    """The last name of what is called: `softmax` for F.softmax / x.softmax / self.softmax."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return ""


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def int_const(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_const(node.operand)
        return -inner if inner is not None else None
    return None


def finding(src: PySource, node: ast.AST, code: str, message: str, fix: Fix,
            line: int | None = None, byte_col: int | None = None) -> Finding:
    """A finding of rule `code` spanning `node` (or starting at `line`/`byte_col`), with columns
    counted in characters as editors and SARIF count them."""
    from gpudoctor.lint.rules import BY_CODE  # here, not at the top: the rule modules import this one

    lineno = line if line is not None else node.lineno  # type: ignore[attr-defined]
    col = byte_col if byte_col is not None else node.col_offset  # type: ignore[attr-defined]
    end_line = getattr(node, "end_lineno", lineno) or lineno
    end_col = src.char_col(end_line, getattr(node, "end_col_offset", col) or col) + 1
    return Finding(path=src.path, line=lineno, col=src.char_col(lineno, col) + 1, code=code,
                   kb_id=BY_CODE[code].kb_id, message=message, fix=fix, end_line=end_line, end_col=end_col)


def short(src: PySource, node: ast.AST, limit: int = 60) -> str:
    text = " ".join(src.segment(node).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def any_of(names: set[str]) -> re.Pattern[str]:
    """Lines worth walking for any of these names (a substring test: the walk decides)."""
    return re.compile("|".join(map(re.escape, sorted(names))))
