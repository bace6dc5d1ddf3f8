"""`gpudoctor run` and `gpudoctor lint` leave nothing behind (issue 32): every process the
command started (its workers, an orphan, a daemon that left the group with setsid, a child in a
group of its own) is gone once gpudoctor has ended by SIGTERM or SIGHUP, and the command's group
once it was killed with SIGKILL; lint's pool workers are gone after SIGTERM or SIGHUP, without a
traceback; an interrupt during the bundle's scan writes no bundle and exits 130.

Every wait polls with a deadline (`gone_within`), never a fixed sleep."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from run_helpers import GPUDOCTOR, script

LINUX = sys.platform.startswith("linux")
AFTER_S = 2.0  # the bound: nothing of the tree alive this long after gpudoctor ended


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie waits only for a parent to read its status)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return data[data.rfind(b")") + 2:data.rfind(b")") + 3] != b"Z"


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still running after polling for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _wait_line(proc: subprocess.Popen, expected: bytes, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == expected:
            return
        if not line:
            break
    raise AssertionError(f"no {expected!r} from the command")


def _start(tmp_path: pathlib.Path, *extra: str) -> tuple[subprocess.Popen, pathlib.Path]:
    pid_file = tmp_path / "pids.txt"
    proc = subprocess.Popen([*GPUDOCTOR, "run", "-q", "--no-scan", "--", sys.executable, script("spawn_tree.py"),
                             str(pid_file), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    _wait_line(proc, b"ready")
    return proc, pid_file


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.skipif(not LINUX, reason="the whole tree is ended on Linux (a subreaper); elsewhere its group")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_nothing_the_command_started_outlives_gpudoctor_ended_by(sig, tmp_path):
    proc, pid_file = _start(tmp_path)
    pids = [int(x) for x in pid_file.read_text().split()]
    assert len(pids) == 5 and all(running(p) for p in pids)
    try:
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig
        left = gone_within(pids, AFTER_S)
        assert not left, f"alive {AFTER_S} s after gpudoctor ended by {sig.name}: {left}"
    finally:
        _kill_leftovers(pids)


@pytest.mark.parametrize("how", ["normal exit", "SIGKILL"])
def test_the_command_group_is_ended_when_gpudoctor_ends(how, tmp_path):
    if how == "normal exit":
        # The command exits; what it left running (its worker, the orphan) must not stay.
        pid_file = tmp_path / "pids.txt"
        code = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, {script('spawn_tree.py')!r}, "
                f"{str(pid_file)!r}, 'group-only'], stdout=subprocess.DEVNULL)\n"
                f"import os, time\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.01)\n")
        done = subprocess.run([*GPUDOCTOR, "run", "-q", "--", sys.executable, "-c", code], capture_output=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        pids = [int(x) for x in pid_file.read_text().split()]
    else:
        proc, pid_file = _start(tmp_path, "group-only")
        pids = [int(x) for x in pid_file.read_text().split()]
        assert len(pids) == 3 and all(running(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
    try:
        left = gone_within(pids, AFTER_S)
        assert not left, f"alive {AFTER_S} s after gpudoctor ended ({how}): {left}"
    finally:
        _kill_leftovers(pids)


def test_signals_reach_the_command_s_whole_group(tmp_path):
    # A shell and its child: SIGTERM to gpudoctor reaches both (once), not the shell alone.
    pid_file = tmp_path / "child.txt"
    child_py = tmp_path / "child.py"
    child_py.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    cmd = f"'{sys.executable}' '{child_py}' & wait"
    proc = subprocess.Popen([*GPUDOCTOR, "run", "-q", "--", "sh", "-c", cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pid_file.read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        assert not gone_within([child], AFTER_S)
    finally:
        _kill_leftovers([child])


# --- lint's pool ------------------------------------------------------------------------------------


def _torch_sources() -> str:
    torch = pytest.importorskip("torch")
    return os.path.dirname(torch.__file__)


@pytest.mark.skipif(not LINUX, reason="reads the pool's pids from /proc; PR_SET_PDEATHSIG for SIGKILL")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_lint_leaves_no_worker_and_no_traceback(sig, tmp_path):
    proc = subprocess.Popen([*GPUDOCTOR, "lint", "--jobs", "2", "--isolated", "--format", "json", "-o",
                             str(tmp_path / "out.json"), _torch_sources()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
        workers = [int(x) for t in os.listdir(f"/proc/{proc.pid}/task")
                   for x in pathlib.Path(f"/proc/{proc.pid}/task/{t}/children").read_text().split()]
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("lint finished before its pool could be signalled")
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), err
        assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode(errors="replace")
        left = gone_within(workers, AFTER_S)
        assert not left, f"lint workers alive after {sig.name}: {left}"
    finally:
        _kill_leftovers(workers)


# --- an interrupt during the bundle's scan --------------------------------------------------------------


def test_an_interrupt_during_the_bundles_scan_is_130_and_no_bundle(tmp_path, monkeypatch):
    import typer

    from gpudoctor.scan import runner
    from gpudoctor.ticket import command as ticket_cli
    from gpudoctor.ticket import runcmd

    def interrupted_scan(options, progress=None):  # what run_scan raises when SIGINT stops it
        raise runner.ScanInterrupted(signal.SIGINT)

    monkeypatch.setattr(runner, "run_scan", interrupted_scan)
    failing = "raise RuntimeError('CUDA error: misaligned address')"
    result = runcmd.run_command([sys.executable, "-c", failing], stdin=subprocess.DEVNULL)
    monkeypatch.setattr(runcmd, "run_command", lambda *a, **k: result)
    bundle = tmp_path / "b"
    with pytest.raises(typer.Exit) as exit_info:
        ticket_cli.run(["python", "-c", failing], localize=False, bundle=str(bundle), no_scan=False, python=None,
                       fmt=None, output=None, quiet=True, verbose=False, no_redact=False)
    assert exit_info.value.exit_code == 130
    assert not bundle.exists() or not any(bundle.iterdir())


# --- the terminal -------------------------------------------------------------------------------------


def test_a_command_that_reads_the_terminal_gets_it_and_then_its_ctrl_c():
    from run_helpers import PtySession

    prompt = ("import sys, time\nprint('ready', flush=True)\nline = input('name? ')\nprint('got', line, flush=True)\n"
              "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n    sys.exit(130)\n")
    session = PtySession([*GPUDOCTOR, "run", "-q", "--", sys.executable, "-c", prompt])
    session.wait_for(b"name? ")
    session.type(b"grace\r")  # read from a background group: SIGTTIN, then gpudoctor lends it the terminal
    session.wait_for(b"got grace")
    session.type(b"\x03")  # the command holds the terminal now: Ctrl-C reaches it from the kernel
    status, shown = session.finish()
    assert status == 130 and "interrupted" in shown
