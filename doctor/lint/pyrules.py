"""The Python rules: turn the dataflow events of `pyflow` into findings (GPU001, GPU003, GPU004,
GPU008) and check the rules that need only the tree: sdp_kernel (GPU002), Parameter reassignment
(GPU005), arch flags in setup.py / cpp_extension calls (GPU006), xformers call sites (GPU007) and
modules created after a cast (GPU011).

GPU011 is partly cross-file: a method that creates float32 submodules and never converts them is
summarised here (`Facts.creators`), and so is every call made on an object after it was cast
(`Facts.after_cast`); gpudoctor.lint.engine pairs them over all linted files in its cross-file step.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from gpudoctor.lint import archflags, rules
from gpudoctor.lint.latemodules import NEVER_LATE, builders, imported_function, late_method
from gpudoctor.lint.latemodules import receiver as late_receiver
from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, UNSAFE, Edit, Finding, Fix
from gpudoctor.lint.pyflow import (AttentionEvent, FlashLayoutEvent, Interp, ShapeArgEvent, ShapeTensorEvent, TV,
                                   ViewEvent)
from gpudoctor.lint.pysource import PySource, call_name, dotted, kwarg, walk
from gpudoctor.lint.rules import BY_CODE

_CASTS = {"to", "half", "float", "double", "bfloat16", "cuda", "cpu", "type", "type_as"}
_LOW_PRECISION = {"bfloat16", "float16", "half", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
_STD_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm[123]d|InstanceNorm[123]d|Embedding|EmbeddingBag|PReLU)$")
_BUILDER = ("__", "_init", "init", "build", "_build", "setup", "_setup", "reset", "_reset", "create", "_create",
            "make", "_make", "construct", "_construct", "forward", "extra_repr", "load", "_load", "from_")
_SDP_ORDER = (("enable_flash", "FLASH_ATTENTION"), ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
              ("enable_math", "MATH"), ("enable_cudnn", "CUDNN_ATTENTION"))
_SDP_POSITIONAL = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")


@dataclass
class Facts:
    """What a file contributes to the project pass (gpudoctor.lint.project; picklable)."""

    # GPU011: method name -> what it creates and never converts: (finding at the assignment, the
    # class it builds when only the project knows whether that class has weights, or None)
    creators: dict[str, list[tuple[Finding, str | None]]] = field(default_factory=dict)
    # calls on an object after it was cast: (method, line, col, cast object, cast line, receiver)
    after_cast: list[tuple[str, int, int, str, int, str]] = field(default_factory=list)
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
    size_calls: list[tuple[tuple[str, ...], int | str, int, str, int, int]] = field(default_factory=list)
    size_fallbacks: dict[int, Finding] = field(default_factory=dict)
    returns_probs: set[str] = field(default_factory=set)
    returns_scores: set[str] = field(default_factory=set)
    cond_attention: list[tuple[str, str, Finding]] = field(default_factory=list)


def _finding(src: PySource, node: ast.AST, code: str, message: str, fix: Fix,
             line: int | None = None, byte_col: int | None = None) -> Finding:
    lineno = line if line is not None else node.lineno  # type: ignore[attr-defined]
    col = byte_col if byte_col is not None else node.col_offset  # type: ignore[attr-defined]
    end_line = getattr(node, "end_lineno", lineno) or lineno
    end_col = src.char_col(end_line, getattr(node, "end_col_offset", col) or col) + 1
    return Finding(path=src.path, line=lineno, col=src.char_col(lineno, col) + 1, code=code,
                   kb_id=BY_CODE[code].kb_id, message=message, fix=fix, end_line=end_line, end_col=end_col)


def _short(src: PySource, node: ast.AST, limit: int = 60) -> str:
    text = " ".join(src.segment(node).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check(src: PySource, codes: set[str], facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    if codes & {"GPU001", "GPU003", "GPU004", "GPU008"}:
        out += _flow_rules(src, codes, facts)
    if "GPU002" in codes:
        out += _sdp_kernel(src)
    if "GPU005" in codes:
        out += _parameter_reassign(src)
    if "GPU006" in codes:
        out += _arch_flags(src)
    if "GPU007" in codes:
        out += _xformers(src)
    if "GPU011" in codes:
        out += _module_after_cast(src, facts)
    return out


# --- dataflow rules ----------------------------------------------------------------------------


# Per function: the text a function must contain for the dataflow to look at it for a rule.
_TRIGGERS = {
    # softmax in the function, or a helper's probabilities multiplied here (named so)
    "GPU001": (("softmax", "get_attention_scores", "probs", "scores", "attn"), re.compile(rules.ATTENTION_PRODUCT.decode())),
    "GPU003": ((".view(",), re.compile(rules.NONCONTIGUOUS.decode())),
    "GPU004": (("tensor(", "stack(", "Tensor(", "_sizes", "shape", "size"), None),
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


def _flow_rules(src: PySource, codes: set[str], facts: Facts | None = None) -> list[Finding]:
    triggers = _triggers(src, codes)

    def want(fn: ast.AST) -> bool:
        return _wanted(src.scope_text(fn), triggers)

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
    if "GPU004" in codes and interp.calls:
        classes = _class_of(src)
        targets = {}
        for c in interp.calls:
            if c.seed is None and id(c.value) not in targets:
                target = call_target(src, c.call, c.fn, classes)
                targets[id(c.value)] = target
                if target is not None:
                    facts.size_calls.append((target, c.slot, c.rank, _short(src, c.value, 40), c.value.lineno,
                                             id(c.value)))
        deferred = {k: None for k, t in targets.items() if t is not None}  # type: ignore[misc]
    for ev in _one_per_group(interp.events):
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
            f = _finding(src, ev.arg, "GPU008", ev.detail,
                         Fix(DISPLAY_ONLY, "pass (batch, seqlen, heads, head_dim) tensors: drop or undo the transpose(1, 2)"))
        if f is not None:
            key = (f.line, f.col, f.code)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _one_per_group(events: list) -> list:
    """One GPU004 finding per group of bindings: `t = sizes[0]; h = sizes[1]; w = sizes[2]` on
    consecutive lines (or `sizes[1], sizes[2]` on one line) are one place to change."""
    out, last = [], {}
    for ev in events:
        if isinstance(ev, ShapeTensorEvent) and isinstance(ev.unpacked, ast.Subscript):
            base = dotted(ev.unpacked.value)
            line = ev.unpacked.lineno
            if base is not None:
                prev = last.get(base)
                last[base] = line
                if prev is not None and 0 <= line - prev <= 1:
                    continue
        out.append(ev)
    return out


# --- GPU004 across functions and modules (the project pass calls these) ---------------------------


def _class_of(src: PySource) -> dict[int, ast.ClassDef]:
    """id(method node) -> its class."""
    return {id(m): cls for cls in src.classes for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}


def call_target(src: PySource, call: ast.Call, fn: ast.AST | None, classes: dict[int, ast.ClassDef]) -> tuple[str, ...] | None:
    """What a call refers to, in absolute names the project pass can look up: ("func", name),
    ("method", class, name) for self.name(...), ("attr", class, name) for self.name(...) where
    name is a submodule, ("super", class, name); None when this file cannot tell."""
    func = call.func
    cls = classes.get(id(fn)) if fn is not None else None
    cls_name = f"{src.module}.{cls.name}" if cls is not None and src.module else None
    if isinstance(func, ast.Name):
        q = src.qualify(func.id)
        return ("func", q) if q else None
    if not isinstance(func, ast.Attribute):
        return None
    base = func.value
    if isinstance(base, ast.Name) and base.id == "self" and cls_name:
        own = any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == func.attr for m in cls.body)  # type: ignore[union-attr]
        return ("method" if own else "attr", cls_name, func.attr)
    if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super" and cls_name:
        return ("super", cls_name, func.attr)
    if isinstance(base, ast.Name):
        q = src.qualify(base.id)
        if q and not q.rsplit(".", 1)[-1][:1].isupper():
            return ("func", f"{q}.{func.attr}")  # module.function
    return None


def class_info(src: PySource, name: str) -> tuple[tuple[str, ...], dict[str, ast.AST], dict[str, str]] | None:
    """A top-level class of this file: its bases (absolute names), its methods, and the classes
    its __init__ assigns to attributes (self.attn = Attention(...))."""
    cls = next((c for c in src.tree.body if isinstance(c, ast.ClassDef) and c.name == name), None)
    if cls is None:
        return None
    bases = []
    for b in cls.bases:
        root = dotted(b) or ""
        head, _, rest = root.partition(".")
        q = src.qualify(head) if head else None
        if q:
            bases.append(f"{q}.{rest}" if rest else q)
    methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    ctors: dict[str, str] = {}
    init = methods.get("__init__")
    if init is not None:
        for st in src.scope_statements(init):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call) and \
                    isinstance(st.value.func, ast.Name):
                key = dotted(st.targets[0]) or ""
                q = src.qualify(st.value.func.id)
                if key.startswith("self.") and key.count(".") == 1 and q:
                    ctors[key[5:]] = q
    return tuple(bases), methods, ctors


def function_node(src: PySource, name: str) -> ast.AST | None:
    return next((f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name),
                None)


def whatif(src: PySource, fn: ast.AST, param: str, rank: int, origin: str):
    """Interpret one function as if `param` were a tensor of sizes (rank 2) or a row of one (rank
    1), handed over by a caller described by `origin`: the GPU004 findings that follows (at each
    binding) and the calls that hand it on: [(target, slot, rank, value text, line)]."""
    interp = Interp(src)
    interp.fn_seeds[id(fn)] = {param: TV(rank=rank, sizes=True, seed=param)}
    interp.run(lambda f: f is fn)
    findings = [_shape_tensor_finding(src, ev, origin) for ev in _one_per_group(interp.events)
                if isinstance(ev, ShapeTensorEvent) and ev.seed == param]
    classes = _class_of(src)
    onward = []
    for c in interp.calls:
        if c.seed == param and c.fn is fn:
            target = call_target(src, c.call, fn, classes)
            if target is not None:
                onward.append((target, c.slot, c.rank, _short(src, c.value, 40), c.value.lineno))
    return findings, onward


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
    f = _finding(src, ev.call, "GPU003", message, fix, line=line, byte_col=byte_col)
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
    return _finding(src, node, "GPU001", message,
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
    if origin is None:
        message = (f"shape values taken from the tensor `{tensor}` are 0-d tensors: `{use}`{where} runs tensor ops "
                   f"(on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
                   f"such as 'misaligned address' gets reported); convert them to Python ints first with .tolist()")
        return _finding(src, ev.unpacked, "GPU004", message,
                        _tolist_fix(src, ev.unpacked, f"unpack `{tensor}.tolist()` (Python ints) instead of tensor elements"))
    message = (f"`{tensor}` is {origin}: the values taken from it here are 0-d tensors, so `{use}`{where} runs tensor "
               f"ops (on CUDA a kernel each, and int() synchronises, which is where an earlier asynchronous error "
               f"such as 'misaligned address' gets reported); pass Python ints there (.tolist()) or convert here")
    return _finding(src, ev.unpacked, "GPU004", message,
                    Fix(DISPLAY_ONLY, "pass .tolist() where the tensor of sizes is handed on, or convert it here"))


def _shape_arg_finding(src: PySource, ev: ShapeArgEvent) -> Finding:
    value = _short(src, ev.value, 40)
    message = (f"{ev.keyword}= gets `{value}`, a row of a tensor of sizes: the callee unpacks 0-d tensors, so its "
               f"shape arithmetic runs tensor ops (and syncs on CUDA, where an earlier asynchronous error such "
               f"as 'misaligned address' gets reported); pass `{value}.tolist()`")
    return _finding(src, ev.value, "GPU004", message, _tolist_fix(src, ev.value, f"pass `{value}.tolist()`"))


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
            out.append(_finding(src, node, "GPU002",
                                "torch.backends.cuda.sdp_kernel is deprecated (FutureWarning since PyTorch 2.3) and "
                                "will be removed: use torch.nn.attention.sdpa_kernel with a list of SDPBackend values",
                                Fix(DISPLAY_ONLY, "use torch.nn.attention.sdpa_kernel([...SDPBackend...])")))
    for call in calls:
        backends = _sdp_backends(call)
        message = ("torch.backends.cuda.sdp_kernel() is deprecated (FutureWarning since PyTorch 2.3) and will be "
                   "removed: use torch.nn.attention.sdpa_kernel(")
        if backends is None:
            out.append(_finding(src, call, "GPU002", message + "[...]) listing the backends whose flag is true",
                                Fix(DISPLAY_ONLY, "list the SDPBackend members whose enable_* flag is true")))
            continue
        listed = "[" + ", ".join(f"SDPBackend.{b}" for b in backends) + "]"
        fix = _sdp_fix(src, call, listed)
        out.append(_finding(src, call, "GPU002", message + listed + ")", fix))
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
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS:
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
    return _finding(src, node, "GPU005", message, fix)


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
    return _finding(src, node, "GPU005", message,
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
    return _finding(src, node, "GPU005", message, fix)


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
    return _finding(src, node, "GPU005", message, fix)


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


def _arch_flags(src: PySource) -> list[Finding]:
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
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, (ast.List, ast.Tuple)) and \
                    id(st.value) not in have:
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
            verdict = archflags.judge(archflags.nvcc_targets(group), "these nvcc flags")
            if verdict:
                verdicts.append((verdict, node))
    # 2. TORCH_CUDA_ARCH_LIST set from Python
    values, unknown = _torch_arch_values(src)
    if values and not unknown and (len({v.text for v, _ in values}) == 1 or _toolkit_alternatives(src, values)):
        for tok, node in values:
            verdict = archflags.judge(archflags.torch_arch_targets([tok]), "TORCH_CUDA_ARCH_LIST")
            if verdict:
                verdicts.append((verdict, node))
    for verdict, node in verdicts:
        start = verdict.anchor.start
        if start is not None:
            import bisect

            line = bisect.bisect_right(src.starts, start)
            col = start - src.starts[line - 1]
            byte_col = len(src.lines[line - 1][:col].encode("utf-8"))
        else:
            line, byte_col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        fix = Fix(SAFE, "add PTX for the newest target", verdict.edits) if verdict.edits else \
            Fix(DISPLAY_ONLY, verdict.hint)
        out.append(_finding(src, node, "GPU006", verdict.message, fix, line=line, byte_col=byte_col))
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
        if isinstance(node, ast.Name) and node.id not in resolving:
            # `[...] + version_macros + cc_flag`: a list name of this scope, bound to a literal
            # (and appended to) before this use, adds its words
            resolving.add(node.id)
            try:
                return _named_list(src, node.id, node.lineno, scope, add_literal)
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
    if start is None or not isinstance(start.value, (ast.List, ast.Tuple)):
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
            out.append(_finding(src, node, "GPU007", (
                "enable_xformers_memory_efficient_attention(): xformers 0.0.30-0.0.32 run a Hopper-only "
                "FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120: 'invalid argument' or "
                "'too new'); without this call diffusers uses PyTorch SDPA, which has kernels for them"),
                Fix(DISPLAY_ONLY, "drop the call (diffusers uses SDPA by default on torch >= 2.0)")))
        elif name == "memory_efficient_attention":
            q = src.qualname(node.func) or ""
            if q.startswith("xformers.") or q in ("xops.memory_efficient_attention",):
                out.append(_finding(src, node, "GPU007", (
                    "xformers.ops.memory_efficient_attention: xformers 0.0.30-0.0.32 dispatch fp16/bf16 inputs to a "
                    "Hopper-only FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120); "
                    "F.scaled_dot_product_attention on (B, H, N, D) tensors runs there"),
                    Fix(DISPLAY_ONLY, "F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), "
                                      "v.transpose(1, 2)).transpose(1, 2) for (B, N, H, D) inputs")))
    return out


# --- GPU011: modules created after a cast -----------------------------------------------------


def _dtype_like(node: ast.AST | None) -> bool:
    """torch.bfloat16 / torch.float16 / dtype / self.dtype / weight.dtype (not float32)."""
    if node is None:
        return False
    if isinstance(node, ast.IfExp):  # torch_dtype=(torch.bfloat16 if args.bf16 else None)
        return _dtype_like(node.body) or _dtype_like(node.orelse)
    if isinstance(node, ast.Attribute):
        if node.attr in _LOW_PRECISION:
            return True
        return node.attr == "dtype" or node.attr.endswith("_dtype")
    if isinstance(node, ast.Name):
        return "dtype" in node.id.lower()
    return False


def _cast_event(node: ast.AST) -> str | None:
    """The receiver of `X.to(bf16)`, `X.half()`, `X.bfloat16()`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    method = node.func.attr
    recv = dotted(node.func.value)
    if not recv:
        return None
    if method in ("half", "bfloat16") and not node.args:
        return recv
    if method == "to" and (any(_dtype_like(a) for a in node.args) or _dtype_like(kwarg(node, "dtype"))):
        return recv
    return None


_WEIGHTED = re.compile(r"^(Linear|LazyLinear|Bilinear|Conv[123]d|ConvTranspose[123]d|Embedding|EmbeddingBag|"
                       r"LayerNorm|GroupNorm|RMSNorm|BatchNorm[123]d|InstanceNorm[123]d|MultiheadAttention|LSTM|GRU|"
                       r"RNN|PReLU|Transformer\w*)$")
_WEIGHTS_TEXT = re.compile(r"(?:nn|torch\.nn)\.(?:Linear|Bilinear|Conv\w*|Embedding\w*|LayerNorm|GroupNorm|RMSNorm|"
                           r"BatchNorm\w*|InstanceNorm\w*|MultiheadAttention|Transformer\w*|LSTM|GRU|RNN|PReLU|Parameter)\("
                           r"|\bParameter\(")
_CASTS_INPUTS = re.compile(r"\.to\([^)\n]*dtype|\.type_as\(|autocast\(")


def _creates_module(src: PySource, node: ast.AST, local_modules) -> bool:
    """A new float32 module with weights: nn.Linear(...) / a local module class that creates
    weights and does not cast its inputs to them / nn.Parameter(torch.randn(...)); no dtype,
    not cast."""
    if not isinstance(node, ast.Call):
        return False
    q = src.qualname(node.func) or ""
    last = q.rsplit(".", 1)[-1]
    if any(k.arg in ("dtype",) or k.arg is None for k in node.keywords):
        return False
    if "dtype" in src.segment(node):
        return False
    if last == "Parameter":
        # nn.Parameter(torch.randn(1, dim) * 0.02): data made here, in float32
        data = node.args[0] if node.args else kwarg(node, "data")
        while isinstance(data, ast.BinOp):
            data = data.left if isinstance(data.left, (ast.Call, ast.BinOp)) else data.right
        if not isinstance(data, ast.Call):
            return False
        dq = src.qualname(data.func) or ""
        return dq.startswith("torch.") and call_name(data) in ("randn", "zeros", "ones", "empty", "rand", "full", "tensor")
    if q.startswith("torch.nn.") and _WEIGHTED.match(last):
        return True
    if last in ("ModuleList", "Sequential", "ModuleDict") and q.startswith("torch.nn."):
        return any(_creates_module(src, n, local_modules) for n in walk([node]) if n is not node)
    info = local_modules.get(last) if isinstance(node.func, ast.Name) else None
    return bool(info) and info[0] and not info[1]


def _local_modules(src: PySource) -> dict[str, tuple[bool, bool]]:
    """nn.Module subclasses of this file: name -> (creates weights, casts its inputs to them)."""
    classes = {c.name: c for c in src.classes}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            for b in cls.bases:
                q = src.qualname(b) or ""
                last = q.rsplit(".", 1)[-1]
                if last in found or last in ("Module", "ModelMixin", "PreTrainedModel"):
                    found.add(name)
                    changed = True
                    break
    texts = {name: src.scope_text(classes[name]) for name in found}
    weights = {name for name in found if _WEIGHTS_TEXT.search(texts[name])}
    changed = True
    while changed:  # a class built from weighted local classes has weights too
        changed = False
        for name in found - weights:
            if any(re.search(r"\b%s\(" % other, texts[name]) for other in weights):
                weights.add(name)
                changed = True
    return {name: (name in weights, bool(_CASTS_INPUTS.search(texts[name]))) for name in found}


_CAST_TEXT = re.compile(r"\.(half|bfloat16)\(\)|\.to\([^)\n]*(dtype|bfloat16|float16|half)|torch_dtype\s*=")
_CONVERT_TEXT = re.compile(r"\.(to|half|bfloat16|float|type|cuda)\(|dtype|device")
_SIMPLE = (ast.Assign, ast.Expr, ast.AugAssign, ast.AnnAssign, ast.Return)


def _module_after_cast(src: PySource, facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    local = _local_modules(src)
    for scope in [src.tree, *src.functions]:
        text = src.text if scope is src.tree else src.scope_text(scope)
        if not _CAST_TEXT.search(text):
            continue
        cast_at: dict[str, int] = {}
        pending: dict[str, tuple[ast.Assign, str]] = {}
        for s in src.scope_statements(scope):
            if not isinstance(s, _SIMPLE):
                continue
            value = getattr(s, "value", None)
            # conversions resolve pending modules (X.to(...), X.sub.to(...), X.half())
            if pending and _CONVERT_TEXT.search(src.segment(s)):
                for c in walk([s]):
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                            c.func.attr in _CASTS | {"bfloat16", "half"}:
                        recv = dotted(c.func.value) or ""
                        for key in list(pending):
                            if key == recv or key.startswith(recv + ".") or recv.startswith(key + "."):
                                del pending[key]
            # a cast of X (as a statement or X = X.to(...))
            recv = _cast_event(value) if isinstance(s, (ast.Expr, ast.Assign)) else None
            if recv:
                cast_at[recv] = s.lineno
                cast_at.setdefault(recv.split(".")[0], s.lineno)
            # X.attr = nn.Linear(...) after a cast of X
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute):
                key = dotted(s.targets[0])
                owner = dotted(s.targets[0].value)
                if key and owner and owner in cast_at and cast_at[owner] < s.lineno and \
                        _creates_module(src, s.value, local):
                    pending[key] = (s, owner)
            # calls on a cast object: candidates for the cross-file part
            if isinstance(s, (ast.Expr, ast.Assign)) and isinstance(value, ast.Call) and \
                    isinstance(value.func, ast.Attribute):
                c = value
                recv_name = late_receiver(c.func.value) or ""
                # the longest cast prefix: self.pipe.dit.enable_x() after self.pipe was loaded cast
                parts = recv_name.split(".") if recv_name else []
                root = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in cast_at), "")
                if root and cast_at[root] < s.lineno and not c.func.attr.startswith(NEVER_LATE):
                    col = src.char_col(c.func.end_lineno, c.func.end_col_offset - len(c.func.attr)) + 1  # type: ignore[arg-type]
                    facts.after_cast.append((c.func.attr, c.func.end_lineno, col, root, cast_at[root], recv_name))  # type: ignore[arg-type]
            # `pipe = Pipeline.from_pretrained(..., torch_dtype=torch.bfloat16)` loads cast weights
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(value, ast.Call) and \
                    call_name(value).startswith(("from_", "load")):
                target = dotted(s.targets[0])
                td = kwarg(value, "torch_dtype")
                if target and td is not None and _dtype_like(td):
                    cast_at[target] = s.lineno
        for key, (s, owner) in pending.items():
            out.append(_finding(src, s, "GPU011", (
                f"{key} is created after {owner} was cast (line {cast_at[owner]}) and never converted: new modules "
                f"are float32, so their matmuls with the cast model's activations fail with 'mat1 and mat2 must "
                f"have the same dtype'; create it with dtype= or convert it (.to(dtype=..., device=...))"),
                Fix(DISPLAY_ONLY, f"convert it: {key} = {key}.to(dtype=..., device=...) (those of {owner})")))
    # cross-file summaries: methods (not __init__ or its helpers) that add float32 modules, and
    # every class of the file (for creators in other modules)
    for cls in src.classes:
        facts.classes[cls.name] = _class_summary(src, cls)
    facts.builders = builders(src, lambda node: _creates_module(src, node, local))
    for cls in src.classes:  # mixins too (LLaVA's LlavaMetaModel): the call after a cast is the evidence
        methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        from_init = _called_from(src, methods, "__init__")
        for name, m in methods.items():
            if name in from_init or not late_method(name, name.startswith(_BUILDER), src.text):
                continue
            created = _created_in(src, m, local)
            if created:
                facts.creators[name] = created
    return out


_FOREIGN = re.compile(r"[A-Z]\w*$")


def _class_summary(src: PySource, cls: ast.ClassDef) -> tuple[tuple[str, ...], bool, bool, tuple[str, ...]]:
    text = src.scope_text(cls)
    bases = tuple((src.qualname(b) or "").rsplit(".", 1)[-1] for b in cls.bases)
    builds = tuple(sorted(set(re.findall(r"\b([A-Z]\w*)\(", text)) - {cls.name}))
    return bases, bool(_WEIGHTS_TEXT.search(text)), bool(_CASTS_INPUTS.search(text)), builds


def _creation(src: PySource, node: ast.AST, local) -> tuple[bool, str | None] | None:
    """(it creates float32 weights for sure, or the class name only the project can judge) for
    the value of `self.x = ...`; None when it creates nothing new in float32."""
    if _creates_module(src, node, local):
        return True, None
    if not isinstance(node, ast.Call) or any(k.arg == "dtype" or k.arg is None for k in node.keywords) or \
            "dtype" in src.segment(node):
        return None
    q = src.qualname(node.func) or ""
    last = q.rsplit(".", 1)[-1]
    if last in ("ModuleList", "Sequential", "ModuleDict") and q.startswith("torch.nn."):
        for n in walk([node]):
            if n is not node and isinstance(n, ast.Call):
                inner = _creation(src, n, local)
                if inner is not None:
                    return inner
        return None
    if isinstance(node.func, ast.Name) and _FOREIGN.match(node.func.id) and node.func.id not in local and \
            not q.startswith("torch."):
        return False, node.func.id  # a class of another module: the project pass decides
    builder = imported_function(src, node)
    return (False, builder) if builder else None  # build_projector(cfg) of another module: the same


_CONVERTS = {"to", "half", "bfloat16", "float", "double", "type", "cuda"}


def _created_in(src: PySource, m: ast.AST, local) -> list[tuple[Finding, str | None]]:
    """What method `m` assigns to self that creates float32 weights and never converts later in
    the method: module.to() / .half() converts a module in place, a Parameter's does not (its
    result is thrown away: GPU005); self.to(...) converts everything."""
    stmts = src.scope_statements(m)
    out = []
    for i, s in enumerate(stmts):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and (dotted(s.targets[0]) or "").startswith("self.")):
            continue
        made = _creation(src, s.value, local)
        if made is None:
            continue
        key = dotted(s.targets[0]) or ""
        is_param = isinstance(s.value, ast.Call) and (src.qualname(s.value.func) or "").endswith("Parameter")
        if _converted_later(stmts[i + 1:], key, is_param):
            continue
        sure, foreign = made
        what = "an nn.Parameter" if is_param else f"a {foreign or call_name(s.value) or 'module'}"
        what = f"the new module {foreign}() returns" if foreign and foreign[:1].islower() else what
        f = _finding(src, s, "GPU011", (
            f"{key} is {what} created in float32 in {m.name}() and never converted; {{caller}}: float32 "  # type: ignore[attr-defined]
            f"weights meeting the cast model's activations fail with 'mat1 and mat2 must have the same dtype'; "
            f"create it with dtype=/device= of the existing weights or convert it at the end of {m.name}()"),  # type: ignore[attr-defined]
            Fix(DISPLAY_ONLY, f"{key} = {key}.to(dtype=ref.dtype, device=ref.device) with ref = next(self.parameters())"
                if not is_param else f"{key}.data = {key}.data.to(dtype=ref.dtype, device=ref.device)"))
        out.append((f, foreign))
    return out


def _converted_later(stmts: list[ast.stmt], key: str, is_param: bool) -> bool:
    for s in stmts:
        for node in walk([s]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CONVERTS:
                recv = dotted(node.func.value) or ""
                if recv == "self":
                    return True  # self.to(...): every submodule and parameter
                if recv == key and not is_param:
                    return True  # a module converts in place
            if isinstance(node, ast.Assign) and any(dotted(t) in (key, key + ".data") for t in node.targets):
                return True  # reassigned (a Parameter reassigned from .to() is GPU005's finding)
            if isinstance(node, (ast.For, ast.AsyncFor)) and not is_param and \
                    any(dotted(e) == key for e in walk([node.iter])):
                loop_var = dotted(node.target)
                if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _CONVERTS
                       and dotted(c.func.value) == loop_var for c in walk(node.body)):
                    return True  # for module in [self.a, self.b]: module.to(...)
    return False


_SELF_CREATE = re.compile(rb"^([ \t]*)self\.\w+[ \t]*=[ \t]*(?:[\w.]*\.)?(?:[A-Z]\w*|Parameter|\w*(?:build|make|create)_\w*)\(",
                          re.M)
_OTHER_CREATE = re.compile(rb"^[ \t]*(?!self\.)[A-Za-z_]\w*(?:\.\w+)+[ \t]*=[ \t]*(?:[\w.]*\.)?[A-Z]\w*\(", re.M)
_SELF_CAST = re.compile(rb"self\.(?:half|bfloat16|to)\(")
_DEF = re.compile(rb"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


def may_create_late(data: bytes) -> bool:
    """Whether GPU011 can find anything in this file itself, read from the text before parsing:
    an attribute of another object assigned a new module (model.head = nn.Linear(...)), the
    object cast with self.half() / self.to(), or self.x = SomeModule(...) in a method that is not
    __init__ or a builder. False means the file matters to GPU011 only for its calls after a cast
    (the engine defers it)."""
    if _OTHER_CREATE.search(data) or _SELF_CAST.search(data):
        return True
    defs = None
    for m in _SELF_CREATE.finditer(data):
        if defs is None:
            defs = [(d.start(), len(d.group(1)), d.group(2).decode("ascii", "replace")) for d in _DEF.finditer(data)]
        indent = len(m.group(1))
        name = next((n for start, ind, n in reversed(defs) if start < m.start() and ind < indent), None)
        if name is None or late_method(name, name.startswith(_BUILDER), data.decode("latin-1")):
            return True
    return False


def _called_from(src: PySource, methods: dict[str, ast.AST], root: str) -> set[str]:
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        m = methods.get(name)
        if m is None or name in seen:
            continue
        seen.add(name)
        todo += re.findall(r"self\.(\w+)\(", src.scope_text(m))
    return seen
