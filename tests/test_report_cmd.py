"""`gpudoctor report FILE.json`: validating a saved report and rendering it again, and every kind of
bad input (one line on stderr, exit code 2, no traceback) for every command that reads reports."""
from __future__ import annotations

import copy
import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.reports import load
from gpudoctor.reports.model import SCHEMA_VERSION

SAMPLE = pathlib.Path(__file__).resolve().parent / "fixtures" / "reports" / "sample.json"
runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def sample() -> dict:
    return json.loads(SAMPLE.read_text())


def healthy() -> dict:
    data = sample()
    data["results"] = [r for r in data["results"] if r["status"] in ("pass", "skipped")]
    data["summary"] = {s: sum(r["status"] == s for r in data["results"])
                       for s in ("pass", "warn", "fail", "skipped", "crashed", "timed_out")}
    return data


def write(tmp_path, data, name="r.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# --- rendering -----------------------------------------------------------------------------------


def test_report_renders_text_md_and_json_with_scans_exit_code(tmp_path):
    text = invoke("report", str(SAMPLE))
    assert text.exit_code == 1  # the sample has failed, crashed and timed-out probes, as scan would say
    assert "xformers-flash-invalid-argument" in text.stdout and "RTX 5090" in text.stdout
    md = invoke("report", str(SAMPLE), "--format", "md")
    # The Markdown report opens with the one-line environment summary, then the heading.
    assert "\n## gpudoctor report\n" in md.stdout[:400] and "| xformers-kernels |" in md.stdout
    js = invoke("report", str(SAMPLE), "--format", "json")
    data = json.loads(js.stdout)
    assert data["schema_version"] == SCHEMA_VERSION and len(data["results"]) == 7
    jsonschema = pytest.importorskip("jsonschema")
    from gpudoctor.reports.render import load_schema

    jsonschema.validate(data, load_schema())
    assert invoke("report", write(tmp_path, healthy())).exit_code == 0


def test_report_quiet_is_the_verdict_line_as_scan_prints_it(tmp_path):
    from gpudoctor.reports import render
    from gpudoctor.reports.model import report_from_dict
    from gpudoctor.reports.redact import redact_report

    r = invoke("report", str(SAMPLE), "-q")
    expected = render.verdict(report_from_dict(load.sanitize(redact_report(sample())))).line
    assert r.exit_code == 1 and r.stdout == f"gpudoctor: {expected}\n" and "NOT HEALTHY" in expected
    healthy_run = invoke("report", write(tmp_path, healthy()), "-q")
    assert healthy_run.exit_code == 0 and healthy_run.stdout == "gpudoctor: healthy\n"


def test_report_writes_to_a_file_and_infers_the_format(tmp_path):
    out = tmp_path / "report.md"
    r = invoke("report", str(SAMPLE), "-o", str(out))
    assert r.exit_code == 1 and r.stdout == ""
    assert "\n## gpudoctor report\n" in out.read_text()[:400]
    text_out = tmp_path / "report.txt"
    invoke("report", str(SAMPLE), "-o", str(text_out))
    assert "\x1b[" not in text_out.read_text() and "Findings" in text_out.read_text()


def test_report_from_stdin():
    r = invoke("report", "-", "--format", "json", input=SAMPLE.read_text())
    assert r.exit_code == 1 and json.loads(r.stdout)["results"][0]["probe"] == "arch-compat"


def test_report_is_redacted_again_unless_asked(tmp_path):
    data = sample()
    data["redacted"] = False
    data["environment"]["python"]["executable"] = "/home/alice/venv/bin/python"
    data["results"][0]["summary"] = "token=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    path = write(tmp_path, data)
    for fmt in ("text", "md", "json"):
        out = invoke("report", path, "--format", fmt).stdout
        assert "alice" not in out and "hf_AbCdEfGh" not in out, fmt
    assert "hf_AbCdEfGh" in invoke("report", path, "--no-redact", "--format", "json").stdout


def test_report_strings_cannot_reach_the_terminal_raw(tmp_path):
    data = sample()
    data["results"][0]["summary"] = "\x1b]52;c;ZXZpbA==\x07 [bold]x[/] \x1b[2J"
    data["results"][4]["stderr_tail"] = "[/]\x1b]0;pwned\x07"
    path = write(tmp_path, data)
    for fmt in ("text", "md"):
        # -v: the text page shows whole summaries and stderr tails (the default page cuts each
        # probe's summary to one line).
        out = invoke("report", path, "--format", fmt, "-v").stdout
        assert "\x1b]" not in out and "\x07" not in out and "\x1b[2J" not in out, fmt
        if fmt == "md":  # Markdown escapes the backslashes and brackets it shows literally
            out = out.replace("\\\\", "\\").replace("\\[", "[").replace("\\]", "]")
        assert "\\x1b]52" in out and "[bold]x[/]" in out, fmt


def test_a_newer_minor_version_is_read_and_its_new_fields_ignored(tmp_path):
    data = sample()
    data["schema_version"] = "1.7"
    data["future_section"] = {"anything": [1, 2]}
    data["results"][0]["future_field"] = "ignored"
    r = invoke("report", write(tmp_path, data), "--format", "json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["schema_version"] == SCHEMA_VERSION and "future_section" not in out
    assert [x["status"] for x in out["results"]] == [x["status"] for x in sample()["results"]]


# --- bad input -----------------------------------------------------------------------------------


def _bad_reports(tmp_path) -> dict[str, tuple[str, str]]:
    """name -> (path, a phrase the one line must contain)."""
    cases: dict[str, tuple[object, str]] = {}
    text = SAMPLE.read_text()
    cases["empty"] = ("", "is empty")
    cases["whitespace"] = ("  \n\t\n", "is empty")
    cases["truncated"] = (text[: len(text) // 2], "truncated")
    cases["not json"] = ("schema_version: 1.0\n", "not valid JSON")
    cases["json list"] = ("[1, 2, 3]", "not a gpudoctor report")
    cases["json string"] = ('"report"', "not a gpudoctor report")
    no_version = sample()
    del no_version["schema_version"]
    cases["no schema_version"] = (no_version, "not a gpudoctor scan report")
    v2 = sample()
    v2["schema_version"] = "2.0"
    cases["major 2"] = (v2, "report schema 2.0")
    vbad = sample()
    vbad["schema_version"] = "one"
    cases["version not M.m"] = (vbad, "not MAJOR.MINOR")
    status = sample()
    status["results"][1]["status"] = "great"
    cases["unknown status"] = (status, "results[1].status")
    types = sample()
    types["results"][2]["findings"][0]["evidence"] = "one string"
    cases["wrong type"] = (types, "results[2].findings[0].evidence")
    results = sample()
    results["results"] = {"probe": "x"}
    cases["results not a list"] = (results, "results")
    cut = sample()
    del cut["results"][3:]
    cases["summary mismatch"] = (cut, "truncated or edited")
    cases["duplicate keys"] = (text.replace('"redacted": true,', '"redacted": true, "redacted": false,', 1), "duplicate key")
    cases["nan"] = (text.replace('"duration_s": 34.43', '"duration_s": NaN', 1), "not a JSON number")
    cases["deep nesting"] = ("[" * 100_000 + "]" * 100_000, "nested too deeply")
    cases["run record"] = ({"schema_version": "1.0", "kind": "gpudoctor-run", "tool": {"name": "gpudoctor"}},
                           "record of a `gpudoctor run`")
    nosummary = sample()
    del nosummary["summary"]
    cases["missing summary"] = (nosummary, "summary: missing")
    negative = sample()
    negative["summary"]["fail"] = -1
    cases["negative count"] = (negative, "summary.fail: not a non-negative integer")
    nover = sample()
    del nover["schema_version"]
    cases["missing version"] = (nover, "no schema_version")
    cases["utf-8 bom and a bad status"] = ("\ufeff" + text.replace('"status": "pass"', '"status": "bogus"', 1),
                                          "must be one of")
    deep = sample()
    node: dict = deep["results"][0]["details"]
    for _ in range(70):
        node["x"] = {}
        node = node["x"]
    cases["nesting a walk would trip on"] = (deep, "nested too deeply")
    out = {}
    for i, (name, (content, phrase)) in enumerate(cases.items()):
        out[name] = (write(tmp_path, content, f"bad{i}.json"), phrase)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    out["binary"] = (str(binary), "binary data")
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{"schema_version": "1.0", "x": "caf\xe9"}')
    out["invalid utf-8"] = (str(latin), "binary data")
    out["missing"] = (str(tmp_path / "nope.json"), "cannot read")
    out["directory"] = (str(tmp_path), "is a directory")
    return out


def test_every_bad_report_is_one_line_and_exit_2_for_report_and_diff(tmp_path):
    for name, (path, phrase) in _bad_reports(tmp_path).items():
        for args in (["report", path], ["diff", str(SAMPLE), path], ["diff", path, str(SAMPLE)]):
            r = invoke(*args)
            assert r.exit_code == 2, (name, args, r.output)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("gpudoctor: "), (name, r.stderr)
            assert phrase in lines[0], (name, lines[0])
            assert path.split("/")[-1] in lines[0] or name in ("missing", "directory"), (name, lines[0])
            assert r.exception is None or isinstance(r.exception, SystemExit), (name, r.exception)


@pytest.mark.parametrize("path, value", [
    (("torch", "devices"), ["cuda:0"]),
    (("torch", "arch_list"), [{"sm": 90}]),
    (("nvml", "gpus", 0, "pcie"), [4, 16]),
    (("nvml", "gpus", 0, "throttle_reasons"), "idle"),
    (("packages", "installed", "diffusers"), "0.35"),
    (("packages", "installed", "nvidia-cuda-runtime-cu12", "duplicates"), [{"v": 1}]),
    (("cuda_libraries", "libraries", "cudart", "loaded", 0), ["path"]),
    (("cuda_libraries", "flags", 0), "duplicate"),
    (("env_vars", "CUDA_VISIBLE_DEVICES"), 0),
    (("system", "container"), True),
])
def test_environment_shapes_the_renderers_read_are_checked(tmp_path, path, value):
    data = sample()
    target = data["environment"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    r = invoke("report", write(tmp_path, data))
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "environment." in r.stderr


def test_structural_checks_name_the_field():
    data = sample()
    load.validate(data, "x")
    data["results"][0]["exit_code"] = "zero"
    with pytest.raises(load.ReportError, match=r"results\[0\].exit_code"):
        load.validate(data, "x")
    data = sample()
    data["results"][0]["findings"] = [{"kb_id": "Not Kebab", "summary": "", "evidence": [], "severity": "error"}]
    with pytest.raises(load.ReportError, match="kb_id"):
        load.validate(data, "x")


def test_too_large_and_silent_pipes_are_bounded(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("x" * 100)
    with pytest.raises(load.ReportError, match="too large"):
        load.read_bytes(str(big), limit=10)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # No writer ever opens it: gpudoctor neither blocks on open nor waits past its deadline.
    with pytest.raises(load.ReportError, match="nothing more arrived"):
        load.read_bytes(str(fifo), timeout=0.5)
    r, w = os.pipe()
    os.write(w, b"{")  # a writer that never finishes
    with pytest.raises(load.ReportError, match="nothing more arrived"):
        load.read_bytes(f"/dev/fd/{r}", timeout=0.5)
    os.close(r)
    os.close(w)


def _slow_writer(fd: int, pieces: list[bytes], gap_s: float, first_s: float = 0.0):
    """A thread that writes `pieces` to the pipe `fd`, `gap_s` apart after `first_s`, then closes it."""
    import threading
    import time

    def write():
        time.sleep(first_s)
        for piece in pieces:
            os.write(fd, piece)
            time.sleep(gap_s)
        os.close(fd)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_standard_input_waits_for_its_writer(monkeypatch):
    # `gpudoctor scan --format json | gpudoctor report -`: the scan prints nothing until it ends,
    # however long that takes; standard input is the user's own pipeline, read to its end.
    r, w = os.pipe()

    class Stdin:
        def fileno(self):
            return r

    monkeypatch.setattr(sys, "stdin", Stdin())
    thread = _slow_writer(w, [SAMPLE.read_bytes()], 0.0, first_s=1.0)
    try:
        assert json.loads(load.read_bytes("-", timeout=0.3)) == sample()
    finally:
        thread.join()
        os.close(r)


def test_a_pipe_that_keeps_writing_is_read_past_the_idle_deadline(tmp_path):
    # The deadline counts silence, not the whole read: 20 pieces 0.15 s apart (3 s in all) pass a
    # 1.5 s deadline.
    raw = SAMPLE.read_bytes()
    step = len(raw) // 19 + 1
    r, w = os.pipe()
    thread = _slow_writer(w, [raw[i:i + step] for i in range(0, len(raw), step)], 0.15)
    try:
        assert load.read_bytes(f"/dev/fd/{r}", timeout=1.5) == raw
    finally:
        thread.join()
        os.close(r)


def test_report_reads_a_pipe_from_process_substitution(tmp_path):
    command = f"{shlex.quote(sys.executable)} -m gpudoctor report --format json <(cat {shlex.quote(str(SAMPLE))})"
    done = subprocess.run(["bash", "-c", command],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and json.loads(done.stdout)["created"] == sample()["created"]


def test_output_paths_are_checked_before_reading(tmp_path):
    link = tmp_path / "link.md"
    target = tmp_path / "target.md"
    target.write_text("mine")
    link.symlink_to(target)
    for args, phrase in ((["-o", str(link)], "symbolic link"), (["-o", str(tmp_path)], "is a directory"),
                         (["-o", str(tmp_path / "no" / "x.md")], "no such directory"),
                         (["--format", "yaml"], "--format yaml")):
        r = invoke("report", str(SAMPLE), *args)
        assert r.exit_code == 2 and phrase in r.stderr, (args, r.stderr)
    assert target.read_text() == "mine"


def test_write_failure_is_one_line(tmp_path, monkeypatch):
    if os.path.exists("/dev/full"):  # refused before the report is read, as by every command
        r = invoke("report", str(SAMPLE), "-o", "/dev/full")
        assert r.exit_code == 2 and r.stderr == "gpudoctor: -o /dev/full: is /dev/full, where every write fails\n"
    out = tmp_path / "r.md"
    out.write_text("old")

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    r = invoke("report", str(SAMPLE), "-o", str(out))
    assert r.exit_code == 2
    assert r.stderr == f"gpudoctor: cannot write {out}: No space left on device; the old file, if any, is unchanged\n"
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["r.md"]


VALIDATION = sorted((pathlib.Path(__file__).parents[1] / "docs" / "validation").glob("*.json"))


@pytest.mark.parametrize("path", VALIDATION, ids=[p.name for p in VALIDATION])
def test_committed_gpu_reports_read_back(path):
    # The real H100 reports in docs/validation are read as any user's report is: validated,
    # re-rendered, and judged by the same exit code as the scan that made them.
    data = json.loads(path.read_text())
    result = CliRunner().invoke(app, ["report", str(path), "--format", "text"])
    assert result.exit_code in (0, 1), result.output
    problems = any(r["status"] in ("fail", "crashed", "timed_out") for r in data["results"])
    assert result.exit_code == (1 if problems else 0), result.output
    assert "NVIDIA H100" in result.output or "H100" in json.dumps(data["environment"])
