"""The report: probe results, the environment, and who made it. Renderers (terminal, JSON,
Markdown) take a `Report` and never print on their own; the CLI decides where output goes.

Standard library only, no colours or markup in the model.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.probes.base import Finding, Status

SCHEMA_VERSION = "1.0"

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
            "environment": self.environment,
            "results": [r.to_dict() for r in self.results],
        }


def report_from_dict(data: dict[str, Any]) -> Report:
    """A `Report` from its `to_dict()` form (a saved or redacted JSON report)."""
    results = []
    for r in data.get("results", []):
        results.append(ProbeResult(
            probe=r["probe"],
            title=r.get("title", r["probe"]),
            status=Status(r["status"]),
            summary=r.get("summary", ""),
            duration_s=float(r.get("duration_s") or 0.0),
            device=r.get("device"),
            details=r.get("details") or {},
            findings=[
                Finding(f["kb_id"], f.get("summary", ""), tuple(f.get("evidence") or ()), f.get("severity", "error"))
                for f in r.get("findings") or []
            ],
            exit_code=r.get("exit_code"),
            signal=r.get("signal"),
            stderr_tail=r.get("stderr_tail"),
        ))
    return Report(
        results=results,
        environment=data.get("environment") or {},
        tool_version=(data.get("tool") or {}).get("version") or "",
        created=data.get("created", ""),
        redacted=bool(data.get("redacted", False)),
        duration_s=float(data.get("duration_s") or 0.0),
    )
