"""`gpudoctor run` owns the command's process tree: what the command starts does not outlive it.

- A process group of its own. The command calls setpgid(0, 0) before exec, so a signal meant for
  the command reaches the whole group (torchrun's workers, a shell's children), and gpudoctor's own
  group, which a shell may share with a pipeline (`gpudoctor run ... | tee log`), is never hit.
- A child subreaper (Linux, prctl PR_SET_CHILD_SUBREAPER, while the command runs): a process whose
  parent exits (a double-forking launcher, a daemon that left the group with setsid) becomes
  gpudoctor's child, not init's, so the tree stays findable (`descendants`).
- `end_tree`: once the command has exited, or gpudoctor is ending, SIGTERM to the group and to every
  other descendant, SIGKILL to what is left after a grace period, and the zombies reaped.
- `Watchdog`: for the one signal gpudoctor cannot catch. A small process (its own session, every
  catchable signal ignored) holds the read end of a pipe whose write end only gpudoctor holds; when
  gpudoctor dies, SIGKILL included, the pipe ends and the watchdog sends SIGKILL to the command's
  process group and to the processes that had left it, which gpudoctor registers as it finds them
  (with their start times, so a reused pid is never hit). The command itself also gets SIGKILL when
  gpudoctor dies (PR_SET_PDEATHSIG).
- `Terminal`: the controlling terminal while gpudoctor is in its foreground. The command's group is
  not the terminal's foreground group, so a Ctrl-C reaches gpudoctor, which forwards it; when the
  command reads from or configures the terminal (a prompt, pdb, getpass) it is stopped by SIGTTIN
  or SIGTTOU, and gpudoctor hands it the terminal (tcsetpgrp) and lets it go on; gpudoctor takes the
  terminal back when the command ends.

What is guaranteed, and what is not: on Linux, when gpudoctor ends normally or by SIGINT, SIGTERM
or SIGHUP, no process of the tree is left (group members, and every process that left the group
but stayed a descendant). When gpudoctor is killed with SIGKILL, the group and the registered
processes are killed by the watchdog; a process that left the group less than `SCAN_S` before, or
that left gpudoctor's descendants altogether (reparented to an outer subreaper: systemd --user, a
container's init), is not. Elsewhere (macOS) there is no subreaper and no PDEATHSIG: the process
group is what is ended. A cgroup would hold everything, but is not available to an unprivileged
process everywhere.

POSIX only. Nothing here prints.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable

SCAN_S = 0.5  # how often the whole tree is walked for processes that left the group
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LINUX = sys.platform.startswith("linux")


def _prctl() -> Callable[..., int] | None:
    if not _LINUX:
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (Linux); True when it is now one."""
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0


def pdeathsig_setter() -> Callable[[], None] | None:
    """For a child between fork and exec: SIGKILL when its parent dies (Linux)."""
    prctl = _prctl()
    if prctl is None:
        return None

    def set_it() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return set_it


# --- the tree -------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children (Linux /proc; [] where there is no /proc)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int, exclude: Iterable[int] = ()) -> list[int]:
    """Every process below `pid` (not `pid` itself, nor `exclude` and what is below them)."""
    skip = set(exclude)
    out: list[int] = []
    todo = [c for c in children(pid) if c not in skip]
    seen: set[int] = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo.extend(c for c in children(p) if c not in skip)
    return out


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), which tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rfind(b")") + 2:data.rfind(b")") + 3] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(exclude: Iterable[int] = ()) -> None:
    """Collect the exit status of this process's finished children (orphans it adopted as a
    subreaper), but not of `exclude` (children a Popen object will wait for)."""
    skip = set(exclude)
    for pid in children(os.getpid()):
        if pid in skip:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def end_tree(pgid: int, grace: float, exclude: Iterable[int] = ()) -> None:
    """End the command's tree: SIGTERM (and SIGCONT, for a stopped process) to its process group
    and to every other descendant of this process (but `exclude`), then, after at most `grace`
    seconds, SIGKILL to what is left; waits (bounded) until nothing of it runs."""
    skip = set(exclude) | {os.getpid()}

    def targets() -> list[int]:
        return [p for p in descendants(os.getpid(), skip) if _running(p)]

    def left() -> bool:
        reap(skip)
        return _group_exists(pgid) or bool(targets())

    if not left():
        return
    for sig in (signal.SIGTERM, signal.SIGCONT):
        _signal(pgid, sig, group=True)
        for pid in targets():
            _signal(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not left():
            return
        time.sleep(0.02)
    for _ in range(3):  # what a SIGKILLed parent's children become is known only after it died
        _signal(pgid, signal.SIGKILL, group=True)
        for pid in targets():
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and left():
            time.sleep(0.01)
        if not left():
            return


# --- the watchdog -----------------------------------------------------------------------------------

_WATCHDOG = r"""
import os, signal, sys
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
fd, pgid = int(sys.argv[1]), int(sys.argv[2])
registered, buffer = [], b""
while True:
    try:
        data = os.read(fd, 4096)
    except InterruptedError:
        continue
    except OSError:
        break
    if not data:
        break
    buffer += data
    *lines, buffer = buffer.split(b"\n")
    registered += [line.split() for line in lines if line]
def started(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rfind(b")") + 2:].split()[19]
    except (OSError, IndexError):
        return None
try:
    os.killpg(pgid, signal.SIGKILL)
except OSError:
    pass
for pid, start in registered:
    pid = int(pid)
    if started(pid) != start:
        continue  # gone, and the pid perhaps reused
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)  # a daemon's own group: its children too
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


class Watchdog:
    """Kills the command's process group (and the registered escapees) if gpudoctor dies without
    ending them itself: SIGKILL is the one signal no handler sees."""

    def __init__(self, pgid: int) -> None:
        self.proc: subprocess.Popen | None = None
        self._fd: int | None = None
        self._known: set[int] = set()
        try:
            read_end, self._fd = os.pipe()
        except OSError:
            return
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(read_end), str(pgid)],
                pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )
        except OSError:
            os.close(self._fd)
            self._fd = None
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def register(self, pids: Iterable[int]) -> None:
        """Processes that left the command's group: killed too if gpudoctor dies."""
        if self._fd is None:
            return
        lines = []
        for pid in pids:
            if pid in self._known:
                continue
            start = start_time(pid)
            if start is not None:
                self._known.add(pid)
                lines.append(f"{pid} {start}\n")
        if lines:
            try:
                os.write(self._fd, "".join(lines).encode())
            except OSError:
                pass

    def stop(self) -> None:
        """gpudoctor ended the tree itself: the watchdog goes without killing anything."""
        if self.proc is not None:
            _signal(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- the terminal --------------------------------------------------------------------------------------


class Terminal:
    """The controlling terminal, when gpudoctor's process group is its foreground group; lends it
    to the command's group when the command needs it (`give`) and takes it back (`take_back`)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.given: int | None = None
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            if os.tcgetpgrp(fd) == os.getpgrp():
                self.fd = fd
                return
        except OSError:
            pass
        os.close(fd)

    def foreground(self) -> bool:
        """Whether gpudoctor's group holds the terminal now (after a `fg`, it does again)."""
        try:
            return self.fd is not None and os.tcgetpgrp(self.fd) == os.getpgrp()
        except OSError:
            return False

    def _set(self, pgid: int) -> bool:
        # From a background group tcsetpgrp raises SIGTTOU unless it is blocked.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(self.fd, pgid)  # type: ignore[arg-type]
            return True
        except OSError:
            return False
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def give(self, pgid: int) -> None:
        if self.fd is not None and self.given is None and self._set(pgid):
            self.given = pgid

    def take_back(self) -> None:
        if self.fd is not None and self.given is not None:
            self._set(os.getpgrp())
            self.given = None

    def close(self) -> None:
        self.take_back()
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def stopped_by(pid: int) -> int | None:
    """The signal that stopped child `pid` since the last call, or None (waitid WSTOPPED: the
    exit status is left for Popen)."""
    if not hasattr(os, "waitid"):
        return None
    try:
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ECHILD, errno.EINVAL):
            return None
        raise
    if info is None or info.si_pid == 0:
        return None
    return info.si_status
