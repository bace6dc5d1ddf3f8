"""Read pasted text, a log file or standard input in bounded memory and time, as text chunks.

What is read:

- At most the last `MAX_BYTES` of any input are kept: the error that ended a run is at the end of
  its log. A regular file larger than that is read from its last `MAX_BYTES` (a seek); a pipe or
  standard input is streamed through to its end, keeping a rolling window of its last `MAX_BYTES`,
  so `python train.py 2>&1 | gpudoctor explain -` sees the traceback that ends a 10 GB log. Peak
  memory is about `MAX_BYTES + 2 * CHUNK_BYTES`, whatever the input's length.
- When the head was dropped, the partial first line of the window is dropped too, unless nothing
  but that line is left (a huge log whose tail has no newline is still read).
- A named pipe (FIFO) is opened without blocking and waits at most `wait_s` for a program to open
  it for writing; once a writer is there it is read like standard input. Character devices and
  files that report a size of 0 (`/proc`, `/sys`) are read with a deadline of `wait_s` for each
  read: nothing before the first deadline is an error, silence later ends the input (so
  `/proc/kmsg` gives what it holds instead of blocking for ever). A terminal has no deadline: a
  person is typing. Directories, sockets and block devices are refused.
- Empty input, binary junk (judged from its first bytes) and unreadable files raise `InputError`,
  whose text is the one line shown to the user.

The chunk interface: `iter_file`, `iter_stream` and `iter_text` return a `Chunks`, an iterator of
`str`. Every chunk but the last ends with "\\n", except where one line is longer than
`CHUNK_BYTES` characters: such a line arrives in several chunks and only its last piece ends with
"\\n". So counting "\\n" across chunks numbers the lines of the window; `Chunks.first_line` is the
input's line number of the window's first line (None when the head was skipped by a seek and not
counted) and `Chunks.skipped_bytes` says how much of the head was dropped. Both are set before the
first chunk is yielded. Reading is lazy: nothing is opened until the first chunk is asked for.
"""
from __future__ import annotations

import codecs
import errno
import os
import select
import stat
import time
from collections import deque
from typing import BinaryIO, Callable, Iterator

MAX_BYTES = 100 * 1024 * 1024
CHUNK_BYTES = 4 * 1024 * 1024
WAIT_S = 10.0  # for a FIFO's writer, and for each read of a device or a /proc file
_SNIFF_BYTES = 8192
_POLL_SLICE_S = 0.25  # Linux's poll does not wake when a FIFO's writer arrives without data

Reader = Callable[[int], bytes]


class InputError(Exception):
    """Input gpudoctor cannot use; str(exc) is the one line shown to the user."""


class Chunks:
    """An iterator of text chunks (see the module docstring) that also says what was skipped.

    `skipped_bytes`: bytes of the input's head that were not read or were dropped.
    `skipped_lines`: newlines in that head, or None when it was skipped by a seek (not counted).
    `first_line`: the 1-based line number of the first chunk's first line, or None when unknown.
    """

    def __init__(self, name: str, produce: Callable[["Chunks"], Iterator[str]]) -> None:
        self.name = name
        self.skipped_bytes = 0
        self.skipped_lines: int | None = 0
        self._gen = produce(self)

    @property
    def truncated(self) -> bool:
        return self.skipped_bytes > 0

    @property
    def first_line(self) -> int | None:
        return None if self.skipped_lines is None else self.skipped_lines + 1

    def __iter__(self) -> "Chunks":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


def _looks_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    # Control bytes other than tab, newline, carriage return, form feed and ESC (ANSI colours).
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27))
    return controls > len(sample) // 20


def _window(read: Reader, info: Chunks, max_bytes: int, *, seeked: bool) -> deque[bytes]:
    """Read to the end, keeping the last `max_bytes` as a deque of byte strings."""
    kept: deque[bytes] = deque()
    kept_bytes = 0
    sniffed = False
    while True:
        try:
            raw = read(CHUNK_BYTES)
        except OSError as exc:
            raise InputError(f"cannot read {info.name}: {exc.strerror or exc}") from None
        if not raw:
            break
        if not sniffed:
            if _looks_binary(raw[:_SNIFF_BYTES]):
                raise InputError(f"{info.name} looks like binary data, not a text log or error message")
            sniffed = True
        kept.append(raw)
        kept_bytes += len(raw)
        # Drop whole chunks from the front while the rest still fills the window.
        while kept_bytes - len(kept[0]) >= max_bytes:
            old = kept.popleft()
            kept_bytes -= len(old)
            _skip(info, old)
    excess = kept_bytes - max_bytes
    if excess > 0:
        _skip(info, kept[0][:excess])
        kept[0] = kept[0][excess:]
    if info.skipped_bytes or seeked:
        _drop_partial_first_line(kept, info)
    return kept


def _skip(info: Chunks, dropped: bytes) -> None:
    info.skipped_bytes += len(dropped)
    if info.skipped_lines is not None:
        info.skipped_lines += dropped.count(b"\n")


def _drop_partial_first_line(kept: deque[bytes], info: Chunks) -> None:
    """The window starts inside a line: drop up to the first newline, unless nothing (but blank
    space) would remain, as with a huge log whose tail has no newline."""
    for i, chunk in enumerate(kept):
        cut = chunk.find(b"\n")
        if cut < 0:
            continue
        rest_has_text = bool(chunk[cut + 1:].strip()) or any(c.strip() for c in list(kept)[i + 1:])
        if not rest_has_text:
            return
        for _ in range(i):
            _skip(info, kept.popleft())
        _skip(info, kept[0][:cut + 1])
        kept[0] = kept[0][cut + 1:]
        return


def _decode(kept: deque[bytes], info: Chunks) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    saw_text = False
    while kept:
        text = carry + decoder.decode(kept.popleft())
        cut = text.rfind("\n") + 1
        if not cut and len(text) >= CHUNK_BYTES:
            cut = len(text)  # one line longer than a chunk: pass it on in pieces
        carry = text[cut:]
        if cut:
            piece = text[:cut]
            del text
            saw_text = saw_text or not piece.isspace()
            yield piece
    tail = carry + decoder.decode(b"", final=True)
    if tail.strip():
        saw_text = True
        yield tail
    if not saw_text:
        raise InputError(f"{info.name} is empty: paste an error message or pass a log file")


def _chunks(read: Reader, info: Chunks, max_bytes: int, *, seeked: bool = False) -> Iterator[str]:
    yield from _decode(_window(read, info, max_bytes, seeked=seeked), info)


def _seek_to_tail(stream: BinaryIO, size: int, max_bytes: int, info: Chunks) -> bool:
    if size <= max_bytes:
        return False
    try:
        stream.seek(size - max_bytes)
    except (OSError, ValueError):
        return False
    info.skipped_bytes = size - max_bytes
    info.skipped_lines = None  # not read, so not counted
    return True


def iter_stream(stream: BinaryIO, *, name: str, max_bytes: int | None = None) -> Chunks:
    """Chunks of a binary stream (standard input, an open file), read to its end keeping the last
    `max_bytes`. A stream that is a regular file larger than that (standard input redirected from
    a file) is read from its tail by a seek."""
    cap = MAX_BYTES if max_bytes is None else max_bytes

    def produce(info: Chunks) -> Iterator[str]:
        try:
            st = os.fstat(stream.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
        except (OSError, AttributeError, ValueError):
            size = None  # not a real file (a BytesIO, a closed stdin)
        seeked = size is not None and _seek_to_tail(stream, size, cap, info)
        yield from _chunks(stream.read, info, cap, seeked=seeked)

    return Chunks(name, produce)


def iter_file(path: str, *, max_bytes: int | None = None, wait_s: float | None = None) -> Chunks:
    """Chunks of a log file, a FIFO or a device; InputError for missing, unreadable, directory,
    socket, block-device, silent or binary inputs (see the module docstring). `max_bytes` and
    `wait_s` default to MAX_BYTES and WAIT_S."""
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    wait_s = WAIT_S if wait_s is None else wait_s

    def produce(info: Chunks) -> Iterator[str]:
        fd = _open(path)
        try:
            st = os.fstat(fd)
            _refuse_kind(path, st.st_mode)
            if stat.S_ISREG(st.st_mode) and st.st_size > 0:
                _set_blocking(fd)
                with os.fdopen(fd, "rb", closefd=False) as handle:
                    seeked = _seek_to_tail(handle, st.st_size, max_bytes, info)
                    yield from _chunks(handle.read, info, max_bytes, seeked=seeked)
            else:
                reader = _SpecialReader(fd, path, st.st_mode, wait_s)
                yield from _chunks(reader.read, info, max_bytes)
        finally:
            os.close(fd)

    return Chunks(path, produce)


def iter_text(text: str) -> Chunks:
    """The single chunk of text given on the command line, checked like any other input."""

    def produce(info: Chunks) -> Iterator[str]:
        if "\x00" in text:
            raise InputError("the text looks like binary data, not an error message")
        if not text.strip():
            raise InputError("the text is empty: paste an error message or pass a log file")
        yield text

    return Chunks("the text", produce)


# --- opening files of every kind -----------------------------------------------------------------


def _refuse_kind(path: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise InputError(f"{path} is a directory, not a log file")
    if stat.S_ISSOCK(mode):
        raise InputError(f"{path} is a socket, not a log file; pipe the text into `gpudoctor explain -`")
    if stat.S_ISBLK(mode):
        raise InputError(f"{path} is a block device (a disk), not a log file")


def _open(path: str) -> int:
    try:
        _refuse_kind(path, os.stat(path).st_mode)
        # Non-blocking, so that opening a FIFO nobody writes to returns at once; no controlling
        # terminal, so that opening a tty device cannot adopt it.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket that appeared between stat and open
            raise InputError(f"{path} is a socket, not a log file") from None
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def _set_blocking(fd: int) -> None:
    try:
        os.set_blocking(fd, True)
    except (OSError, AttributeError):
        pass


def _readable(fd: int, timeout: float) -> bool:
    try:
        ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    except (OSError, ValueError):
        return True  # cannot wait on it: let the read itself tell
    return bool(ready)


class _SpecialReader:
    """Reads a FIFO, a device or a /proc file with the deadlines of the module docstring."""

    def __init__(self, fd: int, path: str, mode: int, wait_s: float) -> None:
        self.fd = fd
        self.path = path
        self.wait_s = wait_s
        self.fifo = stat.S_ISFIFO(mode)
        self.tty = os.isatty(fd)
        self.started = False  # a writer was seen (FIFO) or data was read (other kinds)
        if self.tty:
            _set_blocking(fd)
            self.started = True

    def read(self, n: int) -> bytes:
        if self.fifo:
            return self._read_fifo(n)
        if self.tty:
            return os.read(self.fd, n)
        return self._read_with_deadline(n)

    def _read_fifo(self, n: int) -> bytes:
        if self.started:
            return _read_full(self.fd, n)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                data = os.read(self.fd, n)
            except BlockingIOError:
                data = None  # a writer holds the FIFO open and has written nothing yet
            if data != b"":
                self.started = True
                _set_blocking(self.fd)
                return (data or b"") + _read_full(self.fd, n - len(data or b""))
            # b"": no writer. Linux's select neither wakes when a writer opens the FIFO nor
            # when it is merely absent, so wait in slices and look again. It wakes at once when
            # a writer came and went: then a read gives its data, or b"" for an empty input.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InputError(
                    f"{self.path} is a named pipe (FIFO) and nothing opened it for writing within "
                    f"{self.wait_s:g} s; start the program that writes it first, or pipe the log "
                    "into `gpudoctor explain -`"
                )
            if _readable(self.fd, min(remaining, _POLL_SLICE_S)):
                try:
                    data = os.read(self.fd, n)
                except BlockingIOError:
                    continue
                self.started = True
                if not data:
                    return b""
                _set_blocking(self.fd)
                return data + _read_full(self.fd, n - len(data))

    def _read_with_deadline(self, n: int) -> bytes:
        if _readable(self.fd, self.wait_s):
            try:
                data = os.read(self.fd, n)
            except BlockingIOError:  # select said yes, the read said not yet: count it as silence
                data = None
            if data is not None:
                self.started = True
                return data
        if not self.started:
            raise InputError(f"{self.path} gave nothing to read within {self.wait_s:g} s")
        return b""  # a device or /proc file that went quiet: take what it gave


def _read_full(fd: int, n: int) -> bytes:
    """Up to `n` bytes from a blocking fd, fewer only at end of input."""
    parts = []
    while n > 0:
        data = os.read(fd, min(n, CHUNK_BYTES))
        if not data:
            break
        parts.append(data)
        n -= len(data)
    return b"".join(parts)
