"""The whole product on this machine: `gpudoctor scan` with every built-in probe, in a real
worker of this interpreter, its JSON validated against the shipped schema and its findings tied
to the knowledge base."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from jsonschema import Draft202012Validator

from gpudoctor import probes
from gpudoctor.knowledge import kb
from gpudoctor.reports.render import load_schema

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("scan")
    json_path, md_path = out / "report.json", out / "report.md"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "scan", "--device", "auto", "--json", str(json_path),
         "--markdown", str(md_path)],
        capture_output=True, text=True, timeout=300,
    )
    return proc, json.loads(json_path.read_text()), md_path.read_text()


def test_exit_code_follows_the_findings(scan):
    proc, report, _ = scan
    problems = [r for r in report["results"] if r["status"] in ("fail", "crashed", "timed_out")]
    assert proc.returncode == (1 if problems else 0), proc.stderr[-2000:]
    runtime = next(r for r in report["results"] if r["probe"] == "cuda-runtime")
    if not torch.cuda.is_available():
        # auto fell back to the CPU: cuda-runtime says why, the rest really ran on the CPU.
        assert [f["kb_id"] for f in runtime["findings"]] == ["cuda-unavailable"]
        assert runtime["details"]["requested_device"] == "auto"
        assert report["environment"]["scan"]["devices"] == ["cpu"]


def test_report_validates_against_the_schema(scan):
    _, report, _ = scan
    Draft202012Validator(load_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER).validate(report)


def test_every_builtin_probe_reported_and_cpu_workloads_really_ran(scan):
    _, report, _ = scan
    ids = [m.SPEC.id for m in probes.load_builtin()]
    assert [r["probe"] for r in report["results"]] == ids
    by_id = {r["probe"]: r for r in report["results"]}
    # The probes whose workloads run on any device, from their specs. On a GPU one may still skip
    # with its reason (fp8-matmul where the GPU has no FP8); on the CPU each must have run.
    workloads = [m.SPEC.id for m in probes.load_builtin() if m.SPEC.runs_on_cpu and set(m.SPEC.needs) <= {"torch"}]
    assert workloads
    ran = ("pass", "warn") if not torch.cuda.is_available() else ("pass", "warn", "skipped")
    for probe_id in workloads:
        assert by_id[probe_id]["status"] in ran, by_id[probe_id]["summary"]
        assert by_id[probe_id]["details"], probe_id
    for r in report["results"]:
        if r["status"] == "skipped":
            assert r["summary"], f"{r['probe']} skipped without a reason"
        for finding in r["findings"]:
            assert kb.load_entry(finding["kb_id"]) is not None, finding


def test_environment_sections_and_redaction(scan):
    _, report, _ = scan
    env = report["environment"]
    for section in ("system", "python", "packages", "nvml", "torch", "cuda_libraries", "env_vars"):
        assert section in env, section
    assert env["torch"]["version"] == torch.__version__
    assert report["redacted"] is True
    import re
    import socket

    host = socket.gethostname()
    values = []

    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str):
            values.append(node)

    walk(report)
    word = re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w-])")
    assert not [v for v in values if word.search(v)], f"host name {host!r} reached the report"


def test_markdown_report_for_a_ticket(scan):
    _, report, markdown = scan
    for r in report["results"]:
        assert r["probe"] in markdown
