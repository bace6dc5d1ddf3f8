"""The ticket commands: `gpudoctor run`, `gpudoctor report` and `gpudoctor diff`.

Registered on the main app by `gpudoctor.cli` (`register(app)`), so that cli.py carries only two
lines for them. They follow the team's conventions: `--format text|json|md` (inferred from the `-o`
file's suffix, .json or .md, when not given), `-o/--output PATH` (`-` is standard output), `-q`,
`-v`, one line on stderr and exit code 2 for bad input, no traceback. `run` exits with the command's
own exit status (128 + N when a signal N ended it), 127/126 when the command cannot be found or
executed, as shells do. Nothing here imports torch.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator, NoReturn, Optional

import typer

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
FORMATS = ("text", "json", "md")
_SUFFIX_FORMAT = {".json": "json", ".md": "md", ".markdown": "md"}


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    from gpudoctor.safetext import visible

    sys.stderr.write(f"gpudoctor: {visible(message, 1000)}\n")
    raise typer.Exit(code)


def _note(message: str) -> None:
    """A line of gpudoctor's own on stderr, written straight to the descriptor (the command shares it)."""
    from gpudoctor.safetext import visible

    try:
        sys.stderr.flush()
        os.write(2, f"gpudoctor: {visible(message, 2000)}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _format(fmt: Optional[str], output: Optional[str]) -> str:
    if fmt is None:
        if output and output != "-":
            return _SUFFIX_FORMAT.get(os.path.splitext(output)[1].lower(), "text")
        return "text"
    if fmt not in FORMATS:
        _fail(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    return fmt


def check_output(path: Optional[str]) -> None:
    """Refuse an unusable -o before any work: a directory, a symbolic link (it is not replaced,
    and not followed), a missing folder, an empty path."""
    if path is None or path == "-":
        return
    if not path:
        _fail("-o: empty path")
    if os.path.islink(path):
        _fail(f"-o {path}: is a symbolic link; give the file itself (gpudoctor does not write through links)")
    if os.path.isdir(path):
        _fail(f"-o {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _fail(f"-o {path}: no such directory {parent}")


def write_output(path: Optional[str], text: str) -> None:
    """`text` to standard output, or to `path`: a regular file is replaced atomically (a temporary
    file renamed over it), a device or FIFO is written through. One line and exit 2 on failure."""
    import stat
    import tempfile

    if path is None or path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        except (OSError, UnicodeEncodeError) as exc:
            _quiet_stdout()
            _fail(f"cannot write to standard output: {getattr(exc, 'strerror', None) or exc}")
        return
    try:
        mode = os.stat(path).st_mode if os.path.exists(path) else None
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            return
        fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=os.path.dirname(os.path.abspath(path)))
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror or exc}")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _show(render: Callable[[Any], None], output: Optional[str]) -> None:
    """Run a rich renderer: on the terminal when writing to standard output (colour only there),
    else into text for the file, at a fixed width and without colour."""
    from rich.console import Console

    if output is None or output == "-":
        try:
            render(Console(highlight=False))
        except BrokenPipeError:
            _quiet_stdout()
        return
    write_output(output, _as_text(render))


def _as_text(render: Callable[[Any], None]) -> str:
    import io

    from rich.console import Console

    buffer = io.StringIO()
    render(Console(file=buffer, width=100, color_system=None, highlight=False, force_terminal=False))
    return buffer.getvalue()


# --- run -----------------------------------------------------------------------------------------


def run(
    command: Optional[list[str]] = typer.Argument(None, metavar="-- COMMAND...", help="The command to run and its arguments."),
    localize: bool = typer.Option(False, "--localize", help="On an asynchronous CUDA error, re-run once with CUDA_LAUNCH_BLOCKING=1 to find the line that really failed."),
    bundle: Optional[str] = typer.Option(None, "--bundle", metavar="DIR", help="When the command fails, write a ticket bundle here (a new subfolder if DIR is not empty)."),
    no_scan: bool = typer.Option(False, "--no-scan", help="Bundle without scanning this machine."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter whose environment the bundle's scan probes (default: the command's)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="Format of the diagnosis written with -o: text, json or md."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Also write the diagnosis (the run record) here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing of gpudoctor's own on stderr, only the command's output."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the cause in full, with the patch."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Keep user names, host names, tokens and paths in what gpudoctor writes."),
) -> None:
    """Run a command; when it fails, explain why and write a ticket-ready, redacted bundle."""
    from gpudoctor import runcmd, ticket

    if not command:
        _fail("nothing to run: gpudoctor run [OPTIONS] -- COMMAND [ARGS]...")
    if output == "-":
        _fail("-o -: run passes the command's standard output through; write the diagnosis to a file")
    fmt = _format(fmt, output)
    check_output(output)
    if bundle is not None:
        try:
            ticket.check_bundle_dir(bundle)
        except ticket.BundleError as exc:
            _fail(str(exc))
    if python is not None and bundle is not None and not no_scan:
        from gpudoctor import runner

        try:
            python = runner.resolve_python(python)
        except runner.ScanError as exc:
            _fail(str(exc))

    def interrupted(n: int) -> None:
        if quiet:
            return
        if n == 1:
            _note("interrupt passed to the command; press Ctrl-C again to stop it")
        elif n == 2:
            _note(f"stopping the command (SIGTERM, then SIGKILL in {runcmd.KILL_GRACE_S:g} s)")

    try:
        result = runcmd.run_command(command, on_interrupt=interrupted)
    except runcmd.RunError as exc:
        _fail(str(exc), exc.exit_code)
    try:
        _after_run(result, localize=localize, bundle=bundle, no_scan=no_scan, python=python, fmt=fmt,
                   output=output, quiet=quiet, verbose=verbose, redact=not no_redact, interrupted=interrupted)
    except KeyboardInterrupt:
        _note("interrupted; the diagnosis was not finished" + ("; no bundle written" if bundle else ""))
        raise typer.Exit(130)
    raise typer.Exit(result.exit_status)


def _after_run(result: Any, *, localize: bool, bundle: Optional[str], no_scan: bool, python: Optional[str],
               fmt: str, output: Optional[str], quiet: bool, verbose: bool, redact: bool,
               interrupted: Callable[[int], None]) -> None:
    import subprocess

    from gpudoctor import runcmd, ticket

    redactor = None
    if redact:
        from gpudoctor.reports.redact import Redactor

        redactor = Redactor()
    if result.ok:
        if not quiet:
            _note(f"`{_line(result.argv, redactor)}` {result.how} after {result.duration_s:.1f} s; nothing to explain"
                  + ("; no bundle written" if bundle else ""))
        if output is not None:
            record = ticket.build_ticket(result, ticket.Diagnosis((), None), redactor=redactor)
            write_output(output, _render_ticket(record, fmt, verbose))
        return

    diagnosis = ticket.diagnose(ticket.output_text(result))
    localization = None
    if localize:
        if ticket.is_asynchronous(diagnosis):
            if os.environ.get("CUDA_LAUNCH_BLOCKING") != "1" and not quiet:
                _note("asynchronous CUDA error: re-running once with "
                      + " ".join(f"{k}={v}" for k, v in ticket.LOCALIZE_ENV.items()) + " to find the line that really failed")
            # The first run consumed a piped stdin; a terminal is still there to type into.
            stdin = None if _isatty(0) else subprocess.DEVNULL
            try:
                localization = ticket.localize(result.argv, diagnosis, stdin=stdin, on_interrupt=interrupted)
            except runcmd.RunError as exc:
                _note(f"--localize: the re-run could not start: {exc}")
        elif not quiet:
            _note("--localize: not an asynchronous CUDA failure; nothing re-run")

    record = ticket.build_ticket(result, diagnosis, localization=localization, redactor=redactor)
    if not quiet:
        from rich.console import Console

        ticket.render_text(record, Console(stderr=True, highlight=False), verbose=verbose)
    if bundle is not None and not no_scan:
        ticket.attach_scan(record, *_scan(result.argv, diagnosis, python, quiet), redactor=redactor)
    if bundle is not None:
        try:
            folder, new_sub, files = ticket.write_bundle(bundle, record)
        except ticket.BundleError as exc:
            _note(f"no bundle written: {exc}")
        else:
            if not quiet:
                where = f"{folder} (a new folder: {bundle} was not empty)" if new_sub else folder
                _note(f"ticket bundle written to {where}: {', '.join(files)}; paste ticket.md into the issue")
    if output is not None:
        write_output(output, _render_ticket(record, fmt, verbose))


def _line(argv: Any, redactor: Any) -> str:
    import shlex

    line = shlex.join(argv)
    return redactor.text(line) if redactor is not None else line


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _render_ticket(record: dict[str, Any], fmt: str, verbose: bool) -> str:
    from gpudoctor import ticket

    if fmt == "json":
        return ticket.render_json(record)
    if fmt == "md":
        return ticket.render_markdown(record)
    return _as_text(lambda console: ticket.render_text(record, console, verbose=verbose))


def _scan(argv: Any, diagnosis: Any, python: Optional[str], quiet: bool) -> tuple[Any, tuple[str, ...], Optional[str]]:
    """The bundle's scan: the probes the explanation points at, in the command's interpreter."""
    from gpudoctor import runner, ticket

    probes = ticket.scan_probes(diagnosis)
    if not probes:
        return None, (), None
    target = python or ticket.guess_python(argv)
    if not quiet:
        _note(f"scanning this machine for the ticket: {', '.join(probes)}"
              + (f" in {target}" if target else "") + " (--no-scan skips this)")

    def progress(event: Any) -> None:
        if quiet or event.kind != "result" or event.result is None:
            return
        where = f" on {event.result.device}" if event.result.device else ""
        _note(f"[{event.index}/{event.total}] {event.probe}{where}: {event.result.status.value}")

    try:
        report = runner.run_scan(runner.ScanOptions(python=target, probes=probes), progress=progress)
    except runner.ScanError as exc:
        if not quiet:
            _note(f"the scan could not run: {exc}")
        return None, probes, str(exc)
    return report, probes, None


@contextlib.contextmanager
def _render_guard(what: str) -> Iterator[None]:
    """The last line of defence for input that passed validation yet trips a renderer: one line
    and exit 2 instead of a traceback (and a request for a bug report: validation should have
    refused it)."""
    try:
        yield
    except (typer.Exit, SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:
        _fail(f"{what}: cannot render this report ({type(exc).__name__}: {exc}); "
              "please report this as a gpudoctor bug")


# --- report --------------------------------------------------------------------------------------


def report(
    file: str = typer.Argument(..., metavar="FILE.json", help="A JSON report (`gpudoctor scan --json`), or - for standard input."),
    fmt: Optional[str] = typer.Option(None, "--format", help="text (default), json or md."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write here instead of standard output."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Do not redact the report again before showing it."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Whole summaries, evidence, fixes, patches and the environment."),
) -> None:
    """Validate a saved report and render it again (terminal, Markdown or JSON)."""
    from gpudoctor.reports import load, render
    from gpudoctor.reports.model import report_from_dict
    from gpudoctor.reports.redact import redact_report

    fmt = _format(fmt, output)
    check_output(output)
    try:
        data, _ = load.load_report(file)
    except load.ReportError as exc:
        _fail(str(exc))
    if not no_redact:
        data = redact_report(data)
    # What is printed is made safe first; the JSON form keeps the values as they are (JSON escapes).
    shown = report_from_dict(data if fmt == "json" else load.sanitize(data))
    with _render_guard(file):
        if fmt == "json":
            write_output(output, render.render_json(shown))
        elif fmt == "md":
            write_output(output, render.render_markdown(shown))
        else:
            _show(lambda console: render.render_terminal(shown, console, verbose=verbose), output)
    raise typer.Exit(EXIT_FINDINGS if shown.has_problems else EXIT_OK)


# --- diff ----------------------------------------------------------------------------------------


def diff(
    a: str = typer.Argument(..., metavar="A.json", help="The first report (where it works, or before)."),
    b: str = typer.Argument(..., metavar="B.json", help="The second report (where it fails, or after)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="text (default), json or md."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write here instead of standard output."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Do not redact the reports before comparing them."),
) -> None:
    """Compare two reports, the differences that explain a changed verdict first (exit 1 when a verdict differs)."""
    from gpudoctor.reports import diff as rdiff
    from gpudoctor.reports import load
    from gpudoctor.reports.redact import redact_report

    if a == "-" and b == "-":
        _fail("only one of the two reports can come from standard input")
    fmt = _format(fmt, output)
    check_output(output)
    loaded = []
    for path in (a, b):
        try:
            data, _ = load.load_report(path)
        except load.ReportError as exc:
            _fail(str(exc))
        loaded.append(data if no_redact else redact_report(data))
    try:
        result = rdiff.diff_reports(loaded[0], loaded[1], name_a=a, name_b=b)
    except Exception as exc:  # the knowledge base is damaged: the diff cannot rank
        from gpudoctor.kb import KnowledgeBaseError

        if isinstance(exc, KnowledgeBaseError):
            _fail(f"the knowledge base is damaged: {exc}")
        raise
    with _render_guard(f"{a} and {b}"):
        if fmt == "json":
            write_output(output, rdiff.render_json(result))
        elif fmt == "md":
            write_output(output, rdiff.render_markdown(result))
        else:
            _show(lambda console: rdiff.render_text(result, console), output)
    raise typer.Exit(EXIT_FINDINGS if result.verdicts_changed else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add run, report and diff to the main app."""
    app.command(name="run", context_settings={"allow_interspersed_args": False})(run)
    app.command(name="report")(report)
    app.command(name="diff")(diff)
