"""Probe `cuda-runtime`: can this torch use the GPU at all? Create a context, allocate, launch a tiny
kernel, synchronise, check its result, free; each step timed.

When CUDA is unusable it says why, from torch's own texts (captured init warnings and exceptions):
a CPU-only build, no driver, a driver too old for the build, CUDA_VISIBLE_DEVICES hiding every
device, or a build without kernels for this GPU's architecture. How loudly depends on what the user
asked for (`ctx.options["requested_device"]`, passed by the runner): under `auto` (no --device) the
scan fell back to the CPU and the finding is a warning; an explicit `cuda:N` or `all` that cannot
be met fails; an explicit CPU (or other non-CUDA) device skips this probe, there is nothing to say.
"""
from __future__ import annotations

import os
import time
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, error_text, skipped

SPEC = ProbeSpec(
    id="cuda-runtime",
    title="CUDA runtime: context, allocation, kernel launch, synchronisation",
    timeout_s=60.0,  # a first CUDA context can take tens of seconds (lazy module loading, JIT)
    emits=("cuda-unavailable", "driver-too-old", "no-kernel-image"),
    gpu_memory_mib=64,
    description="Creates a CUDA context, allocates, launches a tiny kernel and checks its result.",
    runs_on_cpu=False,
)

# Most specific first: the driver texts also contain generic words such as "CUDA".
_RULES: tuple[tuple[str, str], ...] = (
    ("no kernel image is available for execution on the device", "no-kernel-image"),
    ("nvidia driver on your system is too old", "driver-too-old"),
    ("cuda driver version is insufficient for cuda runtime version", "driver-too-old"),
    ("found no nvidia driver on your system", "cuda-unavailable"),
    ("torch not compiled with cuda enabled", "cuda-unavailable"),
    ("cuda unknown error", "cuda-unavailable"),
    ("no cuda gpus are available", "cuda-unavailable"),
    ("cuda driver initialization failed", "cuda-unavailable"),
    ("no cuda-capable device is detected", "cuda-unavailable"),
)


def classify(text: str) -> str | None:
    """The knowledge-base id for a CUDA initialisation or launch text, or None."""
    low = " ".join(text.lower().split())
    for needle, kb_id in _RULES:
        if needle in low:
            return kb_id
    return None


def visible_devices_problem(value: str | None) -> str | None:
    """Why CUDA_VISIBLE_DEVICES hides every device, or None when it does not (or is unset).
    CUDA reads the list up to the first invalid entry, so an invalid first entry hides all."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    if not value.strip():
        return "CUDA_VISIBLE_DEVICES is set to the empty string, which hides every GPU"
    first = entries[0]
    if first.lstrip("-").isdigit() and int(first) < 0:
        return f"CUDA_VISIBLE_DEVICES={value!r} starts with a negative index, which hides every GPU"
    if not (first.isdigit() or first.startswith(("GPU-", "MIG-"))):
        return f"CUDA_VISIBLE_DEVICES={value!r} starts with an invalid entry, which hides every GPU"
    return None


def why_unavailable(torch: Any) -> tuple[str, list[str], list[str]]:
    """(kb id, one-line reason, evidence) for a torch whose CUDA is unusable."""
    if getattr(torch.version, "cuda", None) is None:
        hip = getattr(torch.version, "hip", None)
        build = f"ROCm {hip} build" if hip else "CPU-only build"
        return ("cuda-unavailable", f"torch {torch.__version__} is a {build} (torch.version.cuda is None)",
                [f"torch.__version__ = {torch.__version__}", "torch.version.cuda = None"])
    evidence = [f"torch {torch.__version__} built for CUDA {torch.version.cuda}"]
    hidden = visible_devices_problem(os.environ.get("CUDA_VISIBLE_DEVICES"))
    with att.capture() as said:
        try:
            available = bool(torch.cuda.is_available())
            count = int(torch.cuda.device_count())
            torch.cuda.init()
            init_error = ""
        except Exception as exc:  # noqa: BLE001 - the exception text is the diagnosis
            available, count, init_error = False, 0, error_text(exc)
    texts = [t for t in (*said.warnings, init_error) if t]
    evidence += texts
    for text in texts:
        kb_id = classify(text)
        if kb_id:
            return kb_id, text.splitlines()[0], evidence
    if hidden:
        return "cuda-unavailable", hidden, evidence
    if not available or count == 0:
        return "cuda-unavailable", "torch.cuda.is_available() is False and no device is visible", evidence
    return "", "", evidence


DRIVER_FILE = "/proc/driver/nvidia/version"  # present while the NVIDIA kernel module is loaded (Linux)
WHEEL_INDEX = "https://download.pytorch.org/whl"


def driver_version(path: str | None = None) -> str | None:
    """The loaded NVIDIA kernel driver's version ("570.86.15"), "" when loaded but unreadable, None
    when no NVIDIA driver is loaded (or this is not Linux)."""
    import re

    try:
        with open(path or DRIVER_FILE, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    m = re.search(r"Kernel Module(?: for [^\s]+)?\s+(\d+(?:\.\d+)+)", text)
    return m.group(1) if m else ""


def fix_steps(torch: Any, reason: str, driver: str | None) -> tuple[str, ...]:
    """The steps that fit what `why_unavailable` found, most relevant first: a CPU-only build wants
    a CUDA build of the same torch, no driver wants the driver (first: no CUDA build runs without
    it), a driver that is loaded but fails
    to initialise is the suspend/resume (nvidia_uvm) or container case. The entry's full list
    stays in `gpudoctor explain cuda-unavailable`."""
    steps: list[str] = []
    version = str(torch.__version__).split("+")[0]
    no_driver = driver is None or "found no nvidia driver" in reason.lower()
    if getattr(torch.version, "cuda", None) is None and not getattr(torch.version, "hip", None):
        steps.append(
            f"torch {torch.__version__} is a CPU-only build: install the CUDA build of the same version, "
            f"`pip install torch=={version} --index-url {WHEEL_INDEX}/cu128`, choosing the cuXXX that "
            + (f"driver {driver} supports" if driver else "the driver supports")
            + " (nvidia-smi shows the highest CUDA version it runs; https://pytorch.org/get-started/locally/)")
    if no_driver:
        # Without a driver no CUDA build of torch can run: the driver is the first step.
        steps.insert(0, f"no NVIDIA driver is loaded here ({DRIVER_FILE} is missing): on a machine with an "
                      "NVIDIA GPU install the driver until `nvidia-smi` works; in a container start it with "
                      "`--gpus all` and the NVIDIA Container Toolkit")
    elif "cuda_visible_devices" in reason.lower():
        steps.append("unset CUDA_VISIBLE_DEVICES or set indices that exist (nvidia-smi -L lists them), in the "
                     "shell before Python starts")
    elif getattr(torch.version, "cuda", None) is not None:
        steps.append(f"the NVIDIA driver {driver or ''} is loaded but CUDA does not initialise: after "
                     "suspend/resume or a driver update reload the UVM module (`sudo rmmod nvidia_uvm && sudo "
                     "modprobe nvidia_uvm`) or reboot; in a container check that /dev/nvidia-uvm is present")
    return tuple(" ".join(s.split()) for s in steps)


def run_steps(torch: Any, device: str, n: int = 1 << 20) -> dict[str, Any]:
    """Context, allocation, launch, synchronise, free on `device`, each timed in milliseconds.
    The kernel is arange + sum, whose exact result is known, so a silent wrong answer shows."""
    is_cuda = str(device).startswith("cuda")
    steps: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        start = time.perf_counter()
        result = fn()
        if is_cuda:
            torch.cuda.synchronize(device)
        steps[name] = round((time.perf_counter() - start) * 1e3, 3)
        return result

    if is_cuda:
        timed("context", lambda: (torch.cuda.init(), torch.cuda.set_device(device),
                                  torch.empty(1, device=device)))
    buf = timed("allocate", lambda: torch.empty(n, dtype=torch.float64, device=device))
    total = timed("launch", lambda: torch.arange(n, out=buf).sum())
    start = time.perf_counter()
    got = float(total.item())
    steps["synchronize"] = round((time.perf_counter() - start) * 1e3, 3)
    expected = float(n * (n - 1) // 2)
    del buf, total
    timed("free", lambda: torch.cuda.empty_cache() if is_cuda else None)
    return {"steps_ms": steps, "result": got, "expected": expected, "correct": got == expected,
            "elements": n}


def _device_facts(torch: Any, device: str) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "total_memory": int(props.total_memory),
        "device_count": int(torch.cuda.device_count()),
        "arch_list": list(torch.cuda.get_arch_list()),
    }


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    requested = str(ctx.options.get("requested_device") or "auto")
    env = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "torch": str(torch.__version__), "torch.version.cuda": torch.version.cuda}
    if not ctx.is_cuda:
        explicit_cuda = requested.startswith("cuda") or requested == "all"
        if requested.startswith("cpu"):
            return skipped("the CPU was asked for: there is no CUDA runtime to check",
                           requested_device=requested, **env)
        if requested != "auto" and not explicit_cuda:
            return skipped(f"{requested} was asked for: there is no CUDA runtime to check",
                           requested_device=requested, **env)
        kb_id, reason, evidence = why_unavailable(torch)
        if not kb_id:
            # CUDA works, yet the worker handed us a non-CUDA device: nothing here to judge.
            return skipped(f"device {ctx.device} is not a CUDA device", requested_device=requested, **env)
        driver = driver_version()
        details = {"requested_device": requested, "nvidia_driver": driver, **env}
        evidence.append(f"NVIDIA driver {driver}" if driver else
                        f"{DRIVER_FILE}: " + ("missing (no NVIDIA driver loaded)" if driver is None else "unreadable"))
        steps = fix_steps(torch, reason, driver) if kb_id == "cuda-unavailable" else ()
        if explicit_cuda:
            return Outcome(Status.FAIL, f"CUDA is unusable: {reason}", details,
                           [ProbeFinding(kb_id, reason, tuple(evidence), steps=steps)])
        # `auto`: the scan ran on the CPU instead; worth knowing, not an error of this machine.
        return Outcome(Status.WARN, f"CUDA is unusable, the scan ran on {ctx.device}: {reason}", details,
                       [ProbeFinding(kb_id, reason, tuple(evidence), severity="warning", steps=steps)])

    details: dict[str, Any] = {"requested_device": requested, **env}
    with att.capture() as said:
        try:
            details.update(_device_facts(torch, ctx.device))
            details.update(run_steps(torch, ctx.device))
            failure = ""
        except Exception as exc:  # noqa: BLE001 - a failed launch is the measurement
            failure = error_text(exc)
    if said.warnings:
        details["init_warnings"] = said.warnings
    freed = att.free(torch, ctx.device, ctx.poisoned(failure) if failure else False)
    if freed:
        details["empty_cache_error"] = freed
    texts = [t for t in (failure, *said.warnings) if t]
    findings = [ProbeFinding(kb, t.splitlines()[0], (t, f"device {ctx.device}",
                                               f"arch list {details.get('arch_list')}",
                                               f"capability {details.get('capability')}"))
                for t in texts for kb in [classify(t)] if kb]
    if failure:
        details["error"] = failure
        return Outcome(Status.FAIL, f"CUDA runtime failed: {failure.splitlines()[0]}", details, findings)
    if not details.get("correct"):
        return Outcome(Status.FAIL, f"the test kernel returned {details['result']} instead of "
                       f"{details['expected']}", details, findings)
    steps = details["steps_ms"]
    summary = (f"{details['name']} (sm {details['capability']}): context {steps['context']:.0f} ms, "
               f"launch+sync {steps['launch'] + steps['synchronize']:.1f} ms, result correct")
    return Outcome(Status.WARN if findings else Status.PASS, summary, details, findings)
