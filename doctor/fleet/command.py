"""The fleet commands' CLI side: `gpudoctor merge` (registered by gpudoctor.cli) and the output
half of `gpudoctor scan --distributed`.

Like every command: `--format text|json|md`, `-o/--output PATH` (`-` = standard output, the
default), `-q/--quiet`, `-v/--verbose`; exit 0 when the fleet is healthy (warnings alone count as
healthy), 1 when there are error-level findings, 2 for usage or input errors and when gpudoctor
itself cannot run, always with one line on stderr and no traceback. This module imports neither
torch nor rich at import time.
"""
from __future__ import annotations

import enum
import os
import sys
from typing import Any, List, NoReturn

import typer

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class FleetFormat(str, enum.Enum):
    text = "text"
    json = "json"
    md = "md"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    sys.stderr.write(f"gpudoctor: {message}\n")
    raise typer.Exit(code)


def check_output(path: str | None) -> None:
    """Refuse an unusable output path before any work is done."""
    if path is None or path == "-":
        return
    if not path:
        fail("-o: empty path")
    if os.path.isdir(path):
        fail(f"-o {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        fail(f"-o {path}: no such directory {parent}")


def write_output(path: str, text: str) -> None:
    """Standard output for "-"; otherwise a temporary file renamed over PATH, so a reader never
    sees half a report. A symlink at PATH is replaced, never written through; a device or FIFO
    (/dev/null, a pipe) is written as it is."""
    import tempfile

    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    if os.path.exists(path) and not os.path.islink(path) and not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=folder)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def emit(data: dict[str, Any], fmt: str, output: str, quiet: bool = False, verbose: bool = False) -> int:
    """Render the fleet report `data` as `fmt` to `output`; returns the exit code."""
    from gpudoctor.fleet import render

    try:
        if fmt == "text" and output == "-":
            from rich.console import Console

            if quiet:
                sys.stdout.write(render.visible(data.get("verdict", ""), 400) + "\n")
            else:
                render.render_terminal(data, Console(highlight=False), verbose=verbose)
        elif fmt == "text":
            from io import StringIO

            from rich.console import Console

            buffer = StringIO()
            render.render_terminal(data, Console(file=buffer, width=120, color_system=None, highlight=False), verbose=verbose)
            write_output(output, buffer.getvalue())
        elif fmt == "json":
            write_output(output, render.render_json(data))
        else:
            write_output(output, render.render_markdown(data, verbose=verbose))
    except BrokenPipeError:
        # `gpudoctor merge ... | head`: the reader left; that is not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    if output != "-" and not quiet:
        sys.stderr.write(f"gpudoctor: {render.visible(data.get('verdict', ''), 400)}\n")
    return EXIT_FINDINGS if render.has_problems(data) else EXIT_OK


def merge(
    reports: List[str] = typer.Argument(
        ..., metavar="REPORT.json...",
        help="Node or rank reports from `gpudoctor scan --format json`: files, folders of *.json, - for stdin.",
    ),
    fmt: FleetFormat = typer.Option(FleetFormat.text, "--format", help="text (people), json, or md (a ticket)."),
    output: str = typer.Option("-", "-o", "--output", help="Write the report here (- = standard output)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only the verdict line (text format)."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="List every place a finding applies."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Real host names instead of node-0, node-1, ..."),
    straggler_fraction: float = typer.Option(
        0.10, "--straggler-fraction", min=0.0, max=1.0,
        help="A GPU this fraction below its model's fleet median GEMM throughput (and below --expect-fraction of nominal) is a straggler.",
    ),
    expect_fraction: float = typer.Option(
        0.60, "--expect-fraction", min=0.0, max=1.0,
        help="The per-model expectation: this fraction of the nominal peak TFLOP/s.",
    ),
) -> None:
    """Merge per-node scan reports into one fleet report: missing nodes, drift, stragglers."""
    from gpudoctor.fleet.merge import MergeInputError, MergeOptions, merge_files

    check_output(output)
    options = MergeOptions(straggler_fraction=straggler_fraction, expect_fraction=expect_fraction,
                           redact=not no_redact)
    try:
        data = merge_files(reports, options)
    except MergeInputError as exc:
        from gpudoctor.safetext import visible

        fail(visible(str(exc), 400))
    raise typer.Exit(emit(data, fmt.value, output, quiet=quiet, verbose=verbose))


class _Progress:
    """Rank 0's scan progress on stderr: one line per probe result."""

    def __call__(self, event: Any) -> None:
        if getattr(event, "kind", None) == "result" and event.result is not None:
            where = f" on {event.result.device}" if event.result.device else ""
            sys.stderr.write(f"gpudoctor: [{event.index}/{event.total}] {event.probe}{where}: "
                             f"{event.result.status.value} ({event.result.duration_s:.2f}s)\n")


def scan_distributed(options: Any, outputs: list[tuple[str, str | None]], quiet: bool = False) -> int:
    """`gpudoctor scan --distributed`: run this rank's part; rank 0 writes the fleet report to
    every (format, path) in `outputs` that has a path, or as text to standard output when none
    does. Every other rank exits 0 whatever happened to it: its story is in rank 0's report."""
    from gpudoctor.fleet.distributed import DistributedError, run_distributed
    from gpudoctor.runner import ScanError

    def say(message: str) -> None:
        if not quiet:
            sys.stderr.write(f"gpudoctor: {message}\n")

    try:
        outcome = run_distributed(options, progress=None if quiet else _Progress(), say=say)
    except (DistributedError, ScanError) as exc:
        fail(str(exc))
    if outcome.fleet is None:
        if outcome.error:
            sys.stderr.write(f"gpudoctor: rank {outcome.rank}: {outcome.error}\n")
        return EXIT_OK
    wanted = [(fmt, path) for fmt, path in outputs if path]
    code = EXIT_OK
    for fmt, path in wanted or [("text", "-")]:
        code = emit(outcome.fleet, fmt, path, quiet=quiet)
    return code


def scan_ray(options: Any, outputs: list[tuple[str, str | None]], quiet: bool = False) -> int:
    """`gpudoctor scan --ray`: one scan per Ray node, one fleet report (gpudoctor.fleet.rayscan)."""
    from gpudoctor.fleet.distributed import DistributedError
    from gpudoctor.fleet.rayscan import scan_cluster

    def say(message: str) -> None:
        if not quiet:
            sys.stderr.write(f"gpudoctor: {message}\n")

    try:
        data = scan_cluster(options, say=say)
    except DistributedError as exc:
        fail(str(exc))
    code = EXIT_OK
    for fmt, path in [(f, p) for f, p in outputs if p] or [("text", "-")]:
        code = emit(data, fmt, path, quiet=quiet)
    return code


def register(app: typer.Typer) -> None:
    """Add `merge` to the gpudoctor CLI."""
    app.command(name="merge")(merge)
