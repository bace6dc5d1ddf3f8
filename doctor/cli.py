"""The command line: parses options, calls one library function, picks a renderer, sets the exit
code. Nothing else lives here. The CLI process never imports torch.

Commands, in the order `gpudoctor --help` lists them: scan, explain, run, report, diff, lint,
merge, list. Here are their signatures (the options they parse) and the dispatch; the work lives
in the capabilities: scan's option types in gpudoctor.scan.options and the scan itself (progress,
outputs, exit code) in gpudoctor.scan.command, `--distributed` and `--ray` in gpudoctor.fleet.command;
`run`, `report` and `diff` in gpudoctor.ticket.command, `merge` in gpudoctor.fleet.command, lint's
work in gpudoctor.lint.cli; the commands are registered at the end of this module.

Conventions, the same for every command (docs/conventions.md):

- `--format text|json|md` picks the output, `-o/--output PATH` writes it to a file (`-`, the
  default, is standard output; a path ending in .json or .md picks that format when `--format` is
  not given). Outputs are checked before any work and written whole or not at all, never through
  a symbolic link: one implementation, gpudoctor.output, for every command. Old spellings stay as
  hidden aliases: `scan --json PATH`, `scan --markdown PATH`, `explain --json`, `list --json`,
  `list --markdown`.
- `-q/--quiet` prints only the verdict (no progress); `-v/--verbose` adds the details;
  `--no-redact` keeps what is redacted by default.
- `-V/--version`; `--color auto|always|never` on every command (gpudoctor.output.console_options:
  NO_COLOR under auto, and never, write no escape sequence at all); shell completion through
  typer (`--install-completion`, `--show-completion`).
- Exit codes: 0 ok/healthy, 1 findings (a probe failed, crashed or timed out; a text matched
  nothing known), 2 usage or input error or gpudoctor itself could not run. A usage error or an
  unusable output is one line on stderr, never a traceback: click's errors and
  `gpudoctor.output.OutputError` are caught in `_Group.main`. A closed pipe (`| head`) ends
  quietly with 141 (128 + SIGPIPE), as a shell reports for a tool killed by it. `run` exits with
  its command's status.
"""
from __future__ import annotations

import errno
import os
import re
import sys
from typing import Any, List, Optional

import typer
import typer.core

from gpudoctor.scan import options as scan_options
from gpudoctor.output import (
    EXIT_CLOSED_PIPE,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    FORMATS,
    ClosedPipe,
    Format,
    OutputError,
    color_param,
    command_help,
    emit,
    emit_text,
    fail as _fail,
    format_option,
    no_redact_option,
    output_option,
    plan_outputs,
    quiet_option,
    say as _say,
    set_color,
    stderr_console,
    verbose_option,
)

try:  # typer >= 0.20 vendors click as typer._click; older typers use click itself
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_errors  # type: ignore[no-redef]

_NO_ARGS = getattr(_click_errors, "NoArgsIsHelpError", ())  # click >= 8.2
_ABORT = getattr(_click_errors, "Abort", None) or getattr(typer, "Abort")  # where this typer keeps it



def _prepare_streams() -> None:
    # An ASCII-only PYTHONIOENCODING (or a C locale) must not turn a "…" into a traceback: keep
    # the encoding, replace what it cannot carry.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


def _silence_stdout() -> None:
    """After a closed pipe: point fd 1 at /dev/null so that the interpreter's final flush does not
    print "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _stdout_identity() -> Optional[tuple]:
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return (st.st_dev, st.st_ino, st.st_rdev)


def _devnull_identity() -> Optional[tuple]:
    try:
        st = os.stat(os.devnull)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_rdev)


class _Group(typer.core.TyperGroup):
    """Typer's group with one-line errors: click's usage errors (a bad option value, an unknown
    command) become `gpudoctor: ...` and exit 2, a closed pipe exits 141 quietly, and a failed
    output write is one line and exit 2. Help and completion are typer's own."""

    def main(self, args: Any = None, prog_name: Optional[str] = None, complete_var: Optional[str] = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _prepare_streams()
        _add_color_option(self)
        set_color("auto")  # until --color says otherwise (one process may run several commands: tests)
        argv = list(sys.argv[1:] if args is None else args)
        extra.setdefault("obj", {"argv": argv})
        stdout_before = _stdout_identity()
        try:
            rv = super().main(args=argv, prog_name=prog_name or "gpudoctor", complete_var=complete_var,
                              standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else EXIT_OK
            if sys.stdout is not None:
                sys.stdout.flush()
        except (ClosedPipe, BrokenPipeError):
            _silence_stdout()
            code = EXIT_CLOSED_PIPE
        except _NO_ARGS as exc:  # `gpudoctor` alone: the help, as click prints it, and exit 2
            text = exc.ctx.get_help() if exc.ctx is not None else ""  # typer's rich help prints itself
            if text:
                typer.echo(text, err=True)
            code = EXIT_USAGE
        except _click_errors.UsageError as exc:
            _say(_usage_line(exc))
            code = EXIT_USAGE
        except _click_errors.ClickException as exc:
            _say(exc.format_message())
            code = EXIT_USAGE
        except _ABORT:
            _say("aborted")
            code = 130
        except OutputError as exc:
            _say(str(exc))
            code = EXIT_USAGE
        except SystemExit as exc:
            # typer prints --help through a rich Console of its own, whose closed-pipe handler points
            # stdout at /dev/null and exits 1 (`gpudoctor --help | head -1`): that is our 141.
            if exc.code != 1 or stdout_before in (None, _devnull_identity()) or _stdout_identity() != _devnull_identity():
                raise
            code = EXIT_CLOSED_PIPE
        except OSError as exc:  # writing standard output failed: /dev/full, a dead terminal
            if exc.errno == errno.EPIPE:
                _silence_stdout()
                code = EXIT_CLOSED_PIPE
            else:
                _say(f"cannot write to standard output: {exc.strerror or exc}")
                code = EXIT_USAGE
        if not standalone_mode:
            return code
        sys.exit(code)

    def invoke(self, ctx: Any) -> Any:
        # typer turns EPIPE into exit 1 itself; ours is the conventional 141, without a word.
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise ClosedPipe() from exc


def _add_color_option(group: Any) -> None:
    """`--color auto|always|never` on the group and on every command (gpudoctor.output.color_param):
    ruff, uv and gh users expect it wherever they type it."""
    for command in (group, *group.commands.values()):
        if not any(getattr(p, "name", None) == "color" for p in command.params):
            command.params.append(color_param())


def _usage_line(exc: Any) -> str:
    """click's usage error as one line: `--timeout nan: must be ...` or click's own message."""
    param = getattr(exc, "param", None)
    if isinstance(exc, _click_errors.BadParameter) and param is not None and getattr(exc, "message", ""):
        name = (param.opts or [param.name or ""])[0]
        return f"{name} {exc.message}"
    message = exc.format_message()
    command = getattr(getattr(exc, "ctx", None), "command_path", "gpudoctor")
    return f"{message} (see `{command} --help`)"


# Paragraphs are single lines: typer's help keeps line breaks and wraps at the terminal's width.
_HELP = "\n\n".join([
    "A diagnostic doctor for PyTorch on NVIDIA GPUs.",
    "`scan` probes this machine, `explain` names a known failure from an error or an id, `run` turns a "
    "failing command into a ticket, `report` and `diff` read saved reports, `lint` checks code before it "
    "runs, `merge` combines a fleet's reports.",
    "Every command takes --format text|json|md, -o PATH, -q and -v; what gpudoctor writes is redacted "
    "unless --no-redact. Exit codes: 0 ok or healthy, 1 findings, 2 usage or input error (`run`: the "
    "command's own).",
])

app = typer.Typer(
    name="gpudoctor",
    cls=_Group,
    help=_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from gpudoctor import __version__

        typer.echo(f"gpudoctor {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print gpudoctor's version and exit."),
) -> None:
    """The root: only --version (the help is the app's)."""


# --- explain / list (knowledge base) -------------------------------------------------------------

_ID_LIKE = re.compile(r"^[A-Za-z0-9_.:-]{2,64}$")
_LINT_CODE = re.compile(r"^GPU\d{3}$", re.IGNORECASE)


def explain(
    query: Optional[str] = typer.Argument(
        None, metavar="[ID|TEXT|-]",
        help="A knowledge-base id or alias, a lint rule code (GPU001), an error message, or - to read standard "
             "input (read too when nothing is given and standard input is not a terminal)."
    ),
    file: Optional[str] = typer.Option(None, "--file", "-f", metavar="LOG", help="Read the error text from a log file."),
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the matched ids and titles."),
    verbose: bool = verbose_option("Print every matched entry in full, not just the best."),
    no_redact: bool = no_redact_option("Do not redact the lines quoted from the text: keep user names, host names, "
                                       "tokens, paths and hardware ids."),
    as_json: bool = typer.Option(False, "--json", hidden=True, help="Same as --format json."),
) -> None:
    """Name the known failure behind an error, a log or an id.

    Prints the cause, the fix and the patch. An id (`gpudoctor explain misaligned-address`) prints its entry; text, a log (--file) or
    standard input (-) is matched against the knowledge base, the root cause first."""
    if file is not None and query is not None:
        _fail("give either text (or -) or --file, not both")
    if file is None and query is None:
        # Nothing given: read standard input when something is piped into it, as grep and jq do
        # (`python train.py 2>&1 | gpudoctor explain`); a terminal there is a person who forgot
        # the text.
        if not _stdin_is_piped():
            _fail("nothing to explain: give an id or an error text, pipe a log in "
                  "(`python train.py 2>&1 | gpudoctor explain`), or --file LOG")
        query = "-"
    if as_json and fmt not in (None, Format.json):
        _fail("--json and --format both given; use --format")
    [out] = plan_outputs(Format.json if as_json else fmt, output, inputs=[file] if file else ())
    if query is not None and file is None and _LINT_CODE.match(query):  # a lint rule: GPU003
        from gpudoctor.lint.explain import show_rule

        shown = show_rule(query, output=out)
        if shown is not None:
            raise typer.Exit(shown)
        from gpudoctor.lint.rules import RULES

        _fail(f"no lint rule {query.upper()}: the rules are {RULES[0].code}..{RULES[-1].code} "
              "(`gpudoctor explain GPU001`)")
    from gpudoctor.explain import explanation as ex
    from gpudoctor.knowledge import kb

    try:
        # By id, only the entry's own file is read: neither the matcher nor the other entries load
        # (start-up: benchmarks/bench_explain.py).
        entry = kb.load_entry(query) if query not in (None, "-") else None
        if entry is not None:
            result = ex.Explanation(matches=(), entry=entry)
        else:
            result = _match(query, file)
    except kb.KnowledgeBaseError as exc:
        _fail(f"the knowledge base is damaged: {exc}")
    if result.matches and not no_redact:  # the quoted lines go into tickets: redacted as reports are
        from gpudoctor.reports.redact import Redactor

        result = ex.redact_explanation(result, Redactor())

    unknown_id = result.entry is None and query not in (None, "-") and _ID_LIKE.match(query)
    if out.fmt is Format.json:
        emit_text(out, ex.to_json(result) + "\n")
    elif out.fmt is Format.md:
        emit_text(out, ex.render_markdown(result))
    elif not unknown_id:
        emit(out, lambda console: ex.render_page(result, console, quiet=quiet, verbose=verbose))
    if unknown_id:
        hints = kb.suggest(query)
        tail = f"; did you mean {', '.join(hints)}?" if hints else "; `gpudoctor list` shows them all"
        _fail(f"no knowledge-base entry or known error matches {query!r}{tail}")
    if result.entry is None:
        # No entry is the verdict: exit 1. A platform or an unrecognised CUDA error was printed;
        # otherwise one line says nothing was recognised (and nothing more: a KeyError is no GPU
        # failure, and `scan` would not find one).
        if result.kind is None:
            # A few words that match nothing were probably meant as an id: `explain "cuda oom"`.
            words = (query or "").split() if file is None and query != "-" else []
            hints = kb.suggest("-".join(words)) if 1 < len(words) <= 4 else []
            tail = f"; did you mean {', '.join(hints)}? (`gpudoctor explain ID`)" if hints else ""
            _say(f"no GPU failure recognised in this text{tail}")
        raise typer.Exit(EXIT_FINDINGS)


def _stdin_is_piped() -> bool:
    """Standard input is there and is not a terminal (a pipe, a file, /dev/null)."""
    try:
        return sys.stdin is not None and not sys.stdin.isatty()
    except (ValueError, OSError):  # closed
        return False


def _match(query: Optional[str], file: Optional[str]) -> Any:
    """The ranked matches for pasted text, standard input (-) or a log file."""
    from gpudoctor.explain import explanation as ex
    from gpudoctor.explain import textinput
    from gpudoctor.explain.matcher import analyse_chunks
    from gpudoctor.patch.locate import TextTail

    try:
        if file is not None:
            chunks = textinput.iter_file(file)
        elif query == "-":
            stream = getattr(sys.stdin, "buffer", None)  # None when standard input is closed (`<&-`)
            if stream is None:
                _fail("standard input is closed: nothing to explain")
            chunks = textinput.iter_stream(stream, name="standard input")
        else:
            chunks = textinput.iter_text(query or "")
        tail = TextTail(chunks)  # the traceback the patch for the user's code is read from
        analysis = analyse_chunks(tail)
    except textinput.InputError as exc:
        _fail(str(exc))
    result = ex.from_analysis(analysis)
    result.code_patch = _code_patch(result, tail.text())
    return result


def _code_patch(result: Any, text: str) -> Any:
    """The patch for the user's own files that the text's traceback names (gpudoctor.patch), or
    None: only under an entry verdict (a platform or an unrecognised CUDA error has no entry
    whose rules could check the code), and lint is imported only when one of those files exists
    on this machine."""
    best = result.best
    if result.kind != "entry" or best is None or 'File "' not in text:
        return None
    from gpudoctor.patch import locate

    if not locate.names_local_files(text):
        return None
    from gpudoctor.ticket import pytrace

    tb = pytrace.failing_traceback(pytrace.parse_tracebacks(text), tuple(best.evidence))
    sites = locate.user_sites(tb.frames if tb is not None else locate.loose_frames(text))
    if not sites:
        return None
    from gpudoctor.patch.search import find_patches

    return find_patches(result.entry, sites)


def list_entries(
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the ids, one per line."),
    verbose: bool = verbose_option("Also print each entry's aliases."),
    as_json: bool = typer.Option(False, "--json", hidden=True, help="Same as --format json."),
    markdown: bool = typer.Option(False, "--markdown", hidden=True, help="Same as --format md."),
) -> None:
    """List the knowledge-base ids and titles."""
    from gpudoctor.knowledge import kb
    from gpudoctor.explain.explanation import list_json, list_markdown, render_list

    alias = Format.json if as_json else Format.md if markdown else None
    if alias is not None and fmt not in (None, alias):
        _fail("--json/--markdown and --format disagree; use --format")
    [out] = plan_outputs(fmt or alias, output)
    try:
        entries = kb.load_all()
    except kb.KnowledgeBaseError as exc:
        _fail(f"the knowledge base is damaged: {exc}")
    if out.fmt is Format.json:
        emit_text(out, list_json(entries) + "\n")
    elif out.fmt is Format.md:
        emit_text(out, list_markdown(entries))
    else:
        emit(out, lambda console: render_list(entries, console, quiet=quiet, verbose=verbose))


# --- scan (option types in gpudoctor.scan.options, the scan itself in gpudoctor.scan.command) -------

def scan(
    ctx: typer.Context,
    probe: List[str] = typer.Option([], "--probe", metavar="ID", help="Run only this probe (repeatable)."),
    skip: List[str] = typer.Option([], "--skip", metavar="ID", help="Do not run this probe (repeatable)."),
    device: Optional[str] = typer.Option(
        None, "--device", parser=scan_options.parse_device, metavar="DEVICE",
        help="auto (default: cuda:0 when torch sees a GPU, else cpu), cuda:N, all (every visible GPU), "
             "cpu, or a torch device such as xpu:0."),
    timeout: Optional[float] = typer.Option(None, "--timeout", parser=scan_options.parse_seconds, metavar="SECONDS",
                                            help="Time limit per probe, overriding each probe's own."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="Diagnose the environment of this interpreter."),
    fmt: Optional[Format] = format_option(),
    output: Optional[str] = output_option(),
    quiet: bool = quiet_option("Print only the verdict line (no progress)."),
    verbose: bool = verbose_option("Also print evidence, fixes, patches, crash tails and the whole environment."),
    no_redact: bool = no_redact_option(),
    list_only: bool = typer.Option(False, "--list-probes", help="List the probes (ids, titles, what they emit)."),
    attn_shape: Optional[str] = typer.Option(None, "--attn-shape", parser=scan_options.parse_attn_shape, metavar="B,H,N,D",
                                             help="Attention shape for the attention probes."),
    level: str = typer.Option("quick", "--level", parser=scan_options.parse_level, metavar="quick|deep",
                              help="quick (default): every probe's question with fewer cells; deep: "
                                   "the full matrices (sdpa-backends on every half dtype)."),
    probe_file: List[str] = typer.Option([], "--probe-file", parser=scan_options.parse_probe_file, metavar="PATH.py",
                                         help="Also run the probe in this .py file (repeatable)."),
    probe_option: List[str] = typer.Option(
        [], "--probe-option", parser=scan_options.parse_probe_option, metavar="KEY=VALUE",
        help="Passed to probes in ctx.options (repeatable), e.g. fp8_compile_contract=1."),
    json_out: Optional[str] = typer.Option(None, "--json", hidden=True, help="Also write the JSON report here."),
    markdown_out: Optional[str] = typer.Option(None, "--markdown", hidden=True, help="Also write Markdown here."),
    distributed: bool = typer.Option(
        False, "--distributed",
        help="Under torchrun: every rank scans its GPU, collectives are measured, rank 0 writes one fleet report."),
    ray_cluster: bool = typer.Option(
        False, "--ray", help="Scan every node of the Ray cluster at RAY_ADDRESS (needs ray) and write one fleet report."),
) -> None:
    """Probe this machine: what works, what fails, why, and the fix.

    Small real workloads (SDPA backends, xformers, FP8 matmul, async errors, ...) run in isolated
    workers of the target interpreter; the verdict comes first and last."""
    from gpudoctor.scan import command, runner

    outputs = plan_outputs(fmt, output, [(Format.json, json_out, "--json"), (Format.md, markdown_out, "--markdown")],
                           inputs=probe_file)
    settings: dict[str, Any] = dict(
        python=python, probes=tuple(probe), skip=tuple(skip), timeout=timeout, probe_files=tuple(probe_file),
        attn_shape=attn_shape, redact=not no_redact, probe_options=tuple(probe_option), level=level,
    )
    if device is not None:  # otherwise the runner's default (auto)
        settings["device"] = device
    options = runner.ScanOptions(**settings)
    stderr = stderr_console()
    if list_only:
        command.list_probes(options, outputs[0], stderr)
        return
    if distributed or ray_cluster:  # gpudoctor.fleet: torchrun (rank 0) or Ray writes one fleet report
        from gpudoctor.fleet.command import scan_distributed, scan_ray

        fleet_scan = scan_ray if ray_cluster else scan_distributed
        raise typer.Exit(fleet_scan(options, outputs, quiet=quiet))
    command.run(ctx, options, settings, outputs, stderr, quiet=quiet, verbose=verbose)


# --- lint (the implementation lives in gpudoctor.lint) ---------------------------------------------


# gpudoctor.lint.render.RENDERERS, spelt out so that the CLI imports no part of the linter until
# it lints (a test holds the two together).
LINT_FORMATS = ("text", "json", "md", "sarif", "github")
_LINT_FORMAT_HELP = ("Output format: text (for people), json, md (Markdown), sarif (SARIF 2.1.0 for GitHub code "
                     "scanning) or github (GitHub Actions annotations).")


def lint(
    paths: Optional[List[str]] = typer.Argument(None, metavar="[PATH]...",
                                                help="Files or folders to lint (default: the current folder)."),
    fmt: Optional[str] = format_option(_LINT_FORMAT_HELP, choices=LINT_FORMATS),
    output: Optional[str] = output_option("Write the output to PATH (- for standard output, the default); .json, .md "
                                          "or .sarif picks the format."),
    select: List[str] = typer.Option([], "--select", metavar="CODES",
                                     help="Only these rule codes or prefixes, comma-separated (ALL)."),
    ignore: List[str] = typer.Option([], "--ignore", metavar="CODES",
                                     help="Skip these rule codes or prefixes, comma-separated."),
    fix: bool = typer.Option(False, "--fix", help="Apply the safe fixes (atomically; re-parsed before writing)."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Also apply (or show) the unsafe fixes."),
    diff: bool = typer.Option(False, "--diff", help="Print the unified diff of the fixes instead of applying them."),
    isolated: bool = typer.Option(False, "--isolated", help="Ignore the tool.gpudoctor.lint table of pyproject.toml."),
    force_exclude: bool = typer.Option(False, "--force-exclude",
                                       help="Skip files named on the command line that the configuration's exclude "
                                            "(or the default excluded folders) leave out (for pre-commit)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", metavar="N", help="Worker processes (default: one per core)."),
    quiet: bool = quiet_option("Print only the findings (no summary line on stderr)."),
    verbose: bool = verbose_option("Also report the time taken."),
) -> None:
    """Find known GPU failure patterns in code before it runs.

    `gpudoctor explain GPU001` documents a rule; --fix applies the safe fixes."""
    from gpudoctor.lint.cli import Options, run

    if fmt is None and output is not None and output.lower().endswith(".sarif"):
        fmt = "sarif"
    # The formats of every command pick and check the output; lint's own (sarif, github) are text
    # files to it. lint.cli.run refuses an output it would read (files and folders).
    [out] = plan_outputs(Format(fmt) if fmt in FORMATS else (Format.text if fmt else None), output)
    raise typer.Exit(run(Options(paths=list(paths or ["."]), fmt=fmt if fmt and fmt not in FORMATS else out.fmt.value,
                                 output=out.path, select=select, ignore=ignore, fix=fix, unsafe_fixes=unsafe_fixes,
                                 diff=diff, isolated=isolated, force_exclude=force_exclude, jobs=jobs, quiet=quiet,
                                 verbose=verbose)))


# --- the commands, in the order `gpudoctor --help` lists them -------------------------------------

from gpudoctor.fleet.command import register as _register_fleet  # noqa: E402
from gpudoctor.ticket.command import register as _register_ticket_commands  # noqa: E402

app.command(help=command_help(scan))(scan)
app.command(help=command_help(explain))(explain)
_register_ticket_commands(app)  # run, report, diff
app.command(help=command_help(lint))(lint)
_register_fleet(app)  # merge
app.command(name="list", help=command_help(list_entries))(list_entries)


def main() -> None:
    # The console script (gpudoctor.entry) has started a scan's worker before importing this
    # module; a caller that comes straight here still gets it. Other commands import nothing.
    if sys.argv[1:2] == ["scan"]:
        from gpudoctor.scan.spawn import early_start

        early_start()
    app()
