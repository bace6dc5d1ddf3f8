"""`gpudoctor run`'s process side: run the user's command with its output passed through unchanged,
keep a bounded record of that output, forward signals, and say how the command ended.

How, and why:

- A terminal stays a terminal. When gpudoctor's stdout (stderr) is a terminal, the command's stdout
  (stderr) is the slave side of a pseudo-terminal of its own, sized like the real one and resized
  with it (SIGWINCH), so `isatty()` stays true and colours and progress bars still work; otherwise
  it is a pipe. Two ptys rather than one keep the streams apart. Output post-processing (ONLCR) is
  off on them, so the bytes relayed are exactly the bytes the command wrote.
- The command runs in a process group of its own, and gpudoctor owns the whole tree it starts
  (gpudoctor.ticket.proctree): signals are sent to the group, and when the command ends, or
  gpudoctor does, nothing it started is left running (SIGTERM, then SIGKILL after
  `KILL_GRACE_S`), not even a launcher's orphaned workers; if gpudoctor is killed with SIGKILL, a
  watchdog process kills the group. Its stdin is gpudoctor's stdin, untouched.
- The terminal. gpudoctor's group stays the terminal's foreground group, so a Ctrl-C typed there
  reaches gpudoctor, which passes it to the command's group once; when the command reads from or
  sets the terminal (a prompt, pdb, getpass), it is stopped by SIGTTIN/SIGTTOU and gpudoctor hands
  it the terminal, from then on its own to signal (Ctrl-C, Ctrl-Z) as without gpudoctor; the
  window size follows. Ctrl-Z stops the command and gpudoctor (its job), `fg` resumes both.
- Signals. SIGINT, SIGQUIT, SIGTERM and SIGHUP are forwarded to the command's group (taken with
  `sigtimedwait` where it exists, with handlers elsewhere). A second SIGINT ends the command:
  SIGTERM, then SIGKILL after `KILL_GRACE_S`; a third is SIGKILL. The command restarts with
  gpudoctor's original signal mask, and on Linux it gets SIGKILL if gpudoctor itself is killed
  (PR_SET_PDEATHSIG).
- The record. The combined output keeps its first `HEAD_BYTES` and last `TAIL_BYTES`, each stream
  its last `STREAM_TAIL_BYTES`, whatever the command prints (megabytes or gigabytes).
- When the command exits but something it started still holds its output open, gpudoctor reads
  for `DRAIN_S` more, then ends what is left of the tree.
- A broken pipe on gpudoctor's own stdout closes the command's side too, so the command gets
  SIGPIPE/EPIPE as it would have in `command | head`.

Nothing here prints; the caller is told about a first interrupt through `on_interrupt`. POSIX only.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from gpudoctor.ticket import proctree

HEAD_BYTES = 64 << 10
TAIL_BYTES = 1 << 20
STREAM_TAIL_BYTES = 256 << 10
DRAIN_S = 2.0
KILL_GRACE_S = 3.0
_POLL_S = 0.1
_READ = 64 << 10
_FORWARDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)
_WATCHED = (*_FORWARDED, signal.SIGWINCH, signal.SIGTSTP)
_TERMINAL_STOPS = (signal.SIGTTIN, signal.SIGTTOU)  # the command wants the terminal


class RunError(Exception):
    """The command could not be started. `exit_code` follows the shells: 127 not found, 126 found but
    not executable."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Record:
    """The head and the tail of a byte stream, in bounded memory."""

    def __init__(self, head: int, tail: int) -> None:
        self.head_limit, self.tail_limit = head, tail
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self.tail_limit:  # trim in batches, not on every read
                del self._tail[: len(self._tail) - self.tail_limit]

    @property
    def head(self) -> bytes:
        return bytes(self._head)

    @property
    def tail(self) -> bytes:
        return bytes(self._tail[-self.tail_limit:]) if self.tail_limit else b""

    @property
    def omitted(self) -> int:
        """Bytes between the head and the tail that were not kept."""
        return self.total - len(self._head) - len(self.tail)

    def text(self) -> str:
        """Everything kept, as text: the head, a marker where bytes were dropped, the tail."""
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if not self.omitted:
            return head + tail
        return f"{head}\n[... {self.omitted} bytes of output not kept ...]\n{tail}"


@dataclass
class RunResult:
    argv: tuple[str, ...]
    returncode: int | None  # exit code, when the command exited
    signal: int | None  # the signal that killed it, when it was killed
    duration_s: float
    output: Record  # stdout and stderr interleaved as they arrived
    stdout: Record
    stderr: Record
    tty: dict[str, bool] = field(default_factory=dict)  # {"stdout": True, ...}: given a pty
    interrupts: int = 0  # SIGINTs gpudoctor received while the command ran
    forwarded: list[str] = field(default_factory=list)  # signals sent on to the command

    @property
    def exit_status(self) -> int:
        """What a shell would report: the exit code, or 128 + the signal number."""
        if self.signal is not None:
            return 128 + self.signal
        return self.returncode if self.returncode is not None else 1

    @property
    def ok(self) -> bool:
        return self.signal is None and self.returncode == 0

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def how(self) -> str:
        if self.signal is not None:
            return f"was killed by {self.signal_name}"
        return f"exited with code {self.returncode}"


# --- signals -------------------------------------------------------------------------------------


class _Signals:
    """The signals that arrive while the command runs: blocked and taken with `sigtimedwait`, or
    recorded by handlers where it does not exist (macOS)."""

    def __init__(self) -> None:
        self.exact = hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")
        self.mask: set[signal.Signals] = set()
        self._handlers: dict[int, object] = {}
        self._pending: list[int] = []

    def __enter__(self) -> "_Signals":
        if self.exact:
            self.mask = set(signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED))
        else:
            for sig in _WATCHED:
                try:
                    self._handlers[sig] = signal.signal(sig, self._record)
                except (OSError, ValueError):  # not the main thread: leave it as it is
                    pass
        return self

    def _record(self, signum: int, _frame: object) -> None:
        self._pending.append(signum)

    def poll(self) -> list[int]:
        if self.exact:
            out = []
            while True:
                info = signal.sigtimedwait(_WATCHED, 0)
                if info is None:
                    return out
                out.append(info.si_signo)
        out, self._pending = self._pending, []
        return out

    def child_setup(self) -> Callable[[], None]:
        """What runs in the child between fork and exec: a process group of its own, the original
        signal mask, and death with us."""
        mask = self.mask
        exact = self.exact
        prctl = proctree.pdeathsig_setter()

        def setup() -> None:
            os.setpgid(0, 0)
            if exact:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if prctl is not None:
                prctl()

        return setup

    def __exit__(self, *exc: object) -> None:
        if self.exact:
            self.poll()  # what arrived after the command ended is dropped, not acted on later
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        else:
            for sig, old in self._handlers.items():
                signal.signal(sig, old)  # type: ignore[arg-type]


# --- terminals -----------------------------------------------------------------------------------


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _copy_size(source_fd: int, target_fd: int) -> None:
    try:
        import fcntl
        import termios

        size = fcntl.ioctl(source_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(target_fd, termios.TIOCSWINSZ, size)
    except (OSError, ImportError):
        pass


def _open_pty(like_fd: int) -> tuple[int, int]:
    """A pseudo-terminal (master, slave) sized like `like_fd`, with ONLCR off so the command's bytes
    arrive as written."""
    import termios

    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except termios.error:
        pass
    _copy_size(like_fd, slave)
    return master, slave


# --- relaying ------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:  # someone made the shared terminal non-blocking
            select.select([], [fd], [], _POLL_S)
            continue
        except InterruptedError:
            continue
        view = view[n:]


def _read(fd: int) -> bytes | None:
    """Up to _READ bytes; b"" at end of stream (a pty master says EIO when the slave is gone), None
    when nothing is there after all."""
    try:
        return os.read(fd, _READ)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    out_fd: int = 1,
    err_fd: int = 2,
    ptys: bool | None = None,
    on_interrupt: Callable[[int], None] | None = None,
) -> RunResult:
    """Run `argv` to its end and return what happened. `stdin` is a file descriptor or
    `subprocess.DEVNULL` (None: inherit). `ptys`: None gives a stream a pty when its target is a
    terminal, False never. `on_interrupt(n)` is called on the n-th SIGINT. Raises RunError when the
    command cannot start."""
    argv = tuple(argv)
    if not argv:
        raise RunError("no command to run", 2)
    output = Record(HEAD_BYTES, TAIL_BYTES)
    records = {"stdout": Record(0, STREAM_TAIL_BYTES), "stderr": Record(0, STREAM_TAIL_BYTES)}
    targets = {"stdout": out_fd, "stderr": err_fd}
    use_pty = {name: ptys is not False and _is_tty(fd) for name, fd in targets.items()}

    ours: dict[int, str] = {}  # our read end -> stream name
    theirs: dict[str, int] = {}
    try:
        for name in ("stdout", "stderr"):
            if use_pty[name]:
                master, slave = _open_pty(targets[name])
            else:
                master, slave = os.pipe()
            ours[master] = name
            theirs[name] = slave
    except OSError:
        for fd in (*ours, *theirs.values()):
            os.close(fd)
        raise

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    started = time.monotonic()
    subreaper = proctree.set_subreaper(True)
    try:
        with _Signals() as signals:
            try:
                proc = subprocess.Popen(
                    argv, stdin=stdin, stdout=theirs["stdout"], stderr=theirs["stderr"],
                    env=dict(env) if env is not None else None, close_fds=True,
                    preexec_fn=signals.child_setup(),
                )
            except FileNotFoundError:
                _close_all(ours, theirs)
                raise RunError(f"{argv[0]}: command not found", 127) from None
            except PermissionError:
                _close_all(ours, theirs)
                raise RunError(f"{argv[0]}: permission denied (not executable)", 126) from None
            except OSError as exc:
                _close_all(ours, theirs)
                raise RunError(f"{argv[0]}: cannot run: {exc.strerror or exc}", 126) from None
            for fd in theirs.values():
                os.close(fd)
            watchdog = proctree.Watchdog(proc.pid)
            terminal = proctree.Terminal()
            try:
                returncode, interrupts, forwarded = _supervise(
                    proc, signals, watchdog, terminal, ours, records, output, targets, use_pty, on_interrupt)
            finally:
                terminal.close()
                if proc.poll() is None:  # only if something above failed: the command too
                    _kill_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                proctree.end_tree(proc.pid, KILL_GRACE_S, exclude=(watchdog.pid,) if watchdog.pid else ())
                watchdog.stop()
                for fd in ours:
                    os.close(fd)
                ours.clear()
    finally:
        if subreaper:
            proctree.set_subreaper(False)
    duration = time.monotonic() - started
    return RunResult(
        argv=argv,
        returncode=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        duration_s=duration,
        output=output,
        stdout=records["stdout"],
        stderr=records["stderr"],
        tty=dict(use_pty),
        interrupts=interrupts,
        forwarded=forwarded,
    )


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _size(fd: int) -> bytes | None:
    try:
        import fcntl
        import termios

        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except (OSError, ImportError):
        return None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _supervise(
    proc: subprocess.Popen, signals: _Signals, watchdog: proctree.Watchdog, terminal: proctree.Terminal,
    ours: dict[int, str], records: dict[str, Record], output: Record, targets: dict[str, int],
    use_pty: dict[str, bool], on_interrupt: Callable[[int], None] | None,
) -> tuple[int, int, list[str]]:
    """Relay the command's output and the signals for it until it exits and its output ends (or
    `DRAIN_S` after it exited). Returns (returncode, SIGINTs received, signals forwarded)."""
    interrupts = 0
    forwarded: list[str] = []
    kill_at: float | None = None
    drain_until: float | None = None
    next_scan = time.monotonic() + proctree.SCAN_S
    pgid = proc.pid
    sizes = {name: _size(fd) for name, fd in targets.items() if use_pty[name]}

    def send(sig: int) -> None:
        if proc.poll() is None and _kill_group(pgid, sig) and sig != signal.SIGWINCH:
            forwarded.append(signal.Signals(sig).name)

    def suspend() -> None:
        """Ctrl-Z: the command is stopped; so is gpudoctor (the shell's job), until SIGCONT."""
        had_terminal = terminal.given is not None
        terminal.take_back()
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed (`fg` or `bg`): the terminal goes back to the command if it had it and is ours.
        if had_terminal and terminal.foreground():
            terminal.give(pgid)
        _kill_group(pgid, signal.SIGCONT)

    while True:
        if ours:
            try:
                ready, _, _ = select.select(list(ours), [], [], _POLL_S)
            except InterruptedError:
                ready = []
            for fd in ready:
                data = _read(fd)
                if data is None:
                    continue
                if not data:
                    os.close(fd)
                    del ours[fd]
                    continue
                name = ours[fd]
                output.add(data)
                records[name].add(data)
                try:
                    _write_all(targets[name], data)
                except OSError:
                    # Our reader went away (`| head`): close the command's side too, so it sees
                    # the broken pipe itself instead of blocking on a full one.
                    os.close(fd)
                    del ours[fd]
        else:
            try:
                proc.wait(_POLL_S)
            except subprocess.TimeoutExpired:
                pass

        if proc.returncode is None:
            stop = proctree.stopped_by(proc.pid)
            if stop is not None and terminal.fd is not None:
                if stop in _TERMINAL_STOPS and terminal.given is None and terminal.foreground():
                    terminal.give(pgid)  # a prompt, pdb, getpass: the terminal is the command's now
                    _kill_group(pgid, signal.SIGCONT)
                else:
                    suspend()

        for sig in signals.poll():
            if sig == signal.SIGWINCH:
                for fd, name in ours.items():
                    if use_pty[name]:
                        _copy_size(targets[name], fd)
                if any(use_pty.values()):
                    send(signal.SIGWINCH)
                continue
            if sig == signal.SIGTSTP:
                # Ctrl-Z at the terminal reached gpudoctor's group, not the command's.
                if proc.poll() is None and _kill_group(pgid, signal.SIGTSTP) and terminal.fd is not None:
                    deadline = time.monotonic() + 2.0
                    while (proc.poll() is None and time.monotonic() < deadline
                           and proctree.stopped_by(proc.pid) is None):
                        time.sleep(0.01)
                    suspend()
                continue
            if sig == signal.SIGINT:
                interrupts += 1
                if interrupts == 1:
                    send(sig)
                elif interrupts == 2:
                    send(signal.SIGTERM)
                    kill_at = time.monotonic() + KILL_GRACE_S
                else:
                    send(signal.SIGKILL)
                if on_interrupt is not None:
                    on_interrupt(interrupts)
                continue
            send(sig)

        now = time.monotonic()
        if terminal.given is not None:
            # The terminal's resizes go to the command's group now: follow them by polling.
            for fd, name in ours.items():
                if use_pty[name]:
                    size = _size(targets[name])
                    if size is not None and size != sizes.get(name):
                        sizes[name] = size
                        _copy_size(targets[name], fd)
                        send(signal.SIGWINCH)
        if now >= next_scan and proc.returncode is None:
            # Processes that left the command's group: the watchdog must know them too.
            next_scan = now + proctree.SCAN_S
            tree = proctree.descendants(os.getpid(), exclude=(watchdog.pid,) if watchdog.pid else ())
            watchdog.register(p for p in tree if p != proc.pid and _pgid(p) not in (pgid, None))
            proctree.reap((proc.pid, watchdog.pid))
        if kill_at is not None and now >= kill_at:
            send(signal.SIGKILL)
            kill_at = None
        if proc.poll() is not None:
            if not ours:
                break
            if drain_until is None:
                drain_until = now + DRAIN_S
            elif now >= drain_until:
                break
    return proc.wait(), interrupts, forwarded


def _close_all(ours: dict[int, str], theirs: dict[str, int]) -> None:
    for fd in (*ours, *theirs.values()):
        try:
            os.close(fd)
        except OSError:
            pass
