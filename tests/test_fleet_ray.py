"""`gpudoctor scan --ray`: the fleet report from Ray tasks' results (always tested, with made-up
results), and a real scan of a local Ray cluster where ray is installed (skipped otherwise: ray is
an optional extra)."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
from typer.testing import CliRunner

import fleet_synth as fs
from gpudoctor.cli import app
from gpudoctor.fleet.distributed import DistributedError
from gpudoctor.fleet.merge import MergeOptions
from gpudoctor.fleet.rayscan import fleet_from_ray

NODES = [{"node_id": f"id{i}", "hostname": f"rayhost{i}"} for i in range(4)]


def result(i, **kw):
    return {"node_id": f"id{i}", "hostname": f"rayhost{i}", "report": fs.node_report(i, nodes=3, launcher=False, **kw)}


def test_ray_results_become_a_fleet_report():
    results = [result(0), result(1, torch="2.12.0"), {"node_id": "id2", "error": "RayTaskError: worker died"}, result(3)]
    data = fleet_from_ray(results, NODES, "01000000", MergeOptions())
    kinds = {f["kind"]: f for f in data["findings"]}
    assert [(c["node"], c["rank"]) for c in kinds["version-drift"]["culprits"]] == [("node-1", 1)]
    assert [(c["node"], c["rank"]) for c in kinds["scan-failed"]["culprits"]] == [("node-2", 2)]
    assert "missing-node" not in kinds  # the failed node is named once, with its reason
    assert data["job"]["launcher"] == "ray" and data["job"]["expected_nodes"] == 4
    assert "rayhost" not in json.dumps(data)
    plain = fleet_from_ray(results, NODES, "01000000", MergeOptions(redact=False))
    assert [n["name"] for n in plain["nodes"]] == ["rayhost0", "rayhost1", "rayhost3"]
    assert {f["kind"]: f for f in plain["findings"]}["scan-failed"]["culprits"][0]["node"] == "rayhost2"


def test_a_node_whose_task_never_ran_is_missing():
    data = fleet_from_ray([result(0), result(2), result(3)], NODES, "j", MergeOptions())
    [missing] = [f for f in data["findings"] if f["kind"] == "missing-node"]
    assert missing["culprits"][0]["node"] == "node-1"


def test_no_report_at_all_is_an_error():
    with pytest.raises(DistributedError, match="no Ray node returned a report"):
        fleet_from_ray([{"node_id": "id0", "error": "boom"}], NODES, "j", MergeOptions())


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_without_ray_the_option_is_a_usage_error():
    result = CliRunner().invoke(app, ["scan", "--ray", "--device", "cpu"])
    assert result.exit_code == 2 and "needs ray" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (an optional extra)")
def test_a_local_ray_cluster(tmp_path, monkeypatch):
    import ray

    fake = str(pathlib.Path(__file__).parent / "fixtures" / "fake_probes" / "ok.py")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
        out = tmp_path / "fleet.json"
        result = CliRunner().invoke(app, ["scan", "--ray", "--device", "cpu", "--probe-file", fake, "--probe", "fake-ok",
                                          "--json", str(out)])
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        assert data["job"]["launcher"] == "ray" and [n["name"] for n in data["nodes"]] == ["node-0"]
        assert data["nodes"][0]["counts"] == {"pass": 1}
    finally:
        ray.shutdown()
