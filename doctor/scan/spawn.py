"""Starting and ending probe workers: the bootstrap, the CLI's early start, and killing a worker
together with everything it started.

A worker is `python -c BOOTSTRAP ...` in the target interpreter. On Linux every worker
  * is the leader of its own session and process group;
  * sets PR_SET_PDEATHSIG (SIGKILL): it dies with the gpudoctor process, even one killed by SIGKILL;
  * sets PR_SET_CHILD_SUBREAPER: what a probe double-forks or `setsid`s away is re-parented to the
    worker rather than to init, so it stays the worker's descendant;
  * carries a unique `GPUDOCTOR_WORKER=<marker>` in its environment, which its descendants inherit.
`end_tree` stops (SIGSTOP) the worker's descendants, its process group and every process carrying
its marker, repeats until no new one appears, then kills them all: a probe's children cannot outlive
the scan by forking faster than they are killed. Where /proc is missing, the process group is all.
Every process started here is remembered until it is ended, so `end_all` can end what a signal
interrupted half-way.

A signal that arrives while a process is being started is held back until the start is complete
(`signals_deferred`): otherwise the handler would run before the new process is known and could not
end it.

`early_start` is the console script's first call (`gpudoctor.entry`, for `scan` only): it starts the
first worker (which imports torch at once) before the CLI imports typer, rich and the runner, so a
scan costs little more than `import torch`. Standard library only, and cheap to import.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence  # not typing: 2 ms the console script need not pay

MARKER_VAR = "GPUDOCTOR_WORKER"
PARENT_VAR = "GPUDOCTOR_PARENT"
NO_EARLY_START_VAR = "GPUDOCTOR_NO_EARLY_START"

# Runs in the target interpreter as `python -c BOOTSTRAP name=dir ... [--torch=full|light]`. Ties the
# worker's life to the gpudoctor process (prctl, Linux), drops the cwd from sys.path (a user's
# `torch.py` must not shadow torch), registers our packages from their directories (they are not
# installed there), then hands over to the worker.
BOOTSTRAP = """\
import os, sys, importlib.util as u
try:
    import ctypes
    _c = ctypes.CDLL(None, use_errno=True)
    _c.prctl(1, 9, 0, 0, 0)
    _c.prctl(36, 1, 0, 0, 0)
    if str(os.getppid()) != os.environ.get('GPUDOCTOR_PARENT', str(os.getppid())):
        os._exit(70)
except Exception:
    pass
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
for a in sys.argv[1:]:
    if a.startswith('--'):
        continue
    n, _, d = a.partition('=')
    s = u.spec_from_file_location(n, d + '/__init__.py', submodule_search_locations=[d])
    m = u.module_from_spec(s)
    sys.modules[n] = m
    s.loader.exec_module(m)
    p, _, c = n.rpartition('.')
    if p:
        setattr(sys.modules[p], c, m)
import gpudoctor.scan.worker
gpudoctor.scan.worker.main([a for a in sys.argv[1:] if a.startswith('--')])
"""


def new_marker() -> str:
    return f"{os.getpid()}-{os.urandom(6).hex()}"  # not secrets: it imports hashlib (5 ms)


# --- what is running, and signals held back while a process starts ------------------------------

_lock = threading.Lock()
_live: set[str] = set()  # markers of processes started and not yet ended
_deferring = 0  # > 0 while the main thread starts a process
_pending: list[int] = []


def _remember(marker: str) -> None:
    with _lock:
        _live.add(marker)


def _forget(markers: Collection[str]) -> None:
    with _lock:
        _live.difference_update(markers)


def live_markers() -> list[str]:
    with _lock:
        return sorted(_live)


def defer_signal(signum: int) -> bool:
    """Called first by a stop handler: True when a process is being started, in which case the
    signal is held and delivered again as soon as the start is complete."""
    if _deferring and threading.current_thread() is threading.main_thread():
        _pending.append(signum)
        return True
    return False


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending:
            signum = _pending[0]
            _pending.clear()
            os.kill(os.getpid(), signum)  # now the handler can end what was started


class Launched:
    """A started worker process, before the runner wraps it. (A plain class: `dataclasses` costs
    the console script ~8 ms before it can start the first worker.)"""

    __slots__ = ("proc", "python", "marker", "torch", "started")

    def __init__(self, proc: subprocess.Popen, python: str, marker: str, torch: str,
                 started: float | None = None) -> None:
        self.proc = proc
        self.python = python
        self.marker = marker
        self.torch = torch  # "full", "light" or "no": whether it imports torch before reading its config
        self.started = time.monotonic() if started is None else started

    def __repr__(self) -> str:
        return f"Launched(pid={self.proc.pid}, python={self.python!r}, torch={self.torch!r})"


def _package_dirs() -> list[str]:
    import gpudoctor
    import gpudoctor.probes

    return [f"gpudoctor={gpudoctor.__path__[0]}", f"gpudoctor.probes={gpudoctor.probes.__path__[0]}"]


def _env(marker: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, **extra, **{MARKER_VAR: marker, PARENT_VAR: str(os.getpid())})


def worker_env_defaults() -> dict[str, str]:
    """Variables a worker gets unless the user set them. OMP_WAIT_POLICY=PASSIVE: OpenMP threads
    that spin while they wait turn a loaded machine's small CPU workloads into seconds (measured
    here: the CPU probes took 2-14 s and 1.4-4 s of CPU with spinning threads, 1.1-1.3 s and 0.5 s
    without); the probes' results do not depend on it."""
    return {} if "OMP_WAIT_POLICY" in os.environ else {"OMP_WAIT_POLICY": "PASSIVE"}


def launch(python: str, torch: str = "no") -> Launched:
    """Start a worker of `python`. `torch="full"` or `"light"`: it imports torch (and reports on it,
    fully or only CUDA's availability) before it reads its configuration. Raises OSError."""
    marker = new_marker()
    argv = [python, "-c", BOOTSTRAP, *_package_dirs()]
    if torch in ("full", "light"):
        argv.append(f"--torch={torch}")
    _remember(marker)
    with signals_deferred():
        # PYTHONUNBUFFERED: a killed worker keeps what it printed.
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True,
                                env=_env(marker, PYTHONUNBUFFERED="1", **worker_env_defaults()))
    return Launched(proc, python, marker, torch)


# --- finding and killing processes ----------------------------------------------------------------


def _table() -> dict[int, tuple[int, str, int]] | None:
    """pid -> (parent pid, state letter, process group) for every process, or None where /proc is
    missing."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, tuple[int, str, int]] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()
        if len(fields) >= 3:
            table[int(entry)] = (int(fields[1]), fields[0].decode(), int(fields[2]))
    return table


def descendants(root: int, table: dict[int, tuple[int, str, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def carrying(markers: Collection[str], pids: Collection[int]) -> set[int]:
    """The pids whose environment holds GPUDOCTOR_WORKER=<one of markers>."""
    if not markers:
        return set()
    needles = [f"{MARKER_VAR}={m}\0".encode() for m in markers]
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                data = fh.read()
        except OSError:  # another user's process, or gone
            continue
        if any(needle in data for needle in needles):
            found.add(pid)
    return found


def ours(root: int | None, markers: Collection[str]) -> set[int]:
    """Live processes that belong to a worker: `root`, its descendants, its process group and every
    process carrying one of `markers`. Empty where /proc is missing."""
    table = _table()
    if table is None:
        return set()
    found = carrying(markers, table)
    if root is not None:
        if root in table:
            found.add(root)
        found |= descendants(root, table)
        found |= {pid for pid, (_, _, group) in table.items() if group == root}
    found.discard(os.getpid())
    return {pid for pid in found if table.get(pid, (0, "Z", 0))[1] not in ("Z", "X")}


def _signal_all(pids: Collection[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_tree(root: int | None, markers: Collection[str] = (), timeout: float = 3.0) -> None:
    """Kill `root` (a worker, not yet reaped by the caller), everything it started and every process
    carrying one of `markers`. Stops them first so none can fork a new one while they are killed."""
    if root is not None:
        try:
            os.killpg(root, signal.SIGSTOP)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    stopped: set[int] = set()
    while True:
        found = ours(root, markers) - stopped
        if not found:
            break
        _signal_all(found, signal.SIGSTOP)
        stopped |= found
        if time.monotonic() > deadline:
            break
    _signal_all(stopped, signal.SIGKILL)
    if root is not None:
        try:
            os.killpg(root, signal.SIGKILL)
        except OSError:
            pass
        _signal_all([root], signal.SIGKILL)
    # A process re-parented between two reads of /proc can slip through one pass: one more look.
    late = ours(root, markers) - {root}
    if late:
        _signal_all(late, signal.SIGKILL)
    # SIGKILL is delivered at once but a loaded machine takes a moment to run the exits: return
    # only when they are gone (zombies are dead), so that "the scan is over" means "nothing runs".
    doomed = stopped | late
    deadline = time.monotonic() + 2.0
    while doomed and time.monotonic() < deadline:
        table = _table() or {}
        doomed = {pid for pid in doomed if table.get(pid, (0, "Z", 0))[1] not in ("Z", "X")}
        if doomed:
            time.sleep(0.005)
    _forget(markers)


def end_launched(launched: Launched) -> None:
    end_tree(launched.proc.pid, [launched.marker])
    try:
        launched.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (launched.proc.stdin, launched.proc.stdout, launched.proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass


def end_all() -> None:
    """End every process started here and not ended yet (after a signal: whatever was half-way)."""
    markers = live_markers()
    if markers:
        end_tree(None, markers)


class Completed:
    __slots__ = ("returncode", "stdout", "stderr")

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def run_bounded(argv: Sequence[str], timeout: float) -> Completed:
    """Run a short command in its own session with a marker, stdin closed; on timeout kill it and
    everything it started, then raise subprocess.TimeoutExpired. Raises OSError if it cannot start."""
    marker = new_marker()
    _remember(marker)
    try:
        with signals_deferred():
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, env=_env(marker))
    except BaseException:
        _forget([marker])
        raise
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        end_tree(proc.pid, [marker])
        proc.kill()
        proc.communicate()
        raise
    # A daemon it left behind (a wrapper script's background job) goes too.
    end_tree(None, [marker])
    return Completed(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


# --- the CLI's early start ----------------------------------------------------------------------

_early: Launched | None = None
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_saved_handlers: dict[int, object] = {}


def early_start(argv: Sequence[str] | None = None) -> None:
    """Start the first scan worker now, importing torch, when the command line is a scan of this
    interpreter. Called first thing by `gpudoctor.entry:main` (and by `gpudoctor.cli:main` for a
    caller that starts there); never raises. The runner claims the worker (`claim_early`); an
    unclaimed one is ended at exit."""
    global _early
    args = list(sys.argv[1:] if argv is None else argv)
    if _early is not None or not args or args[0] != "scan" or os.environ.get(NO_EARLY_START_VAR):
        return
    for arg in args[1:]:
        # --python: another interpreter (checked before it runs anything); the rest run no scan.
        if arg in ("--help", "-h", "--list-probes", "--python") or arg.startswith("--python="):
            return
    # Until the scan takes over (it installs its own handlers, then calls release_signals), a signal
    # ends the early worker and says that there is no report.
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            try:
                _saved_handlers[signum] = signal.signal(signum, _stop_before_scan)
            except (ValueError, OSError):
                pass
    try:
        _early = launch(sys.executable, torch="full")
    except Exception:  # the runner will start its worker itself and report what fails
        _early = None
        return
    atexit.register(discard_early)


def _stop_before_scan(signum: int, frame: object) -> None:
    if defer_signal(signum):
        return
    discard_early()
    end_all()
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    try:
        os.write(2, f"gpudoctor: interrupted by {name}; no report was written\n".encode())
    finally:
        os._exit(128 + signum)


def release_signals() -> None:
    """Give the signals installed by `early_start` back to their previous handlers."""
    while _saved_handlers:
        signum, handler = _saved_handlers.popitem()
        try:
            if signal.getsignal(signum) is _stop_before_scan:
                signal.signal(signum, handler)
        except (ValueError, OSError, TypeError):
            pass


def claim_early(python: str) -> Launched | None:
    """The early-started worker, when it runs `python` and is still alive; else None (and it is
    ended)."""
    global _early
    launched, _early = _early, None
    if launched is None:
        return None
    same = os.path.realpath(python) == os.path.realpath(launched.python)
    if same and launched.proc.poll() is None:
        return launched
    end_launched(launched)
    return None


def discard_early() -> None:
    global _early
    launched, _early = _early, None
    if launched is not None:
        end_launched(launched)
