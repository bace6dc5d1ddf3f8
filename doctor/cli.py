"""The command line: parses options, calls one library function, picks a renderer, sets the exit
code. Nothing else lives here. The CLI process never imports torch.

Exit codes (documented in the README):
  0  success: something was matched / shown, or every probe passed or skipped
  1  findings: the text matched nothing known (explain), or a probe failed or crashed (scan)
  2  usage or input error, or gpudoctor itself could not run
"""
from __future__ import annotations

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


# --- scan ----------------------------------------------------------------------------------------


def main() -> None:
    app()
