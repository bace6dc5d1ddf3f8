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
from gpudoctor.lint.shapetables import cpu_only_lines


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
    out += _module_after_cast(facts, codes)
    if modules is not None and load is not None:
        out += _shapes(facts, codes, modules, load)
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


def _module_after_cast(facts: dict[str, Any], codes: dict[str, tuple[str, ...]]) -> list[Finding]:
    """A method that creates float32 modules, called on an object after it was cast: a finding
    at each module it creates (the place to change), naming the call and the cast."""
    calls: dict[str, tuple[str, tuple]] = {}
    for path in sorted(facts):
        if "GPU011" in codes.get(path, ()):
            for entry in facts[path].after_cast:
                calls.setdefault(entry[0], (path, entry))
    out: list[Finding] = []
    if not calls:
        return out
    weighted: set[str] | None = None
    for path, f in facts.items():
        if "GPU011" not in codes.get(path, ()):
            continue
        for method, created in f.creators.items():
            if method not in calls:
                continue
            where, (_, line, _, root, cast_line, recv) = calls[method]
            for finding, foreign in created:
                if foreign is not None:
                    weighted = _weighted_classes(facts) | set().union(*(g.builders for g in facts.values())) \
                        if weighted is None else weighted
                    if foreign not in weighted:
                        continue
                caller = (f"{recv}.{method}() is called at {where}:{line}, after {root} was cast to a lower "
                          f"precision at line {cast_line}")
                out.append(replace(finding, message=finding.message.replace("{caller}", caller)))
    return out


# --- GPU004: tensors of sizes handed across functions and modules ------------------------------------


class _Project:
    """The linted modules, parsed on demand, and the lookups of call targets among them."""

    def __init__(self, modules: dict[str, str], codes: dict[str, tuple[str, ...]], load: Callable[[str], Any]):
        self.modules, self.codes, self.load = modules, codes, load

    def source(self, module: str):
        path = self.modules.get(module)
        if path is None or "GPU004" not in self.codes.get(path, ()):
            return None
        return self.load(path)

    def split(self, qual: str) -> tuple[Any, list[str]] | None:
        parts = qual.split(".")
        for i in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:i])
            if module in self.modules:
                src = self.source(module)
                return (src, parts[i:]) if src is not None else None
        return None

    def class_info(self, qual: str):
        from gpudoctor.lint import pyrules

        found = self.split(qual)
        if found is None or len(found[1]) != 1:
            return None
        info = pyrules.class_info(found[0], found[1][0])
        return (found[0], info) if info is not None else None

    def method(self, cls: str, name: str, skip_own: bool = False, depth: int = 0):
        """(source, function node) of `name` looked up from class `cls` through its bases."""
        found = self.class_info(cls) if depth < 8 else None
        if found is None:
            return None
        src, (bases, methods, _) = found
        if not skip_own and name in methods:
            return src, methods[name]
        for base in bases:
            hit = self.method(base, name, False, depth + 1)
            if hit is not None:
                return hit
        return None

    def attribute_class(self, cls: str, attr: str, depth: int = 0) -> str | None:
        found = self.class_info(cls) if depth < 8 else None
        if found is None:
            return None
        _, (bases, _, ctors) = found
        if attr in ctors:
            return ctors[attr]
        return next((c for c in (self.attribute_class(b, attr, depth + 1) for b in bases) if c), None)

    def target(self, target: tuple[str, ...]):
        """(source, function node, how many leading parameters the call does not pass)."""
        from gpudoctor.lint import pyrules

        kind = target[0]
        if kind == "func":
            found = self.split(target[1])
            if found is None:
                return None
            src, rest = found
            if len(rest) == 1:
                fn = pyrules.function_node(src, rest[0])
                return (src, fn, 0) if fn is not None else None
            return None
        if kind == "method":
            hit = self.method(target[1], target[2])
        elif kind == "super":
            hit = self.method(target[1], target[2], skip_own=True)
        elif kind == "attr":
            cls = self.attribute_class(target[1], target[2])
            hit = self.method(cls, "forward") if cls else None
        else:
            return None
        return (hit[0], hit[1], 1) if hit is not None else None


def _parameter(fn: Any, slot: int | str, skip: int) -> str | None:
    args = [*fn.args.posonlyargs, *fn.args.args]
    if isinstance(slot, int):
        i = slot + skip
        return args[i].arg if i < len(args) else None
    names = {a.arg for a in args[skip:]} | {a.arg for a in fn.args.kwonlyargs}
    return slot if slot in names else None


def _shapes(facts: dict[str, Any], codes: dict[str, tuple[str, ...]], modules: dict[str, str],
            load: Callable[[str], Any]) -> list[Finding]:
    from gpudoctor.lint import pyrules

    todo = []
    for path in sorted(facts):
        if "GPU004" in codes.get(path, ()):
            for target, slot, rank, text, line, key in facts[path].size_calls:
                what = "a row of a tensor of sizes" if rank == 1 else "a tensor of sizes"
                todo.append((target, slot, rank, f"`{text}`, {what}, at {path}:{line}", (path, key)))
    if not todo:
        return []
    project = _Project(modules, codes, load)
    out: list[Finding] = []
    followed: set[tuple[str, int]] = set()
    seen: set[tuple[str, int, str, int]] = set()
    while todo:
        target, slot, rank, origin, key = todo.pop(0)
        hit = project.target(target)
        if hit is None:
            continue
        src, fn, skip = hit
        param = _parameter(fn, slot, skip)
        if param is None:
            continue
        if key is not None:
            followed.add(key)
        mark = (src.path, fn.lineno, param, rank)
        if mark in seen:
            continue
        seen.add(mark)
        findings, onward = pyrules.whatif(src, fn, param, rank, origin)
        out += findings
        cpu = cpu_only_lines(fn) if onward else set()
        for t, sl, rk, text, line in onward:
            if line in cpu:
                continue  # the CPU reference path (`else:` of `if value.is_cuda:`): no kernel, no sync
            todo.append((t, sl, rk, f"`{text}` handed on by {fn.name}() at {src.path}:{line}, which is {origin}", None))
    for path, f in facts.items():
        for key, finding in f.size_fallbacks.items():
            if (path, key) not in followed:
                out.append(finding)
    return out
