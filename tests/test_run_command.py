"""`gpudoctor run`: the command's output, input, exit status and signals, through real processes.

Terminal behaviour is tested on pseudo-terminals (os.openpty): the command's own pty, and gpudoctor
on a pty that is its controlling terminal, where a Ctrl-C written to the master is delivered by the
kernel as a terminal would. No timing asserts: every wait has a deadline."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gpudoctor.ticket import runcmd
from run_helpers import GPUDOCTOR, PtySession, gpudoctor, needs_torch, script, set_size

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes, signals and ptys")


# --- the process runner, in this process ---------------------------------------------------------


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return out
        if not data:
            return out
        out += data


def test_success_passes_output_through_and_keeps_the_record(capfd):
    result = runcmd.run_command([sys.executable, script("succeed.py")], stdin=subprocess.DEVNULL)
    out, err = capfd.readouterr()
    assert result.ok and result.exit_status == 0
    assert out == "all good\n" and err == "a warning on stderr\n"  # unchanged, stream by stream
    assert result.stdout.tail == b"all good\n" and result.stderr.tail == b"a warning on stderr\n"
    assert set(result.output.text().splitlines()) == {"all good", "a warning on stderr"}
    assert result.tty == {"stdout": False, "stderr": False}


def test_exit_code_and_signal_death_are_reported_as_shells_do():
    r = runcmd.run_command([sys.executable, "-c", "raise SystemExit(7)"], stdin=subprocess.DEVNULL)
    assert (r.returncode, r.signal, r.exit_status) == (7, None, 7)
    r = runcmd.run_command([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                           stdin=subprocess.DEVNULL)
    assert (r.returncode, r.signal, r.exit_status) == (None, signal.SIGSEGV, 128 + signal.SIGSEGV)
    assert "SIGSEGV" in r.how


def test_megabytes_pass_through_while_the_record_stays_bounded(tmp_path):
    with open(tmp_path / "out", "wb") as sink:
        result = runcmd.run_command([sys.executable, script("flood.py"), "8"], out_fd=sink.fileno(),
                                    stdin=subprocess.DEVNULL)
    assert (tmp_path / "out").stat().st_size == 8 << 20  # every byte relayed
    assert result.stdout.total == 8 << 20
    assert len(result.stdout.tail) <= runcmd.STREAM_TAIL_BYTES
    assert len(result.output.head) <= runcmd.HEAD_BYTES and len(result.output.tail) <= runcmd.TAIL_BYTES
    assert result.output.omitted == result.output.total - len(result.output.head) - len(result.output.tail) > 0
    assert b"illegal memory access" in result.stderr.tail


def test_a_terminal_stays_a_terminal_with_its_size_and_colours():
    master, slave = os.openpty()
    set_size(slave, 123, 33)
    try:
        result = runcmd.run_command([sys.executable, script("tty_info.py")], out_fd=slave,
                                    stdin=subprocess.DEVNULL)
    finally:
        os.close(slave)
    shown = _read_all(master).replace(b"\r\n", b"\n")
    os.close(master)
    assert result.tty == {"stdout": True, "stderr": False}
    assert b"stdout_tty=True stderr_tty=False" in shown and b"size=123x33" in shown
    assert b"\x1b[31mred\x1b[0m\n" in shown  # colour codes relayed as written
    assert result.stdout.tail.endswith(b"\x1b[31mred\x1b[0m\n")  # no CR added: ONLCR is off


def test_ptys_can_be_refused():
    master, slave = os.openpty()
    try:
        result = runcmd.run_command([sys.executable, script("tty_info.py")], out_fd=slave, ptys=False,
                                    stdin=subprocess.DEVNULL)
    finally:
        os.close(slave)
    os.close(master)
    assert result.tty == {"stdout": False, "stderr": False}
    assert b"stdout_tty=False" in result.stdout.tail


def test_a_missing_or_unrunnable_command_is_127_or_126(tmp_path):
    with pytest.raises(runcmd.RunError) as missing:
        runcmd.run_command(["gpudoctor-no-such-command-xyz"])
    assert missing.value.exit_code == 127
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    with pytest.raises(runcmd.RunError) as denied:
        runcmd.run_command([str(plain)])
    assert denied.value.exit_code == 126


# --- the CLI, as a user runs it -----------------------------------------------------------------


def test_cli_success_exit_zero_and_stdout_untouched():
    done = gpudoctor("run", "--", sys.executable, script("succeed.py"))
    assert done.returncode == 0
    assert done.stdout == b"all good\n"
    assert b"a warning on stderr\n" in done.stderr and b"nothing to explain" in done.stderr


def test_cli_without_double_dash_stops_parsing_at_the_command():
    done = gpudoctor("run", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--localize", "-q")
    assert done.returncode == 0 and done.stdout == b"['--localize', '-q']\n"


@needs_torch
def test_cli_dtype_mismatch_is_explained_and_its_exit_code_kept():
    done = gpudoctor("run", "--", sys.executable, script("dtype_mismatch.py"))
    assert done.returncode == 1  # Python's exit code for an uncaught exception
    assert done.stdout == b"forward\n"
    err = done.stderr.decode()
    assert "mat1 and mat2 must have the same dtype" in err  # the command's own stderr, relayed
    assert "gpudoctor: dtype-mismatch" in err
    assert "dtype_mismatch.py:7" in err  # the failing line of the user's script
    assert "Traceback" not in err.split("gpudoctor: dtype-mismatch")[1]  # gpudoctor raised nothing


def test_cli_reads_stdin_through():
    done = gpudoctor("run", "-q", "--", sys.executable, script("echo_stdin.py"), input=b"first line\nsecond\n")
    assert done.returncode == 0
    assert done.stdout == b"read 18 characters; first line: first line\n"
    assert done.stderr == b""  # -q: nothing of gpudoctor's own


def test_cli_flood_then_failure_is_still_explained():
    done = gpudoctor("run", "--", sys.executable, script("flood.py"), "4")
    assert done.returncode == 1
    assert len(done.stdout) == 4 << 20
    assert b"gpudoctor: illegal-memory-access" in done.stderr


def test_cli_token_passes_to_the_terminal_but_not_into_what_gpudoctor_writes(tmp_path):
    out = tmp_path / "run.json"
    done = gpudoctor("run", "-o", str(out), "--", sys.executable, script("prints_secrets.py"))
    assert done.returncode == 3
    # The user's own terminal gets the output unchanged (documented: it is their program talking).
    assert b"hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123" in done.stdout
    record = out.read_text()
    for secret in ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "AKIAABCDEFGHIJKLMNOP", "s3cretpw"):
        assert secret not in record
    data = json.loads(record)
    assert data["redacted"] is True and "<secret-" in data["output"]["log"]
    kept = gpudoctor("run", "--no-redact", "-o", str(tmp_path / "raw.json"), "--", sys.executable, script("prints_secrets.py"))
    assert kept.returncode == 3
    assert "s3cretpw" in (tmp_path / "raw.json").read_text()


def test_cli_missing_command_and_no_command():
    done = gpudoctor("run", "--", "gpudoctor-no-such-command-xyz")
    assert done.returncode == 127
    assert done.stderr.decode().strip() == "gpudoctor: gpudoctor-no-such-command-xyz: command not found"
    done = gpudoctor("run")
    assert done.returncode == 2 and done.stderr.count(b"\n") == 1 and b"nothing to run" in done.stderr


def test_cli_refuses_bad_outputs_before_running(tmp_path):
    marker = tmp_path / "ran"
    cmd = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    (tmp_path / "file").write_text("mine")
    for args in (["--bundle", str(tmp_path / "file")], ["-o", str(tmp_path)], ["-o", "-"]):
        done = gpudoctor("run", *args, *cmd)
        assert done.returncode == 2, args
        assert done.stderr.count(b"\n") == 1 and b"Traceback" not in done.stderr
    assert not marker.exists()
    assert (tmp_path / "file").read_text() == "mine"


def test_cli_closed_stdout_pipe_ends_the_command():
    # `gpudoctor run -- flood | head -c 100`: the command must see the broken pipe, not hang.
    proc = subprocess.Popen([*GPUDOCTOR, "run", "-q", "--", sys.executable, script("flood.py"), "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()
    proc.wait(timeout=120)
    assert proc.returncode != 0


# --- signals -------------------------------------------------------------------------------------


def test_sigint_sent_to_gpudoctor_reaches_the_command_once():
    proc = subprocess.Popen([*GPUDOCTOR, "run", "--", sys.executable, script("wait_for_sigint.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)  # kill(2): only gpudoctor gets it, so it forwards it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert out == b"sigints=1\n"
    assert b"interrupt passed to the command" in err


def test_sigterm_is_forwarded_and_the_exit_status_is_128_plus_n():
    proc = subprocess.Popen([*GPUDOCTOR, "run", "-q", "--", sys.executable, script("ignore_sigint.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"slept through" not in out


def test_ctrl_c_at_the_terminal_reaches_the_command_once():
    session = PtySession([*GPUDOCTOR, "run", "--", sys.executable, script("wait_for_sigint.py")])
    session.wait_for(b"ready")
    session.type(b"\x03")  # the terminal's line discipline sends SIGINT to the foreground group
    status, shown = session.finish()
    assert status == 130
    assert "sigints=1" in shown  # not 2: gpudoctor did not forward what the terminal delivered


def test_ctrl_c_twice_ends_a_command_that_ignores_sigint():
    session = PtySession([*GPUDOCTOR, "run", "--no-scan", "--", sys.executable, script("ignore_sigint.py")])
    session.wait_for(b"ready")
    session.type(b"\x03")
    session.wait_for(b"press Ctrl-C again")
    session.type(b"\x03")
    status, shown = session.finish()
    assert status == 128 + signal.SIGTERM
    assert "slept through" not in shown and "stopping the command" in shown


def test_ctrl_c_twice_kills_a_command_that_ignores_sigint_and_sigterm():
    session = PtySession([*GPUDOCTOR, "run", "--", sys.executable, script("ignore_sigint.py"), "term"])
    session.wait_for(b"ready")
    session.type(b"\x03")
    session.wait_for(b"press Ctrl-C again")
    session.type(b"\x03")
    status, shown = session.finish()
    assert status == 128 + signal.SIGKILL  # after the grace period
    assert "slept through" not in shown


def test_terminal_command_sees_ttys_and_follows_a_resize():
    session = PtySession([*GPUDOCTOR, "run", "-q", "--", sys.executable, script("tty_info.py"), "winch"],
                         cols=100, rows=30)
    session.wait_for(b"ready")
    assert b"stdout_tty=True stderr_tty=True stdin_tty=True size=100x30" in session.buffer
    set_size(session.master, 132, 40)  # the kernel signals the foreground group; gpudoctor relays the size
    session.wait_for(b"resized=132x40")
    status, shown = session.finish()
    assert status == 0
    assert "\x1b[31mred\x1b[0m" in shown
