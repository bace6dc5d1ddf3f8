"""The project pass: what one Python file says about another, combined in the parent process
after every file was parsed once (by a worker, which returns its `pyrules.Facts`).

- GPU001: a helper that returns the softmax of a score matrix (`get_attention_scores`) or the raw
  scores, defined in one module and multiplied with the values in another: each file lists the
  helpers it defines and the findings that hold if a helper it calls is one.
- GPU011: methods that create float32 modules (`enable_fantasy_world_mode`) and calls of them on
  an object that was cast earlier, in another module.
- GPU004: a tensor of sizes (or a row of one, `grid_sizes[0]`) handed to a function of another
  module (`get_attn_map_with_target(q, k, grid_sizes[0])`, `self.audio_cross_attn(x, shape=...)`,
  `super().forward(x, shape)`): the callee is found through imports (relative ones too), the
  classes `__init__` assigns to attributes and the bases, and interpreted once more with that
  parameter seeded; what it unpacks and computes with is reported at its binding, naming the
  caller, and what it hands on is followed in turn. Only files that receive such a tensor from
  another function are read again, in the parent; where the callee cannot be found, the
  caller-side finding (`shape=grid_sizes[0]`) stands.

Helpers are matched by name (the receiver of `attn.get_attention_scores(...)` is a parameter whose
class no file names), so a finding needs both halves: the helper's own code and the caller's use.
Nothing here reads a file: the engine hands in a loader for the few the GPU004 step needs.
"""
from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Any, Callable

from gpudoctor.lint.model import Finding


def module_name(path: str) -> tuple[str | None, bool]:
    """(dotted module name, is a package's __init__) of a Python file, from the folders above it
    that hold an __init__.py; a file outside any package is a top-level module of its stem."""
    folder, name = os.path.split(os.path.abspath(path))
    stem = name[:-3] if name.endswith(".py") else name
    parts = _package_parts(folder)
    if stem == "__init__":
        return (".".join(parts) or None), True
    return ".".join(parts + [stem]), False


@functools.lru_cache(maxsize=4096)
def _package_parts(folder: str) -> list[str]:
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return []
    parent, name = os.path.split(folder)
    if not name.isidentifier():
        return []
    return _package_parts(parent) + [name]


def resolve(facts: dict[str, Any], codes: dict[str, tuple[str, ...]], suppressed: Callable[[Finding], bool],
            modules: dict[str, str] | None = None, load: Callable[[str], Any] | None = None) -> list[Finding]:
    """The cross-file findings of the Python rules. `facts`: path -> pyrules.Facts of each parsed
    file; `codes`: path -> the rule codes selected for it (every linted Python file);
    `suppressed`: an inline suppression; `modules`: module name -> path of the linted Python
    files; `load`: path -> its PySource (parsed on demand), or None."""
    out: list[Finding] = []
    out += _attention(facts, codes)
    out += _module_after_cast(facts, codes, load)
    if load is not None and any(f.size_calls or f.size_returns for f in facts.values()):
        from gpudoctor.lint import valueflow

        if modules is None:
            modules = {}
            for path in sorted(codes):
                name = module_name(path)[0]
                if name:
                    modules.setdefault(name, path)
        out += valueflow.resolve(facts, codes, modules, load)
    return [f for f in out if not suppressed(f)]


def _attention(facts: dict[str, Any], codes: dict[str, tuple[str, ...]]) -> list[Finding]:
    from gpudoctor.lint.pyvalues import PROBS_HELPERS

    probs = set(PROBS_HELPERS).union(*(f.returns_probs for f in facts.values()))
    scores = set().union(*(f.returns_scores for f in facts.values()))
    out = []
    for path, f in facts.items():
        if "GPU001" not in codes.get(path, ()):
            continue
        for helper, kind, finding in f.cond_attention:
            if helper in (probs if kind == "probs" else scores):
                out.append(finding)
    return out


_MODULE_ROOTS = ("Module", "ModelMixin", "PreTrainedModel")


def _weighted_classes(facts: dict[str, Any]) -> set[str]:
    """Names of the project's nn.Module classes that create weights (their own nn.Linear /
    nn.Parameter, a base's, or a weighted class they build) and do not cast their inputs to
    them. Classes are known by name: a name two modules define differently is dropped."""
    classes: dict[str, tuple] = {}
    twice: set[str] = set()
    for f in facts.values():
        for name, summary in f.classes.items():
            if name in classes and classes[name] != summary:
                twice.add(name)
            classes[name] = summary
    for name in twice:
        classes.pop(name)
    modules: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, (bases, _, _, _) in classes.items():
            if name not in modules and any(b in _MODULE_ROOTS or b in modules for b in bases):
                modules.add(name)
                changed = True
    weighted = {n for n in modules if classes[n][1]}
    changed = True
    while changed:
        changed = False
        for name in modules - weighted:
            bases, _, _, builds = classes[name]
            if any(b in weighted for b in bases) or any(b in weighted for b in builds):
                weighted.add(name)
                changed = True
    return {n for n in weighted if not classes[n][2]}


def weighted(facts: dict[str, Any]) -> set[str]:
    """Classes with weights that do not cast their inputs to them, and builder functions that
    return a new float32 module, over the project."""
    return _weighted_classes(facts) | set().union(*(g.builders for g in facts.values()))


def _module_after_cast(facts: dict[str, Any], codes: dict[str, tuple[str, ...]],
                       load: Callable[[str], Any] | None = None) -> list[Finding]:
    """A method that creates float32 modules, called on an object after it was cast (in the same
    scope, or passed in or returned cast by the project's other functions: castflow.resolve): a
    finding at each module it creates (the place to change), naming the call and the cast."""
    calls: dict[str, tuple[str, tuple]] = {}
    for path in sorted(facts):
        if "GPU011" in codes.get(path, ()):
            for entry in facts[path].after_cast:
                calls.setdefault(entry[0], (path, entry))
    if load is not None and any(f.creators for f in facts.values()):
        from gpudoctor.lint import castflow

        for path, entry in castflow.resolve(facts, codes, load):
            calls.setdefault(entry[0], (path, entry))
    out: list[Finding] = []
    if not calls:
        return out
    table: set[str] | None = None
    for path, f in facts.items():
        if "GPU011" not in codes.get(path, ()):
            continue
        for method, created in f.creators.items():
            if method not in calls:
                continue
            where, (_, line, _, root, cast_line, recv, how) = calls[method]
            for finding, foreign in created:
                if foreign is not None:
                    table = weighted(facts) if table is None else table
                    if foreign not in table:
                        continue
                caller = (f"{recv}.{method}() is called at {where}:{line}, after {root} was cast to a lower "
                          f"precision " + (f"({how})" if how else f"at line {cast_line}"))
                out.append(replace(finding, message=finding.message.replace("{caller}", caller)))
    return out
