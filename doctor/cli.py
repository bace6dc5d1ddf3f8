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


def main() -> None:
    app()
