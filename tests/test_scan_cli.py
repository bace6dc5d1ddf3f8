"""`gpudoctor scan` through typer's CliRunner: exit codes, `--json -` purity, output files, and the
one-line usage errors. Fake probes keep it fast."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app

FAKES = pathlib.Path(__file__).parent / "fixtures" / "fake_probes"


def scan(*args: str):
    return CliRunner().invoke(app, ["scan", *args])


def files(*names: str) -> list[str]:
    out = []
    for name in names:
        out += ["--probe-file", str(FAKES / f"{name}.py")]
    return out


def test_json_to_stdout_is_only_json_and_exit_0():
    result = scan(*files("ok"), "--probe", "fake-ok", "--json", "-", "--attn-shape", "2,4,128,64")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # nothing but the report on stdout
    assert data["schema_version"] and data["redacted"] is True
    [res] = data["results"]
    assert res["probe"] == "fake-ok" and res["status"] == "pass"
    # The probe is told what was asked for: no --device means auto (cuda:0 when torch sees one, else
    # cpu), and the probes named with --probe (fp8-matmul checks a GPU without FP8 only when named).
    assert res["details"]["options"] == {"attn_shape": [2, 4, 128, 64], "requested_device": "auto",
                                         "requested_probes": ["fake-ok"], "level": "quick"}
    assert data["invocation"]["options"]["device"] == "auto"
    assert "fake-ok" in result.stderr  # progress went to stderr
    explicit = scan(*files("ok"), "--probe", "fake-ok", "--device", "cpu", "--format", "json", "-q")
    assert explicit.exit_code == 0, explicit.output
    assert json.loads(explicit.stdout)["results"][0]["details"]["options"] == {
        "requested_device": "cpu", "requested_probes": ["fake-ok"], "level": "quick"}


def test_crash_exits_1_and_files_are_written(tmp_path):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    result = scan(*files("ok", "raises"), "--probe", "fake-ok", "--probe", "fake-raise",
                  "--json", str(out_json), "--markdown", str(out_md), "--no-redact")
    assert result.exit_code == 1, result.output
    data = json.loads(out_json.read_text())
    assert data["redacted"] is False
    assert {r["probe"]: r["status"] for r in data["results"]} == {"fake-ok": "pass", "fake-raise": "crashed"}
    assert "fake-raise" in out_md.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]  # no temp file left
    assert "fake-raise" in result.stdout  # the terminal report


def test_a_report_written_to_a_file_still_ends_on_the_verdict(tmp_path):
    """`scan -o report.md` writes nothing on stdout: the verdict and where the report went close
    stderr, so the terminal does not end on the last progress line."""
    out = tmp_path / "report.md"
    result = scan(*files("ok", "raises"), "--probe", "fake-ok", "--probe", "fake-raise", "-o", str(out))
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"gpudoctor: NOT HEALTHY (1 problem); fix first: fake-raise crashed; the report is in {out}")
    assert "fake-raise" in out.read_text()
    quiet = scan(*files("ok"), "--probe", "fake-ok", "-q", "-o", str(tmp_path / "r.json"))
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""  # -q: not a word


def test_unknown_probe_exits_2_with_one_line():
    result = scan(*files("ok"), "--probe", "fake-kk")
    assert result.exit_code == 2
    assert result.stderr.strip() == "gpudoctor: unknown probe 'fake-kk' (did you mean 'fake-ok'?)"
    assert result.stdout == ""


@pytest.mark.parametrize("name, hint", [
    ("sdpa", " (did you mean 'sdpa-backends'?)"),  # part of an id
    ("fp8", " (did you mean 'fp8-matmul'?)"),
    ("nonexistent", "; `gpudoctor scan --list-probes` lists them"),
])
def test_unknown_probe_names_the_id_or_where_they_are_listed(name, hint):
    result = scan("--skip", name)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"gpudoctor: unknown probe {name!r}{hint}"
    assert result.stdout == ""


def test_bad_python_exits_2(tmp_path):
    result = scan("--python", str(tmp_path / "no-python"))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"gpudoctor: --python {tmp_path / 'no-python'}: no such executable"]


def test_usage_errors_exit_2_before_any_scan(tmp_path):
    for args, text in [
        (["--json", str(tmp_path)], "is a directory"),
        (["--attn-shape", "1,2,3"], "four positive integers"),
        (["--timeout", "0"], "must be a positive"),
        (["--probe-file", str(tmp_path / "missing.py")], "no such file"),
        (["--device", "cuda:x"], "--device cuda:x"),
    ]:
        result = scan(*args)
        assert result.exit_code == 2, (args, result.output)
        assert text in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_list_probes_runs_no_scan():
    result = scan("--list-probes", *files("ok", "hang"))
    assert result.exit_code == 0, result.output
    assert "fake-ok" in result.stdout and "Fake hang" in result.stdout


def test_json_through_a_symlink_and_a_fifo(tmp_path):
    import os
    import threading

    # A link to a file is refused before the scan (never written through), and nothing changes.
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real)
    result = scan(*files("ok"), "--probe", "fake-ok", "--json", str(link))
    assert result.exit_code == 2, result.output
    assert "is a symbolic link" in result.stderr and "does not write through links" in result.stderr
    assert link.is_symlink() and real.read_text() == "old" and "fake-ok" not in result.stderr

    # A FIFO (like /dev/stdout or /dev/null) is written through, not replaced by a file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    result = scan(*files("ok"), "--probe", "fake-ok", "--json", str(fifo))
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert fifo.is_fifo() and json.loads(got[0])["results"][0]["status"] == "pass"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch itself judges the device")
def test_a_device_torch_does_not_know_or_lacks_is_a_usage_error():
    for device, text in (("nosuchdevice:0", "RuntimeError: Expected one of"),
                         ("mps", "torch.mps.is_available() is False in this environment")):
        result = scan(*files("torch_ok"), "--device", device, "--json", "-")
        assert result.exit_code == 2, result.output
        # One line says what is wrong (progress lines before it are not errors), and no traceback.
        assert result.stdout == "" and "Traceback" not in result.stderr
        [line] = [line for line in result.stderr.splitlines() if "--device" in line]
        assert line == result.stderr.strip().splitlines()[-1]
        assert line.startswith(f"gpudoctor: --device {device}: ") and text in line


def test_cuda_device_without_usable_cuda_is_a_diagnosis_as_the_readme_says():
    """`scan --device cuda:0` on a machine where torch cannot use CUDA: the `cuda-unavailable`
    finding and exit 1, not a usage error; the table of bad input in docs/scan.md says the same."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is usable here")
    result = scan("--device", "cuda:0", "--probe", "cuda-runtime", "--format", "json")
    assert result.exit_code == 1, result.output
    [res] = json.loads(result.stdout)["results"]
    assert res["status"] == "fail" and [f["kb_id"] for f in res["findings"]] == ["cuda-unavailable"]
    page = (pathlib.Path(__file__).parent.parent / "docs" / "scan.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--device cuda:0`")]
    assert len(rows) == 1 and "exit 1" in rows[0] and "`cuda-unavailable`" in rows[0], rows
