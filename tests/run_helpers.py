"""Helpers for the `gpudoctor run` tests: the CLI as a subprocess, and the CLI on a pseudo-terminal
that is its controlling terminal (so a Ctrl-C written to the master is a real terminal interrupt,
delivered by the kernel to the foreground process group). Every wait has a deadline."""
from __future__ import annotations

import fcntl
import importlib.util
import os
import pathlib
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="the script raises a real torch error; torch is not installed here")
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "run"
GPUDOCTOR = [sys.executable, "-m", "gpudoctor"]
DEADLINE_S = 120.0


def script(name: str) -> str:
    return str(FIXTURES / name)


def gpudoctor(*args: str, input: bytes | None = None, env: dict | None = None, cwd: str | None = None,
              timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([*GPUDOCTOR, *args], input=input, capture_output=True, env=full_env, cwd=cwd,
                          timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtySession:
    """`argv` on a new pseudo-terminal that is its controlling terminal (stdin, stdout, stderr)."""

    def __init__(self, argv: list[str], cols: int = 80, rows: int = 24, env: dict | None = None) -> None:
        self.master, slave = os.openpty()
        set_size(slave, cols, rows)

        def become_session_leader() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("TERM", "xterm")
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=full_env,
                                     preexec_fn=become_session_leader, close_fds=True)
        os.close(slave)
        self.buffer = b""

    def _pump(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every slave is closed
            return False
        if not data:
            return False
        self.buffer += data
        return True

    def wait_for(self, marker: bytes, timeout: float = DEADLINE_S) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            if time.monotonic() > deadline:
                raise AssertionError(f"{marker!r} did not appear; got {self.buffer[-2000:]!r}")
            if not self._pump(0.1) and marker not in self.buffer:
                raise AssertionError(f"{marker!r} did not appear before the end; got {self.buffer[-2000:]!r}")
        return self.buffer

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout: float = DEADLINE_S) -> tuple[int, str]:
        """Exit status and everything the terminal showed (CRLF as LF)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._pump(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not finish in {timeout} s; got {self.buffer[-2000:]!r}")
        while self._pump(0.05) and time.monotonic() < deadline:
            pass
        os.close(self.master)
        return self.proc.returncode, self.buffer.decode("utf-8", "replace").replace("\r\n", "\n")


def descendants_alive(pid: int) -> list[int]:
    """Processes whose parent chain leads to `pid` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], {pid}
    while frontier:
        nxt = {p for p, parent in parents.items() if parent in frontier}
        out.extend(nxt)
        frontier = nxt
    return out
