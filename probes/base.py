"""The probe contract: a frozen spec, a context handed to `run`, and the outcome it returns.

A probe module defines `SPEC: ProbeSpec` and `run(ctx: ProbeContext) -> Outcome`. It must not import
torch at module level (the CLI reads SPEC without torch); `run` receives torch through the context.
This module is standard library only: it is loaded inside probe workers of any target interpreter.
"""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager


class Status(str, enum.Enum):
    """A probe's verdict. `skipped` means "could not tell" and always carries a reason;
    `crashed` and `timed_out` are set by the runner, never by a probe itself."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"
    CRASHED = "crashed"
    TIMED_OUT = "timed_out"


# Requirements a probe may declare in `ProbeSpec.needs`. The worker checks them before `run` and
# skips with the reason when one is missing; "cuda" is satisfied only when the context's device is a
# CUDA device, so device-agnostic probes must *not* declare it.
NEEDS = ("torch", "cuda", "xformers", "flash_attn")

# How much of each matrix a scan runs (`gpudoctor scan --level`), like `dcgmi diag -r`'s levels.
# "quick" (the scan's default) answers every probe's question with fewer cells; "deep" runs the
# full matrices. A probe whose cost is negligible runs the same at both. Each probe that cuts
# cells says in its docstring which and why, and the tests prove both levels give the same
# verdicts and findings for every simulated fault.
LEVELS = ("quick", "deep")
DEFAULT_LEVEL = "quick"


@dataclass(frozen=True)
class ProbeSpec:
    id: str  # kebab-case, shared with the report and the documentation
    title: str
    timeout_s: float = 30.0  # the runner kills the worker after this
    emits: tuple[str, ...] = ()  # knowledge-base ids this probe may report; a test checks they exist
    needs: tuple[str, ...] = ("torch",)
    per_device: bool = True  # run once per device under `--device all`; False: once per scan
    isolated: bool = False  # deliberately poisons the CUDA context: gets a worker of its own
    gpu_memory_mib: int = 512  # budget; the runner skips the probe when the GPU has less free
    description: str = ""
    # False for a probe that judges CUDA itself (its runtime, kernel images, CUDA-only kernels):
    # on another device it has nothing to run and skips with its reason. Documentation and tests
    # read it (the probe table in docs/scan.md; which probes a healthy CPU machine passes); the
    # worker does not: a probe decides at run time, from `ctx.is_cuda`, what it can do.
    runs_on_cpu: bool = True


@dataclass(frozen=True)
class ProbeFinding:
    """One diagnosed problem: a knowledge-base id, a one-line cause, and the evidence for it
    (exact exception texts, shapes, dtypes, strides, backends). `steps`, when the probe knows
    which of the entry's causes this is, are the fix for this machine: shown instead of the
    entry's generic list, which `gpudoctor explain` still prints whole."""

    kb_id: str
    summary: str
    evidence: tuple[str, ...] = ()
    severity: str = "error"  # "error" or "warning"
    steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kb_id": self.kb_id,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "severity": self.severity,
        }
        if self.steps:  # schema 1.2; absent rather than empty, so other findings read as before
            out["steps"] = list(self.steps)
        return out


# The name that probe files written against 0.2 import (plugins, `--probe-file`).
Finding = ProbeFinding


@dataclass
class Outcome:
    """What `run` returns. `details` must be JSON-serialisable (str, int, float, bool, None, lists
    and dicts of those); it is the probe's measured data (matrices, timings, errors per case)."""

    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    findings: list[ProbeFinding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "summary": self.summary,
            "details": self.details,
            "findings": [f.to_dict() for f in self.findings],
        }


def passed(summary: str, **details: Any) -> Outcome:
    return Outcome(Status.PASS, summary, dict(details))


def skipped(reason: str, **details: Any) -> Outcome:
    if not reason:
        raise ValueError("a skip must carry its reason")
    return Outcome(Status.SKIPPED, reason, dict(details))


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """`1 conversion`, `3 conversions`, `no syncs`: a probe's summary reads as a sentence."""
    if count == 0:
        return f"no {plural or singular + 's'}"
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


# CUDA runtime errors after which the context is unusable ("sticky"): every later call in the
# process returns the same error, `cudaFree` (so `torch.cuda.empty_cache()`) included. The texts are
# cudaGetErrorString's for cudaErrorIllegalAddress, MisalignedAddress, Assert, LaunchFailure,
# IllegalInstruction, InvalidPc, HardwareStackError, LaunchTimeout and ECCUncorrectable. Anything
# else (a CUBLAS_STATUS_*, "invalid argument", "out of memory") is reported once and leaves the
# context usable, so it must not stop a probe.
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "illegal instruction",
    "invalid program counter",
    "hardware stack error",
    "launch timed out",
    "uncorrectable ecc error",
)


def is_sticky_cuda_error(text: str) -> bool:
    """Whether an error text is one of the CUDA errors that poison the context for good."""
    low = text.lower()
    return any(needle in low for needle in STICKY_CUDA_ERRORS)


@dataclass
class ProbeContext:
    """Everything a probe's workload needs. `device` is a torch device string ("cuda:0", "cpu",
    or a custom backend such as "privateuseone:0"); the same workload runs on any of them."""

    torch: Any  # the imported torch module
    device: str
    options: dict[str, Any] = field(default_factory=dict)  # e.g. {"attn_shape": [B, H, N, D]}
    memory_budget_bytes: int = 512 << 20
    log: Callable[[str], None] = lambda message: None  # free-form notes for the stderr tail

    @property
    def level(self) -> str:
        """"quick" or "deep" (`options["level"]`, set by the runner for every probe). Absent, as
        when a probe is called directly, it is "deep": the full matrices, as before levels."""
        level = self.options.get("level")
        return level if level in LEVELS else "deep"

    @property
    def deep(self) -> bool:
        return self.level == "deep"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sync(self) -> None:
        """Synchronise the device so that asynchronous errors surface inside the probe."""
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def device_guard(self) -> ContextManager[Any]:
        """Make `device` the current CUDA device for the block. Events, `can_use_*` checks and
        `getCurrentDeviceProperties` follow the *current* device, not the tensors', so without it
        `--device cuda:1` would time or judge device 0. A no-op off CUDA."""
        if self.is_cuda:
            return self.torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def poisoned(self, text: str = "") -> str | None:
        """Why the CUDA context can no longer be used after an error with this text, or None. A
        sticky text says so by itself; otherwise a synchronize that raises proves it."""
        if not self.is_cuda:
            return None
        if text and is_sticky_cuda_error(text):
            return text.splitlines()[0]
        try:
            self.torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - the sticky error itself
            return error_text(exc).splitlines()[0]
        return None


def error_text(exc: BaseException) -> str:
    """The exception as a user would paste it: type name and message, first line kept exact."""
    return f"{type(exc).__name__}: {exc}".strip()
