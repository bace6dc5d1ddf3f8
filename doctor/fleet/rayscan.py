"""`gpudoctor scan --ray`: one scan per node of a Ray cluster, then the same merge.

    RAY_ADDRESS=auto gpudoctor scan --ray --format json -o fleet.json

The driver (this process) connects to the cluster (`ray.init(address=RAY_ADDRESS or "auto")`),
reserves one CPU on every alive node with a STRICT_SPREAD placement group (one bundle per node, so
no node is scanned twice and none is skipped while it has a free CPU), and runs one task per
bundle. Each task runs `gpudoctor.scan.runner.run_scan` on its node, with the scan options given on
the command line (`--device all` scans every GPU of the node: the task does not reserve GPUs, so
it sees all of them; a diagnostic run is best done on an idle cluster). A task that fails or does
not finish within GPUDOCTOR_FLEET_TIMEOUT seconds (default 3600) costs its node, which the fleet
report names. ray is an optional extra, never a dependency: without it `--ray` is a usage error.

Nodes are numbered in the order of their IP addresses; that order also names them node-0,
node-1, ... when the report is redacted. `fleet_from_ray` (pure, tested without ray) turns the
tasks' results into the fleet report.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

from gpudoctor.fleet import nodelist
from gpudoctor.fleet.distributed import DistributedError
from gpudoctor.reports import load


def _scan_node(options: dict[str, Any]) -> dict[str, Any]:
    """The Ray task: scan this node; never raises (its failure is its result)."""
    import dataclasses

    out: dict[str, Any] = {"hostname": socket.gethostname(), "started": time.time()}
    try:
        import ray

        out["node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:
        out["node_id"] = None
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        # Ray hides GPUs from tasks that reserved none; a node scan wants all of them.
        if saved is not None and not saved.strip():
            del os.environ["CUDA_VISIBLE_DEVICES"]
        from gpudoctor.scan import runner

        scan_options = runner.ScanOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
        report = runner.run_scan(dataclasses.replace(scan_options, redact=False))
        out["report"] = report.to_dict()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if saved is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    return out


def _options_dict(options: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def scan_cluster(options: Any, merge_options: Any = None, address: str | None = None,
                 timeout: float | None = None, say: Any = None) -> dict[str, Any]:
    """Scan every alive node of the Ray cluster; the fleet report's dict."""
    try:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        raise DistributedError("--ray needs ray in gpudoctor's environment (pip install ray); it is not a dependency") from None
    from gpudoctor.fleet.merge import MergeOptions

    say = say or (lambda message: None)
    merge_options = merge_options or MergeOptions(redact=options.redact)
    timeout = timeout or float(os.environ.get("GPUDOCTOR_FLEET_TIMEOUT") or 3600)
    started = time.monotonic()
    try:
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    except Exception as exc:
        raise DistributedError(f"cannot connect to the Ray cluster: {exc}") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    nodes.sort(key=lambda n: tuple(int(p) if p.isdigit() else 0 for p in str(n.get("NodeManagerAddress", "")).split(".")))
    if not nodes:
        raise DistributedError("the Ray cluster has no alive node")
    say(f"scanning {len(nodes)} Ray nodes")
    group = placement_group([{"CPU": 1}] * len(nodes), strategy="STRICT_SPREAD")
    ready, _ = ray.wait([group.ready()], timeout=min(timeout, 300))
    if not ready:
        remove_placement_group(group)
        raise DistributedError(f"the placement group of {len(nodes)} one-CPU bundles (STRICT_SPREAD) was not ready "
                               "within 300 s: some node has no free CPU")
    bundle_nodes = placement_group_table(group).get("bundles_to_node_id") or {}
    task = ray.remote(num_cpus=1)(_scan_node)
    refs = [task.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i))
            .remote(_options_dict(options)) for i in range(len(nodes))]
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    results: list[dict[str, Any]] = []
    for i, ref in enumerate(refs):
        if ref in pending:
            ray.cancel(ref, force=True)
            results.append({"error": f"no result within {timeout:g} s", "node_id": bundle_nodes.get(i)})
            continue
        try:
            results.append(ray.get(ref))
        except Exception as exc:  # the task or its worker died
            results.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                            "node_id": bundle_nodes.get(i)})
    remove_placement_group(group)
    job = str(ray.get_runtime_context().get_job_id())
    info = [{"node_id": n.get("NodeID"), "hostname": n.get("NodeManagerHostname") or n.get("NodeManagerAddress")}
            for n in nodes]
    fleet = fleet_from_ray(results, info, job, merge_options)
    fleet["distributed"] = {"rank0_total_s": round(time.monotonic() - started, 3), "slowest_scan_s": None,
                            "rank0_collectives_s": None}
    return fleet


def fleet_from_ray(results: list[dict[str, Any]], nodes: list[dict[str, Any]], job: str, merge_options: Any) -> dict[str, Any]:
    """The fleet report from the tasks' results and the cluster's nodes (in index order: node id,
    host name). Pure: the tests feed it made-up results."""
    from gpudoctor.fleet.merge import finish, member_from_report, merge_members
    from gpudoctor.fleet.model import ERROR, Culprit, FleetFinding

    index_of = {n["node_id"]: i for i, n in enumerate(nodes)}
    hosts = [str(n.get("hostname") or f"node{i}") for i, n in enumerate(nodes)]
    node_list = nodelist.compress(hosts)
    members, failures = [], []
    seen: set[int] = set()
    for result in results:
        index = index_of.get(result.get("node_id"))
        if index is None or index in seen:
            continue
        report = result.get("report")
        if not isinstance(report, dict):
            failures.append((index, str(result.get("error") or "no report")))
            continue
        try:  # read as `gpudoctor report` reads a file
            load.validate(report, f"ray node {index}'s report")
        except load.ReportError as exc:
            failures.append((index, str(exc)))
            continue
        seen.add(index)
        env = report.setdefault("environment", {})
        fleet = env.setdefault("fleet", {}) if isinstance(env, dict) else {}
        fleet["launcher"] = {
            "kind": "ray", "job_id": job, "rank": index, "local_rank": 0, "world_size": len(nodes),
            "local_world_size": 1, "node_index": index, "num_nodes": len(nodes), "slurm": None, "torchrun": None,
            "hostname": {"name": result.get("hostname") or hosts[index], "slurm_node_name": None,
                         "node_list": node_list, "master_addr": None},
        }
        members.append(member_from_report(report, f"ray node {index}", len(members)))
        members[-1].node_list = node_list
    if not members:
        why = failures[0][1] if failures else "no task returned"
        raise DistributedError(f"no Ray node returned a report: {why}")

    def extra(node_of: Any) -> list[FleetFinding]:
        out = []
        for index, why in failures:
            name = node_of(index)
            out.append(FleetFinding("scan-failed", ERROR, f"{name} rank {index}: the Ray task failed ({why})",
                                    key="scan", culprits=(Culprit(name, index, None, "failed", why),)))
        return out

    report, node_objs = merge_members(members, merge_options, (), extra_findings=extra)
    # A node whose task failed is named by scan-failed; do not call it missing as well.
    failed = {f"rank {i}" for i, _ in failures}
    report.findings = [f for f in report.findings
                       if not (f.kind == "missing-node" and any(c.rank is not None and f"rank {c.rank}" in failed
                                                                for c in f.culprits))]
    return finish(report, node_objs, members, merge_options.redact)
