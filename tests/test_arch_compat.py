"""Tests for the `arch-compat` probe: discovery of CUDA binaries in a (temporary) environment, the
listing it gives without a GPU, and the verdicts it gives for a GPU of a given capability.

The verdict path needs a capability; this machine has no GPU, so those tests hand the probe a
stand-in torch module that answers `get_device_capability` and `get_arch_list` as a CUDA build
would. The scanning, parsing and judging code that runs is the real one."""
from __future__ import annotations

import os
import pathlib
import shutil
import struct
import subprocess
import sys
import types

import pytest

from gpudoctor.scan import fatbin
from gpudoctor.probes import arch_compat
from gpudoctor.probes.base import ProbeContext, Status

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "fatbin" / "gd_add.o"  # sm_80, sm_90a, compute_90


def fake_torch(capability, arch_list, tmp_path, version="2.13.0+cu130", cuda="13.0"):
    """A module that answers what arch-compat asks of a CUDA torch build."""
    cuda_ns = types.SimpleNamespace(
        get_arch_list=lambda: list(arch_list),
        get_device_capability=lambda device=None: capability,
        get_device_name=lambda device=None: "Test GPU",
    )
    torch_dir = tmp_path / "faketorch"
    torch_dir.mkdir(exist_ok=True)
    return types.SimpleNamespace(
        __version__=version,
        __file__=str(torch_dir / "__init__.py"),
        version=types.SimpleNamespace(cuda=cuda),
        cuda=cuda_ns,
        _C=types.SimpleNamespace(),
    )


@pytest.fixture
def env(tmp_path):
    """A site-packages folder with an xformers build (the fixture), a damaged flash_attn build,
    a plain Python extension, NVIDIA's own folder (to be skipped), and a torch extension."""
    site = tmp_path / "site-packages"
    (site / "xformers").mkdir(parents=True)
    shutil.copy(FIXTURE, site / "xformers" / "_C.so")
    (site / "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so").write_bytes(FIXTURE.read_bytes()[:5000])
    (site / "numpyish").mkdir()
    (site / "numpyish" / "core.so").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(200))
    (site / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    shutil.copy(FIXTURE, site / "nvidia" / "cublas" / "lib" / "libcublas.so.13")
    (site / "somepkg").mkdir()
    shutil.copy(FIXTURE, site / "somepkg" / "_kernels.so")
    ext = tmp_path / "torch_extensions" / "py311_cu130" / "my_op"
    ext.mkdir(parents=True)
    shutil.copy(FIXTURE, ext / "my_op.so")
    return {"arch_compat_roots": [str(site)], "arch_compat_extension_dirs": [str(tmp_path / "torch_extensions")]}


def names(outcome):
    return {lib["name"]: lib for lib in outcome.details["libraries"]}


def test_spec_is_per_device_and_emits_no_kernel_image():
    spec = arch_compat.SPEC
    assert spec.id == "arch-compat" and spec.per_device
    assert spec.emits == ("no-kernel-image",)
    assert "cuda" not in spec.needs  # it has something to say on a CPU-only machine too


def test_module_import_does_not_import_torch():
    code = "import sys, gpudoctor.probes.arch_compat; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_gpu_lists_what_each_library_carries(env, tmp_path):
    ctx = ProbeContext(torch=fake_torch(None, ["sm_80", "sm_90", "compute_90"], tmp_path),
                       device="cpu", options=env)
    out = arch_compat.run(ctx)
    assert out.status is Status.SKIPPED and "no CUDA device" in out.summary
    assert "torch carries SASS sm_80, sm_90 and PTX compute_90" in out.summary
    libs = names(out)
    xf = libs[os.path.join("xformers", "_C.so")]
    assert xf["package"] == "xformers"
    assert xf["sass"] == ["sm_80", "sm_90a"] and xf["ptx"] == ["compute_90"]
    assert xf["runs_on"][:2] == ["8.0", "8.6"] and "12.0 (JIT)" in xf["runs_on"]
    assert libs["torch_extensions/" + os.path.join("py311_cu130", "my_op", "my_op.so")]["sass"]
    assert os.path.join("somepkg", "_kernels.so") in libs  # found by the generic walk
    damaged = libs["flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"]
    assert damaged["package"] == "flash_attn" and "truncated" in damaged["error"]
    assert not any("nvidia" in name for name in libs)
    assert not any("numpyish" in name for name in libs)  # an ELF without fatbin is not listed
    assert out.details["torch"]["runs_on"][0] == "8.0"
    assert out.to_dict()["status"] == "skipped"  # JSON-serialisable


@pytest.mark.torch
def test_real_torch_on_cpu_skips_with_reason():
    import torch

    out = arch_compat.run(ProbeContext(torch=torch, device="cpu",
                                       options={"arch_compat_extension_dirs": []}))
    assert out.status is Status.SKIPPED and out.summary
    assert out.details["torch"]["version"] == torch.__version__
    if torch.version.cuda is None:
        assert "CPU-only" in out.summary


@pytest.mark.parametrize(
    "capability, arch_list, status, needles",
    [
        # 9.0: torch has sm_90, the extensions sm_90a SASS.
        ((9, 0), ["sm_80", "sm_90"], Status.PASS, []),
        # 8.9: sm_80 SASS runs on 8.9 (same major, higher minor).
        ((8, 9), ["sm_80", "sm_86"], Status.PASS, []),
        # 12.0: extensions only by JIT from compute_90 PTX; torch has nothing for sm_120.
        ((12, 0), ["sm_80", "sm_86"], Status.FAIL,
         ["torch 2.13.0+cu130 has no code for sm_120: it carries SASS sm_80, sm_86"]),
        # 10.0 with a torch that has it: only the JIT warnings remain.
        ((10, 0), ["sm_100", "compute_100"], Status.WARN,
         ["has no SASS for sm_100: it runs only by JIT-compiling compute_90 PTX"]),
        # 7.5: nothing anywhere.
        ((7, 5), ["sm_80"], Status.FAIL,
         ["_C.so has no code for sm_75: it carries SASS sm_80, sm_90a and PTX compute_90"]),
    ],
)
def test_verdicts_for_a_gpu(env, tmp_path, capability, arch_list, status, needles):
    damaged = pathlib.Path(env["arch_compat_roots"][0]) / "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"
    damaged.unlink()
    ctx = ProbeContext(torch=fake_torch(capability, arch_list, tmp_path), device="cuda:0", options=env)
    out = arch_compat.run(ctx)
    summaries = [f.summary for f in out.findings]
    assert out.status is status, (out.summary, summaries)
    for needle in needles:
        assert any(needle in s for s in summaries), summaries
    assert all(f.kb_id == "no-kernel-image" for f in out.findings)
    assert out.details["capability"] == f"{capability[0]}.{capability[1]}"


def test_damaged_binary_alone_warns_not_passes(env, tmp_path):
    ctx = ProbeContext(torch=fake_torch((9, 0), ["sm_90"], tmp_path), device="cuda:0", options=env)
    out = arch_compat.run(ctx)
    # Everything readable runs natively on 9.0, but one file could not be read: that is a
    # warning, with no verdict and no exception for the file.
    assert out.status is Status.WARN and "could not be read" in out.summary
    assert out.findings == []
    damaged = names(out)["flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"]
    assert damaged["verdict"] is None and "truncated" in damaged["error"]


@pytest.mark.parametrize(
    "capability, verdict",
    [((9, 0), "native (sm_90a)"), ((12, 0), None), ((7, 5), None)],
)
def test_partly_read_binary_is_judged_only_on_what_it_proves(tmp_path, capability, verdict):
    # The PTX entry's header is damaged: SASS sm_80 and sm_90a were read, compute_90 was not.
    # Covered by what was read: a verdict. Not covered: unknown, never a no-kernel-image finding.
    site = tmp_path / "site-packages"
    (site / "xformers").mkdir(parents=True)
    data = bytearray(FIXTURE.read_bytes())
    struct.pack_into("<I", data, fatbin.read_fatbin(FIXTURE).entries[2].offset + 4, 8)
    (site / "xformers" / "_C.so").write_bytes(bytes(data))
    options = {"arch_compat_roots": [str(site)], "arch_compat_extension_dirs": []}
    ctx = ProbeContext(torch=fake_torch(capability, ["sm_75", "sm_90", "compute_120"], tmp_path),
                       device="cuda:0", options=options)
    out = arch_compat.run(ctx)
    lib = names(out)[os.path.join("xformers", "_C.so")]
    assert lib["error"] and lib["verdict"] == verdict
    assert not any("xformers" in f.summary for f in out.findings)
    assert out.status is Status.WARN and "could not be read in full" in out.summary


def test_findings_carry_evidence(env, tmp_path):
    ctx = ProbeContext(torch=fake_torch((7, 5), ["sm_80"], tmp_path), device="cuda:0", options=env)
    out = arch_compat.run(ctx)
    xf = next(f for f in out.findings if f.summary.startswith(os.path.join("xformers", "_C.so")))
    assert xf.severity == "error"
    assert any("compute capability 7.5" in e for e in xf.evidence)
    assert any(e.endswith(os.path.join("xformers", "_C.so")) for e in xf.evidence)
    assert any(e.startswith("runs on 8.0, 8.6") for e in xf.evidence)


def test_scan_budget_and_size_limit(env, tmp_path):
    roots = env["arch_compat_roots"]
    scan = arch_compat.scan_binaries(roots, [], max_files=1)
    assert scan.truncated and scan.examined == 1
    scan = arch_compat.scan_binaries(roots, [], size_limit=1024)
    # The generic walk leaves big unknown files out; known packages are read whatever their size.
    assert any(entry.startswith(os.path.join("somepkg", "_kernels.so")) for entry in scan.left_out)
    assert any(c.package == "xformers" for c, _ in scan.reports)


def test_extension_dirs_follow_the_environment(monkeypatch, tmp_path):
    custom = tmp_path / "exts"
    custom.mkdir()
    cache = tmp_path / "cache"
    (cache / "torch_extensions").mkdir(parents=True)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(custom))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert arch_compat.extension_dirs() == [str(custom), str(cache / "torch_extensions")]


def test_broken_arch_list_is_reported_not_raised(tmp_path):
    torch = fake_torch((9, 0), [], tmp_path)

    def boom():
        raise RuntimeError("CUDA driver initialization failed")

    torch.cuda.get_arch_list = boom
    arches, reason = arch_compat.torch_arch_list(torch)
    assert arches == [] and "RuntimeError: CUDA driver initialization failed" in reason


def _retarget(data: bytes, entry: int, sm: int) -> bytes:
    """The fixture with one fatbin entry's architecture changed (the entry header's sm field),
    as another build of the same source would carry; flags keep their meaning."""
    out = bytearray(data)
    offset = fatbin.read_fatbin(FIXTURE).entries[entry].offset
    struct.pack_into("<I", out, offset + 28, sm)
    struct.pack_into("<Q", out, offset + 40, 0)  # a plain (not arch-specific) target
    return bytes(out)


@pytest.fixture
def bnb_site(tmp_path):
    """bitsandbytes 0.50-style per-CUDA builds: cuda126 with SASS sm_80/sm_90a and PTX
    compute_90 (JIT only on sm_120), cuda128 and cuda130 with SASS sm_120."""
    site = tmp_path / "site-packages"
    pkg = site / "bitsandbytes"
    pkg.mkdir(parents=True)
    data = FIXTURE.read_bytes()
    (pkg / "libbitsandbytes_cuda126.so").write_bytes(data)
    for ver in ("128", "130"):
        (pkg / f"libbitsandbytes_cuda{ver}.so").write_bytes(_retarget(data, 0, 120))
    return {"arch_compat_roots": [str(site)], "arch_compat_extension_dirs": []}


def test_only_the_per_cuda_build_torch_loads_is_judged(bnb_site, tmp_path, monkeypatch):
    # Audit D16: on an RTX 5090 the unused cuda118..126 builds made arch-compat warn.
    monkeypatch.delenv("BNB_CUDA_VERSION", raising=False)
    torch = fake_torch((12, 0), ["sm_90", "sm_120"], tmp_path, cuda="13.0")
    out = arch_compat.run(ProbeContext(torch=torch, device="cuda:0", options=bnb_site))
    assert out.status is Status.PASS and out.findings == [], out.summary
    libs = {os.path.basename(lib["path"]): lib for lib in out.details["libraries"]}
    assert libs["libbitsandbytes_cuda130.so"]["verdict"] == "native (sm_120)"
    assert libs["libbitsandbytes_cuda126.so"]["verdict"] is None
    assert "libbitsandbytes_cuda130.so is the build loaded for torch's CUDA 13.0" in \
        libs["libbitsandbytes_cuda126.so"]["not_loaded"]
    assert "2 builds for other CUDA versions not judged" in out.summary


def test_bnb_cuda_version_override_picks_the_judged_build(bnb_site, tmp_path, monkeypatch):
    monkeypatch.setenv("BNB_CUDA_VERSION", "126")
    torch = fake_torch((12, 0), ["sm_90", "sm_120"], tmp_path, cuda="13.0")
    out = arch_compat.run(ProbeContext(torch=torch, device="cuda:0", options=bnb_site))
    assert out.status is Status.WARN
    (finding,) = out.findings
    assert finding.summary.startswith("bitsandbytes/libbitsandbytes_cuda126.so has no SASS for sm_120")


@pytest.mark.parametrize("torch_cuda, versions, chosen", [
    ("13.0", ["118", "126", "130"], "130"),
    ("12.8", ["118", "126", "130"], "126"),  # highest at or below, same major
    ("12.0", ["121", "126"], "121"),  # else the lowest above, same major
    ("12.4", ["118", "130"], None),  # never across majors
    (None, ["126"], None),
])
def test_loaded_variant_follows_bitsandbytes(torch_cuda, versions, chosen):
    assert arch_compat.loaded_variant(versions, torch_cuda) == chosen


def test_a_partly_covered_package_is_a_warning(tmp_path):
    # Audit D23: torch 2.11's libtorch_cuda_linalg.so has no sm_75 although torch's arch list
    # (and libtorch_cuda.so) has it: linalg calls fail on a T4, the rest of torch works.
    torch = fake_torch((7, 5), ["sm_75", "sm_80", "sm_90"], tmp_path)
    lib = tmp_path / "faketorch" / "lib"
    lib.mkdir()
    data = FIXTURE.read_bytes()
    (lib / "libtorch_cuda.so").write_bytes(_retarget(data, 0, 75))
    (lib / "libtorch_cuda_linalg.so").write_bytes(data)
    options = {"arch_compat_roots": [], "arch_compat_extension_dirs": []}
    out = arch_compat.run(ProbeContext(torch=torch, device="cuda:0", options=options))
    assert out.status is Status.WARN, out.summary
    (finding,) = out.findings
    assert finding.severity == "warning"
    assert finding.summary.startswith("torch/lib/libtorch_cuda_linalg.so has no code for sm_75")
    assert "the rest of torch runs here" in finding.summary
    assert "in part of a package: torch/lib/libtorch_cuda_linalg.so" in out.summary


def test_a_read_cut_by_our_time_budget_is_no_warning(env, tmp_path, monkeypatch):
    # Audit D24: a cold 284 MiB .nv_fatbin on a network filesystem can outlast the budget. The
    # slow filesystem is simulated by fatbin's clock running past every deadline while reading.
    damaged = pathlib.Path(env["arch_compat_roots"][0]) / "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"
    damaged.unlink()
    late = types.SimpleNamespace(monotonic=lambda: float("inf"))
    monkeypatch.setattr(fatbin, "time", late)
    ctx = ProbeContext(torch=fake_torch((9, 0), ["sm_80", "sm_90"], tmp_path), device="cuda:0", options=env)
    out = arch_compat.run(ctx)
    assert out.status is Status.PASS, out.summary
    assert out.findings == []
    assert out.details["scan"]["not_read_in_full"]
    assert "not read in full within the time budget" in out.summary
    assert all(lib["out_of_time"] for lib in out.details["libraries"])


@pytest.mark.gpu
def test_real_gpu_gives_a_verdict():
    import torch

    out = arch_compat.run(ProbeContext(torch=torch, device="cuda:0"))
    major, minor = torch.cuda.get_device_capability(0)
    assert out.details["capability"] == f"{major}.{minor}"
    assert out.details["torch"]["verdict"] is not None
    if (major, minor) == (9, 0):
        # The audit's H100 verdict with torch 2.11: everything carries sm_90 SASS.
        assert out.status is Status.PASS and out.findings == [], out.summary
