"""Scan levels (`gpudoctor scan --level quick|deep`): quick gives the same verdicts and findings as
deep for every simulated fault, runs strictly fewer cells where a probe says it does, and deep
runs exactly the matrices gpudoctor ran before levels existed (pinned in
tests/fixtures/levels/sdpa_deep_cells.json, written by the probe as it was at commit f7bdd57)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import levels_sim
from gpudoctor.probes import async_errors, fp8_matmul
from gpudoctor.probes import sdpa_backends as sdpa
from gpudoctor.probes.base import LEVELS, ProbeContext, Status

ROOT = Path(__file__).resolve().parent.parent
PINNED = json.loads((Path(__file__).parent / "fixtures" / "levels" / "sdpa_deep_cells.json").read_text())
_real_sdpa = torch.nn.functional.scaled_dot_product_attention


def ctx(torch_mod, device, level, **options):
    return ProbeContext(torch=torch_mod, device=device, options={"level": level, **options})


def verdict(outcome):
    """What a user acts on: the status, and each finding's id and severity (a finding per cell
    names its cell, so quick's fewer cells may name fewer; the ids and severities must agree)."""
    return outcome.status, sorted({(f.kb_id, f.severity) for f in outcome.findings})


def _forced():
    on = [name for name, flag in (("FLASH_ATTENTION", "flash"), ("EFFICIENT_ATTENTION", "mem_efficient"),
                                  ("MATH", "math"), ("CUDNN_ATTENTION", "cudnn"))
          if getattr(torch.backends.cuda, f"{flag}_sdp_enabled")()]
    return on[0] if len(on) == 1 else None


# --- the level reaches the probe -----------------------------------------------------------------


def test_context_level_defaults_to_deep_and_rejects_unknown_values():
    assert ProbeContext(torch=None, device="cpu").level == "deep"
    assert ProbeContext(torch=None, device="cpu", options={"level": "quick"}).level == "quick"
    assert ProbeContext(torch=None, device="cpu", options={"level": "medium"}).level == "deep"
    assert LEVELS == ("quick", "deep")


def test_only_the_probes_that_document_a_cut_read_the_level():
    # A probe that starts cutting cells must say so in its docstring and get level tests here.
    readers = set()
    for path in sorted((ROOT / "probes").glob("*.py")):
        if path.stem == "base":  # where ctx.level is defined
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Attribute) and n.attr in ("level", "deep")
               or isinstance(n, ast.Constant) and n.value == "level" for n in ast.walk(tree)):
            readers.add(path.stem)
            assert "Levels" in (ast.get_docstring(tree) or ""), path.stem
    assert readers == {"sdpa_backends", "fp8_matmul"}


# --- sdpa-backends: deep is today's matrix, quick cuts cuDNN's float16 default cells -------------


def test_deep_reproduces_the_matrix_from_before_levels_on_the_cpu():
    out = sdpa.run(ctx(torch, "cpu", "deep"))
    assert levels_sim.cells(out) == PINNED["cpu"]


def test_deep_reproduces_the_matrix_from_before_levels_where_sdpa_picks_cudnn(monkeypatch):
    with levels_sim.h100_like(monkeypatch) as (sim, _state):
        out = sdpa.run(ctx(sim, "cuda:0", "deep"))
    assert levels_sim.cells(out) == PINNED["h100_like"]
    assert "level_cut" not in out.details


def test_quick_equals_deep_where_sdpa_does_not_pick_cudnn():
    quick, deep = (sdpa.run(ctx(torch, "cpu", level)) for level in LEVELS)
    assert levels_sim.cells(quick) == levels_sim.cells(deep) == PINNED["cpu"]


@pytest.mark.slow  # tens of seconds on 2 cores: left out by -m "not slow"
def test_quick_cuts_only_float16_cudnn_cells_and_keeps_the_recommendation(monkeypatch):
    with levels_sim.h100_like(monkeypatch) as (sim, _state):
        quick = sdpa.run(ctx(sim, "cuda:0", "quick"))
        deep = sdpa.run(ctx(sim, "cuda:0", "deep"))
    q, d = levels_sim.cells(quick), levels_sim.cells(deep)
    assert len(q) == len(d) == 105  # the same keys; cut cells are there, marked not-run
    changed = {a.rsplit(" ", 1)[0] for a, b in zip(q, d) if a != b}
    # The six non-strided cases: float16's default cell and forced cuDNN (SDPA's choice) only.
    cases = ("d64", "d128", "d256", "mask", "causal", "gqa")
    assert changed == {f"{b} float16/{c}" for b in ("DEFAULT", "CUDNN_ATTENTION") for c in cases}
    assert all(a.endswith(" not-run") for a in q if a.rsplit(" ", 1)[0] in changed)
    assert quick.details["level_cut"]["default_cells"] == [f"float16/{c}" for c in cases]
    ran = lambda out: sum(1 for line in levels_sim.cells(out) if not line.endswith("not-run"))  # noqa: E731
    assert ran(quick) == ran(deep) - 12
    assert quick.status is deep.status is Status.PASS
    assert quick.details["recommended_backend"] == deep.details["recommended_backend"]
    assert "of 15 cases run at the quick level" in quick.summary
    assert "of 21 cases;" in deep.summary


def _no_kernel_image(q, k, v, **kwargs):
    # A torch built without this GPU's architecture: every kernel launch says so.
    raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


def _default_d128_plan_error(q, k, v, **kwargs):
    if _forced() is None and q.shape[-1] == 128:
        raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.")
    return _real_sdpa(q, k, v, **kwargs)


def _forced_efficient_fails(q, k, v, **kwargs):
    if _forced() == "EFFICIENT_ATTENTION":
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
    return _real_sdpa(q, k, v, **kwargs)


def _sticky_in_forced_math(state):
    def fn(q, k, v, **kwargs):
        out = _real_sdpa(q, k, v, **kwargs)
        if _forced() == "MATH" and q.dtype == torch.float16 and q.shape[-1] == 128:
            state.poison()
        return out
    return fn


def _sticky_in_default_bf16(state):
    def fn(q, k, v, **kwargs):
        out = _real_sdpa(q, k, v, **kwargs)
        if _forced() is None and q.dtype == torch.bfloat16 and q.shape[-1] == 256:
            state.poison()
        return out
    return fn


SDPA_FAULTS = {
    "missing-kernel-image": lambda state: _no_kernel_image,
    "default-path-cudnn-plan-error": lambda state: _default_d128_plan_error,
    "forced-backend-fails": lambda state: _forced_efficient_fails,
    "sticky-fault-in-forced-math": _sticky_in_forced_math,
    "sticky-fault-on-the-default-path": _sticky_in_default_bf16,
}


@pytest.mark.slow  # minutes in all on 2 cores: left out by -m "not slow"
@pytest.mark.parametrize("fault", sorted(SDPA_FAULTS))
def test_sdpa_faults_get_the_same_verdict_at_both_levels(fault, monkeypatch):
    outcomes = {}
    for level in LEVELS:
        with levels_sim.h100_like(monkeypatch) as (sim, state):
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", SDPA_FAULTS[fault](state))
            outcomes[level] = sdpa.run(ctx(sim, "cuda:0", level))
    quick, deep = outcomes["quick"], outcomes["deep"]
    assert deep.status is not Status.PASS, deep.summary  # the fault is real at deep
    assert verdict(quick) == verdict(deep), (quick.summary, deep.summary)
    assert ("context_poisoned" in quick.details) == ("context_poisoned" in deep.details)


def test_sdpa_no_kernel_on_the_default_path_at_both_levels(monkeypatch):
    # Every backend disabled globally: the default path has no kernel (a CPU fault, no cut).
    flags = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in ("flash", "math")}
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    monkeypatch.setattr(sdpa, "CASES", sdpa.CASES[:2])
    try:
        quick, deep = (sdpa.run(ctx(torch, "cpu", level)) for level in LEVELS)
    finally:
        torch.backends.cuda.enable_flash_sdp(flags["flash"])
        torch.backends.cuda.enable_math_sdp(flags["math"])
    assert deep.status is Status.FAIL and verdict(quick) == verdict(deep)
    assert ("sdpa-no-kernel", "error") in verdict(quick)[1]


# --- the other simulated faults: their probes run the same at both levels --------------------------

from test_arch_compat import env  # noqa: E402,F401 - the fixture: a site-packages with builds to read


@pytest.mark.parametrize("level", LEVELS)
def test_xformers_build_mismatch_at_both_levels(level, tmp_path, monkeypatch):
    import test_probe_xformers_flash as txf

    monkeypatch.setattr(txf, "CPU", ctx(torch, "cpu", level))
    txf.test_build_mismatch_is_never_a_silent_skip(tmp_path, monkeypatch)  # FAIL, xformers-build-mismatch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict of a torch without CUDA")
@pytest.mark.parametrize("level", LEVELS)
def test_cpu_only_torch_at_both_levels(level):
    from gpudoctor.probes import cuda_runtime

    out = cuda_runtime.run(ctx(torch, "cpu", level, requested_device="cuda:0"))
    assert verdict(out) == (Status.FAIL, [("cuda-unavailable", "error")])


@pytest.mark.parametrize("level", LEVELS)
def test_missing_kernel_image_at_both_levels(level, env, tmp_path):  # noqa: F811 - the fixture
    import test_arch_compat as tac
    from gpudoctor.probes import arch_compat

    sim = tac.fake_torch((7, 5), ["sm_80"], tmp_path)
    out = arch_compat.run(ProbeContext(torch=sim, device="cuda:0", options={**env, "level": level}))
    assert out.status is Status.FAIL and {f.kb_id for f in out.findings} == {"no-kernel-image"}


@pytest.mark.parametrize("level", LEVELS)
def test_attention_oom_at_both_levels(level):
    from gpudoctor.probes import attention_memory

    out = attention_memory.run(ctx(torch, "cpu", level, attn_shape=[2, 8, 61440, 40]))
    assert verdict(out) == (Status.WARN, [("attention-oom", "warning")])


# --- fp8-matmul: the same eager matrix, the compile contract only where it can matter ------------


def _run_fp8(level, scaled_mm=None, monkeypatch=None, **sim):
    import cudasim

    with cudasim.simulated(**sim) as (sim_torch, state):
        if scaled_mm is not None:
            monkeypatch.setattr(torch, "_scaled_mm", scaled_mm(state))
        return fp8_matmul.run(ctx(sim_torch, "cuda:0", level))


_REAL_MM = torch._scaled_mm


def _cublas_status(state):
    def fn(a, b, *args, **kwargs):
        if a.storage_offset():
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmul( ...)`")
        return _REAL_MM(a, b, *args, **kwargs)
    return fn


def _sticky_last(state):
    def fn(a, b, *args, **kwargs):
        if a.storage_offset() and a.device.type != "meta":
            state.poison()
        return _REAL_MM(a, b, *args, **kwargs)
    return fn


def _wrong_numbers(state):
    def fn(a, b, *args, **kwargs):
        out = _REAL_MM(a, b, *args, **kwargs)
        return out * 2 if a.stride(0) == 1 and a.device.type != "meta" else out  # a transposed mat1
    return fn


def _aligned_fails(state):
    def fn(a, b, *args, **kwargs):
        if a.device.type != "meta":
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmul( ...)`")
        return _REAL_MM(a, b, *args, **kwargs)
    return fn


FP8_FAULTS = {
    "healthy": None,
    "cublas-status-on-the-misaligned-case": _cublas_status,
    "sticky-fault-in-the-last-case": _sticky_last,
    "silently-wrong-numbers": _wrong_numbers,
    "aligned-call-fails": _aligned_fails,
}


@pytest.mark.parametrize("fault", sorted(FP8_FAULTS))
def test_fp8_verdicts_and_eager_matrix_are_the_same_at_both_levels(fault, monkeypatch):
    healthy = _run_fp8("deep")  # before the fault is patched in (monkeypatch keeps it)
    quick, deep = (_run_fp8(level, FP8_FAULTS[fault], monkeypatch) for level in LEVELS)
    assert verdict(quick) == verdict(deep), (quick.summary, deep.summary)
    assert [c["eager"] for c in quick.details["cases"]] == [c["eager"] for c in deep.details["cases"]]
    assert [c["verdict"] for c in quick.details["cases"]] == [c["verdict"] for c in deep.details["cases"]]
    # A finding's evidence (which prints the contract) is the same too.
    assert [f.evidence for f in quick.findings] == [f.evidence for f in deep.findings]
    if fault != "healthy":  # the fault is visible at deep: in the verdict or the per-case verdicts
        assert (verdict(deep) != verdict(healthy)
                or [c["verdict"] for c in deep.details["cases"]] != [c["verdict"] for c in healthy.details["cases"]])


def test_fp8_quick_skips_the_contract_only_where_eager_refused_cleanly(monkeypatch):
    quick, deep = (_run_fp8(level) for level in LEVELS)
    skipped = quick.details["contract_not_checked"]
    # On the simulated device (CPU kernels) the two correct control cases and the two rules
    # eager refuses with a clear error (the scale rules); the rules the CPU kernel accepts are
    # `accepted` only through the contract, so it is checked for them.
    assert skipped == ["aligned", "m-not-16", "scale-fp16", "scale-shape-m", "no-out-dtype"]
    assert all(c["compile_contract"]["outcome"] != "not-checked" for c in deep.details["cases"])
    assert "contract_not_checked" not in deep.details
    checked = lambda out: sum(c["compile_contract"]["outcome"] != "not-checked" for c in out.details["cases"])  # noqa: E731
    assert checked(quick) == checked(deep) - 5


def test_on_the_committed_h100_report_quick_would_check_no_contract_and_keep_every_verdict():
    # Every case's eager result as torch 2.11 gave it on an H100: the meta path is never needed.
    report = json.loads((ROOT / "docs" / "validation" / "h100-torch2.11.0.json").read_text())
    (fp8,) = [r for r in report["results"] if r["probe"] == "fp8-matmul"]
    cases = {c.name: c for c in fp8_matmul.CASES}
    assert len(fp8["details"]["cases"]) == len(cases)
    for entry in fp8["details"]["cases"]:
        assert not fp8_matmul.contract_matters(cases[entry["case"]], entry["eager"]), entry["case"]
        quick = {**entry, "compile_contract": {"outcome": "not-checked", "reason": fp8_matmul.CONTRACT_QUICK}}
        if entry["rule"]:
            assert fp8_matmul._verdict(quick) == entry["verdict"], entry["case"]


def test_fp8_contract_matters_reads_the_same_fields_as_the_verdict():
    rule = fp8_matmul.CASES[2]
    assert rule.rule and not fp8_matmul.contract_matters(rule, {"outcome": "error", "error": "RuntimeError: x"})
    assert fp8_matmul.contract_matters(rule, {"outcome": "error", "error": "CUDA error: misaligned address"})
    assert fp8_matmul.contract_matters(rule, {"outcome": "correct", "out_dtype": "bfloat16"})
    assert not fp8_matmul.contract_matters(rule, {"outcome": "correct", "out_dtype": "float8_e4m3fn"})
    assert fp8_matmul.contract_matters(rule, {"outcome": "wrong"})
    assert not fp8_matmul.contract_matters(fp8_matmul.CASES[0], {"outcome": "correct"})
    assert fp8_matmul.contract_matters(fp8_matmul.CASES[0], {"outcome": "error", "error": "x"})
    assert not fp8_matmul.contract_matters(rule, {"outcome": "not-run"})


# --- async-errors keeps its CUDA_LAUNCH_BLOCKING child at both levels ------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_async_errors_starts_its_launch_blocking_child_at_both_levels(level, monkeypatch):
    # Its verdict on a faulty machine (CUDA_LAUNCH_BLOCKING=1 not moving the error, the child
    # crashing) comes from the child alone: quick must not skip it.
    import cudasim

    started = []

    def start(device, launch_blocking, env=None):
        started.append(launch_blocking)
        return {"outcome": "ok", "stages_ok": [], "error_stage": "unrelated-launch",
                "error": "AcceleratorError: CUDA error: device-side assert triggered", "device_assert": []}

    monkeypatch.setattr(async_errors, "start_experiment", start)
    monkeypatch.delenv("TORCH_USE_CUDA_DSA", raising=False)
    with cudasim.simulated() as (sim_torch, _state):
        out = async_errors.run(ctx(sim_torch, "cuda:0", level))
    assert started == [True]
    assert out.status is Status.FAIL
    assert [f.kb_id for f in out.findings] == ["async-error-reporting"]


# --- reports, diff and merge know the level -------------------------------------------------------


def _report(level, sdpa_status="pass", kb_ids=()):
    from gpudoctor.probes.base import ProbeFinding
    from gpudoctor.reports.model import ProbeResult, Report

    result = ProbeResult("sdpa-backends", "SDPA backends", Status(sdpa_status), "s", 1.0, "cuda:0",
                         findings=[ProbeFinding(k, "x") for k in kb_ids])
    return Report(results=[result], tool_version="0", created="2026-11-25T00:00:00+00:00", level=level)


def test_the_level_is_written_read_back_and_validated_and_old_reports_read_as_deep():
    from gpudoctor.reports.load import ReportError, validate
    from gpudoctor.reports.model import SCHEMA_VERSION, report_from_dict
    from gpudoctor.reports.render import render_json, render_markdown, tally_line

    data = json.loads(render_json(_report("quick")))
    assert SCHEMA_VERSION >= "1.3" and data["level"] == "quick"
    validate(data, "r.json")
    assert report_from_dict(data).level == "quick"
    assert "at the quick level" in tally_line(_report("quick")) and "at the quick level" in render_markdown(_report("quick"))
    old = json.loads(render_json(_report(None)))
    assert "level" not in old
    old["schema_version"] = "1.2"
    validate(old, "old.json")
    assert report_from_dict(old).level is None and report_from_dict(old).matrices_level == "deep"
    assert "level" not in tally_line(report_from_dict(old))
    with pytest.raises(ReportError, match="level"):
        validate({**data, "level": "medium"}, "bad.json")


def test_diff_of_a_quick_and_a_deep_report_says_so_and_compares_verdicts_only():
    from rich.console import Console

    from gpudoctor.reports import diff
    from gpudoctor.reports.render import render_json

    quick = json.loads(render_json(_report("quick", "fail", ["no-kernel-image"])))
    deep = json.loads(render_json(_report("deep", "fail", ["no-kernel-image", "no-kernel-image"])))
    deep["results"][0]["details"] = {"matrix": {"CUDNN_ATTENTION": {"float16/d64": "ok"}}}
    d = diff.diff_reports(quick, deep, kb=(), emits={})
    assert not d.verdicts_changed and d.levels_differ
    assert json.loads(diff.render_json(d))["levels_differ"] is True
    assert "levels quick / deep" in diff.summary_line(d)
    console = Console(width=200, record=True, color_system=None)
    diff.render_text(d, console)
    text = console.export_text()
    assert "A ran at the quick level and B at the deep level" in text
    assert "Every probe has the same verdict" in text
    assert "A ran at the quick level" in diff.render_markdown(d)
    same = diff.diff_reports(deep, deep, kb=(), emits={})
    assert not same.levels_differ and "levels" not in diff.summary_line(same)
    # A report from before levels ran the full matrices: it meets a deep report as an equal.
    old = json.loads(render_json(_report(None)))
    assert not diff.diff_reports(old, deep, kb=(), emits={}).levels_differ


def test_fleet_merge_warns_when_nodes_scanned_at_different_levels(tmp_path):
    import fleet_synth as fs
    from gpudoctor.fleet.merge import MergeOptions, merge_files

    reports = [fs.node_report(i, nodes=3) for i in range(3)]
    reports[0]["level"], reports[1]["level"] = "quick", "quick"  # the third predates levels: deep
    data = merge_files(fs.write(tmp_path, reports), MergeOptions())
    drift = [f for f in data["findings"] if f["kind"] == "version-drift" and f["key"] == "scan level"]
    assert len(drift) == 1 and drift[0]["severity"] == "warning", data["findings"]
    same = [fs.node_report(i, nodes=2) for i in range(2)]
    for r in same:
        r["level"] = "quick"
    assert merge_files(fs.write(tmp_path, same, prefix="same"), MergeOptions())["findings"] == []


# --- the CLI: --level reaches the probe in its worker and the report records it -------------------

FAKE_OK = ["--probe-file", str(Path(__file__).parent / "fixtures" / "fake_probes" / "ok.py"), "--probe", "fake-ok"]


@pytest.mark.parametrize("given, level", [((), "quick"), (("--level", "deep"), "deep"), (("--level", "QUICK"), "quick")])
def test_scan_level_travels_to_the_worker_and_into_the_report(given, level):
    from typer.testing import CliRunner

    from gpudoctor.cli import app

    result = CliRunner().invoke(app, ["scan", *FAKE_OK, *given, "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["level"] == level and data["invocation"]["options"]["level"] == level
    (probe,) = data["results"]
    assert probe["details"]["options"]["level"] == level  # what ctx.options held in the worker
    text = CliRunner().invoke(app, ["scan", *FAKE_OK, *given])
    assert f"at the {level} level" in text.stdout


def test_an_unknown_level_is_one_line_and_exit_code_2():
    from typer.testing import CliRunner

    from gpudoctor.cli import app

    result = CliRunner().invoke(app, ["scan", *FAKE_OK, "--level", "long"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "quick or deep" in lines[0] and "Traceback" not in result.output
