"""`gpudoctor merge` on synthetic node reports (tests/fleet_synth.py) with drift, missing nodes and
stragglers written into them: every finding must name the right node, rank and GPU, and nothing
else may be flagged."""
from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

import fleet_synth as fs
from gpudoctor.cli import app
from gpudoctor.fleet import render
from gpudoctor.fleet.merge import MergeInputError, MergeOptions, merge_files, merge_reports
from gpudoctor.fleet.readers import load_inputs, parse_documents
from gpudoctor.reports.load import parse_documents as parse_whole, skim_bytes as _skim

runner = CliRunner()


def merged(tmp_path, reports, **options):
    return merge_files(fs.write(tmp_path, reports), MergeOptions(**options))


def by_kind(data, kind):
    return [f for f in data["findings"] if f["kind"] == kind]


def places(finding):
    return {(c["node"], c["rank"], c["gpu"]) for c in finding["culprits"]}


def validate(data):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, render.load_schema())


def test_a_healthy_fleet_has_no_findings(tmp_path):
    data = merged(tmp_path, [fs.node_report(i, nodes=4) for i in range(4)])
    validate(data)
    assert data["findings"] == []
    assert data["verdict"].startswith("healthy: 4 of 4 nodes")
    assert [n["name"] for n in data["nodes"]] == ["node-0", "node-1", "node-2", "node-3"]
    assert data["summary"] == {"nodes": 4, "ranks": 4, "gpus": 32, "errors": 0, "warnings": 0}
    assert not render.has_problems(data)


def test_one_node_reads_as_a_sentence(tmp_path):
    """`merge scan.json` of one node said "1 nodes reported" and "1 reports read"."""
    data = merged(tmp_path, [fs.node_report(0, nodes=1)])
    assert data["verdict"].startswith("healthy: 1 of 1 node reported, 8 GPUs")
    result = runner.invoke(app, ["merge", *fs.write(tmp_path, [fs.node_report(0, nodes=1)], prefix="alone")])
    assert result.exit_code == 0, result.output
    assert "healthy: 1 of 1 node reported, 8 GPUs, nothing differs" in result.stdout
    assert "1 report read" in result.stdout and "1 nodes" not in result.stdout


def test_drift_missing_node_and_straggler_are_named(tmp_path):
    reports = [
        fs.node_report(0, nodes=5),
        fs.node_report(1, nodes=5, torch="2.12.0+cu130", tflops={5: 400.0}),
        fs.node_report(2, nodes=5, driver="575.51.03", nccl_env={"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "WARN"},
                       gpu_overrides={3: {"pcie": {"width": 8}}, 6: {"vbios": "96.00.61.00.01"}}),
        fs.node_report(4, nodes=5, statuses={("sdpa-backends", 2): "fail"}),
    ]
    data = merged(tmp_path, reports)
    validate(data)

    [missing] = by_kind(data, "missing-node")
    assert places(missing) == {("node-3", 3, None)}
    assert by_kind(data, "missing-rank") == []  # rank 3 is counted with its node

    [straggler] = by_kind(data, "straggler")
    assert places(straggler) == {("node-1", 1, "cuda:5")}
    assert "bf16 400.0 TFLOP/s" in straggler["summary"]

    drift = {f["key"]: f for f in by_kind(data, "version-drift")}
    assert places(drift["torch"]) == {("node-1", 1, None)} and drift["torch"]["expected"] == "2.13.0+cu130"
    assert drift["torch"]["severity"] == "error"
    assert places(drift["driver"]) == {("node-2", 2, None)}
    assert set(drift) == {"torch", "driver"}  # nothing else differs

    [nccl] = by_kind(data, "nccl-env-drift")
    assert nccl["key"] == "NCCL_IB_HCA" and places(nccl) == {("node-2", 2, None)}

    [pcie] = by_kind(data, "pcie-degraded")
    assert places(pcie) == {("node-2", 2, "GPU 3")} and pcie["culprits"][0]["value"] == "x8"
    [vbios] = by_kind(data, "hardware-drift")
    assert vbios["key"] == "VBIOS" and places(vbios) == {("node-2", 2, "GPU 6")}

    [verdict] = by_kind(data, "verdict-drift")
    assert verdict["key"] == "sdpa-backends" and places(verdict) == {("node-4", 4, "cuda:2")}
    assert verdict["culprits"][0]["value"] == "fail" and verdict["severity"] == "error"

    # Errors first; exit code 1.
    severities = [f["severity"] for f in data["findings"]]
    assert severities == sorted(severities, key=lambda s: s != "error")
    assert render.has_problems(data)


def test_gpu_state_findings(tmp_path):
    reports = [fs.node_report(i, nodes=4) for i in range(3)]
    reports.append(fs.node_report(3, nodes=4, gpus=7, gpu_overrides={
        0: {"row_remapping": {"pending": True}},
        1: {"ecc": {"volatile_uncorrected": 2}},
        2: {"throttle_reasons": ["hw_slowdown", "sw_power_cap"]},
        4: {"nvlink": {"active_links": 12}},
        5: {"pcie": {"gen": 3}, "throttle_reasons": []},  # busy and slow link: a finding
        6: {"pcie": {"gen": 1}},  # idle (gpu_idle): power saving, not a finding
    }))
    data = merged(tmp_path, reports)
    validate(data)
    [count] = by_kind(data, "gpu-count")
    assert places(count) == {("node-3", 3, None)} and count["culprits"][0]["value"] == "7"
    hardware = {c["gpu"]: f for f in by_kind(data, "gpu-hardware") for c in f["culprits"]}
    assert set(hardware) == {"GPU 0", "GPU 1", "GPU 2"}
    assert "pending" in hardware["GPU 0"]["summary"] and "ECC" in hardware["GPU 1"]["summary"]
    assert "hw_slowdown" in hardware["GPU 2"]["summary"] and "sw_power_cap" not in hardware["GPU 2"]["summary"]
    nvlink = [f for f in by_kind(data, "hardware-drift") if f["key"] == "active NVLink links"]
    assert len(nvlink) == 1 and places(nvlink[0]) == {("node-3", 3, "GPU 4")} and nvlink[0]["severity"] == "error"
    pcie = by_kind(data, "pcie-degraded")
    assert [places(f) for f in pcie] == [{("node-3", 3, "GPU 5")}]


def test_straggler_needs_both_the_median_and_the_expectation(tmp_path):
    # 14% below the median but at 61% of nominal: above the expectation, not a straggler.
    data = merged(tmp_path, [fs.node_report(0, nodes=2, tflops={1: 600.0}), fs.node_report(1, nodes=2)])
    assert by_kind(data, "straggler") == []
    # The whole fleet at 40% of nominal: below the expectation but nobody below the median.
    slow = {g: 400.0 for g in range(8)}
    data = merged(tmp_path, [fs.node_report(0, nodes=2, tflops=slow), fs.node_report(1, nodes=2, tflops=slow)])
    assert by_kind(data, "straggler") == []
    # The threshold is an option.
    data = merged(tmp_path, [fs.node_report(0, nodes=2, tflops={1: 600.0}), fs.node_report(1, nodes=2)],
                  expect_fraction=0.7)
    assert places(by_kind(data, "straggler")[0]) == {("node-0", 0, "cuda:1")}


def test_cpu_gemm_is_not_judged_and_says_so(tmp_path):
    cpu = json.loads(fs.TEMPLATE.read_text())
    data = merge_reports([d for i in range(3) for d in parse_documents(json.dumps(cpu, indent=2), f"cpu-{i}.json")],
                         MergeOptions())
    assert by_kind(data, "straggler") == []
    assert data["stragglers"]["groups"] == []
    assert "no nominal peak" in data["stragglers"]["not_judged"][0]["reason"]


def test_common_problem_and_tie(tmp_path):
    reports = [fs.node_report(i, nodes=2, statuses={("fp8-matmul", g): "crashed" for g in range(8)}) for i in range(2)]
    data = merged(tmp_path, reports)
    [common] = by_kind(data, "common-problem")
    assert common["key"] == "fp8-matmul" and len(common["culprits"]) == 16
    # Two nodes, two torch versions: no majority, both are named.
    data = merged(tmp_path, [fs.node_report(0, nodes=2), fs.node_report(1, nodes=2, torch="2.12.0")])
    [drift] = by_kind(data, "version-drift")
    assert drift["expected"] is None and places(drift) == {("node-0", 0, None), ("node-1", 1, None)}


def test_missing_ranks_in_a_multi_rank_layout(tmp_path):
    # torchrun-like: 2 nodes x 2 ranks, rank 3 missing on a node that did report.
    reports = []
    for rank in (0, 1, 2):
        r = fs.node_report(rank // 2, nodes=2, gpus=2)
        launcher = r["environment"]["fleet"]["launcher"]
        launcher.update(rank=rank, local_rank=rank % 2, world_size=4, local_world_size=2)
        reports.append(r)
    data = merged(tmp_path, reports)
    assert by_kind(data, "missing-node") == []
    [missing] = by_kind(data, "missing-rank")
    assert places(missing) == {("node-1", 3, None)}
    assert [n["ranks"] for n in data["nodes"]] == [[0, 1], [2]]


def test_duplicates_and_mixed_jobs(tmp_path):
    reports = [fs.node_report(0, nodes=2), fs.node_report(1, nodes=2), fs.node_report(1, nodes=2),
               fs.node_report(0, nodes=1, job="999")]
    data = merged(tmp_path, reports)
    [dup] = by_kind(data, "duplicate-report")
    assert {c["rank"] for c in dup["culprits"]} == {1}
    [mixed] = by_kind(data, "mixed-jobs")
    assert mixed["expected"] == "4242" and mixed["culprits"][0]["value"] == "999"
    assert not by_kind(data, "missing-node")


def test_redaction_names_nodes_by_pseudonyms_everywhere(tmp_path):
    reports = [fs.node_report(i, nodes=4) for i in (0, 1, 3)]
    reports[1]["results"][0]["summary"] = "failed on gpu001.cluster.example and gpu003 (see /home/alice/log)"
    reports[1]["results"][0]["status"] = "fail"
    fs.recount(reports[1])
    paths = []
    for r, i in zip(reports, (0, 1, 3)):
        path = tmp_path / f"scan-gpu{i:03d}.json"  # srun -o 'scan-%N.json'
        path.write_text(json.dumps(r, indent=2))
        paths.append(str(path))
    data = merge_files(paths)
    text = json.dumps(data) + render.render_markdown(data, verbose=True)
    assert not re.search(r"gpu\d{3}", text), "a real host name leaked"
    assert "alice" not in text
    assert [n["name"] for n in data["nodes"]] == ["node-0", "node-1", "node-3"]
    assert [n["sources"] for n in data["nodes"]][1] == [str(tmp_path / "scan-node-1.json")]
    [missing] = by_kind(data, "missing-node")
    assert missing["culprits"][0]["node"] == "node-2"
    [verdict] = by_kind(data, "verdict-drift")
    assert "node-1" in verdict["culprits"][0]["detail"] and "node-3" in verdict["culprits"][0]["detail"]
    # --no-redact: real names, the missing one expanded from Slurm's node list.
    plain = merge_files(paths, MergeOptions(redact=False))
    assert [n["name"] for n in plain["nodes"]] == ["gpu000", "gpu001", "gpu003"]
    assert by_kind(plain, "missing-node")[0]["culprits"][0]["node"] == "gpu002"
    assert plain["job"]["node_list"] == "gpu[000-003]"


def test_redacted_node_reports_still_name_missing_nodes(tmp_path):
    data = merged(tmp_path, [fs.node_report(i, nodes=3, redacted=True) for i in (0, 2)], redact=False)
    assert [n["name"] for n in data["nodes"]] == ["node-0", "node-2"]
    assert places(by_kind(data, "missing-node")[0]) == {("node-1", 1, None)}


def test_reports_without_a_launcher_are_compared_as_they_are(tmp_path):
    reports = [fs.node_report(i, nodes=3, launcher=False, torch="2.12.0" if i == 2 else "2.13.0") for i in range(3)]
    data = merged(tmp_path, reports)
    assert not by_kind(data, "missing-node") and not by_kind(data, "missing-rank")
    [drift] = by_kind(data, "version-drift")
    assert drift["culprits"][0]["node"] == "node-2" and drift["culprits"][0]["rank"] is None


# --- inputs ----------------------------------------------------------------------------------------


def test_unreadable_reports_are_findings_and_the_rest_is_merged(tmp_path):
    paths = fs.write(tmp_path, [fs.node_report(0, nodes=2), fs.node_report(1, nodes=2)])
    text = json.dumps(fs.node_report(1, nodes=2), indent=2)
    (tmp_path / "truncated.json").write_text(text[: len(text) // 2])
    (tmp_path / "junk.json").write_bytes(b"\x00\xff\xfe binary")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "fleet.json").write_text(json.dumps(merge_files(paths)))
    extra = [str(tmp_path / n) for n in ("truncated.json", "junk.json", "other.json", "empty.json", "fleet.json")]
    data = merge_files(paths + extra)
    validate(data)
    bad = {f["culprits"][0]["detail"].rsplit("/", 1)[-1]: f["summary"] for f in by_kind(data, "unreadable-report")}
    assert set(bad) == {"truncated.json", "junk.json", "other.json", "empty.json", "fleet.json"}
    assert "truncated" in bad["truncated.json"] and "binary data" in bad["junk.json"]
    assert "not a gpudoctor scan report" in bad["other.json"] and "fleet report" in bad["fleet.json"]
    assert data["inputs"] == {"reports": 2, "unreadable": 5}
    assert not by_kind(data, "missing-node")


def test_nothing_readable_or_no_such_file_is_an_input_error(tmp_path):
    (tmp_path / "junk.json").write_text("nope")
    with pytest.raises(MergeInputError, match="nothing to merge"):
        merge_files([str(tmp_path / "junk.json")])
    with pytest.raises(MergeInputError, match="no such file"):
        merge_files([str(tmp_path / "absent.json")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeInputError, match="no \\*.json"):
        merge_files([str(tmp_path / "empty")])


def test_a_fifo_is_refused_without_blocking(tmp_path, monkeypatch):
    # Read as `gpudoctor report` reads one: a pipe nobody writes to ends at the idle deadline.
    from gpudoctor.reports import load

    monkeypatch.setattr(load, "READ_TIMEOUT_S", 0.3)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    [loaded] = load_inputs([str(fifo)])
    assert loaded.data is None and "nothing more arrived" in loaded.error


def test_a_folder_and_concatenated_reports(tmp_path):
    folder = tmp_path / "scans"
    folder.mkdir()
    fs.write(folder, [fs.node_report(0, nodes=3)])
    both = "".join(json.dumps(fs.node_report(i, nodes=3), indent=2) + "\n" for i in (1, 2))
    (tmp_path / "all.json").write_text(both)
    data = merge_files([str(folder), str(tmp_path / "all.json")])
    assert data["findings"] == [] and len(data["nodes"]) == 3
    assert data["nodes"][2]["sources"][0].endswith("all.json#2")


def test_progress_lines_before_a_report_are_skipped(tmp_path):
    # `srun -o scan-%N.json` without -e: the scan's stderr lands in the same file, first.
    text = "gpudoctor: [1/12] arch-compat on cuda:0: pass (0.10s)\n" + json.dumps(fs.node_report(0, nodes=1), indent=2)
    (tmp_path / "scan.json").write_text(text)
    data = merge_files([str(tmp_path / "scan.json")])
    assert data["inputs"] == {"reports": 1, "unreadable": 0}


def test_the_fast_path_reads_what_a_full_parse_reads():
    report = fs.node_report(1, nodes=2, statuses={("fp8-matmul", 2): "crashed"})
    pretty = json.dumps(report, indent=2)
    skimmed = json.loads(_skim(pretty.encode()))
    full = json.loads(pretty)
    for r in full["results"]:
        for key in ("findings", "exit_code", "signal", "stderr_tail"):
            del r[key]  # not read by the merge: cut before parsing
        if r["probe"] == "matmul-sanity":
            r["details"] = {"throughput": r["details"]["throughput"]}  # the throughput, and only it, is read
        else:
            del r["details"]
    assert skimmed == full
    # Compact JSON has no such shape: parsed whole, same merge.
    assert _skim(json.dumps(report).encode()) is None
    a = merge_reports(parse_documents(pretty, "a"), MergeOptions())
    b = merge_reports(parse_whole(json.dumps(report), "a", skim=False), MergeOptions())
    assert a["findings"] == b["findings"] and a["stragglers"] == b["stragglers"]


def test_the_fast_path_applies_to_what_scan_writes_today():
    """The skim is keyed to render_json's layout; if the scan's JSON changes shape, the merge must
    still read the same (it falls back to a full parse) and this test says the fast path is lost."""
    from gpudoctor.reports.model import report_from_dict
    from gpudoctor.reports.render import render_json

    written = render_json(report_from_dict(fs.node_report(0, nodes=1, gpus=2))).encode()
    skimmed = _skim(written)
    assert skimmed is not None and len(skimmed) < len(written) / 2
    full = json.loads(written)
    fast = json.loads(skimmed)
    assert [(r["probe"], r["device"], r["status"], r["summary"]) for r in fast["results"]] == \
        [(r["probe"], r["device"], r["status"], r["summary"]) for r in full["results"]]
    assert fast["environment"] == full["environment"]
    gemm = [r["details"] for r in fast["results"] if r["probe"] == "matmul-sanity"]
    assert gemm == [{"throughput": r["details"]["throughput"]} for r in full["results"] if r["probe"] == "matmul-sanity"]
    assert gemm[0]["throughput"]["measured"]


def test_untrusted_text_stays_text(tmp_path):
    hostile = "\x1b]52;c;ZXZpbA==\x07[bold red]pwn[/] <img src=x> | `code` \x1b[31mred"
    reports = [fs.node_report(i, nodes=2) for i in range(2)]
    reports[1]["results"][0].update(status="fail", summary=hostile)
    fs.recount(reports[1])
    reports[1]["environment"]["torch"]["version"] = "2.13.0 " + hostile
    data = merged(tmp_path, reports)
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    render.render_terminal(data, Console(file=out, width=200, color_system=None), verbose=True)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "[bold red]pwn[/]" in text  # shown, not interpreted
    md = render.render_markdown(data, verbose=True)
    assert "<img" not in md and "\x1b" not in md and "\\[bold red\\]" in md


# --- the command -----------------------------------------------------------------------------------


def test_cli_merge_formats_and_exit_codes(tmp_path):
    healthy = fs.write(tmp_path, [fs.node_report(i, nodes=2) for i in range(2)], prefix="ok")
    result = runner.invoke(app, ["merge", *healthy, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    validate(data)
    assert data["kind"] == "gpudoctor-fleet-report" and data["findings"] == []

    sick = fs.write(tmp_path, [fs.node_report(0, nodes=3), fs.node_report(1, nodes=3, tflops={2: 300.0})], prefix="sick")
    out = tmp_path / "fleet.md"
    result = runner.invoke(app, ["merge", *sick, "--format", "md", "-o", str(out)])
    assert result.exit_code == 1
    assert out.read_text().startswith("## gpudoctor fleet report") and "node-2 sent no report" in out.read_text()

    result = runner.invoke(app, ["merge", *sick, "-q"])
    assert result.exit_code == 1 and result.stdout.count("\n") == 1 and "node-2" in result.stdout

    result = runner.invoke(app, ["merge", *sick])
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[1].startswith("2 errors") and any(line.startswith("2 errors") for line in lines[-3:])


def test_cli_merge_usage_errors(tmp_path):
    result = runner.invoke(app, ["merge", str(tmp_path / "absent.json")])
    assert result.exit_code == 2 and "no such file" in result.stderr
    (tmp_path / "x.json").write_text("garbage")
    result = runner.invoke(app, ["merge", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "nothing to merge" in result.stderr and "Traceback" not in result.output
    good = fs.write(tmp_path, [fs.node_report(0, nodes=1)])
    result = runner.invoke(app, ["merge", *good, "-o", str(tmp_path)])
    assert result.exit_code == 2 and "is a directory" in result.stderr
    result = runner.invoke(app, ["merge", *good, "--straggler-fraction", "2"])
    assert result.exit_code == 2


def test_merge_follows_the_shared_output_convention(tmp_path):
    """The same rules as scan (gpudoctor.cli's plan_outputs / emit / write_file)."""
    reports = fs.write(tmp_path, [fs.node_report(i, nodes=2) for i in range(2)])
    # A .json or .md path picks the format when --format is not given; nothing then on stdout.
    result = runner.invoke(app, ["merge", *reports, "-o", str(tmp_path / "fleet.json")])
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads((tmp_path / "fleet.json").read_text())["kind"] == "gpudoctor-fleet-report"
    assert result.stderr.startswith("gpudoctor: healthy")  # the verdict, since stdout had nothing
    result = runner.invoke(app, ["merge", *reports, "-o", str(tmp_path / "fleet.md")])
    assert (tmp_path / "fleet.md").read_text().startswith("## gpudoctor fleet report")
    # A link to a file is refused before any work, and its target is untouched.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    result = runner.invoke(app, ["merge", *reports, "-o", str(link)])
    assert result.exit_code == 2 and "is a symbolic link" in result.stderr and victim.read_text() == "precious"
    result = runner.invoke(app, ["merge", *reports, "-o", "/proc/self/comm"])
    assert result.exit_code == 2 and "kernel interface" in result.stderr
    # Written whole: an existing report is replaced, keeping its mode.
    out = tmp_path / "old.json"
    out.write_text("old")
    out.chmod(0o640)
    assert runner.invoke(app, ["merge", *reports, "--format", "json", "-o", str(out)]).exit_code == 0
    assert json.loads(out.read_text())["findings"] == [] and (out.stat().st_mode & 0o777) == 0o640


def test_merge_into_a_closed_pipe_exits_141_quietly(tmp_path):
    import subprocess
    import sys

    reports = fs.write(tmp_path, [fs.node_report(i, nodes=2) for i in range(2)])
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "gpudoctor", "merge", *reports], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_the_same_report_given_twice_is_one_node(tmp_path):
    # `merge scan.json scan.json`, or a copy of a node's report: one node, and a warning that says so.
    report = fs.node_report(0, nodes=1)
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(report))
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(report))
    data = merge_files([str(path), str(path), str(copy)], MergeOptions())
    validate(data)
    assert [n["name"] for n in data["nodes"]] == ["node-0"]
    [dup] = by_kind(data, "duplicate-report")
    assert "given 3 times" in dup["summary"] and "counted once" in dup["summary"]
    assert [c["node"] for c in dup["culprits"]] == ["node-0"] * 3
    assert data["inputs"]["reports"] == 3
    # Two different scans of one machine are not copies.
    later = json.loads(json.dumps(report))
    later["created"] = "2026-11-23T09:00:00+00:00"
    (tmp_path / "later.json").write_text(json.dumps(later))
    data = merge_files([str(path), str(tmp_path / "later.json")], MergeOptions())
    assert not [f for f in by_kind(data, "duplicate-report") if "counted once" in f["summary"]]


def test_a_long_driver_text_stays_short_in_the_node_table(tmp_path):
    import io

    from rich.console import Console

    report = fs.node_report(0, nodes=1)
    report["environment"]["nvml"] = {"available": False, "reason": "NVML: libnvidia-ml.so.1 not found: no NVIDIA driver, "
                                     "or a container started without the NVIDIA runtime"}
    data = merged(tmp_path, [report])
    out = io.StringIO()
    render.render_terminal(data, Console(file=out, width=100, color_system=None))
    lines = out.getvalue().splitlines()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("node-0"))
    assert "unavailable: NVML" in lines[row]
    assert "NVIDIA runtime" not in "\n".join(lines[row:row + 4])  # the whole text is in JSON
    assert "NVIDIA runtime" in json.dumps(data)


def _without_torch(report: dict, reason: str = "ModuleNotFoundError: No module named 'torch'") -> dict:
    """A node whose scan ran with an interpreter that has no torch, as the runner reports it: a
    failed torch-import result, every probe skipped, no torch section."""
    env = report["environment"]
    env["torch"] = {"available": False, "reason": reason}
    env["packages"]["installed"].pop("torch", None)
    python = "/opt/env/bin/python"
    skipped = [dict(r, status="skipped", summary=f"torch could not be imported in {python} (see torch-import)",
                    findings=[], details={}) for r in report["results"]]
    report["results"] = [{"probe": "torch-import", "title": "import torch in the target interpreter", "device": None,
                          "status": "fail", "summary": f"torch cannot be imported in {python}: {reason}",
                          "duration_s": 0.0, "details": {}, "findings": [
                              {"kb_id": "torch-import-failed", "summary": reason, "evidence": [reason],
                               "severity": "error"}],
                          "exit_code": None, "signal": None, "stderr_tail": None}] + skipped
    return fs.recount(report)


def test_a_node_without_torch_is_one_finding_that_says_so(tmp_path):
    """One cause, one finding: node-3's torch cannot be imported. Not a version drift for torch, its
    CUDA, cuDNN and NCCL, nor a verdict drift for every probe it skipped for want of torch."""
    reports = [fs.node_report(i, nodes=4) for i in range(3)] + [_without_torch(fs.node_report(3, nodes=4))]
    data = merged(tmp_path, reports)
    validate(data)
    failed = by_kind(data, "scan-failed")
    assert len(failed) == 1 and failed[0]["severity"] == "error"
    assert failed[0]["summary"].startswith("node-3 rank 3: torch cannot be imported (ModuleNotFoundError: No module")
    assert places(failed[0]) == {("node-3", 3, None)}
    assert not [f for f in data["findings"] if f["kind"] == "version-drift" and f["key"] in
                ("torch", "torch CUDA", "cuDNN", "NCCL", "package torch")]
    assert by_kind(data, "verdict-drift") == []
    assert data["findings"][0] is failed[0] or data["findings"][0] == failed[0]
    assert "node-3 rank 3: torch cannot be imported" in data["verdict"]


def test_a_large_fleet_shows_alike_nodes_on_one_row_and_every_node_with_v(tmp_path):
    import io

    from rich.console import Console

    n = render.NODE_ROWS + 8
    reports = [fs.node_report(i, nodes=n, gpus=1, torch="2.12.0+cu130" if i == 5 else "2.13.0+cu130") for i in range(n)]
    data = merged(tmp_path, reports)

    def shown(verbose: bool) -> str:
        out = io.StringIO()
        render.render_terminal(data, Console(file=out, width=200, color_system=None), verbose=verbose)
        return out.getvalue()

    text = shown(False)
    assert f"Nodes ({n}): 2 rows" in text
    rows = [line for line in text.splitlines() if line.strip().startswith(("node-", f"{n - 1} nodes"))]
    assert len(rows) == 2
    assert "node-5" in rows[0] and "2.12.0+cu130" in rows[0]  # the odd node first, on its own row
    assert rows[1].strip().startswith(f"{n - 1} nodes: node-0 … node-{n - 1}") and "2.13.0+cu130" in rows[1]
    every = shown(True)
    assert all(re.search(rf"^\s*node-{i}\s", every, re.M) for i in range(n))
    assert "rows" not in every.split("Nodes (")[1].splitlines()[0]
