"""GPU009 across files, in the parent once every C++ file was summarised (gpudoctor.lint.cpprules
per file; gpudoctor.lint.crossfile calls these): which calls check a tensor's layout
(`resolve_checks`: macros and helpers read through the project's includes, or judged by their
names when no linted file defines them; strides and layouts handed on), and which raw reads no
check protects (`resolve_data_ptr`: through the project's C++ callers and the Python callers of a
binding), each reported once (`data_ptr_finding`).
"""
from __future__ import annotations

import os
import re
from typing import Callable

from gpudoctor.lint.cpp import CppFile
from gpudoctor.lint.cpprules import _ASSERTS, FileFacts, FuncSummary, MacroFacts, file_facts
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pycallers import PyCall
from gpudoctor.lint.rules import BY_CODE

# --- across files: which calls check -----------------------------------------------------------


def _name_checks(name: str) -> bool:
    """Judged by its name, for a macro or helper defined nowhere in the linted files: one that
    says it checks contiguity or inputs (precision first: a check we cannot read is a check)."""
    if re.search(r"contig", name, re.I) or name in ("CHECK_INPUT", "CHECK_INPUTS", "CHECK_TENSOR", "CHECK_ARG"):
        return True
    return "check" in name.lower() and name not in _ASSERTS and name not in ("CHECK_CUDA", "CHECK_DEVICE")


# Library headers (found on the include path, never the project's own): not followed.
_LIBRARY_INCLUDE = re.compile(r"^(torch|ATen|c10|caffe2|cuda|cub|thrust|cutlass|cute|pybind11|nv|cooperative_groups|"
                              r"mma|hip|rocm|triton|boost|Eigen|absl|google|fmt|spdlog)\b|^[^./]+$")
_MAX_HEADERS = 64  # headers read for one file's macros (transitively)


def _include_paths(including: str, include: str, by_suffix: dict[str, list[str]]) -> list[str]:
    """The linted files an `#include` names: beside the including file first, then any linted
    file whose path ends with the include's path (a project include folder)."""
    include = include.replace("\\", "/")
    candidates = by_suffix.get(include.rsplit("/", 1)[-1], [])
    if not candidates:
        return []
    here = os.path.normpath(os.path.join(os.path.dirname(including), include))
    if here in candidates:
        return [here]
    tail = "/" + include.lstrip("./")
    return [c for c in candidates if c.replace(os.sep, "/").endswith(tail)][:4]


class _Checks:
    """Whether a call `name(..., x, ...)` with x at position j checks x, seen from a file: a
    macro the file sees (its own, then the project headers it includes) by its body; else a
    function of the project by its summary; else a macro defined in a linted file that this one
    does not include (every definition must check); else, defined nowhere here, by its name."""

    def __init__(self, summaries: list[FuncSummary], facts: dict[str, FileFacts], cpp_paths: list[str],
                 read_facts: Callable[[str], FileFacts | None], defines: dict[str, list[str]] | None = None):
        self.defines = defines
        self.facts = dict(facts)
        self.read_facts = read_facts
        self.by_suffix: dict[str, list[str]] = {}
        for p in cpp_paths:
            self.by_suffix.setdefault(os.path.basename(p), []).append(os.path.normpath(p))
        self.functions: dict[str, list[FuncSummary]] = {}
        for s in summaries:
            self.functions.setdefault(s.name, []).append(s)
        self.dense_positions: dict[str, set[int]] = {}
        self._macro_memo: dict[tuple[str, str, int], bool] = {}
        self.refresh()
        self.cpp_paths = cpp_paths
        self._files: dict[str, list[str]] = {}
        self._visible: dict[tuple[str, str], tuple[str, MacroFacts] | None] = {}
        self._anywhere: dict[str, list[tuple[str, MacroFacts]]] = {}

    def _facts(self, path: str) -> FileFacts | None:
        if path not in self.facts:
            self.facts[path] = self.read_facts(path)
        return self.facts[path]

    def refresh(self) -> None:
        """Per function name, the parameter positions any of its definitions asserts dense (a
        name with thousands of overloads is looked up once, not once per overload)."""
        self.dense_positions = {}
        for name, funcs in self.functions.items():
            for s in funcs:
                for j, dense in enumerate(s.contig):
                    if dense:
                        self.dense_positions.setdefault(name, set()).add(j)
        self._macro_memo.clear()  # a helper checked in the last round may make a macro check

    def _seen_files(self, path: str) -> list[str]:
        """The file and the project headers it includes (transitively, nearest first)."""
        if path in self._files:
            return self._files[path]
        out: list[str] = []
        seen = {path}
        queue = [path]
        while queue:
            current = queue.pop(0)
            facts = self._facts(current)
            if facts is None:
                continue
            out.append(current)
            for inc in facts.includes:
                if _LIBRARY_INCLUDE.search(inc):
                    continue
                for p in _include_paths(current, inc, self.by_suffix):
                    if p not in seen and len(seen) < _MAX_HEADERS:
                        seen.add(p)
                        queue.append(p)
        self._files[path] = out
        return out

    def visible(self, name: str, path: str) -> tuple[str, MacroFacts] | None:
        """(defining file, facts) of the macro a file sees by this name: its own, else the
        nearest project header it includes that defines it."""
        key = (name, path)
        if key not in self._visible:
            found = None
            for p in self._seen_files(path):
                facts = self._facts(p)
                if facts is not None and name in facts.macros:
                    found = (p, facts.macros[name])
                    break
            self._visible[key] = found
        return self._visible[key]

    def prepare_anywhere(self, names: set[str]) -> None:
        """Find where these macro names are defined in the linted C++ files: from the index the
        workers made (`defines`), else in one pass over the files."""
        names = {n for n in names if n not in self._anywhere}
        for n in names:
            self._anywhere[n] = []
        if not names:
            return
        if self.defines is not None:
            places = sorted({p for n in names for p in self.defines.get(n, ())})
            found_in = {p: {n for n in names if p in self.defines.get(n, ())} for p in places}
        else:
            pattern = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(%s)\(" % b"|".join(re.escape(n.encode()) for n in
                                                                               sorted(names)), re.M)
            found_in = {p: f for p in self.cpp_paths for f in [_defines(p, pattern)] if f}
        for p, found in found_in.items():
            facts = self._facts(os.path.normpath(p))
            if facts is None:
                continue
            for n in found:
                if n in facts.macros:
                    self._anywhere[n].append((os.path.normpath(p), facts.macros[n]))

    def checks(self, name: str, j: int, path: str, depth: int = 0) -> bool:
        if depth > 12:
            return False
        macro = self.visible(name, path)
        if macro is not None:
            return self._macro_checks(macro[0], name, macro[1], j, depth)
        if name in self.functions:
            return j in self.dense_positions.get(name, ())
        if name.isupper():
            if name not in self._anywhere:
                self.prepare_anywhere({name})
            defs = self._anywhere[name]
            if defs:
                return all(self._macro_checks(p, name, m, j, depth) for p, m in defs)
        return _name_checks(name)

    def _macro_checks(self, where: str, name: str, m: MacroFacts, j: int, depth: int) -> bool:
        key = (where, name, j)
        if key in self._macro_memo:
            return self._macro_memo[key]
        self._macro_memo[key] = False  # a macro that reaches itself checks nothing through itself
        if j >= len(m.params):
            if not m.params or m.params[-1] != "__VA_ARGS__":
                return False
            j = len(m.params) - 1
        result = j in m.checks or any(self.checks(inner, k, where, depth + 1) for inner, argmap in m.calls
                                      for k, i in enumerate(argmap) if i == j)
        self._macro_memo[key] = result
        return result


def _defines(path: str, pattern: re.Pattern[bytes]) -> set[str]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(20 * 1024 * 1024)
    except OSError:
        return set()
    if b"define" not in data:
        return set()
    return {m.group(1).decode() for m in pattern.finditer(data)}


def read_file_facts(path: str) -> FileFacts | None:
    """A header's macros and includes, read in the parent (a header with no data_ptr is never
    summarised by a worker, yet its CHECK_INPUT decides another file's reads)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(20 * 1024 * 1024 + 1)
    except OSError:
        return None
    if len(data) > 20 * 1024 * 1024 or b"\0" in data:
        return None
    try:
        return file_facts(CppFile(data.decode("utf-8", "surrogateescape"), data))
    except (RecursionError, MemoryError, ValueError):
        return None


def resolve_checks(summaries: list[FuncSummary], facts: dict[str, FileFacts], cpp_paths: list[str],
                   read_facts: Callable[[str], FileFacts | None] = read_file_facts,
                   defines: dict[str, list[str]] | None = None) -> None:
    """Mark the parameters that a macro or helper call checks (see the module docstring), then
    tie same-layout parameters; changes `summaries` in place. `defines`: macro name -> the C++
    files that define it (MACRO_DEFINITIONS), or None to search the files when needed."""
    _resolve_strides(summaries)
    resolver = _Checks(summaries, {os.path.normpath(p): f for p, f in facts.items()}, cpp_paths, read_facts, defines)
    paths = {s.path: os.path.normpath(s.path) for s in summaries}
    # the macro-like names no file sees and no function defines, looked up in one pass
    pending = {name for s in summaries for name, _ in s.via if name.isupper() and name not in resolver.functions
               and resolver.visible(name, paths[s.path]) is None}
    resolver.prepare_anywhere(pending)
    # a helper checked through another helper: again, for the calls of the functions (and the
    # macros, which may call them) that the last round made check, until nothing changes
    grown: set[str] | None = None
    rounds = 0
    while rounds < 8 and (grown is None or grown):
        rounds += 1
        if grown is not None:
            resolver.refresh()
        now: set[str] = set()
        for s in summaries:
            path = paths[s.path]
            for name, argmap in s.via:
                if grown is not None and name not in grown and not name.isupper():
                    continue
                for j, i in enumerate(argmap):
                    if i >= 0 and not s.contig[i] and resolver.checks(name, j, path):
                        s.checked[i] = s.contig[i] = True
                        now.add(s.name)
        grown = now
    by_file: dict[str, list[FuncSummary]] = {}
    for s in summaries:
        by_file.setdefault(s.path, []).append(s)
    for group in by_file.values():
        _same_layout(group)


def _resolve_strides(summaries: list[FuncSummary]) -> None:
    """A parameter whose strides are only handed on (`k<<<...>>>(x.data_ptr(), x.stride(0))`) is
    read with them only if the callee uses that argument: in its body, or handed on to a callee
    that does (three calls deep). A callee the linted files do not define is taken to use it."""
    if not any(s.stride_sinks for s in summaries):
        return
    by_name: dict[str, list[FuncSummary]] = {}
    for s in summaries:
        by_name.setdefault(s.name, []).append(s)
    memo: dict[tuple[str, int], bool] = {}

    def uses(name: str, pos: int, depth: int = 0) -> bool:
        key = (name, pos)
        if key in memo:
            return memo[key]
        defs = [d for d in by_name.get(name, ()) if pos < len(d.params)]
        if not defs or depth > 3:
            return True
        memo[key] = False  # recursion: no evidence of a use through itself
        result = any(d.used[pos] if pos < len(d.used) else True for d in defs) or \
            any(uses(c, j, depth + 1) for d in defs for c, j in d.forwards.get(pos, ()))
        memo[key] = result
        return result

    def reaches(s: FuncSummary, callee: str | None, pos: int, local: str | None) -> bool:
        if callee is not None and by_name.get(callee):
            return uses(callee, pos)  # a function of the project: does it use that argument?
        if local is None:
            return callee is not None  # a library call given the stride: taken as a use
        # stored (`int s = x.stride(0)`, `auto xs = make_long4(x.stride(0), ...)`): the local's uses
        return local in s.local_used or any(uses(c, j) for c, j in s.local_sinks.get(local, ()))

    for s in summaries:
        for i, sinks in s.stride_sinks.items():
            if not s.checked[i] and any(reaches(s, c, j, local) for c, j, local in sinks):
                s.checked[i] = True


def _same_layout(summaries: list[FuncSummary]) -> None:
    """TORCH_CHECK(has_same_layout(dy, x)) with x checked: dy is checked too, when the helper is a
    function of this file that reads the strides of both arguments (it compares layouts). A
    comparison of sizes alone (dy.sizes() == x.sizes()) says nothing about strides."""
    helpers = {s.name: s.checked for s in summaries if sum(s.checked) >= 2}
    for s in summaries:
        links = []
        for name, args in s.compared:
            strided = helpers.get(name)
            if strided is None or name == s.name:
                continue
            tied = [i for pos, i in enumerate(args) if i >= 0 and pos < len(strided) and strided[pos]]
            if len(tied) >= 2:
                links.append(tied)
        changed = bool(links)
        while changed:
            changed = False
            for tied in links:
                if any(s.checked[i] for i in tied) and not all(s.checked[i] for i in tied):
                    for i in tied:
                        s.checked[i] = True
                    changed = True


# --- across files: who passes what ---------------------------------------------------------------


def resolve_data_ptr(summaries: list[FuncSummary], bound: set[str],
                     python: dict[str, list[PyCall]] | None = None) -> list[tuple[FuncSummary, int, PyCall | None]]:
    """(function, parameter index, a Python call that passes it unprotected or None) for the raw
    reads that are not protected. A function that no linted file calls protects nothing only if
    it is bound for Python (an entry point); one that is neither called nor bound (a header whose
    callers are elsewhere) is left alone. `python`: C++ name -> the project's own Python calls of
    its binding (`python_calls`); a bound function is protected when every C++ caller and every
    one of those calls passes a protected tensor."""
    python = python or {}
    callers: dict[str, list[tuple[FuncSummary, list[tuple[str, int]]]]] = {}
    for s in summaries:
        for name, kinds in s.calls:
            callers.setdefault(name, []).append((s, kinds))
    memo: dict[tuple[int, int], bool] = {}
    blame: dict[tuple[int, int], PyCall] = {}

    def protected(s: FuncSummary, i: int, depth: int = 0) -> bool:
        key = (id(s), i)
        if key in memo:
            return memo[key]
        if s.checked[i]:
            return True
        sites = [(c, kinds) for c, kinds in callers.get(s.name, []) if len(kinds) == len(s.params) and c is not s]
        py_sites = [c for c in python.get(s.name, ()) if c.arity_fits(s.params)] if s.name in bound else []
        if (not sites and not py_sites) or depth > 8:
            memo[key] = depth > 8 or s.name not in bound
            return memo[key]
        memo[key] = True  # assume protected inside a cycle
        result = True
        for caller, kinds in sites:
            kind, j = kinds[i]
            if kind == "fresh":
                continue
            if kind == "param" and caller.tensor[j] and protected(caller, j, depth + 1):
                continue
            result = False
            break
        if result:
            for call in py_sites:
                if not call.fresh_at(i, s.params[i]):
                    blame[key] = call
                    result = False
                    break
        memo[key] = result
        return result

    def culprit(s: FuncSummary, i: int, depth: int = 0) -> PyCall | None:
        """The Python call that passes this tensor unprotected, through the C++ callers."""
        if (id(s), i) in blame or depth > 8:
            return blame.get((id(s), i))
        for caller, kinds in callers.get(s.name, []):
            if len(kinds) == len(s.params) and kinds[i][0] == "param" and not memo.get((id(caller), kinds[i][1]), True):
                found = culprit(caller, kinds[i][1], depth + 1)
                if found is not None:
                    return found
        return None

    out = []
    for s in summaries:
        for i in s.reads:
            if not protected(s, i):
                out.append((s, i, culprit(s, i)))
    return out


def data_ptr_finding(s: FuncSummary, i: int, call: PyCall | None = None) -> Finding:
    line, col, read = s.reads[i]
    param = s.params[i]
    where = ""
    if call is not None:
        at, at_line = call.where_at(i, param)
        where = f"; {at}:{at_line} passes `{call.shown_at(i, param)}`, not known to be contiguous"
    message = (f"{read}() reads the raw memory of tensor argument `{param}` of {s.shown or s.name + '()'}, which is "
               f"never checked or made contiguous (here or by its callers{where}): a transposed, sliced or expanded "
               f"tensor is read in the wrong order; add TORCH_CHECK({param}.is_contiguous(), ...) or use "
               f"{param}.contiguous()")
    return Finding(path=s.path, line=line, col=col, code="GPU009", kb_id=BY_CODE["GPU009"].kb_id, message=message,
                   fix=Fix(DISPLAY_ONLY, f"TORCH_CHECK({param}.is_contiguous(), \"{param} must be contiguous\")"),
                   end_line=line, end_col=col + len(read))
