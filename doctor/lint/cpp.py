"""C++/CUDA parsed with a real grammar (tree-sitter and its CUDA grammar, a superset of C++), for
the C++ rules: function definitions wherever they sit (namespaces, classes, templates, `extern
"C"`), lambdas handed to a binding (`m.def("f", [](torch::Tensor a) {...})`), calls, kernel
launches (`k<<<grid, block>>>(...)`), `#define`d macros (their bodies parsed too, so a commented-out
line inside a macro checks nothing) and `#include`s.

What it does not do: preprocess. Macros are not expanded where they are used (the rules read a
macro's body when it is called), `#if` branches are all parsed as written, and code that only
makes sense after expansion (a function whose signature comes from a macro) is seen in the shape
tree-sitter gives it, with local ERROR nodes where it cannot; types are names, not resolved.

Node positions are byte offsets; `pos` turns one into the 1-based line and the 1-based column in
characters that findings carry.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from gpudoctor.lint.model import NotLinted

Node = Any  # tree_sitter.Node (the module is imported only when a file is parsed)


class ParserUnavailable(NotLinted):
    """tree-sitter or its CUDA grammar cannot be loaded: the C++ rules cannot run."""


_PARSER: Any = None


def parser() -> Any:
    """The process's one parser (loaded on first use: `gpudoctor explain` never pays for it)."""
    global _PARSER
    if _PARSER is None:
        try:
            import tree_sitter
            import tree_sitter_cuda

            _PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))
        except Exception as exc:  # noqa: BLE001 (ImportError, an incompatible grammar ABI: ValueError)
            raise ParserUnavailable(
                f"not linted for GPU009/GPU010: the C++/CUDA parser cannot be loaded ({type(exc).__name__}: {exc}); "
                "reinstall gpudoctor (it needs tree-sitter and tree-sitter-cuda)") from None
    return _PARSER


def parse_bytes(data: bytes) -> Any:
    return parser().parse(data)


# --- small helpers over nodes --------------------------------------------------------------------


def walk(node: Node, skip: frozenset[str] = frozenset()) -> Iterator[Node]:
    """Every named node under `node` (itself included), depth first in source order; the
    subtrees of nodes whose type is in `skip` are not entered. Punctuation and keywords are
    left out: read them through their parent (`child_by_field_name("operator")`)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if skip and n.type in skip and n is not node:
            continue
        children = n.named_children
        if children:
            stack.extend(reversed(children))


def leaves(node: Node) -> list[Node]:
    """The tokens under a node, in source order (a string literal gives its quotes and content)."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        children = n.children
        if children:
            stack.extend(reversed(children))
        else:
            out.append(n)
    return out


def words(node: Node) -> list[str]:
    """The token texts under a node, comments left out."""
    return [text_of(n) for n in leaves(node) if n.type != "comment"]


def text_of(node: Node) -> str:
    return node.text.decode("utf-8", "surrogateescape") if node is not None else ""


def last_name(node: Node | None) -> str:
    """The plain name a callee or declarator ends in: `f`, `ns::f` and `f<T>` give "f",
    `obj.f` / `p->f` give "f" (see `is_member`)."""
    while node is not None:
        t = node.type
        if t in ("identifier", "field_identifier", "type_identifier", "namespace_identifier", "destructor_name"):
            return text_of(node)
        if t == "qualified_identifier":
            node = node.child_by_field_name("name")
        elif t in ("template_function", "template_method", "template_type"):
            node = node.child_by_field_name("name")
        elif t == "field_expression":
            node = node.child_by_field_name("field")
        elif t == "parenthesized_expression" and node.named_child_count == 1:
            node = node.named_children[0]
        else:
            return ""
    return ""


def callee(call: Node) -> tuple[str, bool]:
    """(name, is a member call) of a call_expression: `torch::empty(...)` ("empty", False),
    `x.contiguous()` ("contiguous", True), `k<float><<<g, b>>>(...)` ("k", False)."""
    fn = call.child_by_field_name("function")
    if fn is None:
        return "", False
    return last_name(fn), fn.type == "field_expression"


def arguments(call: Node) -> list[Node]:
    """The argument expressions of a call (comments left out)."""
    args = call.child_by_field_name("arguments")
    if args is None:
        return []
    return [a for a in args.named_children if a.type != "comment"]


def declarator_name(node: Node | None) -> str:
    """The name a (parameter or variable) declarator declares: through `&x`, `*x`, `x[]`, `x = v`."""
    while node is not None:
        t = node.type
        if t in ("identifier", "field_identifier"):
            return text_of(node)
        if t in ("reference_declarator", "pointer_declarator", "array_declarator", "init_declarator",
                 "parenthesized_declarator", "attributed_declarator"):
            inner = node.child_by_field_name("declarator")
            if inner is None:  # reference_declarator has no field name for its declarator
                named = [c for c in node.named_children if c.type not in ("type_qualifier", "ms_pointer_modifier")]
                inner = named[-1] if named else None
            node = inner
        else:
            return ""
    return ""


# --- functions ------------------------------------------------------------------------------------

_NOT_TENSOR = re.compile(r"\bTensor(List|Options|Arg|Iterator|Accessor|Ref|Impl|Base\w)|<")


@dataclass
class Param:
    name: str
    type: str  # the type as written, without the declarator (`const at::Tensor`)
    tensor: bool  # a Tensor by value or reference (not a pointer, a list, an optional)


@dataclass
class Function:
    name: str  # the last part of its name (`ns::Foo<T>::run` -> "run"); a bound lambda: "<lambda f>"
    params: list[Param]
    body: Node
    node: Node
    line: int
    shown: str = ""  # how a finding names it ("fwd()", "the lambda bound as \"f\"")


def _param(node: Node) -> Param | None:
    if node.type not in ("parameter_declaration", "optional_parameter_declaration"):
        return None
    type_node = node.child_by_field_name("type")
    declarator = node.child_by_field_name("declarator")
    name = declarator_name(declarator)
    type_text = " ".join(text_of(c) for c in node.children
                         if c is not declarator and c.type not in ("=",) and c != node.child_by_field_name("default_value"))
    pointer = declarator is not None and _has_pointer(declarator)
    base = last_name(type_node) if type_node is not None else ""
    tensor = base == "Tensor" and not pointer and not _NOT_TENSOR.search(type_text)
    return Param(name, type_text, tensor)


def _has_pointer(declarator: Node) -> bool:
    node = declarator
    while node is not None:
        if node.type in ("pointer_declarator", "array_declarator"):
            return True
        named = node.named_children
        node = node.child_by_field_name("declarator") or (named[-1] if named and node.type == "reference_declarator"
                                                          else None)
    return False


def params_of(parameter_list: Node | None) -> list[Param]:
    if parameter_list is None:
        return []
    out = []
    for c in parameter_list.named_children:
        p = _param(c)
        if p is not None:
            out.append(p)
    return out


def _function_declarator(node: Node | None) -> Node | None:
    """The function_declarator inside a definition's declarator (`T& f(...)`, `T* f(...)`)."""
    while node is not None and node.type != "function_declarator":
        inner = node.child_by_field_name("declarator")
        if inner is None:
            named = [c for c in node.named_children if c.type not in ("type_qualifier",)]
            inner = named[-1] if named and node.type in ("reference_declarator", "pointer_declarator") else None
        node = inner
    return node


# --- the parsed file ------------------------------------------------------------------------------

_DEFINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.M)
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_LITERALS = frozenset({"comment", "string_literal", "raw_string_literal", "char_literal", "system_lib_string",
                       "concatenated_string"})


_MACRO_PREFIX = b"void __gpudoctor_macro__() {\n"


@dataclass
class Macro:
    name: str
    params: list[str] | None  # None: an object-like macro
    body: str  # the replacement text, continuations joined (comments still in it: see `body_tree`)
    line: int
    _tree: Any = field(default=None, repr=False)

    def words(self) -> list[str]:
        """The body's tokens, comments left out (`(1024 * 1024)` -> "(", "1024", "*", ...)."""
        root = self.body_tree()
        start = len(_MACRO_PREFIX)
        end = start + len(self.body.encode("utf-8", "surrogateescape"))
        return [text_of(n) for n in leaves(root) if start <= n.start_byte < end and n.type != "comment"]

    def body_tree(self) -> Node:
        """The body parsed as the statements of a function, so that comments and strings in it
        are what they are (`CHECK_CUDA(x); // CHECK_CONTIGUOUS(x)` calls one macro)."""
        if self._tree is None:
            self._tree = parse_bytes(_MACRO_PREFIX + self.body.encode("utf-8", "surrogateescape") + b"\n;}\n")
        return self._tree.root_node


class CppFile:
    """One C++/CUDA file, parsed."""

    def __init__(self, text: str, data: bytes | None = None):
        self.text = text
        self.data = data if data is not None else text.encode("utf-8", "surrogateescape")
        self.tree = parse_bytes(self.data)
        self.root = self.tree.root_node
        self._macros: dict[str, Macro] | None = None
        self._functions: list[Function] | None = None

    # positions
    def pos(self, node_or_byte: Node | int) -> tuple[int, int]:
        """1-based line and column (in characters) of a node's start or of a byte offset."""
        offset = node_or_byte if isinstance(node_or_byte, int) else node_or_byte.start_byte
        line_start = self.data.rfind(b"\n", 0, offset) + 1
        line = self.data.count(b"\n", 0, offset) + 1 if isinstance(node_or_byte, int) else node_or_byte.start_point[0] + 1
        col = len(self.data[line_start:offset].decode("utf-8", "surrogateescape")) + 1
        return line, col

    def in_literal(self, offset: int) -> bool:
        """Whether a byte offset falls inside a comment, a string or a character literal."""
        node = self.root.descendant_for_byte_range(offset, offset + 1)
        while node is not None:
            if node.type in _LITERALS:
                return True
            node = node.parent
        return False

    # preprocessor
    @property
    def macros(self) -> dict[str, Macro]:
        """`#define`s of this file by name (the last definition wins), found where the parser
        sees a directive (never in a comment or string)."""
        if self._macros is None:
            self._macros = {}
            if b"define" in self.data:
                for m in _DEFINE.finditer(self.data):
                    if self.in_literal(m.start(1)):
                        continue
                    macro = _read_macro(self.data, m.start(), m.end(), m.group(1).decode("ascii"))
                    if macro is not None:
                        self._macros[macro.name] = macro
        return self._macros

    @property
    def includes(self) -> list[str]:
        return [m.group(1).decode("utf-8", "surrogateescape").strip() for m in _INCLUDE.finditer(self.data)
                if not self.in_literal(m.start() + m.group(0).index(b"#"))]

    # functions
    def functions(self) -> list[Function]:
        """Every function definition (methods, templates, kernels; nested ones too), in source
        order. Lambdas are part of the function they are written in (see `bound_lambdas`)."""
        if self._functions is None:
            out = []
            for node in self.find("function_definition"):
                fd = _function_declarator(node.child_by_field_name("declarator"))
                body = node.child_by_field_name("body")
                if fd is None or body is None:
                    continue
                name_node = fd.child_by_field_name("declarator")
                name = last_name(name_node)
                if not name or (name_node is not None and name_node.type == "operator_name"):
                    continue
                out.append(Function(name, params_of(fd.child_by_field_name("parameters")), body, node,
                                    node.start_point[0] + 1, f"{name}()"))
            self._functions = out
        return self._functions

    def find(self, *types: str) -> list[Node]:
        """The nodes of these types in the file, in source order (a query: the search runs in C)."""
        return _captures(self.root, types)


def _captures(root: Node, types: tuple[str, ...]) -> list[Node]:
    query = _query(types)
    if query is None:
        return [n for n in walk(root) if n.type in types]
    import tree_sitter

    found = tree_sitter.QueryCursor(query).captures(root)
    nodes = [n for group in found.values() for n in group]
    nodes.sort(key=lambda n: n.start_byte)
    return nodes


_QUERIES: dict[tuple[str, ...], Any] = {}


def _query(types: tuple[str, ...]) -> Any:
    if types not in _QUERIES:
        import tree_sitter

        try:
            _QUERIES[types] = tree_sitter.Query(parser().language, " ".join(f"({t}) @n" for t in types))
        except Exception:  # noqa: BLE001 (a node type this grammar does not have: walk instead)
            _QUERIES[types] = None
    return _QUERIES[types]


def _read_macro(data: bytes, start: int, name_end: int, name: str) -> Macro | None:
    end = _directive_end(data, name_end)
    rest = data[name_end:end].decode("utf-8", "surrogateescape").replace("\\\r\n", " ").replace("\\\n", " ")
    params: list[str] | None = None
    if rest.startswith("("):  # function-like only when "(" follows the name directly
        close = rest.find(")")
        if close < 0:
            return None
        params = [p.strip() for p in rest[1:close].split(",") if p.strip()]
        params = ["__VA_ARGS__" if p == "..." else p for p in params]
        rest = rest[close + 1:]
    line = data.count(b"\n", 0, start) + 1
    return Macro(name, params, rest.strip(), line)


def _directive_end(data: bytes, pos: int) -> int:
    """The end of a directive's logical line: backslash continuations, and a block comment that
    runs past the end of the line."""
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return len(data)
        if data[nl - 1:nl] == b"\\" or data[nl - 2:nl] == b"\\\r":
            pos = nl + 1
            continue
        start_comment = data.find(b"/*", pos, nl)
        if start_comment >= 0 and data.find(b"//", pos, start_comment) < 0:
            close = data.find(b"*/", start_comment + 2)
            if close > nl:
                pos = close + 2
                continue
        return nl
