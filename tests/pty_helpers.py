"""Running gpudoctor with its standard output on a pseudo-terminal of a given size, as a user's
terminal is: what it wrote (escape sequences and all) and its exit code."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import pytest


def on_a_pty(args: list[str], columns: int = 80, env: dict[str, str] | None = None) -> tuple[str, int]:
    """`python -m gpudoctor ARGS` with stdin and stdout on a `columns`-wide pty (TERM
    xterm-256color; COLUMNS, LINES, NO_COLOR and FORCE_COLOR removed unless `env` sets them);
    stderr goes to a pipe. Returns the raw text it wrote and its exit code."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    full["TERM"] = "xterm-256color"
    full.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", *args], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, env=full, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            pytest.fail(f"gpudoctor {' '.join(args[:2])} wrote nothing for 120 s")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.stderr.read()
    code = proc.wait(60)
    return b"".join(chunks).decode("utf-8", "replace"), code
