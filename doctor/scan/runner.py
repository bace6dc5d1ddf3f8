"""The isolated probe runner (parent side): `run_scan(options) -> Report`.

Probes never run in this process. They run in worker processes of the target interpreter
(`ScanOptions.python`, default `sys.executable`), started by `gpudoctor.scan.spawn` with a small bootstrap
that loads `gpudoctor.scan.worker` from this installation's directories, so the target environment needs
torch but not gpudoctor. What a worker says is untrusted input (`gpudoctor.scan.protocol` checks and
bounds it). A worker that segfaults, aborts, exits, hangs past the probe's limit or writes garbage
costs one result (`crashed` / `timed_out`, with the signal or exit code and the stderr tail): the
runner kills it with everything it started and goes on in a fresh worker.

How a scan goes:
  * Probe modules are loaded by the first worker, which announces each one before it loads it: a
    module that kills or hangs the worker at import is a load error for that module alone, and a
    fresh worker loads the rest. A SPEC that is malformed or reuses an id already taken is refused
    with a load error; no two results share an id.
  * torch is imported once per scan. If it cannot be (an error, a crash, a hang past the start-up
    limit), the report gets one `torch-import` result with the `torch-import-failed` finding, every
    probe that needs torch is skipped with that reason, and the import is not tried again.
  * `--device auto` (the default) is cuda:0 when the target's torch can use CUDA, else the CPU.
    An explicit CUDA device that does not exist is a usage error; where CUDA is not usable at all,
    only the probes that can report `cuda-unavailable` run (on the CPU, to say why) and the others
    are skipped with the reason: nothing moves to the CPU by surprise.
  * `ScanOptions.level` ("quick", the default, or "deep") reaches every probe as
    `ctx.options["level"]` and is recorded in the report: quick answers each probe's question with
    fewer cells, deep runs the full matrices.
  * Probes that poison the CUDA context on purpose (`isolated`) run last, each in a worker of its
    own, and that worker is started while the previous probes run: no worker is started twice.
  * Each result says which threads the probe left running. If a worker dies between two probes, or
    during a probe after an earlier one left threads behind, the interrupted probe runs again in a
    fresh worker and the death is charged to the probe that left something behind (or said to be
    uncertain), not to the innocent one.
  * SIGINT, SIGTERM and SIGHUP end every worker and all they started, then raise ScanInterrupted.

This module never imports torch; it reads NVML (one session per scan) only to keep GPU probes off a
device that lacks the free memory they need.

One worker process (its pipes, deadlines, stderr tail, and ending it with everything it started)
and the signals that stop a scan live in gpudoctor.scan.supervise; this module is the scheduling.
It stays above 800 lines because `_Scan` is one state machine (which worker runs what, the
torch import once, isolated probes last, retries and blame after a death): split, each half would
need the other's state to be read.
"""
from __future__ import annotations

import difflib
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gpudoctor
from gpudoctor.scan import protocol, spawn
from gpudoctor.scan.supervise import EXIT_GRACE_S, STDERR_TAIL, ScanSignals, Stop, WorkerProcess, ended_how, signame
from gpudoctor.scan.environment import NvmlSession, collect_environment, cuda_to_nvml, merge_environment
from gpudoctor.probes.base import DEFAULT_LEVEL, LEVELS, ProbeFinding, Status
from gpudoctor.reports.model import ProbeResult, Report
from gpudoctor.reports.redact import redact

MAX_TIMEOUT_S = protocol.MAX_TIMEOUT_S

TORCH_IMPORT_PROBE = "torch-import"  # the result that carries a failed torch import
TORCH_IMPORT_KB = "torch-import-failed"
CUDA_UNAVAILABLE_KB = "cuda-unavailable"  # probes that may emit it run even where CUDA is missing


class ScanError(Exception):
    """gpudoctor itself could not run (exit code 2)."""

    exit_code = 2


class UsageError(ScanError):
    """The options are wrong: an unknown probe id, a bad device or interpreter (exit code 2)."""


class ScanInterrupted(ScanError):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the scan. Every worker and everything it started
    was killed; no report exists. `exit_code` is 128 + the signal number (130, 143, 129)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.signal_name = signame(signum)
        super().__init__(f"interrupted by {self.signal_name}; the scan was stopped and no report was written")


@dataclass(frozen=True)
class ScanOptions:
    python: str | None = None  # target interpreter; None: this one
    probes: tuple[str, ...] = ()  # only these ids (empty: all)
    skip: tuple[str, ...] = ()
    device: str = "auto"  # "auto", "cpu", "cuda[:N]", "all" (every visible GPU), a torch device string
    timeout: float | None = None  # overrides every probe's own limit
    probe_files: tuple[str, ...] = ()
    attn_shape: tuple[int, ...] | None = None
    probe_options: tuple[tuple[str, Any], ...] = ()  # --probe-option KEY=VALUE, into ctx.options
    level: str = DEFAULT_LEVEL  # "quick" or "deep" (--level): how much of each matrix, ctx.level
    redact: bool = True
    builtin: bool = True  # False: only probe files and entry points (tests)
    entry_points: bool = True
    collect_environment: bool = True
    startup_timeout: float = 120.0  # worker start-up and the torch import; caps the --python check
    environment_timeout: float = 30.0
    load_timeout: float = 30.0  # importing one probe module


TORCH_READY = "torch ready"  # status after an import: progress goes back to the running probe


@dataclass(frozen=True)
class ScanEvent:
    """Progress for the CLI. kind: "status" (message), "start" or "result" (probe, result).
    `device` is the device the probe really runs on (None for per-scan probes); `index` counts
    probes in the order they run, which puts isolated probes last."""

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


def resolve_python(python: str | None, timeout: float = 30.0) -> str:
    """The target interpreter as an absolute path, checked to exist and run (UsageError if not).
    Symlinks are kept: a venv's `bin/python` is a symlink, and resolving it leaves the venv. One
    that does not answer within `timeout` is refused, and it and its children are killed."""
    if python is None:
        return sys.executable
    import shutil

    found = shutil.which(python) or python
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError(f"--python {python}: no such executable")
    try:
        out = spawn.run_bounded([found, "-c", "import sys; print('%d %d' % sys.version_info[:2])"], timeout)
    except OSError as exc:
        raise UsageError(f"--python {python}: does not run ({exc})") from None
    except Exception:  # subprocess.TimeoutExpired
        raise UsageError(f"--python {python}: did not answer within {timeout:g} s (killed)") from None
    version = out.stdout.split()
    if out.returncode != 0 or len(version) != 2 or not all(v.isdigit() for v in version):
        raise UsageError(f"--python {python}: not a working Python interpreter")
    if tuple(map(int, version)) < (3, 8):
        raise UsageError(f"--python {python}: Python {'.'.join(version)} is too old (3.8+)")
    return os.path.abspath(found)


_DEVICE = re.compile(r"^[a-z_][a-z0-9_]*(:\d+)?$")


def check_device(device: str) -> str:
    """The --device value normalised ("cuda" is cuda:0), or UsageError when it cannot be a device:
    "auto", "all", "cpu", "cuda:N" or another torch device string (checked against torch later)."""
    if not isinstance(device, str) or len(device) > 64:
        raise UsageError("--device: expected auto, cpu, cuda:N, all or a torch device string")
    if device in ("auto", "all") or _DEVICE.match(device):
        return "cuda:0" if device == "cuda" else device
    raise UsageError(f"--device {device}: expected auto, cpu, cuda:N, all or a torch device string")


def check_level(level: str) -> str:
    """The --level value, or UsageError naming the levels."""
    if level not in LEVELS:
        raise UsageError(f"--level {str(level)[:40]}: expected {' or '.join(LEVELS)}")
    return level


def check_timeouts(options: ScanOptions) -> None:
    """Every time limit a finite number of seconds in (0, MAX_TIMEOUT_S] (UsageError if not)."""
    for name, value in (("--timeout", options.timeout), ("startup_timeout", options.startup_timeout),
                        ("environment_timeout", options.environment_timeout),
                        ("load_timeout", options.load_timeout)):
        if name == "--timeout" and value is None:
            continue
        if protocol.valid_timeout(value) is None:
            raise UsageError(f"{name} {value!r:.40}: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")


def _did_you_mean(name: str, known: list[str]) -> str:
    """A near miss (`fake-kk`), or the id a short name is part of (`sdpa` for sdpa-backends, `fp8`);
    otherwise where the ids are listed."""
    close = difflib.get_close_matches(name, known, n=1)
    key = name.strip().lower()
    close += [k for k in known if len(key) >= 3 and key in k.lower() and k not in close]
    if close:
        return f" (did you mean {' or '.join(repr(c) for c in close[:3])}?)"
    return "; `gpudoctor scan --list-probes` lists them"


def _is_cuda(device: str) -> bool:
    return device.partition(":")[0] == "cuda"


def _cuda_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


# --- the scan ---------------------------------------------------------------------------------


@dataclass(eq=False)  # a task is itself: compared by identity
class _Task:
    entry: dict[str, Any]  # the worker's catalog entry, checked
    device: str  # the device it runs on (resolved)
    per_device: bool
    order: int = 0  # position in the report
    requested: str = ""  # the --device value
    note: str | None = None  # why it runs elsewhere than requested (cuda-unavailable probes)
    retried: bool = False
    preset: dict[str, Any] | None = None  # a result decided without running it (skips)

    @property
    def needs_torch(self) -> bool:
        return "torch" in self.entry["needs"]


def _worker_config(options: ScanOptions, mode: str = "scan", exclude: Any = ()) -> dict[str, Any]:
    return {"mode": mode, "builtin": options.builtin, "entry_points": options.entry_points,
            "probe_files": [os.path.abspath(p) for p in options.probe_files], "exclude": sorted(exclude)}


def _tail_line(tail: str) -> str:
    lines = [line for line in (tail or "").strip().splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""


def _kebab(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:50].strip("-") or "probe-module"


class _Scan:
    def __init__(self, options: ScanOptions, python: str, progress: Progress | None) -> None:
        self.options = options
        self.python = python
        self.progress = progress or (lambda event: None)
        self.excluded: dict[str, dict[str, Any]] = {}  # module key -> load error (it killed a worker)
        self.worker: WorkerProcess | None = None
        self.spare: WorkerProcess | None = None
        self.all_workers: list[WorkerProcess] = []
        self.workers_started = 0
        self.hello: dict[str, Any] | None = None  # the first successful torch import's hello
        self.torch_info: dict[str, Any] = {}
        self.worker_environment: dict[str, Any] | None = None
        self.torch_failure: dict[str, Any] | None = None
        self.devices: list[str] = []
        self.cuda_missing: str | None = None  # explicit CUDA asked for where it is not usable
        self.results: dict[int, ProbeResult] = {}
        self.ahead: list[_Task] = []  # isolated tasks not started yet, in the order they run
        self.nvml = NvmlSession()  # one NVML session for the scan, the environment's read included

    # --- workers

    def _launch(self, torch: str = "no", mode: str = "scan", claim: bool = False) -> WorkerProcess:
        launched = spawn.claim_early(self.python) if claim else None
        if launched is None:
            try:
                launched = spawn.launch(self.python, torch=torch)
            except OSError as exc:
                raise ScanError(f"cannot start {self.python}: {exc}") from None
        self.workers_started += 1
        worker = WorkerProcess(launched, _worker_config(self.options, mode, self.excluded))
        self.all_workers.append(worker)
        return worker

    def _deadline(self, worker: WorkerProcess, limit: float | None = None) -> float:
        what = worker.doing[0] if worker.doing else None
        if what == "load":
            return worker.since + self.options.load_timeout
        if what in ("start", "torch"):
            return worker.since + self.options.startup_timeout
        return worker.since + (limit if limit is not None else self.options.startup_timeout)

    def _await(self, worker: WorkerProcess, kind: str, limit: float | None = None) -> dict[str, Any] | str:
        """Read events until one of `kind`; a hello on the way is kept. Returns the event, or
        "eof", "timeout", "garbage:...", "unexpected:..."."""
        while True:
            event = worker.event(self._deadline(worker, limit))
            if not isinstance(event, dict):
                return event
            name = event["event"]
            if name == "begin":
                continue
            if name == "hello":
                self._take_hello(worker, event)
                if kind == "hello":
                    return event
                continue
            if name == kind:
                return event
            return f"unexpected:{name}"

    def _take_hello(self, worker: WorkerProcess, event: dict[str, Any]) -> None:
        info = event.get("torch_info")
        event["torch_info"] = info if isinstance(info, dict) else {}
        event["importable"] = event.get("importable") is True
        worker.hello = event
        if not event["importable"]:
            if self.torch_failure is None and self.hello is None:
                error = event.get("error")
                tb = event.get("traceback")
                self.torch_failure = {
                    "summary": protocol.cut(str(error or "torch failed to import"), protocol.SUMMARY_MAX),
                    "traceback": protocol.cut_tail(tb, STDERR_TAIL) if isinstance(tb, str) else None,
                    "how": "raised",
                }
            return
        if self.hello is None:
            self.hello = event
            self.torch_info = event["torch_info"]
            environment = event.get("environment")
            self.worker_environment = environment if isinstance(environment, dict) and environment else None

    def _retire(self, worker: WorkerProcess | None) -> None:
        if worker is None:
            return
        worker.finish()
        if self.worker is worker:
            self.worker = None
        if self.spare is worker:
            self.spare = None

    def close(self) -> None:
        """End every worker (the NVML session is closed by the caller, after the environment
        thread that shares it)."""
        for worker in self.all_workers:
            worker.finish()
        self.worker = self.spare = None

    # --- probe modules

    def load_catalog(self, mode: str = "scan") -> tuple[list[dict], list[dict]]:
        """The probes offered (checked, ids unique) and the load errors, from the first worker.
        A module that kills or hangs the worker while it loads is excluded and the rest are
        loaded again in a fresh worker (at most once per module)."""
        worker = self.worker = self._launch(mode=mode, claim=(mode == "scan"))
        if worker.launched.torch != "no":
            self.progress(ScanEvent("status", message="importing torch"))
        for _ in range(len(self.options.probe_files) + 64):
            event = self._await(worker, "catalog")
            if isinstance(event, dict):
                return self._check_catalog(event)
            doing = worker.doing
            stopped = "timeout" if event == "timeout" else "garbage" if event != "eof" else "died"
            code = worker.finish(grace=EXIT_GRACE_S if event == "eof" else 0)
            self.worker = None
            if doing and doing[0] == "load" and doing[1] not in self.excluded:
                what = (f"did not finish loading within {self.options.load_timeout:g} s" if stopped == "timeout"
                        else "wrote garbage on the protocol channel while loading" if stopped == "garbage"
                        else f"{ended_how(code)} while loading")
                self.excluded[doing[1]] = {"key": doing[1], "source": worker.doing_source or doing[1],
                                           "error": f"the probe module {what}",
                                           "traceback": worker.stderr_tail() or ""}
            elif doing and doing[0] == "torch" and self.torch_failure is None:
                self._torch_died(worker, stopped, code)
            else:
                raise ScanError(f"the worker in {self.python} did not start ({ended_how(code)}; {event})"
                                + _tail_line(worker.stderr_tail()))
            worker = self.worker = self._launch(mode=mode)
        raise ScanError(f"the workers in {self.python} kept dying while loading probe modules")

    def _check_catalog(self, event: dict[str, Any]) -> tuple[list[dict], list[dict]]:
        raw_probes = event.get("probes") if isinstance(event.get("probes"), list) else []
        raw_errors = event.get("errors") if isinstance(event.get("errors"), list) else []
        errors: list[dict] = []
        for raw in raw_errors:
            if isinstance(raw, dict):
                errors.append({name: protocol.cut(str(raw.get(name) or ""), limit) for name, limit in (
                    ("key", 300), ("source", 500), ("error", protocol.SUMMARY_MAX), ("traceback", STDERR_TAIL))})
        errors.extend(self.excluded.values())
        probes: list[dict] = []
        owners: dict[str, str] = {}
        for raw in raw_probes:
            try:
                entry = protocol.catalog_entry(raw)
            except protocol.Malformed as exc:
                source = raw.get("source") if isinstance(raw, dict) else None
                key = raw.get("key") if isinstance(raw, dict) else None
                errors.append({"key": str(key or "unknown"), "source": protocol.cut(str(source or key or "?"), 500),
                               "error": f"refused: {exc}", "traceback": ""})
                continue
            if entry["id"] in owners:
                errors.append({"key": entry["key"], "source": entry["source"], "traceback": "",
                               "error": f"refused: probe id {entry['id']!r} is already taken by "
                                        f"{owners[entry['id']]}; ids must be unique, so this one is not run"})
                continue
            owners[entry["id"]] = entry["source"]
            probes.append(entry)
        return probes, errors

    # --- torch

    def _torch_died(self, worker: WorkerProcess, stopped: str, code: tuple[int | None, str | None]) -> None:
        if stopped == "timeout":
            summary = (f"import torch did not finish within {self.options.startup_timeout:g} s "
                       f"(the import hangs; the worker was killed)")
            how = "hung"
        elif stopped == "garbage":
            summary = "the worker wrote garbage on the protocol channel while importing torch"
            how = "garbage"
        else:
            summary = f"the worker {ended_how(code)} while importing torch"
            how = "crashed"
        tail = worker.stderr_tail()
        self.torch_failure = {"summary": summary + _tail_line(tail), "traceback": tail or None,
                              "how": how, "exit_code": code[0] if how == "crashed" else None,
                              "signal": code[1] if how == "crashed" else None}

    def ensure_torch(self) -> None:
        """Import torch once per scan, in the current worker. A failure is recorded once."""
        if self.hello is not None or self.torch_failure is not None:
            return
        worker = self.worker or self._fresh()
        if worker is None:
            return
        if worker.hello is None:
            if worker.doing is None or worker.doing[0] != "torch":
                worker.send({"cmd": "torch", "environment": True})
            self.progress(ScanEvent("status", message="importing torch"))
            event = self._await(worker, "hello")
            if not isinstance(event, dict):
                stopped = "timeout" if event == "timeout" else "died" if event == "eof" else "garbage"
                code = worker.finish(grace=EXIT_GRACE_S if event == "eof" else 0)
                self.worker = None
                self._torch_died(worker, stopped, code)
        self.progress(ScanEvent("status", message=TORCH_READY))

    def _torch_in(self, worker: WorkerProcess) -> dict[str, Any] | None:
        """Import torch in a later worker (light hello). Returns crash fields if that fails."""
        if worker.hello is not None:
            if worker.hello.get("importable"):
                return None
            return {"status": Status.CRASHED, "summary": "torch failed to import in a fresh worker: "
                    + protocol.cut(str(worker.hello.get("error")), 500)}
        if worker.doing is None or worker.doing[0] != "torch":
            worker.send({"cmd": "torch", "environment": False})
        event = self._await(worker, "hello")
        if isinstance(event, dict):
            return self._torch_in(worker)
        code = worker.finish(grace=EXIT_GRACE_S if event == "eof" else 0)
        if self.worker is worker:
            self.worker = None
        return {"status": Status.CRASHED, "summary": f"a fresh worker {ended_how(code)} while importing "
                f"torch ({event})", "stderr_tail": worker.stderr_tail(), "exit_code": code[0], "signal": code[1]}

    def torch_missing_steps(self, error: str) -> tuple[str, ...]:
        """The steps for this machine when torch is simply not installed in the target interpreter
        (the entry's list covers every other cause, and stays one command away)."""
        if "No module named 'torch'" not in error:
            return ()
        return (f"torch is not installed in {self.python}: scan the environment that has it "
                "(`gpudoctor scan --python /path/to/that/bin/python`), or install torch there: on a "
                "machine with an NVIDIA GPU the line https://pytorch.org/get-started/locally/ gives for "
                "its CUDA version, elsewhere the CPU build, `python -m pip install torch numpy "
                "--index-url https://download.pytorch.org/whl/cpu`",)

    def torch_import_result(self) -> ProbeResult | None:
        failure = self.torch_failure
        if failure is None:
            return None
        first = failure["summary"].splitlines()[0] if failure["summary"] else "torch failed to import"
        evidence = tuple(t for t in (failure["summary"], failure.get("traceback")) if t)
        return ProbeResult(
            probe=TORCH_IMPORT_PROBE, title="import torch in the target interpreter",
            status=Status.FAIL, summary=f"torch cannot be imported in {self.python}: {first}",
            details={"python": self.python, "error": failure["summary"], "how": failure["how"]},
            findings=[ProbeFinding(TORCH_IMPORT_KB, protocol.cut(first, protocol.SUMMARY_MAX),
                              tuple(protocol.cut_tail(e, protocol.TEXT_MAX) for e in evidence),
                              steps=self.torch_missing_steps(first))],
            exit_code=failure.get("exit_code"), signal=failure.get("signal"),
            stderr_tail=failure.get("traceback"))

    # --- planning

    def select(self, catalog: list[dict], errors: list[dict]) -> list[dict]:
        ids = [p["id"] for p in catalog]
        # A --probe naming a probe whose file failed to load is answered by the load error.
        file_failed = any(str(e.get("key", "")).startswith("file:") for e in errors)
        for name in (*self.options.probes, *self.options.skip):
            if name not in ids and not file_failed:
                raise UsageError(f"unknown probe {name!r}{_did_you_mean(name, ids)}")
        chosen = [p for p in catalog if not self.options.probes or p["id"] in self.options.probes]
        return [p for p in chosen if p["id"] not in self.options.skip]

    def resolve_devices(self, selected: list[dict]) -> None:
        requested = check_device(self.options.device)
        if any("torch" in p["needs"] for p in selected):
            self.ensure_torch()
        info = self.torch_info if self.hello is not None else None
        cuda_ok = bool(info and info.get("cuda_available"))
        count = int((info or {}).get("device_count") or 0) if cuda_ok else 0
        reason = str((info or {}).get("cuda_unavailable_reason") or "CUDA is not available")
        if requested == "auto":
            self.devices = ["cuda:0" if cuda_ok else "cpu"]
            return
        if requested == "all":
            self.devices = [f"cuda:{i}" for i in range(count)] or ["cuda:0"]
        else:
            self.devices = [requested]
        if info is None:
            return  # no torch: the probes that need it are skipped anyway
        if _is_cuda(requested) or requested == "all":
            if not cuda_ok:
                self.cuda_missing = reason
            elif _cuda_index(requested) >= count:
                raise UsageError(f"--device {requested}: no such CUDA device; torch sees {count} "
                                 f"(cuda:0 to cuda:{count - 1})")
            return
        if requested != "cpu" and self.worker is not None:
            self.worker.send({"cmd": "device", "device": requested})
            event = self._await(self.worker, "device")
            if isinstance(event, dict) and event.get("ok") is False:
                error = str(event.get("error") or "not a device torch knows").splitlines()[0]
                raise UsageError(f"--device {requested}: {protocol.cut(error, 300)}")

    def plan(self, selected: list[dict]) -> list[_Task]:
        tasks: list[_Task] = []
        for entry in selected:
            devices = self.devices if entry["per_device"] else self.devices[:1]
            for device in devices:
                task = _Task(entry, device, entry["per_device"], order=len(tasks), requested=self.options.device)
                self._place(task)
                tasks.append(task)
        return tasks

    def _place(self, task: _Task) -> None:
        """Decide where the task runs, or that it does not run at all (preset skip)."""
        if task.needs_torch and self.torch_failure is not None:
            # The error itself is torch-import's (one cause, one finding): not repeated per probe.
            task.preset = {"status": Status.SKIPPED, "summary": (
                f"torch could not be imported in {self.python} (see {TORCH_IMPORT_PROBE})")}
        elif self.cuda_missing is not None and task.needs_torch and _is_cuda(task.device):
            if CUDA_UNAVAILABLE_KB in task.entry["emits"]:
                task.note = self.cuda_missing  # it runs on the CPU to say why CUDA is unusable
                task.requested, task.device = task.device, "cpu"
            else:
                task.preset = {"status": Status.SKIPPED, "summary": (
                    f"{task.device} was asked for, but CUDA is not usable here: {self.cuda_missing}")}

    def own_worker(self, task: _Task) -> bool:
        """Isolation protects a CUDA context: a torch probe that runs on the CPU cannot poison one,
        so it shares the worker (and its torch import) with the rest."""
        return bool(task.entry["isolated"]) and (_is_cuda(task.device) or not task.needs_torch)

    # --- running

    def _fresh(self) -> WorkerProcess | None:
        """A worker for the next task: the prestarted spare, or a new one (torch on demand) when
        there is none or it did not come up."""
        candidates = [self.spare] if self.spare is not None else []
        self.spare = None
        for attempt in range(2):
            if attempt >= len(candidates):
                try:
                    candidates.append(self._launch())
                except ScanError:
                    return None
            worker = candidates[attempt]
            event = self._await(worker, "catalog")
            if isinstance(event, dict):
                return worker
            worker.finish(grace=EXIT_GRACE_S if event == "eof" else 0)
        return None

    def prestart_spare(self) -> None:
        """Start the worker the next isolated probe will need, so that its start-up (its torch
        import) overlaps the probes still running. Started from this thread, as every worker:
        PR_SET_PDEATHSIG follows the thread that started the process."""
        if self.spare is None and self.ahead:
            torch = "light" if self.ahead[0].needs_torch and self.torch_failure is None else "no"
            try:
                self.spare = self._launch(torch=torch)
            except ScanError:
                self.spare = None

    def _memory_check(self, task: _Task) -> tuple[str | None, str | None]:
        """(skip reason, note for details) from NVML's free memory on the task's GPU."""
        mib = int(task.entry.get("gpu_memory_mib") or 0)
        if mib <= 0 or not _is_cuda(task.device) or not self.torch_info.get("cuda_available"):
            return None, None
        index = _cuda_index(task.device)
        uuids = (self.hello or {}).get("device_uuids")
        uuid = uuids[index] if isinstance(uuids, list) and index < len(uuids) else None
        names = None if uuid else self.nvml.names()
        ref = cuda_to_nvml(index, uuid if isinstance(uuid, str) else None, os.environ, names)
        if ref[0] == "unknown":
            return None, f"free GPU memory not checked: {ref[1]}"
        free = self.nvml.free_memory(ref)
        if free is None or free >= mib << 20:
            return None, None
        return (f"the GPU is busy: {free >> 20} MiB free on {task.device}, this probe needs "
                f"{mib} MiB (not run, so as not to disturb what is using it)"), None

    def run_task(self, task: _Task) -> dict[str, Any]:
        """Run one task, starting a worker if needed. Returns the fields of its ProbeResult."""
        if task.preset is not None:
            return dict(task.preset)
        entry = task.entry
        own = self.own_worker(task)
        if own and self.worker is not None and self.worker.used:
            self._retire(self.worker)
        if self.worker is None:
            self.worker = self._fresh()
            if self.worker is None:
                return {"status": Status.CRASHED, "summary": "could not start a fresh worker"}
        if own and task in self.ahead:
            self.ahead.remove(task)
            self.prestart_spare()  # the next isolated probe's worker starts while this one runs
        worker = self.worker
        if task.needs_torch:
            crash = self._torch_in(worker)
            if crash:
                return crash
        skip, memory_note = self._memory_check(task)
        if skip:
            return {"status": Status.SKIPPED, "summary": skip}

        limit = self.options.timeout or float(entry["timeout_s"])
        # The device the user asked for: probes such as cuda-runtime tell "you asked for a GPU
        # and there is none" (a finding) from "you asked for the CPU" (a skip).
        options: dict[str, Any] = {**dict(self.options.probe_options), "requested_device": task.requested,
                                   "level": self.options.level}
        if self.options.probes:
            # The probes named with --probe: one such as fp8-matmul skips what is not worth a
            # finding in a full scan (FP8 on a GPU without it) but checks it when named.
            options["requested_probes"] = list(self.options.probes)
        if self.options.attn_shape:
            options["attn_shape"] = list(self.options.attn_shape)
        moved = {"requested_device": task.requested, "device_note": task.note} if task.note else {}
        mark = worker.err_total
        started = time.monotonic()
        worker.used = True
        worker.doing, worker.since = ("sent", entry["key"]), started
        worker.send({"cmd": "run", "task": {
            "key": entry["key"], "device": task.device, "needs": entry["needs"], "options": options,
            "memory_budget_bytes": int(entry.get("gpu_memory_mib") or 512) << 20, **moved}})
        event = self._await(worker, "result", limit)
        began = worker.doing == ("run", entry["key"]) or isinstance(event, dict)
        elapsed = time.monotonic() - started
        if isinstance(event, dict) and event.get("key") == entry["key"]:
            fields = protocol.result_fields(event)
            fields["status"] = Status(fields["status"])
            extra = {}
            if moved:
                extra.update(moved)
            if memory_note:
                extra["memory_check"] = memory_note
            left = [protocol.cut(str(t), 200) for t in event.get("left_running") or [] if t][:20]
            cancelled = [protocol.cut(str(t), 200) for t in event.get("cancelled") or [] if t][:20]
            if left:
                extra["left_running"] = left
                worker.suspects[task.order] = left
            if cancelled:
                extra["cancelled_timers"] = cancelled
            restart = event.get("restart")
            if restart:
                extra["context_poisoned"] = protocol.cut(str(restart), protocol.SUMMARY_MAX)
            fields["details"].update(extra)
            worker.history.append((task.order, entry["id"]))
            if restart or own:
                worker.finish(grace=EXIT_GRACE_S if restart else 0)
                self._retire(worker)
            return fields
        return self._lost(task, worker, event, began, mark, limit, elapsed)

    def _lost(self, task: _Task, worker: WorkerProcess, event: Any, began: bool, mark: int, limit: float,
              elapsed: float) -> dict[str, Any]:
        """Fields for a task whose worker hung, died or broke the protocol, after deciding whom to
        blame: this probe, or one that ran before it in the same worker."""
        code = worker.finish(grace=EXIT_GRACE_S if event == "eof" else 0)
        if self.worker is worker:
            self.worker = None
        tail = worker.stderr_tail(mark)
        suspects = dict(worker.suspects)
        if event == "timeout":
            died = {"status": Status.TIMED_OUT, "stderr_tail": tail,
                    "summary": f"no result after {limit:g} s: the worker was killed"}
            how = f"hung (no answer in {limit:g} s)"
        elif event == "eof":
            died = {"status": Status.CRASHED, "summary": f"the worker {ended_how(code)} while running this probe",
                    "exit_code": code[0], "signal": code[1], "stderr_tail": tail}
            how = ended_how(code)
        else:
            text = str(event)
            died = {"status": Status.CRASHED, "stderr_tail": tail, "summary": (
                f"the worker wrote garbage on the protocol channel: {text[8:]!r}" if text.startswith("garbage:")
                else f"unexpected protocol event: {text[:200]}")}
            how = "broke the protocol"
        died.update(duration_s=elapsed, details={})
        if task.note:
            died["details"].update(requested_device=task.requested, device_note=task.note)
        rerun = not task.retried and (not began or (bool(suspects) and event != "timeout"))
        if not rerun:
            if suspects and began:
                died["details"]["earlier_probes_left_running"] = self._names(suspects)
                died["summary"] += (f" (uncertain: {self._names_text(suspects)} left threads running in "
                                    f"this worker, which may be the cause)")
            return died
        # The probe never began, or a thread an earlier probe left behind may have killed the worker:
        # run it again in a fresh worker, then charge the death to whoever it belongs to.
        task.retried = True
        again = self.run_task(task)
        again.setdefault("details", {})
        crashed_again = again["status"] in (Status.CRASHED, Status.TIMED_OUT)
        if began and crashed_again:
            again["details"]["first_attempt"] = f"the worker {how} in the first attempt too"
            return again
        culprits = sorted(suspects) or ([worker.history[-1][0]] if worker.history else [])
        when = "while the next probe ran" if began else "after it returned, before the next probe began"
        again["details"]["first_attempt"] = (
            f"the first worker {how} {'while this probe ran' if began else 'before this probe began'}; "
            f"it ran again in a fresh worker" + (f" (charged to {self._names_text({c: [] for c in culprits})})"
                                                 if culprits else ""))
        for order in culprits:
            self._charge(order, how, when, len(culprits) > 1, suspects.get(order), died)
        return again

    def _names(self, orders: dict[int, list[str]]) -> list[str]:
        return [self.results[o].probe if o in self.results else str(o) for o in sorted(orders)]

    def _names_text(self, orders: dict[int, Any]) -> str:
        return ", ".join(self._names(orders))

    def _charge(self, order: int, how: str, when: str, shared: bool, left: list[str] | None,
                died: dict[str, Any]) -> None:
        result = self.results.get(order)
        if result is None:
            return
        result.details["verdict_before_crash"] = {"status": result.status.value, "summary": result.summary}
        cause = (f"a thread it left running ({', '.join(left)})" if left
                 else "something it left behind (a thread, a timer or a child)")
        result.status = Status.CRASHED
        result.summary = protocol.cut(
            f"the worker {how} {when}: {cause} is the likely cause" + (
                "; uncertain, more than one probe left threads running" if shared else ""),
            protocol.SUMMARY_MAX)
        result.exit_code, result.signal = died.get("exit_code"), died.get("signal")
        result.stderr_tail = died.get("stderr_tail") or result.stderr_tail


def _load_error_result(error: dict[str, Any], taken: set[str]) -> ProbeResult:
    key = str(error.get("key") or "")
    source = str(error.get("source") or key)
    if key.startswith("file:"):
        base = _kebab(os.path.splitext(os.path.basename(source))[0])
    else:
        base = _kebab(key.partition(":")[2] or key)
    probe = base
    if probe in taken:
        probe = f"{base}-load-error"
        n = 2
        while probe in taken:
            probe, n = f"{base}-load-error-{n}", n + 1
    taken.add(probe)
    tail = str(error.get("traceback") or "")
    return ProbeResult(probe=probe, title=protocol.cut(f"load {source}", protocol.TITLE_MAX),
                       status=Status.CRASHED,
                       summary=protocol.cut(f"the probe module could not be loaded: {error.get('error')}",
                                            protocol.SUMMARY_MAX),
                       details={"module": protocol.cut(source, 500)},
                       stderr_tail=protocol.cut_tail(tail, STDERR_TAIL) or None)


class _EnvironmentThread(threading.Thread):
    """Collects the environment while the worker imports torch: the scan then costs little more
    than the torch import itself."""

    def __init__(self, python: str, timeout: float, nvml: NvmlSession | None = None) -> None:
        super().__init__(name="gpudoctor-environment", daemon=True)
        self.python, self.timeout, self.nvml = python, timeout, nvml
        self.environment: dict[str, Any] = {}

    def run(self) -> None:
        try:
            self.environment = dict(collect_environment(self.python, self.timeout, self.nvml))
        except Exception as exc:  # the environment is context; its failure must not cost the scan
            self.environment = {"error": f"{type(exc).__name__}: {exc}"}


def list_probes(options: ScanOptions) -> tuple[list[dict], list[dict]]:
    """The probes the target environment offers (built-ins, probe files, entry points) and the
    modules that failed to load or were refused, from workers that do not import torch."""
    check_timeouts(options)
    python = resolve_python(options.python, min(30.0, options.startup_timeout))
    scan = _Scan(options, python, None)
    try:
        return scan.load_catalog(mode="list")
    finally:
        scan.close()


def run_scan(options: ScanOptions, progress: Progress | None = None) -> Report:
    """Run the selected probes in isolated workers and return the report. Raises UsageError for
    bad options, ScanError when gpudoctor itself cannot run and ScanInterrupted when a signal
    stopped it; a probe's failure is a result."""
    with ScanSignals() as signals:
        try:
            return _run_scan(options, progress, signals)
        except (KeyboardInterrupt, Stop) as exc:
            signals.quiet()
            spawn.end_all()  # what the clean-up could not know: a process started half-way
            signum = exc.signum if isinstance(exc, Stop) else signal.SIGINT
            raise ScanInterrupted(signum) from None


def _run_scan(options: ScanOptions, progress: Progress | None, signals: ScanSignals) -> Report:
    started, cpu_started = time.monotonic(), time.process_time()
    check_timeouts(options)
    check_device(options.device)
    check_level(options.level)
    python = resolve_python(options.python, min(30.0, options.startup_timeout))
    scan = _Scan(options, python, progress)
    env_thread = None
    if options.collect_environment:
        env_thread = _EnvironmentThread(python, options.environment_timeout, scan.nvml)
        env_thread.start()

    load_errors: list[dict] = []
    tasks: list[_Task] = []
    try:
        catalog, load_errors = scan.load_catalog()
        selected = scan.select(catalog, load_errors)
        if options.probes:  # with --probe, only the --probe-files the user named count
            load_errors = [e for e in load_errors if str(e.get("key", "")).startswith("file:")]
        scan.resolve_devices(selected)
        tasks = scan.plan(selected)
        torch_result = scan.torch_import_result()
        if torch_result is not None:
            scan.progress(ScanEvent("result", probe=torch_result.probe, title=torch_result.title,
                                    total=len(tasks), result=torch_result))
        shared = [t for t in tasks if t.preset is not None or not scan.own_worker(t)]
        isolated = [t for t in tasks if t not in shared]
        # Workers for the isolated probes start ahead, one at a time, while earlier probes run.
        scan.ahead = list(isolated)
        scan.prestart_spare()
        for index, task in enumerate(shared + isolated, 1):
            entry = task.entry
            device = task.device if task.per_device else None
            scan.progress(ScanEvent("start", probe=entry["id"], title=entry["title"], device=device,
                                    index=index, total=len(tasks)))
            fields = scan.run_task(task)
            fields.setdefault("details", {})
            fields.pop("device", None)
            findings = [f if isinstance(f, ProbeFinding) else ProbeFinding(f["kb_id"], f["summary"], tuple(f["evidence"]),
                                                                  f["severity"], tuple(f.get("steps") or ()))
                        for f in fields.pop("findings", [])]
            result = ProbeResult(probe=entry["id"], title=entry["title"],
                                 device=device, findings=findings, **fields)
            scan.results[task.order] = result
            scan.progress(ScanEvent("result", probe=entry["id"], title=entry["title"], device=device,
                                    index=index, total=len(tasks), result=result))
    except BaseException:
        signals.quiet()
        scan.close()
        scan.nvml.close()
        raise
    signals.quiet()
    scan.close()

    results: list[ProbeResult] = []
    torch_result = scan.torch_import_result()
    if torch_result is not None:
        results.append(torch_result)
    taken = {t.entry["id"] for t in tasks} | {TORCH_IMPORT_PROBE}
    results.extend(_load_error_result(e, taken) for e in load_errors)
    results.extend(scan.results[t.order] for t in tasks if t.order in scan.results)

    parent_environment: dict[str, Any] = {}
    if env_thread is not None:
        env_thread.join(options.environment_timeout + 5)
        parent_environment = env_thread.environment
    scan.nvml.close()
    environment = merge_environment(parent_environment, scan.worker_environment)
    if scan.worker_environment is None and scan.torch_failure is not None:
        environment["torch"] = {"available": False, "reason": scan.torch_failure["summary"]}
    environment["scan"] = {
        "python": python,
        "requested_device": options.device,
        "devices": scan.devices,
        "workers": scan.workers_started,
        "worker_env": spawn.worker_env_defaults(),  # what gpudoctor set for its workers
        "parent_cpu_s": round(time.process_time() - cpu_started, 3),
    }
    report = Report(results=results, environment=environment, tool_version=gpudoctor.__version__,
                    redacted=False, duration_s=time.monotonic() - started, level=options.level)
    return redact(report) if options.redact else report
