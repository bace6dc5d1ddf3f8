"""A C++/CUDA tokenizer for the lint rules, precise where it matters and nothing more: comments,
string and character literals (raw strings included) never produce tokens, preprocessor
directives are set aside (macro definitions are kept as text), and function definitions are
found from their `name ( params ) ... {` shape with balanced brackets.

This is not a C++ parser; the rules built on it only claim what the token stream shows plainly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r"""
  (?P<ws>[ \t\r\f\v]+|\\\r?\n)
| (?P<nl>\n)
| (?P<lc>//[^\n]*)
| (?P<bc>/\*.*?(?:\*/|\Z))
| (?P<str>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*"?)
| (?P<chr>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*'?)
| (?P<id>[A-Za-z_]\w*)
| (?P<num>\.?\d(?:[eEpP][+-]|[\w.'])*)
| (?P<op>::|->|<<<|>>>|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^!~<>=?:;,.(){}\[\]\#])
| (?P<other>.)
""", re.S | re.X)

_RAW_PREFIXES = {"R", "u8R", "uR", "UR", "LR"}
_RAW_OPEN = re.compile(r'"([^()\\\s"]{0,16})\(')
_CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "static_assert",
            "__launch_bounds__", "defined", "noexcept", "throw", "new", "delete", "alignas", "typeid", "requires",
            "__attribute__", "__declspec", "operator"}
_QUALIFIERS = {"const", "override", "final", "noexcept", "mutable", "volatile", "&", "&&", "__host__", "__device__",
               "throw", "try"}


@dataclass(frozen=True)
class Tok:
    kind: str  # id | num | op | str | chr
    text: str
    start: int


@dataclass
class Function:
    name: str
    params: list[tuple[list[str], str]]  # (type words, name)
    body: tuple[int, int]  # token index of "{" and of its "}"
    line: int


@dataclass
class CppFile:
    text: str
    tokens: list[Tok]
    directives: list[tuple[str, str, int]]  # (name, rest of the line, offset)
    macros: dict[str, str] = field(default_factory=dict)  # name -> body text
    _lines: list[int] | None = None

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        if self._lines is None:
            self._lines = [m.start() for m in re.finditer(r"^", self.text, re.M)]
        import bisect

        i = bisect.bisect_right(self._lines, offset) - 1
        return i + 1, offset - self._lines[i] + 1


def tokenize(text: str) -> CppFile:
    tokens: list[Tok] = []
    directives: list[tuple[str, str, int]] = []
    line_start = True
    pos, n = 0, len(text)
    match = _TOKEN.match
    while pos < n:
        m = match(text, pos)
        if m is None:  # cannot happen (the last alternative matches any character)
            pos += 1
            continue
        kind = m.lastgroup
        if kind == "ws" or kind in ("lc", "bc"):
            pos = m.end()
            continue
        if kind == "nl":
            line_start = True
            pos = m.end()
            continue
        if kind == "op" and m.group() == "#" and line_start:
            end = _directive_end(text, m.end())
            body = _strip_comments(text[m.end():end])
            dm = re.match(r"\s*(\w+)(.*)", body, re.S)
            if dm:
                directives.append((dm.group(1), dm.group(2), m.start()))
            pos = end
            continue
        line_start = False
        if kind == "id" and m.group() in _RAW_PREFIXES and text.startswith('"', m.end()):
            # R"delim( ... )delim": found with str.find, so an unterminated one costs O(n) once
            dm = _RAW_OPEN.match(text, m.end())
            if dm:
                close = text.find(")" + dm.group(1) + '"', dm.end())
                end = n if close < 0 else close + len(dm.group(1)) + 2
                tokens.append(Tok("str", text[m.start():end], m.start()))
                pos = end
                continue
        tokens.append(Tok(kind, m.group(), m.start()))
        pos = m.end()
    cpp = CppFile(text, tokens, directives)
    for name, rest, _ in directives:
        if name == "define":
            dm = re.match(r"\s*([A-Za-z_]\w*)(\([^)]*\))?(.*)", rest, re.S)
            if dm:
                cpp.macros[dm.group(1)] = dm.group(3).replace("\\\n", " ")
    return cpp


def _directive_end(text: str, pos: int) -> int:
    while True:
        nl = text.find("\n", pos)
        if nl < 0:
            return len(text)
        # a comment may hide a backslash; a continuation is a backslash right before the newline
        if text[nl - 1:nl] == "\\" or text[nl - 2:nl] == "\\\r":
            pos = nl + 1
            continue
        start_comment = text.find("/*", pos, nl)
        if start_comment >= 0:
            close = text.find("*/", start_comment + 2)
            if close > nl:
                pos = close + 2
                continue
        return nl


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def match_brackets(tokens: list[Tok]) -> list[int]:
    """For every bracket token, the index of its partner (-1 when unbalanced)."""
    partner = [-1] * len(tokens)
    stack: list[int] = []
    opening = {"(": ")", "[": "]", "{": "}"}
    for i, t in enumerate(tokens):
        if t.kind != "op":
            continue
        if t.text in opening:
            stack.append(i)
        elif t.text in (")", "]", "}"):
            # pop to the matching opener (tolerate stray brackets from macros)
            for k in range(len(stack) - 1, -1, -1):
                if opening[tokens[stack[k]].text] == t.text:
                    j = stack[k]
                    del stack[k:]
                    partner[i], partner[j] = j, i
                    break
    return partner


def functions(cpp: CppFile, partner: list[int] | None = None) -> list[Function]:
    """Function definitions (not lambdas, not constructors with init lists)."""
    toks = cpp.tokens
    partner = partner if partner is not None else match_brackets(toks)
    out: list[Function] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "op" and t.text == "{" and partner[i] > i:
            fn = _function_at(cpp, toks, partner, i)
            if fn is not None:
                out.append(fn)
                i = partner[i] + 1  # nested lambdas belong to this body
                continue
        i += 1
    return out


def _function_at(cpp: CppFile, toks: list[Tok], partner: list[int], brace: int) -> Function | None:
    j = brace - 1
    # skip qualifiers and a trailing return type: ") const noexcept -> T {"
    while j >= 0:
        tj = toks[j]
        if tj.text in _QUALIFIERS:
            j -= 1
        elif tj.text == ")" and toks[partner[j] - 1].text == "noexcept" if partner[j] > 0 else False:
            j = partner[j] - 2
        elif tj.kind == "id" and j > 0 and toks[j - 1].text in ("->", "::", "<", ",") and tj.text not in _CONTROL:
            # part of a trailing return type: walk back to "->"
            k = j
            while k > 0 and toks[k].text != "->" and toks[k].text not in (")", "{", "}", ";"):
                k -= 1
            if toks[k].text == "->":
                j = k - 1
            else:
                break
        elif tj.text == ">" and j > 0:
            # trailing return type ending in a template: find "->"
            k = j
            while k > 0 and toks[k].text not in ("->", "{", "}", ";"):
                k -= 1
            if toks[k].text == "->":
                j = k - 1
            else:
                break
        else:
            break
    if j < 1 or toks[j].text != ")" or partner[j] < 1:
        return None
    open_paren = partner[j]
    name_tok = toks[open_paren - 1]
    if name_tok.kind != "id" or name_tok.text in _CONTROL:
        return None
    before = toks[open_paren - 2].text if open_paren >= 2 else ""
    if before in (":", ",", ".", "->", "=", "(", "return", "new"):
        return None  # an init list entry, a call, or an expression
    params = _params(toks, open_paren + 1, j)
    line, _ = cpp.line_col(name_tok.start)
    return Function(name_tok.text, params, (brace, partner[brace]), line)


def _params(toks: list[Tok], start: int, end: int) -> list[tuple[list[str], str]]:
    params: list[tuple[list[str], str]] = []
    depth = 0
    current: list[Tok] = []
    for k in range(start, end + 1):
        t = toks[k]
        if k == end or (t.text == "," and depth == 0):
            words = [x.text for x in current]
            if "=" in words:
                words = words[: words.index("=")]
            names = [w for w in words if re.match(r"^[A-Za-z_]\w*$", w)]
            if words and names:
                params.append((words[:-1] if len(words) > 1 else words, names[-1]))
            current = []
            continue
        if t.text in ("(", "<", "[", "{"):
            depth += 1
        elif t.text in (")", ">", "]", "}"):
            depth -= 1
        elif t.text == ">>":
            depth -= 2
        current.append(t)
    return params


def split_args(toks: list[Tok], open_paren: int, close_paren: int) -> list[list[Tok]]:
    """The top-level comma-separated arguments between a "(" and its ")"."""
    args: list[list[Tok]] = []
    depth = 0
    current: list[Tok] = []
    for k in range(open_paren + 1, close_paren):
        t = toks[k]
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        if t.text == "," and depth == 0:
            args.append(current)
            current = []
        else:
            current.append(t)
    if current or args:
        args.append(current)
    return args
