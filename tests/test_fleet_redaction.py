"""Redaction in the fleet report: one `Redactor` for the whole merged report names each node
`node-N` (its index in the job) in every field and file name, whether the node reports were
redacted at the node (they then say `<host>` for themselves and the merge goes by node index) or
made with --no-redact (the merge knows the real names and replaces them)."""
from __future__ import annotations

import json
import re

import fleet_synth as fs
from gpudoctor.fleet import render
from gpudoctor.fleet.merge import MergeOptions, merge_files
from gpudoctor.reports import redact as redact_module
from gpudoctor.reports.redact import Redactor, redact_report

REAL = re.compile(r"gpu\d{3}|cluster\.example")


def leaks(data) -> list[str]:
    text = json.dumps(data) + render.render_markdown(data, verbose=True)
    return REAL.findall(text)


def node_redacted(report, index):
    """What `gpudoctor scan` (redaction on, the default) writes on node `index`."""
    host = f"gpu{index:03d}.cluster.example"
    env = {"SLURMD_NODENAME": f"gpu{index:03d}", "HOSTNAME": host}
    return redact_report(report, Redactor(home="/home/alice", user="alice", host=host, environ=env))


def test_reports_redacted_at_the_nodes_merge_by_node_index(tmp_path):
    reports = [node_redacted(fs.node_report(i, nodes=4, torch="2.12.0" if i == 3 else "2.13.0+cu130"), i)
               for i in (0, 1, 3)]
    launcher = reports[0]["environment"]["fleet"]["launcher"]
    assert launcher["hostname"]["name"] == "<host>" and launcher["node_index"] == 0
    paths = []
    for i, r in zip((0, 1, 3), reports):
        path = tmp_path / f"scan-{i}.json"  # srun -o 'scan-%n.json': the node index, no host name
        path.write_text(json.dumps(r, indent=2))
        paths.append(str(path))
    data = merge_files(paths)
    assert [n["name"] for n in data["nodes"]] == ["node-0", "node-1", "node-3"]
    kinds = {f["kind"]: f for f in data["findings"]}
    assert kinds["missing-node"]["culprits"][0]["node"] == "node-2"
    assert [c["node"] for c in kinds["version-drift"]["culprits"]] == ["node-3"]
    assert "<host>" not in json.dumps(data)  # a placeholder never names a node
    assert leaks(data) == []
    # --no-redact cannot bring back what the nodes did not keep: names by index still.
    assert [n["name"] for n in merge_files(paths, MergeOptions(redact=False))["nodes"]] == ["node-0", "node-1", "node-3"]


def test_node_names_are_the_same_in_every_field_and_file_name(tmp_path, monkeypatch):
    # Merged on node 1 itself: its name is node-1 in the fleet report, not this machine's <host>.
    monkeypatch.setattr(redact_module, "_host", lambda: "gpu001.cluster.example")
    comm = {"NCCL_COMM_ID": "gpu000:29500", "NCCL_IB_HCA": "mlx5"}
    reports = [fs.node_report(i, nodes=5, nccl_env=dict(comm)) for i in range(4)]
    reports[2]["environment"]["fleet"]["nccl"]["env"]["NCCL_COMM_ID"] = "gpu003.cluster.example:29500"
    reports[2]["results"][0].update(status="fail", summary="timeout talking to gpu001 (gpu003-ib0 down)")
    fs.recount(reports[2])
    paths = []
    for i, r in enumerate(reports):
        path = tmp_path / f"scan-gpu{i:03d}.json"  # srun -o 'scan-%N.json'
        path.write_text(json.dumps(r))
        paths.append(str(path))
    # Node 4 died while writing: its file is named from Slurm's node list, gpu[000-004].
    (tmp_path / "scan-gpu004.json").write_text('{"truncated": ')
    data = merge_files([*paths, str(tmp_path / "scan-gpu004.json")])
    assert leaks(data) == []
    assert [n["sources"] for n in data["nodes"]] == [[str(tmp_path / f"scan-node-{i}.json")] for i in range(4)]
    kinds = {f["kind"]: f for f in data["findings"]}
    [comm_drift] = [f for f in data["findings"] if f["kind"] == "nccl-env-drift"]
    assert comm_drift["expected"] == "node-0:29500"
    assert [(c["node"], c["value"]) for c in comm_drift["culprits"]] == [("node-2", "node-3:29500")]
    assert kinds["verdict-drift"]["culprits"][0]["detail"] == "timeout talking to node-1 (node-3-ib0 down)"
    assert kinds["unreadable-report"]["culprits"][0]["detail"] == str(tmp_path / "scan-node-4.json")
    assert kinds["missing-node"]["culprits"][0]["node"] == "node-4"
    # An address stays an address placeholder, the same one everywhere.
    reports = [fs.node_report(i, nodes=2, nccl_env={"NCCL_COMM_ID": "10.1.2.3:29500"}) for i in range(2)]
    reports[1]["environment"]["fleet"]["nccl"]["env"]["NCCL_COMM_ID"] = "[fd00::7]:29500"
    data = merge_files(fs.write(tmp_path, reports, prefix="ip"))
    [drift] = [f for f in data["findings"] if f["kind"] == "nccl-env-drift"]
    values = sorted(c["value"] for c in drift["culprits"])
    assert re.fullmatch(r"<ip-\d>:29500", values[0]) and re.fullmatch(r"\[<ip-\d>\]:29500", values[1])
    assert values[0][:6] != values[1][1:7]  # two addresses, two placeholders
    assert "10.1.2.3" not in json.dumps(data) and "fd00" not in json.dumps(data)


def test_unredacted_merge_keeps_the_real_names(tmp_path):
    reports = [fs.node_report(i, nodes=2) for i in range(2)]
    data = merge_files(fs.write(tmp_path, reports), MergeOptions(redact=False))
    assert [n["name"] for n in data["nodes"]] == ["gpu000", "gpu001"] and data["redacted"] is False
