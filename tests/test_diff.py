"""`gpudoctor diff A.json B.json`: what differs, and the difference that explains a changed verdict
ranked first. (Bad input for diff is tested with report's, in test_report_cmd.py.)"""
from __future__ import annotations

import copy
import json
import pathlib

import pytest
from typer.testing import CliRunner

from gpudoctor.knowledge import kb
from gpudoctor.cli import app
from gpudoctor.reports import diff as rdiff

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "reports"
SAMPLE = FIXTURES / "sample.json"
VALIDATION = pathlib.Path(__file__).resolve().parent.parent / "docs" / "validation"
runner = CliRunner()
STATUSES = ("pass", "warn", "fail", "skipped", "crashed", "timed_out")


def _recount(data: dict) -> dict:
    data["summary"] = {s: sum(r["status"] == s for r in data["results"]) for s in STATUSES}
    return data


def pair() -> tuple[dict, dict]:
    """A works; B was upgraded (torch, xformers, diffusers, an allocator setting) and its SDPA probe
    now fails with sdpa-no-kernel."""
    a = json.loads(SAMPLE.read_text())
    a["results"][1].update(status="pass", summary="flash: ok | efficient: ok | cudnn: ok", findings=[])
    b = copy.deepcopy(a)
    env = b["environment"]
    env["torch"]["version"] = "2.9.0+cu128"
    env["packages"]["installed"]["torch"]["version"] = "2.9.0+cu128"
    env["packages"]["installed"]["xformers"]["version"] = "0.0.33"
    env["packages"]["installed"]["diffusers"]["version"] = "0.36.0"
    env["env_vars"]["TORCH_USE_CUDA_DSA"] = "0"
    b["results"][1].update(status="fail", summary="no SDPA kernel for this input", findings=[{
        "kb_id": "sdpa-no-kernel", "summary": "No available kernel", "evidence": ["No available kernel. Aborting execution."],
        "severity": "error"}])
    return _recount(a), _recount(b)


def test_the_difference_that_explains_the_verdict_ranks_first():
    a, b = pair()
    d = rdiff.diff_reports(a, b)
    assert [(v.probe, v.a, v.b) for v in d.verdicts] == [("sdpa-backends", "pass", "fail")]
    keys = [x.key for x in d.differences]
    assert keys[0] == "torch"  # bears on sdpa-no-kernel, which sdpa-backends reports on B
    assert d.differences[0].score == 3
    assert d.differences[0].explains == [{"probe": "sdpa-backends", "kb_id": "sdpa-no-kernel", "link": "reported"}]
    # xformers can matter to a probe that checks attention (weaker), diffusers cannot.
    assert keys.index("package:xformers") < keys.index("package:diffusers")
    assert d.differences[keys.index("package:xformers")].score == 2
    assert d.differences[keys.index("package:diffusers")].score == 0
    assert d.differences[keys.index("env:TORCH_USE_CUDA_DSA")].score == 0
    assert d.verdicts[0].explained_by[0]["key"] == "torch"
    assert "package:torch" not in keys  # torch's version is shown once


def test_the_ranking_follows_the_data_not_the_order_of_the_files():
    a, b = pair()
    forward = rdiff.diff_reports(a, b)
    backward = rdiff.diff_reports(b, a)
    assert backward.verdicts[0].change == "better"
    assert [x.key for x in backward.differences][0] == "torch" == [x.key for x in forward.differences][0]


def test_a_driver_difference_wins_when_the_finding_is_a_driver_one():
    a, b = pair()
    b["environment"]["nvml"]["driver_version"] = "535.54.03"
    b["environment"]["nvml"]["cuda_driver_version"] = "12.2"
    b["results"][1]["findings"][0]["kb_id"] = "driver-too-old"
    d = rdiff.diff_reports(a, b)
    top = [x.key for x in d.differences[:2]]
    assert set(top) == {"driver", "driver.cuda"}
    torch_diff = next(x for x in d.differences if x.key == "torch")
    assert torch_diff.score == 2  # torch bears on ids sdpa-backends checks for, not on driver-too-old


def test_bears_on_names_only_real_ids_and_every_id_a_probe_can_detect():
    ids = {e.id for e in kb.load_all()}
    for key, bears in rdiff.BEARS_ON.items():
        assert bears, key
        assert set(bears) <= ids, (key, set(bears) - ids)
    assert rdiff.bears_on("package:nvidia-cublas-cu12") == rdiff.BEARS_ON["package:nvidia-cublas"]
    assert rdiff.bears_on("env:XFORMERS_FORCE_DISABLE_TRITON") == rdiff.BEARS_ON["env:XFORMERS_"]
    assert rdiff.bears_on("package:numpy") == ()
    # The relation between probes and ids comes from the knowledge base and the probes' SPECs.
    assert "sdpa-no-kernel" in rdiff.detectable_by("sdpa-backends")
    assert "no-kernel-image" in rdiff.detectable_by("arch-compat")


def test_identical_reports_have_no_differences_and_exit_0(tmp_path):
    r = runner.invoke(app, ["diff", str(SAMPLE), str(SAMPLE)])
    assert r.exit_code == 0, r.output
    assert "Every probe has the same verdict" in r.stdout and "do not differ" in r.stdout


def test_cli_formats_and_exit_code(tmp_path):
    a, b = pair()
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    args = ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    text = runner.invoke(app, args)
    assert text.exit_code == 1
    lines = text.stdout.splitlines()
    assert any(line.strip().startswith("sdpa-backends on cuda:0: pass -> fail [sdpa-no-kernel]") for line in lines)
    first = next(line for line in lines if line.strip().startswith("1."))
    assert "torch: 2.8.0+cu128 -> 2.9.0+cu128" in first and "bears on sdpa-no-kernel" in first
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert data["kind"] == "gpudoctor-diff" and data["verdicts_changed"] is True
    assert data["differences"][0]["key"] == "torch"
    md = runner.invoke(app, [*args, "--format", "md"]).stdout
    assert md.startswith("## gpudoctor diff")
    assert "| 1 | `torch` | `2.8.0+cu128` | `2.9.0+cu128` |" in md
    out = tmp_path / "d.md"
    r = runner.invoke(app, [*args, "-o", str(out)])
    assert r.exit_code == 1 and r.stdout == "" and out.read_text() == md


def test_quiet_is_the_verdict_line_and_verbose_every_link(tmp_path):
    a, b = pair()
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    args = ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    quiet = runner.invoke(app, [*args, "-q"])
    n = len(rdiff.diff_reports(a, b).differences)
    assert quiet.exit_code == 1 and quiet.stdout == (
        "gpudoctor: 1 verdict changed, first sdpa-backends on cuda:0: pass -> fail [sdpa-no-kernel]; "
        f"likely: torch 2.8.0+cu128 -> 2.9.0+cu128; {n} environment differences\n")
    same = runner.invoke(app, ["diff", str(SAMPLE), str(SAMPLE), "-q"])
    assert same.exit_code == 0 and same.stdout == "gpudoctor: same verdicts on A and B; 0 environment differences\n"
    # A verdict linked to more differences than the default shows: -v lists them all.
    torch = b["environment"]["torch"]  # cuDNN and the SDP settings bear on sdpa-no-kernel too
    torch["cudnn"].update(loaded="9.11.0", version=91100)
    torch["sdp"]["flash_enabled"] = False
    torch["built_with_cuda"] = "12.9"
    (tmp_path / "b.json").write_text(json.dumps(b))
    d = rdiff.diff_reports(a, b)
    links = d.verdicts[0].explained_by
    default = runner.invoke(app, args).stdout
    verbose = runner.invoke(app, [*args, "-v"]).stdout
    assert sum(line.strip().startswith("likely:") for line in default.splitlines()) == min(3, len(links))
    assert sum(line.strip().startswith("likely:") for line in verbose.splitlines()) == len(links)
    assert len(links) > 3 and f"... {len(links) - 3} more (-v shows them)" in default


def test_list_values_show_what_was_added_and_removed():
    a, b = pair()
    b["environment"]["torch"]["arch_list"] = ["sm_80", "sm_90"]
    d = rdiff.diff_reports(a, b)
    arch = next(x for x in d.differences if x.key == "torch.arch_list").to_dict()
    assert arch["added"] == [] and "sm_120" in arch["removed"]


def test_results_pair_by_probe_when_devices_differ():
    a, b = pair()
    for r in b["results"]:
        if r["device"] == "cuda:0":
            r["device"] = "cuda:1"
    d = rdiff.diff_reports(a, b)
    assert [(v.probe, v.device_a, v.device_b) for v in d.verdicts] == [("sdpa-backends", "cuda:0", "cuda:1")]


def test_a_probe_on_one_side_only():
    a, b = pair()
    b["results"].append({"probe": "shape-sync", "title": "Shape sync", "device": "cuda:0", "status": "fail",
                         "summary": "x", "duration_s": 0.1, "details": {}, "findings": [
                             {"kb_id": "misaligned-address", "summary": "m", "evidence": [], "severity": "error"}],
                         "exit_code": None, "signal": None, "stderr_tail": None})
    d = rdiff.diff_reports(a, _recount(b))
    changes = {v.probe: v.change for v in d.verdicts}
    assert changes["shape-sync"] == "only-b"


def test_values_are_printed_as_text(tmp_path):
    a, b = pair()
    b["environment"]["env_vars"]["CUDA_VISIBLE_DEVICES"] = "\x1b]0;pwned\x07[bold]1[/]"
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    for fmt in ("text", "md", "json"):
        out = runner.invoke(app, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--format", fmt]).stdout
        assert "\x1b]" not in out and "\x07" not in out, fmt
        assert "[bold]1[/]" in out, fmt


def test_both_from_stdin_is_refused():
    r = runner.invoke(app, ["diff", "-", "-"])
    assert r.exit_code == 2 and "only one" in r.stderr


@pytest.mark.parametrize("side", ["a", "b"])
def test_diff_redacts_by_default(tmp_path, side):
    a, b = pair()
    target = a if side == "a" else b
    target["environment"]["python"]["executable"] = "/home/alice/venv/bin/python"
    target["environment"]["env_vars"]["HF_TOKEN"] = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = runner.invoke(app, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--format", "json"]).stdout
    assert "hf_AbCdEfGh" not in out and "alice" not in out


# --- the two pairs a new user compares first (issue: diff names the cause first) ------------------
# cpu-healthy.json and cpu-no-torch.json are real scans of one machine: the second with
# `--python` at a virtual environment without torch. The H100 pair is the committed validation
# pair: a full scan and `scan --probe xformers` after a mismatched xformers was installed.


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_a_missing_torch_is_the_cause_and_the_skipped_probes_are_coverage():
    a, b = _load(FIXTURES / "cpu-healthy.json"), _load(FIXTURES / "cpu-no-torch.json")
    d = rdiff.diff_reports(a, b)
    # One changed verdict: torch-import, which passed wherever torch imported.
    assert [(v.probe, v.a, v.b, v.findings_b) for v in d.verdicts] == [
        ("torch-import", "pass", "fail", ["torch-import-failed"])]
    # The missing torch ranks first and explains it; nothing else is linked to it.
    top = d.differences[0]
    assert (top.key, top.a, top.b, top.score) == ("torch", "2.13.0+cpu", "not installed", 4)
    assert d.verdicts[0].explained_by[0]["key"] == "torch"
    assert all(not x.explains for x in d.differences[1:])
    keys = [x.key for x in d.differences]
    assert "package:torch" not in keys  # torch is one difference, not two
    # What only an imported torch reports is not measured on B, not a difference.
    assert not [k for k in keys if k.startswith(("torch.", "cuda_lib", "cudnn"))]
    assert "torch built for CUDA" in d.unmeasured["b"]
    # The probes that passed on A and were skipped on B did not run there: coverage, no cause.
    ran_a = {r["probe"] for r in a["results"] if r["status"] != "skipped"}
    assert {c.probe for c in d.coverage} == ran_a and all(c.ran_on == "a" for c in d.coverage)
    assert all(c.other.startswith("skipped: torch could not be imported") for c in d.coverage)
    line = rdiff.summary_line(d)
    assert line.startswith("1 verdict changed, first torch-import: pass -> fail [torch-import-failed]; "
                           "likely: torch 2.13.0+cpu -> not installed;"), line
    assert f"{len(ran_a)} probes ran on A only" in line


def test_a_full_scan_against_a_one_probe_scan_counts_no_unrun_probe_as_changed():
    a = _load(VALIDATION / "h100-torch2.11.0.json")
    b = _load(VALIDATION / "h100-torch2.11.0-xformers0.0.35.json")
    d = rdiff.diff_reports(a, b)
    assert [(v.probe, v.a, v.b) for v in d.verdicts] == [("xformers", "skipped", "fail")]
    assert d.verdicts[0].explained_by[0]["key"] == "package:xformers"
    ran_a = {r["probe"] for r in a["results"] if r["status"] != "skipped"}
    assert {c.probe for c in d.coverage} == ran_a
    assert {c.other for c in d.coverage} == {"not in the scan"}
    # No invented cause: a coverage difference is linked to nothing.
    assert [x.explains for x in d.differences] == [[{"probe": "xformers", "kb_id": "xformers-build-mismatch",
                                                     "link": "reported"}]]
    assert rdiff.summary_line(d).startswith(
        "1 verdict changed, first xformers on cuda:0: skipped -> fail [xformers-build-mismatch]; "
        "likely: xformers not installed -> 0.0.35; 10 probes ran on A only")


def test_the_first_line_and_quiet_name_the_cause(tmp_path):
    args = ["diff", str(FIXTURES / "cpu-healthy.json"), str(FIXTURES / "cpu-no-torch.json")]
    text = runner.invoke(app, args)
    quiet = runner.invoke(app, [*args, "-q"])
    assert text.exit_code == quiet.exit_code == 1
    first = text.stdout.splitlines()[0]
    assert first == quiet.stdout.strip()
    assert "likely: torch 2.13.0+cpu -> not installed" in first
    assert "coverage, not a changed verdict" in text.stdout
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert data["schema_version"] == rdiff.DIFF_SCHEMA_VERSION and data["summary"] == quiet.stdout.strip()[11:]
    assert data["coverage"] and data["unmeasured"]["b"]
    md = runner.invoke(app, [*args, "--format", "md"]).stdout
    assert "### Ran in one report only" in md and "likely: torch 2.13.0+cpu -&gt; not installed" in md


def test_a_subset_scan_with_the_same_verdicts_exits_0():
    a = _load(VALIDATION / "h100-torch2.11.0.json")
    b = copy.deepcopy(a)
    b["results"] = [r for r in b["results"] if r["probe"] == "sdpa-backends"]
    d = rdiff.diff_reports(a, _recount(b))
    assert d.verdicts == [] and not d.verdicts_changed
    assert rdiff.summary_line(d).startswith("same verdicts on A and B where both ran; ")
