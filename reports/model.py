"""The report: probe results, the environment, and who made it. Renderers (terminal, JSON,
Markdown) take a `Report` and never print on their own; the CLI decides where output goes.

Standard library only (and gpudoctor.safetext, to show untrusted ids in the verdict), no colours
or markup in the model.

Schema versions (reports/schema.json): 1.0 is the first; 1.1 adds `invocation` (the command and
options that produced the report, redacted with the rest); 1.2 a finding's `steps`; 1.3 `level`,
the scan level ("quick" or "deep") the matrices were run at (absent before: those reports ran
what is now "deep"); 1.4 `verdict`, the scan's verdict (`Report.verdict`: healthy or not, its
line, the id to fix first and the command that tells its story), so that a program reads the
answer without re-deriving it from the results. Minor versions only add optional
fields, so `report_from_dict` reads every 1.x report; another major version is refused with
`ReportFormatError`, as is a document that is not a report.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.probes.base import ProbeFinding, Status

SCHEMA_VERSION = "1.4"  # 1.2: a finding's optional `steps`; 1.3: the report's `level`; 1.4: `verdict`
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
    findings: list[ProbeFinding] = field(default_factory=list)
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


@dataclass(frozen=True)
class Verdict:
    """The scan in one line: healthy, or the one thing to fix first and how to learn more."""

    healthy: bool  # no probe failed, crashed or timed out (scan exits 0)
    line: str
    fix_id: str | None = None  # the knowledge-base id (or probe id) to deal with first
    command: str | None = None  # the command that tells its full story

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "line": self.line, "fix_first": self.fix_id, "next": self.command}


def _one_line(text: Any, limit: int = 2000) -> str:
    """Untrusted text as one visible line (gpudoctor.reports.render.one_line)."""
    from gpudoctor.safetext import visible

    return " ".join(visible(str(text), limit).split())


def _fit(text: str, width: int) -> str:
    """`text` shortened to about `width` terminal cells at a word boundary, with "…" where it was
    cut (wide characters count two cells)."""
    import unicodedata

    def cells(t: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1 for c in t)

    if cells(text) <= width:
        return text
    if width <= 1:
        return "…"
    cut = text[:width]
    while cut and cells(cut) > width - 1:
        cut = cut[:-1]
    space = cut.rfind(" ")
    if space >= width // 2:  # a word boundary not too far back; else cut the long token itself
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


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
    def findings(self) -> list[tuple[ProbeResult, ProbeFinding]]:
        return [(r, f) for r in self.results for f in r.findings]

    @property
    def has_problems(self) -> bool:
        return any(r.status in PROBLEM_STATUSES for r in self.results)

    def verdict(self) -> Verdict:
        """Healthy, or the one thing to fix first. Errors found by a failed probe come first, in run
        order (arch-compat and cuda-runtime run first and are the most fundamental), then probes that
        crashed, timed out or failed without a finding; warnings never make a machine unhealthy."""
        results = self.results
        if not results:
            return Verdict(True, "nothing checked: no probe ran")
        if self.has_problems:
            errors = [(r, f) for r, f in self.findings if f.severity == "error" and r.status in PROBLEM_STATUSES]
            errors += [(r, f) for r, f in self.findings if f.severity == "error" and (r, f) not in errors]
            problems = sum(1 for r in results if r.status in PROBLEM_STATUSES)
            if errors:
                fix_id = _one_line(errors[0][1].kb_id, 100)
                command = f"gpudoctor explain {fix_id}"
            else:
                r = next(r for r in results if r.status in PROBLEM_STATUSES)
                fix_id = f"{_one_line(r.probe, 100)} {r.status.value.replace('_', ' ')}"
                command = f"gpudoctor scan --probe {_one_line(r.probe, 100)} -v"
            noun = "problem" if problems == 1 else "problems"
            return Verdict(False, f"NOT HEALTHY ({problems} {noun}); fix first: {fix_id}", fix_id, command)
        if all(r.status is Status.SKIPPED for r in results):
            return Verdict(True, f"nothing checked: all {len(results)} probe runs skipped",
                           command=f"gpudoctor scan -v  (why: {_fit(_one_line(results[0].summary, 200), 60)})")
        warned = [_one_line(f.kb_id, 100) for _, f in self.findings]
        warned += [_one_line(r.probe, 100) for r in results if r.status is Status.WARN and not r.findings]
        if warned:
            unique = list(dict.fromkeys(warned))
            shown = ", ".join(unique[:2]) + (f" and {len(unique) - 2} more" if len(unique) > 2 else "")
            noun = "warning" if len(unique) == 1 else "warnings"
            return Verdict(True, f"healthy, {len(unique)} {noun}: {shown}", unique[0],
                           f"gpudoctor explain {unique[0]}" if self.findings else None)
        return Verdict(True, "healthy")

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
            "verdict": self.verdict().to_dict(),
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
                    ProbeFinding(str(f["kb_id"]), str(f.get("summary") or ""),
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
