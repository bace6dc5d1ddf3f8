"""Read pasted text, a log file or stdin in bounded memory and time, as chunks ending at lines.

At most `MAX_BYTES` are read. A file larger than that is read from its last `MAX_BYTES` (the
error that ended a run is at the end of its log). Empty input, binary junk and unreadable files
raise `InputError` with one line meant for the user.
"""
from __future__ import annotations

import codecs
import os
from typing import BinaryIO, Iterator

MAX_BYTES = 100 * 1024 * 1024
CHUNK_BYTES = 4 * 1024 * 1024
_SNIFF_BYTES = 8192


class InputError(Exception):
    """Input gpudoctor cannot use; str(exc) is the one line shown to the user."""


def _looks_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    # Control bytes other than tab, newline, carriage return, form feed and ESC (ANSI colours).
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27))
    return controls > len(sample) // 20


def iter_stream(stream: BinaryIO, *, name: str, skip_to_tail_of: int | None = None) -> Iterator[str]:
    """Yield decoded text chunks that end at line boundaries. `skip_to_tail_of` is the stream's
    size when it is seekable and larger than MAX_BYTES."""
    if skip_to_tail_of is not None and skip_to_tail_of > MAX_BYTES:
        stream.seek(skip_to_tail_of - MAX_BYTES)
        stream.readline()  # drop the partial first line
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""
    total = 0
    first = True
    saw_text = False
    while total < MAX_BYTES:
        try:
            raw = stream.read(min(CHUNK_BYTES, MAX_BYTES - total))
        except OSError as exc:
            raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
        if not raw:
            break
        if first:
            if _looks_binary(raw[:_SNIFF_BYTES]):
                raise InputError(f"{name} looks like binary data, not a text log or error message")
            first = False
        total += len(raw)
        text = carry + decoder.decode(raw)
        cut = text.rfind("\n") + 1
        carry = text[cut:]
        if cut:
            saw_text = saw_text or bool(text[:cut].strip())
            yield text[:cut]
    tail = carry + decoder.decode(b"", final=True)
    if tail.strip():
        saw_text = True
        yield tail
    if not saw_text:
        raise InputError(f"{name} is empty: paste an error message or pass a log file")


def iter_file(path: str) -> Iterator[str]:
    """Chunks of a log file; InputError for missing, unreadable, directory or binary files."""
    try:
        if os.path.isdir(path):
            raise InputError(f"{path} is a directory, not a log file")
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            size = os.fstat(handle.fileno()).st_size
        except OSError:
            size = None
        seekable = handle.seekable() and size is not None
        yield from iter_stream(handle, name=path, skip_to_tail_of=size if seekable else None)


def iter_text(text: str) -> Iterator[str]:
    """The single chunk of text given on the command line, checked like any other input."""
    if "\x00" in text:
        raise InputError("the text looks like binary data, not an error message")
    if not text.strip():
        raise InputError("the text is empty: paste an error message or pass a log file")
    yield text
