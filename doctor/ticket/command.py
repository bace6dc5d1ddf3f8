"""The ticket commands: `gpudoctor run`, `gpudoctor report` and `gpudoctor diff`.

Registered on the main app by `gpudoctor.cli` (`register(app)`). They follow the conventions of
every command, with the same implementation (gpudoctor.output: its option factories, output
writing, messages and exit codes): `--format text|json|md` (inferred from the `-o` file's suffix, .json or .md, when
not given), `-o/--output PATH` (`-` is standard output) checked before any work and written whole,
never through a link; `-q`, `-v`, `--no-redact`; one line on stderr and exit code 2 for bad input,
no traceback; 141 for a closed pipe. `run` exits with the command's own exit status (128 + N when
a signal N ended it), 127/126 when the command cannot be found or executed, as shells do; its
standard output is the command's, so its diagnosis goes to stderr and, with -o, to a file. Nothing
here imports torch.
"""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional

import typer

from gpudoctor.output import (
    EXIT_FINDINGS,
    EXIT_OK,
    ClosedPipe,
    Format,
    Output,
    OutputError,
    emit,
    emit_line,
    emit_text,
    fail as _fail,
    format_option,
    no_redact_option,
    output_option,
    plan_outputs,
    progress_line,
    quiet_option,
    say as _say,
    verbose_option,
)


# --- run -----------------------------------------------------------------------------------------


def run(
    command: Optional[List[str]] = typer.Argument(None, metavar="-- COMMAND...", help="The command to run and its arguments."),
    localize: bool = typer.Option(False, "--localize", help="On an asynchronous CUDA error, re-run once with CUDA_LAUNCH_BLOCKING=1 to find the line that really failed."),
    bundle: Optional[str] = typer.Option(None, "--bundle", metavar="DIR", help="When the command fails, write a ticket bundle here (a new subfolder if DIR is not empty)."),
    no_scan: bool = typer.Option(False, "--no-scan", help="Bundle without scanning this machine."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="Interpreter whose environment the bundle's scan probes (default: the command's)."),
    fmt: Optional[Format] = format_option(
        "Format of the diagnosis written with -o: text (for people), json (the run record), or md (the ticket)."),
    output: Optional[str] = output_option(
        "Also write the diagnosis to PATH (standard output is the command's); .json or .md picks the format."),
    quiet: bool = quiet_option("Print nothing of gpudoctor's own, only the command's output."),
    verbose: bool = verbose_option("Also print the cause in full, with the patch."),
    no_redact: bool = no_redact_option(),
) -> None:
    """Run a command; when it fails, explain why and bundle a ticket.

    The command's output passes through unchanged and gpudoctor exits with its status; on failure
    the diagnosis goes to stderr, --localize finds the line an asynchronous CUDA error really came
    from, and --bundle DIR writes a redacted ticket bundle (ticket.md, run.json, scan.json, output.log)."""
    from gpudoctor.ticket import runcmd
    from gpudoctor.ticket import bundle as ticket

    if not command:
        _fail("nothing to run: gpudoctor run [OPTIONS] -- COMMAND [ARGS]...")
    out = None
    if output is not None:
        [out] = plan_outputs(fmt, output)
        if out.to_stdout:
            _fail(f"-o {output}: run passes the command's standard output through; write the diagnosis to a file")
    elif fmt is not None:
        _fail(f"--format {fmt.value}: run's standard output is the command's; give -o PATH for the diagnosis")
    if bundle is not None:
        try:
            ticket.check_bundle_dir(bundle)
        except ticket.BundleError as exc:
            _fail(str(exc))
    if python is not None and bundle is not None and not no_scan:
        from gpudoctor.scan import runner

        try:
            python = runner.resolve_python(python)
        except runner.ScanError as exc:
            _fail(str(exc))

    def interrupted(n: int) -> None:
        if quiet:
            return
        if n == 1:
            _say("interrupt passed to the command; press Ctrl-C again to stop it")
        elif n == 2:
            _say(f"stopping the command (SIGTERM, then SIGKILL in {runcmd.KILL_GRACE_S:g} s)")

    try:
        result = runcmd.run_command(command, on_interrupt=interrupted)
    except runcmd.RunError as exc:
        _fail(str(exc), exc.exit_code)
    try:
        _after_run(result, localize=localize, bundle=bundle, no_scan=no_scan, python=python, out=out,
                   quiet=quiet, verbose=verbose, redact=not no_redact, interrupted=interrupted)
    except KeyboardInterrupt:
        _say("interrupted; the diagnosis was not finished" + ("; no bundle written" if bundle else ""))
        raise typer.Exit(130)
    except _Interrupted as exc:  # a signal during the bundle's scan: the scan's workers are gone
        _say(f"{exc}; no bundle written")
        raise typer.Exit(exc.exit_code)
    raise typer.Exit(result.exit_status)


class _Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP stopped the bundle's scan: no bundle, exit 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _after_run(result: Any, *, localize: bool, bundle: Optional[str], no_scan: bool, python: Optional[str],
               out: Optional[Output], quiet: bool, verbose: bool, redact: bool,
               interrupted: Callable[[int], None]) -> None:
    import subprocess

    from gpudoctor.ticket import runcmd
    from gpudoctor.ticket import bundle as ticket

    redactor = None
    if redact:
        from gpudoctor.reports.redact import Redactor

        redactor = Redactor()
        # A secret the output names once (`DB_PASSWORD=hunter2`) is hidden wherever the output, and
        # every file of the bundle, shows it bare, before or after that line.
        if not result.ok or out is not None:
            redactor.learn_text(ticket.output_text(result))
    if result.ok:
        if not quiet:
            _say(f"`{_line(result.argv, redactor)}` {result.how} after {result.duration_s:.1f} s; nothing to explain"
                  + ("; no bundle written" if bundle else ""))
        if out is not None:
            record = ticket.build_ticket(result, ticket.Diagnosis((), None), redactor=redactor)
            emit_text(out, _render_ticket(record, out.fmt, verbose))
        return

    diagnosis = ticket.diagnose(ticket.output_text(result))
    localization = None
    if localize:
        if ticket.is_asynchronous(diagnosis):
            if os.environ.get("CUDA_LAUNCH_BLOCKING") != "1" and not quiet:
                _say("asynchronous CUDA error: re-running once with "
                      + " ".join(f"{k}={v}" for k, v in ticket.LOCALIZE_ENV.items()) + " to find the line that really failed")
            # The first run consumed a piped stdin; a terminal is still there to type into.
            stdin = None if _isatty(0) else subprocess.DEVNULL
            try:
                localization = ticket.localize(result.argv, diagnosis, stdin=stdin, on_interrupt=interrupted)
            except runcmd.RunError as exc:
                _say(f"--localize: the re-run could not start: {exc}")
        elif not quiet:
            _say("--localize: not an asynchronous CUDA failure; nothing re-run")

    record = ticket.build_ticket(result, diagnosis, localization=localization, redactor=redactor,
                                 code_patch=ticket.code_patch(diagnosis))
    if bundle is not None and not no_scan:
        # Before the diagnosis is shown: a finding's steps for this machine (the probe's, one
        # source) replace the entry's generic list in every part of the ticket.
        ticket.attach_scan(record, *_scan(result.argv, diagnosis, python, quiet), redactor=redactor)
    if not quiet:
        from gpudoctor.output import stderr_console

        from gpudoctor.ticket.render import render_text

        render_text(record, stderr_console(), verbose=verbose)
    if bundle is not None:
        try:
            folder, new_sub, files = ticket.write_bundle(bundle, record)
        except ticket.BundleError as exc:
            _say(f"no bundle written: {exc}")
        else:
            if not quiet:
                where = f"{folder} (a new folder: {bundle} was not empty)" if new_sub else folder
                _say(f"ticket bundle written to {where}: {', '.join(files)}; paste ticket.md into the issue")
    if out is not None:
        emit_text(out, _render_ticket(record, out.fmt, verbose))


def _line(argv: Any, redactor: Any) -> str:
    import shlex

    line = shlex.join(argv)
    return redactor.text(line) if redactor is not None else line


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _render_ticket(record: dict[str, Any], fmt: Format, verbose: bool) -> str:
    from gpudoctor.ticket import render as ticket_render
    from gpudoctor.output import render_to_text

    if fmt is Format.json:
        return ticket_render.render_json(record)
    if fmt is Format.md:
        return ticket_render.render_markdown(record)
    return render_to_text(lambda console: ticket_render.render_text(record, console, verbose=verbose))


def _scan(argv: Any, diagnosis: Any, python: Optional[str], quiet: bool) -> tuple[Any, tuple[str, ...], Optional[str]]:
    """The bundle's scan: the probes the explanation points at, in the command's interpreter."""
    from gpudoctor.scan import runner
    from gpudoctor.ticket import bundle as ticket

    probes = ticket.scan_probes(diagnosis)
    if not probes:
        return None, (), None
    target = python or ticket.guess_python(argv)
    if not quiet:
        _say(f"scanning this machine for the ticket: {', '.join(probes)}"
              + (f" in {target}" if target else "") + " (--no-scan skips this)")

    def progress(event: Any) -> None:
        if not quiet and event.kind == "result" and event.result is not None:
            _say(progress_line(event))

    try:
        # Not redacted here: the ticket's own Redactor redacts it with the rest of the bundle
        # (`ticket.attach_scan`), so a placeholder means the same value in every file.
        report = runner.run_scan(runner.ScanOptions(python=target, probes=probes, redact=False), progress=progress)
    except runner.ScanInterrupted as exc:
        raise _Interrupted(f"interrupted by {exc.signal_name} during the bundle's scan", exc.exit_code) from None
    except runner.ScanError as exc:
        if not quiet:
            _say(f"the scan could not run: {exc}")
        return None, probes, str(exc)
    return report, probes, None


def _guarded(what: str, render: Callable[..., Any]) -> Callable[..., Any]:
    """`render` behind the last line of defence for input that passed validation yet trips a
    renderer: one line and exit 2 instead of a traceback (and a request for a bug report:
    validation should have refused it). Output errors and a closed pipe pass through: they are the
    output convention's, not the renderer's."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return render(*args, **kwargs)
        except (typer.Exit, SystemExit, KeyboardInterrupt, ClosedPipe, OutputError, OSError):
            raise
        except Exception as exc:
            _fail(f"{what}: cannot render this report ({type(exc).__name__}: {exc}); "
                  "please report this as a gpudoctor bug")

    return call


# --- report --------------------------------------------------------------------------------------


def report(
    file: str = typer.Argument(..., metavar="FILE.json",
                               help="A JSON report (`gpudoctor scan --format json`), or - for standard input."),
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the verdict line."),
    verbose: bool = verbose_option("Also print whole summaries, evidence, fixes, patches and the environment."),
    no_redact: bool = no_redact_option("Do not redact the report again before showing it."),
) -> None:
    """Validate a saved report and show it again.

    Text, Markdown or JSON. A report of another schema version is read correctly or refused with one line (exit 2)."""
    from gpudoctor.reports import load, render
    from gpudoctor.reports.model import ReportFormatError, report_from_dict
    from gpudoctor.reports.redact import redact_report

    [out] = plan_outputs(fmt, output, inputs=[file])
    try:
        data = load.load_report(file)
    except load.ReportError as exc:
        _fail(str(exc))
    if not no_redact:
        data = redact_report(data)
    # What is printed is made safe first; the JSON form keeps the values as they are (JSON escapes).
    try:
        shown = report_from_dict(data if out.fmt is Format.json else load.sanitize(data))
    except ReportFormatError as exc:  # validation should have refused it
        _fail(f"{file}: not a valid report: {exc}")
    if out.fmt is Format.json:
        emit_text(out, _guarded(file, render.render_json)(shown))
    elif out.fmt is Format.md:
        emit_text(out, _guarded(file, render.render_markdown)(shown))
    elif quiet:
        emit_line(out, _guarded(file, render.verdict)(shown).line)
    else:
        emit(out, _guarded(file, lambda console: render.render_terminal(shown, console, verbose=verbose)))
    raise typer.Exit(EXIT_FINDINGS if shown.has_problems else EXIT_OK)


# --- diff ----------------------------------------------------------------------------------------


def diff(
    a: str = typer.Argument(..., metavar="A.json", help="The first report (where it works, or before)."),
    b: str = typer.Argument(..., metavar="B.json", help="The second report (where it fails, or after)."),
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the verdict line: which verdicts changed and the likeliest cause."),
    verbose: bool = verbose_option("Also print every link between a difference and a changed verdict."),
    no_redact: bool = no_redact_option("Do not redact the reports before comparing them."),
) -> None:
    """Compare two reports, the causes of changed verdicts first.

    Exit 1 when a probe's verdict differs between A and B, 0 when none does."""
    from gpudoctor.knowledge.kb import KnowledgeBaseError
    from gpudoctor.reports import diff as rdiff
    from gpudoctor.reports import load
    from gpudoctor.reports.redact import redact_report

    if a == "-" and b == "-":
        _fail("only one of the two reports can come from standard input")
    [out] = plan_outputs(fmt, output, inputs=[a, b])
    loaded = []
    for path in (a, b):
        try:
            data = load.load_report(path)
        except load.ReportError as exc:
            _fail(str(exc))
        loaded.append(data if no_redact else redact_report(data))
    try:
        result = rdiff.diff_reports(loaded[0], loaded[1], name_a=a, name_b=b)
    except KnowledgeBaseError as exc:  # the diff ranks through the knowledge base
        _fail(f"the knowledge base is damaged: {exc}")
    what = f"{a} and {b}"
    if out.fmt is Format.json:
        emit_text(out, _guarded(what, rdiff.render_json)(result))
    elif out.fmt is Format.md:
        emit_text(out, _guarded(what, rdiff.render_markdown)(result))
    elif quiet:
        emit_line(out, _guarded(what, rdiff.summary_line)(result))
    else:
        emit(out, _guarded(what, lambda console: rdiff.render_text(result, console, verbose=verbose)))
    raise typer.Exit(EXIT_FINDINGS if result.verdicts_changed else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add run, report and diff to the main app."""
    from gpudoctor.output import command_help

    app.command(name="run", help=command_help(run), context_settings={"allow_interspersed_args": False})(run)
    app.command(name="report", help=command_help(report))(report)
    app.command(name="diff", help=command_help(diff))(diff)
