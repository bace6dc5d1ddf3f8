"""The console script's entry point (`gpudoctor`, and `python -m gpudoctor`).

A scan's first worker imports torch, which takes most of a CPU scan's time. Started here, before
this process imports typer, rich and the CLI (~0.2 s), the two imports overlap. Only `scan`
reaches `gpudoctor.scan.spawn`: every other command (`explain` above all, whose start-up is measured)
pays one list look-up here and starts nothing. Standard library only.
"""
from __future__ import annotations

import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "scan":
        from gpudoctor.scan.spawn import early_start

        early_start()
    from gpudoctor.cli import main as cli_main

    cli_main()
