"""Tests for the environment report: the parent half (gpudoctor.scan.environment, no torch) against this
interpreter, broken interpreters and a fake NVML library, and the worker half
(gpudoctor.scan.torchenv) against the real torch installed here and synthetic library layouts."""
from __future__ import annotations

import importlib.metadata
import os
import stat
import sys
import threading
import time
import types

import pytest

from gpudoctor.scan import environment as envmod
from gpudoctor.scan import torchenv
from gpudoctor.scan.environment import (
    collect_environment,
    decode_throttle,
    detect_container,
    detect_wsl,
    merge_environment,
    nvml_device_count,
    nvml_info,
)
from gpudoctor.scan.torchenv import cuda_libraries, cuda_unavailable_reason, env_vars, parse_maps, torch_environment


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# --- parent side: the target interpreter ---------------------------------------------------------


@pytest.mark.torch
def test_collect_environment_reads_this_interpreter():
    env = collect_environment(sys.executable)
    assert set(env) == {"system", "python", "packages", "nvml", "toolchain", "env_vars", "fleet"}
    assert env["python"]["version"] == sys.version.split()[0]
    assert env["python"]["same_as_cli"] is True
    installed = env["packages"]["installed"]
    assert installed["torch"]["version"] == importlib.metadata.version("torch")
    assert installed["nvidia-ml-py"]["version"] == importlib.metadata.version("nvidia-ml-py")
    assert "xformers" in env["packages"]["not_installed"] or "xformers" in installed
    assert env["python"]["origins"]["torch"].endswith(os.path.join("torch", "__init__.py"))
    system = env["system"]
    assert system["kernel"] and system["os"] == "Linux"
    assert isinstance(system["container"]["detected"], bool)
    assert "hostname" not in system and "node" not in system


def test_collect_environment_does_not_import_torch_in_the_parent(tmp_path):
    # A fresh interpreter: importing and running the collector must leave torch unimported.
    import subprocess

    code = (
        "import sys; from gpudoctor.scan.environment import collect_environment; "
        f"collect_environment({sys.executable!r}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_missing_interpreter_is_a_reported_state(tmp_path):
    env = collect_environment(str(tmp_path / "no-such-python"))
    assert env["python"] == {"available": False, "reason": f"interpreter {tmp_path / 'no-such-python'} not found"}
    assert env["packages"]["available"] is False
    assert env["system"]["os"] == "Linux"  # the rest is still collected


def test_hanging_interpreter_is_bounded_by_the_timeout(tmp_path):
    python = _script(tmp_path, "exec sleep 30")
    env = collect_environment(python, timeout=0.5)  # speed lives in benchmarks/, not in asserts
    assert env["python"]["available"] is False
    assert "did not answer within 0.5 s" in env["python"]["reason"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ("echo 'hello, not json'", "printed no JSON"),
        ("echo 'ImportError: broken site' >&2; exit 3", "exited with code 3: ImportError: broken site"),
    ],
)
def test_broken_interpreter_output_is_explained(tmp_path, body, expected):
    env = collect_environment(_script(tmp_path, body), timeout=5)
    assert env["python"]["available"] is False
    assert expected in env["python"]["reason"]


def test_merge_environment_prefers_the_worker_and_explains_its_absence():
    parent = {"system": {"os": "Linux"}, "env_vars": {"A": "parent"}}
    merged = merge_environment(parent, {"torch": {"version": "x"}, "env_vars": {"A": "worker"}, "cuda_libraries": {}})
    assert merged["env_vars"] == {"A": "worker"} and merged["torch"] == {"version": "x"}
    failed = merge_environment(parent, {"torch": {"available": False, "reason": "ImportError: libcudart.so.12"}})
    assert failed["torch"]["reason"] == "ImportError: libcudart.so.12"
    assert failed["cuda_libraries"]["available"] is False
    alone = merge_environment(parent, None)
    assert alone["torch"]["available"] is False and "worker" in alone["torch"]["reason"]
    assert parent == {"system": {"os": "Linux"}, "env_vars": {"A": "parent"}}


def test_tool_versions_are_parsed_and_a_hanging_tool_is_cut_off(tmp_path):
    nvcc = _script(tmp_path, 'echo "nvcc: NVIDIA (R) Cuda compiler driver"; '
                             'echo "Cuda compilation tools, release 13.0, V13.0.88"')
    assert envmod.tool_version(nvcc) == {"path": nvcc, "version": "13.0.88",
                                         "banner": "nvcc: NVIDIA (R) Cuda compiler driver"}
    # A wrapper that hangs with a child of its own: at the deadline both are killed.
    hang = _script(tmp_path, "sleep 297.125 & wait")
    got = envmod.tool_version(hang, timeout=0.5)
    assert got["available"] is False and "did not answer within 0.5 s" in got["reason"]
    assert _processes_running(b"sleep\x00297.125\x00") == []


def _processes_running(cmdline: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if fh.read() == cmdline:
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


# --- parent side: container and WSL --------------------------------------------------------------


def test_detect_container_and_wsl_from_a_fake_root(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("container", raising=False)
    bare = tmp_path / "bare"
    (bare / "proc" / "sys" / "kernel").mkdir(parents=True)
    (bare / "proc" / "sys" / "kernel" / "osrelease").write_text("6.8.0-45-generic\n")
    assert detect_container(str(bare)) == {"detected": False, "kind": None, "evidence": []}
    assert detect_wsl(str(bare)) == {"detected": False}

    root = tmp_path / "wsl"
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text("5.15.153.1-microsoft-standard-WSL2\n")
    (root / "proc" / "1").mkdir()
    (root / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1234\n")
    (root / ".dockerenv").write_text("")
    (root / "dev").mkdir()
    (root / "dev" / "dxg").write_text("")
    container = detect_container(str(root))
    assert container["detected"] and container["kind"] == "docker"
    assert "/proc/1/cgroup mentions kubepods" in container["evidence"]
    assert detect_wsl(str(root)) == {"detected": True, "version": 2, "gpu_forwarded": True, "driver_libcuda": False}


# --- parent side: NVML through a fake pynvml -----------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _fake_pynvml(*, init_error: int | None = None, init_delay: float = 0.0) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC = 0, 1
    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nv.NVML_TEMPERATURE_GPU = 0
    nv.calls = {"init": 0, "shutdown": 0}

    def init():
        nv.calls["init"] += 1
        if init_delay:
            time.sleep(init_delay)
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def not_supported(*_):
        raise FakeNVMLError(3)

    gpus = [
        {"name": b"NVIDIA H100 80GB HBM3", "cc": (9, 0), "free": 80 << 30, "ecc": [1, 1], "reasons": 0x1 | 0x4 | 0x40, "procs": 2},
        {"name": "NVIDIA GeForce RTX 4090", "cc": (8, 9), "free": 20 << 30, "ecc": None, "reasons": 0x0, "procs": 0},
    ]
    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: nv.calls.__setitem__("shutdown", nv.calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    nv.nvmlSystemGetNVMLVersion = lambda: b"12.550.54.15"
    nv.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nv.nvmlDeviceGetName = lambda h: h["name"]
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: h["cc"]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["free"] + (1 << 30), used=1 << 30, free=h["free"])
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [object()] * h["procs"]
    nv.nvmlDeviceGetEccMode = lambda h: h["ecc"] if h["ecc"] else not_supported()
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 7 if (kind, counter) == (1, 0) else 0
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: h["reasons"]
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 8
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 45
    nv.nvmlDeviceGetPersistenceMode = not_supported
    return nv


def test_nvml_info_decodes_every_field(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = nvml_info()
    assert info["available"] is True
    assert info["driver_version"] == "550.54.15"
    assert info["cuda_driver_version"] == "12.4"
    assert info["nvml_version"] == "12.550.54.15"
    h100, ada = info["gpus"]
    assert h100["name"] == "NVIDIA H100 80GB HBM3" and h100["capability"] == "9.0"
    assert h100["memory"] == {"total": (81 << 30), "used": 1 << 30, "free": 80 << 30}
    assert h100["compute_processes"] == 2
    assert h100["ecc"]["enabled"] is True and h100["ecc"]["volatile_uncorrected"] == 7
    assert h100["ecc"]["aggregate_uncorrected"] == 0
    assert h100["throttle_reasons"] == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert h100["pcie"] == {"gen": 4, "max_gen": 5, "width": 8, "max_width": 16}
    assert h100["persistence_mode"] == "not available: NVML: not supported on this GPU"
    assert ada["ecc"] == "not available: NVML: not supported on this GPU"
    assert ada["throttle_reasons"] == []
    # Identifiers a report must not carry are never collected.
    assert not {"uuid", "serial", "pci_bus_id", "bus_id"} & set(h100)
    assert fake.calls["shutdown"] == fake.calls["init"] == 1


def gpu_free_memory(index: int) -> int | None:
    """Free bytes on NVML device `index`, read as the runner reads it: through an NvmlSession."""
    session = envmod.NvmlSession()
    try:
        return session.free_memory(("index", index))
    finally:
        session.close()


def test_gpu_free_memory_and_device_count_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    assert gpu_free_memory(1) == 20 << 30
    assert gpu_free_memory(5) is None  # no such device: None, not IndexError
    assert nvml_device_count() == 2


@pytest.mark.parametrize(
    "code, reason",
    [
        (12, "libnvidia-ml.so.1 not found"),
        (9, "kernel driver is not loaded"),
        (18, "driver and libnvidia-ml versions differ"),
    ],
)
def test_nvml_failures_are_reported_states(monkeypatch, code, reason):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=code))
    info = nvml_info()
    assert info["available"] is False and reason in info["reason"]
    assert gpu_free_memory(0) is None
    assert nvml_device_count() is None


def test_missing_nvidia_ml_py_is_a_reported_state(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    info = nvml_info()
    assert info == {"available": False, "reason": "nvidia-ml-py (pynvml) is not installed in gpudoctor's environment"}
    assert gpu_free_memory(0) is None and nvml_device_count() is None


def test_real_nvml_never_raises():
    info = nvml_info()
    assert info.get("available") is True or info["reason"]
    count = nvml_device_count()
    assert count is None or count >= 0


def test_a_wedged_nvml_is_cut_off(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_delay=3.0))
    info = nvml_info(timeout=0.2)  # cut off: the reason says so, and the thread is left behind
    assert info["available"] is False and "did not answer within 0.2 s" in info["reason"]
    assert any(t.name == "gpudoctor-nvml" and t.daemon for t in threading.enumerate())


def test_decode_throttle_names_bits_and_keeps_unknown_ones():
    assert decode_throttle(0) == []
    assert decode_throttle(0x4 | 0x8 | 0x100) == ["sw_power_cap", "hw_slowdown", "display_clock_setting"]
    assert decode_throttle(0x20 | 0x10000) == ["sw_thermal_slowdown", "0x10000"]


# --- worker side: torch --------------------------------------------------------------------------


def test_torch_environment_on_this_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("XFORMERS_FORCE_DISABLE_TRITON", "1")
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "x")
    env = torch_environment(torch)
    assert set(env) == {"torch", "cuda_libraries", "env_vars"}
    t = env["torch"]
    assert t["version"] == torch.__version__
    assert t["built_with_cuda"] == torch.version.cuda
    assert t["cuda_available"] == torch.cuda.is_available()
    assert t["arch_list"] == torch.cuda.get_arch_list()
    assert t["sdp"]["math_enabled"] == torch.backends.cuda.math_sdp_enabled()
    if not torch.cuda.is_available():
        assert t["devices"] == [] and t["cuda_unavailable_reason"]
        # Asking must not have initialised CUDA.
        assert not torch.cuda.is_initialized()
    if torch.version.cuda is None:
        assert t["cuda_unavailable_reason"].startswith("CPU-only build of torch")
        assert t["cudnn"] == "not available: torch built without cuDNN"
    assert env["env_vars"]["CUDA_LAUNCH_BLOCKING"] == "1"
    assert env["env_vars"]["XFORMERS_FORCE_DISABLE_TRITON"] == "1"
    assert "SOME_UNRELATED_VARIABLE" not in env["env_vars"]
    libs = env["cuda_libraries"]
    assert isinstance(libs["libraries"], dict) and isinstance(libs["flags"], list)


@pytest.mark.gpu
def test_torch_environment_on_a_cuda_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    env = torch_environment(torch)
    dev = env["torch"]["devices"][0]
    major, minor = torch.cuda.get_device_capability(0)
    assert dev["capability"] == f"{major}.{minor}"
    assert dev["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    assert env["cuda_libraries"]["libraries"]["cudart"]["loaded"], "a CUDA torch maps libcudart"


def test_torch_environment_never_raises_on_a_broken_torch():
    def boom(*_a, **_k):
        raise RuntimeError("cuDNN version incompatibility: PyTorch was compiled against (9, 1, 0)")

    cuda = types.SimpleNamespace(get_arch_list=boom, is_available=lambda: False, device_count=boom)
    broken = types.SimpleNamespace(
        __version__="9.9.9",
        version=types.SimpleNamespace(cuda="12.8", hip=None),
        _C=types.SimpleNamespace(_cudnn=types.SimpleNamespace(getCompileVersion=lambda: (9, 1, 0), getRuntimeVersion=boom)),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(version=boom)),
        cuda=cuda,
    )
    env = torch_environment(broken)
    t = env["torch"]
    assert t["version"] == "9.9.9" and t["cuda_available"] is False
    assert t["arch_list"].startswith("not available: RuntimeError: cuDNN version incompatibility")
    assert t["cudnn"]["compiled"] == "9.1.0"
    assert t["cudnn"]["loaded"].startswith("not available:")
    assert t["sdp"].startswith("not available: AttributeError")
    assert torch_environment(object())["torch"]["available"] is False


@pytest.mark.parametrize(
    "built, visible, warnings_, expected",
    [
        (None, None, [], "CPU-only build of torch"),
        ("12.8", "", [], "CUDA_VISIBLE_DEVICES='' hides every device"),
        ("12.8", "-1", [], "CUDA_VISIBLE_DEVICES='-1' hides every device"),
        ("12.8", "0,1", ["CUDA initialization: Found no NVIDIA driver on your system.\nmore"], "CUDA initialization: Found no NVIDIA driver"),
        ("12.8", None, [], "no CUDA device found"),
    ],
)
def test_cuda_unavailable_reason(built, visible, warnings_, expected):
    assert cuda_unavailable_reason(built, None, visible, warnings_).startswith(expected)


def test_env_vars_is_an_allow_list():
    environ = {"CUDA_VISIBLE_DEVICES": "1", "HOME": "/home/x", "XFORMERS_DISABLE_FLASH_ATTN": "1", "AWS_SECRET_ACCESS_KEY": "s", "TORCH_CUDA_ARCH_LIST": "8.0;9.0", "X": "y" * 1000}
    assert env_vars(environ) == {"CUDA_VISIBLE_DEVICES": "1", "TORCH_CUDA_ARCH_LIST": "8.0;9.0", "XFORMERS_DISABLE_FLASH_ATTN": "1"}
    assert len(env_vars({"LD_LIBRARY_PATH": "/a" * 1000})["LD_LIBRARY_PATH"]) < 500


# --- worker side: loaded versus installed libraries ----------------------------------------------


def _maps_line(path: str) -> str:
    return f"7f0000000000-7f0000001000 r-xp 00000000 08:01 1234  {path}"


def _fake_wheel(site, rel: str, dist: str, version: str):
    lib = site / rel
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"\x7fELF")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{rel},sha256=x,4\n")
    return lib


def test_parse_maps_groups_by_library_and_skips_noise():
    text = "\n".join([
        _maps_line("/usr/lib/x86_64-linux-gnu/libc.so.6"),
        _maps_line("/site/nvidia/cublas/lib/libcublasLt.so.12"),
        _maps_line("/site/nvidia/cublas/lib/libcublasLt.so.12"),
        _maps_line("/site/nvidia/cublas/lib/libcublas.so.12"),
        _maps_line("/site/nvidia/cudnn/lib/libcudnn_ops.so.9"),
        _maps_line("/site/torch/lib/libcudart-9335f6a2.so.12 (deleted)"),
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0  [stack]",
        _maps_line("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
    ])
    assert parse_maps(text) == {
        "cublasLt": ["/site/nvidia/cublas/lib/libcublasLt.so.12"],
        "cublas": ["/site/nvidia/cublas/lib/libcublas.so.12"],
        "cudnn_ops": ["/site/nvidia/cudnn/lib/libcudnn_ops.so.9"],
        "cudart": ["/site/torch/lib/libcudart-9335f6a2.so.12"],
        "cuda": ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"],
    }


def test_cuda_libraries_flags_duplicates_and_mismatches(tmp_path):
    site = tmp_path / "site-packages"
    system = tmp_path / "usr-local-cuda" / "lib64"
    system.mkdir(parents=True)
    pip_cudart = _fake_wheel(site, "nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia-cuda-runtime-cu12", "12.8.90")
    pip_cublas = _fake_wheel(site, "nvidia/cublas/lib/libcublas.so.12", "nvidia-cublas-cu12", "12.8.4.1")
    sys_cudart = system / "libcudart.so.12.4.127"
    sys_cudart.write_bytes(b"\x7fELF")
    (system / "libcudart.so.12").symlink_to(sys_cudart.name)
    sys_cublas = system / "libcublas.so.12.4.5.8"
    sys_cublas.write_bytes(b"\x7fELF")

    maps = "\n".join(_maps_line(str(p)) for p in (pip_cudart, system / "libcudart.so.12", sys_cublas))
    out = cuda_libraries(maps, site_dirs=[str(site)], system_dirs=[str(system)], torch_version_cuda="12.8")
    cudart = out["libraries"]["cudart"]
    assert [c["path"] for c in cudart["loaded"]] == [str(pip_cudart), str(sys_cudart)]
    assert cudart["loaded"][0] == {"path": str(pip_cudart), "version": "12.8.90", "dist": "nvidia-cuda-runtime-cu12"}
    assert cudart["loaded"][1] == {"path": str(sys_cudart), "version": "12.4.127"}
    assert {c["path"] for c in cudart["installed"]} == {str(pip_cudart), str(sys_cudart)}
    kinds = {(f["kind"], f["library"]) for f in out["flags"]}
    assert ("duplicate", "cudart") in kinds
    mismatch = next(f for f in out["flags"] if f["kind"] == "mismatch" and f["library"] == "cublas")
    assert str(sys_cublas) in mismatch["detail"] and "nvidia-cublas-cu12 12.8.4.1" in mismatch["detail"]
    assert str(pip_cublas) in mismatch["detail"]

    # Only the pip copies loaded: clean, except that torch was built for another CUDA major.
    clean = "\n".join(_maps_line(str(p)) for p in (pip_cudart, pip_cublas))
    out = cuda_libraries(clean, site_dirs=[str(site)], system_dirs=[str(system)], torch_version_cuda="13.0")
    assert [(f["kind"], f["library"]) for f in out["flags"]] == [("mismatch", "cudart")]
    assert "built for CUDA 13.0 but loaded CUDA runtime 12.8.90" in out["flags"][0]["detail"]


def test_cuda_libraries_of_this_process_never_raises():
    out = cuda_libraries()
    assert set(out) == {"libraries", "flags"}
    for entry in out["libraries"].values():
        assert set(entry) == {"loaded", "installed"}


def test_modules_stay_import_light():
    # The worker module must not pull in anything outside the standard library at import time.
    import subprocess

    code = "import sys; import gpudoctor.scan.torchenv, gpudoctor.scan.environment; print(sorted(m for m in ('torch', 'pynvml', 'rich', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    assert envmod.PACKAGES and torchenv.ENV_ALLOWLIST
