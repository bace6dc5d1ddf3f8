"""`gpudoctor merge`: per-node (or per-rank) scan reports -> one fleet report.

Inputs are JSON scan reports: files, folders of `*.json`, `-` for standard input; a file may hold
several reports one after another (`srun ... > all.json` with one task per node). A report that
cannot be read is a finding (`unreadable-report`), not the end of the merge: a node that died
while writing is exactly what a fleet report must show.

What the merge reports (every finding names node, rank and GPU through its `Culprit`s):

- missing nodes and ranks, from the job the reports carry (Slurm's node list and counts, torchrun's
  world size); reports from several jobs, or the same rank twice, are named too;
- version drift, compared rank by rank: torch, its CUDA, cuDNN and NCCL, the driver and the CUDA
  version it supports, Python, every installed package, NCCL plugins, `NCCL_*` variables;
- hardware-state drift, compared node by node and GPU by GPU among GPUs of the same model: GPU
  count and model, VBIOS, PCIe link width and generation against their maximum (a link that
  drops its generation while idle is power saving, not a finding), ECC mode and uncorrectable
  errors, row remapping, throttle reasons that mean trouble, clocks, power limits, NVLink links,
  persistence mode;
- stragglers: a GPU whose measured GEMM throughput (matmul-sanity) is more than
  `straggler_fraction` below the median of its model and mode AND below `expect_fraction` of the
  model's nominal peak; GPUs with no nominal peak (the CPU, unknown models) are not judged, and the
  report says so;
- every probe whose verdict differs between places, and problems common to all of them;
- a place whose torch cannot be imported, once (`scan-failed`: "node-3: torch cannot be
  imported"), instead of a version drift for torch, its CUDA, cuDNN and NCCL and a verdict drift
  for every probe it skipped for want of torch.

Majorities decide the expected value; with a tie there is none, and every side is named.
Reading the reports and what one report says (`Member`) live in gpudoctor.fleet.readers; this
module compares the members and names what differs. Untrusted contents are bounded there
(`_text`) and printed through gpudoctor.safetext by the renderers. Standard library only: no
torch, no rich.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Sequence

import gpudoctor
from gpudoctor.fleet import nodelist
from gpudoctor.fleet.model import (
    ERROR, WARNING, Culprit, FleetFinding, FleetReport, KINDS, NodeSummary, plural,
)
from gpudoctor.fleet.readers import (  # noqa: F401 (MergeInputError: what merge_files raises)
    _HW_DRIFT, Gpu, Loaded, Member, MergeInputError, _int, load_members, member_from_report,
)

LIST_IN_SUMMARY = 4  # places named in a one-line summary before "+N more"

PROBLEM_STATUSES = frozenset({"fail", "crashed", "timed_out"})
_STATUS_HEALTH = {"pass": 0, "warn": 1, "skipped": 2, "fail": 3, "timed_out": 4, "crashed": 5}

# Throttle (clock event) reasons that mean the GPU is being held back by trouble, not by idling or
# a power cap it is allowed to hit.
BAD_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")

# Version keys compared rank by rank, with the severity of a difference. torch, its CUDA, NCCL and
# the driver must agree for collectives and numerics to agree.
_ERROR_VERSION_KEYS = frozenset({"torch", "torch CUDA", "cuDNN", "NCCL", "driver", "CUDA driver"})
# What a place whose torch cannot be imported does not have to compare: its torch finding says it.
_TORCH_KEYS = frozenset({"torch", "torch CUDA", "cuDNN", "NCCL", "package torch"})
TORCH_IMPORT_PROBE = "torch-import"  # gpudoctor.scan.runner's result for a failed torch import


@dataclass(frozen=True)
class MergeOptions:
    straggler_fraction: float = 0.10  # more than this below the median of the model and mode...
    expect_fraction: float = 0.60  # ...and below this fraction of the nominal peak
    redact: bool = True

    def thresholds(self) -> dict[str, float]:
        return {"straggler_fraction": self.straggler_fraction, "expect_fraction": self.expect_fraction}


# --- nodes, job, expectations -------------------------------------------------------------------


@dataclass
class Node:
    index: int
    name: str  # display name
    real: str | None  # real host name, when known
    members: list[Member] = field(default_factory=list)
    _gpu_ranks: dict[str, int | None] | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted({m.rank for m in self.members if m.rank is not None})

    def rank_of_gpu(self, gpu_index: int) -> int | None:
        """The rank that scanned NVML GPU `gpu_index` (one rank on the node: that rank)."""
        if self._gpu_ranks is None:
            ranks = {m.rank for m in self.members}
            self._gpu_ranks = {}
            if len(ranks) > 1:
                for m in self.members:
                    for _, device, _, _ in m.results:
                        if device and device.startswith("cuda:"):
                            index = device[5:]
                            nvml = m.visible[int(index)] if index.isdigit() and int(index) < len(m.visible) else index
                            self._gpu_ranks.setdefault(nvml, m.rank)
        if not self._gpu_ranks:
            return self.members[0].rank if len({m.rank for m in self.members}) == 1 else None
        return self._gpu_ranks.get(str(gpu_index))


def _majority(values: Iterable[Any]) -> Any:
    counts = Counter(v for v in values if v is not None)
    return counts.most_common(1)[0][0] if counts else None


def _job(members: list[Member]) -> dict[str, Any]:
    job_id = _majority(m.job_id for m in members)
    main = [m for m in members if m.job_id == job_id] if job_id is not None else members
    node_list = _majority(m.node_list for m in main)
    expanded: list[str] | None = None
    node_list_error = None
    if node_list:
        try:
            expanded = nodelist.expand(node_list)
        except ValueError as exc:
            node_list_error = str(exc)
    num_nodes = _majority(m.num_nodes for m in main)
    if expanded and not num_nodes:
        num_nodes = len(expanded)
    return {
        "launcher": _majority(m.launcher for m in main),
        "job_id": job_id,
        "node_list": node_list,
        "expanded": expanded,
        "node_list_error": node_list_error,
        "expected_nodes": num_nodes,
        "expected_ranks": _majority(m.world_size for m in main),
        "local_world_size": _majority(m.local_world_size for m in main),
        "main": main,
    }


def _assign_nodes(members: list[Member], job: dict[str, Any], redact: bool) -> list[Node]:
    """Group members into nodes and number them: the main job's node index (Slurm node id,
    torchrun group rank) when known, so that node-3 is node 3 of the job; the rest after."""
    main_ids = {id(m) for m in job["main"]}
    groups: dict[tuple, list[Member]] = {}
    for m in members:
        if m.node_index is not None and id(m) in main_ids:
            key: tuple = ("index", m.node_index)
        elif m.real_name:
            key = ("host", m.real_name.lower())
        else:
            key = ("input", m.position)
        groups.setdefault(key, []).append(m)
    expanded = job["expanded"] or []
    position = {name: i for i, name in reversed(list(enumerate(expanded)))}
    taken = {key[1] for key in groups if key[0] == "index"}
    next_free = max([job["expected_nodes"] or 0, len(expanded), *(i + 1 for i in taken)] or [0])
    nodes = []
    for key, group in groups.items():
        if key[0] == "index":
            index = key[1]
        else:
            real = group[0].real_name
            if real and real in position and position[real] not in taken:
                index = position[real]
                taken.add(index)
            else:
                index, next_free = next_free, next_free + 1
        real = next((m.real_name for m in group if m.real_name), None)
        if real is None and index < len(expanded) and key[0] == "index":
            real = expanded[index]
        name = f"node-{index}" if redact or not real else real
        node = Node(index, name, real, group)
        for m in group:
            m.node = node
        nodes.append(node)
    nodes.sort(key=lambda n: n.index)
    return nodes


def _node_name(index: int, job: dict[str, Any], redact: bool) -> str:
    expanded = job["expanded"] or []
    if not redact and index < len(expanded):
        return expanded[index]
    return f"node-{index}"


# --- findings -----------------------------------------------------------------------------------


def _places(culprits: Sequence[Culprit]) -> str:
    """"node-1 rank 3, node-4 rank 9 (+6 more)": the first few places, for a one-line summary."""
    seen = list(dict.fromkeys(c.where() for c in culprits))  # first occurrences, in order
    text = ", ".join(seen[:LIST_IN_SUMMARY])
    if len(seen) > LIST_IN_SUMMARY:
        text += f" (+{len(seen) - LIST_IN_SUMMARY} more)"
    return text


def _culprit(m: Member, gpu: str | None = None, value: str | None = None, detail: str | None = None) -> Culprit:
    return Culprit(node=m.node.name if m.node else None, rank=m.rank, gpu=gpu, value=value, detail=detail)


def _differ(
    kind: str, key: str, entries: list[tuple[Culprit, str]], severity: str, noun: str = "",
) -> FleetFinding | None:
    """One drift finding for `key` from (place, value) pairs, or None when all agree. The majority
    value is expected; with a tie every place is named."""
    counts = Counter(v for _, v in entries)
    if len(counts) < 2:
        return None
    ranked = counts.most_common()
    tie = ranked[0][1] == ranked[1][1]
    expected = None if tie else ranked[0][0]
    culprits = tuple(Culprit(c.node, c.rank, c.gpu, value, c.detail) for c, value in entries if value != expected)
    parts = []
    for value, _ in ranked:
        if value == expected:
            continue
        where = [c for c in culprits if c.value == value]
        parts.append(f"{value} on {_places(where)}")
    summary = f"{noun or key} differs: " + "; ".join(parts)
    if expected is not None:
        summary += f" (the other {counts[expected]}: {expected})"
    return FleetFinding(kind, severity, summary, key=key, expected=expected, culprits=culprits)


def torch_failure(m: Member) -> str | None:
    """Why torch cannot be imported where `m` scanned ("ModuleNotFoundError: No module named
    'torch'"), or None when it could be."""
    failed = [summary for probe, _, status, summary in m.results
              if probe == TORCH_IMPORT_PROBE and status in PROBLEM_STATUSES]
    if not failed:
        return None
    version = m.versions.get("torch", "")
    if version.startswith("unavailable: "):
        return version[len("unavailable: "):]
    return failed[0].partition(": ")[2] or failed[0]


def _torch_findings(members: list[Member]) -> list[FleetFinding]:
    """One finding per reason torch cannot be imported, naming every place it cannot be: the one
    cause of all that place's skipped probes and missing versions, said once."""
    by_reason: dict[str, list[Member]] = defaultdict(list)
    for m in members:
        why = torch_failure(m)
        if why is not None:
            by_reason[why].append(m)
    findings = []
    for why, places in by_reason.items():
        culprits = tuple(_culprit(m, value="torch cannot be imported", detail=why) for m in places)
        findings.append(FleetFinding(
            "scan-failed", ERROR, f"{_places(culprits)}: torch cannot be imported ({why}); no probe that needs "
            "torch ran there", key="torch", expected=None, culprits=culprits))
    return findings


def _version_findings(members: list[Member]) -> list[FleetFinding]:
    members = [m for m in members if m.versions]  # a rank whose scan did not run has nothing to compare
    keys: dict[str, None] = {}
    for m in members:
        for k in m.versions:
            keys.setdefault(k, None)
    no_torch = {id(m) for m in members if torch_failure(m) is not None}
    findings = []
    for key in keys:
        default = "not installed" if key.startswith("package ") else "not reported"
        entries = [(_culprit(m), m.versions.get(key, default)) for m in members
                   if not (key in _TORCH_KEYS and id(m) in no_torch)]
        severity = ERROR if key in _ERROR_VERSION_KEYS else WARNING
        finding = _differ("version-drift", key, entries, severity)
        if finding:
            findings.append(finding)
    names: dict[str, None] = {}
    for m in members:
        for k in m.nccl_env:
            names.setdefault(k, None)
    for name in sorted(names):
        entries = [(_culprit(m), m.nccl_env.get(name, "unset")) for m in members]
        finding = _differ("nccl-env-drift", name, entries, WARNING, noun=f"{name}")
        if finding:
            findings.append(finding)
    return findings


def _gpu_rows(nodes: list[Node]) -> list[tuple[Node, Gpu, Culprit]]:
    """One row per (node, GPU) from the first member of the node that read NVML."""
    rows = []
    for node in nodes:
        source = next((m for m in node.members if m.gpus), None)
        if source is None:
            continue
        for gpu in source.gpus:
            rows.append((node, gpu, Culprit(node.name, node.rank_of_gpu(gpu.index), f"GPU {gpu.index}")))
    return rows


def _hardware_findings(nodes: list[Node]) -> list[FleetFinding]:
    findings: list[FleetFinding] = []
    # GPU count, node by node.
    entries = []
    for node in nodes:
        counts = [m.gpu_count for m in node.members if m.gpu_count is not None]
        if counts:
            entries.append((Culprit(node.name, node.ranks[0] if len(node.ranks) == 1 else None), str(counts[0])))
    finding = _differ("gpu-count", "GPU count", entries, ERROR)
    if finding:
        findings.append(finding)
    rows = _gpu_rows(nodes)
    finding = _differ("gpu-model", "GPU model", [(c, gpu.name or "unknown") for _, gpu, c in rows], ERROR)
    if finding:
        findings.append(finding)
    by_model: dict[str, list[tuple[Node, Gpu, Culprit]]] = defaultdict(list)
    for row in rows:
        by_model[row[1].name or "unknown"].append(row)
    for model, model_rows in by_model.items():
        for label, path, severity in _HW_DRIFT:
            entries = [(c, v) for _, gpu, c in model_rows if (v := gpu.values.get(label)) is not None]
            finding = _differ("hardware-drift", label, entries, severity, noun=f"{label} of {model}")
            if finding:
                findings.append(finding)
    for node, gpu, c in rows:
        findings.extend(_gpu_state(gpu, c))
    return findings


def _gpu_state(gpu: Gpu, c: Culprit) -> list[FleetFinding]:
    """Problems one GPU shows on its own: a degraded link, uncorrectable errors, rows that could
    not be remapped, throttling for a bad reason."""
    out = []
    raw = gpu.raw
    pcie = raw.get("pcie") if isinstance(raw.get("pcie"), dict) else {}
    width, max_width = _int(pcie.get("width")), _int(pcie.get("max_width"))
    gen, max_gen = _int(pcie.get("gen")), _int(pcie.get("max_gen"))
    throttle = [t for t in raw.get("throttle_reasons") or [] if isinstance(t, str)] \
        if isinstance(raw.get("throttle_reasons"), list) else []
    idle = "gpu_idle" in throttle
    where = c.where()
    if width and max_width and width < max_width:
        out.append(FleetFinding("pcie-degraded", ERROR,
                                f"{where}: PCIe link runs at x{width} of x{max_width} (reseat the GPU or riser; check the slot)",
                                key="PCIe width", expected=f"x{max_width}",
                                culprits=(Culprit(c.node, c.rank, c.gpu, f"x{width}"),)))
    if gen and max_gen and gen < max_gen and not idle:
        # An idle GPU lowers its link generation to save power; a busy one should not.
        out.append(FleetFinding("pcie-degraded", WARNING,
                                f"{where}: PCIe link at generation {gen} of {max_gen} while the GPU was not idle",
                                key="PCIe generation", expected=str(max_gen),
                                culprits=(Culprit(c.node, c.rank, c.gpu, str(gen)),)))
    ecc = raw.get("ecc") if isinstance(raw.get("ecc"), dict) else {}
    volatile = _int(ecc.get("volatile_uncorrected"))
    aggregate = _int(ecc.get("aggregate_uncorrected"))
    if volatile:
        out.append(FleetFinding("gpu-hardware", ERROR,
                                f"{where}: {volatile} uncorrectable ECC errors since the driver loaded (drain the node; reset or replace the GPU)",
                                key="ECC uncorrectable (volatile)", expected="0",
                                culprits=(Culprit(c.node, c.rank, c.gpu, str(volatile)),)))
    elif aggregate:
        out.append(FleetFinding("gpu-hardware", WARNING,
                                f"{where}: {aggregate} uncorrectable ECC errors in this GPU's lifetime",
                                key="ECC uncorrectable (aggregate)", expected="0",
                                culprits=(Culprit(c.node, c.rank, c.gpu, str(aggregate)),)))
    remap = raw.get("row_remapping") if isinstance(raw.get("row_remapping"), dict) else {}
    if remap.get("failed") is True:
        out.append(FleetFinding("gpu-hardware", ERROR,
                                f"{where}: row remapping failed (the GPU has run out of spare rows: replace it)",
                                key="row remapping", expected="ok", culprits=(Culprit(c.node, c.rank, c.gpu, "failed"),)))
    elif remap.get("pending") is True:
        out.append(FleetFinding("gpu-hardware", ERROR,
                                f"{where}: a row remapping is pending (reset the GPU to apply it)",
                                key="row remapping", expected="ok", culprits=(Culprit(c.node, c.rank, c.gpu, "pending"),)))
    bad = [t for t in throttle if t in BAD_THROTTLE]
    if bad:
        out.append(FleetFinding("gpu-hardware", ERROR,
                                f"{where}: clocks held back by {', '.join(bad)} (cooling, power delivery or a hardware fault)",
                                key="throttle reasons", expected="none",
                                culprits=(Culprit(c.node, c.rank, c.gpu, ", ".join(bad)),)))
    return out


def _verdict_findings(members: list[Member]) -> list[FleetFinding]:
    by_probe: dict[str, list[tuple[Member, str | None, str, str]]] = defaultdict(list)
    for m in members:
        no_torch = torch_failure(m) is not None
        for probe, device, status, summary in m.results:
            if no_torch and (probe == TORCH_IMPORT_PROBE or status == "skipped"):
                continue  # not run for want of torch: _torch_findings says so once
            by_probe[probe].append((m, device, status, summary))

    def culprit(entry: tuple[Member, str | None, str, str]) -> Culprit:
        m, device, status, summary = entry
        return _culprit(m, m.gpu_label(device), status, summary)

    findings = []
    for probe, entries in by_probe.items():
        statuses = Counter(e[2] for e in entries)
        if len(statuses) == 1:
            status = next(iter(statuses))
            if status in PROBLEM_STATUSES and len({id(e[0].node) for e in entries}) > 1:
                findings.append(FleetFinding(
                    "common-problem", ERROR,
                    f"{probe} is {status.replace('_', ' ')} everywhere ({len(entries)} places): {entries[0][3]}",
                    key=probe, expected=None, culprits=tuple(culprit(e) for e in entries)))
            continue
        ranked = statuses.most_common()
        if ranked[0][1] == ranked[1][1]:
            # No majority: the healthiest of the tied statuses is taken as expected.
            top = min((s for s, n in ranked if n == ranked[0][1]), key=lambda s: _STATUS_HEALTH.get(s, 9))
        else:
            top = ranked[0][0]
        culprits = tuple(culprit(e) for e in entries if e[2] != top)
        severity = ERROR if any(s in PROBLEM_STATUSES for s in statuses) else WARNING
        parts = []
        for status, _ in ranked:
            if status != top:
                parts.append(f"{status} on {_places([c for c in culprits if c.value == status])}")
        findings.append(FleetFinding(
            "verdict-drift", severity,
            f"{probe}: " + "; ".join(parts) + f" (the other {statuses[top]}: {top})",
            key=probe, expected=top, culprits=culprits))
    return findings


def _straggler_findings(members: list[Member], options: MergeOptions) -> tuple[list[FleetFinding], dict[str, Any]]:
    groups: dict[tuple[str, str], list[tuple[Member, dict[str, Any]]]] = defaultdict(list)
    not_judged: Counter[str] = Counter()
    for m in members:
        for g in m.gemm:
            device = g["device"] or ""
            if not device.startswith("cuda"):
                not_judged[f"{device or 'unknown device'}: no nominal peak outside NVIDIA GPUs"] += 1
            elif not g["nominal"]:
                not_judged[f"{g['model'] or 'unknown GPU'}: no nominal peak known for this model"] += 1
            else:
                groups[(g["model"] or "unknown", g["mode"])].append((m, g))
    table = []
    # One finding per slow GPU, naming every mode in which it is slow.
    slow_gpus: dict[tuple[int, str | None], list[str]] = {}
    slow_member: dict[tuple[int, str | None], Member] = {}
    for (model, mode), rows in sorted(groups.items()):
        values = [g["tflops"] for _, g in rows]
        median = statistics.median(values)
        nominal = statistics.median(g["nominal"] for _, g in rows)
        expected = options.expect_fraction * nominal
        floor = (1 - options.straggler_fraction) * median
        slow = [(m, g) for m, g in rows if g["tflops"] < floor and g["tflops"] < expected] if len(rows) >= 2 else []
        table.append({
            "model": model, "mode": mode, "gpus": len(rows), "median_tflops": round(median, 2),
            "min_tflops": round(min(values), 2), "max_tflops": round(max(values), 2),
            "nominal_tflops": nominal, "expected_tflops": round(expected, 2), "stragglers": len(slow),
        })
        for m, g in slow:
            key = (m.position, g["device"])
            slow_member[key] = m
            slow_gpus.setdefault(key, []).append(
                f"{mode} {g['tflops']:.1f} TFLOP/s, {100 * (1 - g['tflops'] / median):.0f}% below the median "
                f"{median:.1f} of {len(rows)} {model} GPUs and under the expected {expected:.0f} "
                f"({100 * options.expect_fraction:.0f}% of nominal {nominal:g})")
    findings = []
    for key, parts in slow_gpus.items():
        m = slow_member[key]
        c = _culprit(m, m.gpu_label(key[1]), parts[0].split(",")[0], "; ".join(parts))
        findings.append(FleetFinding("straggler", ERROR, f"{c.where()} is a straggler: GEMM " + "; ".join(parts),
                                     key="GEMM throughput", culprits=(c,)))
    summary = {"groups": table, "not_judged": [{"reason": r, "count": n} for r, n in sorted(not_judged.items())]}
    return findings, summary


def _presence_findings(nodes: list[Node], members: list[Member], job: dict[str, Any],
                       redact: bool) -> list[FleetFinding]:
    findings: list[FleetFinding] = []
    main = job["main"]
    job_ids = Counter(m.job_id for m in members)
    if len(job_ids) > 1 and job["job_id"] is not None:
        others = [m for m in members if m.job_id != job["job_id"]]
        findings.append(FleetFinding(
            "mixed-jobs", WARNING,
            f"reports come from {len(job_ids)} jobs; job {job['job_id']} is the fleet, "
            f"{len(others)} report(s) are from elsewhere: " + ", ".join(m.label for m in others[:LIST_IN_SUMMARY]),
            key="job id", expected=job["job_id"],
            culprits=tuple(_culprit(m, value=m.job_id or "none", detail=m.label) for m in others)))
    if job.get("node_list_error"):
        findings.append(FleetFinding("mixed-jobs", WARNING, f"the job's node list cannot be read: {job['node_list_error']}",
                                     key="node list"))
    # Nodes.
    present = {n.index for n in nodes}
    expected_nodes = job["expected_nodes"] or 0
    lws = job["local_world_size"]
    world = job["expected_ranks"]
    rank_node = _rank_to_node(main, world, expected_nodes, lws)
    missing_nodes = [i for i in range(expected_nodes) if i not in present]
    for i in missing_nodes:
        name = _node_name(i, job, redact)
        ranks = [r for r in range(world or 0) if rank_node and rank_node(r) == i]
        findings.append(FleetFinding(
            "missing-node", ERROR,
            f"{name} sent no report" + (f" ({'rank' if len(ranks) == 1 else 'ranks'} {_ranges(ranks)})" if ranks else "")
            + " (it did not run, died, or its output was lost)",
            key="node", expected="a report",
            culprits=tuple(Culprit(name, r) for r in ranks) or (Culprit(name),)))
    # Ranks.
    if world:
        seen = Counter(m.rank for m in main if m.rank is not None)
        missing = [r for r in range(world) if r not in seen]
        on_missing_node = {r for r in missing if rank_node and rank_node(r) in missing_nodes}
        rest = [r for r in missing if r not in on_missing_node]
        if rest:
            culprits = []
            for r in rest:
                index = rank_node(r) if rank_node else None
                culprits.append(Culprit(_node_name(index, job, redact) if index is not None else None, r))
            findings.append(FleetFinding(
                "missing-rank", ERROR,
                f"{len(rest)} of {world} ranks sent no report: " + _places(culprits),
                key="rank", expected="a report", culprits=tuple(culprits)))
        twice = sorted(r for r, n in seen.items() if n > 1)
        for r in twice:
            same = [m for m in main if m.rank == r]
            findings.append(FleetFinding(
                "duplicate-report", WARNING,
                f"rank {r} reported {len(same)} times: " + ", ".join(m.label for m in same[:LIST_IN_SUMMARY]),
                key="rank", culprits=tuple(_culprit(m, detail=m.label) for m in same)))
    return findings


def _fingerprint(m: Member) -> str:
    """Everything read from a report, its start time and length included: two inputs with the
    same fingerprint are the same report (the same file given twice, or a copy of it)."""
    return repr([getattr(m, f.name) for f in fields(Member) if f.name not in ("label", "position", "node")])


def _drop_copies(members: list[Member]) -> tuple[list[Member], list[list[Member]]]:
    """Count a report given more than once once (a copy would otherwise be one more node); the
    groups of copies, the one kept first. A report that does not say when it was made is never
    taken for a copy (nothing then tells two scans of one machine apart)."""
    # Cheap key first; the whole fingerprint only where it collides (999 reports: ~1 ms, not 0.2 s).
    buckets: dict[tuple, list[Member]] = {}
    for m in members:
        if m.created is not None:
            buckets.setdefault((m.created, m.duration_s, m.hostname, m.slurm_name, m.node_index, m.rank, m.job_id), []).append(m)
    dropped: set[int] = set()
    groups: list[list[Member]] = []
    for bucket in buckets.values():
        if len(bucket) < 2:
            continue
        same: dict[str, list[Member]] = {}
        for m in bucket:
            same.setdefault(_fingerprint(m), []).append(m)
        for group in same.values():
            if len(group) > 1:
                groups.append(group)
                dropped.update(id(m) for m in group[1:])
    groups.sort(key=lambda g: g[0].position)
    return [m for m in members if id(m) not in dropped], groups


def _copy_findings(copies: list[list[Member]]) -> list[FleetFinding]:
    findings = []
    for same in copies:
        node = same[0].node.name if same[0].node else None
        findings.append(FleetFinding(
            "duplicate-report", WARNING,
            f"the same report was given {len(same)} times: "
            + ", ".join(m.label for m in same[:LIST_IN_SUMMARY]) + " (counted once)",
            key="report", culprits=tuple(Culprit(node, m.rank, None, None, m.label) for m in same)))
    return findings


def _rank_to_node(main: list[Member], world: int | None, nodes: int, lws: int | None):
    """rank -> node index when the reports show a block layout (rank // ranks-per-node), else None."""
    per_node = lws or (world // nodes if world and nodes and world % nodes == 0 else None)
    if not per_node:
        return None
    known = [(m.rank, m.node_index) for m in main if m.rank is not None and m.node_index is not None]
    if not known or any(rank // per_node != index for rank, index in known):
        return None
    return lambda rank: rank // per_node


def _ranges(numbers: list[int]) -> str:
    return nodelist.compress(f"r{n}" for n in numbers).replace("r", "")


# --- the whole merge ----------------------------------------------------------------------------


def _node_summary(node: Node) -> NodeSummary:
    first = node.members[0]
    brief = {k: first.versions[k] for k in ("torch", "torch CUDA", "NCCL", "driver") if k in first.versions}
    counts: Counter[str] = Counter()
    for m in node.members:
        counts.update(status for _, _, status, _ in m.results)
    source = next((m for m in node.members if m.gpus), None)
    gpus = []
    if source is not None:
        for gpu in source.gpus:
            pcie = gpu.raw.get("pcie") if isinstance(gpu.raw.get("pcie"), dict) else {}
            gpus.append({"gpu": f"GPU {gpu.index}", "model": gpu.name, "rank": node.rank_of_gpu(gpu.index),
                         "pcie": f"gen{pcie.get('gen')}/{pcie.get('max_gen')} x{pcie.get('width')}/{pcie.get('max_width')}"
                         if pcie else None,
                         "vbios": gpu.values.get("VBIOS")})
    durations = [m.duration_s for m in node.members if m.duration_s is not None]
    return NodeSummary(name=node.name, index=node.index, ranks=node.ranks,
                       sources=[m.label for m in node.members], gpus=gpus, versions=brief,
                       counts=dict(sorted(counts.items())), duration_s=max(durations) if durations else None)


def _order(findings: list[FleetFinding]) -> list[FleetFinding]:
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(findings, key=lambda f: (f.severity != ERROR, rank.get(f.kind, len(rank))))


def rank_namer(nodes: list[Node], members: list[Member], job: dict[str, Any], redact: bool) -> Callable[[int], str | None]:
    """rank -> the display name of its node (also for ranks that sent nothing, when the layout
    shows which node they were on)."""
    known = {m.rank: m.node.name for m in members if m.rank is not None and m.node is not None}
    to_index = _rank_to_node(job["main"], job["expected_ranks"], job["expected_nodes"] or 0, job["local_world_size"])
    by_index = {n.index: n.name for n in nodes}

    def name(rank: int) -> str | None:
        if rank in known:
            return known[rank]
        if to_index is None:
            return None
        index = to_index(rank)
        return by_index.get(index) or _node_name(index, job, redact)

    return name


def merge_members(
    members: list[Member], options: MergeOptions, unreadable: Sequence[Loaded] = (),
    extra_findings: Sequence[FleetFinding] | Callable[[Callable[[int], str | None]], list[FleetFinding]] = (),
) -> tuple[FleetReport, list[Node]]:
    """The fleet report (not yet redacted) and its nodes, from extracted members. `extra_findings`
    may be a function of rank -> node name (the distributed scan's collective findings)."""
    started = time.monotonic()
    given = len(members)
    members, copies = _drop_copies(members)
    job = _job(members)
    nodes = _assign_nodes(members, job, options.redact)
    findings: list[FleetFinding] = _copy_findings(copies)
    findings += _presence_findings(nodes, members, job, options.redact)
    for bad in unreadable:
        findings.append(FleetFinding("unreadable-report", ERROR, f"{bad.label}: {bad.error}", key="report",
                                     culprits=(Culprit(None, None, None, None, bad.label),)))
    findings += _torch_findings(members)
    findings += _hardware_findings(nodes)
    findings += _version_findings(members)
    stragglers, straggler_table = _straggler_findings(members, options)
    findings += stragglers
    findings += _verdict_findings(members)
    if callable(extra_findings):
        findings += extra_findings(rank_namer(nodes, members, job, options.redact))
    else:
        findings += list(extra_findings)
    report = FleetReport(
        job={k: v for k, v in job.items() if k not in ("main", "expanded", "node_list_error")},
        nodes=[_node_summary(n) for n in nodes],
        findings=_order(findings),
        stragglers=straggler_table,
        inputs={"reports": given, "unreadable": len(unreadable)},
        thresholds=options.thresholds(),
        tool_version=gpudoctor.__version__,
        redacted=options.redact,
    )
    if job["node_list"] and options.redact:
        report.job["node_list"] = f"{plural(len(job['expanded'] or []), 'node')} (names redacted)"
    report.duration_s = time.monotonic() - started
    return report, nodes


def alias_nodes(redactor: Any, nodes: list[Node], members: list[Member], report: FleetReport) -> None:
    """Teach `redactor` the fleet's node names: every real host name the inputs carry (full and
    short, from the reports and Slurm's node list) becomes its node's `node-N` wherever it appears,
    file names included, and every `node-N` the report uses stays as it is."""
    for node_list in sorted({m.node_list for m in members if m.node_list}):
        try:
            for i, real in enumerate(nodelist.expand(node_list)):
                redactor.alias("host", real, f"node-{i}")
        except ValueError:
            pass
    for node in nodes:  # after the node list: a node's own report has the last word
        for m in node.members:
            for real in (m.hostname, m.slurm_name):
                if real:
                    redactor.alias("host", real, f"node-{node.index}")
    labels = {n.name for n in report.nodes}
    labels.update(c.node for f in report.findings for c in f.culprits if c.node)
    for label in labels:
        if label.startswith("node-") and label[5:].isdigit():
            redactor.alias("host", label, label)  # never taken for an unknown host itself


def finish(report: FleetReport, nodes: list[Node], members: list[Member], redact: bool) -> dict[str, Any]:
    """The fleet report as a dict, redacted by one `Redactor` for the whole report (node names,
    secrets, home folders, addresses; see `alias_nodes`) unless asked not to."""
    data = report.to_dict()
    if not redact:
        return data
    from gpudoctor.reports.redact import Redactor

    redactor = Redactor()
    alias_nodes(redactor, nodes, members, report)
    return redactor.report(data)


def merge_loaded(members: list[Member], unreadable: Sequence[Loaded], options: MergeOptions) -> dict[str, Any]:
    """Merge extracted members into the fleet report's final (redacted unless asked not) dict."""
    if not members:
        first = unreadable[0] if unreadable else None
        raise MergeInputError(f"nothing to merge: {first.label}: {first.error}" if first else "nothing to merge")
    report, nodes = merge_members(members, options, unreadable)
    return finish(report, nodes, members, options.redact)


def merge_reports(loaded: Sequence[Loaded], options: MergeOptions) -> dict[str, Any]:
    """Merge loaded documents (report dicts, or why they could not be read)."""
    members = [member_from_report(d.data, d.label, i) for i, d in enumerate(loaded) if d.data is not None]
    for i, m in enumerate(members):
        m.position = i
    return merge_loaded(members, [d for d in loaded if d.data is None], options)


def merge_files(paths: Sequence[str], options: MergeOptions = MergeOptions(), jobs: int | None = None) -> dict[str, Any]:
    """`gpudoctor merge PATH...`: read (in parallel when there are many), merge, redact."""
    members, unreadable = load_members(paths, jobs)
    return merge_loaded(members, unreadable, options)
