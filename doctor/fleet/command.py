"""The fleet commands' CLI side: `gpudoctor merge` (registered by gpudoctor.cli) and the output
half of `gpudoctor scan --distributed` and `scan --ray`.

Their outputs follow the shared convention, implemented once in gpudoctor.output (`plan_outputs`,
`emit`, `write_file`, `Format` and the option factories): `--format text|json|md` (inferred from the `-o`
file's suffix when not given), `-o/--output PATH` (`-` = standard output, the default), checked
before any work (no directories, no symbolic links to files, no /proc), written whole or not at all;
`-q/--quiet` prints only the verdict, `-v/--verbose` every place a finding applies. Exit 0 when the
fleet is healthy (warnings alone count as healthy), 1 when there are error-level findings, 2 for
usage or input errors and when gpudoctor itself cannot run, always with one line on stderr and no
traceback.

gpudoctor's own lines on stderr (`say`, `fail`) and the exit codes are gpudoctor.output's too;
a message that quotes another rank's error goes through safetext there. gpudoctor.output imports
neither typer's nor rich's heavy parts at import time and nothing of gpudoctor.cli, so this module
(imported by cli while it loads, to register `merge`) uses it directly. Nothing here imports torch
or rich at import time.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import typer

from gpudoctor.output import (EXIT_FINDINGS, EXIT_OK, Format, Output, command_help, emit, emit_line, emit_text, fail,
                              format_option, no_redact_option, output_option, plan_outputs, progress_line, quiet_option,
                              say, verbose_option)


def emit_fleet(data: dict[str, Any], outputs: Sequence[Output], quiet: bool = False, verbose: bool = False) -> int:
    """Write the fleet report `data` to every planned output (`gpudoctor.output.Output`), as scan
    writes its report; returns the exit code. When nothing went to standard output and not
    quiet, the verdict is one line on stderr (merge has no progress to show otherwise)."""
    from gpudoctor.fleet import render
    from gpudoctor.safetext import visible

    verdict = visible(data.get("verdict", ""), 400)
    for out in outputs:
        if out.fmt is Format.json:
            emit_text(out, render.render_json(data))
        elif out.fmt is Format.md:
            emit_text(out, render.render_markdown(data, verbose=verbose))
        elif quiet:
            emit_line(out, verdict)
        else:
            emit(out, lambda console: render.render_terminal(data, console, verbose=verbose))
    if not quiet and not any(o.to_stdout for o in outputs):
        say(verdict)
    return EXIT_FINDINGS if render.has_problems(data) else EXIT_OK


def merge(
    reports: List[str] = typer.Argument(
        ..., metavar="REPORT.json...",
        help="Node or rank reports from `gpudoctor scan --format json`: files, folders of *.json, - for stdin.",
    ),
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the verdict line."),
    verbose: bool = verbose_option("List every place a finding applies."),
    no_redact: bool = no_redact_option("Keep real host names (not node-0, node-1, ...), user names, paths and ids."),
    straggler_fraction: float = typer.Option(
        0.10, "--straggler-fraction", min=0.0, max=1.0,
        help="A GPU this fraction below its model's fleet median GEMM throughput (and below --expect-fraction of nominal) is a straggler.",
    ),
    expect_fraction: float = typer.Option(
        0.60, "--expect-fraction", min=0.0, max=1.0,
        help="The per-model expectation: this fraction of the nominal peak TFLOP/s.",
    ),
) -> None:
    """Merge node reports: missing nodes, drift between nodes, slow GPUs."""
    from gpudoctor.fleet.merge import MergeInputError, MergeOptions, merge_files

    outputs = plan_outputs(fmt, output, inputs=reports)
    options = MergeOptions(straggler_fraction=straggler_fraction, expect_fraction=expect_fraction,
                           redact=not no_redact)
    try:
        data = merge_files(reports, options)
    except MergeInputError as exc:
        fail(str(exc))
    raise typer.Exit(emit_fleet(data, outputs, quiet=quiet, verbose=verbose))


class _Progress:
    """Rank 0's scan progress on stderr: one line per probe result."""

    def __call__(self, event: Any) -> None:
        if getattr(event, "kind", None) == "result" and event.result is not None:
            say(progress_line(event))


def _unless(quiet: bool) -> Any:
    """The fleet's progress messages: `say`, or nothing under -q."""
    return (lambda message: None) if quiet else say


def scan_distributed(options: Any, outputs: Sequence[Output], quiet: bool = False) -> int:
    """`gpudoctor scan --distributed`: run this rank's part; rank 0 writes the fleet report to
    scan's planned (and checked) outputs. Every other rank exits 0 whatever happened to
    it: its story is in rank 0's report."""
    from gpudoctor.fleet.distributed import DistributedError, run_distributed
    from gpudoctor.scan.runner import ScanError

    try:
        outcome = run_distributed(options, progress=None if quiet else _Progress(), say=_unless(quiet))
    except (DistributedError, ScanError) as exc:
        fail(str(exc))
    if outcome.fleet is None:
        if outcome.error:
            say(f"rank {outcome.rank}: {outcome.error}")
        return EXIT_OK
    return emit_fleet(outcome.fleet, outputs, quiet=quiet)


def scan_ray(options: Any, outputs: Sequence[Output], quiet: bool = False) -> int:
    """`gpudoctor scan --ray`: one scan per Ray node, one fleet report (gpudoctor.fleet.rayscan)."""
    from gpudoctor.fleet.distributed import DistributedError
    from gpudoctor.fleet.rayscan import scan_cluster

    try:
        data = scan_cluster(options, say=_unless(quiet))
    except DistributedError as exc:
        fail(str(exc))
    return emit_fleet(data, outputs, quiet=quiet)


def register(app: typer.Typer) -> None:
    """Add `merge` to the gpudoctor CLI."""
    app.command(name="merge", help=command_help(merge))(merge)
