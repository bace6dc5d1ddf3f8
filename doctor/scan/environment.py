"""The parent's half of the environment report, collected without torch while the worker imports it.

`collect_environment(python)` returns the sections `system` (OS, kernel, container and WSL
detection), `python` (the target interpreter), `packages` (versions read with importlib.metadata in
the target environment), `nvml` (driver and GPUs through nvidia-ml-py), `toolchain` (gcc, g++,
clang, nvcc, cmake and ninja: what builds CUDA extensions), `env_vars` and `fleet` (the job it
ran in, for `gpudoctor merge`). The worker's `torch_environment` adds `torch` and `cuda_libraries`
and its own view of `env_vars`; `merge_environment` joins the two halves.

NVML is read through `NvmlSession` (a scan holds one for its environment and its free-memory
checks; `cuda_to_nvml` says which NVML device torch's cuda:N is). Every external command runs
without a shell in a session of its own, killed with what it started at its deadline; NVML calls
run in a daemon thread with a deadline, because a wedged driver hangs them too. A missing piece is
reported as {"available": false, "reason": ...} or "not available: <why>", never raised.
pynvml is imported lazily so that `gpudoctor explain` starts fast.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from gpudoctor.scan.spawn import run_bounded
from gpudoctor.scan.torchenv import env_vars, na

# Distributions whose versions matter for attention kernels and CUDA. Every installed `nvidia-*`
# distribution is added in the target environment.
PACKAGES: tuple[str, ...] = (
    "torch", "torchvision", "torchaudio", "xformers", "flash_attn", "flash-attn-3", "sageattention",
    "triton", "pytorch-triton", "diffusers", "transformers", "accelerate", "peft", "bitsandbytes",
    "torchao", "numpy", "nvidia-ml-py", "pynvml",
)

# Runs in the target interpreter: standard library only, no torch import, prints one JSON object.
# find_spec on a top-level name locates a package without executing it.
_TARGET_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, os, sys
wanted = json.loads(sys.argv[1])
def norm(n): return (n or "").lower().replace("_", "-").replace(".", "-")
seen = {}
for d in md.distributions():
    name = norm(d.metadata["Name"])
    if not name:
        continue
    installer = ""
    try:
        installer = (d.read_text("INSTALLER") or "").strip()
    except Exception:
        pass
    seen.setdefault(name, []).append([d.version, installer])
installed, missing = {}, []
for name in sorted(set(map(norm, wanted)) | {n for n in seen if n.startswith("nvidia-")}):
    if name not in seen:
        missing.append(name)
        continue
    versions = seen[name]
    entry = {"version": versions[0][0], "installer": versions[0][1] or None}
    if len(versions) > 1:
        # Two dist-info folders for one name: pip's "uninstall then install" half done.
        entry["duplicates"] = [v for v, _ in versions[1:]]
    installed[name] = entry
origins = {}
for mod in ("torch", "xformers", "flash_attn", "triton"):
    try:
        spec = importlib.util.find_spec(mod)
        origins[mod] = spec.origin if spec else None
    except Exception as exc:
        origins[mod] = "error: %s" % exc
print(json.dumps({
    "version": sys.version.split()[0],
    "implementation": sys.implementation.name,
    "executable": sys.executable,
    "prefix": sys.prefix,
    "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
    "conda": bool(os.environ.get("CONDA_PREFIX")) or os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
    "packages": {"installed": installed, "not_installed": missing},
    "origins": origins,
}))
"""

_NVML_CODES = {
    3: "not supported on this GPU",
    4: "no permission",
    9: "the NVIDIA kernel driver is not loaded",
    12: "libnvidia-ml.so.1 not found: no NVIDIA driver, or a container started without the NVIDIA runtime",
    15: "the GPU has fallen off the bus",
    18: "the driver and libnvidia-ml versions differ (driver upgraded without a reboot?)",
}

# Bits of nvmlDeviceGetCurrentClocksEventReasons (formerly ...ThrottleReasons), in bit order.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason}


def _why(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if isinstance(code, int) and code in _NVML_CODES:
        return f"NVML: {_NVML_CODES[code]}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def collect_environment(python: str, timeout: float = 10.0, nvml: "NvmlSession | None" = None) -> dict[str, Any]:
    """The parent-side sections for the target interpreter `python`. Never raises; takes at most
    about `timeout` seconds for the target query plus a few for NVML (read through the scan's
    `nvml` session when given, so a scan initialises NVML once)."""
    target = target_python(python, timeout)
    if target.get("available", True):
        packages = target.pop("packages", None) or unavailable("the target printed no package list")
    else:
        packages = unavailable(target["reason"])
    return {
        "system": _safe(system_info),
        "python": target,
        "packages": packages,
        "nvml": _safe(lambda: nvml_info(timeout=min(timeout, 5.0), session=nvml)),
        "toolchain": _safe(lambda: toolchain_info(timeout=min(timeout, 5.0))),
        "env_vars": _safe(env_vars),
        "fleet": _safe(fleet_section),
    }


def fleet_section() -> dict[str, Any]:
    """The job this scan ran in (Slurm, torchrun), NCCL variables and plugins, network ports:
    what `gpudoctor merge` compares across nodes (gpudoctor.fleet.launch)."""
    from gpudoctor.fleet.launch import node_environment

    return node_environment()


def merge_environment(parent: dict[str, Any], worker: dict[str, Any] | None) -> dict[str, Any]:
    """The full environment: the worker's sections win where both exist (its env_vars are the
    ones the probes ran under); without a worker, `torch` says why it is missing."""
    merged = dict(parent)
    merged.update(worker or {})
    # A worker that failed to import torch reports only why; the schema still wants both sections.
    merged.setdefault("torch", unavailable("the worker did not report (torch failed to import?)"))
    merged.setdefault("cuda_libraries", unavailable("the worker did not report"))
    return merged


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # a report part must never take the scan down
        return unavailable(_why(exc))


# --- system --------------------------------------------------------------------------------------


def _read(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def system_info() -> dict[str, Any]:
    """OS, kernel, libc, CPU and memory, container and WSL. No hostname."""
    try:
        pretty = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:  # no /etc/os-release nor /usr/lib/os-release (macOS, minimal images)
        pretty = None
    libc = platform.libc_ver()
    meminfo = _read("/proc/meminfo") or ""
    mem_total = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemTotal:")), None)
    return {
        "os": platform.system(),
        "distribution": pretty or platform.platform(terse=True),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "libc": f"{libc[0]} {libc[1]}".strip() or None,
        "cpu_count": os.cpu_count(),
        "memory_total": mem_total,
        "container": detect_container(),
        "wsl": detect_wsl(),
    }


def detect_container(root: str = "/") -> dict[str, Any]:
    """Docker, Podman, Kubernetes, LXC or another container, with the evidence for the verdict."""
    join = lambda p: os.path.join(root, p.lstrip("/"))  # noqa: E731
    cgroup = _read(join("/proc/1/cgroup")) or ""
    container_env = os.environ.get("container")
    # Most specific first: the first hit names the kind, every hit is kept as evidence.
    checks = [
        ("kubernetes", bool(os.environ.get("KUBERNETES_SERVICE_HOST")), "KUBERNETES_SERVICE_HOST is set"),
        ("podman", os.path.exists(join("/run/.containerenv")), "/run/.containerenv exists"),
        ("docker", os.path.exists(join("/.dockerenv")), "/.dockerenv exists"),
        (container_env or "", bool(container_env), f"container={container_env}"),
    ]
    checks += [(m, m in cgroup, f"/proc/1/cgroup mentions {m}") for m in ("kubepods", "docker", "containerd", "lxc", "libpod")]
    hits = [(kind, why) for kind, hit, why in checks if hit]
    kind = hits[0][0] if hits else None
    evidence = [why for _, why in hits]
    return {"detected": kind is not None, "kind": kind, "evidence": evidence}


def detect_wsl(root: str = "/") -> dict[str, Any]:
    """WSL 1 or 2, and whether the GPU is forwarded (/dev/dxg and the driver's libcuda stub)."""
    join = lambda p: os.path.join(root, p.lstrip("/"))  # noqa: E731
    release = (_read(join("/proc/sys/kernel/osrelease")) or platform.release()).strip()
    if "microsoft" not in release.lower():
        return {"detected": False}
    return {
        "detected": True,
        "version": 2 if "wsl2" in release.lower() or os.path.exists(join("/run/WSL")) else 1,
        "gpu_forwarded": os.path.exists(join("/dev/dxg")),
        "driver_libcuda": os.path.exists(join("/usr/lib/wsl/lib/libcuda.so.1")),
    }


# --- toolchain -----------------------------------------------------------------------------------

# Build tools that decide whether a CUDA extension (xformers, flash-attn, a torch cpp_extension)
# builds and for which -arch, as collect_env and cuda-doctor report them. Each is one bounded
# `--version` run without a shell.
TOOLCHAIN: tuple[str, ...] = ("gcc", "g++", "clang", "nvcc", "cmake", "ninja")
# "gcc (Debian 12.2.0-14) 12.2.0", "Cuda compilation tools, release 13.0, V13.0.88",
# "cmake version 3.25.1", "1.11.1" (ninja), "Ubuntu clang version 14.0.0-1ubuntu1".
_VERSION_RE = re.compile(r"(?:release \d+\.\d+, V|version |\) |^)(\d+\.\d+(?:\.\d+)*)", re.M)


def _tool_path(name: str) -> str | None:
    found = shutil.which(name)
    if found is None and name == "nvcc":
        # nvcc is often installed but off PATH; torch's cpp_extension looks in CUDA_HOME too.
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            candidate = os.path.join(home, "bin", "nvcc") if home else None
            if candidate and os.access(candidate, os.X_OK):
                return candidate
    return found


def tool_version(path: str, timeout: float = 5.0) -> dict[str, Any]:
    """{path, version, banner} from `path --version`, or {available: false, reason}. The tool runs
    in a process group of its own, killed whole at the deadline: a wrapper (ccache, a conda or
    module shim) that hangs takes its children with it. Not `spawn.run_bounded`: its /proc sweep
    for left-behind daemons costs ~20 us per process on the machine, six times over, in the
    parent's CPU time, for programs that only print a version."""
    try:
        proc = subprocess.Popen([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        return unavailable(f"cannot run {path}: {_why(exc)}")
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        return unavailable(f"{path} --version did not answer within {timeout:g} s")
    text = (stdout or stderr)[:4096]
    banner = next((line.strip() for line in text.splitlines() if line.strip()), "")
    found = _VERSION_RE.search(text)
    return {"path": path, "version": found.group(1) if found else None, "banner": banner[:200]}


def toolchain_info(timeout: float = 5.0, tools: tuple[str, ...] = TOOLCHAIN) -> dict[str, Any]:
    """Each tool in `tools` that is installed, with its version; missing ones say so. The runs go
    in parallel, so the whole takes about one `timeout` at worst."""
    from concurrent.futures import ThreadPoolExecutor

    paths = {name: _tool_path(name) for name in tools}
    out: dict[str, Any] = {name: unavailable("not found on PATH") for name, path in paths.items() if path is None}
    present = {name: path for name, path in paths.items() if path is not None}
    if present:
        with ThreadPoolExecutor(max_workers=len(present)) as pool:
            futures = {name: pool.submit(tool_version, path, timeout) for name, path in present.items()}
            out.update({name: future.result() for name, future in futures.items()})
    return {name: out[name] for name in tools}


# --- the target interpreter ----------------------------------------------------------------------


def target_python(python: str, timeout: float = 10.0) -> dict[str, Any]:
    """Interpreter facts and package versions read inside `python` (stdlib only, no torch import).
    On success the dict holds a `packages` key that `collect_environment` moves to its own section."""
    cmd = [python, "-c", _TARGET_SCRIPT, json.dumps(list(PACKAGES))]
    try:
        # In its own session, killed with anything it started when it does not answer in time.
        proc = run_bounded(cmd, timeout)
    except FileNotFoundError:
        return unavailable(f"interpreter {python} not found")
    except PermissionError:
        return unavailable(f"interpreter {python} is not executable")
    except subprocess.TimeoutExpired:
        return unavailable(f"{python} did not answer within {timeout:g} s")
    except OSError as exc:
        return unavailable(f"cannot run {python}: {_why(exc)}")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return unavailable(f"{python} exited with code {proc.returncode}: {tail}")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return unavailable(f"{python} printed no JSON (a sitecustomize writing to stdout?)")
    data["path"] = python
    data["same_as_cli"] = os.path.realpath(data.get("executable") or python) == os.path.realpath(sys.executable)
    data["cli_python"] = sys.version.split()[0]
    return data


# --- NVML ----------------------------------------------------------------------------------------


def _bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """Run `fn` in a daemon thread; raise TimeoutError when it does not return in time. The thread is
    left behind on a hang (it cannot be killed), which is still better than hanging the scan."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # carried to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="gpudoctor-nvml", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"NVML did not answer within {timeout:g} s (a wedged driver?)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _nvml() -> Any:
    import pynvml  # lazy: only scans need it

    pynvml.nvmlInit()
    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"


def decode_throttle(mask: int) -> list[str]:
    """Names of the set clock event (throttle) bits; unknown bits are kept as hex."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in THROTTLE_REASONS)
    if rest:
        names.append(hex(rest))
    return names


def _field(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return na(_why(exc))


def _gpu(nv: Any, index: int) -> dict[str, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)

    def memory() -> dict[str, int]:
        info = nv.nvmlDeviceGetMemoryInfo(handle)
        return {"total": int(info.total), "used": int(info.used), "free": int(info.free)}

    def ecc() -> dict[str, Any]:
        current, pending = nv.nvmlDeviceGetEccMode(handle)
        out: dict[str, Any] = {"enabled": bool(current), "pending": bool(pending)}
        if current:
            for label, counter in (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC)):
                out[f"{label}_uncorrected"] = _field(lambda c=counter: int(nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, c)))
                out[f"{label}_corrected"] = _field(lambda c=counter: int(nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, c)))
        return out

    def throttle() -> list[str]:
        get = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return decode_throttle(int(get(handle)))

    def pcie() -> dict[str, int]:
        return {
            "gen": int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            "max_gen": int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
            "width": int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            "max_width": int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        }

    return {
        "index": index,
        "name": _field(lambda: _text(nv.nvmlDeviceGetName(handle))),
        "capability": _field(lambda: "%d.%d" % tuple(nv.nvmlDeviceGetCudaComputeCapability(handle))),
        "memory": _field(memory),
        "compute_processes": _field(lambda: len(nv.nvmlDeviceGetComputeRunningProcesses(handle))),
        "ecc": _field(ecc),
        "throttle_reasons": _field(throttle),
        "pcie": _field(pcie),
        "temperature_c": _field(lambda: int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))),
        "persistence_mode": _field(lambda: bool(nv.nvmlDeviceGetPersistenceMode(handle))),
        **gpu_fleet_fields(nv, handle),
    }


def gpu_fleet_fields(nv: Any, handle: Any) -> dict[str, Any]:
    """Per-GPU state that `gpudoctor merge` compares across nodes: VBIOS, row remapping, clocks,
    power limits and NVLink. Each read is guarded like the rest of `_gpu`."""

    def remapped() -> dict[str, Any]:
        corrected, uncorrected, pending, failed = nv.nvmlDeviceGetRemappedRows(handle)
        return {"correctable": int(corrected), "uncorrectable": int(uncorrected),
                "pending": bool(pending), "failed": bool(failed)}

    def clocks() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, kind in (("sm", nv.NVML_CLOCK_SM), ("memory", nv.NVML_CLOCK_MEM)):
            out[label] = _field(lambda k=kind: int(nv.nvmlDeviceGetClockInfo(handle, k)))
            out[f"{label}_max"] = _field(lambda k=kind: int(nv.nvmlDeviceGetMaxClockInfo(handle, k)))
            out[f"{label}_applications"] = _field(lambda k=kind: int(nv.nvmlDeviceGetApplicationsClock(handle, k)))
        return out

    def power() -> dict[str, Any]:
        return {"limit_w": _field(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000),
                "default_limit_w": _field(lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000)}

    def nvlink() -> dict[str, Any]:
        active, versions = 0, set()
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if not nv.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except Exception:
                continue  # a link that does not exist on this GPU
            active += 1
            try:
                versions.add(int(nv.nvmlDeviceGetNvLinkVersion(handle, link)))
            except Exception:
                pass
        return {"active_links": active, "version": max(versions) if versions else None}

    return {
        "vbios": _field(lambda: _text(nv.nvmlDeviceGetVbiosVersion(handle))),
        "row_remapping": _field(remapped),
        "clocks_mhz": _field(clocks),
        "power": _field(power),
        "nvlink": _field(nvlink),
    }


def _nvml_read(nv: Any) -> dict[str, Any]:
    count = int(nv.nvmlDeviceGetCount())
    cuda = _field(lambda: _cuda_version(int(nv.nvmlSystemGetCudaDriverVersion_v2())))
    return {
        "available": True,
        "driver_version": _field(lambda: _text(nv.nvmlSystemGetDriverVersion())),
        "cuda_driver_version": cuda,
        "nvml_version": _field(lambda: _text(nv.nvmlSystemGetNVMLVersion())),
        "device_count": count,
        "gpus": [_field(lambda i=i: _gpu(nv, i)) for i in range(count)],
    }


def _once(read: Callable[[Any], Any], timeout: float) -> Any:
    """`read(pynvml)` in an NVML session of its own (init, read, shutdown) under the deadline.
    Raises what NVML raises. A scan shares one `NvmlSession` instead."""
    session = NvmlSession(timeout)
    try:
        return session.call(read)
    finally:
        session.close()


def nvml_info(timeout: float = 5.0, session: "NvmlSession | None" = None) -> dict[str, Any]:
    """Driver, the CUDA version it supports, and each GPU (no UUIDs, serials or bus ids)."""
    try:
        return session.call(_nvml_read) if session is not None else _once(_nvml_read, timeout)
    except ImportError:
        return unavailable("nvidia-ml-py (pynvml) is not installed in gpudoctor's environment")
    except Exception as exc:
        return unavailable(_why(exc))


def nvml_device_count() -> int | None:
    """How many GPUs NVML sees, or None when NVML is unavailable."""
    try:
        return int(_once(lambda nv: nv.nvmlDeviceGetCount(), 5.0))
    except Exception:
        return None


# --- which NVML device is cuda:N -------------------------------------------------------------------

def _hex(uuid: str) -> str:
    """A UUID's 32 hex digits, whatever its prefix ("GPU-", "MIG-") and dashes."""
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text.replace("-", "")


def cuda_to_nvml(index: int, uuid: str | None, environ: Mapping[str, str] | None = None,
                 nvml_names: Sequence[str] | None = None) -> tuple[str, Any]:
    """Which NVML device torch's cuda:`index` is: ("uuid", hex digits), ("index", NVML index), or
    ("unknown", why) when it cannot be known for sure.

    The UUID that torch reports for the device (`uuid`) settles it, MIG instances included. Without
    it the environment decides: CUDA_VISIBLE_DEVICES entries are GPU or MIG UUIDs (or prefixes of
    them) or indices into CUDA's own order, and that order is NVML's (PCI bus) order only under
    CUDA_DEVICE_ORDER=PCI_BUS_ID or when every GPU is the same model (CUDA's default, FASTEST_FIRST,
    puts the fastest GPU first and breaks ties by bus id). `nvml_names` are the GPUs' names in NVML
    order, where known."""
    if uuid and len(_hex(uuid)) == 32:
        return "uuid", _hex(uuid)
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    order = (environ.get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST").strip().upper()
    position = index
    if visible is not None:
        entries = [e.strip() for e in visible.split(",")]
        if index >= len(entries) or not entries[index]:
            return "unknown", f"CUDA_VISIBLE_DEVICES={visible!r} has no entry {index}"
        entry = entries[index]
        if entry.upper().startswith(("GPU-", "MIG-")):
            if "/" in entry:  # the pre-R470 MIG form MIG-GPU-<uuid>/<gi>/<ci>
                return "unknown", f"the MIG device {entry!r} is named in an old form NVML cannot look up"
            return "uuid", _hex(entry)
        if not entry.isdigit():
            return "unknown", f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither an index nor a UUID"
        position = int(entry)
    if order == "PCI_BUS_ID":
        return "index", position
    names = list(nvml_names or [])
    if len(names) <= 1 or len(set(names)) == 1:
        if names and position >= len(names):
            return "unknown", f"CUDA device {position} is beyond the {len(names)} GPU(s) NVML sees"
        return "index", position  # one model: FASTEST_FIRST ties are broken by bus id
    return "unknown", (f"CUDA_DEVICE_ORDER is {order} and the GPUs differ ({', '.join(sorted(set(names)))}):"
                       f" CUDA's device {position} need not be NVML's; set CUDA_DEVICE_ORDER=PCI_BUS_ID")


class NvmlSession:
    """One NVML session for a whole scan: initialised on first use, shut down by `close()`. Every
    call runs under a deadline; after one timeout the session gives up, because a wedged driver
    would stall every later call too. Methods return None where NVML cannot tell."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._nv: Any = None
        self._broken: str | None = None
        self._names: list[str] | None = None
        self._by_uuid: dict[str, Any] | None = None
        self._lock = threading.RLock()  # the environment thread and the scan share the session

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(pynvml)` under the deadline, NVML initialised once. Raises what NVML raises."""
        with self._lock:
            return self._call(fn)

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        if self._broken:
            raise RuntimeError(self._broken)

        def run() -> Any:
            if self._nv is None:
                self._nv = _nvml()
            return fn(self._nv)

        try:
            return _bounded(run, self.timeout)
        except TimeoutError as exc:
            self._broken = str(exc)
            raise
        except Exception as exc:
            if self._nv is None:  # nvmlInit itself failed: it will not work later either
                self._broken = _why(exc)
            raise

    def names(self) -> list[str] | None:
        if self._names is None:
            try:
                self._names = self.call(lambda nv: [
                    _text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(int(nv.nvmlDeviceGetCount()))])
            except Exception:
                return None
        return self._names

    def _uuid_handles(self, nv: Any) -> dict[str, Any]:
        if self._by_uuid is None:
            found: dict[str, Any] = {}
            for i in range(int(nv.nvmlDeviceGetCount())):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                found[_hex(_text(nv.nvmlDeviceGetUUID(handle)))] = handle
                try:
                    count = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
                except Exception:  # no MIG on this GPU or driver
                    count = 0
                for j in range(count):
                    try:
                        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                        found[_hex(_text(nv.nvmlDeviceGetUUID(mig)))] = mig
                    except Exception:
                        continue
            self._by_uuid = found
        return self._by_uuid

    def free_memory(self, ref: tuple[str, Any]) -> int | None:
        """Bytes free on the device `ref` from `cuda_to_nvml` ("uuid" matched in full or as a
        prefix, as CUDA accepts; "index"), or None."""
        kind, value = ref

        def read(nv: Any) -> int | None:
            if kind == "index":
                handle = nv.nvmlDeviceGetHandleByIndex(int(value))
            elif kind == "uuid":
                handles = self._uuid_handles(nv)
                matches = [h for u, h in handles.items() if u.startswith(value)]
                if len(matches) != 1:
                    return None
                handle = matches[0]
            else:
                return None
            return int(nv.nvmlDeviceGetMemoryInfo(handle).free)

        try:
            return self.call(read)
        except Exception:
            return None

    def close(self) -> None:
        with self._lock:
            nv, self._nv = self._nv, None
        if nv is not None and not self._broken:
            try:
                _bounded(nv.nvmlShutdown, min(self.timeout, 2.0))
            except Exception:
                pass
