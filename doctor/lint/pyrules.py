"""The Python rules on one file: `check` runs each chosen rule, by the table of rule modules
(gpudoctor.lint.rules.gpuNNN_*: each holds its documentation and its check). The rules that need
only the tree (GPU002, GPU005, GPU006, GPU007, GPU011) are their modules' `check`; the dataflow
rules (GPU001, GPU003, GPU004, GPU008) share one interpretation of the file
(gpudoctor.lint.pyflow, its values and events in pyvalues), run here once for all of them, whose
events their modules turn into findings. Also here: the facts a file hands the project pass.

GPU011 is partly cross-file: a method that creates float32 submodules and never
converts them is summarised there (`Facts.creators`), and so is every call made on an object after
it was cast (`Facts.after_cast`); gpudoctor.lint.engine pairs them over all linted files in its
cross-file step.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from types import ModuleType

from gpudoctor.lint import valueflow
from gpudoctor.lint.model import Finding
from gpudoctor.lint.pyflow import Interp
from gpudoctor.lint.pyvalues import AttentionEvent, FlashLayoutEvent, ShapeArgEvent, ShapeTensorEvent, TV, ViewEvent
from gpudoctor.lint.pysource import PySource, dotted, short
from gpudoctor.lint.rules import (gpu001_naive_attention, gpu002_sdp_kernel_deprecated, gpu003_view_after_transpose,
                                  gpu004_shape_tensor_arithmetic, gpu005_parameter_reassign,
                                  gpu006_no_kernel_for_newer_gpus, gpu007_xformers_attention, gpu008_flash_attn_layout,
                                  gpu011_module_after_cast, gpu012_strided_into_checking_kernel)


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


# The rules that need only the file's tree: code -> the rule module whose `check(src, facts)` finds
# them (looked up when called). GPU001, GPU003, GPU004 and GPU008 share one interpretation of the
# file (`_flow_rules`), which hands each rule module the events it turns into findings.
TREE_RULES: dict[str, ModuleType] = {
    "GPU002": gpu002_sdp_kernel_deprecated,
    "GPU005": gpu005_parameter_reassign,
    "GPU006": gpu006_no_kernel_for_newer_gpus,
    "GPU007": gpu007_xformers_attention,
    "GPU011": gpu011_module_after_cast,
    "GPU012": gpu012_strided_into_checking_kernel,
}
FLOW_RULES = frozenset({"GPU001", "GPU003", "GPU004", "GPU008"})


def check(src: PySource, codes: set[str], facts: Facts, every_function: bool = False) -> list[Finding]:
    """The Python rules on one parsed file. `every_function`: the dataflow interprets every
    function, not only those whose text has a rule's trigger words (the prefilters' safety test)."""
    out: list[Finding] = []
    if codes & FLOW_RULES:
        out += _flow_rules(src, codes, facts, every_function)
    for code, rule in TREE_RULES.items():
        if code in codes:
            out += rule.check(src, facts)
    return out


# --- dataflow rules ----------------------------------------------------------------------------


# Per function: the text a function must contain for the dataflow to look at it for a rule.
_TRIGGERS = {
    # softmax in the function, or a helper's probabilities multiplied here (named so)
    "GPU001": (("softmax", "get_attention_scores", "probs", "scores", "attn"),
               re.compile(gpu001_naive_attention.ATTENTION_PRODUCT.decode())),
    "GPU003": ((".view(",), re.compile(gpu003_view_after_transpose.NONCONTIGUOUS.decode())),
    # a function that makes a tensor of sizes (what it receives from elsewhere, a field of self, a
    # return value or a keyword, is followed by the later rounds and the project pass)
    "GPU004": (("tensor(", "stack(", "Tensor(", "register_buffer(", ".sum("), None),
    "GPU008": (("flash_attn",), None),
}


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
        deferred = {k: None for k in valueflow.record(src, interp, facts, lambda n: short(src, n, 40))}  # type: ignore[misc]
    for ev in _one_per_group(interp.events, src):
        f = None
        if isinstance(ev, ViewEvent) and "GPU003" in codes:
            f = gpu003_view_after_transpose.finding_for(src, ev)
        elif isinstance(ev, AttentionEvent) and "GPU001" in codes:
            f = gpu001_naive_attention.finding_for(src, ev)
            if f is not None and ev.cond is not None:
                # get_attention_scores(q, k) returns softmax(q k^T) only if the helper does so:
                # this file's own helpers decide here, the project's in the project pass
                helper, kind = ev.cond
                if helper not in (interp.returns_probs if kind == "probs" else interp.returns_scores):
                    facts.cond_attention.append((helper, kind, f))
                    f = None
        elif isinstance(ev, ShapeTensorEvent) and "GPU004" in codes:
            f = gpu004_shape_tensor_arithmetic.tensor_finding(src, ev)
        elif isinstance(ev, ShapeArgEvent) and "GPU004" in codes and ev.keyword not in params:
            f = gpu004_shape_tensor_arithmetic.arg_finding(src, ev)
            if id(ev.value) in deferred:
                facts.size_fallbacks[id(ev.value)] = f  # only if the callee cannot be followed
                f = None
        elif isinstance(ev, FlashLayoutEvent) and "GPU008" in codes:
            f = gpu008_flash_attn_layout.finding_for(src, ev)
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


def _fn_params(fn: ast.AST) -> set[str]:
    a = fn.args  # type: ignore[attr-defined]
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _param_names(src: PySource) -> set[str]:
    names: set[str] = set()
    for fn in src.functions:
        names |= _fn_params(fn)
    return names
