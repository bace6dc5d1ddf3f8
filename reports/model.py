"""The report: probe results, the environment, and who made it. Renderers (terminal, JSON,
Markdown) take a `Report` and never print on their own; the CLI decides where output goes.

Standard library only, no colours or markup in the model.

Schema versions (reports/schema.json): 1.0 is the first; 1.1 adds `invocation` (the command and
options that produced the report, redacted with the rest); 1.2 a finding's `steps`; 1.3 `level`,
the scan level ("quick" or "deep") the matrices were run at (absent before: those reports ran
what is now "deep"). Minor versions only add optional
fields, so `report_from_dict` reads every 1.x report; another major version is refused with
`ReportFormatError`, as is a document that is not a report.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.probes.base import Finding, Status

SCHEMA_VERSION = "1.3"  # 1.2: a finding's optional `steps`; 1.3: the report's `level`
READABLE_MAJOR = 1

# Statuses that mean "findings exist": `gpudoctor scan` exits 1 when any result has one of them.
PROBLEM_STATUSES = frozenset({Status.FAIL, Status.CRASHED, Status.TIMED_OUT})


@dataclass
class ProbeResult:
    probe: str  # probe id
    title: str
    status: Status
    summary: str
    duration_s: float = 0.0
    device: str | None = None  # "cuda:0", "cpu"; None for per-scan probes
    details: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    # Set by the runner when the worker died or hung: exit code or signal name, and stderr's tail.
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "title": self.title,
            "device": self.device,
            "status": self.status.value,
            "summary": self.summary,
            "duration_s": round(self.duration_s, 4),
            "details": self.details,
            "findings": [f.to_dict() for f in self.findings],
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stderr_tail": self.stderr_tail,
        }


@dataclass
class Report:
    results: list[ProbeResult] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    tool_version: str = ""
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )
    redacted: bool = True
    duration_s: float = 0.0
    # How the report was made: {"command": "gpudoctor scan ...", "argv": [...], "options": {...}};
    # None for a report built without the CLI (or read from a 1.0 report).
    invocation: dict[str, Any] | None = None
    # The scan level ("quick" or "deep"); None for a report built without the runner, or read from
    # a report older than 1.3 (whose matrices were what "deep" runs now: see `matrices_level`).
    level: str | None = None

    @property
    def matrices_level(self) -> str:
        """The level the matrices were run at: a report without one predates levels and ran the
        full matrices, which is "deep"."""
        return self.level or "deep"

    @property
    def findings(self) -> list[tuple[ProbeResult, Finding]]:
        return [(r, f) for r in self.results for f in r.findings]

    @property
    def has_problems(self) -> bool:
        return any(r.status in PROBLEM_STATUSES for r in self.results)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for r in self.results:
            out[r.status.value] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "gpudoctor", "version": self.tool_version},
            "created": self.created,
            "redacted": self.redacted,
            "duration_s": round(self.duration_s, 3),
            "summary": self.counts(),
            "invocation": self.invocation,
            **({"level": self.level} if self.level else {}),
            "environment": self.environment,
            "results": [r.to_dict() for r in self.results],
        }


class ReportFormatError(ValueError):
    """The data is not a gpudoctor report this version can read (one line, for the user)."""


def lookup(data: Any, *keys: str) -> Any:
    """`data[k1][k2]...` through nested objects of a report read from JSON, or None where a level is
    missing or not an object (a report from another version, or a hand-edited one)."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def report_from_dict(data: Any) -> Report:
    """A `Report` from its `to_dict()` form (a saved or redacted JSON report of any 1.x schema).
    Raises ReportFormatError, naming the first thing that is wrong, for anything else."""
    if not isinstance(data, dict):
        raise ReportFormatError(f"not a gpudoctor report: the JSON is {type(data).__name__}, not an object")
    version = data.get("schema_version")
    major = str(version).partition(".")[0]
    if not isinstance(version, str) or not major.isdigit():
        raise ReportFormatError(f"not a gpudoctor report: schema_version is {version!r}")
    if int(major) != READABLE_MAJOR:
        raise ReportFormatError(
            f"report schema {version} is not readable by this gpudoctor (it reads {READABLE_MAJOR}.x)")
    results = []
    for n, r in enumerate(_list(data, "results")):
        where = f"results[{n}]"
        try:
            results.append(ProbeResult(
                probe=str(r["probe"]),
                title=str(r.get("title") or r["probe"]),
                status=Status(r["status"]),
                summary=str(r.get("summary") or ""),
                duration_s=float(r.get("duration_s") or 0.0),
                device=None if r.get("device") is None else str(r["device"]),
                details=r.get("details") if isinstance(r.get("details"), dict) else {},
                findings=[
                    Finding(str(f["kb_id"]), str(f.get("summary") or ""),
                            tuple(str(e) for e in _list(f, "evidence")), str(f.get("severity") or "error"),
                            tuple(str(s) for s in _list(f, "steps")))
                    for f in _list(r, "findings")
                ],
                exit_code=r.get("exit_code") if isinstance(r.get("exit_code"), int) else None,
                signal=None if r.get("signal") is None else str(r["signal"]),
                stderr_tail=None if r.get("stderr_tail") is None else str(r["stderr_tail"]),
            ))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportFormatError(f"{where} is malformed ({type(exc).__name__}: {exc})") from None
    invocation = data.get("invocation")
    try:
        return Report(
            results=results,
            environment=data.get("environment") if isinstance(data.get("environment"), dict) else {},
            tool_version=str((data.get("tool") or {}).get("version") or ""),
            created=str(data.get("created") or ""),
            redacted=bool(data.get("redacted", False)),
            duration_s=float(data.get("duration_s") or 0.0),
            invocation=invocation if isinstance(invocation, dict) else None,
            level=data["level"] if data.get("level") in ("quick", "deep") else None,
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReportFormatError(f"the report's header is malformed ({type(exc).__name__}: {exc})") from None


def _list(data: Any, key: str) -> list[Any]:
    value = data.get(key) if isinstance(data, dict) else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise ReportFormatError(f"{key} is {type(value).__name__}, not a list")
    return value
