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

from gpudoctor.scan.environment import collect_environment, merge_environment
from gpudoctor.probes.base import ProbeFinding, Status
from gpudoctor.reports.model import SCHEMA_VERSION, ProbeResult, Report, ReportFormatError
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
    verdict,
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
    lines = out.splitlines()
    # The verdict is the first and the last line; the command for the full story just before it.
    verdict_line = "gpudoctor: NOT HEALTHY (3 problems); fix first: xformers-flash-invalid-argument"
    assert lines[0] == verdict_line and lines[-1] == verdict_line
    assert lines[-2] == "Next: gpudoctor explain xformers-flash-invalid-argument"
    # One line per probe, then findings as id + one line + the explain command; no patch by default.
    assert sum(1 for line in lines if line.startswith("  fp8-matmul ")) == 1
    at = lines.index("  error     xformers-flash-invalid-argument  xformers' flash kernel raises invalid argument on")
    assert lines[at + 1] == " " * 45 + "sm_120"  # wrapped under itself, never cut
    assert "            gpudoctor explain xformers-flash-invalid-argument" in lines
    assert "            gpudoctor explain sdpa-no-kernel" in lines
    assert "  crashed   fp8-matmul on cuda:0: worker died with SIGSEGV" in lines
    assert "pipe.disable_xformers" not in out and "not markup" not in out
    assert lines.index("Findings") > lines.index("  matmul-sanity       cpu     pass        205 ms  "
                                                 "fp32/fp16/bf16 matmul agree with the CPU within")
    assert "…" not in out
    env = next(line for line in lines if line.startswith("Environment: "))
    assert env == ("Environment: torch 2.8.0+cu128 (CUDA 12.8), cuDNN 9.10.2, driver 570.133.20 (CUDA 12.8), "
                   "NVIDIA GeForce RTX 5090 (sm 12.0), Python 3.11.9")
    assert "\x1b[" not in out


def test_verbose_adds_evidence_fixes_patches_tails_and_environment():
    out = _terminal(_sample(), kb=FAKE_KB.get, verbose=True)
    lines = out.splitlines()
    # The patch is printed at column 0, whole: it can be copied into a file as it is.
    assert "-pipe.enable_xformers_memory_efficient_attention()" in lines
    assert "+pipe.disable_xformers_memory_efficient_attention()" in lines
    assert "            1) Use F.scaled_dot_product_attention instead of xformers." in lines
    assert "            | torch.AcceleratorError: CUDA error: invalid argument" in lines
    # No entry for sdpa-no-kernel in FAKE_KB: the id and the explain command still appear.
    assert "No knowledge-base entry loaded for this id." in out and "gpudoctor explain sdpa-no-kernel" in out
    # Probe output is text, not markup.
    assert "            | [bold]not markup[/bold]" in lines
    assert "            signal SIGSEGV" in lines
    assert any(line.startswith("  duplicate!") for line in lines) and "installed twice" in out
    assert lines[0] == lines[-1]


def test_golden_terminal_verbose_at_80_columns():
    console = Console(file=io.StringIO(), width=80, color_system=None)
    render_terminal(_sample(), console, kb=FAKE_KB.get, verbose=True)
    _golden("sample.terminal-verbose-80.txt", console.file.getvalue())


def _raw_html(md: str) -> list[str]:
    """Unescaped "<" outside fenced code blocks, other than the renderer's own <details> tags."""
    import re

    prose = re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", md, flags=re.S | re.M)
    prose = re.sub(r"</?(details|summary)>", "", prose)
    return re.findall(r"(?<!\\)<[^\n]{0,20}", prose)


def _report(*results: ProbeResult, **kw) -> Report:
    return Report(results=list(results), tool_version="0.1.0", created="2026-05-01T10:20:30+00:00", **kw)


@pytest.mark.parametrize("results, line, command", [
    ([], "nothing checked: no probe ran", None),
    ([ProbeResult("a", "A", Status.PASS, "ok", 0.1, "cpu")], "healthy", None),
    ([ProbeResult("a", "A", Status.SKIPPED, "no CUDA", 0.0, "cpu")], "nothing checked: all 1 probe runs skipped",
     "gpudoctor scan -v  (why: no CUDA)"),
    ([ProbeResult("a", "A", Status.WARN, "meh", 0.1, "cpu", findings=[ProbeFinding("cuda-oom", "x", (), "warning")])],
     "healthy, 1 warning: cuda-oom", "gpudoctor explain cuda-oom"),
    ([ProbeResult("a", "A", Status.CRASHED, "died", 0.1, "cpu", signal="SIGSEGV"),
      ProbeResult("b", "B", Status.FAIL, "bad", 0.1, "cpu", findings=[ProbeFinding("dtype-mismatch", "x")])],
     "NOT HEALTHY (2 problems); fix first: dtype-mismatch", "gpudoctor explain dtype-mismatch"),
    ([ProbeResult("a", "A", Status.TIMED_OUT, "hung", 30.0, "cuda:1")],
     "NOT HEALTHY (1 problem); fix first: a timed out", "gpudoctor scan --probe a -v"),
])
def test_verdict(results, line, command):
    v = verdict(_report(*results))
    assert (v.line, v.command) == (line, command)
    assert v.healthy is not _report(*results).has_problems


def test_huge_and_hostile_probe_text_is_bounded_and_inert():
    # A 20 MB exception message, escape sequences, markup and bidi controls from a probe.
    huge = "RuntimeError: " + "x" * (20 << 20)
    hostile = "\x1b]52;c;ZXZpbA==\x07 [link=https://evil]click[/link] \u202e [/] <script>"
    report = _report(ProbeResult(
        "fp8-matmul", "FP8", Status.CRASHED, huge + hostile, 1.0, "cpu", signal="SIGSEGV",
        stderr_tail=(hostile + "\n") * 5 + huge,
        findings=[ProbeFinding("fp8-layout", hostile + huge, (huge, hostile, hostile))],
    ))
    for verbose in (False, True):
        out = _terminal(report, kb=lambda _id: None, verbose=verbose)
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
        assert "[link=https://evil]click[/link]" in out  # shown as text, not a live link
        assert len(out) < 200_000
    md = render_markdown(report, kb=lambda _id: None)
    assert "\x1b" not in md and "\u202e" not in md and _raw_html(md) == [] and "&lt;script&gt;" in md
    assert len(md) < 200_000
    data = json.loads(render_json(report))  # JSON keeps what the report holds, escaped by JSON
    assert data["results"][0]["summary"].endswith("<script>")


def test_evidence_is_shown_once_and_never_cut_mid_word():
    long_line = "RuntimeError: " + " ".join(f"word{i}" for i in range(60))
    report = _report(ProbeResult("p", "P", Status.FAIL, "bad", 0.1, "cpu", findings=[
        ProbeFinding("view-stride", long_line, (long_line, "second line", "second line"))]))
    out = _terminal(report, kb=lambda _id: None, verbose=True)
    assert out.count("second line") == 1
    # The summary, wrapped at word boundaries under its column (-v too); the evidence copy dropped.
    assert " ".join(out.split()).count(long_line) == 1
    out80 = Console(file=io.StringIO(), width=80, color_system=None)
    render_terminal(report, out80, kb=lambda _id: None)
    lines = out80.file.getvalue().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("  error"))
    rows = lines[at:lines.index("            gpudoctor explain view-stride")]
    assert len(rows) > 1 and all(len(row.rstrip()) <= 80 for row in rows)
    # Wrapped between words under the summary's column: the whole summary, nothing cut.
    assert rows[0].startswith("  error     view-stride  RuntimeError: ")
    assert all(row.startswith(" " * 25) for row in rows[1:])
    assert " ".join(row[25:].strip() for row in rows) == long_line


def test_markdown_starts_with_the_environment_summary():
    md = render_markdown(_sample(), kb=FAKE_KB.get)
    first = md.splitlines()[0]
    assert first == ("**Environment:** torch 2.8.0+cu128 (CUDA 12.8), cuDNN 9.10.2, driver 570.133.20 "
                     "(CUDA 12.8), NVIDIA GeForce RTX 5090 (sm 12.0), Python 3.11.9")
    assert "**NOT HEALTHY (3 problems); fix first: xformers-flash-invalid-argument**" in md


def test_markdown_cannot_be_broken_out_of():
    nasty = "a | b ` ``` </details> <img src=x onerror=alert(1)> @everyone [x](javascript:alert(1)) *bold*"
    report = _report(ProbeResult("p", "P", Status.FAIL, nasty, 0.1, "cpu", stderr_tail="```\n</details>",
                                 findings=[ProbeFinding("view-stride", nasty, ("````\n# heading\n````",))]))
    md = render_markdown(report, kb=lambda _id: None)
    row = next(line for line in md.splitlines() if line.startswith("| p |"))
    assert row.count(" | ") == 4 and row.endswith(" |")  # the pipe in the text did not add a column
    assert _raw_html(md) == []  # every < outside code is escaped, except our own <details>
    assert "\\@everyone" in md and "\\[x\\]" in md
    assert "`````\n````\n# heading\n````\n`````" in md  # a fence longer than the content's


def test_a_1_0_report_still_reads_and_rerenders_as_the_current_schema():
    old = json.loads((FIXTURES / "sample.json").read_text())
    assert old["schema_version"] == "1.0" and "invocation" not in old
    data = json.loads(render_json(report_from_dict(old)))
    assert data == {**old, "schema_version": SCHEMA_VERSION, "invocation": None, "verdict": data["verdict"]}
    # 1.4: the verdict the terminal page starts with, for programs.
    assert data["verdict"] == {"healthy": False, "line": verdict(report_from_dict(old)).line,
                               "fix_first": verdict(report_from_dict(old)).fix_id,
                               "next": verdict(report_from_dict(old)).command}
    assert [e.message for e in _validator().iter_errors(data)] == []
    assert [e.message for e in _validator().iter_errors(old)] == []  # 1.0 stays valid


def test_json_round_trips_with_the_invocation():
    report = _sample()
    report.invocation = {"command": "gpudoctor scan --device cpu", "argv": ["gpudoctor", "scan", "--device", "cpu"],
                         "options": {"device": "cpu", "timeout": None}}
    data = json.loads(render_json(report))
    assert data["schema_version"] == SCHEMA_VERSION == "1.4"
    assert report_from_dict(data).to_dict() == data
    assert [e.message for e in _validator().iter_errors(data)] == []


@pytest.mark.parametrize("data, message", [
    ([], "not a gpudoctor report: the JSON is list"),
    ({"results": []}, "not a gpudoctor report: schema_version is None"),
    ({"schema_version": "2.0", "results": []}, "report schema 2.0 is not readable by this gpudoctor (it reads 1.x)"),
    ({"schema_version": "1.0", "results": "x"}, "results is str, not a list"),
    ({"schema_version": "1.0", "results": [{"probe": "p", "status": "weird"}]}, "results[0] is malformed"),
    ({"schema_version": "1.0", "results": [{"status": "pass"}]}, "results[0] is malformed"),
])
def test_malformed_reports_are_refused_with_one_line(data, message):
    with pytest.raises(ReportFormatError) as info:
        report_from_dict(data)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_knowledge_base_lookup_degrades(monkeypatch):
    assert load_kb_entry("no-such-entry-anywhere") is None
    import gpudoctor.knowledge.kb

    def broken(_name):
        raise gpudoctor.knowledge.kb.KnowledgeBaseError("bad.toml: missing field 'title'")

    monkeypatch.setattr(gpudoctor.knowledge.kb, "load_entry", broken)
    assert load_kb_entry("cuda-oom") is None
    out = _terminal(_sample(), verbose=True)  # the default lookup, now failing
    assert "gpudoctor explain xformers-flash-invalid-argument" in out
    assert "No knowledge-base entry loaded for this id." in out


def test_terminal_colour_follows_the_console():
    console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    render_terminal(_sample(), console, kb=FAKE_KB.get)
    assert "\x1b[" in console.file.getvalue()


def test_explanation_markdown_is_explains_own_and_inert():
    """`explain --format md` has one renderer, gpudoctor.explain.explanation.render_markdown (reports.render
    renders reports only): untrusted evidence is escaped, the knowledge base's prose keeps its code
    spans but not stray HTML, the patch is fenced whole."""
    from gpudoctor.explain import explanation as ex
    from gpudoctor.knowledge.kb import load_entry
    from gpudoctor.explain.matcher import match_chunks
    from gpudoctor.reports import render
    from gpudoctor.explain.textinput import iter_text

    assert not hasattr(render, "render_explanation_markdown")
    text = "[rank0]: RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float <b>"
    matches = tuple(match_chunks(iter_text(text)))
    md = ex.render_markdown(ex.Explanation(matches=matches, entry=matches[0].entry))
    assert md.startswith("## `dtype-mismatch`: ")
    assert "- line 1: \\[rank0\\]" in md and "<b>" not in md  # escaped, not HTML or a link
    assert "**Fix:**" in md and "### Patch" in md
    entry = load_entry("misaligned-address")
    md = ex.render_markdown(ex.Explanation(matches=(), entry=entry))
    assert md.splitlines()[0].startswith("## `misaligned-address`: ")
    assert "```" + (entry.patch_lang or "") in md and entry.patch.splitlines()[0] in md
    assert f"[{entry.references[0].title}](<{entry.references[0].url}>)" in md
    # Prose with a placeholder in angle brackets stays visible on GitHub; code spans stay code.
    import dataclasses

    odd = dataclasses.replace(entry, what="Set TORCH_CUDA_ARCH_LIST=<your arch>, then run `x<y`.")
    body = ex.render_markdown(ex.Explanation(matches=(), entry=odd)).split("### What happened", 1)[1]
    assert "TORCH_CUDA_ARCH_LIST=\\<your arch>" in body and "`x<y`" in body
    none = ex.render_markdown(ex.Explanation(matches=(), entry=None))
    assert none == "No GPU failure recognised in this text.\n"


def test_schema_validates_a_real_report_from_this_machine():
    torch = pytest.importorskip("torch")
    from gpudoctor.scan.torchenv import torch_environment

    env = merge_environment(collect_environment(sys.executable), torch_environment(torch))
    results = [
        ProbeResult("matmul-sanity", "Matmul sanity", Status.PASS, "ok", 0.1, "cpu", details={"max_abs_err": 0.0}),
        ProbeResult("cuda-runtime", "CUDA runtime", Status.SKIPPED, "CUDA is not available", 0.0, None),
        ProbeResult("dtype-probe", "dtypes", Status.FAIL, "mismatch", 0.2, "cpu",
                    findings=[ProbeFinding("dtype-mismatch", "mat1 and mat2 differ", ("RuntimeError: mat1 and mat2 must have the same dtype",))]),
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
        findings=[ProbeFinding("view-stride", "view on a transposed tensor", ("```python\nx.view(-1)\n```",))],
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


def test_steps_for_this_machine_replace_the_entrys_list_and_patch():
    # The xformers build mismatch on an H100 with torch 2.11: the probe knows the fix for this torch;
    # the entry's generic patch (another torch from another index) must not be printed beside it.
    entry = SimpleNamespace(title="xformers was built for another torch", fix=("Generic step.",),
                            patch="-pip install xformers\n+pip install torch==2.8.0 xformers", patch_lang="diff")
    step = "install the xformers built for torch 2.11.0+cu130: `pip install -U xformers`"
    report = _report(ProbeResult("xformers", "xformers", Status.FAIL, "cannot load", 0.1, "cuda:0", findings=[
        ProbeFinding("xformers-build-mismatch", "xformers 0.0.35 cannot load its extensions", ("built for 2.10",),
                steps=(step,))]))
    kb = {"xformers-build-mismatch": entry}.get
    terminal, markdown = _terminal(report, kb=kb, verbose=True), render_markdown(report, kb=kb)
    assert "every cause and fix: gpudoctor explain xformers-build-mismatch" in terminal
    assert "Details: `gpudoctor explain xformers-build-mismatch`" in markdown
    for text in (terminal, markdown):
        assert "pip install -U xformers" in text
        assert "Generic step." not in text
        assert "torch==2.8.0" not in text
    # Without steps the entry's list and patch are shown, as before.
    plain = _report(ProbeResult("xformers", "xformers", Status.FAIL, "cannot load", 0.1, "cuda:0", findings=[
        ProbeFinding("xformers-build-mismatch", "xformers 0.0.35 cannot load its extensions", ("built for 2.10",))]))
    assert "torch==2.8.0" in render_markdown(plain, kb=kb) and "Generic step." in _terminal(plain, kb=kb, verbose=True)


def _page(name: str, width: int, verbose: bool = False) -> list[str]:
    report = report_from_dict(json.loads((FIXTURES / name).read_text()))
    console = Console(file=io.StringIO(), width=width, color_system=None)
    render_terminal(report, console, verbose=verbose)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def _table(lines: list[str]) -> list[str]:
    """The probe table: from the line after the verdict to the tally line."""
    end = next(i for i, line in enumerate(lines) if " probe run" in line)
    return lines[2:end]


@pytest.mark.parametrize("name", ["cpu-healthy.json", "cpu-no-torch.json", "sample.json"])
@pytest.mark.parametrize("verbose", [False, True])
def test_probe_rows_fit_80_columns_with_and_without_v(name, verbose):
    """A log, CI or a default terminal has 80 columns: every row of the probe table fits them, at
    every verbosity; the words are all there (wrapped, not cut)."""
    lines = _page(name, 80, verbose)
    rows = _table(lines)
    assert rows and max(len(line) for line in rows) <= 80, max(rows, key=len)
    report = json.loads((FIXTURES / name).read_text())
    joined = " ".join(" ".join(rows).split())
    for r in report["results"]:
        assert r["probe"] in joined


def test_a_missing_torch_is_one_row_and_one_finding():
    """Twelve probes skipped because torch cannot be imported: one row that names them, the
    torch-import failure once, one finding."""
    lines = _page("cpu-no-torch.json", 80)
    text = "\n".join(lines)
    rows = _table(lines)
    starts = [line for line in rows if line.startswith("  ") and not line.startswith("   ")]
    assert [line.split()[0] for line in starts] == ["torch-import", "12"]
    assert starts[1].split()[:3] == ["12", "probes", "cpu"]
    flat = " ".join(text.split())
    assert flat.count("could not be imported") == 1  # the group's reason, once
    assert flat.count("No module named 'torch'") == 2  # torch-import's row and its finding
    assert sum(line.startswith("  error ") for line in lines) == 1


def test_no_driver_advice_starts_with_the_driver():
    """On a machine with a CPU-only torch and no NVIDIA driver, the default page's one step is the
    driver (no CUDA build of torch can run without it)."""
    report = json.loads((FIXTURES / "cpu-healthy.json").read_text())
    [finding] = [f for r in report["results"] for f in r["findings"] if f["kb_id"] == "cuda-unavailable"]
    assert finding["steps"][0].startswith("no NVIDIA driver is loaded here")
    text = " ".join(" ".join(_page("cpu-healthy.json", 80)).split())
    assert "cuda-unavailable" in text and "no NVIDIA driver is loaded here" in text
    assert text.index("no NVIDIA driver is loaded here") < text.index("gpudoctor explain cuda-unavailable")


def test_the_json_report_carries_the_verdict_of_the_page():
    for name in ("cpu-healthy.json", "cpu-no-torch.json"):
        data = json.loads((FIXTURES / name).read_text())
        assert [e.message for e in _validator().iter_errors(data)] == []
        v = verdict(report_from_dict(data))
        assert data["verdict"] == {"healthy": v.healthy, "line": v.line, "fix_first": v.fix_id, "next": v.command}
        assert _page(name, 80)[0] == f"gpudoctor: {v.line}"
