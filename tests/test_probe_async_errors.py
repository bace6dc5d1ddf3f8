"""Tests for the `async-errors` probe: the error classifier on real CUDA error texts, the environment
checks, the CPU experiment (in-process and in a child interpreter), and the CUDA run where a GPU
exists."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.probes import async_errors  # noqa: E402
from gpudoctor.probes.base import ProbeContext, Status  # noqa: E402

TRAILER_215 = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)
ASSERT_215 = (
    "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n" + TRAILER_215
)
ASSERT_2023 = (
    "RuntimeError: CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
INDEX_SELECT_ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1237: indexSelectSmallIndex: block: [0,0,0], "
    "thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed."
)
MISALIGNED = (
    "torch.AcceleratorError: CUDA error: misaligned address\n"
    "Search for `cudaErrorMisalignedAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n" + TRAILER_215
)
ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered\n" + TRAILER_215 + "."
LAUNCH_FAILURE = "RuntimeError: CUDA error: unspecified launch failure\n" + TRAILER_215
OOM_STYLE = (
    "torch.AcceleratorError: CUDA error: out of memory\n"
    "For more detailed error information, run with CUDA_LOG_FILE=stderr"
)


@pytest.mark.parametrize(
    ("text", "kb_id", "cuda_error"),
    [
        (ASSERT_215, "device-side-assert", "device-side assert triggered"),
        (ASSERT_2023, "device-side-assert", "device-side assert triggered"),
        (INDEX_SELECT_ASSERT, "device-side-assert", None),
        (MISALIGNED, "misaligned-address", "misaligned address"),
        (ILLEGAL, "illegal-memory-access", "an illegal memory access was encountered"),
        (LAUNCH_FAILURE, "async-error-reporting", "unspecified launch failure"),
        (OOM_STYLE, None, "out of memory"),
        ("IndexError: index 10 is out of bounds for dimension 0 with size 4", None, None),
    ],
)
def test_classify_cuda_error(text, kb_id, cuda_error):
    got = async_errors.classify_cuda_error(text)
    assert got.kb_id == kb_id
    assert got.cuda_error == cuda_error


def test_classify_trailer_variants():
    new = async_errors.classify_cuda_error(ASSERT_215)
    old = async_errors.classify_cuda_error(ASSERT_2023)
    assert new.asynchronous_hint and new.launch_blocking_hint and not new.dsa_hint
    assert old.asynchronous_hint and old.launch_blocking_hint and old.dsa_hint
    both = async_errors.classify_cuda_error(INDEX_SELECT_ASSERT + "\n" + ASSERT_215)
    assert both.assertion == "srcIndex < srcSelectDimSize"
    assert async_errors.classify_cuda_error(OOM_STYLE).launch_blocking_hint is False


def test_environment_flags_build_time_dsa_switch():
    seen, findings = async_errors.environment_checks(
        {"TORCH_USE_CUDA_DSA": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    )
    assert seen["launch_blocking_active"] is True
    assert [f.kb_id for f in findings] == ["device-side-assert"]
    assert "build-time" in findings[0].summary
    assert any("PYTORCH_USE_CUDA_DSA=1" in e for e in findings[0].evidence)
    seen, findings = async_errors.environment_checks({"PYTORCH_USE_CUDA_DSA": "1"})
    assert findings == [] and seen["launch_blocking_active"] is False


def test_cpu_run_is_synchronous(monkeypatch):
    monkeypatch.delenv("TORCH_USE_CUDA_DSA", raising=False)
    outcome = async_errors.run(ProbeContext(torch=torch, device="cpu"))
    assert outcome.status is Status.PASS
    assert outcome.details["default"]["error_stage"] == "launch"
    assert outcome.details["default"]["stages_ok"] == []
    assert outcome.details["default"]["error"] == (
        "IndexError: index 10 is out of bounds for dimension 0 with size 4"
    )
    assert "synchronous" in outcome.summary and "needs CUDA" in outcome.summary
    json.dumps(outcome.to_dict())


def test_cpu_run_warns_about_runtime_dsa_flag(monkeypatch):
    monkeypatch.setenv("TORCH_USE_CUDA_DSA", "1")
    outcome = async_errors.run(ProbeContext(torch=torch, device="cpu"))
    assert outcome.status is Status.WARN
    assert outcome.details["environment"]["TORCH_USE_CUDA_DSA"] == "1"
    assert {f.kb_id for f in outcome.findings} <= set(async_errors.SPEC.emits)


def test_child_experiment_on_cpu_stops_at_launch():
    # The same child program the CUDA path runs; on the CPU the error is at the launch line.
    rec = async_errors.run_experiment("cpu", launch_blocking=True)
    assert rec["outcome"] == "ok", rec
    assert rec["error_stage"] == "launch" and rec["stages_ok"] == []
    assert "index 10 is out of bounds" in rec["error"]


def test_child_timeout_is_a_result():
    assert async_errors.run_experiment("cpu", False, timeout_s=0.01)["outcome"] == "timed-out"


def test_child_cannot_import_a_torch_folder_from_the_working_directory(tmp_path, monkeypatch):
    # Audit D19: `python -c` puts the working directory first on sys.path.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('a pytorch source tree')\n")
    monkeypatch.chdir(tmp_path)
    rec = async_errors.run_experiment("cpu", launch_blocking=True)
    assert rec["outcome"] == "ok", rec
    assert rec["error_stage"] == "launch"


def test_launch_blocking_child_starts_before_the_in_process_experiment(monkeypatch):
    # The child (a second torch import and CUDA context) runs while the worker's experiment does.
    # CUDA is simulated in-process; the child really runs, on the CPU (no GPU here).
    import subprocess

    import cudasim

    real_popen = subprocess.Popen
    with cudasim.simulated() as (sim_torch, state):
        def popen(cmd, *args, **kwargs):
            state.log.append(("popen", cmd[-1]))
            return real_popen([*cmd[:-1], "cpu"], *args, **kwargs)

        monkeypatch.setattr(async_errors.subprocess, "Popen", popen)
        monkeypatch.delenv("TORCH_USE_CUDA_DSA", raising=False)
        outcome = async_errors.run(ProbeContext(torch=sim_torch, device="cuda:0"))
    names = [name for name, _ in state.log]
    assert names.index("popen") < names.index("synchronize")
    assert ("popen", "cuda:0") in state.log
    # In-process the device-side assert surfaces late; the child reports it at the launch.
    assert outcome.details["default"]["error_stage"] == "synchronize"
    assert outcome.details["launch_blocking"]["error_stage"] == "launch"
    # How CUDA works on every healthy GPU is information with its explanations, not a finding.
    assert outcome.status is Status.PASS and outcome.findings == []
    assert outcome.details["observed"]["late_reporting"] is True
    assert outcome.details["observed"]["explained_by"] == [
        "gpudoctor explain async-error-reporting", "gpudoctor explain device-side-assert"]


def _scan_async_errors(device: str):
    from gpudoctor.scan.runner import ScanOptions, run_scan

    report = run_scan(ScanOptions(probes=("async-errors",), device=device, collect_environment=False))
    (result,) = [r for r in report.results if r.probe == "async-errors"]
    return result


@pytest.mark.slow
def test_scan_runs_async_errors_out_of_the_test_process():
    # The same path the GPU test takes: the probe runs in a worker, never in pytest's process.
    result = _scan_async_errors("cpu")
    assert result.status in (Status.PASS, Status.PASS.value), result.summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_error_surfaces_at_launch_only_with_launch_blocking():
    # Audit D3: run in-process, the device-side assert would poison this pytest process and
    # fail every GPU test after it. run_scan gives the probe a worker of its own.
    result = _scan_async_errors("cuda:0")
    details = result.details
    assert details["launch_blocking"]["error_stage"] == "launch"
    assert details["default"]["error_stage"] in async_errors.STAGES
    assert details["default"]["classified"]["kb_id"] == "device-side-assert"
    assert result.status in (Status.PASS, Status.PASS.value), result.summary
    assert result.findings == []  # a healthy GPU: the behaviour is in the details
    assert "context_poisoned" in details
