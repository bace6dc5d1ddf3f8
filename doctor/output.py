"""The output convention every command follows, implemented once (docs/conventions.md):

- `--format text|json|md` picks the format (`format_option`); `-o/--output PATH` writes it to a
  file, `-` (the default) to standard output; a path ending in .json or .md picks that format
  when `--format` is not given (`plan_outputs`).
- Outputs are checked before any work (`check_output`): an empty path, a directory, a missing
  folder, /proc or /sys, /dev/full, a closed standard output, and a symbolic link are refused. A
  link to a device or a FIFO (/dev/stdout, /dev/null, /dev/fd/N) is written through; a link to a
  file is never followed: in a shared sticky directory (/tmp) a planted link would otherwise
  redirect the report onto someone else's file.
- Files are written whole or not at all (`write_file`: a temporary file in the same folder, then a
  rename that replaces the path itself, never a link's target); a FIFO or a terminal device is
  written through.
- Standard output (`emit`, `emit_text`, `emit_line`): a rich Console for text (colour only on a
  terminal), the finished text for JSON and Markdown, `gpudoctor: <verdict>` for -q. A closed pipe
  (`| head`) raises `ClosedPipe`, which the CLI turns into a quiet exit 141 (128 + SIGPIPE), as a
  shell reports for a tool killed by it.
- Colour (`--color auto|always|never`, on every command: `color_param`): `auto` (the default) colours
  a terminal unless `NO_COLOR` is set; `never`, and `NO_COLOR` under auto, write no escape sequence
  at all (no colour, no bold or dim either); `always` colours a pipe or a file too (`less -R`).
  Every console gpudoctor opens takes its settings from `console_options`.
- gpudoctor's own messages (`say`, `fail`): one `gpudoctor: ...` line on stderr, through safetext,
  and for `fail` the exit code (`EXIT_USAGE` unless told); `progress_line`: a probe's result as
  every scanning command shows it.

Every refusal and failed write raises `OutputError` with one line for the user; the CLI
(`gpudoctor.cli._Group.main`) prints it as `gpudoctor: ...` and exits 2, for every command alike.
Nothing here imports rich or typer until it is used.
"""
from __future__ import annotations

import errno
import functools
import os
import sys
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, NoReturn, Optional, Sequence

# Exit codes, the same for every command (docs/conventions.md).
EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool that a closed pipe ended

TEXT_FILE_WIDTH = 100  # the terminal report written to a file

FORMAT_HELP = "Output format: text (for people), json, or md (Markdown)."
OUTPUT_HELP = "Write the output to PATH (- for standard output, the default); .json or .md picks the format."


def say(message: str) -> None:
    """One line of gpudoctor's own on stderr. Messages quote what the user typed or what an input
    held (a path, a value, another rank's error): shown through safetext, never as raw escape
    sequences. Flushed at once: `gpudoctor run` shares stderr with the command it runs."""
    from gpudoctor.safetext import visible

    try:
        sys.stderr.write(f"gpudoctor: {visible(message, 2000)}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One clear line on stderr (`say`) and the exit code; never a traceback."""
    import typer

    say(message)
    raise typer.Exit(code)


class OutputError(Exception):
    """An output cannot be used or could not be written: str(exc) is one line; exit 2."""


class ClosedPipe(Exception):
    """Standard output's reader went away (`gpudoctor list | head -1`): exit 141, without a word."""


class Format(str, Enum):
    text = "text"
    json = "json"
    md = "md"


FORMATS = tuple(f.value for f in Format)
_SUFFIX_FORMAT = {".json": Format.json, ".md": Format.md, ".markdown": Format.md}
_DEV_FULL = (1, 7)  # Linux's /dev/full: major 1, minor 7


# --- the options that ask for outputs, the same on every command ----------------------------------

OUTPUT_METAVAR = "PATH"
NO_REDACT_HELP = "Do not redact: keep user names, host names, tokens, paths and hardware ids."


def output_option(help: str = OUTPUT_HELP) -> Any:
    import typer

    return typer.Option(None, "--output", "-o", metavar=OUTPUT_METAVAR, help=help, show_default=False)


def quiet_option(help: str) -> Any:
    import typer

    return typer.Option(False, "--quiet", "-q", help=help)


def verbose_option(help: str) -> Any:
    import typer

    return typer.Option(False, "--verbose", "-v", help=help)


def no_redact_option(help: str = NO_REDACT_HELP) -> Any:
    import typer

    return typer.Option(False, "--no-redact", help=help)


def command_help(function: Any) -> str:
    """A command's docstring as its help: paragraphs reflowed into single lines (typer keeps line
    breaks inside a paragraph and would print the source's wrapping at any terminal width)."""
    import inspect

    paragraphs = inspect.cleandoc(function.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def format_option(help: str = FORMAT_HELP, choices: tuple[str, ...] = FORMATS) -> Any:
    """The `--format` option, the same for every command: its choices, its metavar, its shell
    completion, and its usage error (`--format xml: expected one of text, json, md`). A command
    with formats of its own beyond these (`lint --format sarif`) passes its `choices` and is
    annotated `Optional[str]`."""
    import typer

    return typer.Option(None, "--format", click_type=_format_type(choices), help=help, show_default=False)


@functools.lru_cache(maxsize=None)
def _format_type(choices: tuple[str, ...] = FORMATS) -> Any:
    try:  # typer >= 0.20 vendors click as typer._click; older typers use click itself
        from typer._click import types
        from typer._click.shell_completion import CompletionItem
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import types  # type: ignore[no-redef]
        from click.shell_completion import CompletionItem  # type: ignore[no-redef]

    class FormatChoice(types.ParamType):
        """text|json|md (or the command's `choices`), with one message for a wrong value whatever
        click or typer version."""

        name = "format"

        def get_metavar(self, param: Any, ctx: Any = None) -> str:
            return "[" + "|".join(choices) + "]"

        def convert(self, value: Any, param: Any, ctx: Any) -> Any:
            text = value.value if isinstance(value, Format) else str(value)
            if text in choices:
                return text  # typer turns it into the Format the command is annotated with
            self.fail(f"{text}: expected one of {', '.join(choices)}", param, ctx)

        def shell_complete(self, ctx: Any, param: Any, incomplete: str) -> list:
            return [CompletionItem(f) for f in choices if f.startswith(incomplete)]

    return FormatChoice()


@dataclass(frozen=True)
class Output:
    """One requested output: its format, where it goes ("-": standard output), and the option
    that asked for it (for messages)."""

    fmt: Format
    path: str
    option: str

    @property
    def to_stdout(self) -> bool:
        return self.path == "-"


def _is_dev_full(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == _DEV_FULL


def _check_stdout() -> None:
    if sys.stdout is None:
        raise OutputError("standard output is closed; give a file with -o PATH")
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # a captured stream (tests): nothing to check
        return
    try:
        st = os.fstat(fd)
    except OSError:
        raise OutputError("standard output is closed; give a file with -o PATH") from None
    if _is_dev_full(st):
        raise OutputError("standard output is /dev/full, where every write fails; give a file with -o PATH")


def check_output(option: str, path: str) -> None:
    """Refuse, before any work, an output that cannot or must not be written (module docstring):
    raises OutputError with one line."""
    import stat

    if path == "":
        raise OutputError(f"{option}: the path is empty")
    if path == "-":
        _check_stdout()
        return
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        link = None
    except OSError as exc:
        raise OutputError(f"{option} {path}: {exc.strerror}") from None
    target = None
    if link is not None:
        try:
            target = os.stat(path)
        except OSError:
            target = None  # a dangling link
    if link is not None and stat.S_ISLNK(link.st_mode):
        # A link to a device or a FIFO (/dev/stdout, /dev/null, /dev/fd/N) is written through:
        # nothing gets replaced. A link to a file is refused, never followed.
        if target is None or not (stat.S_ISCHR(target.st_mode) or stat.S_ISFIFO(target.st_mode)):
            to = os.readlink(path)
            raise OutputError(f"{option} {path}: is a symbolic link (to {to}); gpudoctor does not write "
                              "through links: give the real path")
    if target is not None:
        if stat.S_ISDIR(target.st_mode):
            raise OutputError(f"{option} {path}: is a directory")
        if _is_dev_full(target):
            raise OutputError(f"{option} {path}: is /dev/full, where every write fails")
        if stat.S_ISCHR(target.st_mode) or stat.S_ISFIFO(target.st_mode):
            return
        if not stat.S_ISREG(target.st_mode):
            raise OutputError(f"{option} {path}: is not a regular file")
    real = os.path.realpath(path)
    for kernel in ("/proc", "/sys"):
        if real == kernel or real.startswith(kernel + "/"):
            raise OutputError(f"{option} {path}: is in {kernel}, a kernel interface, not a place for a report")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{option} {path}: no such directory {parent}")
    if target is not None and not os.access(path, os.W_OK):
        raise OutputError(f"{option} {path}: permission denied")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot create files in {parent} (permission denied)")


def std_name(path: str) -> str:
    """Standard output under its other names is standard output."""
    return "-" if path in ("/dev/stdout", "/proc/self/fd/1", "/dev/fd/1") else path


def plan_outputs(fmt: Optional[Format], output: Optional[str],
                 aliases: Sequence[tuple[Format, Optional[str], str]] = (),
                 inputs: Sequence[str] = ()) -> list[Output]:
    """The outputs a command writes, checked: `--format`/`-o`, plus the old alias options (format,
    path, option name). The text report on standard output is dropped when an alias takes
    standard output and neither `--format` nor `-o` was given. The first output is the one
    `--format`/`-o` asked for (or the default: text on standard output). `inputs` are the files
    the command reads: an output that is one of them is refused (`check_not_input`)."""
    outputs: list[Output] = []
    for alias_fmt, path, option in aliases:
        if path is not None:
            outputs.append(Output(alias_fmt, std_name(path), option))
    if fmt is not None or output is not None or not any(o.to_stdout for o in outputs):
        path = std_name(output if output is not None else "-")
        chosen = fmt or (_SUFFIX_FORMAT.get(os.path.splitext(path)[1].lower(), Format.text) if path != "-" else Format.text)
        outputs.insert(0, Output(Format(chosen), path, "-o" if output is not None else "--format"))
    stdout = [o for o in outputs if o.to_stdout]
    if len(stdout) > 1:
        raise OutputError(f"{stdout[0].option} and {stdout[1].option} both write to standard output; "
                          "give one of them a file")
    seen: dict[str, str] = {}
    for o in outputs:
        if o.to_stdout:
            continue
        key = os.path.abspath(o.path)
        if key in seen:
            raise OutputError(f"{seen[key]} and {o.option} both write to {o.path}")
        seen[key] = o.option
    for o in outputs:
        check_output(o.option, o.path)
        check_not_input(o, inputs)
    return outputs


def check_not_input(output: Output, inputs: Sequence[str]) -> None:
    """gpudoctor never modifies its input files: `explain -f train.log -o train.log` would replace
    the log with its explanation. An output that is the same file as an input (by device and
    inode, so another spelling of the path or a hard link counts) is refused. Devices and FIFOs
    (/dev/null) are never inputs worth protecting."""
    import stat

    if output.to_stdout:
        return
    try:
        out = os.stat(output.path)
    except OSError:
        return  # a new file cannot be an input
    if not stat.S_ISREG(out.st_mode):
        return
    for path in inputs:
        if not path or path == "-":
            continue
        try:
            src = os.stat(path)
        except OSError:
            continue
        if (src.st_dev, src.st_ino) == (out.st_dev, out.st_ino):
            raise OutputError(f"{output.option} {output.path}: is also an input ({path}); gpudoctor never "
                              "overwrites what it reads: give another path")


def write_file(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all. A regular file is replaced by renaming a
    temporary file from the same folder over it: readers never see half a report, a failed write
    leaves the old file as it was, and the rename replaces the path itself, never what a link
    (planted after `check_output`) points to. A FIFO or a device is written through."""
    import stat
    import tempfile

    try:
        st = os.stat(path)
    except OSError:
        st = None
    try:
        if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            return
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; nothing was written") from None
    try:
        if st is not None and stat.S_ISREG(st.st_mode) and not os.path.islink(path):
            mode = stat.S_IMODE(st.st_mode)  # keep the old file's permissions
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # mkstemp's 0600 would make a shared report unreadable
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; the old file, if any, is unchanged") from None


# --- colour: --color auto|always|never, the same on every command ----------------------------------

COLORS = ("auto", "always", "never")
COLOR_HELP = "Colour: auto (a terminal, unless NO_COLOR is set), always, or never (no escape sequences at all)."
_color = {"mode": "auto"}


def set_color(mode: str) -> None:
    """The colour mode for every console opened from now on (`--color`)."""
    _color["mode"] = mode if mode in COLORS else "auto"


def console_options(stream: Any = None) -> dict[str, Any]:
    """rich Console settings for the colour mode. `never`, or `NO_COLOR` (any non-empty value) under
    `auto`: no colour system, so no escape sequence at all (rich's own NO_COLOR handling drops
    colours but keeps bold and dim). `always`: a terminal's colours on any stream, though a stream
    that is not a terminal stays non-interactive (no animated progress in a log)."""
    mode = _color["mode"]
    if mode == "never" or (mode == "auto" and os.environ.get("NO_COLOR")):
        return {"color_system": None, "no_color": True}
    if mode == "always":
        try:
            interactive = bool(stream is not None and stream.isatty())
        except (ValueError, OSError, AttributeError):
            interactive = False
        return {"force_terminal": True, "force_interactive": interactive}
    return {}


def color_param() -> Any:
    """The `--color` option, as a click parameter that a command does not receive (it sets the mode
    for the consoles it opens): gpudoctor.cli adds it to every command and to the group."""
    import typer.core

    def remember(ctx: Any, param: Any, value: Any) -> Any:
        if value is not None and not getattr(ctx, "resilient_parsing", False):
            set_color(str(value))
        return value

    return typer.core.TyperOption(param_decls=["--color"], type=_format_type(COLORS), default=None,
                                  callback=remember, expose_value=False,
                                  is_eager=True, help=COLOR_HELP)


def stdout_console(**options: Any) -> Any:
    """A rich Console on standard output whose closed pipe is ours to report (rich's own
    on_broken_pipe exits 1), coloured as `--color` and NO_COLOR say."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise ClosedPipe()

    options.setdefault("highlight", False)
    for key, value in console_options(sys.stdout).items():
        options.setdefault(key, value)
    return StdoutConsole(**options)


def stderr_console(**options: Any) -> Any:
    """A rich Console on standard error (progress, a run's explanation), coloured as `--color` and
    NO_COLOR say."""
    from rich.console import Console

    options.setdefault("highlight", False)
    for key, value in console_options(sys.stderr).items():
        options.setdefault(key, value)
    return Console(stderr=True, **options)


def file_console(file: Any) -> Any:
    """The Console a text report is rendered on for a file: fixed width, no colour."""
    from rich.console import Console

    return Console(file=file, width=TEXT_FILE_WIDTH, color_system=None, highlight=False, soft_wrap=False,
                   force_terminal=False)


def emit(output: Output, render: Callable[[Any], None]) -> None:
    """Run `render(console)` with a console on standard output, or on a buffer that is then
    written to `output.path` (`write_file`)."""
    if output.to_stdout:
        try:
            render(stdout_console())
            sys.stdout.flush()
        except BrokenPipeError:
            raise ClosedPipe() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise ClosedPipe() from None
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None
        return
    write_file(output.path, render_to_text(render))


def text_renderer(text: str) -> Callable[[Any], None]:
    """A renderer that prints finished text (JSON, Markdown) as it is."""

    def render(console: Any) -> None:
        console.file.write(text)

    return render


def emit_text(output: Output, text: str) -> None:
    """Finished text (JSON, Markdown, a diff) to `output`. JSON passes `safetext.json_text`: the
    controls and bidi characters JSON itself leaves raw are written as \\u escapes."""
    if output.fmt is Format.json:
        from gpudoctor.safetext import json_text

        text = json_text(text)
    emit(output, text_renderer(text))


def emit_line(output: Output, line: str) -> None:
    """The one-line verdict of -q, `gpudoctor: <line>`, to `output`: printed as text (a verdict can
    quote a report's summary), never as markup or emoji codes."""
    from gpudoctor.safetext import as_text

    emit(output, lambda console: console.print(as_text(f"gpudoctor: {line}"), highlight=False, soft_wrap=True))


def progress_line(event: Any) -> str:
    """A probe's result as the line a scan's progress prints for it, in every command that scans
    (`scan` off a terminal, `run --bundle`, `scan --distributed`):
    `[3/12] sdpa-backends on cuda:0: pass (0.25s)`. `event` is a runner progress event of kind
    "result"; probe and device ids are shown through safetext."""
    from gpudoctor.safetext import visible

    result = event.result
    device = result.device or getattr(event, "device", None)
    where = f" on {visible(device, 100)}" if device else ""
    return (f"[{event.index}/{event.total}] {visible(event.probe, 100)}{where}: "
            f"{result.status.value} ({result.duration_s:.2f}s)")


def render_to_text(render: Callable[[Any], None]) -> str:
    """What `render(console)` prints on a file's console, as a string."""
    import io

    buffer = io.StringIO()
    render(file_console(buffer))
    return buffer.getvalue()
