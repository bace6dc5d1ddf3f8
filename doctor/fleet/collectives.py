"""What the distributed scan's collectives say about the fleet: who arrived late, who never
entered a collective, who hung or crashed in one, and bus bandwidth against what the links
should give. Pure Python (no torch): it reads the per-rank records the ranks exchanged through
the store, and the enter/done markers rank 0 read for ranks that could not report.

Bandwidth follows nccl-tests (PERFORMANCE.md): for S bytes per rank in time t on n ranks,
algbw = S / t, and busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for all-to-all, which
is comparable with the bandwidth of the slowest link. "Should give" is `comm_expect_fraction` of
the nominal link bandwidth of the group: NVLink (active links x per-link GB/s of its generation)
or PCIe (generation x width) within a node; the InfiniBand/RoCE port rate per rail across nodes.
Only NCCL on GPUs is judged: gloo on the CPU measures the host, not an interconnect.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from gpudoctor.fleet.model import ERROR, WARNING, Culprit, FleetFinding, plural

# GB/s per direction.
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

NodeOf = Callable[[int], "str | None"]
# How a rank's set-up error reads when it only waited for another rank (gloo, NCCL, the store).
_TIMED_OUT = re.compile(r"timed? ?out|timeout|deadline exceeded", re.IGNORECASE)


def bus_factor(op: str, n: int) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _gpu_link_gbps(gpus: list[dict[str, Any]]) -> float | None:
    """A node's slowest GPU link inside the node: NVLink if every GPU has active links, else PCIe."""
    values = []
    for gpu in gpus:
        if not isinstance(gpu, dict):
            return None
        nvlink = gpu.get("nvlink") if isinstance(gpu.get("nvlink"), dict) else {}
        links, version = nvlink.get("active_links"), nvlink.get("version")
        if isinstance(links, int) and links > 0 and version in NVLINK_GBPS_PER_LINK:
            values.append(links * NVLINK_GBPS_PER_LINK[version])
            continue
        pcie = gpu.get("pcie") if isinstance(gpu.get("pcie"), dict) else {}
        gen, width = pcie.get("max_gen"), pcie.get("max_width")
        if gen in PCIE_GBPS_PER_LANE and isinstance(width, int):
            values.append(PCIE_GBPS_PER_LANE[gen] * width)
        else:
            return None
    return min(values) if values else None


def _rail_gbps(network: Any, per_node: int) -> float | None:
    ports = network.get("ports") if isinstance(network, dict) else None
    if not isinstance(ports, list):
        return None
    rates = [p["rate_gbps"] / 8 for p in ports if isinstance(p, dict) and p.get("state") == "ACTIVE"
             and isinstance(p.get("rate_gbps"), (int, float))]
    if not rates:
        return None
    if len(rates) >= per_node:
        return min(rates)  # one NIC per GPU rail: the slowest rail bounds the ring
    return sum(rates) / per_node  # ranks share the node's NICs


def nominal_gbps(scope: str, group: list[int], reports: dict[int, dict[str, Any]], per_node: int) -> float | None:
    """Nominal link bandwidth (GB/s per direction) a group's collective should approach, or None
    when the reports do not say (no NVML, no ports, a world-wide hierarchical group)."""
    if scope == "intra-node":
        env = (reports.get(group[0]) or {}).get("environment") or {}
        nvml = env.get("nvml") if isinstance(env.get("nvml"), dict) else {}
        gpus = nvml.get("gpus") if isinstance(nvml.get("gpus"), list) else []
        return _gpu_link_gbps(gpus) if gpus else None
    if scope == "inter-node":
        values = []
        for rank in group:
            env = (reports.get(rank) or {}).get("environment") or {}
            fleet = env.get("fleet") if isinstance(env.get("fleet"), dict) else {}
            value = _rail_gbps(fleet.get("network"), per_node)
            if value is None:
                return None
            values.append(value)
        return min(values) if values else None
    return None


def _events(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    comm = (record or {}).get("comm")
    return [e for e in comm if isinstance(e, dict)] if isinstance(comm, list) else []


def analyse(
    records: dict[int, dict[str, Any] | None],
    plan: dict[str, Any],
    markers: dict[str, dict[int, str]],
    node_of: NodeOf,
    *,
    backend: str | None,
    late_after_s: float,
    expect_fraction: float,
) -> tuple[list[FleetFinding], dict[str, Any]]:
    """Findings and the report's `collectives` section from every rank's record (None for ranks
    that sent none) and the store's markers {"enter/<step>": {rank: ...}, "done/<step>": ...}."""
    world = int(plan["world_size"])
    per_node = int(plan["local_world_size"])
    reports = {r: rec.get("report") for r, rec in records.items() if rec and isinstance(rec.get("report"), dict)}
    by_rank: dict[int, dict[str, dict[str, Any]]] = {}
    for rank in range(world):
        by_rank[rank] = {}
        for event in _events(records.get(rank)):
            if isinstance(event.get("step"), str):
                by_rank[rank].setdefault(event["step"], event)

    def place(rank: int, value: str | None = None, detail: str | None = None) -> Culprit:
        return Culprit(node_of(rank), rank, None, value, detail)

    findings: list[FleetFinding] = []
    arrival_rows = []

    # Arrival: lateness from how long each rank waited (no clocks compared across nodes).
    waits = {r: e["arrival"]["wait_s"] for r, e in by_rank.items()
             if e.get("arrival", {}).get("status") == "ok" and isinstance(e["arrival"].get("wait_s"), (int, float))}
    if len(waits) >= 2:
        longest = max(waits.values())
        for rank, wait in sorted(waits.items()):
            arrival_rows.append({"rank": rank, "node": node_of(rank), "late_s": round(longest - wait, 3)})
        late = sorted(((longest - w, r) for r, w in waits.items() if longest - w > late_after_s), reverse=True)
        if late:
            culprits = tuple(place(r, f"{lateness:.1f} s late") for lateness, r in late)
            worst, rank = late[0]
            findings.append(FleetFinding(
                "late-rank", WARNING,
                f"{culprits[0].where()} reached the collectives {worst:.1f} s after the first rank"
                + (f" (+{len(late) - 1} more late ranks)" if len(late) > 1 else "")
                + ": the rest of the job waits for it (a slow or overloaded node, or a probe that hung there)",
                key="arrival", expected=f"within {late_after_s:g} s", culprits=culprits))
    failed_arrival = [e["arrival"] for e in by_rank.values() if e.get("arrival", {}).get("status") == "failed"]
    if failed_arrival:
        missing = sorted({r for e in failed_arrival for r in e.get("missing") or [] if isinstance(r, int)})
        dead = sorted({r for e in failed_arrival for r in e.get("dead") or [] if isinstance(r, int)})
        culprits = tuple(place(r, "dead" if r in dead else "never arrived") for r in missing)
        findings.append(FleetFinding(
            "collective-failed", ERROR,
            f"ranks never entered the collectives: {', '.join(c.where() for c in culprits[:6])}"
            + (f" (+{len(culprits) - 6} more)" if len(culprits) > 6 else "")
            + " (they died, hung earlier, or never started); no collective was measured",
            key="arrival", expected="every rank", culprits=culprits))

    # Init.
    init_failed = {r: e["init"] for r, e in by_rank.items()
                   if e.get("init", {}).get("status") in ("failed", "hung", "crashed")}
    if init_failed:
        # Ranks that timed out waiting are the victims of one that failed outright, if there is one.
        waited = {r for r, e in init_failed.items() if _TIMED_OUT.search(str(e.get("detail") or ""))}
        blamed = sorted(set(init_failed) - waited) or sorted(init_failed)
        first = init_failed[blamed[0]]
        victims = len(init_failed) - len(blamed)
        findings.append(FleetFinding(
            "collective-failed", ERROR,
            f"init_process_group({backend}) failed on {plural(len(blamed), 'rank')}: {first.get('detail')}"
            + (f"; {plural(victims, 'other rank')} timed out waiting for it" if victims else ""),
            key="init", culprits=tuple(place(r, str(init_failed[r].get("status")), init_failed[r].get("detail"))
                                       for r in blamed)))
    # The set-up barrier: ranks that never finished setting up and said nothing of it themselves.
    unready = sorted({r for e in by_rank.values() if e.get("ready", {}).get("status") == "failed"
                      for r in e["ready"].get("missing") or [] if isinstance(r, int) and r not in init_failed})
    if unready:
        dead = {r for e in by_rank.values() if e.get("ready", {}).get("status") == "failed"
                for r in e["ready"].get("dead") or [] if isinstance(r, int)}
        culprits = tuple(place(r, "dead" if r in dead else "never set up") for r in unready)
        findings.append(FleetFinding(
            "collective-failed", ERROR,
            f"{', '.join(c.where() for c in culprits[:6])}" + (f" (+{len(culprits) - 6} more)" if len(culprits) > 6 else "")
            + " never finished setting up the process group; no collective was measured",
            key="ready", expected="every rank", culprits=culprits))

    rows: list[dict[str, Any]] = []
    steps = plan.get("steps") or []
    for step in steps:
        name = step["name"]
        entered_keys = markers.get(f"enter/{name}", {})
        groups = step.get("groups") or [list(range(world))]
        reached = any(name in by_rank[r] or r in entered_keys for r in range(world))
        for group in groups:
            statuses: dict[int, str] = {}
            details: dict[int, str] = {}
            times = []
            for rank in group:
                event = by_rank[rank].get(name)
                if event is not None:
                    statuses[rank] = str(event.get("status"))
                    if event.get("detail"):
                        details[rank] = str(event.get("detail"))
                    if event.get("status") == "ok" and isinstance(event.get("time_s"), (int, float)):
                        times.append(event["time_s"])
                elif rank in entered_keys:
                    statuses[rank] = "entered"  # and then nothing: the rank could not report
                elif reached:
                    statuses[rank] = "never entered"
                else:
                    statuses[rank] = "not run"
            row: dict[str, Any] = {
                "op": step["op"], "scope": step["scope"], "group": _group_label(group, step["scope"], node_of),
                "ranks": group, "bytes": int(step["bytes"]), "status": "not-run", "time_s": None,
                "algbw_gbps": None, "busbw_gbps": None, "expected_busbw_gbps": None, "detail": None,
            }
            if all(s == "not run" for s in statuses.values()):
                rows.append(row)
                continue
            if all(s == "ok" for s in statuses.values()) and len(times) == len(group):
                seconds = max(times)  # the collective ends when its slowest rank does
                algbw = step["bytes"] / seconds / 1e9
                busbw = algbw * bus_factor(step["op"], len(group))
                row.update(status="ok", time_s=seconds, algbw_gbps=round(algbw, 3), busbw_gbps=round(busbw, 3))
                if backend == "nccl" and step.get("judge"):
                    nominal = nominal_gbps(step["scope"], group, reports, per_node)
                    if nominal:
                        expected = expect_fraction * nominal
                        row["expected_busbw_gbps"] = round(expected, 2)
                        if busbw < expected and len(group) > 1:
                            row["status"] = "below-expected"
                            findings.append(FleetFinding(
                                "bandwidth-low", ERROR,
                                f"{step['op'].replace('_', '-')} {step['scope']} on {row['group']}: bus bandwidth "
                                f"{busbw:.1f} GB/s, under the expected {expected:.1f} ({100 * expect_fraction:.0f}% "
                                f"of the links' nominal {nominal:.1f} GB/s): a link is down or degraded",
                                key=name, expected=f"{expected:.1f} GB/s",
                                culprits=tuple(place(r, f"{busbw:.1f} GB/s") for r in group)))
                rows.append(row)
                continue
            # Something went wrong: say who is to blame, most certain first.
            blame = _blame(statuses)
            row["status"] = "hung" if any(s in ("hung", "entered") for s in statuses.values()) else "failed"
            victims = [r for r, s in statuses.items() if s == "failed"]
            why = details.get(victims[0]) if victims else None
            row["detail"] = why
            culprits = tuple(place(r, statuses[r], details.get(r)) for r in blame)
            others = f"; {len(victims)} other ranks failed waiting for it" if victims and blame != victims else ""
            what = {"never entered": "never entered it", "crashed": "crashed in it", "hung": "hung in it",
                    "entered": "entered it and never reported back", "failed": "failed in it"}
            first = statuses[blame[0]] if blame else "failed"
            findings.append(FleetFinding(
                "collective-failed", ERROR,
                f"{step['op'].replace('_', '-')} {step['scope']} ({_size(step['bytes'])}): "
                + ", ".join(c.where() for c in culprits[:6]) + (f" (+{len(culprits) - 6} more)" if len(culprits) > 6 else "")
                + f" {what.get(first, first)}{others}" + (f" ({why})" if why and first == "failed" else ""),
                key=name, expected="ok", culprits=culprits))
            rows.append(row)
    section = {"backend": backend, "world_size": world, "results": rows, "arrival": arrival_rows,
               "expect_fraction": expect_fraction}
    return findings, section


def _blame(statuses: dict[int, str]) -> list[int]:
    """The ranks to blame for a collective that did not complete: those that never entered it,
    else those that crashed, else those that hung (entered, never returned, never errored: the
    others then fail waiting for them), else every rank that failed."""
    for kind in ("never entered", "crashed", "hung", "entered", "failed"):
        ranks = sorted(r for r, s in statuses.items() if s == kind)
        if ranks:
            return ranks
    return sorted(statuses)


def _group_label(group: list[int], scope: str, node_of: NodeOf) -> str:
    if scope == "intra-node":
        return str(node_of(group[0]) or f"ranks {group[0]}-{group[-1]}")
    if scope == "inter-node":
        return f"rail of rank {group[0]} ({len(group)} nodes)"
    return f"all {len(group)} ranks"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def build_steps(world: int, per_node: int, sizes: list[int], judge_size: int | None = None) -> list[dict[str, Any]]:
    """The measured steps: each op at each size over the whole world, within each node and
    across nodes (rails), skipping scopes that are the same group as another or have one rank."""
    nodes = (world + per_node - 1) // per_node
    scopes = []
    if nodes > 1 and per_node > 1:
        scopes = ["world", "intra-node", "inter-node"]
    elif nodes > 1:
        scopes = ["inter-node"]  # one rank per node: the world is the rail
    elif per_node > 1:
        scopes = ["intra-node"]  # one node: the world is the node
    steps = []
    largest = max(sizes) if sizes else 0
    for size in sizes:
        for op in ("all_reduce", "all_to_all"):
            for scope in scopes:
                steps.append({"name": f"{op}/{scope}/{size}", "op": op, "scope": scope, "bytes": size,
                              "groups": groups_of(world, per_node, scope),
                              "judge": size == (judge_size or largest)})
    return steps


def groups_of(world: int, per_node: int, scope: str) -> list[list[int]]:
    nodes = [list(range(g * per_node, min(world, (g + 1) * per_node))) for g in range((world + per_node - 1) // per_node)]
    if scope == "intra-node":
        return nodes
    if scope == "inter-node":
        return [[node[i] for node in nodes if i < len(node)] for i in range(per_node)]
    return [list(range(world))]
