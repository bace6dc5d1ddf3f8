"""A parsed Python file for the rules: the decoded text, the tree, positions in characters (ast
gives UTF-8 byte columns), name resolution through the file's imports, and small AST helpers.
"""
from __future__ import annotations

import ast
from typing import Iterator

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


class PySource:
    def __init__(self, path: str, text: str, tree: ast.Module) -> None:
        self.path = path
        self.text = text
        self.tree = tree
        self.lines = text.splitlines(keepends=True)
        self._starts: list[int] | None = None
        self.imports: dict[str, str] = {}  # local name -> qualified name
        self.import_nodes: list[ast.stmt] = []  # top-level import statements, in order
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.imports.setdefault(top, top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.import_nodes.append(node)

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

    def line_indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""
        return line[: len(line) - len(line.lstrip())]

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
        root = self.imports.get(node.id) or _CONVENTIONAL.get(node.id) or node.id
        return ".".join([root, *reversed(parts)])


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


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
