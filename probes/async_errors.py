"""The `async-errors` probe: where does a failing CUDA kernel's error surface, and is the
environment set up to find it?

The experiment indexes a 4-element tensor at position 10 (a device-side assert on CUDA) and records
the first call that raises: the launch itself, an unrelated later launch, `torch.cuda.synchronize()`
or `.item()`. It runs first in the worker, with the environment as the user has it (usually
asynchronous reporting: the error shows up calls later). On CUDA that poisons the worker's context
for good (hence `isolated=True`), so the comparison run with CUDA_LAUNCH_BLOCKING=1 (the error at
the launch line) happens in a fresh child interpreter, whose output also carries the device's
"Assertion `...` failed" line. The child is started first and runs while the in-process
experiment does (its torch import and CUDA context dominate the probe's time); it cannot import a
`torch/` folder from the working directory (the `-c` entry on sys.path is dropped, as the worker's
bootstrap does). On the CPU the same index raises synchronously, at the launch; the
environment checks (CUDA_LAUNCH_BLOCKING, the build-time-only TORCH_USE_CUDA_DSA) run everywhere.

`classify_cuda_error` sorts a pasted CUDA error text into a knowledge-base id and the trailer's
hints; it is standard library only.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Union

from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status

SPEC = ProbeSpec(
    id="async-errors",
    title="Asynchronous CUDA error reporting and device-side asserts",
    timeout_s=90.0,
    emits=("async-error-reporting", "device-side-assert"),
    needs=("torch",),
    isolated=True,
    gpu_memory_mib=64,
    description=(
        "Triggers an out-of-range index on the device and records where the error surfaces, with "
        "and without CUDA_LAUNCH_BLOCKING=1; checks the debugging environment variables."
    ),
)

CHILD_TIMEOUT_S = 40.0
STAGES = ("launch", "unrelated-launch", "synchronize", "item")
_MARKER = "GPUDOCTOR-ASYNC-RESULT "

# The experiment, as source: the worker runs it in-process (exec) and the child interpreter runs
# the same text, so both measure exactly the same calls.
EXPERIMENT = r"""
def experiment(torch, device):
    cuda = device.startswith("cuda")
    rec = {"stages_ok": [], "error_stage": None, "error": None}

    def step(name, fn):
        try:
            fn()
        except Exception as exc:
            rec["error_stage"] = name
            rec["error"] = f"{type(exc).__name__}: {exc}"
            return False
        rec["stages_ok"].append(name)
        return True

    x = torch.zeros(4, device=device)
    idx = torch.tensor([10], device=device)
    if cuda:
        torch.cuda.synchronize(device)
    box = {}

    def launch():
        box["y"] = x[idx]

    def unrelated():
        box["z"] = torch.ones(8, device=device) * 2

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    def item():
        box["v"] = box["y"].sum().item()

    step("launch", launch) and step("unrelated-launch", unrelated) and step(
        "synchronize", synchronize) and step("item", item)
    return rec
"""
_CHILD = EXPERIMENT + r"""
import json, sys
# `python -c` puts the working directory first on sys.path: a pytorch source tree there would be
# imported instead of the installed torch.
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import torch
print(MARKER + json.dumps(experiment(torch, sys.argv[1])), flush=True)
""".replace("MARKER", repr(_MARKER))


def experiment_in_process(torch: Any, device: str) -> dict[str, Any]:
    """Run the experiment here. On CUDA this poisons the process's CUDA context for good."""
    namespace: dict[str, Any] = {}
    exec(EXPERIMENT, namespace)  # noqa: S102 - our own constant source, shared with the child
    return namespace["experiment"](torch, device)


@dataclass(frozen=True)
class ErrorClass:
    """What a CUDA error text says. `kb_id` is the most specific knowledge-base id, or None."""

    kb_id: str | None
    cuda_error: str | None  # e.g. "device-side assert triggered"
    assertion: str | None  # the failed device assertion's condition, when printed
    asynchronous_hint: bool  # the "might be asynchronously reported" trailer
    launch_blocking_hint: bool  # "consider passing CUDA_LAUNCH_BLOCKING=1" (with or without ".")
    dsa_hint: bool  # older builds: "Compile with `TORCH_USE_CUDA_DSA` ..."


_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+?)\s*(?:\n|$)")
_ASSERTION = re.compile(r"Assertion `(.+?)` failed")
# Most specific first: the generic "asynchronously reported" trailer only when nothing else matched.
_SPECIFIC = (
    ("device-side-assert", re.compile(r"device-side assert triggered|Assertion `.+?` failed")),
    ("illegal-memory-access", re.compile(r"an illegal memory access was encountered")),
    ("misaligned-address", re.compile(r"misaligned address")),
)


def classify_cuda_error(text: str) -> ErrorClass:
    """Classify a CUDA error as pasted by a user (exception text, optionally with the device's
    assert lines). Rules, in order: a device-side assert (the runtime's "device-side assert
    triggered" or a printed "Assertion `...` failed") -> device-side-assert; "an illegal memory
    access" -> illegal-memory-access; "misaligned address" -> misaligned-address; otherwise, when the
    asynchronous-reporting trailer or the CUDA_LAUNCH_BLOCKING hint is present ->
    async-error-reporting; else None. Trailer variants across versions (with or without the final
    period, with or without the `TORCH_USE_CUDA_DSA` line) are all accepted."""
    kb_id = next((kb for kb, pattern in _SPECIFIC if pattern.search(text)), None)
    asynchronous = "might be asynchronously reported at some other API call" in text
    blocking = re.search(r"consider passing CUDA_LAUNCH_BLOCKING=1\.?", text) is not None
    if kb_id is None and (asynchronous or blocking):
        kb_id = "async-error-reporting"
    cuda_error = _CUDA_ERROR.search(text)
    assertion = _ASSERTION.search(text)
    return ErrorClass(
        kb_id=kb_id,
        cuda_error=cuda_error.group(1).rstrip(".") if cuda_error else None,
        assertion=assertion.group(1) if assertion else None,
        asynchronous_hint=asynchronous,
        launch_blocking_hint=blocking,
        dsa_hint="Compile with `TORCH_USE_CUDA_DSA`" in text,
    )


def environment_checks(env: Mapping[str, str]) -> tuple[dict[str, Any], list[ProbeFinding]]:
    """The debugging switches as the user has set them, and what is wrong with them."""
    keys = ("CUDA_LAUNCH_BLOCKING", "TORCH_USE_CUDA_DSA", "PYTORCH_USE_CUDA_DSA",
            "PYTORCH_CUDA_DSA_STACKTRACING")
    seen = {k: env.get(k) for k in keys}
    findings: list[ProbeFinding] = []
    if env.get("TORCH_USE_CUDA_DSA") is not None:
        findings.append(
            ProbeFinding(
                "device-side-assert",
                "TORCH_USE_CUDA_DSA is set at runtime, where it does nothing: it is a build-time "
                "(CMake) flag, and release wheels are built without it",
                evidence=(
                    f"TORCH_USE_CUDA_DSA={env['TORCH_USE_CUDA_DSA']}",
                    "the runtime switch is PYTORCH_USE_CUDA_DSA=1 (with "
                    "PYTORCH_CUDA_DSA_STACKTRACING=1), effective only in a torch built with "
                    "TORCH_USE_CUDA_DSA; for release wheels use CUDA_LAUNCH_BLOCKING=1",
                ),
                severity="warning",
            )
        )
    blocking = env.get("CUDA_LAUNCH_BLOCKING")
    seen["launch_blocking_active"] = blocking is not None and blocking.strip() == "1"
    return seen, findings


Started = Union[subprocess.Popen, dict]


def start_experiment(device: str, launch_blocking: bool,
                     env: Mapping[str, str] | None = None) -> Started:
    """Start EXPERIMENT in a fresh interpreter and return at once; `finish_experiment` collects
    it. Returns the outcome directly when the interpreter cannot even start."""
    child_env = dict(os.environ if env is None else env)
    child_env.pop("CUDA_LAUNCH_BLOCKING", None)
    if launch_blocking:
        child_env["CUDA_LAUNCH_BLOCKING"] = "1"
    cmd = [sys.executable, "-c", _CHILD, device]
    try:
        return subprocess.Popen(cmd, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        return {"outcome": "crashed", "returncode": None, "stderr_tail": str(exc), "device_assert": []}


def finish_experiment(proc: Started, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Wait for a started experiment (at most `timeout_s`); the result says which stage raised."""
    if isinstance(proc, dict):
        return proc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"outcome": "timed-out", "timeout_s": timeout_s}
    out = stdout + "\n" + stderr
    line = next((ln for ln in stdout.splitlines() if ln.startswith(_MARKER)), None)
    # The device prints one assert line per failing thread; one is enough evidence.
    asserts = [ln.strip() for ln in out.splitlines() if "Assertion `" in ln][:1]
    if line is None:
        return {"outcome": "crashed", "returncode": proc.returncode,
                "stderr_tail": stderr[-2000:], "device_assert": asserts}
    rec = json.loads(line[len(_MARKER):])
    rec.update(outcome="ok", returncode=proc.returncode, device_assert=asserts)
    if rec["error"]:
        rec["classified"] = classify_cuda_error(rec["error"] + "\n" + "\n".join(asserts)).__dict__
    return rec


def run_experiment(device: str, launch_blocking: bool, timeout_s: float = CHILD_TIMEOUT_S,
                   env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run EXPERIMENT in a fresh interpreter; the result says which stage raised, and what."""
    return finish_experiment(start_experiment(device, launch_blocking, env), timeout_s)


def run(ctx: ProbeContext) -> Outcome:
    env_seen, findings = environment_checks(os.environ)
    details: dict[str, Any] = {"environment": env_seen}
    # The comparison run needs a fresh process (this one's context is poisoned by the experiment):
    # started first, it imports torch and creates its context while the experiment runs here.
    child = start_experiment(ctx.device, launch_blocking=True) if ctx.is_cuda else None
    try:
        # In the worker, as the user's code would see it (the runner gives this probe its own worker).
        default = experiment_in_process(ctx.torch, ctx.device)
    except BaseException:
        if isinstance(child, subprocess.Popen):
            child.kill()
            child.communicate()
        raise
    if default["error"]:
        default["classified"] = classify_cuda_error(default["error"]).__dict__
    details["default"] = default

    if not ctx.is_cuda:
        if default["error_stage"] != "launch":
            return Outcome(Status.FAIL, f"an out-of-range index on {ctx.device} raised no error "
                           "at its launch", details, findings)
        summary = (
            f"on {ctx.device} errors are synchronous: the out-of-range index raised at the launch "
            "line; asynchronous reporting needs CUDA"
        )
        return Outcome(Status.WARN if findings else Status.PASS, summary, details, findings)

    blocking = finish_experiment(child)
    details["launch_blocking"] = blocking
    if blocking["outcome"] != "ok":
        return Outcome(Status.WARN, f"the CUDA_LAUNCH_BLOCKING=1 experiment {blocking['outcome']}",
                       details, findings)
    if default["error_stage"] is None or blocking["error_stage"] is None:
        return Outcome(Status.FAIL, "an out-of-range index on the device raised no error at all",
                       details, findings)
    default["device_assert"] = blocking.get("device_assert", [])  # printed only to our stderr

    late = default["error_stage"] != "launch"
    as_set = f"CUDA_LAUNCH_BLOCKING={env_seen['CUDA_LAUNCH_BLOCKING'] or 'unset'}"
    evidence = (
        f"as configured ({as_set}): first error at `{default['error_stage']}`",
        f"with CUDA_LAUNCH_BLOCKING=1: first error at `{blocking['error_stage']}`",
        default["error"].splitlines()[0],
        *default["device_assert"],
    )
    # Late reporting and a poisoned context after a device-side assert are how CUDA works on
    # every healthy GPU: what the user should know goes in the details, with the entries that
    # explain it. A finding is what is wrong here: the debugging recipe itself failing.
    kb_ids = ["async-error-reporting"] if late else []
    if (default.get("classified") or {}).get("kb_id") == "device-side-assert":
        kb_ids.append("device-side-assert")
    details["observed"] = {
        "late_reporting": late,
        "evidence": list(evidence),
        "explained_by": [f"gpudoctor explain {kb}" for kb in kb_ids],
        "note": (f"on {ctx.device} a failing kernel is reported at `{default['error_stage']}`"
                 + (", not at its launch: a traceback points at a later, innocent line; rerun with "
                    "CUDA_LAUNCH_BLOCKING=1 to see the real one" if late else "")
                 + "; after a device-side assert the CUDA context is unusable and the process "
                 "must restart"),
    }
    summary = (
        f"as configured ({as_set}) the error surfaced at `{default['error_stage']}`; with "
        f"CUDA_LAUNCH_BLOCKING=1 at `{blocking['error_stage']}`"
    )
    if blocking["error_stage"] != "launch":
        findings.append(
            ProbeFinding(
                "async-error-reporting",
                f"on {ctx.device} even with CUDA_LAUNCH_BLOCKING=1 a failing kernel is reported at "
                f"`{blocking['error_stage']}`, not at its launch: the usual way to find the failing "
                "line does not work here",
                evidence=evidence,
            )
        )
        status = Status.FAIL
    elif findings:
        status = Status.WARN  # the environment checks' findings (TORCH_USE_CUDA_DSA at runtime)
    else:
        status = Status.PASS
    return Outcome(status, summary, details, findings)
