"""The ticket bundle of `gpudoctor run --bundle DIR`: its Markdown (golden), its size limit, its
redaction, and how it is written (never over anything the user had, atomically per file)."""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import sys

import pytest

from gpudoctor.ticket import pytrace
from gpudoctor.ticket import bundle as ticket
from gpudoctor.ticket import render as ticket_render
from gpudoctor.knowledge.kb import parse_entry
from gpudoctor.explain.matcher import Match
from gpudoctor.reports.model import report_from_dict
from gpudoctor.reports.redact import Redactor
from gpudoctor.ticket.runcmd import Record, RunResult
from run_helpers import gpudoctor, needs_torch, script

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
GOLDEN = FIXTURES / "tickets" / "ticket.md"

OUTPUT = """\
epoch 1: loading /home/alice/data with token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123
step 10\r step 20\r step 30
step done
Traceback (most recent call last):
  File "/home/alice/proj/train.py", line 44, in <module>
    main()
  File "/home/alice/proj/train.py", line 38, in main
    print(loss.item())
RuntimeError: CUDA error: misaligned address
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
"""

ENTRY = {
    "id": "misaligned-address",
    "title": "CUDA error: misaligned address",
    "cause": "A kernel used a vector access on an address not aligned to its width.",
    "quick_fix": "Call .contiguous() before the kernel and re-run with CUDA_LAUNCH_BLOCKING=1.",
    "applicability": "unsafe",
    "fix_safety": "A copy costs memory and time.",
    "probes": ["shape-sync", "contiguity"],
    "what": "A kernel read or wrote memory at an address its vector loads do not allow.",
    "why": ["A non-contiguous view reached a vectorised kernel."],
    "fix": ["Re-run with CUDA_LAUNCH_BLOCKING=1.", "Make the input contiguous: x = x.contiguous()."],
    "patch": "-y = kernel(x)\n+y = kernel(x.contiguous())",
    "patch_lang": "diff",
    "references": [{"title": "CUDA C Programming Guide: alignment", "url": "https://docs.nvidia.com/cuda/"}],
    # Provenance for maintainers: a field that is never printed, in the ticket or anywhere else.
    "origin": "an unpublished note, 000_secret.txt",
    "patterns": [{"name": "msg", "regex": "misaligned address", "keyword": "misaligned", "weight": 0.9}],
    "examples": [],
}
TRAILER = dict(ENTRY, id="async-error-reporting", title="CUDA errors are reported asynchronously", generic=True,
               probes=["async-errors"])


def _result(output: str = OUTPUT, argv=("python", "train.py", "--token", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123")) -> RunResult:
    rec = Record(1 << 16, 1 << 20)
    rec.add(output.encode())
    err = Record(0, 1 << 18)
    err.add(output.encode())
    return RunResult(argv=tuple(argv), returncode=1, signal=None, duration_s=12.25, output=rec,
                     stdout=Record(0, 1 << 18), stderr=err, tty={"stdout": False, "stderr": False})


def _diagnosis(output: str = OUTPUT) -> ticket.Diagnosis:
    entry, trailer = parse_entry(ENTRY, "test"), parse_entry(TRAILER, "test")
    # Lines of OUTPUT, as the matcher numbers them (test_match_lines_are_lines_of_output_log checks that).
    matches = (
        Match(entry, 0.95, ("RuntimeError: CUDA error: misaligned address",), lines=(9,), first_line=9),
        Match(trailer, 0.25, ("CUDA kernel errors might be asynchronously reported at some other API call",),
              context_only=True, lines=(10,), first_line=10),
    )
    return ticket.Diagnosis(matches, pytrace.failing_traceback(pytrace.parse_tracebacks(output)))


def _localization(first: ticket.Diagnosis) -> ticket.Localization:
    real = pytrace.Frame("/home/alice/proj/model.py", 17, "fused_scale", "return ops.scaled_mm(x, s)")
    call = pytrace.Frame("/opt/venv/lib/python3.11/site-packages/torch/_ops.py", 1243, "__call__", "")
    return ticket.Localization("moved", dict(ticket.LOCALIZE_ENV), first.frame, real=real,
                               operator="aten::_scaled_mm", call=call,
                               exception="RuntimeError: CUDA error: misaligned address")


def _ticket(output: str = OUTPUT, **kw):
    diagnosis = _diagnosis(output)
    scan = report_from_dict(json.loads((FIXTURES / "reports" / "sample.json").read_text()))
    return ticket.build_ticket(
        _result(output), diagnosis, localization=_localization(diagnosis), scan=scan,
        probes=("shape-sync", "contiguity"), redactor=Redactor(home="/home/alice", user="alice", host="gpubox"),
        created="2026-11-22T10:00:00+00:00", tool_version="0.1.0", cwd="/home/alice/proj", **kw,
    )


def test_golden_ticket_markdown():
    text = ticket_render.render_markdown(_ticket())
    if os.environ.get("GPUDOCTOR_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_ticket_says_what_a_maintainer_needs_and_nothing_private():
    text = ticket_render.render_markdown(_ticket())
    assert len(text) < 65_536
    assert "misaligned-address" in text and "CUDA_LAUNCH_BLOCKING=1" in text
    assert "model.py:17" in text and "train.py:38" in text and "aten::_scaled_mm" in text
    assert "+y = kernel(x.contiguous())" in text  # the patch, whole
    assert "step 30" in text and "step 10" not in text  # progress bars keep their last state
    for private in ("alice", "gpubox", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "000_secret", "unpublished"):
        assert private not in text, private


def test_ticket_says_where_in_the_log_each_match_was_found():
    text = ticket_render.render_markdown(_ticket())
    assert ("**Where**: `misaligned-address` found on line 9 of output.log; the traceback blames "
            "`~/proj/train.py:38` in `main`: `print(loss.item())`") in text
    assert "| `async-error-reporting` | 25% (context) | 10 |" in text
    assert "Output (lines 1-11 of output.log, redacted)" in text
    record = _ticket()
    assert record["diagnosis"]["lines_in"] == "output.log"
    assert [m["line"] for m in record["diagnosis"]["matches"]] == [9, 10]


def test_match_lines_are_lines_of_output_log(tmp_path):
    """The numbers the ticket prints point at the right lines of the bundle's output.log, also when
    the output lost bytes in the middle and redraws lines with carriage returns."""
    flood = "".join(f"progress {i}\r" for i in range(50)) + "\n" + "noise\n" * 200_000
    result = _result(OUTPUT.replace("step done\n", flood))
    assert result.output.omitted  # the record kept a head and a tail
    diagnosis = ticket.diagnose(ticket.output_text(result))
    record = ticket.build_ticket(result, diagnosis, redactor=Redactor(home="/home/alice", user="alice", host="gpubox"))
    folder, _, _ = ticket.write_bundle(str(tmp_path / "b"), record)
    log = (pathlib.Path(folder) / "output.log").read_text().split("\n")
    for m in record["diagnosis"]["matches"]:
        for text, line in zip(m["evidence"], m["evidence_lines"]):
            assert text in log[line - 1], (m["id"], line)
    assert record["diagnosis"]["matches"][0]["id"] == "misaligned-address"


def test_huge_output_is_cut_to_fit_under_the_limit():
    flood = "".join(f"line {i} " + "x" * 300 + "\n" for i in range(5000))
    text = ticket_render.render_markdown(_ticket(OUTPUT.replace("step done\n", flood)))
    assert len(text) < ticket.MAX_TICKET_CHARS
    assert text.rstrip().endswith("</sub>")  # the footer survives
    assert "line 4999" in text  # the end of the output is what is kept
    small = ticket_render.render_markdown(_ticket(), limit=3000)
    assert len(small) < 3000 and small.rstrip().endswith("</sub>")


def test_output_cannot_break_out_of_its_markdown():
    hostile = OUTPUT.replace("step done", "```\n</details>\n<img src=x onerror=alert(1)> | a | b |\n\x1b]52;c;ZXZpbA==\x07")
    text = ticket_render.render_markdown(_ticket(hostile))
    tail = text.split("<details><summary>Output")[1]
    fence = tail.split("\n")[2]
    assert fence.startswith("````")  # longer than any backtick run inside
    assert tail.count("</details>") == 2  # the one in the output stays inside the fence
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]52" in text


def test_scan_probes_come_from_the_explanation():
    d = _diagnosis()
    assert ticket.scan_probes(d, known=["shape-sync", "contiguity", "async-errors", "cuda-runtime"]) == (
        "shape-sync", "contiguity", "async-errors")
    assert ticket.scan_probes(ticket.Diagnosis((), None), known=["cuda-runtime"]) == ("cuda-runtime",)
    assert set(ticket.scan_probes(ticket.diagnose("RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half\n"))) \
        <= set(ticket.known_probe_ids())


def test_guess_python(tmp_path):
    assert ticket.guess_python([sys.executable, "x.py"]) == sys.executable
    launcher = tmp_path / "torchrun"
    launcher.write_text("#!/opt/conda/bin/python3.11\nimport sys\n")
    launcher.chmod(0o755)
    assert ticket.guess_python([str(launcher)]) == "/opt/conda/bin/python3.11"
    # pip's launcher where the interpreter's path has a space or is longer than a `#!` line holds
    # (a venv under "/tmp/ci run/..."): /bin/sh runs the quoted interpreter.
    for interpreter in (sys.executable, "/opt/my envs/py311/bin/python3.11"):
        sh_launcher = tmp_path / "accelerate-sh"
        sh_launcher.write_text("#!/bin/sh\n'''exec' " + shlex.quote(interpreter) + ' "$0" "$@"\n' + "' '''\nimport sys\n")
        sh_launcher.chmod(0o755)
        assert ticket.guess_python([str(sh_launcher)]) == interpreter
    env_launcher = tmp_path / "accelerate"
    env_launcher.write_text("#!/usr/bin/env python3\n")
    env_launcher.chmod(0o755)
    assert ticket.guess_python([str(env_launcher)], {"PATH": os.path.dirname(sys.executable)}) is not None
    assert ticket.guess_python(["/bin/sh", "-c", "true"]) is None
    assert ticket.guess_python(["no-such-thing-xyz"]) is None


# --- writing the bundle --------------------------------------------------------------------------


def test_bundle_goes_into_a_missing_or_empty_folder(tmp_path):
    record = _ticket()
    folder, sub, files = ticket.write_bundle(str(tmp_path / "new" / "bundle"), record)
    assert not sub and folder == str(tmp_path / "new" / "bundle")
    assert sorted(os.listdir(folder)) == sorted(ticket.BUNDLE_FILES) == sorted(files)
    run = json.loads((tmp_path / "new" / "bundle" / "run.json").read_text())
    assert run["scan"]["report_file"] == "scan.json" and "report" not in run["scan"]
    assert run["output"]["log_file"] == "output.log" and "log" not in run["output"]
    (tmp_path / "empty").mkdir()
    folder, sub, _ = ticket.write_bundle(str(tmp_path / "empty"), record)
    assert not sub and folder == str(tmp_path / "empty")


def test_bundle_never_overwrites_what_the_user_had(tmp_path):
    mine = tmp_path / "tickets"
    mine.mkdir()
    (mine / "ticket.md").write_text("my notes")
    record = _ticket()
    import datetime as dt

    when = dt.datetime(2026, 11, 22, 10, 0, 0)
    first, sub, _ = ticket.write_bundle(str(mine), record, now=when)
    second, sub2, _ = ticket.write_bundle(str(mine), record, now=when)
    assert sub and sub2 and first != second
    assert os.path.basename(first) == "gpudoctor-run-20261122-100000"
    assert os.path.basename(second) == "gpudoctor-run-20261122-100000-2"
    assert (mine / "ticket.md").read_text() == "my notes"
    assert not [n for n in os.listdir(first) if n.startswith(".")]  # no temporary file left


def test_write_new_file_refuses_an_existing_name(tmp_path):
    (tmp_path / "run.json").write_text("keep")
    with pytest.raises(ticket.BundleError, match="already exists"):
        ticket.write_new_file(str(tmp_path), "run.json", "new")
    assert (tmp_path / "run.json").read_text() == "keep"
    assert os.listdir(tmp_path) == ["run.json"]


def test_bundle_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ticket.BundleError, match="not a directory"):
        ticket.check_bundle_dir(str(tmp_path / "f"))
    with pytest.raises(ticket.BundleError):
        ticket.check_bundle_dir("")


# --- end to end ----------------------------------------------------------------------------------


@needs_torch
def test_cli_bundle_from_a_real_torch_failure(tmp_path):
    bundle = tmp_path / "bundle"
    done = gpudoctor("run", "--bundle", str(bundle), "--", sys.executable, script("dtype_mismatch.py"))
    assert done.returncode == 1
    assert b"ticket bundle written to" in done.stderr
    assert sorted(os.listdir(bundle)) == sorted(ticket.BUNDLE_FILES)
    md = (bundle / "ticket.md").read_text()
    assert len(md) < 65_536 and "`dtype-mismatch`" in md and "dtype_mismatch.py:7" in md
    scan = json.loads((bundle / "scan.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    from gpudoctor.reports.render import load_schema

    jsonschema.validate(scan, load_schema())
    assert scan["redacted"] is True
    # Only the probes the explanation points at ran (dtype-mismatch: device-conformance, matmul-sanity).
    from gpudoctor.knowledge.kb import load_entry

    assert {r["probe"] for r in scan["results"]} == set(load_entry("dtype-mismatch").probes)
    run = json.loads((bundle / "run.json").read_text())
    assert run["command"]["argv"][-1].endswith("dtype_mismatch.py")
    assert "mat1 and mat2 must have the same dtype" in (bundle / "output.log").read_text()


def test_the_fix_for_this_machine_comes_from_the_scan():
    """One source for a finding's steps: the scan's finding for the diagnosed id (the probe knows
    which cause it is) replaces the entry's generic list and patch in every part of the ticket."""
    from rich.console import Console

    record = _ticket()
    assert "steps" not in record["diagnosis"]  # the sample scan has no misaligned-address finding
    steps = ["x is a view of stride (1, 64): call x.contiguous() before ops.scaled_mm in model.py"]
    scan = {"results": [
        {"probe": "contiguity", "findings": [{"kb_id": "view-stride", "steps": ["not this one"]}]},
        {"probe": "shape-sync", "findings": [{"kb_id": "misaligned-address", "summary": "s", "steps": steps}]},
    ]}
    assert ticket.machine_steps(record["diagnosis"], scan) == steps
    assert ticket.machine_steps(record["diagnosis"], {"results": [{"findings": [{"kb_id": "misaligned-address"}]}]}) == []
    ticket.attach_scan(record, report_from_dict(_with_steps(steps)), ("shape-sync",), None)
    assert record["diagnosis"]["steps"] == steps
    md = ticket_render.render_markdown(record)
    assert "#### Fix for this machine (from the scan)\n\n1. x is a view of stride (1, 64)" in md
    assert "Re-run with CUDA_LAUNCH_BLOCKING=1." not in md and "+y = kernel(x.contiguous())" not in md
    assert "Every cause and fix: `gpudoctor explain misaligned-address`" in md
    console = Console(file=__import__("io").StringIO(), width=200, color_system=None)
    ticket_render.render_text(record, console, verbose=True)
    text = console.file.getvalue()
    assert "Fix for this machine (from the scan):" in text and "1. x is a view of stride (1, 64)" in text
    assert "Re-run with CUDA_LAUNCH_BLOCKING=1." not in text and "+y = kernel" not in text


def _with_steps(steps: list[str]) -> dict:
    data = json.loads((FIXTURES / "reports" / "sample.json").read_text())
    data["results"][0]["findings"] = [{"kb_id": "misaligned-address", "summary": "s", "evidence": [],
                                       "severity": "error", "steps": steps}]
    data["results"][0]["status"] = "fail"
    return data


@needs_torch
def test_cli_bundle_gives_the_scans_pinned_torch_for_a_cpu_only_build(tmp_path):
    """`run --bundle` on a CPU-only torch: the fix it prints, ticket.md and run.json say what the
    scan says, the CUDA build of this very torch version, never an unpinned `pip install torch`."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build; the CPU-only case needs the CPU build")
    bundle = tmp_path / "bundle"
    done = gpudoctor("run", "--bundle", str(bundle), "--", sys.executable, script("needs_cuda.py"))
    assert done.returncode == 1
    pinned = f"pip install torch=={torch.__version__.split('+')[0]} --index-url"
    stderr = done.stderr.decode()
    assert "Fix for this machine (from the scan):" in stderr and pinned in stderr
    md = (bundle / "ticket.md").read_text()
    run = json.loads((bundle / "run.json").read_text())
    # The scan's steps: with no NVIDIA driver loaded the driver comes first, then the pinned build.
    assert run["schema_version"] == ticket.RUN_SCHEMA_VERSION and any(pinned in s for s in run["diagnosis"]["steps"])
    scan_steps = [f["steps"] for r in json.loads((bundle / "scan.json").read_text())["results"]
                  for f in r.get("findings") or [] if f["kb_id"] == "cuda-unavailable"]
    assert scan_steps and run["diagnosis"]["steps"] == scan_steps[0]
    for text in (stderr, md):
        assert "pip install torch --index-url" not in text


def test_cli_bundle_secrets_stay_out_and_no_bundle_on_success(tmp_path):
    bundle = tmp_path / "b"
    done = gpudoctor("run", "--bundle", str(bundle), "--no-scan", "--", sys.executable, script("prints_secrets.py"))
    assert done.returncode == 3
    for name in os.listdir(bundle):
        text = (bundle / name).read_text()
        for secret in ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "AKIAABCDEFGHIJKLMNOP", "s3cretpw"):
            assert secret not in text, (name, secret)
    assert "scan.json" not in os.listdir(bundle)
    ok = gpudoctor("run", "--bundle", str(tmp_path / "ok"), "--", sys.executable, script("succeed.py"))
    assert ok.returncode == 0 and not (tmp_path / "ok").exists()
    assert b"no bundle written" in ok.stderr


def test_bundle_files_share_one_set_of_placeholders(tmp_path, monkeypatch):
    # A host in the command's output and another in the bundle's scan: one Redactor redacts the
    # whole bundle, so they get two placeholders (redacted apart, both would be <host-1>).
    import re
    import subprocess

    from gpudoctor.ticket import runcmd
    from gpudoctor.scan import runner
    from gpudoctor.ticket import command as ticket_cli
    from gpudoctor.probes.base import Status
    from gpudoctor.reports.model import ProbeResult, Report
    from gpudoctor.reports.redact import redact

    def scan(options, progress=None):  # runner.run_scan's contract, with a result that names a host
        report = Report(results=[ProbeResult("cuda-runtime", "CUDA", Status.FAIL, "rendezvous at gpu-b3.internal:29500",
                                             0.1, "cpu")], environment={}, redacted=False)
        return redact(report) if options.redact else report

    monkeypatch.setattr(runner, "run_scan", scan)
    failing = "print('connect to gpu-a7.internal:29500 failed'); raise SystemExit(3)"
    result = runcmd.run_command([sys.executable, "-c", failing], stdin=subprocess.DEVNULL)
    ticket_cli._after_run(result, localize=False, bundle=str(tmp_path / "b"), no_scan=False, python=None, out=None,
                          quiet=True, verbose=False, redact=True, interrupted=lambda n: None)
    files = {name: (tmp_path / "b" / name).read_text() for name in ticket.BUNDLE_FILES}
    assert not any("gpu-a7" in text or "gpu-b3" in text for text in files.values())
    [in_output] = set(re.findall(r"<host-\d+>", files["output.log"]))
    [in_scan] = set(re.findall(r"<host-\d+>", files["scan.json"]))
    assert in_output != in_scan
