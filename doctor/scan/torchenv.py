"""The worker's half of the environment report: what the torch that a probe runs under really is.

`torch_environment(torch)` is called once in a probe worker right after `import torch`. It returns
three sections: `torch` (versions it was built with and loaded, arch list, CUDA availability and
why not, devices), `cuda_libraries` (the CUDA libraries this process has mapped, read from
/proc/self/maps, against the copies installed in site-packages and the system library folders, with
duplicates and mismatches flagged) and `env_vars` (an explicit allow-list).

Worker side: standard library and the torch handed in, nothing else. Every part is guarded: a part
that cannot be read says "not available: <why>" and never raises. CUDA is initialised only after
`torch.cuda.is_available()` said yes.
"""
from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any, Iterable, Mapping

# Variables that change how torch, CUDA and the attention libraries behave. Values are collected
# only for these; redaction still scrubs secrets from them (an index URL may carry a password).
ENV_ALLOWLIST: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "CUDA_CACHE_DISABLE",
    "CUDA_LOG_FILE",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDNN_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_TF32_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_USE_CUDA_DSA",
    "PYTORCH_CUDA_DSA_STACKTRACING",
    "TORCH_USE_CUDA_DSA",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK",
    "TORCH_CUDA_ARCH_LIST",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_BLAS_PREFER_CUBLASLT",
    "TORCH_CUDNN_V8_API_DISABLED",
    "TORCH_LOGS",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_LOG_LEVEL",
    "CUDNN_LOGLEVEL_DBG",
    "NCCL_DEBUG",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "OMP_NUM_THREADS",
)
ENV_ALLOWED_PREFIXES: tuple[str, ...] = ("XFORMERS_", "FLASH_ATTENTION_", "TORCHINDUCTOR_", "TRITON_")
_ENV_VALUE_MAX = 400

# The CUDA libraries whose copies matter, keyed by the name shown in the report. The pattern accepts
# auditwheel's hashed names (libcudart-9335f6a2.so.12) used by older "big" torch wheels.
CUDA_LIBRARIES: tuple[str, ...] = (
    "cuda", "cudart", "cublas", "cublasLt", "cudnn", "nccl", "nvrtc", "nvrtc-builtins", "nvJitLink",
    "cusparse", "cusparseLt", "cufft", "curand", "cusolver", "cupti", "nvToolsExt", "nvshmem_host",
    "cufile", "nvidia-ml",
)
# cuDNN 9 ships its engines as separate libraries (libcudnn_ops, libcudnn_graph, ...); each is
# tracked on its own so that two copies of one of them count as a duplicate.
_LIB_RE = re.compile(
    r"^lib(?P<name>" + "|".join(re.escape(n) for n in sorted(CUDA_LIBRARIES, key=len, reverse=True))
    + r"|cudnn_[a-z_]+)(?:-[0-9a-f]{8})?\.so(?:\.(?P<version>[0-9][0-9.]*))?$"
)
# The driver API and NVML come from the driver, never from a pip wheel: they are listed but never
# compared with site-packages.
_DRIVER_LIBS = frozenset({"cuda", "nvidia-ml"})
_SYSTEM_LIB_DIRS: tuple[str, ...] = (
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/lib/wsl/lib",
)


def na(why: str) -> str:
    """The one spelling of a value that could not be read."""
    return f"not available: {why}"


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def allowed_env_name(name: str) -> bool:
    return name in ENV_ALLOWLIST or name.startswith(ENV_ALLOWED_PREFIXES)


def env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables that are set, sorted by name, long values cut."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in sorted(environ):
        if allowed_env_name(name):
            value = environ[name]
            out[name] = value if len(value) <= _ENV_VALUE_MAX else value[:_ENV_VALUE_MAX] + "..."
    return out


def torch_environment(torch: Any) -> dict[str, Any]:
    """The `torch`, `cuda_libraries` and `env_vars` sections, read in this (the worker) process.

    Never raises. The torch section is read first because `cudnn.version()` loads cuDNN, which then
    shows up among the loaded libraries.
    """
    torch_section = _guard(lambda: _torch_section(torch))
    libraries = _guard(lambda: cuda_libraries(torch_version_cuda=getattr(getattr(torch, "version", None), "cuda", None)))
    return {"torch": torch_section, "cuda_libraries": libraries, "env_vars": _guard(env_vars)}


def _guard(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # a report part must never take the worker down
        return {"available": False, "reason": _why(exc)}


def _get(fn: Any, default: Any = None) -> Any:
    """One guarded read: the value, or "not available: <why>"."""
    try:
        return fn()
    except Exception as exc:
        return na(_why(exc)) if default is None else default


def _torch_section(torch: Any) -> dict[str, Any]:
    version = torch.version
    built_cuda = getattr(version, "cuda", None)
    built_hip = getattr(version, "hip", None)
    out: dict[str, Any] = {
        "version": str(torch.__version__),
        "git_version": getattr(version, "git_version", None),
        "debug": bool(getattr(version, "debug", False)),
        "file": getattr(torch, "__file__", None),
        "built_with_cuda": built_cuda,
        "built_with_hip": built_hip,
        "cudnn": _cudnn(torch),
        "arch_list": _get(lambda: list(torch.cuda.get_arch_list())),
        "nccl": _get(lambda: _nccl_version(torch)) if built_cuda else na("torch built without CUDA"),
    }

    out.update(_availability(torch))
    available, count = out["cuda_available"], out["device_count"]
    out["devices"] = [_device(torch, i) for i in range(count)] if available else []
    out["sdp"] = _get(lambda: _sdp_flags(torch))
    out["tf32"] = _get(lambda: {
        "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    })
    return out


def _availability(torch: Any) -> dict[str, Any]:
    """cuda_available, device_count and, when CUDA is unusable, why."""
    version = torch.version
    # torch reports why CUDA failed to initialise as a UserWarning ("CUDA initialization: Found no
    # NVIDIA driver on your system..."): catch it, it is the best "why" there is.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = _get(lambda: bool(torch.cuda.is_available()), default=False)
        count = _get(lambda: int(torch.cuda.device_count()), default=0) if available else 0
    init_warnings = [str(w.message).strip() for w in caught if "cuda" in str(w.message).lower()]
    out: dict[str, Any] = {
        "cuda_available": available,
        "device_count": count,
        "cuda_unavailable_reason": None if available else cuda_unavailable_reason(
            getattr(version, "cuda", None), getattr(version, "hip", None),
            os.environ.get("CUDA_VISIBLE_DEVICES"), init_warnings),
    }
    if init_warnings:
        out["init_warnings"] = init_warnings[:3]
    return out


def torch_summary(torch: Any) -> dict[str, Any]:
    """The few facts the runner needs to place probes (a spare worker reports only these): the
    version, whether CUDA is usable, on how many devices, and why not."""
    out = {"version": _get(lambda: str(torch.__version__))}
    out.update(_guard(lambda: _availability(torch)))
    return out


def device_uuids(torch: Any, count: int) -> list[str | None]:
    """The UUID of each visible CUDA device as torch numbers them ("GPU-..." or "MIG-..." is for
    NVML to add), None where torch cannot tell. The runner maps cuda:N to its NVML device with
    them; they are identifiers, so they never enter the report."""
    out: list[str | None] = []
    for index in range(count):
        try:
            uuid = torch.cuda.get_device_properties(index).uuid
            out.append(str(uuid) if uuid is not None else None)
        except Exception:  # torch < 2.0 has no uuid; a broken device has none to give
            out.append(None)
    return out


def cuda_unavailable_reason(
    built_cuda: str | None, built_hip: str | None, visible: str | None, init_warnings: Iterable[str] = ()
) -> str:
    """Why `torch.cuda.is_available()` is false, most basic cause first."""
    if built_cuda is None and built_hip is None:
        return "CPU-only build of torch (torch.version.cuda is None): install a CUDA wheel"
    if visible is not None:
        first = visible.split(",")[0].strip()
        # CUDA stops at the first invalid entry, so "-1" or "" hide every device.
        if first in ("", "-1") or (first.lstrip("-").isdigit() and int(first) < 0):
            return f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
    for text in init_warnings:
        return text.splitlines()[0]
    return "no CUDA device found: no NVIDIA driver, or a container started without GPU access"


def _cudnn(torch: Any) -> Any:
    cudnn = getattr(torch._C, "_cudnn", None)
    if cudnn is None:
        return na("torch built without cuDNN")
    out: dict[str, Any] = {
        "compiled": _get(lambda: ".".join(map(str, cudnn.getCompileVersion()))),
        "loaded": _get(lambda: ".".join(map(str, cudnn.getRuntimeVersion()))),
    }
    # version() also runs torch's own compatibility check and raises on a mismatch: keep its text.
    out["version"] = _get(lambda: torch.backends.cudnn.version())
    out["enabled"] = _get(lambda: bool(torch.backends.cudnn.enabled))
    return out


def _nccl_version(torch: Any) -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _sdp_flags(torch: Any) -> dict[str, Any]:
    cuda = torch.backends.cuda
    return {
        "flash_enabled": bool(cuda.flash_sdp_enabled()),
        "mem_efficient_enabled": bool(cuda.mem_efficient_sdp_enabled()),
        "math_enabled": bool(cuda.math_sdp_enabled()),
        "cudnn_enabled": bool(cuda.cudnn_sdp_enabled()),
        "flash_built": _get(lambda: bool(cuda.is_flash_attention_available())),
    }


def _device(torch: Any, index: int) -> dict[str, Any]:
    try:
        props = torch.cuda.get_device_properties(index)
    except Exception as exc:
        return {"index": index, "error": na(_why(exc))}
    return {
        "index": index,
        "name": str(props.name),
        "capability": f"{props.major}.{props.minor}",
        "total_memory": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
    }


# --- libraries -----------------------------------------------------------------------------------


def parse_maps(text: str) -> dict[str, list[str]]:
    """CUDA library name -> the distinct files mapped, from /proc/<pid>/maps text."""
    loaded: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        match = _LIB_RE.match(os.path.basename(path))
        if match and path not in loaded.setdefault(match["name"], []):
            loaded[match["name"]].append(path)
    return loaded


def site_package_dirs() -> list[str]:
    """Folders on sys.path that hold installed distributions, in search order."""
    seen: list[str] = []
    for entry in sys.path:
        if entry and os.path.basename(entry) in ("site-packages", "dist-packages") and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if real not in seen:
                seen.append(real)
    return seen


def _pip_owners(site_dirs: Iterable[str]) -> dict[str, tuple[str, str]]:
    """realpath of every shared object shipped by an `nvidia-*` (or torch) wheel -> (dist, version),
    read from the wheels' RECORD files: exact provenance without importing anything."""
    import importlib.metadata as md
    import pathlib  # already loaded by importlib.metadata

    owners: dict[str, tuple[str, str]] = {}
    for site in site_dirs:
        try:
            entries = sorted(os.listdir(site))
        except OSError:
            continue
        for entry in entries:
            # Chosen by the metadata folder's name ("nvidia_cublas_cu12-12.8.4.1.dist-info"):
            # parsing every distribution's METADATA to learn its name cost a CPU scan ~30 ms.
            stem, dot, kind = entry.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            folder = stem.split("-", 1)[0].lower().replace("_", "-")
            if not (folder.startswith("nvidia-") or folder == "torch"):
                continue
            dist = md.PathDistribution(pathlib.Path(site, entry))
            name = (dist.metadata["Name"] or folder).lower().replace("_", "-")
            # Scan RECORD's text rather than `dist.files`: torch's RECORD lists ~15,000 files, and
            # building a path object for each costs more than the rest of the environment together.
            record = dist.read_text("RECORD") or ""
            for line in record.splitlines():
                rel = line.split(",", 1)[0]
                if ".so" in rel and _LIB_RE.match(os.path.basename(rel)):
                    owners[os.path.realpath(str(dist.locate_file(rel)))] = (name, dist.version)
    return owners


def _installed(site_dirs: list[str], extra_dirs: Iterable[str]) -> dict[str, list[str]]:
    """CUDA library name -> distinct real files in site-packages/nvidia/*/lib, torch/lib, and the
    system and LD_LIBRARY_PATH folders."""
    folders: list[str] = []
    for site in site_dirs:
        nvidia = os.path.join(site, "nvidia")
        if os.path.isdir(nvidia):
            for sub in sorted(os.listdir(nvidia)):
                folders.append(os.path.join(nvidia, sub, "lib"))
        folders.append(os.path.join(site, "torch", "lib"))
    folders.extend(extra_dirs)
    found: dict[str, list[str]] = {}
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for fname in names:
            match = _LIB_RE.match(fname)
            if not match:
                continue
            real = os.path.realpath(os.path.join(folder, fname))
            if real not in found.setdefault(match["name"], []):
                found[match["name"]].append(real)
    return found


def _version_of(path: str, owner: tuple[str, str] | None) -> str | None:
    match = _LIB_RE.match(os.path.basename(path))
    file_version = match["version"] if match else None
    # A wheel's file is named by soname only (libcublas.so.12): its dist version is more precise.
    if owner and (not file_version or file_version.count(".") == 0):
        return owner[1]
    return file_version


def cuda_libraries(
    maps_text: str | None = None,
    *,
    site_dirs: list[str] | None = None,
    system_dirs: Iterable[str] | None = None,
    torch_version_cuda: str | None = None,
) -> dict[str, Any]:
    """Loaded versus installed copies of the CUDA libraries, with `flags` for duplicates (two
    copies of one library mapped in this process), mismatches (the loaded copy is not the one the
    pip wheel installed) and a CUDA runtime whose major version is not the one torch was built for.
    Arguments exist for tests; by default this process's maps and paths are read."""
    if maps_text is None:
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
                maps_text = fh.read()
        except OSError as exc:
            return {"available": False, "reason": f"cannot read /proc/self/maps ({_why(exc)})"}
    site_dirs = site_package_dirs() if site_dirs is None else site_dirs
    if system_dirs is None:
        ld_path = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        conda = [os.path.join(p, "lib") for p in (os.environ.get("CONDA_PREFIX"), sys.prefix) if p]
        system_dirs = [*ld_path, *conda, *_SYSTEM_LIB_DIRS]
    loaded = parse_maps(maps_text)
    installed = _installed(site_dirs, system_dirs)
    owners = _get(lambda: _pip_owners(site_dirs), default={})

    def describe(path: str) -> dict[str, Any]:
        real = os.path.realpath(path)
        owner = owners.get(real)
        entry: dict[str, Any] = {"path": real, "version": _version_of(real, owner)}
        if owner:
            entry["dist"] = owner[0]
        return entry

    libs: dict[str, Any] = {}
    flags: list[dict[str, str]] = []
    for name in sorted(set(loaded) | set(installed), key=str.lower):
        loaded_real = []
        for p in loaded.get(name, []):
            if os.path.realpath(p) not in loaded_real:
                loaded_real.append(os.path.realpath(p))
        libs[name] = {
            "loaded": [describe(p) for p in loaded_real],
            "installed": [describe(p) for p in installed.get(name, [])],
        }
        if len(loaded_real) > 1:
            flags.append({
                "kind": "duplicate",
                "library": name,
                "detail": f"{len(loaded_real)} copies of lib{name} are loaded: " + ", ".join(loaded_real),
            })
        pip_copies = [p for p in installed.get(name, []) if p in owners]
        if name not in _DRIVER_LIBS and loaded_real and pip_copies:
            strays = [p for p in loaded_real if p not in owners]
            if strays:
                flags.append({
                    "kind": "mismatch",
                    "library": name,
                    "detail": f"lib{name} is loaded from {strays[0]} but the pip wheel "
                    f"{owners[pip_copies[0]][0]} {owners[pip_copies[0]][1]} installs {pip_copies[0]}",
                })
    if torch_version_cuda and "cudart" in libs:
        want = torch_version_cuda.split(".")[0]
        for entry in libs["cudart"]["loaded"]:
            have = (entry["version"] or "").split(".")[0]
            if have and have != want:
                flags.append({
                    "kind": "mismatch",
                    "library": "cudart",
                    "detail": f"torch was built for CUDA {torch_version_cuda} but loaded CUDA runtime "
                    f"{entry['version']} ({entry['path']})",
                })
    return {"libraries": libs, "flags": flags}
