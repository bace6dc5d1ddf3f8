"""One probe worker as the runner sees it, and the signals that stop a scan: the process
supervision half of gpudoctor.scan.runner (which keeps the scheduling).

`WorkerProcess` wraps a worker started by gpudoctor.scan.spawn: it sends the configuration, reads
protocol events from the worker's stdout in bounded lines with a deadline on every wait (what a
worker says is untrusted: gpudoctor.scan.protocol checks it), keeps a bounded tail of its stderr,
and `finish` ends it together with everything it started and says how it died (exit code or
signal), without ever blocking for good. `ScanSignals` turns SIGINT, SIGTERM and SIGHUP during a
scan into `Stop`, once, so that the clean-up that kills the workers is not cut short.

Standard library only; never imports torch.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import threading
import time
from typing import Any

from gpudoctor.scan import protocol, spawn

STDERR_TAIL = protocol.TEXT_MAX  # characters of stderr kept per crashed probe
STDERR_KEEP = 64 << 10  # bytes of a worker's stderr held in memory
MAX_LINE = protocol.LINE_MAX  # a protocol line longer than this is garbage
EXIT_GRACE_S = 2.0  # how long a worker that closed its channel may take to exit (for its status)


def signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(returncode: int) -> tuple[int | None, str | None]:
    if returncode < 0:
        return None, signame(-returncode)
    return returncode, None


def ended_how(code: tuple[int | None, str | None]) -> str:
    exit_code, sig = code
    return f"was killed by {sig}" if sig else f"exited with code {exit_code}"


class WorkerProcess:
    """One worker process and its pipes. Every wait has a deadline; nothing here blocks forever.
    `doing` is what the worker last said it began ("torch", "load", "run") and has not finished:
    None means it is between steps."""

    def __init__(self, launched: spawn.Launched, config: dict[str, Any]) -> None:
        self.launched = launched
        self.proc = launched.proc
        self.marker = launched.marker
        self.selector = selectors.DefaultSelector()
        for pipe in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ)
        self._out = bytearray()
        self._err = bytearray()
        self.err_total = 0  # bytes of stderr seen, for per-probe marks
        self.doing: tuple[str, str] | None = ("start", "")
        self.doing_source = ""
        self.since = launched.started
        self.used = False
        self.hello: dict[str, Any] | None = None
        self.history: list[tuple[int, str]] = []  # (task order, probe id) run here, in order
        self.suspects: dict[int, list[str]] = {}  # task order -> threads that probe left running
        self.code: tuple[int | None, str | None] | None = None
        self.send(config)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, obj: dict[str, Any]) -> bool:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def event(self, deadline: float) -> dict[str, Any] | str:
        """The next protocol event, or "eof", "timeout", or "garbage:<text>". `begin` events
        update `doing`; the caller sees them too (they move its deadline)."""
        while True:
            nl = self._out.find(b"\n")
            if nl >= 0:
                line = bytes(self._out[:nl])
                del self._out[: nl + 1]
                return self._parse(line)
            if len(self._out) > MAX_LINE:
                return "garbage:" + self._out[:200].decode("utf-8", "replace")
            if self.proc.stdout.fileno() not in self.selector.get_map():
                return "garbage:" + self._out[:200].decode("utf-8", "replace") if self._out else "eof"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            self._pump(remaining)

    def _parse(self, line: bytes) -> dict[str, Any] | str:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            return "garbage:" + line[:200].decode("utf-8", "replace")
        if obj["event"] == "begin":
            what, key = obj.get("what"), obj.get("key", "")
            if what not in ("torch", "load", "run") or not isinstance(key, str):
                return "garbage:" + line[:200].decode("utf-8", "replace")
            self.doing, self.since = (what, key), time.monotonic()
            source = obj.get("source")
            self.doing_source = protocol.cut(source, 500) if isinstance(source, str) else key
        elif obj["event"] in ("hello", "catalog", "result", "device"):
            self.doing, self.since = None, time.monotonic()
        return obj

    def _pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(min(timeout, 60.0)):
            try:
                data = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.selector.unregister(key.fd)
            elif key.fd == self.proc.stdout.fileno():
                self._out += data
            else:
                self.err_total += len(data)
                self._err += data
                del self._err[:-STDERR_KEEP]

    def stderr_tail(self, since: int = 0) -> str:
        held = min(len(self._err), self.err_total - since)
        text = bytes(self._err[len(self._err) - held:]).decode("utf-8", "replace") if held > 0 else ""
        return text[-STDERR_TAIL:]

    def _exited(self, timeout: float) -> bool:
        """Wait up to `timeout` for the worker to exit *without reaping it*: while it is a zombie
        its pid and process group id cannot be reused, so killing the group afterwards is safe."""
        deadline = time.monotonic() + timeout
        while True:
            if hasattr(os, "waitid"):
                try:
                    if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG):
                        return True
                except ChildProcessError:
                    return True
            elif self.proc.poll() is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def finish(self, grace: float = 0.0) -> tuple[int | None, str | None]:
        """End the worker and everything it started: wait up to `grace` seconds for it to exit on
        its own (to learn how it died), then stop and kill its whole tree, reap it, drain stderr.
        Returns (exit code, signal name). Safe to call twice: the second call only reports."""
        if self.code is not None:
            return self.code
        if grace > 0:
            self._exited(grace)
        spawn.end_tree(self.proc.pid, [self.marker])
        try:
            returncode = self.proc.wait(timeout=10)
        except Exception:  # unkillable (stuck in the kernel): report it as such, do not hang
            returncode = -signal.SIGKILL
        deadline = time.monotonic() + 1.0
        try:  # a second call (after a signal cut the first short) finds the pipes closed
            while self.proc.stderr.fileno() in (self.selector.get_map() or {}) and time.monotonic() < deadline:
                self._pump(deadline - time.monotonic())
        except (OSError, ValueError, TypeError):
            pass
        self.selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
        self.code = exit_status(returncode)
        return self.code


class Stop(BaseException):
    """Raised in the main thread by SIGTERM or SIGHUP during a scan (not an Exception: no
    `except Exception` on the way may swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class ScanSignals:
    """While a scan runs in the main thread: SIGINT, SIGTERM and SIGHUP stop it (the first one; later
    ones are ignored so that the clean-up that kills the workers is not cut short)."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None or spawn.defer_signal(signum):
            return
        self.received = signum
        raise Stop(signum)

    def __enter__(self) -> "ScanSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                try:
                    self.previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):
                    pass
        return self

    def quiet(self) -> None:
        """No more interruptions: the clean-up runs to its end."""
        if self.received is None:
            self.received = 0

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self.previous.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, OSError, TypeError):
                pass
        if self.previous:
            spawn.release_signals()  # the CLI's pre-scan handlers: the scan is over
