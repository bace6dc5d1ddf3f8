"""The fleet report: what `gpudoctor merge` and `gpudoctor scan --distributed` return.

A `FleetReport` holds the job (launcher, job id, expected nodes and ranks), one `NodeSummary` per
node that reported, and the `FleetFinding`s. Every finding names its culprits as `Culprit`s
(node, rank, GPU, and the value that differs), so "which node, which GPU" is a field, not prose.
Its JSON form carries `kind: "gpudoctor-fleet-report"` and its own `schema_version`, validated
against reports/fleet_schema.json in the tests.

Standard library only; no colours or markup in the model.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

FLEET_SCHEMA_VERSION = "1.0"
FLEET_KIND = "gpudoctor-fleet-report"

ERROR, WARNING = "error", "warning"

# Finding kinds, in the order the renderers show them (most urgent first). docs/fleets.md lists them.
KINDS: tuple[str, ...] = (
    "missing-node",
    "missing-rank",
    "unreadable-report",
    "scan-failed",
    "collective-failed",
    "late-rank",
    "straggler",
    "bandwidth-low",
    "gpu-count",
    "gpu-model",
    "gpu-hardware",
    "pcie-degraded",
    "version-drift",
    "nccl-env-drift",
    "hardware-drift",
    "verdict-drift",
    "common-problem",
    "duplicate-report",
    "mixed-jobs",
)


@dataclass(frozen=True)
class Culprit:
    """Where a finding applies: node (display name), rank, GPU ("GPU 3", "cuda:1"), and the value
    this place has (the version, the status, the TFLOP/s), with an optional detail line."""

    node: str | None
    rank: int | None = None
    gpu: str | None = None
    value: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "gpu": self.gpu, "value": self.value, "detail": self.detail}

    def where(self) -> str:
        parts = [self.node or "unknown node"]
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.gpu:
            parts.append(self.gpu)
        return " ".join(parts)


@dataclass(frozen=True)
class FleetFinding:
    kind: str
    severity: str  # "error" or "warning"
    summary: str  # one line
    key: str | None = None  # what differs: "torch", "package xformers", "NCCL_IB_HCA", a probe id
    expected: str | None = None  # the fleet's value (the majority), when there is one
    culprits: tuple[Culprit, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "summary": self.summary,
            "key": self.key,
            "expected": self.expected,
            "culprits": [c.to_dict() for c in self.culprits],
        }


@dataclass
class NodeSummary:
    name: str  # display name: a pseudonym (node-3) when redacted
    index: int  # the number in the pseudonym
    ranks: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # input files (or "rank 3")
    gpus: list[dict[str, Any]] = field(default_factory=list)  # {"gpu": "GPU 0", "model": ...}
    versions: dict[str, str] = field(default_factory=dict)  # torch, CUDA, driver, ... (brief)
    counts: dict[str, int] = field(default_factory=dict)  # probe statuses
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "ranks": self.ranks,
            "sources": self.sources,
            "gpus": self.gpus,
            "versions": self.versions,
            "counts": self.counts,
            "duration_s": self.duration_s,
        }


@dataclass
class FleetReport:
    job: dict[str, Any] = field(default_factory=dict)  # launcher, job_id, node_list, expected counts
    nodes: list[NodeSummary] = field(default_factory=list)
    findings: list[FleetFinding] = field(default_factory=list)
    stragglers: dict[str, Any] = field(default_factory=dict)  # groups, medians, expectations
    collectives: dict[str, Any] | None = None  # distributed scans only
    inputs: dict[str, Any] = field(default_factory=dict)  # reports read, unreadable
    thresholds: dict[str, float] = field(default_factory=dict)
    tool_version: str = ""
    redacted: bool = True
    duration_s: float = 0.0
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )

    @property
    def errors(self) -> list[FleetFinding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def has_problems(self) -> bool:
        """Exit code 1: any error-level finding (warnings alone exit 0, as in `scan`)."""
        return bool(self.errors)

    def counts(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "ranks": sum(len(n.ranks) for n in self.nodes),
            "gpus": sum(len(n.gpus) for n in self.nodes),
            "errors": len(self.errors),
            "warnings": len(self.findings) - len(self.errors),
        }

    def verdict(self) -> str:
        """One line: healthy, or the first thing to fix."""
        expected = self.job.get("expected_nodes")
        nodes = f"{len(self.nodes)} of {plural(expected, 'node')}" if expected else plural(len(self.nodes), "node")
        c = self.counts()
        if not self.findings:
            return f"healthy: {nodes} reported, {plural(c['gpus'], 'GPU')}, nothing differs"
        first = self.errors[0] if self.errors else self.findings[0]
        warnings = plural(c["warnings"], "warning")
        head = f"{plural(c['errors'], 'error')}, {warnings}" if c["errors"] else warnings
        return f"{head} across {nodes}; first: {first.summary}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": FLEET_KIND,
            "schema_version": FLEET_SCHEMA_VERSION,
            "tool": {"name": "gpudoctor", "version": self.tool_version},
            "created": self.created,
            "redacted": self.redacted,
            "duration_s": round(self.duration_s, 3),
            "verdict": self.verdict(),
            "summary": self.counts(),
            "job": self.job,
            "inputs": self.inputs,
            "thresholds": self.thresholds,
            "nodes": [n.to_dict() for n in self.nodes],
            "findings": [f.to_dict() for f in self.findings],
            "stragglers": self.stragglers,
            "collectives": self.collectives,
        }


def plural(count: int, noun: str) -> str:
    """`1 node`, `2 nodes`: a verdict line reads as a sentence."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
