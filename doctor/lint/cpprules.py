"""The C++/CUDA rules: raw data_ptr reads of unchecked tensor arguments (GPU009, resolved across
files, with the project's own Python calls of a binding as callers); `scan` also runs the custom
allocator rule (GPU010, in gpudoctor.lint.cppalloc) on each file. Files are parsed by
gpudoctor.lint.cpp (tree-sitter's CUDA grammar).

GPU009 is decided in three steps. Per file, `summarise` records each function's tensor
parameters (lambdas bound with `m.def("f", [](torch::Tensor a) {...})` are functions too), which
of them it checks or makes contiguous itself, the calls that may check them (a macro such as
`CHECK_INPUT(x)`, a helper `check_inputs(q, k)`), where it reads their raw memory, and which
functions it calls with which arguments. Over all files (gpudoctor.lint.cppresolve),
`resolve_checks` decides those possible
checks by reading the macro's body (in the file, in the project headers it includes) or the
helper's own summary; only a name defined nowhere in the linted files is judged by its name.
Then `resolve_data_ptr` reports a read unless the parameter is protected: checked in the
function itself, or every caller found passes a checked parameter, a `.contiguous()` value or a
freshly created tensor. A function nobody calls (a pybind11 / TORCH_LIBRARY entry point)
protects nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudoctor.lint import cppalloc
from gpudoctor.lint.cpp import (CppFile, Function, Macro, Node, arguments, callee, declarator_name, last_name, params_of,
                                text_of, walk)
from gpudoctor.lint.model import Finding, NotLinted
from gpudoctor.lint.rules.gpu010_allocator_mismatch import BACKEND_CODE

_READS = {"data_ptr", "mutable_data_ptr", "const_data_ptr", "data"}
_ASSERTS_DENSE = {"is_contiguous", "expect_contiguous", "is_non_overlapping_and_dense"}
_STRIDE_AWARE = {"is_contiguous", "contiguous", "expect_contiguous", "stride", "strides", "packed_accessor",
                 "packed_accessor32", "packed_accessor64", "generic_packed_accessor", "accessor",
                 "is_non_overlapping_and_dense", "suggest_memory_format", "sym_strides", "sym_stride"}
_ASSERTS = {"TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "TORCH_CHECK_EQ", "TORCH_CHECK_NE", "AT_ASSERT", "assert",
            "AT_ASSERTM", "CHECK", "TORCH_INTERNAL_ASSERT_DEBUG_ONLY", "C10_CUDA_CHECK", "static_assert"}
_FRESH = {"empty", "zeros", "ones", "empty_like", "zeros_like", "ones_like", "full", "randn", "rand", "arange",
          "empty_strided", "clone", "contiguous", "cat", "stack"}
_ALL_CHECKED = {"checkContiguous", "checkAllContiguous", "TensorIteratorConfig", "TensorIterator"}
_EXTENSION_MARKERS = (b"torch/extension.h", b"torch/torch.h", b"torch/all.h", b"torch/python.h", b"torch/script.h",
                      b"torch/library.h", b"torch/types.h", b"PYBIND11_MODULE", b"TORCH_LIBRARY")
_BINDERS = {"def", "impl", "def_static", "op"}
_COMPARISONS = {"==", "!=", "%", "<", ">", "<=", ">=", "&"}


def is_extension_source(data: bytes) -> bool:
    """Extension code (rather than PyTorch's own sources): it includes the torch extension
    headers, binds functions, spells torch::Tensor, or spells at::Tensor where it launches
    kernels or includes the project's own headers."""
    if any(m in data for m in _EXTENSION_MARKERS) or b"torch::Tensor" in data:
        return True
    # at::Tensor in a kernel launcher, or in a header of the project's own (one it includes with
    # quotes: a dispatch header that calls the CUDA or CPU version; PyTorch's own headers use <>)
    return b"at::Tensor" in data and (b"<<<" in data or _PROJECT_INCLUDE.search(data) is not None)


_PROJECT_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"', re.M)


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
    # calls that may check a parameter (a macro, a helper): callee, per argument the parameter
    # index or -1; decided by `resolve_checks`, which reads the callee
    via: list[tuple[str, list[int]]] = field(default_factory=list)
    shown: str = ""  # how the finding names it: "fwd()", "the lambda bound as \"fwd\""
    # the parameters it asserts to be dense (x.is_contiguous(), a checking macro): a helper that
    # does so checks its callers' tensors too; one that only reads strides or copies does not
    contig: list[bool] = field(default_factory=list)
    # strides of a parameter handed on (`k<<<...>>>(x.data_ptr(), x.stride(0))`, or through a
    # local: `auto xs = make_long4(x.stride(0), ...); k<<<...>>>(..., xs)`): per parameter,
    # (callee or None, argument position, the local the call's result is stored in or None).
    # They protect the read only if what receives them uses them (`_resolve_strides`); a kernel
    # that indexes densely and ignores them does not.
    stride_sinks: dict[int, list[tuple[str | None, int, str | None]]] = field(default_factory=dict)
    # per such local: the calls it is handed to as it is, and whether it is used otherwise
    local_sinks: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    local_used: set[str] = field(default_factory=set)
    # per parameter: used in the body other than as a bare argument of a call, and the calls it
    # is handed to as a bare argument (callee, position): whether a stride handed here is read
    used: list[bool] = field(default_factory=list)
    forwards: dict[int, list[tuple[str, int]]] = field(default_factory=dict)


@dataclass
class MacroFacts:
    """What a function-like macro does with its parameters: the ones it checks itself
    (`x.is_contiguous()` in its body) and the calls it passes them to (`CHECK_CONTIGUOUS(x)`)."""

    params: tuple[str, ...]
    checks: frozenset[int]
    calls: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class FileFacts:
    """A file's function-like macros and its includes, for `resolve_checks` (small and picklable)."""

    macros: dict[str, MacroFacts]
    includes: tuple[str, ...]


_MAY_CHECK = re.compile(r"[A-Za-z_]\w*\s*\(|\.|->")


def macro_facts(m: Macro) -> MacroFacts | None:
    if m.params is None:
        return None
    if not _MAY_CHECK.search(m.body):  # calls nothing and reads no member: checks nothing
        return MacroFacts(tuple(m.params), frozenset(), ())
    index = {p: i for i, p in enumerate(m.params)}
    checks: set[int] = set()
    calls: list[tuple[str, tuple[int, ...]]] = []
    for n in walk(m.body_tree()):
        if n.type == "field_expression":
            obj = _unparen(n.child_by_field_name("argument"))
            if obj is not None and obj.type == "identifier" and text_of(obj) in index and \
                    last_name(n.child_by_field_name("field")) in _STRIDE_AWARE:
                checks.add(index[text_of(obj)])
        elif n.type == "call_expression":
            name, member = callee(n)
            if not name or member:
                continue
            for argmap in _argmaps(arguments(n), index):
                if name in _ALL_CHECKED:
                    checks.update(i for i in argmap if i >= 0)
                else:
                    calls.append((name, tuple(argmap)))
    return MacroFacts(tuple(m.params), frozenset(checks), tuple(calls))


def _unparen(n: Node | None) -> Node | None:
    while n is not None and n.type == "parenthesized_expression" and n.named_child_count == 1:
        n = n.named_children[0]
    return n


def _passes(a: Node, index: dict[str, int]) -> list[int]:
    """The parameters an argument passes as they are: `x`, `(x)`, each of `{x, y}`."""
    a = _unparen(a)
    if a is None:
        return []
    if a.type == "identifier":
        i = index.get(text_of(a))
        return [] if i is None else [i]
    if a.type == "initializer_list":
        return [i for e in a.named_children for i in _passes(e, index)]
    return []


def _argmaps(args: list[Node], index: dict[str, int]) -> list[list[int]]:
    """For a call, one argument map (position -> parameter index or -1) per parameter passed:
    `check_all({a, b})` gives [[a's index], [b's index]]."""
    out = []
    for j, a in enumerate(args):
        for i in _passes(a, index):
            argmap = [-1] * len(args)
            argmap[j] = i
            out.append(argmap)
    return out


def file_facts(cpp: CppFile) -> FileFacts:
    macros = {}
    for name, m in cpp.macros.items():
        facts = macro_facts(m)
        if facts is not None:
            macros[name] = facts
    return FileFacts(macros, tuple(cpp.includes))


def _inside(node: Node, stop: Node) -> list[Node]:
    """The ancestors of `node` up to (not including) `stop`, innermost first."""
    out = []
    p = node.parent
    while p is not None and p != stop:
        out.append(p)
        p = p.parent
    return out


def _is_fresh_value(value: Node) -> bool:
    """An expression whose value is a new dense tensor: `torch::empty(...)`, `x.contiguous()`."""
    for n in walk(value, skip=frozenset({"lambda_expression"})):
        if n.type == "call_expression" and callee(n)[0] in _FRESH:
            return True
    return False


# Tensor methods whose result shares the receiver's memory with its strides (a view), and the
# `*_like` factories whose result copies its strides (preserve_format): a raw read of the result
# reads the parameter's layout.
_VIEWS = {"select", "narrow", "slice", "view", "transpose", "permute", "t", "expand", "expand_as", "squeeze",
          "unsqueeze", "diagonal", "unfold", "as_strided", "index", "chunk", "split", "unbind", "reshape", "flatten",
          "view_as", "reshape_as", "alias", "detach", "mT", "swapaxes", "swapdims", "movedim", "squeeze_",
          "unsqueeze_"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
_STRIDES = {"stride", "strides", "sym_stride", "sym_strides"}


def _alias_of(value: Node, index: dict[str, int], aliases: dict[str, int]) -> int | None:
    """The parameter whose memory layout `value` has: `x.select(0, b)`, `x[b]`,
    `x.narrow(...).view(...)`, `at::zeros_like(x)`, another such local; None otherwise."""
    v = _unparen(value)
    for _ in range(8):
        if v is None:
            return None
        if v.type == "identifier":
            name = text_of(v)
            return index.get(name, aliases.get(name))
        if v.type == "subscript_expression":
            v = _unparen(v.child_by_field_name("argument"))
            continue
        if v.type != "call_expression":
            return None
        name, member = callee(v)
        if member and name in _VIEWS:
            fn = v.child_by_field_name("function")
            v = _unparen(fn.child_by_field_name("argument")) if fn is not None else None
            continue
        if not member and name in _LIKE:
            args = arguments(v)
            if any("MemoryFormat" in text_of(a) and "Preserve" not in text_of(a) or "CONTIGUOUS" in text_of(a)
                   for a in args[1:]):
                return None  # empty_like(x, at::MemoryFormat::Contiguous): a layout of its own
            v = _unparen(args[0]) if args else None
            continue
        return None
    return None


def _bare_argument(n: Node) -> tuple[str, int] | None:
    """(callee, position) when `n` is passed as it is to a plain call or kernel launch."""
    p = n.parent
    if p is None or p.type != "argument_list" or p.parent is None or p.parent.type != "call_expression":
        return None
    name, member = callee(p.parent)
    if not name or member or name in _ASSERTS:
        return None
    args = arguments(p.parent)
    for j, a in enumerate(args):
        if a == n:
            return name, j
    return None


def _stride_sink(field_expr: Node) -> tuple[str | None, int, str | None] | None:
    """Where `x.stride(k)` goes: (callee, position, local) when it is handed as it is to a call
    (a kernel launch, a helper, `make_long4(...)`), with the local that call's result is stored in
    (`auto xs = make_long4(x.stride(0), ...)`), or (None, 0, local) stored as it is (`int s =
    x.stride(0)`); None for any other use (compared, computed with: a use of the strides)."""
    call = _call_of(field_expr)
    if call is None:
        return None
    p = call.parent
    if p is not None and p.type == "init_declarator":
        return (None, 0, declarator_name(p.child_by_field_name("declarator")) or None)
    sink = _bare_argument(call)
    if sink is None:
        return None
    holder = p.parent.parent  # type: ignore[union-attr]
    local = None
    if holder is not None and holder.type == "init_declarator" and holder.child_by_field_name("value") == p.parent:  # type: ignore[union-attr]
        local = declarator_name(holder.child_by_field_name("declarator")) or None
    return (sink[0], sink[1], local)


def summarise_function(path: str, cpp: CppFile, fn: Function, skip: frozenset[int] = frozenset(),
                       pasting: frozenset[str] = frozenset()) -> FuncSummary:
    """One function's GPU009 facts. `skip`: start bytes of lambdas summarised on their own (bound
    lambdas), whose bodies belong to them, not to this function."""
    names = [p.name for p in fn.params]
    tensor = [p.tensor for p in fn.params]
    index = {p: i for i, p in enumerate(names) if p}
    checked = [False] * len(names)
    contig = [False] * len(names)
    reads: dict[int, tuple[int, int, str]] = {}
    calls: list[tuple[str, list[tuple[str, int]]]] = []
    compared: list[tuple[str, list[int]]] = []
    via: list[tuple[str, list[int]]] = []
    fresh_locals: set[str] = set()
    elements: dict[str, int] = {}  # range-for variable -> the parameter it walks
    aliases: dict[str, int] = {}  # a local viewing a parameter's memory -> the parameter
    stride_locals: set[str] = set()  # locals holding a parameter's strides (or a value made of them)
    sinks: dict[int, list[tuple[str | None, int, str | None]]] = {}
    local_sinks: dict[str, list[tuple[str, int]]] = {}
    local_used: set[str] = set()
    strided: set[int] = set()  # parameters whose strides are used here (not only handed on)
    used = [False] * len(names)
    forwards: dict[int, list[tuple[str, int]]] = {}
    all_checked = False
    body = fn.body
    stack = [(body, False, False)]  # (node, inside a check, inside a condition)
    while stack:
        n, in_check, in_cond = stack.pop()
        t = n.type
        if t == "lambda_expression" and n.start_byte in skip:
            continue
        if t == "identifier":
            word = text_of(n)
            if word in ("TensorIterator", "TensorIteratorConfig"):
                all_checked = True
            elif word in index or word in stride_locals:
                p = n.parent
                declared = p is not None and p.type == "init_declarator" and p.child_by_field_name("declarator") == n
                bare = None if declared else _bare_argument(n)
                if word in index and not declared:
                    i = index[word]
                    if bare is not None:
                        forwards.setdefault(i, []).append(bare)
                    else:
                        used[i] = True
                elif word in stride_locals and not declared:
                    if bare is not None:
                        local_sinks.setdefault(word, []).append(bare)
                    else:
                        local_used.add(word)
        elif t == "type_identifier" and n.text in (b"TensorIterator", b"TensorIteratorConfig"):
            all_checked = True
        elif t == "call_expression":
            name, member = callee(n)
            args = arguments(n)
            if name in _ALL_CHECKED:
                all_checked = True
            if name in pasting and not member:
                used = [True] * len(names)  # TENSOR##_stride: the macro names any parameter
            if name and not member:
                argmap = [index.get(text_of(a), -1) if a.type == "identifier" else -1 for a in args]
                if (in_check or in_cond) and name not in _ASSERTS:
                    compared.append((name, argmap))
                if name not in _ASSERTS:
                    via.extend((name, m) for m in _argmaps(args, index))
                if name not in _ASSERTS and not name.isupper():
                    kinds = []
                    for a in args:
                        if a.type == "identifier" and text_of(a) in index:
                            kinds.append(("param", index[text_of(a)]))
                        elif a.type == "identifier" and text_of(a) in fresh_locals:
                            kinds.append(("fresh", 0))
                        elif _is_fresh_value(a):
                            kinds.append(("fresh", 0))
                        else:
                            kinds.append(("other", 0))
                    calls.append((name, kinds))
            if name in _ASSERTS and not member:
                in_check = True
        elif t == "init_declarator" or t == "assignment_expression":
            target = n.child_by_field_name("declarator" if t == "init_declarator" else "left")
            value = n.child_by_field_name("value" if t == "init_declarator" else "right")
            if target is not None and value is not None:
                local = text_of(target) if target.type == "identifier" else ""
                if local and local not in index:
                    viewed = _alias_of(value, index, aliases)
                    if viewed is not None:
                        aliases[local] = viewed
                        fresh_locals.discard(local)
                    elif _is_fresh_value(value):
                        fresh_locals.add(local)
                        aliases.pop(local, None)
                    else:
                        aliases.pop(local, None)
        elif t == "condition_clause":
            in_cond = True
        elif t == "for_range_loop":
            # `for (auto& t : tensors) TORCH_CHECK(t.is_contiguous())`: t stands for each element
            element = declarator_name(n.child_by_field_name("declarator"))
            seq = _unparen(n.child_by_field_name("right"))
            if element and seq is not None and seq.type == "identifier" and text_of(seq) in index:
                elements[element] = index[text_of(seq)]
        elif t == "field_expression":
            obj = _unparen(n.child_by_field_name("argument"))
            if obj is not None and obj.type == "identifier" and text_of(obj) in elements and \
                    last_name(n.child_by_field_name("field")) in _ASSERTS_DENSE:
                checked[elements[text_of(obj)]] = contig[elements[text_of(obj)]] = True
            elif obj is not None and obj.type == "identifier" and text_of(obj) in index:
                i = index[text_of(obj)]
                field_node = n.child_by_field_name("field")
                member = last_name(field_node)
                if member in _STRIDES and not in_check and not in_cond:
                    sink = _stride_sink(n)
                    if sink is None or (sink[0] is None and sink[2] is None):
                        strided.add(i)
                    else:
                        sinks.setdefault(i, []).append(sink)
                        if sink[2]:
                            stride_locals.add(sink[2])
                elif member in _STRIDE_AWARE:
                    checked[i] = True
                    contig[i] = contig[i] or member in _ASSERTS_DENSE
                elif member in ("numel", "dim") and in_check and _equals(n, "1" if member == "numel" else "0"):
                    checked[i] = contig[i] = True  # TORCH_CHECK(x.numel() == 1): one element is dense whatever its strides
                elif member in _READS and tensor[i] and i not in reads:
                    templated = field_node is not None and field_node.type == "template_method"
                    if (member != "data" or templated) and not in_check and not _compared(n):
                        line, col = cpp.pos(obj)
                        reads[i] = (line, col, f"{text_of(obj)}.{member}")
            elif obj is not None and obj.type == "identifier" and text_of(obj) in aliases:
                # a view of a parameter (`auto x_n = x.select(0, b)`, `zeros_like(x)`): its raw
                # read reads the parameter's layout
                i = aliases[text_of(obj)]
                field_node = n.child_by_field_name("field")
                member = last_name(field_node)
                if member in _READS and tensor[i] and i not in reads:
                    templated = field_node is not None and field_node.type == "template_method"
                    if (member != "data" or templated) and not in_check and not _compared(n):
                        line, col = cpp.pos(obj)
                        reads[i] = (line, col, f"{text_of(obj)}.{member}")
        children = n.named_children
        if children:
            stack.extend((c, in_check, in_cond) for c in reversed(children))
    for i in strided:
        checked[i] = True  # its strides are used here: read with them
    if all_checked:
        checked = [True] * len(names)
    stride_sinks = {i: v for i, v in sinks.items() if not checked[i]}
    wanted = {local for v in stride_sinks.values() for _, _, local in v if local}
    return FuncSummary(fn.name, path, names, tensor, checked, reads, calls, compared, via, fn.shown or f"{fn.name}()",
                       contig, stride_sinks, {k: v for k, v in local_sinks.items() if k in wanted},
                       local_used & wanted, used, forwards)


def _call_of(field_expr: Node) -> Node | None:
    """The call_expression `x.member(...)` whose function is this field expression."""
    p = field_expr.parent
    return p if p is not None and p.type == "call_expression" and p.child_by_field_name("function") == field_expr \
        else None


def _equals(field_expr: Node, value: str) -> bool:
    """`x.numel() == value` (either side)."""
    call = _call_of(field_expr)
    if call is None or call.parent is None or call.parent.type != "binary_expression":
        return False
    b = call.parent
    op = b.child_by_field_name("operator")
    other = b.child_by_field_name("right") if b.child_by_field_name("left") == call else b.child_by_field_name("left")
    return op is not None and op.type == "==" and other is not None and text_of(other) == value


def _compared(field_expr: Node) -> bool:
    """x.data_ptr() == y.data_ptr(), reinterpret_cast<uintptr_t>(x.data_ptr()) % 16: a pointer
    compared or tested for alignment, not read."""
    node = _call_of(field_expr) or field_expr
    while node.parent is not None:
        p = node.parent
        if p.type in ("parenthesized_expression", "cast_expression"):
            node = p
            continue
        if p.type == "argument_list" and p.parent is not None and p.parent.type == "call_expression" and \
                callee(p.parent)[0] in ("reinterpret_cast", "static_cast", "uintptr_t", "size_t", "int64_t"):
            node = p.parent
            continue
        if p.type == "binary_expression":
            op = p.child_by_field_name("operator")
            return op is not None and op.type in _COMPARISONS
        return False
    return False


# --- bindings -------------------------------------------------------------------------------------


def _python_name(first: Node) -> str | None:
    """The Python-visible name of a binding's first argument: "f" of `"f"`, of a schema
    `"f(Tensor x) -> Tensor"`, of `"ns::f"` and of `TORCH_SELECTIVE_NAME("ns::f")`."""
    if first.type == "call_expression" and callee(first)[0] in ("TORCH_SELECTIVE_NAME", "TORCH_SELECTIVE_SCHEMA"):
        args = arguments(first)
        if not args:
            return None
        first = args[0]
    if first.type not in ("string_literal", "raw_string_literal", "concatenated_string"):
        return None
    m = re.match(r'^[A-Za-z0-9]*"(?:\w+::)?([A-Za-z_]\w*)', text_of(first))
    return m.group(1) if m else None


def _function_ref(arg: Node) -> str | None:
    """The C++ function a binding argument names: `&f`, `&ns::f`, `f`, `TORCH_FN(f)`,
    `torch::dispatch(key, TORCH_FN(f))`, `static_cast<...>(&f)`."""
    for _ in range(6):
        t = arg.type
        if t == "pointer_expression":
            inner = arg.child_by_field_name("argument")
            if inner is None:
                return None
            arg = inner
        elif t in ("identifier", "qualified_identifier", "template_function"):
            return last_name(arg) or None
        elif t == "call_expression":
            name, member = callee(arg)
            args = arguments(arg)
            if member or not args or name not in ("TORCH_FN", "dispatch", "static_cast", "overload_cast", "TORCH_FN_TYPE"):
                return None
            arg = args[-1]
        elif t == "parenthesized_expression" and arg.named_child_count == 1:
            arg = arg.named_children[0]
        else:
            return None
    return None


@dataclass
class Bindings:
    names: dict[str, str] = field(default_factory=dict)  # Python name -> C++ function (or bound lambda)
    bound: set[str] = field(default_factory=set)  # C++ functions handed to Python or the dispatcher
    lambdas: list[Function] = field(default_factory=list)


def bindings(cpp: CppFile) -> Bindings:
    """pybind11 (`m.def("f", &f)`, `.def("f", [](torch::Tensor a) {...})`) and the dispatcher
    (`TORCH_LIBRARY` / `TORCH_LIBRARY_IMPL` blocks: `m.def("f(Tensor x) -> Tensor", &f)`,
    `m.impl("f", TORCH_FN(f_cuda))`, `torch::RegisterOperators().op("ns::f", &f)`)."""
    out = Bindings()
    if not _BINDS.search(cpp.data):
        return out
    for call in cpp.find("call_expression"):
        name, member = callee(call)
        if name == "TORCH_FN" and not member:
            for a in arguments(call):
                ref = _function_ref(a)
                if ref:
                    out.bound.add(ref)
            continue
        if not member or name not in _BINDERS:
            continue
        args = arguments(call)
        if len(args) < 2:
            continue
        py = _python_name(args[0])
        chosen = None
        for a in args[1:]:
            if a.type == "lambda_expression":
                declarator = a.child_by_field_name("declarator")
                body = a.child_by_field_name("body")
                if body is None or py is None:
                    break
                params = params_of(declarator.child_by_field_name("parameters")) if declarator is not None else []
                synthetic = f"<lambda {py}>"
                out.lambdas.append(Function(synthetic, params, body, a, a.start_point[0] + 1,
                                            f"the lambda bound as \"{py}\""))
                chosen = synthetic
                break
            ref = _function_ref(a)
            if not ref:
                continue
            if a.type in ("identifier", "qualified_identifier") and _DISPATCH_KEY.match(text_of(a)):
                continue  # m.impl("f", torch::kCUDA, &f): the dispatch key, not the function
            if a.type in ("identifier", "qualified_identifier", "template_function"):
                chosen = chosen or ref  # a bare name: taken unless a &f or TORCH_FN(f) follows
                continue
            chosen = ref
            break
        if chosen:
            out.bound.add(chosen)
            if py:
                out.names[py] = chosen
    return out


_BINDS = re.compile(rb"\b(?:def|impl|def_static|op|TORCH_FN)\s*\(")
_DISPATCH_KEY = re.compile(r"^(?:(?:\w+::)*k[A-Z]\w*|(?:\w+::)*(?:DispatchKey|DeviceType|kCPU|kCUDA)(?:::\w+)?)$")


def summarise(path: str, cpp: CppFile, binds: Bindings | None = None) -> list[FuncSummary]:
    binds = binds if binds is not None else bindings(cpp)
    skip = frozenset(f.node.start_byte for f in binds.lambdas)
    # the file's macros that paste a name (`TENSOR##_stride`): a function calling one may use any
    # of its parameters under a name its body never spells
    pasting = frozenset(name for name, m in cpp.macros.items() if "##" in m.body) if b"##" in cpp.data else frozenset()
    out = [summarise_function(path, cpp, fn, skip, pasting) for fn in cpp.functions()]
    out += [summarise_function(path, cpp, fn, skip - {fn.node.start_byte}, pasting) for fn in binds.lambdas]
    return out


# --- one file ---------------------------------------------------------------------------------------

# (findings, summaries, bound names, Python name -> C++ name, FileFacts or None)
EMPTY_SCAN: tuple = ([], [], set(), {}, None)


# Function-like macros a C++ file defines (found by a byte search in the workers, for every C++
# file read while GPU009 is selected): where `resolve_checks` looks for a macro no file includes.
# (Not anchored at the line start: ten times faster, and a "#define" in a comment only costs a
# parse of that file in the parent, which then finds no such macro.)
MACRO_DEFINITIONS = re.compile(rb"#[ \t]*define[ \t]+([A-Z_][A-Z0-9_]*)\(")


# The rules that read extension functions (their checks, reads and bindings): GPU009, and GPU012
# on the C++ side (which bound functions check their arguments' contiguity).
EXTENSION_RULES = frozenset({"GPU009", "GPU012"})


def applicable(codes: set[str], data: bytes, exhaustive: bool = False) -> set[str]:
    """The C++ rules that apply to a file: GPU009 and GPU012 read extension code only, GPU010
    PyTorch backend and allocator code only (unless `exhaustive`)."""
    if exhaustive:
        return codes
    if codes & EXTENSION_RULES and not is_extension_source(data):
        codes = codes - EXTENSION_RULES
    if "GPU010" in codes and not any(marker in data for marker in BACKEND_CODE):
        codes = codes - {"GPU010"}
    return codes


# The parser's syntax tree takes about 50 bytes of memory per byte of source (a 20 MB generated
# file: 1.1 GB and ten seconds); the largest hand-written headers (torch's generated
# RedispatchFunctions.h, CUDA's cuda.h) are 1-2 MB.
MAX_PARSE_BYTES = 8 * 1024 * 1024


def parse(path: str, text: str, data: bytes) -> CppFile:
    """The file parsed. Raises NotLinted for a file over MAX_PARSE_BYTES, and
    cpp.ParserUnavailable (a NotLinted) when the parser cannot be loaded."""
    if len(data) > MAX_PARSE_BYTES:
        limit = f"{MAX_PARSE_BYTES // (1024 * 1024)} MiB" if MAX_PARSE_BYTES >= 1024 * 1024 else f"{MAX_PARSE_BYTES} bytes"
        raise NotLinted(f"not linted for GPU009/GPU010: larger than {limit}, the limit of the C++ parser")
    return CppFile(text, data)


def scan(path: str, cpp: CppFile, data: bytes, codes: set[str], exhaustive: bool = False) -> tuple:
    """Findings (GPU010), and GPU009's facts: summaries, bound C++ names, Python name -> C++ name,
    and the file's macros and includes. `exhaustive`: GPU009 on any C++ file, extension or not."""
    codes = applicable(codes, data, exhaustive)
    if not codes:
        return EMPTY_SCAN
    findings: list[Finding] = []
    summaries: list[FuncSummary] = []
    bound: set[str] = set()
    aliases: dict[str, str] = {}
    facts = None
    if "GPU010" in codes:
        findings += cppalloc.allocator_findings(path, cpp)
    if codes & EXTENSION_RULES:
        binds = bindings(cpp)
        # every function with parameters: one that checks nothing decides too (a helper called
        # check_cuda(x) that reads only the device is not judged by its name)
        summaries = [s for s in summarise(path, cpp, binds) if s.params or s.reads or s.calls]
        bound = binds.bound | set(binds.names.values())
        aliases = binds.names
        facts = file_facts(cpp)
    return findings, summaries, bound, aliases, facts


def checking_bindings(summaries: list[FuncSummary], bound: set[str], aliases: dict[str, str]) -> dict[str, list]:
    """GPU012's C++ side: Python name of a binding -> the tensor arguments its function checks to
    be contiguous (after `resolve_checks`: by itself, a macro or a helper), as pycontig.Check. A
    name bound to several overloads checks what every one of them checks."""
    from gpudoctor.lint.pycontig import Check

    by_name: dict[str, list[FuncSummary]] = {}
    for s in summaries:
        if s.name in bound:
            by_name.setdefault(s.name, []).append(s)
    out: dict[str, list] = {}
    for py, cxx in aliases.items():
        found = by_name.get(cxx)
        if not found or len({len(s.params) for s in found}) != 1:
            continue
        checked = [i for i in range(len(found[0].params))
                   if all(i < len(s.contig) and s.contig[i] and s.tensor[i] for s in found)]
        if checked:
            s = found[0]
            out[py] = [Check(i, s.params[i], f"is bound to the extension's C++ function {s.shown or s.name + '()'} "
                                             f"({s.path}), which checks that `{s.params[i]}` is contiguous", (s.path, 0))
                       for i in checked]
    return out
