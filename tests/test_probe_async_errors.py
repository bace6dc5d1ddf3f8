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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_error_surfaces_at_launch_only_with_launch_blocking():
    outcome = async_errors.run(ProbeContext(torch=torch, device="cuda:0"))
    assert outcome.details["launch_blocking"]["error_stage"] == "launch"
    assert outcome.details["default"]["error_stage"] in async_errors.STAGES
    assert outcome.details["default"]["classified"]["kb_id"] == "device-side-assert"
    assert outcome.status in (Status.PASS, Status.WARN)
