"""The command line: parses options, calls one library function, picks a renderer, sets the exit
code. Nothing else lives here. The CLI process never imports torch.

Exit codes (documented in the README):
  0  success: something was matched / shown, or every probe passed or skipped
  1  findings: the text matched nothing known (explain), or a probe failed or crashed (scan)
  2  usage or input error, or gpudoctor itself could not run
"""
from __future__ import annotations

import re
import sys
from typing import NoReturn, Optional

import typer

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

app = typer.Typer(
    name="gpudoctor",
    help="A diagnostic doctor for PyTorch on NVIDIA GPUs.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


# --- explain / list (knowledge base) -------------------------------------------------------------

_ID_LIKE = re.compile(r"^[A-Za-z0-9_.:-]{2,64}$")
_LINT_CODE = re.compile(r"^GPU\d{3}$", re.IGNORECASE)


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One clear line on stderr and the exit code; never a traceback."""
    sys.stderr.write(f"gpudoctor: {message}\n")
    raise typer.Exit(code)


def _console():
    from rich.console import Console

    return Console(highlight=False)


@app.command()
def explain(
    query: Optional[str] = typer.Argument(
        None, help="A knowledge-base id or alias, an error message, or - to read standard input."
    ),
    file: Optional[str] = typer.Option(None, "--file", "-f", help="Read the error text from a log file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (see the README)."),
) -> None:
    """Name the known failure behind an id or pasted error text: cause, fix and patch."""
    if query is not None and file is None and _LINT_CODE.match(query):  # a lint rule: GPU003
        from gpudoctor.lint.explain import show_rule

        shown = show_rule(query, as_json)
        if shown is not None:
            raise typer.Exit(shown)
    from gpudoctor import explain as ex
    from gpudoctor import kb, textinput
    from gpudoctor.matcher import match_chunks

    if file is not None and query is not None:
        _fail("give either text (or -) or --file, not both")
    if file is None and query is None:
        _fail("nothing to explain: give an id, an error text, - for stdin, or --file LOG")
    try:
        entry = kb.load_entry(query) if query not in (None, "-") else None
        if entry is not None:
            result = ex.Explanation(matches=(), entry=entry)
        else:
            if file is not None:
                chunks = textinput.iter_file(file)
            elif query == "-":
                chunks = textinput.iter_stream(sys.stdin.buffer, name="standard input")
            else:
                chunks = textinput.iter_text(query)
            matches = tuple(match_chunks(chunks))
            result = ex.Explanation(matches=matches, entry=matches[0].entry if matches else None)
    except textinput.InputError as exc:
        _fail(str(exc))
    except kb.KnowledgeBaseError as exc:
        _fail(f"the knowledge base is damaged: {exc}")

    if result.entry is None and query not in (None, "-") and _ID_LIKE.match(query):
        hints = kb.suggest(query)
        tail = f"; did you mean {', '.join(hints)}?" if hints else "; `gpudoctor list` shows them all"
        if as_json:
            sys.stdout.write(ex.to_json(result) + "\n")
        _fail(f"no knowledge-base entry or known error matches {query!r}{tail}")

    if as_json:
        sys.stdout.write(ex.to_json(result) + "\n")
    else:
        console = _console()
        if result.matches:
            ex.render_matches(result.matches, console)
            console.print()
        if result.entry is not None:
            ex.render_entry(result.entry, console, result.best)
    if result.entry is None:
        sys.stderr.write(
            "gpudoctor: no known failure matched this text; run `gpudoctor scan` to probe this machine\n"
        )
        raise typer.Exit(EXIT_FINDINGS)


@app.command(name="list")
def list_entries(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print a Markdown table (the README index)."),
) -> None:
    """List the knowledge-base ids and titles."""
    from gpudoctor import kb
    from gpudoctor.explain import list_json

    try:
        entries = kb.load_all()
    except kb.KnowledgeBaseError as exc:
        _fail(f"the knowledge base is damaged: {exc}")
    if as_json:
        sys.stdout.write(list_json(entries) + "\n")
        return
    if markdown:
        rows = ["| `%s` | %s |" % (e.id, e.title.replace("|", "\\|")) for e in entries]
        sys.stdout.write("\n".join(["| id | title |", "| --- | --- |", *rows]) + "\n")
        return
    from rich.table import Table

    table = Table(show_header=True, box=None)
    table.add_column("id", style="bold")
    table.add_column("title")
    for e in entries:
        table.add_row(e.id, e.title)
    _console().print(table)


# --- scan ----------------------------------------------------------------------------------------


def _attn_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) <= 0:
        _fail(f"--attn-shape {text}: expected four positive integers B,H,N,D")
    return shape


def _check_output(option: str, path: str | None) -> None:
    """Refuse an output path before the scan runs, not after."""
    import os

    if path is None or path == "-":
        return
    if os.path.isdir(path):
        _fail(f"{option} {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _fail(f"{option} {path}: no such directory {parent}")


def _probe_options(items: list[str]) -> tuple[tuple[str, object], ...]:
    """KEY=VALUE pairs; values that parse as JSON (1, true, 0.5, [1,2]) are typed, others stay text."""
    import json

    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--probe-option {item}: expected KEY=VALUE")
        try:
            parsed: object = json.loads(value)
        except ValueError:
            parsed = value
        out.append((key.strip(), parsed))
    return tuple(out)


def _write_atomic(path: str, text: str) -> None:
    """Write via a temporary file and rename: a reader never sees half a report. The rename goes
    to the symlink's target; a device or FIFO (/dev/stdout, a pipe) is written through, never
    replaced."""
    import os
    import tempfile

    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=os.path.dirname(path))
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make a shared report unreadable
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class _ScanProgress:
    """Progress on stderr: a live line (running probe, elapsed time) on a terminal, plain lines
    otherwise. Called by the runner for each event."""

    def __init__(self, console) -> None:
        self.console = console
        self.live = None
        self.current = self.probe_line = "starting"
        self.since = 0.0

    def __enter__(self) -> "_ScanProgress":
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self, console=self.console, transient=True, refresh_per_second=8)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def __rich__(self):
        import time

        from rich.spinner import Spinner

        return Spinner("dots", text=f"{self.current}  {time.monotonic() - self.since:.1f}s")

    def __call__(self, event) -> None:
        import time

        where = f" on {event.device}" if event.device else ""
        from gpudoctor.runner import TORCH_READY

        if event.kind == "status" and event.message == TORCH_READY:
            self.current, self.since = self.probe_line, time.monotonic()
        elif event.kind == "status":
            self.current, self.since = event.message, time.monotonic()
            if self.live is None and event.message == "importing torch":
                self.console.print("gpudoctor: importing torch", markup=False, highlight=False)
        elif event.kind == "start":
            self.current = self.probe_line = f"[{event.index}/{event.total}] {event.probe}{where}"
            self.since = time.monotonic()
        elif event.kind == "result" and event.result is not None:
            where = f" on {event.result.device}" if event.result.device else ""
            line = (f"[{event.index}/{event.total}] {event.probe}{where}: {event.result.status.value} "
                    f"({event.result.duration_s:.2f}s)")
            self.console.print(line, markup=False, highlight=False)


@app.command()
def scan(
    probe: list[str] = typer.Option([], "--probe", help="Run only this probe id (repeatable)."),
    skip: list[str] = typer.Option([], "--skip", help="Do not run this probe id (repeatable)."),
    device: str = typer.Option("cuda:0", "--device", help="cuda:N, all (every visible GPU), cpu, or a torch device."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds; overrides every probe's limit."),
    python: Optional[str] = typer.Option(None, "--python", help="Diagnose the environment of this interpreter."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the JSON report here (- for stdout)."),
    markdown_out: Optional[str] = typer.Option(None, "--markdown", help="Write a Markdown report here (- for stdout)."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Keep user names, host names, paths and ids."),
    list_only: bool = typer.Option(False, "--list-probes", help="List the probes (ids, titles, what they emit)."),
    attn_shape: Optional[str] = typer.Option(None, "--attn-shape", help="Attention shape B,H,N,D for attention probes."),
    probe_file: list[str] = typer.Option([], "--probe-file", help="Also run the probe in this .py file (repeatable)."),
    probe_option: list[str] = typer.Option(
        [], "--probe-option", help="KEY=VALUE passed to probes in ctx.options (repeatable), e.g. fp8_compile_contract=1."
    ),
) -> None:
    """Run the probes in isolated workers and report what works on this machine."""
    import os

    from rich.console import Console

    from gpudoctor import runner

    if timeout is not None and timeout <= 0:
        _fail(f"--timeout {timeout:g}: must be positive")
    for path in probe_file:
        if not os.path.isfile(path):
            _fail(f"--probe-file {path}: no such file")
    if json_out == "-" and markdown_out == "-":
        _fail("--json - and --markdown - cannot both write to standard output")
    _check_output("--json", json_out)
    _check_output("--markdown", markdown_out)
    options = runner.ScanOptions(
        python=python, probes=tuple(probe), skip=tuple(skip), device=device, timeout=timeout,
        probe_files=tuple(probe_file), attn_shape=_attn_shape(attn_shape) if attn_shape else None,
        redact=not no_redact, probe_options=_probe_options(probe_option),
    )
    stderr = Console(stderr=True, highlight=False)
    if list_only:
        try:
            probes, errors = runner.list_probes(options)
        except runner.ScanError as exc:
            _fail(str(exc))
        from rich.table import Table

        table = Table(show_header=True, box=None)
        for column in ("id", "title", "emits"):
            table.add_column(column, style="bold" if column == "id" else None)
        for p in probes:
            table.add_row(p["id"], p["title"], ", ".join(p["emits"]) or "-")
        Console(highlight=False).print(table)
        for error in errors:
            stderr.print(f"gpudoctor: {error['source']}: {error['error']}", markup=False)
        return

    try:
        with _ScanProgress(stderr) as progress:
            report = runner.run_scan(options, progress=progress)
    except runner.ScanError as exc:
        _fail(str(exc))

    from gpudoctor.reports import render

    for path, render_to in ((json_out, render.render_json), (markdown_out, render.render_markdown)):
        if path == "-":
            sys.stdout.write(render_to(report))
        elif path is not None:
            _write_atomic(path, render_to(report))
    if "-" not in (json_out, markdown_out):
        render.render_terminal(report, Console(highlight=False))
    raise typer.Exit(EXIT_FINDINGS if report.has_problems else EXIT_OK)


# --- lint (the implementation lives in gpudoctor.lint) ---------------------------------------------


@app.command()
def lint(
    paths: Optional[list[str]] = typer.Argument(None, help="Files or folders to lint (default: the current folder)."),
    fmt: str = typer.Option("text", "--format", help="Output format: text, json or md."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the output to this file (- for stdout)."),
    select: list[str] = typer.Option([], "--select", help="Only these rule codes or prefixes, comma-separated (ALL)."),
    ignore: list[str] = typer.Option([], "--ignore", help="Skip these rule codes or prefixes, comma-separated."),
    fix: bool = typer.Option(False, "--fix", help="Apply the safe fixes (atomically; re-parsed before writing)."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Also apply (or show) the unsafe fixes."),
    diff: bool = typer.Option(False, "--diff", help="Print the unified diff of the fixes instead of applying them."),
    isolated: bool = typer.Option(False, "--isolated", help="Ignore the tool.gpudoctor.lint table of pyproject.toml."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes (default: one per core)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line on stderr."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also report the time taken."),
) -> None:
    """Find known GPU failure patterns in code before it runs (`gpudoctor explain GPU001` documents a rule)."""
    from gpudoctor.lint.cli import Options, run

    raise typer.Exit(run(Options(paths=list(paths or ["."]), fmt=fmt, output=output, select=select, ignore=ignore,
                                 fix=fix, unsafe_fixes=unsafe_fixes, diff=diff, isolated=isolated, jobs=jobs,
                                 quiet=quiet, verbose=verbose)))


def main() -> None:
    app()
