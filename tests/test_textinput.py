"""Reading logs: the tail of anything too big is kept (files, pipes, standard input), special files
never hang (a FIFO without a writer, devices, /proc), and the chunk interface the matcher and
explain's line numbers rely on."""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpudoctor.explain import textinput
from gpudoctor.explain.textinput import InputError, iter_file, iter_stream, iter_text

MISALIGNED = b"RuntimeError: CUDA error: misaligned address\n"
# A subprocess running the real CLI with a short FIFO deadline (the default is WAIT_S).
_CLI = (
    "import sys\nfrom gpudoctor.explain import textinput\ntextinput.WAIT_S = float(sys.argv[1])\n"
    "textinput.MAX_BYTES = int(sys.argv[2])\nfrom gpudoctor.cli import main\n"
    "sys.argv = ['gpudoctor', 'explain', '--json'] + sys.argv[3:]\nmain()\n"
)


def _cli(*args: str, wait_s: float = 1.0, max_bytes: int = textinput.MAX_BYTES, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CLI, str(wait_s), str(max_bytes), *args],
                          capture_output=True, timeout=120, **kw)


def _noise(n_lines: int, width: int = 100) -> bytes:
    return b"".join(b"INFO step %08d loss 0.1 " % i + b"x" * (width - 29) + b"\n" for i in range(n_lines))


def _lines_of(chunks) -> list[str]:
    return "".join(chunks).splitlines()


# --- the chunk interface ---------------------------------------------------------------------------


def test_chunks_end_at_line_boundaries_and_number_the_lines(monkeypatch):
    monkeypatch.setattr(textinput, "CHUNK_BYTES", 1000)
    data = b"".join(b"line %d\n" % i for i in range(5000))
    chunks = iter_stream(io.BytesIO(data), name="log")
    pieces = list(chunks)
    assert len(pieces) > 5 and all(p.endswith("\n") for p in pieces)
    assert "".join(pieces).encode() == data
    assert chunks.first_line == 1 and chunks.skipped_bytes == 0 and not chunks.truncated
    # Counting "\n" across chunks gives each line's number in the input.
    line = chunks.first_line + "".join(pieces).split("line 4321\n")[0].count("\n")
    assert line == 4322


def test_a_line_longer_than_a_chunk_comes_in_pieces(monkeypatch):
    monkeypatch.setattr(textinput, "CHUNK_BYTES", 1000)
    data = b"short\n" + b"y" * 5500 + b"\nend\n"
    pieces = list(iter_stream(io.BytesIO(data), name="log"))
    assert "".join(pieces).encode() == data
    assert max(len(p) for p in pieces) < 3000  # bounded, never the whole 5.5 KB line at once
    assert "".join(pieces).count("\n") == 3


def test_iter_text_is_one_chunk_and_checks_its_input():
    assert list(iter_text("RuntimeError: x\n")) == ["RuntimeError: x\n"]
    with pytest.raises(InputError, match="binary"):
        list(iter_text("a\x00b"))
    with pytest.raises(InputError, match="empty"):
        list(iter_text("  \n"))


def test_chunks_are_lazy():
    chunks = iter_file("/no/such/file")  # nothing is opened yet
    with pytest.raises(InputError, match="cannot read /no/such/file"):
        next(chunks)


# --- the tail of big inputs ------------------------------------------------------------------------


def test_stdin_over_the_cap_keeps_its_end():
    head = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    data = head + _noise(2000) + MISALIGNED
    chunks = iter_stream(io.BytesIO(data), name="standard input", max_bytes=50_000)
    text = "".join(chunks)
    assert text.endswith(MISALIGNED.decode()) and "illegal memory access" not in text
    assert len(text) <= 50_000 and text.startswith("INFO step ")  # the partial first line is dropped
    assert chunks.truncated and chunks.skipped_bytes == len(data) - len(text.encode())
    # The window's first line is numbered as in the whole input.
    assert chunks.first_line == data[: chunks.skipped_bytes].count(b"\n") + 1
    first = text.splitlines()[0]
    assert data.splitlines()[chunks.first_line - 1].decode() == first


def test_lines_found_in_the_tail_of_a_piped_log_are_numbered_as_in_the_whole_log():
    from gpudoctor.explain.matcher import match_chunks

    data = _noise(2000) + MISALIGNED + _noise(3)
    [match] = [m for m in match_chunks(iter_stream(io.BytesIO(data), name="standard input", max_bytes=50_000))
               if m.id == "misaligned-address"]
    assert match.first_line == data.splitlines().index(MISALIGNED.rstrip()) + 1


def test_a_real_pipe_over_the_cap_keeps_its_end():
    read_fd, write_fd = os.pipe()

    def writer():
        with os.fdopen(write_fd, "wb") as w:
            w.write(b"first line\n")
            for _ in range(40):
                w.write(_noise(1000))
            w.write(MISALIGNED)

    thread = threading.Thread(target=writer)
    thread.start()
    with os.fdopen(read_fd, "rb") as r:
        text = "".join(iter_stream(r, name="standard input", max_bytes=1_000_000))
    thread.join()
    assert text.endswith(MISALIGNED.decode()) and "first line" not in text
    assert 900_000 < len(text) <= 1_000_000


def test_real_stdin_over_100_mb_keeps_the_tail_in_bounded_memory():
    """The README's `python train.py 2>&1 | gpudoctor explain -` with 120 MiB of output."""
    code = (
        "import sys\nfrom gpudoctor.explain.textinput import iter_stream, MAX_BYTES\n"
        "chunks = iter_stream(sys.stdin.buffer, name='standard input')\nn = 0\nlast = ''\n"
        "for c in chunks:\n    n += len(c)\n    last = c[-200:]\n"
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print(hwm, n, chunks.skipped_bytes, MAX_BYTES)\nprint(last.splitlines()[-1])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    block = _noise(1024, width=1024)  # 1 MiB
    proc.stdin.write(b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
    for _ in range(120):
        proc.stdin.write(block)
    proc.stdin.write(MISALIGNED)
    proc.stdin.close()
    out = proc.stdout.read().decode().splitlines()
    assert proc.wait(timeout=120) == 0
    hwm_kib, n, skipped, cap = map(int, out[0].split())
    assert out[1] == MISALIGNED.decode().strip()
    assert cap - 2048 < n <= cap and skipped >= 120 * 2**20 - cap
    # Peak memory: the window plus a few chunks and the interpreter, far under twice the cap.
    assert hwm_kib * 1024 < 1.4 * cap, f"peak {hwm_kib} KiB for a {cap} byte window"


def test_a_big_file_is_read_from_its_tail(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(MISALIGNED.replace(b"misaligned address", b"an illegal memory access") + _noise(3000) + MISALIGNED)
    chunks = iter_file(str(log), max_bytes=20_000)
    text = "".join(chunks)
    assert text.endswith(MISALIGNED.decode()) and "illegal" not in text and text.startswith("INFO")
    assert chunks.truncated and chunks.first_line is None  # seeked over, not counted


def test_a_huge_file_whose_tail_has_no_newline_is_not_empty(tmp_path):
    log = tmp_path / "one-line.log"
    log.write_bytes(b"x" * 30_000 + b"\n" + b"RuntimeError: CUDA error: misaligned address " + b"y" * 60_000)
    text = "".join(iter_file(str(log), max_bytes=20_000))
    assert len(text) == 20_000 and set(text) == {"y"}
    log.write_bytes(b"z" * 50_000)  # no newline at all
    assert "".join(iter_file(str(log), max_bytes=20_000)) == "z" * 20_000


def test_explain_finds_the_error_at_the_end_of_a_big_stdin():
    """Through the real CLI, with a 1 MB cap so that a 6 MB stream is over it."""
    stdin = b"RuntimeError: CUDA error: an illegal memory access was encountered\n" + _noise(60_000) + MISALIGNED
    proc = _cli("-", max_bytes=1_000_000, input=stdin)
    assert proc.returncode == 0, proc.stderr
    import json

    ids = [m["id"] for m in json.loads(proc.stdout)["matches"]]
    assert ids[0] == "misaligned-address" and "illegal-memory-access" not in ids


# --- special files -----------------------------------------------------------------------------------


def test_fifo_without_a_writer_gives_one_line_and_exit_2(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    proc = _cli("--file", str(fifo), wait_s=1.0)
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "named pipe" in err and "Traceback" not in err
    assert time.monotonic() - started < 60  # it returned; the subprocess timeout would raise


def test_fifo_with_a_late_writer_is_read(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def writer():
        time.sleep(0.3)
        fd = os.open(fifo, os.O_WRONLY)  # blocks until the reader is there
        time.sleep(0.3)  # open, not yet written: gpudoctor must wait for the data, not give up
        os.write(fd, b"noise\n" + MISALIGNED)
        os.close(fd)

    thread = threading.Thread(target=writer)
    thread.start()
    text = "".join(iter_file(str(fifo), wait_s=30))
    thread.join()
    assert text == "noise\n" + MISALIGNED.decode()


def test_fifo_whose_writer_leaves_without_writing_is_empty(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)))
    thread.start()
    with pytest.raises(InputError, match="empty"):
        list(iter_file(str(fifo), wait_s=30))
    thread.join()


def test_fifo_in_process_deadline(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"nothing opened it for writing within 0.3 s"):
        list(iter_file(str(fifo), wait_s=0.3))


@pytest.mark.parametrize("path, message", [
    ("/dev/zero", "binary"),
    ("/dev/urandom", "binary"),
    ("/dev/null", "empty"),
    ("/", "directory"),
])
def test_devices_and_directories(path, message):
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    with pytest.raises(InputError, match=message):
        list(iter_file(path, wait_s=1))


def test_a_socket_is_refused(tmp_path):
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)
        with pytest.raises(InputError, match="socket"):
            list(iter_file(path))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc")
def test_proc_files_that_report_size_zero_are_read():
    assert os.stat("/proc/self/status").st_size == 0
    text = "".join(iter_file("/proc/self/status", wait_s=5))
    assert text.startswith("Name:") and "VmRSS" in text


def test_special_files_through_the_cli(tmp_path):
    for path, message in (("/dev/zero", "binary"), (str(tmp_path), "directory")):
        proc = _cli("--file", path)
        err = proc.stderr.decode().strip()
        assert proc.returncode == 2 and message in err and len(err.splitlines()) == 1


def test_binary_is_judged_from_the_first_bytes_of_a_stream():
    with pytest.raises(InputError, match="binary"):
        list(iter_stream(io.BytesIO(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 40), name="x"))
    with pytest.raises(InputError, match="empty"):
        list(iter_stream(io.BytesIO(b""), name="standard input"))
