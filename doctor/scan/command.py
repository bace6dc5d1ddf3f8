"""The plain scan of `gpudoctor scan` once its options are parsed (gpudoctor.cli parses them and
dispatches here, or to gpudoctor.fleet for `--distributed` and `--ray`): the progress on stderr
(`ScanProgress`), the scan, the invocation the report records, redaction, and every planned
output written; `list_probes` for `--list-probes`. Exit codes are the CLI's (gpudoctor.output):
0 healthy, 1 problems, 2 when gpudoctor itself cannot run, 128 + N after signal N.
"""
from __future__ import annotations

from typing import Any, Sequence

import typer

from gpudoctor.output import (EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, Format, Output, emit, emit_line, emit_text, fail,
                              progress_line, say)


class ScanProgress:
    """Progress on stderr. On a terminal: rich's Progress (a spinner that moves on its own
    refresh thread, the running probe and the device it runs on, done/total, elapsed time),
    cleared when the scan ends. Elsewhere (CI logs): one plain line per result. Quiet: nothing."""

    def __init__(self, console: Any, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.progress: Any = None
        self.task: Any = None
        self.running = "starting"

    def __enter__(self) -> "ScanProgress":
        # Interactive, not merely a terminal: `--color always` colours a log, never animates it.
        if self.console.is_interactive and not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self.console, transient=True, redirect_stdout=False,
                redirect_stderr=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _show(self, **fields: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, **fields)

    def _line(self, text: str) -> None:
        if self.progress is None and not self.quiet:
            from rich.text import Text

            self.console.print(Text(text), soft_wrap=True, highlight=False)

    def __call__(self, event: Any) -> None:
        from gpudoctor.scan.runner import TORCH_READY
        from gpudoctor.safetext import visible

        probe = visible(event.probe, 100)
        where = f" on {visible(event.device, 100)}" if event.device else ""
        if event.kind == "status":
            message = visible(event.message, 200)
            self._show(description=self.running if event.message == TORCH_READY else message)
            if event.message == "importing torch":
                self._line("gpudoctor: importing torch")
        elif event.kind == "start":
            self.running = f"{probe}{where}"
            self._show(description=self.running, total=event.total, completed=event.index - 1)
        elif event.kind == "result" and event.result is not None:
            self._show(completed=event.index)
            self._line(progress_line(event))


def _invocation(ctx: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What made the report: the command line and the options it resolved to (redacted with the
    rest of the report unless --no-redact)."""
    import shlex

    argv = ["gpudoctor", *(ctx.obj.get("argv", []) if isinstance(ctx.obj, dict) else [])]
    return {"command": shlex.join(argv), "argv": argv, "options": options}


def invocation(ctx: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What made the report: the command line and the options it resolved to (redacted with the
    rest of the report unless --no-redact)."""
    import shlex

    argv = ["gpudoctor", *(ctx.obj.get("argv", []) if isinstance(ctx.obj, dict) else [])]
    return {"command": shlex.join(argv), "argv": argv, "options": options}


def run(ctx: Any, options: Any, settings: dict[str, Any], outputs: Sequence[Output], stderr: Any, *,
        quiet: bool, verbose: bool) -> None:
    """Scan with `options` (gpudoctor.scan.runner.ScanOptions, made from `settings`), write the
    report to every output and exit with the scan's code (typer.Exit)."""
    import dataclasses

    from gpudoctor.scan import runner

    try:
        with ScanProgress(stderr, quiet=quiet) as progress:
            # Redacted below, with its invocation, by one Redactor: a placeholder such as
            # <host-1> then means the same machine in the command line and in the results.
            report = runner.run_scan(dataclasses.replace(options, redact=False), progress=progress)
    except runner.ScanError as exc:
        fail(str(exc), getattr(exc, "exit_code", EXIT_USAGE))  # ScanInterrupted: 128 + signal

    from gpudoctor.reports import render
    from gpudoctor.reports.redact import redact

    report.invocation = invocation(ctx, {
        **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items() if k != "probe_options"},
        "device": options.device,
        # KEY=VALUE text, as given: a value such as token=... is then redacted like any other text.
        "probe_options": [f"{key}={value}" for key, value in options.probe_options],
        "outputs": [{"format": o.fmt.value, "path": o.path} for o in outputs],
        "verbose": verbose, "quiet": quiet,
    })
    if options.redact:
        report = redact(report)
    for out in outputs:
        if out.fmt is Format.json:
            emit_text(out, render.render_json(report))
        elif out.fmt is Format.md:
            emit_text(out, render.render_markdown(report))
        elif quiet:
            emit_line(out, render.verdict(report).line)
        else:
            emit(out, lambda console: render.render_terminal(report, console, verbose=verbose))
    if not quiet and not any(o.to_stdout for o in outputs):
        # Every report went to a file: the verdict and where the report is, on stderr (as merge does),
        # so that `scan -o report.md` does not end on the last progress line without a word.
        where = ", ".join(o.path for o in outputs)
        say(f"{render.verdict(report).line}; the report is in {where}")
    raise typer.Exit(EXIT_FINDINGS if report.has_problems else EXIT_OK)


def list_probes(options: Any, out: Output, stderr: Any) -> None:
    import json

    from gpudoctor.scan import runner
    from gpudoctor.safetext import visible

    try:
        probes, errors = runner.list_probes(options)
    except runner.ScanError as exc:
        fail(str(exc))
    if out.fmt is Format.json:
        emit_text(out, json.dumps({"probes": probes, "errors": errors}, indent=2, ensure_ascii=False) + "\n")
    elif out.fmt is Format.md:  # a --probe-file's id and title are anyone's text
        from gpudoctor.reports import markdown as md

        rows = [f"| {md.code_span(p['id'], 100, table=True)} | {md.cell(p['title'], 200)} | "
                f"{md.cell(', '.join(p['emits']) or '-')} |" for p in probes]
        emit_text(out, "\n".join(["| probe | title | emits |", "| --- | --- | --- |", *rows]) + "\n")
    else:
        def table(console: Any) -> None:
            from rich.table import Table
            from rich.text import Text

            grid = Table(show_header=True, box=None)
            for column in ("id", "title", "emits"):
                grid.add_column(column, style="bold" if column == "id" else None, no_wrap=column == "id")
            for p in probes:
                grid.add_row(Text(visible(p["id"], 100)), Text(visible(p["title"], 200)),
                             Text(", ".join(p["emits"]) or "-"))
            console.print(grid)

        emit(out, table)
    for error in errors:
        stderr.print(f"gpudoctor: {visible(error['source'], 500)}: {visible(error['error'], 500)}",
                     markup=False, highlight=False)
