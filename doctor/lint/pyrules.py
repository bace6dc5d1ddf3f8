"""The Python rules: turn the dataflow events of `pyflow` into findings (GPU001, GPU003, GPU004,
GPU008) and check the rules that need only the tree: sdp_kernel (GPU002), Parameter reassignment
(GPU005), arch flags in setup.py / cpp_extension calls (GPU006), xformers call sites (GPU007) and
modules created after a cast (GPU011).

The interpreter is gpudoctor.lint.pyflow (its values and events in pyvalues); GPU006's flag
collection lives in gpudoctor.lint.pyarch and GPU011 in gpudoctor.lint.latemodules, both called
from `check`. GPU011 is partly cross-file: a method that creates float32 submodules and never
converts them is summarised there (`Facts.creators`), and so is every call made on an object after
it was cast (`Facts.after_cast`); gpudoctor.lint.engine pairs them over all linted files in its
cross-file step.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from gpudoctor.lint import pyarch, rules
from gpudoctor.lint import latemodules, valueflow
from gpudoctor.lint.latemodules import CASTS
from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.pyflow import Interp
from gpudoctor.lint.pyvalues import (AttentionEvent, FlashLayoutEvent, ShapeArgEvent, ShapeTensorEvent, TV,
                                     ViewEvent, _REDUCTIONS)
from gpudoctor.lint.pysource import PySource, call_name, dotted, finding, walk

_STD_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm[123]d|InstanceNorm[123]d|Embedding|EmbeddingBag|PReLU)$")
_SDP_ORDER = (("enable_flash", "FLASH_ATTENTION"), ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
              ("enable_math", "MATH"), ("enable_cudnn", "CUDNN_ATTENTION"))
_SDP_POSITIONAL = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")


@dataclass
class Facts:
    """What a file contributes to the project pass (gpudoctor.lint.project; picklable)."""

    # GPU011: method name -> what it creates and never converts: (finding at the assignment, the
    # class it builds when only the project knows whether that class has weights, or None)
    creators: dict[str, list[tuple[Finding, str | None]]] = field(default_factory=dict)
    # calls on an object after it was cast: (method, line, col, cast object, cast line, receiver,
    # how the cast reached the scope: "" when it happened there)
    after_cast: list[tuple[str, int, int, str, int, str, str]] = field(default_factory=list)
    # GPU011: top-level functions of the file that return a cast object (absolute name -> line)
    cast_returns: dict[str, int] = field(default_factory=dict)
    # GPU001: the functions and methods (by name) that return attention probabilities or raw
    # scores, and findings that hold only if a helper this file calls returns them:
    # (helper name, "probs" | "scores", the finding)
    # GPU011: the classes of the file, by name: (base names, creates weights in its own text,
    # casts its inputs, capitalised names it calls), for a class built in another module
    classes: dict[str, tuple[tuple[str, ...], bool, bool, tuple[str, ...]]] = field(default_factory=dict)
    # GPU011: top-level functions of the file that return a new float32 module (builders)
    builders: set[str] = field(default_factory=set)
    # GPU004: tensors of sizes handed to the project's code: (callee, slot, rank, the value as
    # written, line, key), and the caller-side findings to report where the callee cannot be
    # followed (key -> finding)
    size_calls: list[tuple[tuple[str, ...], int | str, tuple, str, int, int]] = field(default_factory=list)
    size_fallbacks: dict[int, Finding] = field(default_factory=dict)
    # GPU004: the file's functions that return sizes (absolute name -> carried value,
    # gpudoctor.lint.pyvalues), and the methods it rebinds with types.MethodType: (attribute,
    # method, absolute name of the function bound in its place, the class whose self.<attribute>
    # it is, when it is one)
    size_returns: dict[str, tuple] = field(default_factory=dict)
    rebinds: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    # GPU004, for a file that hands sizes to calls: its classes (absolute name -> bases, method
    # names, submodule classes, element classes) and its top-level defs (module, names), so that
    # the project pass looks a call's target up without parsing the file again
    vf_classes: dict[str, tuple] = field(default_factory=dict)
    vf_defs: tuple[str, frozenset[str]] | None = None
    returns_probs: set[str] = field(default_factory=set)
    returns_scores: set[str] = field(default_factory=set)
    cond_attention: list[tuple[str, str, Finding]] = field(default_factory=list)
    # GPU012: the file's module-level functions that check a parameter's contiguity
    # (gpudoctor.lint.pycontig); the cross-file step reads their callers
    contig_checkers: tuple[str, ...] = ()


def _short(src: PySource, node: ast.AST, limit: int = 60) -> str:
    text = " ".join(src.segment(node).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check(src: PySource, codes: set[str], facts: Facts, every_function: bool = False) -> list[Finding]:
    """The Python rules on one parsed file. `every_function`: the dataflow interprets every
    function, not only those whose text has a rule's trigger words (the prefilters' safety test)."""
    out: list[Finding] = []
    if codes & {"GPU001", "GPU003", "GPU004", "GPU008"}:
        out += _flow_rules(src, codes, facts, every_function)
    if "GPU002" in codes:
        out += _sdp_kernel(src)
    if "GPU005" in codes:
        out += _parameter_reassign(src)
    if "GPU006" in codes:
        out += pyarch.arch_flags(src)
    if "GPU007" in codes:
        out += _xformers(src)
    if "GPU011" in codes:
        out += latemodules.module_after_cast(src, facts)
    if "GPU012" in codes:
        from gpudoctor.lint import pycontig

        facts.contig_checkers = pycontig.checking_functions(src)
    return out


# --- dataflow rules ----------------------------------------------------------------------------


# Per function: the text a function must contain for the dataflow to look at it for a rule.
_TRIGGERS = {
    # softmax in the function, or a helper's probabilities multiplied here (named so)
    "GPU001": (("softmax", "get_attention_scores", "probs", "scores", "attn"), re.compile(rules.ATTENTION_PRODUCT.decode())),
    "GPU003": ((".view(",), re.compile(rules.NONCONTIGUOUS.decode())),
    # a function that makes a tensor of sizes (what it receives from elsewhere, a field of self, a
    # return value or a keyword, is followed by the later rounds and the project pass)
    "GPU004": (("tensor(", "stack(", "Tensor(", "register_buffer(", ".sum("), None),
    "GPU008": (("flash_attn",), None),
}


def _words(names: set[str]) -> re.Pattern[str]:
    """Lines worth walking for any of these names (a substring test: the walk decides)."""
    return re.compile("|".join(map(re.escape, sorted(names))))


def _triggers(src: PySource, codes: set[str]) -> list[tuple[tuple[str, ...], re.Pattern[str] | None, tuple[str, ...]]]:
    """Per rule: its trigger words, its pattern, and the names this file binds to something the
    words or the pattern name (`from flash_attn import flash_attn_func as faf`: `faf` is as good
    as `flash_attn`), which stand in for either."""
    out = []
    for c in codes:
        trigger = _TRIGGERS.get(c)
        if trigger is None:
            continue
        words, pattern = trigger
        aliases = tuple(n for n, q in src.imports.items()
                        if n not in q.split(".") and (any(w.rstrip("(") in q for w in words) or
                                                      (pattern is not None and pattern.search(q + "("))))
        out.append((words, pattern, aliases))
    return out


def _wanted(text: str, triggers) -> bool:
    for words, pattern, aliases in triggers:
        alias = any(a in text for a in aliases)
        if (alias or any(w in text for w in words)) and (pattern is None or alias or pattern.search(text)):
            return True
    return False


def _flow_rules(src: PySource, codes: set[str], facts: Facts | None = None, every_function: bool = False) -> list[Finding]:
    triggers = _triggers(src, codes)

    def want(fn: ast.AST) -> bool:
        return every_function or _wanted(src.scope_text(fn), triggers)

    interp = Interp(src)
    interp.run(want)
    facts = facts if facts is not None else Facts()
    facts.returns_probs, facts.returns_scores = set(interp.returns_probs), set(interp.returns_scores)
    params = _param_names(src)
    if "GPU004" in codes and interp.kw_sizes:
        # Size tensors passed by keyword: functions of this file with a parameter of that name
        # receive them. One more pass with those parameters seeded.
        seeds = {k: TV(rank=v.rank, sizes=True) for k, v in interp.kw_sizes.items() if k in params}
        if seeds:
            events = interp.events
            interp = Interp(src, seeds)
            interp.run(lambda fn: want(fn) or bool(_fn_params(fn) & set(seeds)))
            interp.events = events + [e for e in interp.events if e not in events]
    out: list[Finding] = []
    seen: set[tuple[int, int, str]] = set()
    deferred: dict[int, Finding] = {}  # id(value node) -> a caller-side finding the project pass decides on
    if "GPU004" in codes:
        deferred = {k: None for k in valueflow.record(src, interp, facts, lambda n: _short(src, n, 40))}  # type: ignore[misc]
    for ev in _one_per_group(interp.events, src):
        f = None
        if isinstance(ev, ViewEvent) and "GPU003" in codes:
            f = _view_finding(src, ev)
        elif isinstance(ev, AttentionEvent) and "GPU001" in codes:
            f = None if _beside_sdpa(src, ev.scores) or _chunked(src, ev.scores) else _attention_finding(src, ev)
            if f is not None and ev.cond is not None:
                # get_attention_scores(q, k) returns softmax(q k^T) only if the helper does so:
                # this file's own helpers decide here, the project's in the project pass
                helper, kind = ev.cond
                if helper not in (interp.returns_probs if kind == "probs" else interp.returns_scores):
                    facts.cond_attention.append((helper, kind, f))
                    f = None
        elif isinstance(ev, ShapeTensorEvent) and "GPU004" in codes:
            f = _shape_tensor_finding(src, ev)
        elif isinstance(ev, ShapeArgEvent) and "GPU004" in codes and ev.keyword not in params:
            f = _shape_arg_finding(src, ev)
            if id(ev.value) in deferred:
                facts.size_fallbacks[id(ev.value)] = f  # only if the callee cannot be followed
                f = None
        elif isinstance(ev, FlashLayoutEvent) and "GPU008" in codes:
            f = finding(src, ev.arg, "GPU008", ev.detail,
                         Fix(DISPLAY_ONLY, "pass (batch, seqlen, heads, head_dim) tensors: drop or undo the transpose(1, 2)"))
        if f is not None:
            key = (f.line, f.col, f.code)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _one_per_group(events: list, src: PySource | None = None) -> list:
    """One GPU004 finding per group of bindings: `t = sizes[0]; h = sizes[1]; w = sizes[2]` on
    consecutive lines (or `sizes[1], sizes[2]` on one line) are one place to change, and so are
    the elements of one tensor taken in the two branches of an if (`n = offs[i + 1] - offs[i]`,
    `else: n = total - offs[i]`)."""
    out, last = [], {}
    branches = _branch_pairs(src, events) if src is not None else []
    for ev in events:
        if isinstance(ev, ShapeTensorEvent) and isinstance(ev.unpacked, ast.Subscript):
            base = dotted(ev.unpacked.value)
            line = ev.unpacked.lineno
            if base is not None:
                prev = last.get(base)
                last[base] = line
                if prev is not None and (0 <= line - prev <= 1 or
                                         any(a[0] <= prev <= a[1] and b[0] <= line <= b[1] for a, b in branches)):
                    continue
        out.append(ev)
    return out


def _branch_pairs(src: PySource, events: list) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(lines of the body, lines of the else) of each if/else that holds GPU004 events."""
    lines = {ev.unpacked.lineno for ev in events if isinstance(ev, ShapeTensorEvent) and
             isinstance(ev.unpacked, ast.Subscript)}
    if len(lines) < 2:
        return []
    out = []
    for node in ast.walk(src.tree):
        if isinstance(node, ast.If) and node.orelse and node.lineno <= max(lines) and \
                (node.end_lineno or node.lineno) >= min(lines):
            body = (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
            orelse = (node.orelse[0].lineno, node.orelse[-1].end_lineno or node.orelse[-1].lineno)
            out.append((body, orelse))
    return out


# --- GPU004 across functions and modules (the project pass calls these) ---------------------------


def _fn_params(fn: ast.AST) -> set[str]:
    a = fn.args  # type: ignore[attr-defined]
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _param_names(src: PySource) -> set[str]:
    names: set[str] = set()
    for fn in src.functions:
        names |= _fn_params(fn)
    return names


def _view_finding(src: PySource, ev: ViewEvent) -> Finding | None:
    func = ev.call.func
    if not isinstance(func, ast.Attribute):
        return None
    end = src.offset(func.end_lineno, func.end_col_offset)  # type: ignore[arg-type]
    start = end - len("view")
    if src.text[start:end] != "view":
        return None
    line = func.end_lineno
    byte_col = func.end_col_offset - len("view")  # type: ignore[operator]
    where = f"line {ev.origin.lineno}"  # type: ignore[attr-defined]
    if ev.origin_kind == "sdpa":
        what = (f"the scaled_dot_product_attention output ({where}), whose layout depends on the backend "
                f"(memory-efficient and flash return (B, N, H, D) memory, math a contiguous tensor)")
    elif ev.origin_kind == "rearrange":
        what = f"a tensor that einops.rearrange ({where}) permuted without copying"
    else:
        what = f"a tensor made non-contiguous by {_short(src, ev.origin, 40)} ({where})"
    message = (f".view() merges dimensions of {what}; view cannot merge dimensions that are not adjacent "
               f"in memory ('view size is not compatible with input tensor's size and stride'): use .reshape()")
    fix = Fix(SAFE, "replace .view( with .reshape(", (Edit(start, end, "reshape"),))
    f = finding(src, ev.call, "GPU003", message, fix, line=line, byte_col=byte_col)
    return f


def _beside_sdpa(src: PySource, node: ast.AST) -> bool:
    """Hand-written attention in one branch of an `if` whose other branch calls PyTorch's SDPA is
    a deliberate fallback (old torch, export, a debug flag), not the path that runs. A branch
    beside xformers or flash_attn is different: that is what runs when those packages are
    missing or fail on a new GPU, so it is still reported."""
    line = node.lineno  # type: ignore[attr-defined]
    for st, scope in src.stmts:
        if not isinstance(st, ast.If) or not (st.lineno <= line <= st.end_lineno):  # type: ignore[operator]
            continue
        for here, other in ((st.body, st.orelse), (st.orelse, st.body)):
            if here and other and here[0].lineno <= line <= here[-1].end_lineno:  # type: ignore[operator]
                text = "".join(src.lines[other[0].lineno - 1:other[-1].end_lineno])
                if "scaled_dot_product_attention" in text:
                    return not _default_branch(src, st, line, scope)
    return False


_UNKNOWN = object()


def _default_branch(src: PySource, st: ast.If, line: int, scope: ast.AST) -> bool:
    """Whether the if/elif chain `st` takes the branch holding `line` when the class's switches
    have their constructor defaults (`attention_mode="math"`, `enable_flash_attn=False` stored as
    self.attention_mode / self.enable_flash_attn): then the hand-written branch is what runs
    unless a caller asks otherwise, and SDPA beside it does not excuse it."""
    defaults: dict[str, object] = {}
    for cls in src.classes:
        if not (cls.lineno <= line <= cls.end_lineno):  # type: ignore[operator]
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                a = fn.args
                positional = a.posonlyargs + a.args
                pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults)) + \
                    [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                given = {x.arg: d.value for x, d in pairs if isinstance(d, ast.Constant)}
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in given:
                        for t in n.targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                defaults[t.attr] = given[n.value.id]
    if not defaults:
        return False
    local: dict[str, list[ast.expr]] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and n.lineno < st.lineno:
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        local.setdefault(t.id, []).append(n.value)

    def value(e: ast.AST, depth: int = 0) -> object:
        if depth > 6:
            return _UNKNOWN
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
            return defaults.get(e.attr, _UNKNOWN)
        if isinstance(e, ast.Name):
            assigned = local.get(e.id, [])
            return value(assigned[0], depth + 1) if len(assigned) == 1 else _UNKNOWN
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = value(e.operand, depth + 1)
            return _UNKNOWN if v is _UNKNOWN else not v
        if isinstance(e, ast.BoolOp):
            unknown = False
            for part in e.values:
                v = value(part, depth + 1)
                if v is _UNKNOWN:
                    unknown = True
                elif isinstance(e.op, ast.And) and not v:
                    return False
                elif isinstance(e.op, ast.Or) and v:
                    return True
            return _UNKNOWN if unknown else isinstance(e.op, ast.And)
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
            left, right = value(e.left, depth + 1), value(e.comparators[0], depth + 1)
            if isinstance(e.comparators[0], (ast.Tuple, ast.List, ast.Set)):
                items = [value(x, depth + 1) for x in e.comparators[0].elts]
                if left is _UNKNOWN or _UNKNOWN in items:
                    return _UNKNOWN
                found = left in items
                return found if isinstance(e.ops[0], ast.In) else not found
            if left is _UNKNOWN or right is _UNKNOWN or isinstance(e.ops[0], (ast.In, ast.NotIn)):
                return _UNKNOWN
            return (left == right) if isinstance(e.ops[0], ast.Eq) else (left != right)
        return _UNKNOWN

    node: ast.If | None = st
    while node is not None:
        v = value(node.test)
        if v is _UNKNOWN:
            return False
        branch = node.body if v else node.orelse
        if not branch:
            return False
        if branch[0].lineno <= line <= branch[-1].end_lineno:  # type: ignore[operator]
            if len(branch) == 1 and isinstance(branch[0], ast.If) and not v and \
                    branch[0].lineno <= line <= branch[0].end_lineno:  # type: ignore[operator]
                node = branch[0]  # an elif: decide its own test
                continue
            return True
        return False
    return False


def _chunked(src: PySource, node: ast.AST) -> bool:
    """Scores of a slice of the queries taken in a loop (`for i in range(0, n, step): s =
    q[:, i:i + step] @ k.T`): sliced attention, whose memory the step bounds (the remedy the
    knowledge base itself gives when SDPA is not available), not the full matrix."""
    if isinstance(node, ast.Call):
        operands = list(node.args)
    elif isinstance(node, ast.BinOp):
        operands = [node.left, node.right]
    else:
        return False
    bounds = set()
    for op in operands:
        while isinstance(op, ast.Call) and isinstance(op.func, ast.Attribute):  # q[:, i:j].float()
            op = op.func.value
        if isinstance(op, ast.Subscript):
            parts = op.slice.elts if isinstance(op.slice, ast.Tuple) else [op.slice]
            for p in parts:
                if isinstance(p, ast.Slice):
                    bounds |= {n.id for b in (p.lower, p.upper) if b is not None for n in walk([b])
                               if isinstance(n, ast.Name)}
    if not bounds:
        return False
    line = node.lineno  # type: ignore[attr-defined]
    for st, _ in src.stmts:
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)) and st.lineno < line <= st.end_lineno:  # type: ignore[operator]
            bound_here = {n.id for n in walk([st.target]) if isinstance(n, ast.Name)} if not isinstance(st, ast.While) else set()
            for inner in walk(st.body):
                if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    bound_here |= {n.id for t in targets for n in walk([t]) if isinstance(n, ast.Name)}
            if bounds & bound_here:
                return True
    return False


def _attention_finding(src: PySource, ev: AttentionEvent) -> Finding:
    node = ev.scores
    what = f"{call_name(node)}()" if isinstance(node, ast.Call) else "this @ product"
    message = (f"hand-written attention: {what} builds the full score matrix (batch x heads x N x M), which a "
               f"softmax normalises and line {ev.product.lineno} multiplies with the values; memory grows "
               f"with the square of the sequence length: use F.scaled_dot_product_attention")  # type: ignore[attr-defined]
    return finding(src, node, "GPU001", message,
                    Fix(DISPLAY_ONLY, "replace the product, softmax and product with "
                        "F.scaled_dot_product_attention(q, k, v, attn_mask=..., scale=...) on (B, H, N, D) tensors"))


def _tolist_fix(src: PySource, node: ast.AST, description: str) -> Fix:
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        _, end = src.span(node)
        return Fix(UNSAFE, description, (Edit(end, end, ".tolist()"),))
    return Fix(DISPLAY_ONLY, description)


def _shape_tensor_finding(src: PySource, ev: ShapeTensorEvent, origin: str | None = None) -> Finding:
    """At the binding (the place to change: `.tolist()` goes there), naming the first use; with
    `origin`, the caller in another function or module that passes the tensor."""
    tensor = _short(src, ev.unpacked, 40)
    use = _short(src, ev.use, 40)
    where = f" (line {ev.use.lineno})" if ev.use.lineno != ev.unpacked.lineno else ""  # type: ignore[attr-defined]
    reduced = isinstance(ev.unpacked, ast.Call) and call_name(ev.unpacked) in _REDUCTIONS
    if reduced and origin is None:
        message = (f"`{tensor}` reduces a tensor of sizes to a 0-d tensor: `{use}`{where} uses it as a number (on CUDA "
                   f"a kernel, and converting it synchronises, which is where an earlier asynchronous error such as "
                   f"'misaligned address' gets reported); take it as a Python int once with .item()")
        fix = Fix(UNSAFE, f"`{tensor}.item()` (a Python int)", (Edit(src.span(ev.unpacked)[1], src.span(ev.unpacked)[1],
                                                                     ".item()"),))
        return finding(src, ev.unpacked, "GPU004", message, fix)
    if origin is None:
        message = (f"shape values taken from the tensor `{tensor}` are 0-d tensors: `{use}`{where} runs tensor ops "
                   f"(on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
                   f"such as 'misaligned address' gets reported); convert them to Python ints first with .tolist()")
        return finding(src, ev.unpacked, "GPU004", message,
                        _tolist_fix(src, ev.unpacked, f"unpack `{tensor}.tolist()` (Python ints) instead of tensor elements"))
    message = (f"`{tensor}` is {origin}: the values taken from it here are 0-d tensors, so `{use}`{where} runs tensor "
               f"ops (on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
               f"such as 'misaligned address' gets reported); pass Python ints there (.tolist()) or convert here")
    from gpudoctor.lint import autofix  # the conversion at the binding, where its shape allows one

    return finding(src, ev.unpacked, "GPU004", message, autofix.shape_values(
        src, ev.unpacked, "pass .tolist() where the tensor of sizes is handed on, or convert it here"))


def _shape_arg_finding(src: PySource, ev: ShapeArgEvent) -> Finding:
    value = _short(src, ev.value, 40)
    message = (f"{ev.keyword}= gets `{value}`, a row of a tensor of sizes: the callee unpacks 0-d tensors, so its "
               f"shape arithmetic runs tensor ops (and syncs on CUDA, where an earlier asynchronous error such "
               f"as 'misaligned address' gets reported); pass `{value}.tolist()`")
    return finding(src, ev.value, "GPU004", message, _tolist_fix(src, ev.value, f"pass `{value}.tolist()`"))


# --- GPU002: sdp_kernel -----------------------------------------------------------------------

_SDP = "torch.backends.cuda.sdp_kernel"


def _sdp_kernel(src: PySource) -> list[Finding]:
    out: list[Finding] = []
    call_funcs: set[int] = set()
    calls: list[ast.Call] = []
    refs: list[ast.AST] = []
    for node, _ in src.nodes_on_lines(src.lines_matching(_words(src.spellings(_SDP))), (ast.Call, ast.Attribute, ast.Name)):
        if isinstance(node, ast.Call) and src.qualname(node.func) == _SDP:
            calls.append(node)
            call_funcs.add(id(node.func))
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
            refs.append(node)
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    for node in refs:
        if id(node) not in call_funcs and src.qualname(node) == _SDP:
            out.append(finding(src, node, "GPU002",
                                "torch.backends.cuda.sdp_kernel is deprecated (FutureWarning since PyTorch 2.3) and "
                                "will be removed: use torch.nn.attention.sdpa_kernel with a list of SDPBackend values",
                                Fix(DISPLAY_ONLY, "use torch.nn.attention.sdpa_kernel([...SDPBackend...])")))
    for call in calls:
        backends = _sdp_backends(call)
        message = ("torch.backends.cuda.sdp_kernel() is deprecated (FutureWarning since PyTorch 2.3) and will be "
                   "removed: use torch.nn.attention.sdpa_kernel(")
        if backends is None:
            out.append(finding(src, call, "GPU002", message + "[...]) listing the backends whose flag is true",
                                Fix(DISPLAY_ONLY, "list the SDPBackend members whose enable_* flag is true")))
            continue
        listed = "[" + ", ".join(f"SDPBackend.{b}" for b in backends) + "]"
        fix = _sdp_fix(src, call, listed)
        out.append(finding(src, call, "GPU002", message + listed + ")", fix))
    return out


def _sdp_backends(call: ast.Call) -> list[str] | None:
    flags = {name: True for name in _SDP_POSITIONAL}
    if len(call.args) > len(_SDP_POSITIONAL):
        return None
    for name, arg in zip(_SDP_POSITIONAL, call.args):
        if isinstance(arg, ast.Starred) or not (isinstance(arg, ast.Constant) and isinstance(arg.value, bool)):
            return None
        flags[name] = arg.value
    for kw in call.keywords:
        if kw.arg not in flags or not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
            return None
        flags[kw.arg] = kw.value.value
    return [backend for name, backend in _SDP_ORDER if flags[name]]


def _sdp_fix(src: PySource, call: ast.Call, listed: str) -> Fix:
    description = "use sdpa_kernel(%s) (from torch.nn.attention import SDPBackend, sdpa_kernel)" % listed
    have = src.imports.get("sdpa_kernel") == "torch.nn.attention.sdpa_kernel" and \
        src.imports.get("SDPBackend") == "torch.nn.attention.SDPBackend"
    bound = _module_bindings(src)
    if not have and (("sdpa_kernel" in bound and src.imports.get("sdpa_kernel") != "torch.nn.attention.sdpa_kernel")
                     or ("SDPBackend" in bound and src.imports.get("SDPBackend") != "torch.nn.attention.SDPBackend")):
        return Fix(DISPLAY_ONLY, description)
    edits = []
    start, end = src.span(call)
    edits.append(Edit(start, end, f"sdpa_kernel({listed})"))
    if not have:
        if not src.import_nodes:
            return Fix(DISPLAY_ONLY, description)
        last = src.import_nodes[-1]
        pos = src.offset(last.end_lineno, last.end_col_offset)  # type: ignore[arg-type]
        edits.append(Edit(pos, pos, src.newline + "from torch.nn.attention import SDPBackend, sdpa_kernel"))
    return Fix(SAFE, description, tuple(edits))


def _module_bindings(src: PySource) -> set[str]:
    """Names bound anywhere in the file that could shadow the fix's imports."""
    names = set(src.imports) | {n.name for n in src.functions} | {c.name for c in src.classes}
    for name in ("sdpa_kernel", "SDPBackend"):
        if re.search(r"\b%s\s*(=|,[^\n]*=)|as\s+%s\b" % (name, name), src.text):
            names.add(name)
    return names


# --- GPU005: Parameter reassignment -----------------------------------------------------------


def _is_parameter_call(src: PySource, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    q = src.qualname(node.func) or ""
    return q.endswith(".Parameter") or q == "Parameter"


def _cast_of(node: ast.AST) -> tuple[ast.Call, str, ast.expr] | None:
    """`recv.to(...)` / `recv.half()`: (call, method, receiver)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CASTS:
        if node.func.attr in ("to", "type") and not node.args and not node.keywords:
            return None
        return node, node.func.attr, node.func.value
    return None


def _parameter_reassign(src: PySource) -> list[Finding]:
    out: list[Finding] = []
    assigns = [st for st, _ in src.stmts if isinstance(st, ast.Assign) and len(st.targets) == 1]
    # parameters and standard modules per class, by attribute name on self
    for cls in src.classes:
        params: set[str] = set()
        modules: set[str] = set()
        stmts = [st for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for st in src.scope_statements(m)]
        for node in stmts:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = dotted(node.targets[0])
                if key and key.startswith("self.") and key.count(".") == 1:
                    if _is_parameter_call(src, node.value):
                        params.add(key)
                    elif isinstance(node.value, ast.Call):
                        q = src.qualname(node.value.func) or ""
                        if q.startswith("torch.nn.") and _STD_WEIGHTED.match(q.rsplit(".", 1)[-1]):
                            modules.add(key)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                c = node.value
                if call_name(c) == "register_parameter" and c.args and isinstance(c.args[0], ast.Constant) and \
                        isinstance(c.args[0].value, str) and isinstance(c.func, ast.Attribute) and \
                        dotted(c.func.value) == "self":
                    params.add("self." + c.args[0].value)
        known = params | {f"{m}.weight" for m in modules} | {f"{m}.bias" for m in modules}
        for base in cls.bases:  # class LayerNorm2d(nn.LayerNorm): self.weight is the parent's Parameter
            q = src.qualname(base) or ""
            if q.startswith("torch.nn.") and _STD_WEIGHTED.match(q.rsplit(".", 1)[-1]):
                known |= {"self.weight", "self.bias"}
        if known:
            for m in cls.body:
                if not isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in src.scope_statements(m):
                    f = None
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        f = _reassign(src, node, known)
                        if f is None and m.name != "__init__":
                            f = _computed(src, node, known)
                    elif isinstance(node, ast.Expr):
                        f = _thrown_away(src, node, known)
                    if f:
                        out.append(f)
    # module level and plain functions: `m.p = nn.Parameter(...)` then `m.p = m.p.to(...)`
    for scope in [src.tree, *src.functions]:
        known = set()
        for node in src.scope_statements(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = dotted(node.targets[0])
                if key and "." in key and not key.startswith("self.") and _is_parameter_call(src, node.value):
                    known.add(key)
                elif key in known:
                    f = _reassign(src, node, known)
                    if f:
                        out.append(f)
            elif known and isinstance(node, ast.Expr):
                f = _thrown_away(src, node, known)
                if f:
                    out.append(f)
    # `x.p = nn.Parameter(t).to(...)`
    for node in assigns:
        if isinstance(node.targets[0], ast.Attribute):
            cast = _cast_of(node.value)
            if cast and _is_parameter_call(src, cast[2]):
                out.append(_parameter_then_cast(src, node, cast))
    from gpudoctor.lint.pyparams import foreign_parameter_casts

    out += foreign_parameter_casts(src)  # m.bias = m.bias.float() on a module typed nn.Linear
    unique = {(f.line, f.col): f for f in out}
    return list(unique.values())


_THROWN = {"to", "half", "float", "double", "bfloat16", "cuda", "cpu", "type"}


def _thrown_away(src: PySource, node: ast.Expr, known: set[str]) -> Finding | None:
    """`self.p.half()` as a statement: a parameter's conversion returns a new tensor, which is
    dropped; the parameter keeps its dtype (a module's .half() converts in place, this does not)."""
    c = node.value
    if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _THROWN):
        return None
    if c.func.attr in ("to", "type") and not c.args and not c.keywords:
        return None
    key = dotted(c.func.value)
    if key not in known:
        return None
    method = c.func.attr
    spelt = src.segment(c.func.value)
    start, _ = src.span(c)
    _, recv_end = src.span(c.func.value)
    fix = Fix(UNSAFE, f"convert in place: {spelt}.data = {spelt}.data.{method}(...)",
              (Edit(start, start, f"{spelt}.data = "), Edit(recv_end, recv_end, ".data")))
    message = (f"{key}.{method}(...) returns a converted copy of the nn.Parameter and drops it: unlike a module's "
               f".{method}(), a parameter's conversion is not in place, so {key} keeps its old dtype/device (a "
               f"float32 parameter next to a half-precision model: 'expected scalar type' / 'mat1 and mat2 must "
               f"have the same dtype'); convert in place: {spelt}.data = {spelt}.data.{method}(...)")
    return finding(src, node, "GPU005", message, fix)


def _computed(src: PySource, node: ast.Assign, known: set[str]) -> Finding | None:
    """`self.p = F.softmax(self.p, dim=0)`: a tensor computed from the parameter, assigned back to
    its name, which nn.Module refuses (TypeError) once it is a registered parameter."""
    key = dotted(node.targets[0])
    value = node.value
    if key not in known or _is_parameter_call(src, value):
        return None
    if not any(isinstance(n, (ast.Attribute, ast.Name)) and dotted(n) == key for n in walk([value])):
        return None
    if isinstance(value, ast.Call):
        q = src.qualname(value.func) or ""
        if isinstance(value.func, ast.Attribute) and (dotted(value.func.value) or "").split(".")[0] == "self" \
                and dotted(value.func.value) != key:
            return None  # self.helper(self.p): it may return a Parameter
        if not (q.startswith("torch.") or (isinstance(value.func, ast.Attribute) and dotted(value.func.value) == key)):
            return None
    elif not isinstance(value, ast.BinOp):
        return None
    shown = _short(src, value, 50)
    local = key.rsplit(".", 1)[-1]
    message = (f"{key} is an nn.Parameter, and `{shown}` is a plain Tensor computed from it: assigning it to the "
               f"parameter's name raises TypeError: cannot assign ... as parameter (torch.nn.Parameter or None "
               f"expected) (and would replace the learned values with a computed copy on every call); keep it in "
               f"a local name: {local} = {shown}")
    return finding(src, node, "GPU005", message,
                    Fix(DISPLAY_ONLY, f"assign the computed tensor to a local name ({local} = ...) and use that"))


def _reassign(src: PySource, node: ast.Assign, known: set[str]) -> Finding | None:
    key = dotted(node.targets[0])
    cast = _cast_of(node.value)
    if not key or key not in known or not cast or dotted(cast[2]) != key:
        return None
    call, method, recv = cast
    target = node.targets[0]
    _, tend = src.span(target)
    _, rend = src.span(recv)
    fix = Fix(SAFE, f"convert in place: {key}.data = {key}.data.{method}(...)",
              (Edit(tend, tend, ".data"), Edit(rend, rend, ".data")))
    message = (f"{key} is an nn.Parameter, but {key}.{method}(...) returns a plain Tensor whenever it converts: the "
               f"assignment raises TypeError: cannot assign ... as parameter (torch.nn.Parameter or None expected); "
               f"convert in place ({key}.data = {key}.data.{method}(...)) or convert the module")
    return finding(src, node, "GPU005", message, fix)


def _parameter_then_cast(src: PySource, node: ast.Assign, cast: tuple[ast.Call, str, ast.expr]) -> Finding:
    call, method, param_call = cast
    key = dotted(node.targets[0]) or "the attribute"
    assert isinstance(param_call, ast.Call)
    _, pend = src.span(param_call)
    _, cend = src.span(call)
    suffix = src.text[pend:cend]  # ".to(device)"
    fix = Fix(DISPLAY_ONLY, f"convert the data inside: nn.Parameter(t{suffix.strip()})")
    if len(param_call.args) >= 1 and not isinstance(param_call.args[0], ast.Starred):
        data = param_call.args[0]
        ds, de = src.span(data)
        simple = isinstance(data, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        edits = [Edit(pend, cend, "")]
        if simple:
            edits.append(Edit(de, de, suffix))
        else:
            edits += [Edit(ds, ds, "("), Edit(de, de, ")" + suffix)]
        fix = Fix(SAFE, f"convert the data inside: nn.Parameter(data{suffix.strip()})", tuple(sorted(edits)))
    message = (f"nn.Parameter(...){suffix.split('(')[0]}(...) is a plain Tensor whenever the conversion happens, so "
               f"{key} is not registered as a parameter (missing from parameters(), the optimizer and the state "
               f"dict); convert the data first: nn.Parameter(data{suffix.split('(')[0]}(...))")
    return finding(src, node, "GPU005", message, fix)


# --- GPU007: xformers -------------------------------------------------------------------------


def _xformers(src: PySource) -> list[Finding]:
    out: list[Finding] = []
    spelt = src.spellings("xformers.ops.memory_efficient_attention") | {"memory_efficient_attention"}
    for node, _ in src.nodes_on_lines(src.lines_matching(_words(spelt)), (ast.Call,)):
        assert isinstance(node, ast.Call)
        name = call_name(node)
        if isinstance(node.func, ast.Name):
            name = (src.qualname(node.func) or name).rsplit(".", 1)[-1]
        if name == "enable_xformers_memory_efficient_attention" and isinstance(node.func, ast.Attribute):
            out.append(finding(src, node, "GPU007", (
                "enable_xformers_memory_efficient_attention(): xformers 0.0.30-0.0.32 run a Hopper-only "
                "FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120: 'invalid argument' or "
                "'too new'); without this call diffusers uses PyTorch SDPA, which has kernels for them"),
                Fix(DISPLAY_ONLY, "drop the call (diffusers uses SDPA by default on torch >= 2.0)")))
        elif name == "memory_efficient_attention":
            q = src.qualname(node.func) or ""
            if q.startswith("xformers.") or q in ("xops.memory_efficient_attention",):
                out.append(finding(src, node, "GPU007", (
                    "xformers.ops.memory_efficient_attention: xformers 0.0.30-0.0.32 dispatch fp16/bf16 inputs to a "
                    "Hopper-only FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120); "
                    "F.scaled_dot_product_attention on (B, H, N, D) tensors runs there"),
                    Fix(DISPLAY_ONLY, "F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), "
                                      "v.transpose(1, 2)).transpose(1, 2) for (B, N, H, D) inputs")))
    return out
