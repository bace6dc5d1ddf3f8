"""The probe worker: runs inside the *target* interpreter and executes probes on the parent's orders.

Standard library and torch only: this module is loaded by a small bootstrap (see
`gpudoctor.scan.spawn.BOOTSTRAP`) in environments where gpudoctor is not installed, so it must not pull
in typer, rich or pynvml.

Protocol, one JSON object per line. The parent writes the configuration as the first line on stdin,
then commands; the worker answers on a private duplicate of its original stdout. Before each step
that runs code it does not control, the worker says so with a `begin` event, so that when it dies or
hangs the parent knows what was running (or that nothing was):

  worker -> {"event": "begin", "what": "torch"} ... {"event": "hello", ...}
            at once when started with --torch=full|light (before the configuration is read),
            otherwise on {"cmd": "torch"}
  worker -> {"event": "begin", "what": "load", "key": K, "source": S} for each probe module, then
            {"event": "catalog", "probes": [...], "errors": [...]}
  parent -> {"cmd": "device", "device": D}      worker -> {"event": "device", "ok": ..., ...}
  parent -> {"cmd": "run", "task": {...}}
            worker -> {"event": "begin", "what": "run", "key": K} then {"event": "result", ...}
  parent -> {"cmd": "exit"} (or EOF)

A result carries `left_running` (threads the probe started and left alive) and `cancelled` (timers
it left, which the worker cancelled), so that a crash such a thread causes later can be traced to
the probe that started it. After a result with `restart` (the CUDA context is poisoned) the worker
exits at once, skipping interpreter teardown.

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
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from gpudoctor.scan import protocol
from gpudoctor.probes.base import Outcome, ProbeContext, Status, error_text, is_sticky_cuda_error

ENTRY_POINT_GROUP = "gpudoctor.probes"
TRACEBACK_TAIL = protocol.TEXT_MAX  # characters of a probe's traceback kept in the report
REPR_LIMIT = 2000  # a tensor's repr in details is evidence, not a dump
_STDERR_TRACEBACK = 64 << 10  # characters of a traceback echoed to stderr

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
    raw_timeout = getattr(spec, "timeout_s", 30.0)
    timeout = protocol.valid_timeout(raw_timeout)
    if timeout is None:
        raise ValueError(f"SPEC.timeout_s = {raw_timeout!r:.40} is not a number of seconds in "
                         f"(0, {protocol.MAX_TIMEOUT_S:g}]")
    memory = getattr(spec, "gpu_memory_mib", 512)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise ValueError(f"SPEC.gpu_memory_mib = {memory!r:.40} is not a number of MiB")
    return {
        "key": key,
        "source": source,
        "id": str(spec.id),
        "title": str(getattr(spec, "title", spec.id)),
        "timeout_s": timeout,
        "emits": [str(e) for e in getattr(spec, "emits", ())],
        "needs": [str(n) for n in getattr(spec, "needs", ("torch",))],
        "per_device": bool(getattr(spec, "per_device", True)),
        "isolated": bool(getattr(spec, "isolated", False)),
        "gpu_memory_mib": memory,
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


def discover(config: dict[str, Any], begin: Callable[[str, str], None] = lambda key, source: None,
             ) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """Load every probe module: built-ins in registry order, then `--probe-file`s, then entry
    points; `begin(key, source)` is called before each. Modules whose key is in config["exclude"]
    (they killed or hung an earlier worker) are not loaded again. Returns (modules by key, catalog
    entries, load errors). A built-in that does not exist yet is absent, not an error; one that
    fails to import is an error with its traceback."""
    modules: dict[str, Any] = {}
    catalog: list[dict] = []
    errors: list[dict] = []
    exclude = set(config.get("exclude") or ())

    def add(key: str, source: str, load) -> None:
        if key in exclude:
            return
        begin(key, source)
        try:
            mod = load()
            entry = _describe(key, source, mod)
        except BaseException as exc:  # SystemExit or KeyboardInterrupt at import: that file's error
            errors.append({"key": key, "source": source,
                           "error": protocol.cut(error_text(exc), protocol.SUMMARY_MAX),
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


def _import_torch(full: bool = True) -> tuple[Any, dict[str, Any]]:
    """(torch or None, the hello event). `torch_info` says whether CUDA is usable and on how many
    devices; with `full`, `environment` carries `torch_environment`'s sections, read here because
    only this process knows which torch and CUDA libraries it really loaded."""
    started = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # a broken install may raise OSError, SystemExit or worse
        error = protocol.cut(error_text(exc), protocol.SUMMARY_MAX)
        return None, {"event": "hello", "importable": False, "error": error,
                      "traceback": traceback.format_exc()[-TRACEBACK_TAIL:],
                      "import_s": round(time.perf_counter() - started, 3),
                      "torch_info": {"available": False, "reason": error},
                      "environment": {"torch": {"available": False, "reason": error}} if full else {}}
    import_s = round(time.perf_counter() - started, 3)
    from gpudoctor.scan.torchenv import device_uuids, torch_environment, torch_summary

    environment: dict[str, Any] = {}
    if full:
        environment = jsonable(torch_environment(torch))
        section = environment.get("torch")
        if isinstance(section, dict):
            section["import_s"] = import_s
            info = {k: section.get(k) for k in (
                "version", "cuda_available", "device_count", "cuda_unavailable_reason")}
        else:
            info = jsonable(torch_summary(torch))
    else:
        info = jsonable(torch_summary(torch))
    info["import_s"] = import_s
    return torch, {"event": "hello", "importable": True, "import_s": import_s, "torch_info": info,
                   "device_uuids": jsonable(device_uuids(torch, int(info.get("device_count") or 0))),
                   "environment": environment}


def _check_device(torch: Any, device: str) -> dict[str, Any]:
    """Whether torch accepts `device` as a device string (types registered by plugins included)."""
    if torch is None:
        return {"event": "device", "ok": True, "checked": False}
    try:
        parsed = torch.device(device)
    except Exception as exc:
        return {"event": "device", "ok": False, "error": protocol.cut(error_text(exc), 500)}
    backend = getattr(torch, str(parsed.type), None)  # torch.mps, torch.xpu, a plugin's module
    try:
        available = backend.is_available() if callable(getattr(backend, "is_available", None)) else True
    except Exception as exc:
        available, why = False, error_text(exc)
    else:
        why = f"torch.{parsed.type}.is_available() is False in this environment"
    if not available:
        return {"event": "device", "ok": False, "error": protocol.cut(why, 500)}
    return {"event": "device", "ok": True, "checked": True, "type": str(parsed.type), "index": parsed.index}


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


def _context_poisoned(torch: Any, device: str) -> str | None:
    """The error text if the CUDA context of `device` can no longer be used by a following probe.
    Synchronises the probe's own device (under --device cuda:N that is not the current one), and
    never a device the probe did not use (that would create a context there)."""
    if torch is None or device.partition(":")[0] != "cuda":
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        torch.cuda.synchronize(device)
    except Exception as exc:
        return protocol.cut(error_text(exc), protocol.SUMMARY_MAX)
    return None


def _leftovers(before: set[int | None]) -> tuple[list[str], list[str]]:
    """(threads a probe started and left running, timers it left that were cancelled now). A
    timer is stopped before it can fire into the next probe; a thread cannot be stopped, so it is
    named, and the parent knows whom to suspect if the worker dies later."""
    running, cancelled = [], []
    for thread in threading.enumerate():
        if thread.ident in before or not thread.is_alive():
            continue
        name = protocol.cut(thread.name, 100)
        if isinstance(thread, threading.Timer):
            thread.cancel()
            thread.join(0.05)
            if not thread.is_alive():
                cancelled.append(f"timer thread {name!r}")
                continue
        running.append(f"thread {name!r}" + (" (daemon)" if thread.daemon else ""))
    try:
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            cancelled.append(f"SIGALRM timer due in {remaining:.1f} s")
    except (AttributeError, OSError, ValueError):  # no interval timers here
        pass
    return running[:20], cancelled[:20]


# --- running ----------------------------------------------------------------------------------


def run_task(task: dict[str, Any], modules: dict[str, Any], torch: Any, hello: dict,
             log) -> dict[str, Any]:
    """Run one probe and return its result event. Exceptions from the probe become `crashed`."""
    mod = modules[task["key"]]
    # device_note: why the parent moved the probe off the device asked for (it puts it, with the
    # device asked for, in the result's details); here it explains an unmet "cuda" need.
    device, note = task["device"], task.get("device_note")
    result: dict[str, Any] = {"event": "result", "key": task["key"], "device": device, "details": {},
                              "findings": []}

    for need in task.get("needs", []):
        reason = _unmet_need(need, torch, device, hello, note)
        if reason:
            result.update(status=Status.SKIPPED.value, summary=reason, duration_s=0.0)
            return result

    ctx = ProbeContext(torch=torch, device=device, options=dict(task.get("options", {})),
                       memory_budget_bytes=int(task.get("memory_budget_bytes", 512 << 20)), log=log)
    threads_before = {t.ident for t in threading.enumerate()}
    started = time.perf_counter()
    try:
        outcome = mod.run(ctx)
        if not isinstance(outcome, Outcome) and not hasattr(outcome, "to_dict"):
            raise TypeError(f"run() returned {type(outcome).__name__}, not an Outcome")
        out = outcome.to_dict()
        if not isinstance(out, dict):
            raise TypeError(f"to_dict() returned {type(out).__name__}, not a dict")
    except BaseException as exc:  # SystemExit from a probe is its crash, not the worker's exit
        tb = traceback.format_exc()
        sys.stderr.write(protocol.cut_tail(tb, _STDERR_TRACEBACK))
        text = protocol.cut(error_text(exc), protocol.SUMMARY_MAX)
        result.update(status=Status.CRASHED.value, summary=text.rstrip(":"),
                      traceback=protocol.cut_tail(tb, TRACEBACK_TAIL))
        if is_sticky_cuda_error(text):  # the worker must not run another probe in this context
            result["restart"] = text
    else:
        details = out.get("details") or {}
        details = dict(details) if isinstance(details, dict) else {"value": details}
        summary = out.get("summary", "")
        result.update(status=out.get("status"), details=details, findings=out.get("findings", []),
                      summary=protocol.cut(summary, protocol.SUMMARY_MAX) if isinstance(summary, str)
                      else summary)
    result["duration_s"] = time.perf_counter() - started
    running, cancelled = _leftovers(threads_before)
    if running:
        result["left_running"] = running
    if cancelled:
        result["cancelled"] = cancelled
    poisoned = _context_poisoned(torch, device)
    if poisoned:
        result["restart"] = poisoned
    result["details"] = protocol.bound(jsonable(result["details"]))
    result["findings"] = protocol.bound(jsonable(result["findings"]), protocol.DETAILS_MAX)
    result["summary"] = jsonable(result.get("summary"))
    result["status"] = jsonable(result.get("status"))
    return result


def _exit(code: int = 0) -> None:
    """Leave without interpreter teardown: with torch loaded it takes ~0.3 s, can stall on a
    poisoned CUDA context, and there is nothing left to save (the protocol is flushed on every
    line; the driver frees the context)."""
    try:
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(flags: Sequence[str] = ()) -> None:
    """Entry point of a worker process (called by the bootstrap with its `--` flags)."""
    # Private channels first: nothing a probe prints may reach the protocol pipe.
    channel = _Channel(os.dup(1))
    commands = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a segfault leaves the Python stacks

    torch, hello = None, {"importable": False, "error": "not imported"}
    imported = False

    def load_torch(full: bool) -> None:
        nonlocal torch, hello, imported
        if not imported:
            channel.send({"event": "begin", "what": "torch"})
            torch, hello = _import_torch(full)
            imported = True
        channel.send(hello)

    early = next((f.partition("=")[2] for f in flags if f.startswith("--torch=")), "")
    if early in ("full", "light"):
        load_torch(early == "full")  # before the configuration: the parent is still starting up

    config = json.loads(commands.readline() or b"{}")
    modules, catalog, errors = discover(
        config, lambda key, source: channel.send({"event": "begin", "what": "load", "key": key,
                                                  "source": source}))
    channel.send({"event": "catalog", "probes": jsonable(catalog), "errors": jsonable(errors),
                  "python": sys.executable, "version": list(sys.version_info[:3]), "pid": os.getpid()})
    if config.get("mode") == "list":
        _exit(0)

    def log(message: str) -> None:
        sys.stderr.write(f"[probe] {message}\n")

    for line in commands:
        cmd = json.loads(line)
        if cmd.get("cmd") == "torch":
            load_torch(bool(cmd.get("environment", True)))
        elif cmd.get("cmd") == "device":
            channel.send(_check_device(torch, str(cmd.get("device"))))
        elif cmd.get("cmd") == "run":
            task = cmd["task"]
            channel.send({"event": "begin", "what": "run", "key": task["key"], "device": task["device"]})
            result = run_task(task, modules, torch, hello, log)
            try:
                channel.send(result)
            except (TypeError, ValueError) as exc:  # jsonable() should make this unreachable
                channel.send({"event": "result", "key": task["key"], "device": result["device"],
                              "status": "crashed", "summary": f"result not serialisable: {exc}"})
            if result.get("restart"):
                _exit(0)  # a poisoned CUDA context: the parent continues in a fresh worker
        elif cmd.get("cmd") == "exit":
            _exit(0)
    _exit(0)
