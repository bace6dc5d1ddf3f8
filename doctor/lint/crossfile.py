"""The cross-file steps of `gpudoctor lint`, run in the parent once every file was linted
(gpudoctor.lint.engine.lint calls `cross_file`): GPU009 (a C++ function's unchecked data_ptr reads,
resolved over the project's macros, includes and bindings, and the Python callers of a binding),
GPU012 (the callers of a function or binding that checks contiguity) and the Python project
pass (gpudoctor.lint.project: GPU001's helpers, GPU004's values across modules, GPU011's late
methods and builders). A step that fails costs that rule's cross-file findings only.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from gpudoctor.lint import rules
from gpudoctor.lint.engine import (MAX_BYTES, FileResult, Task, _decode, _describe, _suppressions, can_fork,
                                   parse_python, read_bounded, suppressed)
from gpudoctor.lint.model import Finding, InternalError

_CALLED = re.compile(rb"\b([A-Za-z_]\w*)[ \t]*\(")  # a call's name, in a file's bytes

def cross_file(by_path: dict[str, FileResult], tasks: dict[str, Task],
               beside: bool = False) -> tuple[list[Finding], list[InternalError]]:
    """The findings of the cross-file steps, and the steps that failed (a failure costs that
    rule's cross-file findings only). `beside`: the Python project pass runs in a forked child
    while this process does the C++ and GPU012 steps (they share nothing; on a machine with a
    core to spare, the serial tail of a large tree's run is the longer of the two, not their
    sum); where the child cannot run or dies, the pass runs here."""
    out: list[Finding] = []
    failed: list[InternalError] = []

    def python_pass() -> tuple[list[Finding], list[InternalError]]:
        own: list[InternalError] = []
        found = _step(lambda: _python_cross_file(by_path, tasks, own), None, "the Python project pass: ", own)
        return found, own

    child = _Beside(python_pass) if beside and _has_python_facts(by_path) else None
    checking: dict[str, Any] = {}  # GPU012: Python name of a binding -> the arguments its C++ function checks
    # the Python files by the names they call: read once (when GPU009 or GPU012 first needs it)
    calling = _CallIndex(sorted(p for p, t in tasks.items() if t.kind == rules.PYTHON))
    try:
        out += _step(lambda: _cpp_cross_file(by_path, tasks, checking, calling), "GPU009", "", failed)
        out += _step(lambda: _contig_cross_file(by_path, tasks, checking, calling), "GPU012", "", failed)
        python = child.result() if child is not None else None
    finally:
        if child is not None:
            child.close()
    found, own = python if python is not None else python_pass()
    return out + found, failed + own


def _has_python_facts(by_path: dict[str, FileResult]) -> bool:
    return any(fr.facts for fr in by_path.values())


class _Beside:
    """`run()` in a forked child (it inherits the parent's memory: nothing is sent to it), its
    result sent back through a pipe. `result()` is None when the child could not start, died or
    sent nothing: the caller runs it itself. The child ignores Ctrl-C and dies with the parent
    (the pool workers' setup); `close()` ends it whatever happened."""

    def __init__(self, run: Callable[[], Any]) -> None:
        import multiprocessing

        self.proc = None
        self.conn = None
        if not can_fork():
            return
        ctx = multiprocessing.get_context("fork")
        try:
            self.conn, sender = ctx.Pipe(duplex=False)
            self.proc = ctx.Process(target=_beside_child, args=(run, sender), daemon=True)
            self.proc.start()
            sender.close()
        except OSError:
            self.proc = None

    def result(self) -> Any:
        if self.proc is None or self.conn is None:
            return None
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join()


def _beside_child(run: Callable[[], Any], sender: Any) -> None:
    from gpudoctor.lint.engine import _worker_start

    _worker_start()
    try:
        result = run()
    except BaseException:  # noqa: BLE001 (the parent runs it again and reports it there)
        result = None
    sender.send(result)
    sender.close()


def _step(run: Callable[[], list[Finding]], code: str | None, what: str, failed: list[InternalError]) -> list[Finding]:
    """One cross-file step's findings; a step that fails is an internal error of its rule (`code`;
    None: of every rule it serves), and the others go on."""
    try:
        return run()
    except (RecursionError, MemoryError) as exc:
        failed.append(InternalError(None, code, f"{what}the project is too large or too deeply nested to follow "
                                                f"({type(exc).__name__})"))
    except Exception as exc:  # noqa: BLE001
        failed.append(InternalError(None, code, f"{what}{_describe(exc)}"))
    return []


def _cpp_cross_file(by_path: dict[str, FileResult], tasks: dict[str, Task], checking: dict[str, Any],
                    calling: "_CallIndex") -> list[Finding]:
    """GPU009's findings; and, for GPU012, `checking` filled with the bindings whose C++
    function checks an argument's contiguity (Python name -> pycontig.Check list)."""
    out: list[Finding] = []
    summaries = [s for fr in by_path.values() for s in fr.cpp_summaries]
    if summaries:
        from gpudoctor.lint import cppresolve, cpprules, pycallers

        facts = {path: fr.cpp_facts for path, fr in by_path.items() if fr.cpp_facts is not None}
        cpp_paths = [p for p, t in tasks.items() if t.kind == rules.CPP]
        defines: dict[str, list[str]] = {}
        for path, fr in by_path.items():
            for name in fr.cpp_defines:
                defines.setdefault(name, []).append(path)
        cppresolve.resolve_checks(summaries, facts, cpp_paths, defines=defines)
        bound = {name for fr in by_path.values() for name in fr.cpp_bound}
        aliases = {py: cxx for fr in by_path.values() for py, cxx in fr.cpp_aliases.items()}
        if any("GPU012" in tasks[p].codes for p in tasks if tasks[p].kind == rules.PYTHON):
            checking.update(cpprules.checking_bindings(summaries, bound, aliases))
        summaries = [s for s in summaries if s.path in tasks and "GPU009" in tasks[s.path].codes]
        unprotected = cppresolve.resolve_data_ptr(summaries, bound) if summaries else []
        if unprotected and aliases:
            # the entry points' own Python callers: read (in the parent) only the Python files
            # that mention a binding's name followed by "(", and only when a read is unprotected
            sources = calling(aliases)
            try:
                calls = pycallers.python_calls(sources, aliases, calling) if sources else {}
            except RecursionError:  # a file nested too deeply to follow: no evidence from Python
                calls = {}
            if calls:
                unprotected = cppresolve.resolve_data_ptr(summaries, bound, calls)
        for s, i, call in unprotected:
            f = cppresolve.data_ptr_finding(s, i, call)
            if not suppressed(f, by_path[s.path].suppress):
                out.append(f)
    return out


class _CallIndex:
    """The project's Python files that call one of some names (`name(` in their bytes): each
    file is read once for an index of the names it calls, and parsed once when first needed
    (`loaded`, path -> PySource or None)."""

    def __init__(self, paths: list[str], loaded: dict[str, Any] | None = None) -> None:
        self.paths = paths
        self.loaded: dict[str, Any] = {} if loaded is None else loaded
        self.called_in: dict[str, list[str]] | None = None

    def load(self, path: str) -> Any:
        if path not in self.loaded:
            self.loaded[path] = _load_python(path)
        return self.loaded[path]

    def __call__(self, names: Any) -> list[Any]:
        if self.called_in is None:
            self.called_in = {}
            for path in self.paths:
                data = self._read(path)
                for name in set(_CALLED.findall(data)) if data else ():
                    self.called_in.setdefault(name.decode("ascii", "replace"), []).append(path)
        paths = sorted({p for n in names for p in self.called_in.get(n, ())})
        return [src for src in (self.load(p) for p in paths) if src is not None]

    def few(self, names: set[str]) -> list[Any]:
        """The same for a few names, without the index (a substring test per name and file, and
        one search in the files that have one; much cheaper than indexing every name a file
        calls) unless the index was already built."""
        if self.called_in is not None or not names:
            return self(names)
        spelt = [n.encode() for n in sorted(names)]
        pattern = re.compile(rb"\b(?:%s)[ \t]*\(" % b"|".join(re.escape(n) for n in spelt))
        paths = [p for p in self.paths
                 if (data := self._read(p)) and any(n in data for n in spelt) and pattern.search(data)]
        return [src for src in (self.load(p) for p in paths) if src is not None]

    @staticmethod
    def _read(path: str) -> bytes:
        try:
            return read_bounded(path)[:MAX_BYTES]
        except OSError:
            return b""


def _contig_cross_file(by_path: dict[str, FileResult], tasks: dict[str, Task], checking: dict[str, Any],
                       calling: "_CallIndex") -> list[Finding]:
    """GPU012 (gpudoctor.lint.pycontig): the calls that pass a strided view to a function or a
    binding that checks its layout. Nothing is read unless a linted file has a function that
    checks (its worker says so) or a binding's C++ function checks; then the Python files that
    call those names (an index of the names each linted Python file calls, read once) are parsed,
    and the callers of the wrappers among them."""
    checkers = {path: fr.facts.contig_checkers for path, fr in by_path.items()
                if fr.facts is not None and getattr(fr.facts, "contig_checkers", ())}
    if not checkers and not checking:
        return []
    from gpudoctor.lint import pycontig

    out = []
    for f in pycontig.resolve(checkers, calling.load, calling.few, checking, lambda p: p):
        if "GPU012" not in tasks[f.path].codes:
            continue  # a caller in a file the configuration leaves GPU012 out of
        fr = by_path.get(f.path)
        table = fr.suppress if fr is not None else {}
        src = calling.loaded.get(f.path)
        if not table and src is not None and "gpudoctor:" in src.text:  # a file no worker parsed
            table = _suppressions(src.text, rules.PYTHON)
        if not suppressed(f, table):
            out.append(f)
    return out


def _python_cross_file(by_path: dict[str, FileResult], tasks: dict[str, Task], failed: list[InternalError]) -> list[Finding]:
    out: list[Finding] = []
    facts = {path: fr.facts for path, fr in by_path.items() if fr.facts}
    creators = {name for f in facts.values() for name in f.creators}
    if creators:
        # Files deferred by GPU011 matter now: those that call a creating method, and those that
        # define the classes the creators build (and their bases), for the project's class table.
        called = re.compile(rb"\.(?:%s)\(" % b"|".join(re.escape(n.encode()) for n in sorted(creators)))
        needed = {foreign for f in facts.values() for made in f.creators.values() for _, foreign in made if foreign}
        done: set[str] = set()
        pending = [p for p, fr in by_path.items() if fr.deferred]
        while pending:
            defines = re.compile(rb"^[ \t]*(?:class|def)[ \t]+(?:%s)\b" % b"|".join(re.escape(n.encode()) for n in sorted(needed)),
                                 re.M) if needed else None
            grew = False
            for path in pending:
                if path in done or not (_mentions(path, called) or (defines is not None and _mentions(path, defines))):
                    continue
                done.add(path)
                try:
                    late_facts = _late_module_facts(path)
                except (RecursionError, MemoryError):
                    late_facts = None
                except Exception as exc:  # noqa: BLE001
                    failed.append(InternalError(path, "GPU011", _describe(exc)))
                    late_facts = None
                if late_facts is not None:
                    facts[path] = by_path[path].facts = late_facts
                    for bases, _, _, builds in late_facts.classes.values():
                        new = (set(bases) | set(builds)) - needed
                        grew = grew or bool(new)
                        needed |= new
            pending = [p for p in pending if p not in done] if grew else []
    if facts:
        from gpudoctor.lint import project

        python = {path: t.codes for path, t in tasks.items() if t.kind == rules.PYTHON}
        modules: dict[str, str] | None = None
        if any(f.size_calls for f in facts.values()):
            modules = {}
            for path in sorted(python):
                name = project.module_name(path)[0]
                if name:
                    modules.setdefault(name, path)
        loaded: dict[str, Any] = {}

        def load(path: str) -> Any:
            if path not in loaded:
                loaded[path] = _load_python(path)
            return loaded[path]

        late: dict[str, dict[int, frozenset[str] | None]] = {}

        def is_suppressed(f: Finding) -> bool:
            fr = by_path.get(f.path)
            if fr is None:
                return False
            table = fr.suppress
            src = loaded.get(f.path)
            if not table and src is not None and "gpudoctor:" in src.text:  # parsed here, by the project pass
                if f.path not in late:
                    late[f.path] = _suppressions(src.text, rules.PYTHON)
                table = late[f.path]
            return suppressed(f, table)

        found = {(f.path, f.line, f.col, f.code) for fr in by_path.values() for f in fr.findings}

        def resolve(codes: dict[str, tuple[str, ...]]) -> list[Finding]:
            return project.resolve(facts, codes, is_suppressed, modules, load)

        try:
            resolved = resolve(python)
        except (RecursionError, MemoryError):
            raise
        except Exception:  # noqa: BLE001 (one rule's project step failed: find which, keep the others)
            resolved = []
            for code in sorted({c for cs in python.values() for c in cs}):
                try:
                    resolved += resolve({p: (code,) if code in cs else () for p, cs in python.items()})
                except (RecursionError, MemoryError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    failed.append(InternalError(None, code, _describe(exc)))
        for f in resolved:
            key = (f.path, f.line, f.col, f.code)
            if key not in found:
                found.add(key)
                out.append(f)
    return out


def _mentions(path: str, pattern: re.Pattern[bytes]) -> bool:
    try:
        return pattern.search(read_bounded(path)[:MAX_BYTES]) is not None
    except OSError:
        return False


def _late_module_facts(path: str) -> Any:
    """GPU011's facts of a file deferred in the first pass (see FileResult.deferred)."""
    from gpudoctor.lint import pyrules
    from gpudoctor.lint.rules import gpu011_module_after_cast

    src = _load_python(path)
    if src is None:
        return None
    facts = pyrules.Facts()
    gpu011_module_after_cast.module_after_cast(src, facts)
    return facts


def _load_python(path: str) -> Any:
    """A linted Python file parsed in the parent, for the project pass; None if it cannot be."""
    from gpudoctor.lint import project
    from gpudoctor.lint.pysource import PySource

    try:
        data = read_bounded(path)
        if len(data) > MAX_BYTES or b"\0" in data:
            return None
        text = _decode(data, rules.PYTHON)
        return PySource(path, text, parse_python(text, path), *project.module_name(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError, RecursionError, MemoryError):
        return None
