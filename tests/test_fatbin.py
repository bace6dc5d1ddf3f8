"""Tests for gpudoctor.scan.fatbin: the fatbinary reader (on a committed nvcc-built fixture, on binaries
nvcc builds here with chosen -gencode sets, on damaged and synthetic files) and the rules that say
which GPU runs which code."""
from __future__ import annotations

import pathlib
import re
import shutil
import struct
import subprocess
import sys
import time

import pytest

from gpudoctor.scan import fatbin
from gpudoctor.scan.fatbin import CodeTarget, coverage, parse_target, read_fatbin, runs_on

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "fatbin" / "gd_add.o"
SOURCE = FIXTURE.with_suffix(".cu")


# --- a tiny ELF64 writer, for damaged and synthetic fatbins -------------------------------------


def write_elf(path: pathlib.Path, sections: list[tuple[str, int, list[tuple[int, bytes]]]]) -> None:
    """Write an ELF64 LE shared object whose sections are (name, size, [(offset, bytes)]).
    Unwritten parts stay holes (sparse), so a "1 GB" fatbin costs only its headers on disk."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    offset = 64
    placed = []
    for name, size, chunks in sections:
        offset = (offset + 7) & ~7
        placed.append((name, offset, size, chunks))
        offset += size
    strtab_off = offset
    shoff = (strtab_off + len(names) + 7) & ~7
    shnum = len(sections) + 2
    with open(path, "wb") as f:
        f.write(struct.pack("<4sBBBB8sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, bytes(8), 3, 62, 1,
                            0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1))
        headers = [bytes(64)]
        name_off = 1
        for name, off, size, chunks in placed:
            for at, data in chunks:
                f.seek(off + at)
                f.write(data)
            headers.append(struct.pack("<IIQQQQIIQQ", name_off, 1, 2, 0, off, size, 0, 0, 8, 0))
            name_off += len(name) + 1
        headers.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, strtab_off, len(names), 0, 0, 1, 0))
        f.seek(strtab_off)
        f.write(names)
        f.seek(shoff)
        f.write(b"".join(headers))


def entry_header(kind: int, sm: int, payload: int, flags: int = 0x11, code=(1, 8)) -> bytes:
    return struct.pack("<HHIIIIIHHIIIQQQ", kind, 0x101, 64, payload, 0, 0, 0, code[1], code[0], sm,
                       0, 0, flags, 0, 0)


def container(entries: list[tuple[int, int, int, int]], payload_fill: bool = True) -> bytes:
    """A fatbin container with (kind, sm, payload size, flags) entries and zeroed payloads."""
    body = b"".join(entry_header(k, sm, size, flags) + bytes(size) for k, sm, size, flags in entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


# --- the committed fixture (no nvcc needed) -------------------------------------------------------


def test_fixture_lists_exactly_the_gencode_targets():
    report = read_fatbin(FIXTURE)
    assert report.error is None
    assert report.sections == (".nv_fatbin",)
    assert report.sass == ["sm_80", "sm_90a"]
    assert report.ptx == ["compute_90"]
    assert report.containers == 1
    ptx = [e for e in report.entries if e.target.kind == "ptx"]
    # nvcc 13 compresses the PTX (zstd) and leaves small cubins alone; headers tell us either way.
    assert ptx[0].compressed and ptx[0].code_version == (9, 0)


def test_fixture_readme_names_the_command():
    readme = (FIXTURE.parent / "README.md").read_text()
    assert "nvcc" in readme and "gd_add.o" in readme and SOURCE.is_file()


@pytest.mark.parametrize("cut", [10, 100, 1000, 4000, 9000, -200])
def test_truncated_fixture_reports_an_error_and_never_raises(tmp_path, cut):
    data = FIXTURE.read_bytes()
    path = tmp_path / "cut.o"
    path.write_bytes(data[:cut])
    report = read_fatbin(path)
    assert report.error, f"cut at {cut}: {report}"
    assert re.search(r"truncated|not an ELF|corrupt", report.error)


def _section(data: bytes, name: bytes) -> tuple[int, int]:
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    for h in heads:
        if data[strtab + h[0]:].startswith(name + b"\0"):
            return h[4], h[5]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "patch, message",
    [
        (lambda b, s: struct.pack_into("<I", b, s, 0xDEADBEEF), "magic 0xdeadbeef"),
        (lambda b, s: struct.pack_into("<Q", b, s + 8, 1 << 40), "truncated fatbin"),
        (lambda b, s: struct.pack_into("<I", b, s + 16 + 8, 1 << 30), "corrupt fatbin: entry"),
        (lambda b, s: struct.pack_into("<I", b, s + 16 + 4, 8), "corrupt fatbin: entry"),
    ],
    ids=["bad-magic", "container-too-long", "payload-too-long", "entry-header-too-short"],
)
def test_corrupt_fatbin_headers_give_clear_errors(tmp_path, patch, message):
    data = bytearray(FIXTURE.read_bytes())
    start, _size = _section(bytes(data), b".nv_fatbin")
    patch(data, start)
    path = tmp_path / "bad.o"
    path.write_bytes(bytes(data))
    report = read_fatbin(path)
    assert report.error is not None and message in report.error


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not an ELF"),
        (b"\x00" * 100, "not an ELF"),
        (bytes(range(256)) * 8, "not an ELF"),
        (b"\x7fELF\x01\x01\x01" + bytes(100), "64-bit little-endian"),
        (b"\x7fELF\x02\x02\x01" + bytes(100), "64-bit little-endian"),
    ],
)
def test_junk_bytes_are_reported_not_raised(tmp_path, content, message):
    path = tmp_path / "junk.so"
    path.write_bytes(content)
    report = read_fatbin(path)
    assert report.error is not None and message in report.error
    assert report.entries == () and not report.has_fatbin


def test_deadline_stops_the_walk_with_a_partial_listing():
    report = read_fatbin(FIXTURE, deadline=time.monotonic() - 1.0)
    assert "out of time" in report.error and report.entries == ()


def test_entries_before_the_damage_are_kept(tmp_path):
    data = bytearray(FIXTURE.read_bytes())
    ptx = read_fatbin(FIXTURE).entries[2]
    struct.pack_into("<I", data, ptx.offset + 4, 8)  # the PTX entry's header size
    path = tmp_path / "partial.o"
    path.write_bytes(bytes(data))
    report = read_fatbin(path)
    assert "corrupt fatbin: entry" in report.error
    assert report.sass == ["sm_80", "sm_90a"] and report.ptx == []


def test_missing_file_is_an_error_result(tmp_path):
    assert "cannot open" in read_fatbin(tmp_path / "nope.so").error


def test_elf_without_fatbin_is_fine(tmp_path):
    path = tmp_path / "plain.so"
    write_elf(path, [(".text", 16, [(0, b"\xc3" * 16)])])
    report = read_fatbin(path)
    assert report.error is None and not report.has_fatbin and report.targets == ()
    # And a real one: the interpreter running these tests (an ELF on Linux).
    exe = pathlib.Path(sys.executable).resolve()
    with open(exe, "rb") as f:
        is_elf = f.read(4) == b"\x7fELF"
    if is_elf:
        real = read_fatbin(exe)
        assert real.error is None and not real.has_fatbin


def test_synthetic_containers_with_padding_and_flags(tmp_path):
    first = container([(2, 75, 24, 0x11), (1, 75, 8, 0x8011)])
    second = container([(2, 100, 16, 0x1200011), (1, 120, 40, 0x108011), (8, 90, 8, 0x18011)])
    # Eight zero bytes between containers are tolerated (alignment padding).
    blob = first + bytes(8) + second
    path = tmp_path / "syn.so"
    write_elf(path, [(".text", 16, [(0, b"\xc3" * 16)]), (".nv_fatbin", len(blob), [(0, blob)])])
    report = read_fatbin(path)
    assert report.error is None, report.error
    assert report.containers == 2
    assert report.sass == ["sm_75", "sm_100f"]
    assert report.ptx == ["compute_75", "compute_120a"]
    assert report.lto == ["lto_90"]
    assert [e.compressed for e in report.entries] == [False, True, False, True, True]


def test_unknown_entry_kinds_are_kept_apart(tmp_path):
    blob = container([(2, 86, 8, 0x11), (0x40, 90, 8, 0x11)])
    path = tmp_path / "kinds.so"
    write_elf(path, [(".nv_fatbin", len(blob), [(0, blob)])])
    report = read_fatbin(path)
    assert report.sass == ["sm_86"] and report.ptx == []
    assert report.unknown_kinds == (0x40,)
    assert not any(runs_on(e.target, (9, 0)) for e in report.entries if e.kind_code == 0x40)


def write_big_fatbin(path: pathlib.Path) -> None:
    """A libtorch_cuda.so-sized file: 2000 containers of 6 entries with 80 KiB payloads each
    (~0.9 GiB, sparse on disk). Also read by benchmarks/bench_test_limits.py."""
    arches = [(2, 75), (2, 80), (2, 86), (2, 90), (2, 100), (1, 120)]
    payload = 80 << 10
    one = 16 + len(arches) * (64 + payload)
    chunks = []
    for c in range(2000):
        base = c * one
        chunks.append((base, struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, one - 16)))
        for i, (kind, sm) in enumerate(arches):
            chunks.append((base + 16 + i * (64 + payload), entry_header(kind, sm, payload)))
    write_elf(path, [(".nv_fatbin", 2000 * one, chunks)])


def test_large_sparse_fatbin_reads_only_headers_fast(tmp_path):
    path = tmp_path / "libbig.so"
    write_big_fatbin(path)
    assert path.stat().st_size > 900 << 20
    report = read_fatbin(path)  # only the headers are read; its speed is measured in benchmarks/
    assert report.error is None
    assert report.containers == 2000 and len(report.entries) == 12000
    assert report.sass == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100"]
    assert report.ptx == ["compute_120"]


# --- the compatibility rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, capability, expected",
    [
        ("sm_86", (8, 6), True),
        ("sm_86", (8, 9), True),  # same major, higher minor
        ("sm_86", (8, 0), False),  # never backwards
        ("sm_86", (9, 0), False),  # never across majors
        ("sm_80", (8, 7), True),
        ("sm_90", (10, 0), False),
        ("sm_120", (12, 1), True),
        ("compute_80", (12, 0), True),  # PTX JIT forward, across majors
        ("compute_80", (9, 0), True),
        ("compute_80", (7, 5), False),
        ("compute_90", (8, 9), False),
        ("compute_120", (12, 0), True),
        ("sm_90a", (9, 0), True),  # arch-specific: exactly that arch
        ("sm_90a", (10, 0), False),
        ("compute_90a", (9, 0), True),
        ("compute_90a", (10, 0), False),  # arch-specific PTX does not JIT forward
        ("sm_100a", (10, 3), False),
        ("sm_120a", (12, 1), False),
        ("sm_100f", (10, 0), True),  # family-specific: same major, minor at or above
        ("sm_100f", (10, 3), True),
        ("sm_103f", (10, 0), False),
        ("sm_100f", (11, 0), False),
        ("sm_100f", (12, 0), False),
        ("compute_100f", (10, 3), True),
        ("compute_100f", (12, 0), False),
        ("lto_90", (9, 0), False),  # LTO-IR must be linked first
    ],
)
def test_runs_on_rule_table(target, capability, expected):
    assert runs_on(parse_target(target), capability) is expected


def test_parse_target_round_trips_and_rejects_junk():
    for name in ("sm_75", "sm_90a", "sm_100f", "compute_80", "compute_121", "lto_90"):
        assert parse_target(name).name == name
    assert parse_target("sm_121") == CodeTarget(12, 1, "sass", "")
    for junk in ("sm90", "gfx90a", "sm_90x", "", "compute_"):
        with pytest.raises(ValueError):
            parse_target(junk)


def test_coverage_prefers_closest_sass_then_newest_ptx():
    targets = [parse_target(n) for n in ("sm_80", "sm_86", "sm_90a", "compute_80", "compute_90")]
    assert coverage(targets, (8, 9)).native.name == "sm_86"
    assert coverage(targets, (9, 0)).native.name == "sm_90a"
    jit = coverage(targets, (12, 0))
    assert jit.verdict == "jit" and jit.jit.name == "compute_90"
    none = coverage(targets, (7, 5))
    assert none.verdict == "none" and not none.ok
    assert none.describe() == "no code for sm_75"


def test_describe_and_supported_capabilities():
    targets = [parse_target(n) for n in ("sm_90", "sm_80", "compute_90", "sm_90a")]
    assert fatbin.describe_targets(targets) == "SASS sm_80, sm_90, sm_90a and PTX compute_90"
    assert fatbin.describe_targets([]) == "no SASS or PTX"
    caps = fatbin.supported_capabilities(targets)
    assert caps[:5] == ["8.0", "8.6", "8.7", "8.8", "8.9"]
    assert "9.0" in caps and "10.0 (JIT)" in caps and "12.1 (JIT)" in caps and "7.5" not in caps


# --- nvcc-built binaries ----------------------------------------------------------------------------

BUILDS = {
    # name: (-gencode sets and options, expected SASS, expected PTX, all entries compressed?)
    "mixed": (["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90"],
              ["sm_80"], ["compute_90"], None),
    "specific": (["-gencode", "arch=compute_90a,code=sm_90a",
                  "-gencode", "arch=compute_100f,code=[sm_100f,compute_100f]", "-compress-mode=none"],
                 ["sm_90a", "sm_100f"], ["compute_100f"], False),
    "blackwell": (["-gencode", "arch=compute_120,code=[sm_120,compute_120]", "-Xfatbin", "-compress-all"],
                  ["sm_120"], ["compute_120"], True),
}


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("nvcc")
    built = {}
    for name, (flags, *_rest) in BUILDS.items():
        lib = out / f"lib{name}.so"
        cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-o", str(lib), str(SOURCE), *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        built[name] = lib
    return built


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(BUILDS))
def test_parser_reports_exactly_what_nvcc_was_asked_for(nvcc_builds, name):
    _flags, sass, ptx, compressed = BUILDS[name]
    report = read_fatbin(nvcc_builds[name])
    assert report.error is None
    assert report.sass == sass
    assert report.ptx == ptx
    # nvcc links a device-link stub into every shared library: a second container, same arches.
    assert report.containers >= 1
    if compressed is not None:
        assert all(e.compressed is compressed for e in report.entries)


@pytest.mark.nvcc
def test_cross_check_with_cuobjdump(nvcc_builds):
    tool = shutil.which("cuobjdump") or (
        "/usr/local/cuda/bin/cuobjdump" if pathlib.Path("/usr/local/cuda/bin/cuobjdump").exists() else None)
    if tool is None:
        pytest.skip("cuobjdump is not installed with this CUDA toolkit")
    for name, lib in nvcc_builds.items():
        elf = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True).stdout
        ptx = subprocess.run([tool, "--list-ptx", str(lib)], capture_output=True, text=True).stdout
        listed_sass = {f"sm_{m}" for m in re.findall(r"\.sm_(\d+[af]?)\.cubin", elf)}
        listed_ptx = {f"compute_{m}" for m in re.findall(r"\.(?:sm|compute)_(\d+[af]?)\.ptx", ptx)}
        report = read_fatbin(lib)
        assert set(report.sass) == listed_sass, (name, elf)
        assert set(report.ptx) == listed_ptx, (name, ptx)
