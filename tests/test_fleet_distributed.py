"""The distributed scan's pure parts: torchrun's variables, the plan, and the analysis of the
ranks' collective records (late, never entered, hung, crashed, slow links), with made-up records.
The real thing under torchrun is in test_fleet_torchrun.py."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import fleet_synth as fs
from gpudoctor.cli import app
from gpudoctor.fleet import collectives
from gpudoctor.fleet.distributed import (
    DistContext, DistOptions, DistributedError, build_fleet, make_plan, parse_size, rank_device,
)
from gpudoctor.fleet.merge import MergeOptions

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r1",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}


def test_context_from_torchrun_variables():
    ctx = DistContext.from_env(TORCHRUN)
    assert (ctx.rank, ctx.world_size, ctx.local_world_size, ctx.agent_store, ctx.prefix) == (0, 4, 2, True, "gpudoctor/r1/0/")
    with pytest.raises(DistributedError, match="runs under torchrun"):
        DistContext.from_env({"RANK": "0"})
    with pytest.raises(DistributedError, match="inconsistent"):
        DistContext.from_env({**TORCHRUN, "RANK": "7"})
    with pytest.raises(DistributedError, match="not numbers"):
        DistContext.from_env({**TORCHRUN, "RANK": "x"})


def test_knobs():
    assert parse_size("64K") == 65536 and parse_size("256M") == 256 << 20 and parse_size("1GiB") == 1 << 30
    with pytest.raises(DistributedError):
        parse_size("lots")
    options = DistOptions.from_env({"GPUDOCTOR_COLLECTIVE_TIMEOUT": "5", "GPUDOCTOR_COMM_SIZES": "1K,2K"})
    assert options.collective_timeout == 5 and options.sizes == (1024, 2048)
    for bad in ("nan", "-1", "inf", "x"):
        with pytest.raises(DistributedError):
            DistOptions.from_env({"GPUDOCTOR_LIVENESS": bad})


def test_each_rank_scans_its_own_device():
    assert rank_device("cpu", 3) == "cpu"
    assert rank_device("cuda:0", 3) == "cuda:3" and rank_device("cuda", 1) == "cuda:1"
    with pytest.raises(DistributedError, match="its own GPU"):
        rank_device("all", 0)


def test_steps_cover_the_node_the_rails_and_the_world():
    steps = collectives.build_steps(world=8, per_node=4, sizes=[1024, 4096])
    scopes = {(s["op"], s["scope"]) for s in steps}
    assert scopes == {(op, scope) for op in ("all_reduce", "all_to_all") for scope in ("world", "intra-node", "inter-node")}
    intra = next(s for s in steps if s["scope"] == "intra-node")
    rails = next(s for s in steps if s["scope"] == "inter-node")
    assert intra["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rails["groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [s["judge"] for s in steps if s["bytes"] == 4096] == [True] * 6
    # One node: the world is the node; one rank per node: the world is the rail.
    assert {s["scope"] for s in collectives.build_steps(4, 4, [1])} == {"intra-node"}
    assert {s["scope"] for s in collectives.build_steps(4, 1, [1])} == {"inter-node"}


def test_nccl_tests_bus_bandwidth_factors():
    assert collectives.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert collectives.bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert collectives.bus_factor("all_reduce", 1) == 0


# --- analysis of made-up records -----------------------------------------------------------------


def plan_for(world=4, per_node=2, sizes=(1 << 20,), backend="gloo"):
    ctx = DistContext.from_env({**TORCHRUN, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node)})
    options = DistOptions(sizes=tuple(sizes), late_after_s=2.0)
    return ctx, options, make_plan(ctx, options, backend, "cpu")


def record(rank, plan, wait=0.1, fail_at=None, how="failed", time_s=0.01, report=None):
    events = [{"step": "arrival", "status": "ok", "wait_s": wait}, {"step": "init", "status": "ok"}]
    for step in plan["steps"]:
        if step["name"] == fail_at:
            events.append({"step": step["name"], "status": how, "detail": f"{how} here"})
            break
        group = next(g for g in step["groups"] if rank in g)
        events.append({"step": step["name"], "status": "ok", "time_s": time_s, "ranks": group})
    return {"rank": rank, "local_rank": rank % plan["local_world_size"],
            "group_rank": rank // plan["local_world_size"], "hostname": f"host{rank // plan['local_world_size']}",
            "report": report or torchrun_report(rank, plan), "comm": events, "scan_s": 1.0, "comm_s": 0.5}


def torchrun_report(rank, plan, **kw):
    per_node = plan["local_world_size"]
    r = fs.node_report(rank // per_node, nodes=plan["world_size"] // per_node, gpus=per_node, **kw)
    r["results"] = [x for x in r["results"] if x["device"] == f"cuda:{rank % per_node}"]
    r["environment"]["fleet"]["launcher"].update(kind="torchrun", rank=rank, local_rank=rank % per_node,
                                                 world_size=plan["world_size"], local_world_size=per_node)
    return fs.recount(r)


def analyse(records, plan, markers=None, backend="gloo"):
    return collectives.analyse(records, plan, markers or {}, lambda r: f"node-{r // plan['local_world_size']}",
                               backend=backend, late_after_s=2.0, expect_fraction=0.5)


def test_a_healthy_run_has_bandwidth_rows_and_no_findings():
    ctx, options, plan = plan_for()
    records = {r: record(r, plan) for r in range(4)}
    findings, section = analyse(records, plan)
    assert findings == []
    row = next(r for r in section["results"] if r["op"] == "all_reduce" and r["scope"] == "world")
    # 1 MiB in 10 ms on 4 ranks: algbw 0.105 GB/s, busbw x 2*3/4.
    assert row["status"] == "ok" and row["algbw_gbps"] == pytest.approx(0.105, abs=1e-3)
    assert row["busbw_gbps"] == pytest.approx(0.105 * 1.5, abs=2e-3)
    assert row["expected_busbw_gbps"] is None  # gloo on the CPU is not judged


def test_the_late_rank_is_named_by_how_little_it_waited():
    ctx, options, plan = plan_for()
    records = {r: record(r, plan, wait=6.0) for r in range(4)}
    records[2] = record(2, plan, wait=0.05)  # everybody waited ~6 s for rank 2
    findings, section = analyse(records, plan)
    [late] = findings
    assert late.kind == "late-rank"
    assert [(c.node, c.rank) for c in late.culprits] == [("node-1", 2)]
    assert {row["rank"]: row["late_s"] for row in section["arrival"]}[2] == pytest.approx(5.95)


def test_a_hung_rank_is_blamed_not_its_victims():
    ctx, options, plan = plan_for()
    first = plan["steps"][0]["name"]
    records = {r: record(r, plan, fail_at=first, how="failed") for r in range(4)}
    records[3] = record(3, plan, fail_at=first, how="hung")
    [finding] = [f for f in analyse(records, plan)[0] if f.kind == "collective-failed"]
    assert [(c.rank, c.value) for c in finding.culprits] == [(3, "hung")]
    assert "hung in it" in finding.summary and "3 other ranks failed" in finding.summary


def test_a_crashed_rank_and_a_rank_that_never_entered():
    ctx, options, plan = plan_for()
    first = plan["steps"][0]["name"]
    records = {r: record(r, plan, fail_at=first) for r in range(4)}
    records[1] = record(1, plan, fail_at=first, how="crashed")
    [finding] = [f for f in analyse(records, plan)[0] if f.kind == "collective-failed"]
    assert [(c.rank, c.value) for c in finding.culprits] == [(1, "crashed")]
    # Rank 2 sent no record and left no enter marker: it never entered; rank 3's marker says it did.
    records[1] = record(1, plan, fail_at=first)
    records[2] = None
    records[3] = None
    markers = {f"enter/{first}": {3: "1700000000.0"}}
    [finding] = [f for f in analyse(records, plan, markers)[0] if f.kind == "collective-failed"]
    assert [(c.rank, c.value) for c in finding.culprits] == [(2, "never entered")]


def test_ranks_that_never_arrived():
    ctx, options, plan = plan_for()
    records = {r: {"rank": r, "comm": [{"step": "arrival", "status": "failed", "missing": [3], "dead": [3]}]} for r in range(3)}
    records[3] = None
    findings, section = analyse(records, plan)
    [finding] = findings
    assert finding.key == "arrival" and [(c.node, c.rank, c.value) for c in finding.culprits] == [("node-1", 3, "dead")]
    assert all(row["status"] == "not-run" for row in section["results"])


def test_a_rank_whose_set_up_failed_is_the_one_finding():
    # Rank 1's new_group failed; the set-up barrier stopped the others before any collective,
    # so nobody is blamed for "never entering" one.
    ctx, options, plan = plan_for()
    ready_failed = {"step": "ready", "status": "failed", "missing": [], "dead": [], "failed": [1]}
    records = {r: {"rank": r, "comm": [{"step": "arrival", "status": "ok", "wait_s": 0.1},
                                       {"step": "init", "status": "ok"}, ready_failed]} for r in range(4)}
    records[1]["comm"][1:] = [{"step": "init", "status": "failed", "detail": "new_group: RuntimeError: boom"}]
    findings, section = analyse(records, plan)
    [finding] = findings
    assert finding.key == "init" and [(c.rank, c.value) for c in finding.culprits] == [(1, "failed")]
    assert "failed on 1 rank:" in finding.summary
    assert all(row["status"] == "not-run" for row in section["results"])


def test_ranks_that_timed_out_in_set_up_are_victims():
    ctx, options, plan = plan_for()
    records = {r: {"rank": r, "comm": [{"step": "arrival", "status": "ok", "wait_s": 0.1},
                                       {"step": "init", "status": "failed",
                                        "detail": "new_group: DistStoreError: Timed out after 121 seconds waiting for clients"}]}
               for r in range(4)}
    records[2]["comm"][1]["detail"] = "new_group: RuntimeError: CUDA error: out of memory"
    [finding] = analyse(records, plan)[0]
    assert [(c.rank, c.value) for c in finding.culprits] == [(2, "failed")]
    assert "out of memory" in finding.summary and "3 other ranks timed out waiting for it" in finding.summary
    for r in range(4):  # every rank timed out: nobody to single out, all are named
        records[r]["comm"][1]["detail"] = "RuntimeError: Socket Timeout"
    [finding] = analyse(records, plan)[0]
    assert [c.rank for c in finding.culprits] == [0, 1, 2, 3] and "timed out waiting" not in finding.summary


def test_a_rank_that_never_finished_setting_up():
    # Rank 3 reported nothing (killed while making its groups); the others waited at the barrier.
    ctx, options, plan = plan_for()
    ready_failed = {"step": "ready", "status": "failed", "missing": [3], "dead": [], "failed": []}
    records = {r: {"rank": r, "comm": [{"step": "arrival", "status": "ok", "wait_s": 0.1},
                                       {"step": "init", "status": "ok"}, ready_failed]} for r in range(3)}
    records[3] = None
    [finding] = analyse(records, plan)[0]
    assert finding.key == "ready" and [(c.node, c.rank, c.value) for c in finding.culprits] == [("node-1", 3, "never set up")]
    # A rank that said its own set-up hung is named once, by the init finding.
    records[3] = {"rank": 3, "comm": [{"step": "arrival", "status": "ok", "wait_s": 0.1},
                                      {"step": "init", "status": "hung", "detail": "no answer"}]}
    [finding] = analyse(records, plan)[0]
    assert finding.key == "init" and [(c.rank, c.value) for c in finding.culprits] == [(3, "hung")]


def test_nccl_bandwidth_is_judged_against_the_links():
    ctx, options, plan = plan_for(world=4, per_node=2, sizes=(256 << 20,), backend="nccl")
    plan["backend"] = "nccl"
    records = {r: record(r, plan, time_s=0.0005) for r in range(4)}  # 256 MiB in 0.5 ms: 537 GB/s algbw
    for r in (2, 3):  # node 1: NVLink down to 2 links of 18
        records[r]["report"] = torchrun_report(r, plan, gpu_overrides={0: {"nvlink": {"active_links": 2}}})
    slow = [s["name"] for s in plan["steps"] if s["scope"] == "intra-node" and s["op"] == "all_reduce"][0]
    for r in (2, 3):  # and its intra-node all-reduce takes 100 ms
        for e in records[r]["comm"]:
            if e["step"] == slow:
                e["time_s"] = 0.1
    findings, section = analyse(records, plan, backend="nccl")
    low = [f for f in findings if f.kind == "bandwidth-low"]
    assert len(low) == 1 and {c.rank for c in low[0].culprits} == {2, 3} and "node-1" in low[0].summary
    row = next(r for r in section["results"] if r["group"] == "node-0" and r["op"] == "all_reduce")
    assert row["expected_busbw_gbps"] == pytest.approx(0.5 * 18 * 25)  # NVLink 4: 25 GB/s a link
    # Rails: 400 Gb/s ports, one per GPU: 50 GB/s nominal.
    rail = next(r for r in section["results"] if r["scope"] == "inter-node" and r["op"] == "all_reduce")
    assert rail["expected_busbw_gbps"] == pytest.approx(25.0)


def test_build_fleet_merges_reports_and_collectives():
    ctx, options, plan = plan_for()
    records = {r: record(r, plan) for r in range(4)}
    records[1]["report"] = torchrun_report(1, plan, torch="2.12.0")
    records[3] = None
    data = build_fleet(records, {"heartbeat": {3: "0"}}, ctx, options, MergeOptions(), plan)
    from gpudoctor.fleet.render import load_schema

    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, load_schema())
    kinds = {f["kind"]: f for f in data["findings"]}
    assert {(c["node"], c["rank"]) for c in kinds["missing-rank"]["culprits"]} == {("node-1", 3)}
    assert {(c["node"], c["rank"]) for c in kinds["version-drift"]["culprits"]} == {("node-0", 1)}
    assert [n["ranks"] for n in data["nodes"]] == [[0, 1], [2]]
    assert data["collectives"]["backend"] == "gloo"
    assert "host0" not in json.dumps(data)  # real host names only with --no-redact


def test_a_rank_whose_scan_failed_still_counts():
    ctx, options, plan = plan_for()
    records = {r: record(r, plan) for r in range(4)}
    del records[2]["report"]
    records[2]["scan_error"] = "RuntimeError: injected"
    data = build_fleet(records, {}, ctx, options, MergeOptions(), plan)
    [failed] = [f for f in data["findings"] if f["kind"] == "scan-failed"]
    assert failed["culprits"][0]["rank"] == 2 and "injected" in failed["summary"]
    assert not [f for f in data["findings"] if f["kind"] in ("missing-rank", "version-drift")]


def test_scan_distributed_outside_torchrun_is_a_usage_error(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["scan", "--distributed", "--device", "cpu"])
    assert result.exit_code == 2 and "torchrun" in result.stderr and "Traceback" not in result.output


def test_a_scan_stopped_by_torchrun_is_a_termination_not_a_failed_scan():
    # The runner turns SIGTERM during the scan into ScanInterrupted (after killing its workers);
    # under --distributed that is torchrun tearing the job down: the rank publishes "terminated".
    import types

    from gpudoctor.scan import runner
    from gpudoctor.fleet import distributed

    def interrupted(options, progress=None):
        raise runner.ScanInterrupted(15)

    def broken(options, progress=None):
        raise runner.ScanError("cannot start the worker")

    ctx = DistContext.from_env(TORCHRUN)
    fake = types.SimpleNamespace(ScanInterrupted=runner.ScanInterrupted, run_scan=interrupted)
    with pytest.raises(distributed._Terminated, match="SIGTERM"):
        distributed._scan(runner.ScanOptions(device="cpu"), "cpu", ctx, None, fake)
    fake.run_scan = broken
    out = distributed._scan(runner.ScanOptions(device="cpu"), "cpu", ctx, None, fake)
    assert out["scan_error"] == "ScanError: cannot start the worker"
