"""Which GPU architectures a CUDA binary carries code for, and whether that code runs on a GPU.

Two halves live here:

- a reader for the CUDA fatbinary embedded in an ELF shared library or object (`read_fatbin`): it
  finds the `.nv_fatbin` (and `__nv_relfatbin`) sections, walks the fatbin containers in them and
  lists each entry's kind (SASS, PTX, LTO-IR), architecture and variant (`a` arch-specific,
  `f` family-specific). Only headers are read, with positioned reads, so a 1 GB libtorch_cuda.so
  costs a few thousand small reads and never a copy of the file; payloads (often zstd-compressed)
  are skipped, so compression does not matter.
- the compatibility rules (`runs_on`, `coverage`): does SASS or PTX built for one target run on a
  GPU of a given compute capability.

Standard library only: this module is imported inside probe workers of any target interpreter.

Layout (little-endian; from NVIDIA's `fatbinary_section.h`/`fatBinaryHeader` and reimplementations
such as ZLUDA and cuda-fatbin-decompression, checked against nvcc 13.0 output, see
tests/test_fatbin.py):

    container header, 16 bytes: u32 magic 0xBA55ED50, u16 version 1, u16 header size (16),
                                u64 size of the entries that follow
    entry header, >= 64 bytes:  u16 kind (1 PTX, 2 ELF/SASS, 8 LTO-IR), u16 version (0x0101),
                                u32 header size (64, 80, 96, 112), u32 padded payload size,
                                u32 -, u32 payload size when compressed, u32 -,
                                u16 code version minor, u16 major (PTX ISA version for PTX),
                                u32 sm (e.g. 90 for 9.0), u32 -, u32 -, u64 flags, u64 -,
                                u64 uncompressed payload size
    the payload follows the entry header; the next entry starts header size + padded size later.

Flag bits used: 0x2000 LZ4-compressed, 0x8000 zstd-compressed, 0x100000 arch-specific (`sm_90a`),
0x200000 family-specific (`sm_100f`, CUDA 12.9+). A section may hold several containers back to
back (nvcc's device-link stub adds one to every shared library).
"""
from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

KIND_PTX = 1
KIND_SASS = 2
KIND_LTO = 8
_KIND_NAMES = {KIND_PTX: "ptx", KIND_SASS: "sass", KIND_LTO: "lto"}

FLAG_COMPRESSED_LZ4 = 0x2000
FLAG_COMPRESSED_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
_CONTAINER_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEADER = struct.Struct("<HHIIIIIHHIIIQQQ")
_SHT_NOBITS = 8
_SHN_XINDEX = 0xFFFF
# Section-name tables and header tables beyond these sizes are not real ELF files: refuse them
# rather than allocate what a corrupt header asks for.
_MAX_SECTIONS = 1 << 16
_MAX_SHSTRTAB = 1 << 20
# Zero padding tolerated between two containers of one section.
_MAX_GAP = 4096

# Compute capabilities of shipped NVIDIA GPUs, used to say "which GPUs this runs on" where no GPU
# is present to compare against. 8.8 and 11.0 are the CUDA 13 names of embedded parts.
KNOWN_CAPABILITIES: tuple[tuple[int, int], ...] = (
    (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5),
    (8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1),
)


class FatbinError(ValueError):
    """The file is not an ELF we can read, or its fatbinary is truncated or corrupt."""


class FatbinTimeout(FatbinError):
    """The caller's deadline passed while reading: the listing is partial, the file is fine."""


@dataclass(frozen=True, order=True)
class CodeTarget:
    """One compiled target: SASS (`sm_90a`) or PTX (`compute_80`) for an architecture."""

    major: int
    minor: int
    kind: str = "sass"  # "sass", "ptx", "lto" (LTO-IR) or "unknown"
    variant: str = ""  # "", "a" (arch-specific) or "f" (family-specific)

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        prefix = {"sass": "sm", "ptx": "compute"}.get(self.kind, self.kind)
        return f"{prefix}_{self.sm}{self.variant}"

    def __str__(self) -> str:
        return self.name


_TARGET_RE = re.compile(r"^(sm|compute|lto)_(\d+)([af]?)$")


def parse_target(text: str) -> CodeTarget:
    """`sm_90a`, `compute_80`, `lto_90` (the spellings nvcc and `torch.cuda.get_arch_list()` use)."""
    match = _TARGET_RE.match(text.strip().lower())
    if match is None:
        raise ValueError(f"not a CUDA architecture name: {text!r}")
    prefix, digits, variant = match.groups()
    kind = {"sm": "sass", "compute": "ptx", "lto": "lto"}[prefix]
    return target_for_sm(int(digits), kind, variant)


def target_for_sm(sm: int, kind: str = "sass", variant: str = "") -> CodeTarget:
    # Every architecture so far has a one-digit minor: sm_121 is 12.1, sm_90 is 9.0.
    return CodeTarget(sm // 10, sm % 10, kind, variant)


def capability_name(capability: tuple[int, int]) -> str:
    """(8, 6) -> "sm_86", the way error messages and wheels name a GPU."""
    return f"sm_{capability[0]}{capability[1]}"


def runs_on(target: CodeTarget, capability: tuple[int, int]) -> bool:
    """Whether code built for `target` can run on a GPU of `capability` (major, minor).

    - SASS `sm_XY` runs on X.Z for every Z >= Y (same major only): sm_86 runs on 8.6 and 8.9,
      never on 9.0.
    - PTX `compute_XY` is JIT-compiled by the driver for any GPU at or above X.Y.
    - `a` (arch-specific, sm_90a) code, SASS or PTX, runs only on exactly X.Y.
    - `f` (family-specific, CUDA 12.9+) code runs within the family: same major, minor >= Y
      (sm_100f on 10.0 and 10.3, not on 11.0 or 12.0).
    - LTO-IR must be linked first: it never runs as is.
    """
    major, minor = capability
    if target.kind not in ("sass", "ptx"):
        return False
    if target.variant == "a":
        return (major, minor) == (target.major, target.minor)
    if target.variant == "f" or target.kind == "sass":
        return major == target.major and minor >= target.minor
    return (major, minor) >= (target.major, target.minor)


@dataclass(frozen=True)
class Coverage:
    """How a set of targets serves one GPU: native SASS, PTX by JIT, or nothing."""

    capability: tuple[int, int]
    native: CodeTarget | None = None  # the SASS the driver would load
    jit: CodeTarget | None = None  # the PTX it would JIT when no SASS fits

    @property
    def verdict(self) -> str:
        if self.native is not None:
            return "native"
        return "jit" if self.jit is not None else "none"

    @property
    def ok(self) -> bool:
        return self.verdict != "none"

    def describe(self) -> str:
        if self.native is not None:
            return f"runs natively ({self.native.name})"
        if self.jit is not None:
            return f"runs only by JIT from {self.jit.name} PTX"
        return f"no code for {capability_name(self.capability)}"


def coverage(targets: Iterable[CodeTarget], capability: tuple[int, int]) -> Coverage:
    """Pick what the driver would use on `capability`: the closest SASS, else the newest PTX."""
    fitting = [t for t in set(targets) if runs_on(t, capability)]
    sass = [t for t in fitting if t.kind == "sass"]
    ptx = [t for t in fitting if t.kind == "ptx"]
    # The closest SASS is the highest one that still runs; arch-specific code wins a tie because
    # it is the most tuned build for exactly this GPU.
    native = max(sass, key=lambda t: (t.sm, t.variant == "a"), default=None)
    jit = max(ptx, key=lambda t: (t.sm, t.variant == "a"), default=None)
    return Coverage((capability[0], capability[1]), native, jit)


def describe_targets(targets: Iterable[CodeTarget]) -> str:
    """"SASS sm_80, sm_90a and PTX compute_90", the inventory a no-kernel-image finding quotes."""
    unique = sorted(set(targets), key=lambda t: (t.sm, t.variant))
    sass = [t.name for t in unique if t.kind == "sass"]
    ptx = [t.name for t in unique if t.kind == "ptx"]
    parts = []
    if sass:
        parts.append("SASS " + ", ".join(sass))
    if ptx:
        parts.append("PTX " + ", ".join(ptx))
    return " and ".join(parts) if parts else "no SASS or PTX"


def supported_capabilities(
    targets: Iterable[CodeTarget], known: Sequence[tuple[int, int]] = KNOWN_CAPABILITIES
) -> list[str]:
    """The known GPUs the targets serve, e.g. ["8.0", "8.6", "9.0 (JIT)"]."""
    targets = list(targets)
    out = []
    for cap in known:
        cov = coverage(targets, cap)
        if cov.ok:
            out.append(f"{cap[0]}.{cap[1]}" + (" (JIT)" if cov.verdict == "jit" else ""))
    return out


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of a fatbin container, as its header describes it."""

    target: CodeTarget
    kind_code: int  # the raw kind (1 PTX, 2 SASS, 8 LTO-IR, others unknown)
    flags: int
    code_version: tuple[int, int]  # PTX ISA version for PTX (9.0), ELF code version for SASS
    offset: int  # file offset of the entry header
    payload_size: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & (FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_ZSTD))


@dataclass(frozen=True)
class FatbinReport:
    """What one file carries. `error` is set (and the lists hold what was read before it) when
    the file is not a readable ELF or its fatbinary is damaged; reading never raises for that."""

    path: str
    size: int = 0
    sections: tuple[str, ...] = ()  # fatbin sections found
    containers: int = 0
    entries: tuple[FatbinEntry, ...] = ()
    error: str | None = None
    unknown_kinds: tuple[int, ...] = field(default=())
    out_of_time: bool = False  # `error` is the caller's deadline, not damage (a slow filesystem)

    @property
    def has_fatbin(self) -> bool:
        return bool(self.sections)

    @property
    def targets(self) -> tuple[CodeTarget, ...]:
        return tuple(sorted({e.target for e in self.entries if e.kind_code in _KIND_NAMES}))

    @property
    def sass(self) -> list[str]:
        return [t.name for t in self.targets if t.kind == "sass"]

    @property
    def ptx(self) -> list[str]:
        return [t.name for t in self.targets if t.kind == "ptx"]

    @property
    def lto(self) -> list[str]:
        return [t.name for t in self.targets if t.kind == "lto"]

    @property
    def compressed(self) -> bool:
        return any(e.compressed for e in self.entries)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "size": self.size,
            "sass": self.sass,
            "ptx": self.ptx,
            "lto": self.lto,
            "containers": self.containers,
            "entries": len(self.entries),
            "compressed": self.compressed,
            "error": self.error,
            "out_of_time": self.out_of_time,
        }


def _pread(fd: int, size: int, offset: int, what: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FatbinError(f"truncated: {what} at offset {offset} needs {size} bytes, file ends first")
    return data


def fatbin_sections(fd: int, file_size: int) -> list[tuple[str, int, int]]:
    """(name, file offset, size) of each fatbin section of the ELF open on `fd`."""
    if file_size < _ELF_HEADER.size:
        raise FatbinError(f"not an ELF file: only {file_size} bytes")
    header = _ELF_HEADER.unpack(_pread(fd, _ELF_HEADER.size, 0, "ELF header"))
    ident = header[0]
    if ident[:4] != b"\x7fELF":
        raise FatbinError("not an ELF file (bad magic)")
    if ident[4] != 2 or ident[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum, shstrndx = header[6], header[11], header[12], header[13]
    if shoff == 0:
        return []
    if shentsize < _SECTION_HEADER.size:
        raise FatbinError(f"corrupt ELF: section header size {shentsize}")

    def section(index: int) -> tuple:
        at = shoff + index * shentsize
        return _SECTION_HEADER.unpack(_pread(fd, _SECTION_HEADER.size, at, f"section header {index}"))

    # More than 0xff00 sections: the real count and name-table index live in section 0.
    if shnum == 0 or shstrndx == _SHN_XINDEX:
        first = section(0)
        shnum = shnum or first[5]
        if shstrndx == _SHN_XINDEX:
            shstrndx = first[7]
    if shnum > _MAX_SECTIONS or shoff + shnum * shentsize > file_size:
        raise FatbinError(f"truncated or corrupt ELF: {shnum} section headers at offset {shoff} "
                          f"do not fit in {file_size} bytes")
    table = _pread(fd, shnum * shentsize, shoff, "section headers")
    headers = [_SECTION_HEADER.unpack_from(table, i * shentsize) for i in range(shnum)]
    if shstrndx >= shnum:
        raise FatbinError(f"corrupt ELF: section name table index {shstrndx} of {shnum}")
    str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
    if str_size > _MAX_SHSTRTAB or str_off + str_size > file_size:
        raise FatbinError("truncated or corrupt ELF: section name table outside the file")
    names = _pread(fd, str_size, str_off, "section name table")
    found = []
    for name_off, sh_type, _flags, _addr, offset, size, *_rest in headers:
        end = names.find(b"\0", name_off)
        name = names[name_off:end if end >= 0 else None].decode("ascii", "replace")
        if name in FATBIN_SECTIONS and sh_type != _SHT_NOBITS and size:
            if offset + size > file_size:
                raise FatbinError(f"truncated: section {name} ends at {offset + size}, "
                                  f"file has {file_size} bytes")
            found.append((name, offset, size))
    return found


def iter_entries(
    fd: int, start: int, size: int, deadline: float | None = None
) -> Iterator[FatbinEntry | None]:
    """Walk the containers of one fatbin section; yields each entry, and None after each
    container (so the caller can count them). Raises FatbinError on damage, and when the
    `time.monotonic()` deadline passes (a cold 1 GB library on a slow disk)."""
    pos, end = start, start + size
    while pos + _CONTAINER_HEADER.size <= end:
        if deadline is not None and time.monotonic() > deadline:
            raise FatbinTimeout(f"stopped at offset {pos} of {end}: out of time, listing is partial")
        raw = _pread(fd, _CONTAINER_HEADER.size, pos, "fatbin header")
        magic, _version, header_size, fat_size = _CONTAINER_HEADER.unpack(raw)
        if magic != FATBIN_MAGIC:
            if magic == 0:
                # Alignment padding between containers: skip zeros, but not forever.
                gap = _pread(fd, min(_MAX_GAP, end - pos), pos, "padding")
                skip = len(gap) - len(gap.lstrip(b"\0"))
                if skip == _MAX_GAP and pos + skip < end:
                    raise FatbinError(f"corrupt fatbin: more than {_MAX_GAP} zero bytes at {pos}")
                pos += skip
                continue
            raise FatbinError(f"corrupt fatbin: magic 0x{magic:08x} at offset {pos}, "
                              f"expected 0x{FATBIN_MAGIC:08X}")
        if header_size < _CONTAINER_HEADER.size or pos + header_size + fat_size > end:
            raise FatbinError(f"truncated fatbin: container at offset {pos} claims "
                              f"{header_size + fat_size} bytes, its section has {end - pos} left")
        entry_pos, container_end = pos + header_size, pos + header_size + fat_size
        while entry_pos < container_end:
            if entry_pos + _ENTRY_HEADER.size > container_end:
                raise FatbinError(f"truncated fatbin: entry header at offset {entry_pos} runs "
                                  f"past its container")
            fields = _ENTRY_HEADER.unpack(_pread(fd, _ENTRY_HEADER.size, entry_pos, "fatbin entry"))
            (kind, _ver, entry_header_size, padded_size, _u0, _packed_size, _u1,
             code_minor, code_major, sm, _u2, _u3, flags, _u4, _unpacked_size) = fields
            if entry_header_size < _ENTRY_HEADER.size or \
                    entry_pos + entry_header_size + padded_size > container_end:
                raise FatbinError(f"corrupt fatbin: entry at offset {entry_pos} claims "
                                  f"{entry_header_size}+{padded_size} bytes, container has "
                                  f"{container_end - entry_pos} left")
            if flags & FLAG_ARCH_SPECIFIC:
                variant = "a"
            elif flags & FLAG_FAMILY_SPECIFIC:
                variant = "f"
            else:
                variant = ""
            yield FatbinEntry(
                target=target_for_sm(sm, _KIND_NAMES.get(kind, "unknown"), variant),
                kind_code=kind,
                flags=flags,
                code_version=(code_major, code_minor),
                offset=entry_pos,
                payload_size=padded_size,
            )
            entry_pos += entry_header_size + padded_size
        yield None
        pos = container_end


def read_fatbin(path: str | os.PathLike[str], deadline: float | None = None) -> FatbinReport:
    """The architectures the fatbinary of an ELF file carries. Never raises for a bad file: the
    report's `error` says what went wrong (not an ELF, truncated, corrupt, unreadable, out of
    time past the `time.monotonic()` deadline); the entries read before it are kept, so a report
    with an error lists a subset of what the file carries."""
    path = os.fspath(path)
    sections: list[str] = []
    entries: list[FatbinEntry] = []
    containers = 0
    size = 0
    out_of_time = False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return FatbinReport(path, error=f"cannot open: {exc.strerror or exc}")
    try:
        size = os.fstat(fd).st_size
        for name, offset, length in fatbin_sections(fd, size):
            sections.append(name)
            for entry in iter_entries(fd, offset, length, deadline):
                if entry is None:
                    containers += 1
                else:
                    entries.append(entry)
    except FatbinTimeout as exc:
        error, out_of_time = str(exc), True
    except FatbinError as exc:
        error = str(exc)
    except (OSError, struct.error) as exc:
        error = f"read failed: {exc}"
    else:
        error = None
    finally:
        os.close(fd)
    unknown = tuple(sorted({e.kind_code for e in entries if e.kind_code not in _KIND_NAMES}))
    return FatbinReport(path, size, tuple(dict.fromkeys(sections)), containers, tuple(entries),
                        error, unknown, out_of_time)
