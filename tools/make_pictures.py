"""The documentation's pictures of the terminal, made by gpudoctor itself: each runs a real
command through the CLI (`gpudoctor report FILE`, `gpudoctor explain -f FILE`) onto a recording
rich Console and saves what it printed as SVG, rich's own export. A run's diagnosis is shown from
the record a real `gpudoctor run -o run.json` wrote (docs/examples/), through the renderer `run`
prints it with, so that the picture needs neither torch nor the run.

    python tools/make_pictures.py           # rewrite docs/pictures/*.svg
    python tools/make_pictures.py --check   # exit 1 and name the pictures that are stale
    python tools/make_pictures.py --scan    # first scan this machine again (quick level, the CPU
                                            # example report), then rewrite the pictures

The CPU picture shows a real quick scan of a machine without a GPU, made by `--scan`
(`cpu_scan`): the interpreter of this environment, reached through `~/proj/.venv` in a temporary
home so that the report reads as a user's would, redacted as shipped. tests/test_pictures.py checks
that it is a report of the current schema at the quick level, and (where torch 2.13.0 runs on the
CPU) that a fresh scan gives every probe the same verdict. The H100 picture shows the committed
H100 report of the validation page; only a machine with an H100 can make another (a GPU session:
`docs/validation/run-on-gpu.sh scan`), never this script.

The SVGs are self-contained: rich's export loads Fira Code from a CDN, which is dropped here
(`offline`) for the fonts of the reader's machine, so the pictures render the same offline.

tests/test_pictures.py renders every picture again and compares it with the committed file, so a
change to a renderer, a probe summary or a knowledge-base entry that a picture shows fails the
suite until this script is run. The rendering is deterministic: a fixed width and title, colour
forced on, no clock, and redaction run as for a fixed user (`alice` on `gpu-box-17`, home
/home/alice) with an environment that holds nothing of the machine that makes the picture.
"""
from __future__ import annotations

import contextlib
import io
import os
import pathlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator
from unittest import mock

if TYPE_CHECKING:
    from rich.console import Console

ROOT = pathlib.Path(__file__).resolve().parents[1]
PICTURES = ROOT / "docs" / "pictures"
WIDTH = 100  # columns: wide enough for a summary column, narrow enough to read in a README


@dataclass(frozen=True)
class Picture:
    name: str  # the file in docs/pictures/
    args: tuple[str, ...]  # gpudoctor's arguments; paths relative to the repository root (or `cwd`)
    alt: str  # what the picture shows, for the page that embeds it
    cwd: str = ""  # where the command runs, relative to the repository root
    record: str = ""  # a run record (`gpudoctor run -o`) to show as `run` printed it; `args` are its command

    @property
    def title(self) -> str:
        return "gpudoctor " + " ".join(self.args)


PICTURES_MADE = (
    Picture("scan-h100.svg", ("report", "docs/validation/h100-torch2.11.0.json"),
            "gpudoctor's page for a healthy H100 (torch 2.11.0+cu130): every probe passes"),
    Picture("scan-cpu.svg", ("report", "docs/examples/cpu-only-torch2.13.0.json"),
            "gpudoctor's page for a machine without a GPU (torch 2.13.0+cpu): healthy, one warning"),
    Picture("explain.svg", ("explain", "-f", "docs/examples/misaligned-address.txt"),
            "gpudoctor explain naming a pasted CUDA misaligned-address error, its cause and its fix"),
    Picture("explain-patch.svg", ("explain", "-f", "traceback.txt"),
            "gpudoctor explain reading a traceback whose files are on this machine: the patch for the user's own file, "
            "with the line it changes and the command that applies it",
            cwd="tests/fixtures/patch/multitalk"),
    Picture("run-patch.svg", ("run", "--", "python", "train.py"),
            "gpudoctor run on a failing training script: the dtype mismatch, the diff of the module that creates the "
            "float32 layers, and the lint command that applies it",
            record="docs/examples/run-dtype-mismatch.json"),
)

# The identity redaction runs as: a report or a pasted text is redacted the same on every machine.
_ENVIRON = {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "LANG": "C.UTF-8", "TERM": "xterm-256color"}


@contextlib.contextmanager
def _fixed_machine(where: str = "") -> Iterator[None]:
    from gpudoctor.reports import redact

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, _ENVIRON, clear=True))
        stack.enter_context(mock.patch.object(redact, "_home", lambda: "/home/alice"))
        stack.enter_context(mock.patch.object(redact, "_user", lambda: "alice"))
        stack.enter_context(mock.patch.object(redact, "_host", lambda: "gpu-box-17"))
        stack.enter_context(mock.patch.object(redact, "_machine_id", lambda: ""))
        cwd = os.getcwd()
        os.chdir(ROOT / where)  # the arguments' paths are the repository's, from any checkout
        try:
            yield
        finally:
            os.chdir(cwd)


def render(picture: Picture) -> str:
    """The SVG of what `gpudoctor <args>` prints on a WIDTH-column colour terminal."""
    from rich.console import Console

    import typer.main

    from gpudoctor import output
    from gpudoctor.cli import app

    stderr = io.StringIO()
    # Consoles are made inside the fixed environment too: COLUMNS, NO_COLOR and friends of the
    # machine that makes the picture never reach them.
    with _fixed_machine(picture.cwd), contextlib.redirect_stderr(stderr):
        console = Console(record=True, file=io.StringIO(), width=WIDTH, height=50, force_terminal=True,
                          color_system="truecolor", no_color=False, highlight=False, legacy_windows=False,
                          emoji=False)
        if picture.record:
            import json

            from gpudoctor.ticket import render as ticket_render

            ticket_render.render_text(json.loads((ROOT / picture.record).read_text(encoding="utf-8")), console)
            code = 0
        else:
            code = None
        with mock.patch.object(output, "stdout_console", lambda **_: console):
            if code is None:
                code = typer.main.get_command(app).main(args=list(picture.args), standalone_mode=False)
        if code not in (0, 1):
            raise SystemExit(f"make_pictures: `{picture.title}` exited {code}: {stderr.getvalue().strip()}")
        svg = offline(as_a_terminal_shows_it(console).export_svg(title=picture.title))
    return f"<!-- made by tools/make_pictures.py (rich {_rich_version()}): {picture.title} -->\n{svg}"


# Local monospace fonts, best first: what the reader's machine has stands in for the CDN's Fira Code.
_MONOSPACE = '"Fira Code", "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace'


def offline(svg: str) -> str:
    """rich's SVG without its @font-face rules, which fetch Fira Code from a CDN: the picture uses
    the reader's own monospace fonts and loads nothing."""
    import re

    svg = re.sub(r"\n?[ \t]*@font-face \{[^}]*\}", "", svg)
    return re.sub(r"font-family: Fira Code, monospace;", f"font-family: {_MONOSPACE};", svg)


CPU_EXAMPLE = "docs/examples/cpu-only-torch2.13.0.json"


def cpu_scan(out: str = CPU_EXAMPLE, python: str | None = None) -> None:
    """A real quick scan of this machine, written to `out` (relative to the repository) as a user's
    report reads: the target interpreter reached as ~/proj/.venv/bin/python (a link to this
    environment in a temporary home), redacted as shipped."""
    import subprocess
    import tempfile

    prefix = pathlib.Path(python or sys.executable).parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        home = pathlib.Path(tmp) / "alice"
        (home / "proj").mkdir(parents=True)
        (home / "proj" / ".venv").symlink_to(prefix, target_is_directory=True)
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "VIRTUAL_ENV")}
        env.update(HOME=str(home), USER="alice", LOGNAME="alice")
        command = [sys.executable, "-m", "gpudoctor", "scan", "--python", "~/proj/.venv/bin/python",
                   "--format", "json", "-o", out]
        argv = [str(home / "proj" / ".venv" / "bin" / "python") if a == "~/proj/.venv/bin/python" else a
                for a in command]
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"make_pictures: the scan exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")


def as_a_terminal_shows_it(recorded: "Console") -> "Console":
    """A console holding what `recorded` printed with every line longer than the width wrapped at
    the width, as a terminal wraps it. gpudoctor prints ids, commands and patches whole
    (soft_wrap) and leaves the wrapping to the terminal; rich's SVG export would crop them."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.text import Text

    out = Console(record=True, file=io.StringIO(), width=recorded.width, force_terminal=True,
                  color_system="truecolor", no_color=False, highlight=False, emoji=False)
    segments = [s for s in recorded._record_buffer if not s.control]
    for line in Segment.split_lines(segments):
        text = Text.assemble(*((s.text, s.style) for s in line))
        text.rstrip()
        cuts = list(range(recorded.width, len(text), recorded.width))
        for part in text.divide(cuts) if cuts else [text]:
            out.print(part, no_wrap=True, overflow="ignore", crop=False, soft_wrap=False)
    return out


def _rich_version() -> str:
    from importlib.metadata import version

    return version("rich")


def rich_version_of(svg: str) -> str | None:
    """The rich version a committed picture was made with (its first line says)."""
    head = svg.split("\n", 1)[0]
    if "(rich " not in head:
        return None
    return head.split("(rich ", 1)[1].split(")", 1)[0]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    if "--scan" in argv and not check:
        cpu_scan()
        print(f"make_pictures: scanned this machine into {CPU_EXAMPLE}")
    PICTURES.mkdir(parents=True, exist_ok=True)
    stale = []
    for picture in PICTURES_MADE:
        path = PICTURES / picture.name
        svg = render(picture)
        if path.exists() and path.read_text(encoding="utf-8") == svg:
            continue
        stale.append(picture.name)
        if not check:
            path.write_text(svg, encoding="utf-8")
            print(f"make_pictures: wrote docs/pictures/{picture.name} ({picture.title})")
    if check and stale:
        print(f"make_pictures: stale: {', '.join(stale)}; run python tools/make_pictures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
