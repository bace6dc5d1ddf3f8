"""`gpudoctor lint` behind the command line: gpudoctor.cli parses the options and calls `run`,
which lints, applies or shows fixes, renders, and returns the exit code:

    0  no findings (after --fix: none left)
    1  findings (with --diff: fixes to show)
    2  usage or configuration error, or a file that could not be read, decoded or parsed
    3  internal error: a rule failed on a file (a gpudoctor bug); that rule's findings there are
       missing, everything else was linted and reported (it wins over 1 and 2: the run is
       incomplete in a way no change to the input explains)

Messages for people go to stderr; stdout carries only the chosen format. The output itself (-o,
standard output, a closed pipe) follows the CLI's convention, implemented once in
gpudoctor.output.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 3


@dataclass
class Options:
    paths: list[str] = field(default_factory=lambda: ["."])
    fmt: str = "text"
    output: str | None = None
    select: list[str] | None = None
    ignore: list[str] | None = None
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    isolated: bool = False
    force_exclude: bool = False
    jobs: int | None = None
    quiet: bool = False
    verbose: bool = False


def _codes(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def _err(message: str) -> None:
    from gpudoctor.safetext import visible

    sys.stderr.write(f"gpudoctor: {visible(message)}\n")


def run(opts: Options) -> int:
    import time

    from gpudoctor.lint import engine, fixes, render

    if opts.fmt not in render.FORMATS:
        _err(f"--format {opts.fmt}: expected one of {', '.join(render.FORMATS)}")
        return EXIT_ERROR
    if opts.fix and opts.diff:
        _err("--fix and --diff cannot be used together (--diff shows what --fix would change)")
        return EXIT_ERROR
    if opts.jobs is not None and opts.jobs < 1:
        _err(f"--jobs {opts.jobs}: must be at least 1")
        return EXIT_ERROR
    if opts.output not in (None, "-"):  # gpudoctor.cli checked it already; direct callers get the same rules
        from gpudoctor.output import OutputError, check_output

        try:
            check_output("-o", opts.output)
        except OutputError as exc:
            _err(str(exc))
            return EXIT_ERROR
        refused = _linted_output(opts.output, opts.paths or ["."], opts.isolated)
        if refused:
            _err(refused)
            return EXIT_ERROR
    started = time.perf_counter()
    try:
        result, by_path, tasks = engine.lint(opts.paths or ["."], _codes(opts.select), _codes(opts.ignore),
                                             opts.isolated, opts.jobs, force_exclude=opts.force_exclude)
    except ValueError as exc:  # engine.UsageError, config.ConfigError, an unknown code in --select
        _err(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except engine.Terminated as exc:  # SIGTERM or SIGHUP: every worker is already gone
        _err("terminated")
        return 128 + exc.signum

    diffs: dict[int, str | None] = {}
    if opts.fix or opts.diff:
        shown = _apply_fixes(opts, result, by_path, tasks)
        if opts.diff:
            out = "".join(shown)
            if not _emit(opts, out):
                return EXIT_ERROR
            if not opts.quiet:
                n = sum(1 for f in result.findings if fixes.applicable(f, opts.unsafe_fixes))
                sys.stderr.write(f"gpudoctor lint: {n} fix{'es' * (n != 1)} would be applied\n" if out else
                                 "gpudoctor lint: no fixes to apply\n")
            _errors(result)
            return _exit_code(result, bool(out))
    elif opts.fmt == "json":
        diffs = _finding_diffs(result, tasks)

    out = render.render(opts.fmt, result, render.Context(diffs=diffs, root=os.getcwd(), lines=_line_reader(tasks)))
    if not _emit(opts, out):
        return EXIT_ERROR
    _errors(result)
    if not opts.quiet:
        sys.stderr.write(render.summary(result, opts.unsafe_fixes) + "\n")
        if opts.verbose:
            sys.stderr.write(f"gpudoctor lint: {time.perf_counter() - started:.2f}s\n")
    return _exit_code(result, bool(result.findings))


def _exit_code(result, found: bool) -> int:
    if result.internal_errors:
        return EXIT_INTERNAL
    if result.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if found else EXIT_OK


def _linted_output(output: str, paths: list[str], isolated: bool) -> str | None:
    """Why `-o output` must not be written, or None. `gpudoctor lint . -o model.py` would replace a
    file it reads with its own report: refused before anything is read or fixed are a named file
    (any spelling or hard link), an existing source file of a kind lint reads anywhere under a
    linted folder (walked or excluded alike: it is the user's code), and a hard link to a file the
    walk lints."""
    import os
    import stat

    from gpudoctor.lint import engine
    from gpudoctor.output import Format, Output, OutputError, check_not_input

    try:
        st = os.stat(output)
    except OSError:
        return None  # a new file overwrites nothing
    if not stat.S_ISREG(st.st_mode):
        return None  # /dev/null, a FIFO
    files = [p for p in paths if not os.path.isdir(p)]
    try:
        check_not_input(Output(Format.text, output, "-o"), files)
    except OutputError as exc:
        return str(exc)
    real = os.path.realpath(output)
    for folder in (p for p in paths if os.path.isdir(p)):
        root = os.path.realpath(folder)
        if engine.classify(output) is not None and os.path.commonpath([root, real]) == root:
            return (f"-o {output}: is a source file under {folder}, which is being linted; gpudoctor never "
                    "overwrites what it reads: give another path")
    if st.st_nlink > 1 and len(files) < len(paths):
        try:
            planned = engine.discover(paths, None, None, isolated)
        except ValueError:
            return None  # the lint itself reports the bad path or configuration
        for task, _ in planned:
            try:
                src = os.stat(task.path)
            except OSError:
                continue
            if (src.st_dev, src.st_ino) == (st.st_dev, st.st_ino):
                return (f"-o {output}: is the same file as {task.path}, which is being linted; gpudoctor "
                        "never overwrites what it reads: give another path")
    return None


def _apply_fixes(opts: Options, result, by_path, tasks) -> list[str]:
    """--fix: write the fixed files and re-lint them, so `result` holds what is left; --diff: the
    unified diff of each file's fixes, nothing written. A file that cannot be fixed becomes an
    error of `result`."""
    from gpudoctor.lint import engine, fixes
    from gpudoctor.lint.model import FileError

    shown = []
    fixed_paths = set()
    for path in sorted({f.path for f in result.findings if fixes.applicable(f, opts.unsafe_fixes)}):
        task, fr = tasks[path], by_path[path]
        try:
            original, new, count = fixes.fix_file(task, fr, opts.unsafe_fixes, fixes.cross_file(result.findings, fr))
            if new == original:
                continue
            if opts.diff:
                shown.append(fixes.unified_diff(path, original, new))
            else:
                with open(path, "rb") as fh:
                    raw = fh.read()
                fixes.write_atomic(path, fixes.encode(task, new, raw))
                result.fixed += count
                fixed_paths.add(path)
        except (fixes.FixError, OSError, UnicodeError) as exc:
            result.errors.append(FileError(path, f"not fixed: {exc}"))
    if fixed_paths:
        # what is left in the fixed files is what a fresh lint finds there
        again, _, _ = engine.lint(sorted(fixed_paths), _codes(opts.select), _codes(opts.ignore), opts.isolated, 1)
        remaining = [f for f in result.findings if f.path not in fixed_paths] + again.findings
        result.findings = sorted(remaining, key=lambda f: f.sort_key)
        result.errors += again.errors
    return shown


def _finding_diffs(result, tasks) -> dict[int, str | None]:
    """For JSON: the diff of each finding's own edits, by its index in `result.findings`."""
    from gpudoctor.lint import engine, fixes

    diffs: dict[int, str | None] = {}
    texts: dict[str, str] = {}
    for i, f in enumerate(result.findings):
        if f.fix.edits:
            task = tasks[f.path]
            if f.path not in texts:
                try:
                    with open(f.path, "rb") as fh:
                        texts[f.path] = engine._decode(fh.read(), task.kind)
                except (OSError, ValueError):
                    continue
            diffs[i] = fixes.finding_diff(task, texts[f.path], f)
    return diffs


def _line_reader(tasks):
    """For SARIF fingerprints: a linted file's lines, read once; None where it cannot be."""
    from gpudoctor.lint import engine

    cache: dict[str, list[str] | None] = {}

    def lines(path: str) -> list[str] | None:
        if path not in cache:
            try:
                with open(path, "rb") as fh:
                    cache[path] = engine._decode(fh.read(), tasks[path].kind).splitlines()
            except (OSError, ValueError, UnicodeError, KeyError):
                cache[path] = None
        return cache[path]

    return lines


def _emit(opts: Options, out: str) -> bool:
    """Write `out` as every gpudoctor command writes (gpudoctor.output): standard output, or the
    file replaced atomically, never through a link. False (after one line on stderr) when it could
    not be written; a closed pipe propagates (the CLI exits 141)."""
    from gpudoctor.output import Format, Output, OutputError, emit_text

    try:
        emit_text(Output(Format.json if opts.fmt in ("json", "sarif") else Format.text, opts.output or "-", "-o"), out)
    except OutputError as exc:
        _err(str(exc))
        return False
    return True


def _errors(result) -> None:
    for e in result.errors:
        _err(f"{e.path}: {e.message}")
    for ie in result.internal_errors:
        _err(ie.describe())
    if result.internal_errors:
        _err("an internal error is a gpudoctor bug, not a problem in your code: please report it with the "
             "line above; the other rules and files were linted")
