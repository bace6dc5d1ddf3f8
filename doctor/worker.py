"""The probe worker: runs inside the *target* interpreter and executes probes on the parent's orders.

Standard library and torch only: this module is loaded by a small bootstrap (see
`gpudoctor.runner.BOOTSTRAP`) in environments where gpudoctor is not installed, so it must not pull
in typer, rich or pynvml.

Protocol, one JSON object per line. The parent writes the configuration as the first line on stdin,
then commands; the worker answers on a private duplicate of its original stdout:

  worker -> {"event": "catalog", "probes": [...], "errors": [...]}       at once, without torch
  parent -> {"cmd": "torch"}        worker -> {"event": "hello", "torch": {...}}
  parent -> {"cmd": "run", "task": {...}}
                                    worker -> {"event": "start", ...} then {"event": "result", ...}
  parent -> {"cmd": "exit"} (or EOF)

fd 1 and `sys.stdout` are pointed at stderr before any probe runs, so a `print` or a C-level printf
from a probe or a CUDA extension lands in the stderr tail instead of corrupting the protocol.
"""
from __future__ import annotations

import enum
import faulthandler
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from typing import Any

from gpudoctor.probes.base import Outcome, ProbeContext, Status, error_text

ENTRY_POINT_GROUP = "gpudoctor.probes"
TRACEBACK_TAIL = 4000  # characters of a probe's traceback kept in the report
REPR_LIMIT = 2000  # a tensor's repr in details is evidence, not a dump

# Substrings of CUDA errors after which the context is unusable ("sticky" errors): the worker must
# not run another probe in it.
_STICKY = (
    "illegal memory access",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "illegal instruction",
)


class _Channel:
    """The protocol channel: a private duplicate of the original stdout, one write per line."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, allow_nan=False) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]


def jsonable(value: Any, depth: int = 0) -> Any:
    """`value` made strictly JSON-serialisable: what is not becomes its (bounded) repr, so one odd
    object in a probe's details costs a string, not the probe's result."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth > 20:
        return repr(value)[:REPR_LIMIT]
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value, depth + 1)
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ is still no reason to lose the result
        text = f"<unrepresentable {type(value).__name__}: {exc}>"
    return text[:REPR_LIMIT]


# --- probe discovery --------------------------------------------------------------------------


def _describe(key: str, source: str, mod: Any) -> dict[str, Any]:
    spec = mod.SPEC
    if not callable(getattr(mod, "run", None)):
        raise TypeError(f"{source} has a SPEC but no callable run(ctx)")
    return {
        "key": key,
        "source": source,
        "id": str(spec.id),
        "title": str(getattr(spec, "title", spec.id)),
        "timeout_s": float(getattr(spec, "timeout_s", 30.0)),
        "emits": [str(e) for e in getattr(spec, "emits", ())],
        "needs": [str(n) for n in getattr(spec, "needs", ("torch",))],
        "per_device": bool(getattr(spec, "per_device", True)),
        "isolated": bool(getattr(spec, "isolated", False)),
        "gpu_memory_mib": int(getattr(spec, "gpu_memory_mib", 512)),
        "description": str(getattr(spec, "description", "")),
    }


def _load_file(path: str, index: int) -> Any:
    name = f"gpudoctor_probe_file_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a Python module from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _entry_points() -> list[Any]:
    from importlib import metadata

    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except TypeError:  # Python < 3.10
        return list(metadata.entry_points().get(ENTRY_POINT_GROUP, []))


def discover(config: dict[str, Any]) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """Load every probe module: built-ins in registry order, then `--probe-file`s, then entry
    points. Returns (modules by key, catalog entries, load errors). A built-in that does not exist
    yet is absent, not an error; one that fails to import is an error with its traceback."""
    modules: dict[str, Any] = {}
    catalog: list[dict] = []
    errors: list[dict] = []

    def add(key: str, source: str, load) -> None:
        try:
            mod = load()
            entry = _describe(key, source, mod)
        except Exception as exc:
            errors.append({"key": key, "source": source, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()[-TRACEBACK_TAIL:]})
            return
        modules[key] = mod
        catalog.append(entry)

    if config.get("builtin", True):
        from gpudoctor.probes import BUILTIN

        for name in BUILTIN:
            full = f"gpudoctor.probes.{name}"
            if importlib.util.find_spec(full) is None:
                continue
            add(f"builtin:{name}", full, lambda full=full: importlib.import_module(full))
    for i, path in enumerate(config.get("probe_files", [])):
        add(f"file:{i}", path, lambda path=path, i=i: _load_file(path, i))
    if config.get("entry_points", True):
        try:
            eps = _entry_points()
        except Exception as exc:
            errors.append({"key": "entry-points", "source": ENTRY_POINT_GROUP,
                           "error": f"{type(exc).__name__}: {exc}", "traceback": ""})
            eps = []
        for ep in eps:
            add(f"ep:{ep.name}", f"{ep.value} (entry point {ep.name})", ep.load)
    return modules, catalog, errors


# --- torch and devices ------------------------------------------------------------------------


def _import_torch() -> tuple[Any, dict[str, Any]]:
    """(torch or None, the hello event). The hello carries `torch_environment`'s sections, read
    here because only this process knows which torch and CUDA libraries it really loaded."""
    started = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # a broken install may raise OSError or worse, not ImportError
        error = error_text(exc)
        return None, {"event": "hello", "importable": False, "error": error,
                      "import_s": round(time.perf_counter() - started, 3),
                      "environment": {"torch": {"available": False, "reason": error}}}
    import_s = round(time.perf_counter() - started, 3)
    from gpudoctor.torchenv import torch_environment

    environment = jsonable(torch_environment(torch))
    if isinstance(environment.get("torch"), dict):
        environment["torch"]["import_s"] = import_s
    return torch, {"event": "hello", "importable": True, "import_s": import_s,
                   "environment": environment}


def _unmet_need(need: str, torch: Any, device: str, hello: dict, cuda_note: str | None) -> str | None:
    if need == "torch":
        if torch is None:
            return f"torch is not importable in {sys.executable}: {hello.get('error', 'not imported')}"
        return None
    if need == "cuda":
        if device.partition(":")[0] == "cuda":
            return None
        return f"needs a CUDA device: {cuda_note}" if cuda_note else f"needs a CUDA device, running on {device}"
    if need in ("xformers", "flash_attn"):
        if importlib.util.find_spec(need) is None:
            return f"{need} is not installed in this environment ({sys.executable})"
        return None
    return f"unknown requirement {need!r} in the probe's spec"


def _context_poisoned(torch: Any) -> str | None:
    """The error text if the CUDA context can no longer be used by a following probe."""
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# --- running ----------------------------------------------------------------------------------


def run_task(task: dict[str, Any], modules: dict[str, Any], torch: Any, hello: dict,
             log) -> dict[str, Any]:
    """Run one probe and return its result event. Exceptions from the probe become `crashed`."""
    mod = modules[task["key"]]
    device, note = task["device"], task.get("device_note")
    result: dict[str, Any] = {"event": "result", "key": task["key"], "device": device, "details": {},
                              "findings": []}
    if note:  # the parent moved the probe off the device asked for; say where and why
        result["details"].update({"requested_device": task["requested_device"], "device_note": note})

    for need in task.get("needs", []):
        reason = _unmet_need(need, torch, device, hello, note)
        if reason:
            result.update(status=Status.SKIPPED.value, summary=reason, duration_s=0.0)
            return result

    ctx = ProbeContext(torch=torch, device=device, options=dict(task.get("options", {})),
                       memory_budget_bytes=int(task.get("memory_budget_bytes", 512 << 20)), log=log)
    started = time.perf_counter()
    try:
        outcome = mod.run(ctx)
        if not isinstance(outcome, Outcome) and not hasattr(outcome, "to_dict"):
            raise TypeError(f"run() returned {type(outcome).__name__}, not an Outcome")
        out = outcome.to_dict()
    except BaseException as exc:  # SystemExit from a probe is its crash, not the worker's exit
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        result.update(status=Status.CRASHED.value, summary=error_text(exc).rstrip(":"),
                      traceback=tb[-TRACEBACK_TAIL:])
        if any(s in str(exc) for s in _STICKY):
            result["restart"] = str(exc)
    else:
        details = dict(out.get("details") or {})
        details.update(result["details"])
        result.update(status=out["status"], summary=out.get("summary", ""), details=details,
                      findings=out.get("findings", []))
    result["duration_s"] = time.perf_counter() - started
    poisoned = _context_poisoned(torch)
    if poisoned:
        result["restart"] = poisoned
    result["details"] = jsonable(result["details"])
    result["findings"] = jsonable(result["findings"])
    return result


def main() -> None:
    """Entry point of a worker process (called by the bootstrap)."""
    # Private channels first: nothing a probe prints may reach the protocol pipe.
    channel = _Channel(os.dup(1))
    commands = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr)  # a segfault leaves the probe's Python stack in the tail

    config = json.loads(commands.readline() or b"{}")
    modules, catalog, errors = discover(config)
    channel.send({"event": "catalog", "probes": catalog, "errors": errors,
                  "python": sys.executable, "version": list(sys.version_info[:3])})
    if config.get("mode") == "list":
        return

    torch, hello = None, {"importable": False, "error": "not imported"}

    def log(message: str) -> None:
        sys.stderr.write(f"[probe] {message}\n")

    for line in commands:
        cmd = json.loads(line)
        if cmd.get("cmd") == "torch":
            if torch is None:
                torch, hello = _import_torch()
            channel.send(hello)
        elif cmd.get("cmd") == "run":
            task = cmd["task"]
            channel.send({"event": "start", "key": task["key"], "device": task["device"]})
            result = run_task(task, modules, torch, hello, log)
            try:
                channel.send(result)
            except (TypeError, ValueError) as exc:  # jsonable() should make this unreachable
                channel.send({"event": "result", "key": task["key"], "device": result["device"],
                              "status": "crashed", "summary": f"result not serialisable: {exc}"})
            if result.get("restart"):
                return  # a poisoned CUDA context: the parent continues in a fresh worker
        elif cmd.get("cmd") == "exit":
            # Skip interpreter teardown: with torch loaded it takes ~0.3 s and there is nothing
            # left to save (the protocol is flushed on every line; the driver frees the context).
            sys.stderr.flush()
            os._exit(0)
