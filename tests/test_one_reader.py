"""One reader of reports, one strictness (issue 32): `merge` and the fleet's readers refuse every
file `report` refuses, for the same reason and in one line; a closed standard input is one line;
and no JSON that gpudoctor prints or writes carries a raw C1 control or a bidi override from the
untrusted text it quotes."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import fleet_synth as fs
from gpudoctor.cli import app
from gpudoctor.fleet.merge import MergeOptions, merge_files
from gpudoctor.reports import load
from run_helpers import GPUDOCTOR, gpudoctor
from test_report_cmd import SAMPLE, _bad_reports, sample

runner = CliRunner()
HOSTILE = "csi \x9b31m c1 \x85 bidi \u202eevil\u202c isolate \u2066x\u2069 del \x7f zero-width \u200b"
RAW = ("\x9b", "\x85", "\u202e", "\u202c", "\u2066", "\u2069", "\x7f", "\u200b")


def _reason(line: str, prefix: str) -> str:
    assert line.startswith(prefix), line
    return line[len(prefix):]


def test_merge_refuses_every_file_report_refuses_for_the_same_reason(tmp_path):
    for name, (path, phrase) in _bad_reports(tmp_path).items():
        if name in ("missing", "directory"):
            continue  # not a file: merge says so before reading (no such file; a folder of *.json)
        report = runner.invoke(app, ["report", path])
        merged = runner.invoke(app, ["merge", path, "--format", "json", "-o", os.devnull])
        assert report.exit_code == merged.exit_code == 2, (name, report.output, merged.output)
        [line] = merged.stderr.strip().splitlines()
        [expected] = report.stderr.strip().splitlines()
        assert _reason(line, "gpudoctor: nothing to merge: ") == _reason(expected, "gpudoctor: "), name
        assert phrase in line, (name, line)


def test_a_refused_report_beside_good_ones_is_named_and_the_fleet_is_not_healthy(tmp_path):
    good = fs.write(tmp_path, [fs.node_report(0, nodes=2), fs.node_report(1, nodes=2)])
    cases = {"v2": {"schema_version": "2.0"}, "bogus": "bogus-status", "nan": "nan", "negative": "negative",
             "nosummary": "nosummary", "noversion": "noversion"}
    bad = []
    for name, change in cases.items():
        report = fs.node_report(1, nodes=2)
        text = None
        if isinstance(change, dict):
            report.update(change)
        elif change == "bogus-status":
            report["results"][0]["status"] = "bogus"
        elif change == "nan":
            text = json.dumps(report, indent=2).replace('"duration_s": ', '"duration_s": NaN, "x": ', 1)
        elif change == "negative":
            report["summary"]["pass"] = -3
        elif change == "nosummary":
            del report["summary"]
        elif change == "noversion":
            del report["schema_version"]
        path = tmp_path / f"{name}.json"
        path.write_text(text or json.dumps(report, indent=2))
        bad.append(str(path))
    data = merge_files(good + bad)
    unreadable = [f for f in data["findings"] if f["kind"] == "unreadable-report"]
    assert data["inputs"] == {"reports": 2, "unreadable": len(cases)} and len(unreadable) == len(cases)
    assert data["verdict"] != "healthy" and any(f["severity"] == "error" for f in unreadable)


def test_a_utf8_bom_is_read_by_every_reader(tmp_path):
    report = fs.node_report(0, nodes=1)
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(report, indent=2).encode())
    assert runner.invoke(app, ["report", str(path), "-q"]).exit_code in (0, 1)
    data = merge_files([str(path)])
    assert data["inputs"] == {"reports": 1, "unreadable": 0}
    assert load.load_documents(str(path))[0].data is not None


def test_deep_nesting_is_one_line_for_every_reader(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"results": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for args in (["report", str(deep)], ["merge", str(deep)], ["diff", str(SAMPLE), str(deep)]):
        done = subprocess.run([*GPUDOCTOR, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, (args, done.stderr)
        assert "nested too deeply" in done.stderr


def test_the_fleets_own_readers_refuse_what_report_refuses():
    from gpudoctor.fleet.distributed import build_fleet
    from gpudoctor.fleet.rayscan import fleet_from_ray
    from test_fleet_distributed import plan_for, record

    ctx, options, plan = plan_for()
    records = {r: record(r, plan) for r in range(4)}
    records[2]["report"]["results"][0]["status"] = "bogus"
    data = build_fleet(records, {}, ctx, options, MergeOptions(), plan)
    [failed] = [f for f in data["findings"] if f["kind"] == "scan-failed"]
    assert "results[0].status: must be one of" in failed["summary"]

    good, bad = fs.node_report(0, nodes=2), fs.node_report(1, nodes=2)
    bad["schema_version"] = "2.0"
    nodes = [{"node_id": "a", "hostname": "gpu000"}, {"node_id": "b", "hostname": "gpu001"}]
    data = fleet_from_ray([{"node_id": "a", "report": good}, {"node_id": "b", "report": bad}], nodes, "j1", MergeOptions())
    [failed] = [f for f in data["findings"] if f["kind"] == "scan-failed"]
    assert "report schema 2.0" in failed["summary"]


def test_a_rank_record_nested_too_deeply_is_a_scan_error_not_a_traceback():
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(load.ReportError, match="nested too deeply"):
        load.parse_json(text.encode(), "rank 3's record")


@pytest.mark.parametrize("args", [["explain", "-"], ["merge", "-"], ["report", "-"], ["diff", "-", str(SAMPLE)]])
def test_a_closed_standard_input_is_one_line(args):
    done = subprocess.run(["bash", "-c", 'exec "$@" <&-', "bash", *GPUDOCTOR, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "standard input is closed" in done.stderr


# --- controls and bidi characters in every JSON output --------------------------------------------------


def _assert_escaped(text: str, where: str) -> None:
    raw = [c for c in RAW if c in text]
    assert not raw, f"{where} carries raw {[hex(ord(c)) for c in raw]}"
    assert "\\u009b" in text and "\\u202e" in text, where


def test_json_outputs_escape_c1_and_bidi(tmp_path):
    data = sample()
    data["results"][0]["summary"] = HOSTILE
    data["results"][0]["status"] = "fail"
    data["summary"] = {s: sum(r["status"] == s for r in data["results"]) for s in load.STATUSES}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    out = runner.invoke(app, ["report", str(path), "--format", "json", "--no-redact"])
    _assert_escaped(out.stdout, "report --format json")
    assert json.loads(out.stdout)["results"][0]["summary"] == HOSTILE  # the same string, escaped

    reports = [fs.node_report(i, nodes=2) for i in range(2)]
    reports[1]["results"][0].update(status="fail", summary=HOSTILE)
    fs.recount(reports[1])
    paths = fs.write(tmp_path, reports)
    merged = runner.invoke(app, ["merge", *paths, "--format", "json"])
    _assert_escaped(merged.stdout, "merge --format json")

    other = sample()
    other["results"][0]["summary"] = "plain"
    other_path = tmp_path / "other.json"
    other_path.write_text(json.dumps(other))
    diffed = runner.invoke(app, ["diff", str(other_path), str(path), "--format", "json", "--no-redact"])
    assert not [c for c in RAW if c in diffed.stdout], "diff --format json"


def test_run_json_and_bundle_files_escape_c1_and_bidi(tmp_path):
    program = tmp_path / "hostile.py"
    program.write_text(f"print({HOSTILE!r})\nraise SystemExit(3)\n")
    bundle = tmp_path / "b"
    done = gpudoctor("run", "--bundle", str(bundle), "--no-scan", "-o", str(tmp_path / "run.json"), "--",
                     sys.executable, str(program))
    assert done.returncode == 3, done.stderr
    for name in ("run.json",):
        text = (bundle / name).read_text(encoding="utf-8")
        assert not [c for c in RAW if c in text], f"bundle {name}"
    text = (tmp_path / "run.json").read_text(encoding="utf-8")
    assert not [c for c in RAW if c in text], "run -o run.json"
    assert not [c for c in RAW if c in pathlib.Path(bundle / "ticket.md").read_text(encoding="utf-8")]


def test_the_fast_reading_of_a_laid_out_report_is_as_strict_as_the_slow_one(tmp_path):
    """merge reads a report as gpudoctor writes it (indent 2) with the plain decoder and counts the
    keys instead of checking each object for duplicates: a duplicate is still refused, a string
    that quotes JSON is not taken for one, and nesting is measured all the same."""
    def pretty(report):
        return json.dumps(report, indent=2)

    def merged_error(text, name):
        path = tmp_path / name
        path.write_text(text)
        [doc] = load.load_documents(str(path))
        whole = load.parse_documents(text, str(path), skim=False)[0]
        assert (doc.error is None) == (whole.error is None), (doc.error, whole.error)
        return doc.error

    report = fs.node_report(0, nodes=1)
    assert load.skim_bytes(pretty(report).encode()) is not None  # the fast path is the one tested
    assert merged_error(pretty(report), "good.json") is None

    quoting = fs.node_report(0, nodes=1)
    quoting["results"][0]["summary"] = 'the config said {"key": "value", "other\\\\": 1}'
    quoting["environment"]["torch"]["note"] = '\\": odd'
    assert merged_error(pretty(quoting), "quoting.json") is None

    text = pretty(report).replace('"driver_version": ', '"driver_version": "1.0", "driver_version": ', 1)
    assert "duplicate key 'driver_version'" in merged_error(text, "dup.json")

    deep = fs.node_report(0, nodes=1)
    node = deep["environment"]["torch"]
    for _ in range(70):
        node["x"] = {}
        node = node["x"]
    assert "nested too deeply" in merged_error(pretty(deep), "deep.json")
