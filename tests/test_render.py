"""Tests for the renderers and the JSON schema: golden terminal and Markdown output of a sample
report (tests/fixtures/reports/), every format handled, JSON valid against reports/schema.json,
including a report built from the real collectors on this machine.

Set GPUDOCTOR_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change."""
from __future__ import annotations

import copy
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator
from rich.console import Console

from gpudoctor.environment import collect_environment, merge_environment
from gpudoctor.probes.base import Finding, Status
from gpudoctor.reports.model import SCHEMA_VERSION, ProbeResult, Report
from gpudoctor.reports.render import (
    FORMATS,
    RENDERERS,
    environment_brief,
    load_kb_entry,
    load_schema,
    render_json,
    render_markdown,
    render_terminal,
    report_from_dict,
)

FIXTURES = Path(__file__).parent / "fixtures" / "reports"

# A pinned knowledge base, so that the golden output does not move when real entries change.
FAKE_KB = {
    "xformers-flash-invalid-argument": SimpleNamespace(
        title="xformers' flash kernel fails on this GPU",
        fix=("Use F.scaled_dot_product_attention instead of xformers.", "Or upgrade xformers to a build for sm_120."),
        patch="-pipe.enable_xformers_memory_efficient_attention()\n+pipe.disable_xformers_memory_efficient_attention()",
        patch_lang="diff",
    ),
}


def _sample() -> Report:
    return report_from_dict(json.loads((FIXTURES / "sample.json").read_text()))


def _terminal(report: Report, **kw) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    render_terminal(report, console, **kw)
    return console.file.getvalue()


def _golden(name: str, text: str) -> None:
    # rich pads lines to the console width; trailing blanks are not part of the contract.
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    path = FIXTURES / name
    if os.environ.get("GPUDOCTOR_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with GPUDOCTOR_UPDATE_GOLDEN=1 if intended"


def _validator() -> Draft202012Validator:
    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_golden_terminal():
    _golden("sample.terminal.txt", _terminal(_sample(), kb=FAKE_KB.get))


def test_golden_markdown():
    _golden("sample.md", render_markdown(_sample(), kb=FAKE_KB.get))


def test_every_format_has_a_renderer_that_renders_every_result():
    assert set(RENDERERS) == set(FORMATS)
    report = _sample()
    for fmt in FORMATS:
        if fmt == "terminal":
            out = _terminal(report, kb=FAKE_KB.get)
        else:
            out = RENDERERS[fmt](report)
        assert isinstance(out, str) and out
        for r in report.results:
            assert r.probe in out, (fmt, r.probe)


def test_terminal_shows_findings_patches_crashes_and_environment():
    out = _terminal(_sample(), kb=FAKE_KB.get)
    assert "[xformers-flash-invalid-argument] xformers' flash kernel raises invalid argument" in out
    assert "+pipe.disable_xformers_memory_efficient_attention()" in out
    assert "1) Use F.scaled_dot_product_attention instead of xformers." in out
    # No entry for sdpa-no-kernel in FAKE_KB: the id and the explain command still appear.
    assert "No knowledge-base entry loaded; run `gpudoctor explain sdpa-no-kernel`." in out
    # Probe output is text, not markup.
    assert "| [bold]not markup[/bold]" in out
    assert "fp8-matmul crashed (signal SIGSEGV) on cuda:0" in out
    assert "duplicate!" in out and "installed twice" in out
    assert "\x1b[" not in out


def test_terminal_colour_follows_the_console():
    console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    render_terminal(_sample(), console, kb=FAKE_KB.get)
    assert "\x1b[" in console.file.getvalue()


def test_knowledge_base_lookup_degrades(monkeypatch):
    assert load_kb_entry("no-such-entry-anywhere") is None
    import gpudoctor.kb

    def broken(_name):
        raise gpudoctor.kb.KnowledgeBaseError("bad.toml: missing field 'title'")

    monkeypatch.setattr(gpudoctor.kb, "load_entry", broken)
    assert load_kb_entry("cuda-oom") is None
    out = _terminal(_sample())  # the default lookup, now failing
    assert "run `gpudoctor explain xformers-flash-invalid-argument`" in out


def test_json_round_trips_and_validates():
    report = _sample()
    text = render_json(report)
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION
    assert data == json.loads((FIXTURES / "sample.json").read_text())
    assert report_from_dict(data).to_dict() == data
    errors = [e.message for e in _validator().iter_errors(data)]
    assert errors == []


def test_schema_validates_a_real_report_from_this_machine():
    torch = pytest.importorskip("torch")
    from gpudoctor.torchenv import torch_environment

    env = merge_environment(collect_environment(sys.executable), torch_environment(torch))
    results = [
        ProbeResult("matmul-sanity", "Matmul sanity", Status.PASS, "ok", 0.1, "cpu", details={"max_abs_err": 0.0}),
        ProbeResult("cuda-runtime", "CUDA runtime", Status.SKIPPED, "CUDA is not available", 0.0, None),
        ProbeResult("dtype-probe", "dtypes", Status.FAIL, "mismatch", 0.2, "cpu",
                    findings=[Finding("dtype-mismatch", "mat1 and mat2 differ", ("RuntimeError: mat1 and mat2 must have the same dtype",))]),
    ]
    data = json.loads(render_json(Report(results=results, environment=env, tool_version="0.1.0", duration_s=0.3)))
    assert [e.message for e in _validator().iter_errors(data)] == []
    # A report without a worker (torch failed to import) is valid too.
    data["environment"] = merge_environment(collect_environment(sys.executable), None)
    assert [e.message for e in _validator().iter_errors(data)] == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["results"][0].__setitem__("status", "broken"),
        lambda d: d["results"][2]["findings"][0].__setitem__("kb_id", "Not_Kebab"),
        lambda d: d.pop("schema_version"),
        lambda d: d["summary"].__setitem__("pass", -1),
        lambda d: d["environment"]["torch"].__setitem__("cuda_available", "yes"),
        lambda d: d["environment"]["cuda_libraries"]["flags"].append({"kind": "weird", "library": "x", "detail": "y"}),
        lambda d: d["environment"].__setitem__("nvml", {"available": False}),
    ],
)
def test_schema_rejects_broken_reports(mutate):
    data = json.loads((FIXTURES / "sample.json").read_text())
    broken = copy.deepcopy(data)
    mutate(broken)
    assert not _validator().is_valid(broken)


def test_markdown_escapes_tables_and_fences():
    report = Report(results=[ProbeResult(
        "contiguity", "Contiguity", Status.FAIL, "a | b\nc", 0.01, "cpu",
        findings=[Finding("view-stride", "view on a transposed tensor", ("```python\nx.view(-1)\n```",))],
    )])
    md = render_markdown(report, kb=lambda _id: None)
    assert "| a \\| b c |" in md
    assert "````\n```python\nx.view(-1)\n```\n````" in md
    assert "<details><summary>Environment</summary>" in md and "</details>" in md
    assert "Details: `gpudoctor explain view-stride`" in md


def test_environment_brief_tolerates_missing_sections():
    brief = dict(environment_brief({
        "system": {"available": False, "reason": "boom"},
        "torch": {"available": False, "reason": "the worker did not report"},
        "nvml": {"available": False, "reason": "NVML: libnvidia-ml.so.1 not found"},
        "packages": "garbage",
        "cuda_libraries": None,
    }))
    assert brief["system"] == "not available: boom"
    assert brief["torch"] == "not available: the worker did not report"
    assert brief["driver"] == "not available: NVML: libnvidia-ml.so.1 not found"
    assert environment_brief({}) == [("system", "not collected"), ("python", "not collected"), ("torch", "not collected"), ("driver", "not collected")]
