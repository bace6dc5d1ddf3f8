"""The isolated probe runner (parent side): `run_scan(options) -> Report`.

Probes never run in this process. They run in worker processes of the target interpreter
(`ScanOptions.python`, default `sys.executable`), started with a small bootstrap that loads
`gpudoctor.worker` from this installation's directories, so the target environment needs torch but
not gpudoctor. A worker that segfaults, aborts, exits, hangs past the probe's limit or writes garbage
on the protocol channel costs one result (`crashed` / `timed_out`, with the signal or exit code and
the stderr tail): the runner kills its whole process group and goes on in a fresh worker.

This module never imports torch; it reads NVML (through `gpudoctor.environment`) only to keep GPU
probes off a device that lacks the free memory they need.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gpudoctor
import gpudoctor.probes
from gpudoctor.environment import collect_environment, gpu_free_memory, merge_environment
from gpudoctor.probes.base import Finding, Status
from gpudoctor.reports.model import ProbeResult, Report
from gpudoctor.reports.redact import redact

STDERR_TAIL = 4096  # characters of stderr kept per crashed probe
_STDERR_KEEP = 64 << 10  # bytes of a worker's stderr held in memory
_MAX_LINE = 64 << 20  # a protocol line longer than this is garbage
_GRACE_S = 2.0  # how long a worker may take to exit after its last word

# Runs in the target interpreter as `python -c BOOTSTRAP name=dir ...`. Drops the cwd from sys.path
# (a user's `torch.py` must not shadow torch), registers our packages from their directories (they
# are not installed there), then hands over to the worker.
BOOTSTRAP = """\
import sys, importlib.util as u
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
for a in sys.argv[1:]:
    n, _, d = a.partition('=')
    s = u.spec_from_file_location(n, d + '/__init__.py', submodule_search_locations=[d])
    m = u.module_from_spec(s)
    sys.modules[n] = m
    s.loader.exec_module(m)
    p, _, c = n.rpartition('.')
    if p:
        setattr(sys.modules[p], c, m)
import gpudoctor.worker
gpudoctor.worker.main()
"""


class ScanError(Exception):
    """gpudoctor itself could not run (exit code 2)."""


class UsageError(ScanError):
    """The options are wrong: an unknown probe id, a bad device or interpreter (exit code 2)."""


@dataclass(frozen=True)
class ScanOptions:
    python: str | None = None  # target interpreter; None: this one
    probes: tuple[str, ...] = ()  # only these ids (empty: all)
    skip: tuple[str, ...] = ()
    device: str = "cuda:0"  # a torch device string, or "all"
    timeout: float | None = None  # overrides every probe's own limit
    probe_files: tuple[str, ...] = ()
    attn_shape: tuple[int, ...] | None = None
    probe_options: tuple[tuple[str, Any], ...] = ()  # --probe-option KEY=VALUE, into ctx.options
    redact: bool = True
    builtin: bool = True  # False: only probe files and entry points (tests)
    entry_points: bool = True
    collect_environment: bool = True
    startup_timeout: float = 120.0  # worker start-up, torch import included
    environment_timeout: float = 30.0


TORCH_READY = "torch ready"  # status after an import: progress goes back to the running probe


@dataclass(frozen=True)
class ScanEvent:
    """Progress for the CLI. kind: "status" (message), "start" or "result" (probe, result)."""

    kind: str
    message: str = ""
    probe: str = ""
    title: str = ""
    device: str | None = None
    index: int = 0
    total: int = 0
    result: ProbeResult | None = None


Progress = Callable[[ScanEvent], None]


# --- options ----------------------------------------------------------------------------------


def resolve_python(python: str | None) -> str:
    """The target interpreter as an absolute path, checked to exist and run (UsageError if not).
    Symlinks are kept: a venv's `bin/python` is a symlink, and resolving it leaves the venv."""
    if python is None:
        return sys.executable
    found = shutil.which(python) or python
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError(f"--python {python}: no such executable")
    try:
        out = subprocess.run([found, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: does not run ({exc})") from None
    version = out.stdout.split()
    if out.returncode != 0 or len(version) != 2:
        raise UsageError(f"--python {python}: not a working Python interpreter")
    if tuple(map(int, version)) < (3, 8):
        raise UsageError(f"--python {python}: Python {'.'.join(version)} is too old (3.8+)")
    return os.path.abspath(found)


_DEVICE = re.compile(r"^[a-z_][a-z0-9_]*(:\d+)?$")


def check_device(device: str) -> str:
    if device == "all" or _DEVICE.match(device):
        return "cuda:0" if device == "cuda" else device
    raise UsageError(f"--device {device}: expected cuda:N, cpu, all or a torch device string")


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- one worker -------------------------------------------------------------------------------


def _signal_name(returncode: int) -> tuple[int | None, str | None]:
    if returncode < 0:
        try:
            return None, signal.Signals(-returncode).name
        except ValueError:
            return None, f"signal {-returncode}"
    return returncode, None


class _Worker:
    """One worker process and its pipes. Every wait has a deadline; nothing here blocks forever."""

    def __init__(self, python: str, config: dict[str, Any]) -> None:
        argv = [python, "-c", BOOTSTRAP,
                f"gpudoctor={gpudoctor.__path__[0]}", f"gpudoctor.probes={gpudoctor.probes.__path__[0]}"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # a killed worker keeps what it printed
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, env=env)
        self.selector = selectors.DefaultSelector()
        for pipe in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ)
        self._out = bytearray()
        self._err = bytearray()
        self.err_total = 0  # bytes of stderr seen, for per-probe marks
        self.used = False
        self.torch_info: dict[str, Any] | None = None
        self.catalog: dict[str, Any] | None = None
        self.send(config)

    def send(self, obj: dict[str, Any]) -> bool:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def event(self, deadline: float) -> dict[str, Any] | str:
        """The next protocol event, or "eof", "timeout", or "garbage:<text>"."""
        while True:
            nl = self._out.find(b"\n")
            if nl >= 0:
                line = bytes(self._out[:nl])
                del self._out[: nl + 1]
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and isinstance(obj.get("event"), str):
                    return obj
                return "garbage:" + line[:200].decode("utf-8", "replace")
            if len(self._out) > _MAX_LINE:
                return "garbage:" + self._out[:200].decode("utf-8", "replace")
            if self.proc.stdout.fileno() not in self.selector.get_map():
                return "garbage:" + self._out[:200].decode("utf-8", "replace") if self._out else "eof"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            self._pump(remaining)

    def _pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            try:
                data = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                self.selector.unregister(key.fd)
            elif key.fd == self.proc.stdout.fileno():
                self._out += data
            else:
                self.err_total += len(data)
                self._err += data
                del self._err[:-_STDERR_KEEP]

    def stderr_tail(self, since: int = 0) -> str:
        held = min(len(self._err), self.err_total - since)
        text = bytes(self._err[len(self._err) - held:]).decode("utf-8", "replace") if held > 0 else ""
        return text[-STDERR_TAIL:]

    def _exited(self, timeout: float) -> bool:
        """Wait up to `timeout` for the worker to exit *without reaping it*: while it is a zombie
        its process group id cannot be reused, so killing the group afterwards is safe."""
        deadline = time.monotonic() + timeout
        while True:
            if hasattr(os, "waitid"):
                try:
                    if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG):
                        return True
                except ChildProcessError:
                    return True
            elif self.proc.poll() is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def finish(self, grace: float = _GRACE_S) -> tuple[int | None, str | None]:
        """End the worker and everything it started: wait `grace` seconds for it to exit on its
        own, kill its process group, reap it, drain stderr. Returns (exit code, signal name).
        Safe to call twice: the second call only reports."""
        if self.proc.returncode is not None:
            return _signal_name(self.proc.returncode)
        self._exited(grace)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        returncode = self.proc.wait()
        deadline = time.monotonic() + 1.0
        while self.proc.stderr.fileno() in self.selector.get_map() and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        self.selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
        return _signal_name(returncode)

    def close(self) -> None:
        self.send({"cmd": "exit"})
        self.finish()


# --- the scan ---------------------------------------------------------------------------------


@dataclass
class _Task:
    entry: dict[str, Any]  # the worker's catalog entry
    device: str  # requested device
    per_device: bool

    @property
    def needs_torch(self) -> bool:
        return "torch" in self.entry["needs"]


def _death(summary: str, worker: _Worker, mark: int, code: tuple[int | None, str | None]) -> dict:
    exit_code, sig = code
    how = f"was killed by {sig}" if sig else f"exited with code {exit_code}"
    return {"status": Status.CRASHED, "summary": summary.replace("{how}", how), "exit_code": exit_code,
            "signal": sig, "stderr_tail": worker.stderr_tail(mark)}


def resolve_device(requested: str, torch_info: dict[str, Any]) -> tuple[str, str | None]:
    """(device a probe runs on, why it is not the one requested, or None). Device-agnostic probes
    asked for cuda:N on a machine where CUDA cannot run still run, on the CPU."""
    if not _is_cuda(requested) or not torch_info.get("importable"):
        return requested, None
    if not torch_info.get("cuda_available"):
        return "cpu", str(torch_info.get("cuda_unavailable_reason") or "CUDA is not available")
    index = int(requested.partition(":")[2] or 0)
    count = int(torch_info.get("device_count") or 0)
    if index >= count:
        return "cpu", f"{requested} does not exist: {count} CUDA device(s) visible"
    return requested, None


def _worker_config(options: ScanOptions, mode: str = "scan") -> dict[str, Any]:
    return {"mode": mode, "builtin": options.builtin, "entry_points": options.entry_points,
            "probe_files": [os.path.abspath(p) for p in options.probe_files]}


def _is_cuda(device: str) -> bool:
    return device.partition(":")[0] == "cuda"


def _nvml_index(device: str) -> int:
    """torch's cuda:N is the N-th entry of CUDA_VISIBLE_DEVICES, not NVML's index N."""
    index = int(device.partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


class _Scan:
    def __init__(self, options: ScanOptions, python: str, progress: Progress | None) -> None:
        self.options = options
        self.python = python
        self.progress = progress or (lambda event: None)
        self.config = _worker_config(options)
        self.worker: _Worker | None = None
        self.workers_started = 0
        self.torch_info: dict[str, Any] = {}  # the first worker's torch section: CUDA, devices
        self.worker_environment: dict[str, Any] | None = None  # its `torch_environment` sections
        self.devices: list[str] = []

    # workers

    def _spawn(self) -> _Worker:
        self.progress(ScanEvent("status", message="starting a worker"))
        try:
            worker = _Worker(self.python, self.config)
        except OSError as exc:
            raise ScanError(f"cannot start {self.python}: {exc}") from None
        self.workers_started += 1
        event = worker.event(time.monotonic() + self.options.startup_timeout)
        if not isinstance(event, dict) or event.get("event") != "catalog":
            code = worker.finish(grace=0.5)
            raise ScanError(_death(f"the worker in {self.python} did not start ({{how}}; {event})",
                                  worker, 0, code)["summary"] + _tail_line(worker.stderr_tail()))
        worker.catalog = event
        return worker

    def _ensure_torch(self, worker: _Worker) -> dict | None:
        """Import torch in `worker` once. Returns a crash record if the worker died doing it."""
        if worker.torch_info is not None:
            return None
        self.progress(ScanEvent("status", message="importing torch"))
        worker.send({"cmd": "torch"})
        event = worker.event(time.monotonic() + self.options.startup_timeout)
        if isinstance(event, dict) and event.get("event") == "hello":
            environment = event.get("environment") or {}
            section = environment.get("torch")
            worker.torch_info = {**(section if isinstance(section, dict) else {}),
                                 "importable": bool(event.get("importable"))}
            if self.worker_environment is None:
                self.worker_environment = environment
                self.torch_info = worker.torch_info
            self.progress(ScanEvent("status", message=TORCH_READY))
            return None
        code = worker.finish(grace=0.5)
        return _death(f"the worker {{how}} while importing torch ({event})", worker, 0, code)

    def _drop_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    # planning

    def select(self, catalog: list[dict]) -> list[dict]:
        ids = [p["id"] for p in catalog]
        for name in (*self.options.probes, *self.options.skip):
            if name not in ids:
                raise UsageError(f"unknown probe {name!r}{_did_you_mean(name, ids)}")
        chosen = [p for p in catalog if not self.options.probes or p["id"] in self.options.probes]
        return [p for p in chosen if p["id"] not in self.options.skip]

    def plan(self, selected: list[dict], worker: _Worker) -> list[_Task]:
        device = check_device(self.options.device)
        if device == "all":
            count = 0
            if any("torch" in p["needs"] for p in selected):
                crash = self._ensure_torch(worker)
                if crash:
                    raise ScanError(crash["summary"] + _tail_line(crash["stderr_tail"]))
                count = int(worker.torch_info.get("device_count") or 0)
            # With no GPU, one cuda:0 pass lets the worker say why CUDA is unavailable.
            self.devices = [f"cuda:{i}" for i in range(count)] or ["cuda:0"]
        else:
            self.devices = [device]
        tasks = []
        for entry in selected:
            if entry["per_device"]:
                tasks.extend(_Task(entry, d, True) for d in self.devices)
            else:
                tasks.append(_Task(entry, self.devices[0], False))
        return tasks

    # running

    def _memory_skip(self, task: _Task, device: str, worker: _Worker) -> str | None:
        mib = int(task.entry.get("gpu_memory_mib") or 0)
        if mib <= 0 or not _is_cuda(device) or not (worker.torch_info or {}).get("cuda_available"):
            return None
        free = gpu_free_memory(_nvml_index(device))  # None where NVML cannot tell
        if free is None or free >= mib << 20:
            return None
        return (f"the GPU is busy: {free >> 20} MiB free on {device}, this probe needs "
                f"{mib} MiB (not run, so as not to disturb what is using it)")

    def _needs_own_worker(self, task: _Task) -> bool:
        """Isolation protects a CUDA context; a probe that will run on the CPU cannot poison one,
        so it shares the worker (and its torch import) with the rest."""
        if not task.entry["isolated"]:
            return False
        if self.torch_info:
            device, _ = resolve_device(task.device, self.torch_info)
            return _is_cuda(device)
        return True

    def run_task(self, task: _Task) -> dict[str, Any]:
        """Run one task, starting a worker if needed. Returns the fields of its ProbeResult."""
        entry = task.entry
        isolated = self._needs_own_worker(task)
        if isolated and self.worker is not None and self.worker.used:
            self._drop_worker()
        if self.worker is None:
            try:
                self.worker = self._spawn()
            except ScanError as exc:
                return {"status": Status.CRASHED, "summary": f"could not start a fresh worker: {exc}"}
        worker = self.worker
        if task.needs_torch:
            crash = self._ensure_torch(worker)
            if crash:
                self.worker = None
                return crash
        device, note = resolve_device(task.device, worker.torch_info or self.torch_info)
        moved = {"requested_device": task.device, "device_note": note} if note else {}
        reason = self._memory_skip(task, device, worker)
        if reason:
            return {"status": Status.SKIPPED, "summary": reason, "device": device}

        limit = self.options.timeout or float(entry["timeout_s"])
        # The device the user asked for: probes such as cuda-runtime tell "you asked for a GPU
        # and there is none" (a finding) from "you asked for the CPU" (a skip).
        options: dict[str, Any] = {**dict(self.options.probe_options), "requested_device": task.device}
        if self.options.attn_shape:
            options["attn_shape"] = list(self.options.attn_shape)
        mark = worker.err_total
        started = time.monotonic()
        worker.used = True
        worker.send({"cmd": "run", "task": {
            "key": entry["key"], "device": device, "needs": entry["needs"], "options": options,
            "memory_budget_bytes": int(entry.get("gpu_memory_mib") or 512) << 20, **moved}})
        deadline = started + limit
        event = worker.event(deadline)
        while isinstance(event, dict) and event.get("event") == "start":
            event = worker.event(deadline)
        elapsed = time.monotonic() - started
        if isinstance(event, dict) and event.get("event") == "result" and event.get("key") == entry["key"]:
            fields = _from_result(event)
            if event.get("restart") or isolated:
                if event.get("restart"):
                    fields["details"]["context_poisoned"] = event["restart"]
                self._drop_worker()
            return fields
        self.worker = None
        died = self._lost(event, worker, mark, limit)
        died.update(duration_s=elapsed, device=device, details=dict(moved))
        return died

    @staticmethod
    def _lost(event: Any, worker: _Worker, mark: int, limit: float) -> dict[str, Any]:
        """The result fields for a worker that hung, died or broke the protocol; ends it."""
        if event == "timeout":
            worker.finish(grace=0)
            return {"status": Status.TIMED_OUT, "stderr_tail": worker.stderr_tail(mark),
                    "summary": f"no result after {limit:g} s: the worker was killed"}
        if event == "eof":
            return _death("the worker {how} while running this probe", worker, mark, worker.finish())
        worker.finish(grace=0)
        text = str(event)
        summary = (f"the worker wrote garbage on the protocol channel: {text[8:]!r}"
                   if text.startswith("garbage:") else f"unexpected protocol event: {text[:200]}")
        return {"status": Status.CRASHED, "summary": summary, "stderr_tail": worker.stderr_tail(mark)}

    def close(self) -> None:
        self._drop_worker()


def _tail_line(tail: str) -> str:
    lines = [line for line in (tail or "").strip().splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""


def _from_result(event: dict[str, Any]) -> dict[str, Any]:
    try:
        status = Status(event.get("status"))
    except ValueError:
        return {"status": Status.CRASHED, "summary": f"the probe returned an unknown status "
                f"{event.get('status')!r}", "details": {}}
    findings = []
    for f in event.get("findings") or []:
        if isinstance(f, dict) and f.get("kb_id"):
            findings.append(Finding(kb_id=str(f["kb_id"]), summary=str(f.get("summary", "")),
                                    evidence=tuple(str(e) for e in f.get("evidence") or ()),
                                    severity=str(f.get("severity", "error"))))
    return {"status": status, "summary": str(event.get("summary", "")),
            "details": dict(event.get("details") or {}), "findings": findings,
            "duration_s": float(event.get("duration_s") or 0.0), "device": event.get("device"),
            "stderr_tail": event.get("traceback")}


def _load_error_result(error: dict[str, Any]) -> ProbeResult:
    key = error["key"]
    probe = key.partition(":")[2].replace("_", "-") if ":" in key else key
    if key.startswith("file:"):
        probe = os.path.splitext(os.path.basename(error["source"]))[0].replace("_", "-")
    return ProbeResult(probe=probe, title=f"load {error['source']}", status=Status.CRASHED,
                       summary=f"the probe module could not be loaded: {error['error']}",
                       stderr_tail=(error.get("traceback") or "")[-STDERR_TAIL:] or None)


class _EnvironmentThread(threading.Thread):
    """Collects the environment while the worker imports torch: the scan then costs little more
    than the torch import itself."""

    def __init__(self, python: str, timeout: float) -> None:
        super().__init__(name="gpudoctor-environment", daemon=True)
        self.python, self.timeout = python, timeout
        self.environment: dict[str, Any] = {}

    def run(self) -> None:
        try:
            self.environment = dict(collect_environment(self.python, self.timeout))
        except Exception as exc:  # the environment is context; its failure must not cost the scan
            self.environment = {"error": f"{type(exc).__name__}: {exc}"}


def list_probes(options: ScanOptions) -> tuple[list[dict], list[dict]]:
    """The probes the target environment offers (built-ins, probe files, entry points) and the
    modules that failed to load, from a worker that does not import torch."""
    python = resolve_python(options.python)
    worker = _Worker(python, _worker_config(options, mode="list"))
    event = worker.event(time.monotonic() + options.startup_timeout)
    worker.finish()
    if not isinstance(event, dict) or event.get("event") != "catalog":
        raise ScanError(f"the worker in {python} did not start ({event})" + _tail_line(worker.stderr_tail()))
    return list(event.get("probes") or []), list(event.get("errors") or [])


def run_scan(options: ScanOptions, progress: Progress | None = None) -> Report:
    """Run the selected probes in isolated workers and return the report. Raises UsageError for
    bad options and ScanError when gpudoctor itself cannot run; a probe's failure is a result."""
    started, cpu_started = time.monotonic(), time.process_time()
    python = resolve_python(options.python)
    check_device(options.device)
    env_thread = None
    if options.collect_environment:
        env_thread = _EnvironmentThread(python, options.environment_timeout)
        env_thread.start()

    scan = _Scan(options, python, progress)
    results: list[ProbeResult] = []
    try:
        scan.worker = scan._spawn()
        catalog = scan.worker.catalog or {}
        probes, errors = list(catalog.get("probes") or []), list(catalog.get("errors") or [])
        selected = scan.select(probes)
        # A module that failed to load is a result in a full scan; with --probe, only the
        # --probe-file the user named counts.
        for error in errors:
            if not options.probes or error["key"].startswith("file:"):
                results.append(_load_error_result(error))
        tasks = scan.plan(selected, scan.worker)
        for index, task in enumerate(tasks, 1):
            entry = task.entry
            device = task.device if task.per_device else None
            scan.progress(ScanEvent("start", probe=entry["id"], title=entry["title"], device=device,
                                    index=index, total=len(tasks)))
            fields = scan.run_task(task)
            fields.setdefault("details", {})
            resolved = fields.pop("device", None) or task.device
            result = ProbeResult(probe=entry["id"], title=entry["title"],
                                 device=resolved if task.per_device else None, **fields)
            results.append(result)
            scan.progress(ScanEvent("result", probe=entry["id"], title=entry["title"], device=device,
                                    index=index, total=len(tasks), result=result))
    finally:
        scan.close()

    parent_environment: dict[str, Any] = {}
    if env_thread is not None:
        env_thread.join(options.environment_timeout + 5)
        parent_environment = env_thread.environment
    environment = merge_environment(parent_environment, scan.worker_environment)
    environment["scan"] = {
        "python": python,
        "requested_device": options.device,
        "devices": scan.devices,
        "workers": scan.workers_started,
        "parent_cpu_s": round(time.process_time() - cpu_started, 3),
    }
    report = Report(results=results, environment=environment, tool_version=gpudoctor.__version__,
                    redacted=False, duration_s=time.monotonic() - started)
    return redact(report) if options.redact else report

