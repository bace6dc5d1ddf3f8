"""Running the rules over files: discovery, the per-rule substring prefilter, one parse per file,
inline suppressions and a process pool over chunks of files; then the cross-file steps in the
parent (gpudoctor.lint.crossfile: GPU009's callers, GPU012's, the Python project pass).

A file is read only when one of the selected rules applies to its kind, and decoded and parsed
only when the rule's prefilter finds the text it looks for; a file that is never parsed cannot be
reported as unparseable. Everything a worker returns is small and picklable.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from gpudoctor.lint import config as cfg
from gpudoctor.lint import rules
from gpudoctor.lint.model import FileError, Finding, InternalError, LintResult, NotLinted

MAX_BYTES = 20 * 1024 * 1024
DEFAULT_EXCLUDE = frozenset({
    ".git", ".hg", ".svn", ".bzr", ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    "__pycache__", "node_modules", "site-packages", "build", "dist", ".eggs", "_build", "buck-out", "__pypackages__",
    ".direnv", ".ipynb_checkpoints",
})
_CPP_EXT = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c++", ".c", ".h", ".hpp", ".hh", ".hxx", ".inl", ".ipp")
_SUPPRESS = re.compile(r"gpudoctor:\s*ignore(?:\[([A-Za-z0-9_,\s]*)\])?")


def classify(path: str) -> tuple[str, str] | None:
    """(kind, subkind) of a file by name: python, cpp, or build (cmake / make / shell / cog)."""
    name = os.path.basename(path)
    lower = name.lower()
    if lower.endswith(".py"):
        return rules.PYTHON, "python"
    if lower.endswith(_CPP_EXT):
        return rules.CPP, "cpp"
    if name == "CMakeLists.txt" or lower.endswith(".cmake"):
        return rules.BUILD, "cmake"
    if lower in ("makefile", "gnumakefile") or lower.endswith(".mk"):
        return rules.BUILD, "make"
    if lower.endswith((".sh", ".bash")) or lower == "dockerfile" or lower.startswith("dockerfile.") \
            or lower.endswith(".dockerfile"):
        return rules.BUILD, "shell"
    if lower in ("cog.yaml", "cog.yml"):
        return rules.BUILD, "cog"  # Replicate's Cog: its build.run commands are shell
    return None


@dataclass(frozen=True)
class Task:
    path: str
    kind: str
    subkind: str
    codes: tuple[str, ...]
    size: int = 0
    # every rule on the file, prefilters and gates off (the robustness test over a whole tree)
    exhaustive: bool = False
    # the byte prefilters off, the rules' own gates on (GPU009 on extension code only): the test
    # that the prefilters skip no file that has a finding
    unfiltered: bool = False


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    checked: bool = False
    digest: str | None = None  # of the bytes linted, when a finding carries edits
    suppress: dict[int, frozenset[str] | None] = field(default_factory=dict)
    cpp_summaries: list[Any] = field(default_factory=list)
    cpp_bound: set[str] = field(default_factory=set)
    cpp_aliases: dict[str, str] = field(default_factory=dict)  # Python name of a binding -> C++ function
    cpp_facts: Any = None  # cpprules.FileFacts: the file's macros and includes, for GPU009's checks
    cpp_defines: tuple[str, ...] = ()  # the function-like macros it defines (any C++ file, GPU009 selected)
    facts: Any = None  # pyrules.Facts of a parsed Python file, for the project pass
    # GPU011 alone wanted this file for a cast followed by calls, and it creates no module: its
    # calls matter only if another file has a method that creates modules (parsed then, once)
    deferred: bool = False
    # rules that failed on this file: (code, or None when no one rule failed; what failed)
    internal: list[tuple[str | None, str]] = field(default_factory=list)


class UsageError(ValueError):
    """Bad paths or options: exit code 2."""


# --- discovery -----------------------------------------------------------------------------------


def discover(paths: list[str], select: list[str] | None, ignore: list[str] | None,
             isolated: bool, force_exclude: bool = False) -> list[tuple[Task, cfg.Config]]:
    """The files to lint, each with its rule codes and configuration. A file named on the command
    line is linted even where the configuration excludes it, unless `force_exclude` (pre-commit
    names every changed file: the configuration must still decide)."""
    out: list[tuple[Task, cfg.Config]] = []
    seen: set[tuple[int, int]] = set()  # (device, inode): one file reached twice (links, overlapping paths)
    for arg in paths:
        if not os.path.exists(arg):
            raise UsageError(f"{arg}: no such file or directory")
        config = cfg.Config() if isolated else cfg.find(arg)
        chosen = rules.select(select if select else (list(config.select) if config.select else None),
                              list(config.ignore) + list(ignore or []))
        codes = tuple(r.code for r in chosen)
        if os.path.isdir(arg):
            walked = _walk(arg, config)
        elif force_exclude and _force_excluded(arg, config):
            continue
        else:
            kind = classify(arg)
            if kind is None:
                raise UsageError(f"{arg}: not a file type gpudoctor lint reads (Python, C++/CUDA, CMake, Makefile, "
                                 "shell script, Dockerfile, cog.yaml)")
            try:
                st = os.stat(arg)
                size, key = st.st_size, (st.st_dev, st.st_ino)
            except OSError:
                size, key = 0, (-1, hash(os.path.realpath(arg)))
            walked = iter([(os.path.normpath(arg), kind, size, key)])
        by_kind: dict[str, tuple[str, ...]] = {}
        for path, (kind, sub), size, key in walked:
            if key in seen:
                continue
            seen.add(key)
            file_codes = by_kind.get(kind)
            if file_codes is None:
                file_codes = by_kind[kind] = tuple(c for c in codes if kind in rules.BY_CODE[c].kinds)
            if file_codes:
                out.append((Task(path, kind, sub, file_codes, size), config))
    return out


def _force_excluded(path: str, config: cfg.Config) -> bool:
    """A file the walk would leave out: excluded by the configuration, or under a folder excluded
    by default (.venv, build, site-packages, ...) below the configuration's root (or the current
    folder when there is no configuration)."""
    if config.excluded(path):
        return True
    base = config.root or os.getcwd()
    rel = os.path.relpath(os.path.abspath(path), base)
    if rel.startswith(os.pardir + os.sep):
        rel = os.path.normpath(path)
    parts = rel.split(os.sep)[:-1]
    return any(p in DEFAULT_EXCLUDE for p in parts)


def _walk(root: str, config: cfg.Config) -> Iterator[tuple[str, tuple[str, str], int, tuple[int, int]]]:
    """(path, kind, size, (device, inode)) of the files under root, in name order; the identity
    comes from the stat the size needs (realpath on every file cost more than the walk)."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in DEFAULT_EXCLUDE and not config.excluded(e.path):
                        subdirs.append(e.path)
                    continue
                if not e.is_file():
                    continue
            except OSError:
                continue
            kind = classify(e.name)
            if kind is None or config.excluded(e.path):
                continue
            try:
                st = e.stat()
                size, key = st.st_size, (st.st_dev, st.st_ino)
            except OSError:
                size, key = 0, (-1, hash(os.path.realpath(e.path)))
            yield os.path.normpath(e.path), kind, size, key
        stack.extend(reversed(subdirs))


# --- one file -------------------------------------------------------------------------------------


def read_bounded(path: str) -> bytes:
    """A file's bytes, at most MAX_BYTES + 1 of them (more means too large). A regular file is
    read with one call sized by its fstat (a buffered read of MAX_BYTES + 1 allocates that much
    for every file first); anything else (a pipe, /proc) is read until its end or the bound."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        want = MAX_BYTES + 1
        st = os.fstat(fd)
        data = os.read(fd, min(st.st_size + 1, want)) if stat.S_ISREG(st.st_mode) else b""
        while len(data) < want:
            more = os.read(fd, min(want - len(data), 1 << 20))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def _decode(data: bytes, kind: str) -> str:
    if kind == rules.PYTHON:
        import io
        import tokenize

        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as exc:
            raise ValueError(str(exc)) from None
        return data.decode(encoding)
    return data.decode("utf-8", "surrogateescape")


def _suppressions(text: str, kind: str) -> dict[int, frozenset[str] | None]:
    """Line -> codes suppressed there (None: every code). Python comments are found with the
    tokenizer, so a string that contains the marker suppresses nothing."""
    out: dict[int, frozenset[str] | None] = {}

    def add(line: int, comment: str) -> None:
        for m in _SUPPRESS.finditer(comment):
            if m.group(1) is None:
                out[line] = None
            elif out.get(line, frozenset()) is not None:
                codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
                out[line] = frozenset(out.get(line) or frozenset()) | codes

    if kind == rules.PYTHON:
        import io
        import tokenize

        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT and "gpudoctor:" in tok.string:
                    add(tok.start[0], tok.string)
        except (tokenize.TokenError, SyntaxError, IndentationError):
            pass
        return out
    for i, line in enumerate(text.splitlines(), 1):
        if "gpudoctor:" in line:
            cut = min((p for p in (line.find("//"), line.find("/*"), line.find("#")) if p >= 0), default=-1)
            if cut >= 0:
                add(i, line[cut:])
    return out


def suppressed(f: Finding, table: dict[int, frozenset[str] | None]) -> bool:
    for line in {f.line, f.end_line or f.line}:
        if line in table:
            codes = table[line]
            if codes is None or f.code in codes:
                return True
    return False


def lint_text(path: str, kind: str, subkind: str, text: str, data: bytes, codes: set[str],
              result: FileResult, exhaustive: bool = False, unfiltered: bool = False) -> list[Finding]:
    """Run the chosen rules on decoded text. Raises SyntaxError / ValueError for unparseable
    Python and NotLinted for a file that cannot be read for another reason; a rule that raises
    anything else costs that rule on this file only (`result.internal`, see `_isolated`)."""
    findings: list[Finding] = []
    if kind == rules.PYTHON:
        from gpudoctor.lint import pyrules
        from gpudoctor.lint.pysource import PySource

        from gpudoctor.lint.project import module_name

        tree = parse_python(text, path)
        src = PySource(path, text, tree, *module_name(path))

        def python(chosen: set[str]) -> tuple[list[Finding], Any]:
            facts = pyrules.Facts()
            return pyrules.check(src, chosen, facts, every_function=unfiltered), facts

        findings, result.facts = _isolated(python, codes, result, ([], None))
    elif kind == rules.CPP:
        from gpudoctor.lint import cpprules

        codes = cpprules.applicable(codes, data, exhaustive)
        if codes:
            parsed = cpprules.parse(path, text, data)  # NotLinted: the parser cannot be loaded

            def cpp(chosen: set[str]) -> tuple:
                return cpprules.scan(path, parsed, data, chosen, exhaustive)

            findings, result.cpp_summaries, result.cpp_bound, result.cpp_aliases, result.cpp_facts = \
                _isolated(cpp, codes, result, cpprules.EMPTY_SCAN)
    else:
        from gpudoctor.lint import buildflags

        def build(chosen: set[str]) -> list[Finding]:
            return [_build_finding(path, text, v) for v in buildflags.scan_build(text, subkind)] if "GPU006" in chosen else []

        findings = _isolated(build, codes, result, [])
    return findings


def parse_python(text: str, path: str) -> Any:
    """ast.parse, quietly: the linted code's own warnings (an invalid escape sequence is a
    SyntaxWarning printed to stderr on Python 3.12) are not gpudoctor's to print."""
    import ast
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text, filename=path)


def _describe(exc: BaseException) -> str:
    """`TypeError: ... (archflags.py:261 in _list_entries)`: the exception and the innermost
    frame of gpudoctor's own code, for the bug report."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "gpudoctor" in f.filename or
              os.sep + "doctor" + os.sep in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" ({os.path.basename(f.filename)}:{f.lineno} in {f.name})"
    text = str(exc)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


# Failures that belong to the input (or the machine), not to one rule: they keep their meaning
# as file errors.
_INPUT_FAILURES = (RecursionError, MemoryError, NotLinted, KeyboardInterrupt)


def _isolated(run, codes: set[str], result: FileResult, empty):
    """`run(codes)`, with each rule's failure costing that rule only: when the rules together
    raise, each is run alone to find the ones that fail (recorded in `result.internal`), and the
    others run together again. The common case costs one call."""
    try:
        return run(set(codes))
    except _INPUT_FAILURES:
        raise
    except Exception as exc:  # noqa: BLE001 (a rule's bug must not end the run)
        if len(codes) == 1:
            result.internal.append((next(iter(codes)), _describe(exc)))
            return empty
    good = set()
    for code in sorted(codes):
        try:
            run({code})
            good.add(code)
        except _INPUT_FAILURES:
            raise
        except Exception as exc:  # noqa: BLE001
            result.internal.append((code, _describe(exc)))
    if not good:
        return empty
    try:
        return run(good)
    except _INPUT_FAILURES:
        raise
    except Exception as exc:  # noqa: BLE001 (fails only together: every one of them is missing)
        for code in sorted(good):
            result.internal.append((code, _describe(exc)))
        return empty


def _build_finding(path: str, text: str, verdict) -> Finding:
    from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, Fix

    start = verdict.anchor.start or 0
    line = text.count("\n", 0, start) + 1
    col = start - (text.rfind("\n", 0, start) + 1) + 1
    fix = Fix(SAFE, "add PTX for the newest target", verdict.edits) if verdict.edits else \
        Fix(DISPLAY_ONLY, verdict.hint)
    return Finding(path=path, line=line, col=col, code="GPU006", kb_id=rules.BY_CODE["GPU006"].kb_id,
                   message=verdict.message, fix=fix, end_line=line, end_col=col + len(verdict.anchor.text))


def lint_file(task: Task) -> FileResult:
    """One file: read, prefilter, decode, parse, run the rules. Never raises: what cannot be
    linted is `error`, and a failure of gpudoctor's own code is `internal`."""
    with _no_cycle_collection():
        try:
            return _lint_file(task)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 (outside every rule: the whole file's findings are missing)
            result = FileResult(task.path, checked=True)
            result.internal.append((None, _describe(exc)))
            return result


class _no_cycle_collection:
    """Python's cycle collector off while one file's syntax tree is alive: a parsed file is
    hundreds of thousands of objects, which every full collection would walk again, for no
    garbage (trees hold no cycles; what the rules make is freed by reference counting). On again
    at the end, so a cycle made while it was off is collected later. (A sixth of lint's time on
    the torch tree.)"""

    def __enter__(self) -> None:
        import gc

        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        import gc

        if self.was:
            gc.enable()


def _lint_file(task: Task) -> FileResult:
    result = FileResult(task.path)
    wanted = [rules.BY_CODE[c] for c in task.codes]
    try:
        data = read_bounded(task.path)
    except OSError as exc:
        result.error = f"cannot read: {exc.strerror or exc}"
        return result
    if len(data) > MAX_BYTES:
        result.error = f"larger than {MAX_BYTES // (1024 * 1024)} MiB: not linted"
        return result
    if task.kind == rules.PYTHON:
        # GPU009's Python callers are read by the cross-file step, when needed
        wanted = [r for r in wanted if r.code != "GPU009"]
    seen: dict = {}  # substrings and patterns found, shared by the rules' prefilters
    codes = {r.code for r in wanted if task.exhaustive or task.unfiltered or r.wants(data, seen)}
    if task.kind == rules.CPP and ("GPU009" in task.codes or "GPU012" in task.codes) and b"define" in data:
        from gpudoctor.lint.cpprules import MACRO_DEFINITIONS

        result.cpp_defines = tuple(sorted({m.decode() for m in MACRO_DEFINITIONS.findall(data)}))
    result.checked = True
    if codes == {"GPU011"} and task.kind == rules.PYTHON and not (task.exhaustive or task.unfiltered):
        from gpudoctor.lint.rules.gpu011_module_after_cast import may_create_late

        if not may_create_late(data):
            result.deferred = True
            return result
    if not codes:
        return result
    if b"\0" in data:
        result.error = "binary file (contains NUL bytes): not linted"
        return result
    try:
        text = _decode(data, task.kind)
    except (UnicodeDecodeError, ValueError, LookupError) as exc:
        result.error = f"cannot decode: {exc}"
        return result
    if codes == {"GPU012"} and task.kind == rules.PYTHON and not (task.exhaustive or task.unfiltered) and \
            _contig_first_look(task.path, text, result):
        return result
    try:
        findings = lint_text(task.path, task.kind, task.subkind, text, data, codes, result, task.exhaustive,
                             task.unfiltered)
    except SyntaxError as exc:
        result.error = f"cannot parse (Python {sys.version_info[0]}.{sys.version_info[1]}): {exc.msg} (line {exc.lineno})"
        return result
    except RecursionError:
        result.error = "too deeply nested to parse or analyse: not linted"
        return result
    except NotLinted as exc:
        result.error = str(exc)
        return result
    except (ValueError, MemoryError) as exc:  # ast.parse's own refusals (rules' errors are internal)
        result.error = f"cannot parse: {type(exc).__name__}: {exc}"
        return result
    if b"gpudoctor:" in data:
        result.suppress = _suppressions(text, task.kind)
        findings = [f for f in findings if not suppressed(f, result.suppress)]
    if any(f.fix.edits for f in findings):
        result.digest = hashlib.sha256(data).hexdigest()
    result.findings = findings
    return result


def _contig_first_look(path: str, text: str, result: FileResult) -> bool:
    """A Python file only GPU012 wants: its functions that check contiguity, from the pieces of
    text that can hold one (gpudoctor.lint.pycontig.checking_functions_in_text) instead of the
    whole file's syntax tree. False when the first look cannot tell (the file is parsed whole)."""
    from gpudoctor.lint import pycontig, pyrules

    try:
        names = pycontig.checking_functions_in_text(text, path)
    except (RecursionError, MemoryError):
        return False
    if names is None:
        return False
    result.facts = pyrules.Facts(contig_checkers=names)
    return True


# --- many files ----------------------------------------------------------------------------------


def _jobs(requested: int | None) -> int:
    if requested:
        return max(1, requested)
    try:
        return max(1, len(os.sched_getaffinity(0)))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _preload(tasks: list[Task]) -> None:
    """Import the rule modules (and load the C++ parser) once, before the workers are forked, so
    that each worker does not do it again."""
    kinds = {t.kind for t in tasks}
    if rules.PYTHON in kinds:
        from gpudoctor.lint import pyrules  # noqa: F401
    if rules.CPP in kinds:
        from gpudoctor.lint import cpp, cpprules  # noqa: F401

        try:
            cpp.parser()
        except NotLinted:
            pass  # each worker reports it for its files
    if rules.BUILD in kinds:
        from gpudoctor.lint import archflags, buildflags  # noqa: F401


def can_fork() -> bool:
    """Whether lint's helper processes are forked (they inherit the parent's memory): where the
    platform has fork, except macOS, whose system libraries are not fork-safe."""
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"


def _run_tasks(tasks: list[Task], jobs: int) -> Iterable[FileResult]:
    # Big files first, so no worker is left alone with one at the end.
    tasks = sorted(tasks, key=lambda t: -t.size)
    total = sum(t.size for t in tasks)
    if jobs <= 1 or len(tasks) < 16 or total < 256 * 1024:
        return [lint_file(t) for t in tasks]
    import multiprocessing

    method = "fork" if can_fork() else "spawn"
    if method == "fork":
        _preload(tasks)
    ctx = multiprocessing.get_context(method)
    chunk = max(1, min(32, len(tasks) // (jobs * 16)))
    return _pooled(ctx, tasks, jobs, chunk, forked=method == "fork")


# The tasks of the run in progress, for forked workers: they inherit the list, so a worker is sent
# an index, not a pickled Task, and answers a plain result with its index alone (most files of a
# large tree have no finding and nothing for the project steps; the parent, which shares the two
# cores with the workers, would otherwise unpickle ten thousand empty results).
_FORKED_TASKS: list[Task] = []


def _lint_at(index: int) -> FileResult | int:
    result = lint_file(_FORKED_TASKS[index])
    return index if result == FileResult(result.path, checked=True) else result


class Terminated(BaseException):
    """SIGTERM or SIGHUP while the pool runs (a BaseException, like KeyboardInterrupt: nothing may
    catch it on the way out). Raised in the parent, so that leaving the pool's `with` terminates
    every worker before gpudoctor exits with 128 + `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_STOPPING = ("SIGTERM", "SIGHUP")


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def _worker_start() -> None:
    """In each worker: the parent alone decides on Ctrl-C (the terminal sends it to both), SIGTERM
    and SIGHUP end a worker at once (the parent's handler is not a worker's), and on Linux the
    worker dies with the parent, even a SIGKILLed one (PR_SET_PDEATHSIG)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in _STOPPING:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _pooled(ctx, tasks: list[Task], jobs: int, chunk: int, forked: bool = False) -> Iterator[FileResult]:
    import signal
    import threading

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in _STOPPING:
            if hasattr(signal, name):
                previous[getattr(signal, name)] = signal.signal(getattr(signal, name), _raise_terminated)
    try:
        if forked:
            _FORKED_TASKS[:] = tasks  # before the workers are forked: they inherit it
        with ctx.Pool(processes=min(jobs, len(tasks)), initializer=_worker_start) as pool:
            if not forked:
                yield from pool.imap_unordered(lint_file, tasks, chunksize=chunk)
            else:
                for r in pool.imap_unordered(_lint_at, range(len(tasks)), chunksize=chunk):
                    yield FileResult(tasks[r].path, checked=True) if isinstance(r, int) else r
    finally:  # the `with` has terminated and joined the workers, whatever ended the loop
        _FORKED_TASKS.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def lint(paths: list[str], select: list[str] | None = None, ignore: list[str] | None = None,
         isolated: bool = False, jobs: int | None = None,
         force_exclude: bool = False, exhaustive: bool = False,
         unfiltered: bool = False) -> tuple[LintResult, dict[str, FileResult], dict[str, Task]]:
    """Lint files and folders. Raises UsageError (bad path, unknown code) and cfg.ConfigError.
    `exhaustive`: every selected rule on every file, prefilters and gates off (for robustness
    tests). `unfiltered`: the prefilters off (every file read for every rule, every function
    interpreted), the rules' gates on: the same findings as a normal run, much slower (the test
    that the prefilters are safe)."""
    result = LintResult()
    planned = discover(paths, select, ignore, isolated, force_exclude)
    if exhaustive or unfiltered:
        planned = [(dataclasses.replace(t, exhaustive=exhaustive, unfiltered=unfiltered), c) for t, c in planned]
    tasks = [t for t, _ in planned]
    configs = {t.path: c for t, c in planned}
    by_path: dict[str, FileResult] = {}
    results = _run_tasks(tasks, _jobs(jobs))
    try:
        with _no_cycle_collection():  # thousands of unpickled results, no cycles among them
            for fr in results:
                by_path[fr.path] = fr
    finally:  # a signal between two results: the pool is closed here, not at exit
        close = getattr(results, "close", None)
        if close is not None:
            close()
    task_by_path = {t.path: t for t in tasks}
    findings: list[Finding] = []
    for path, fr in by_path.items():
        if fr.error:
            result.errors.append(FileError(path, fr.error))
        if fr.checked:
            result.files_checked += 1
        result.internal_errors += [InternalError(path, code, message) for code, message in fr.internal]
        findings.extend(fr.findings)
    with _no_cycle_collection():
        from gpudoctor.lint.crossfile import cross_file  # after every file: the project's steps

        cross, failed = cross_file(by_path, task_by_path, beside=_jobs(jobs) > 1 and len(tasks) >= 16)
    findings += cross
    result.internal_errors += failed
    # per-file-ignores from the configuration
    kept = []
    for f in findings:
        config = configs.get(f.path)
        if config is not None and f.code in config.ignored_codes(f.path):
            continue
        kept.append(f)
    result.findings = sorted(kept, key=lambda f: f.sort_key)
    result.errors.sort(key=lambda e: e.path)
    result.internal_errors.sort(key=lambda e: (e.path or "", e.code or ""))
    return result, by_path, task_by_path
