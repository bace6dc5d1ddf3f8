"""Tests of the cuda-runtime probe: the text classifier on torch's real messages, the
CUDA_VISIBLE_DEVICES check, the timed workload on the CPU, and the verdicts a CPU-only torch gets."""
from __future__ import annotations

import json

import pytest
import torch

from gpudoctor.probes import cuda_runtime
from gpudoctor.probes.base import ProbeContext, Status

# Real texts: torch/cuda/__init__.py, c10/cuda (REFERENCE.md section 7) and user reports.
DRIVER_OLD = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). "
              "Please update your GPU driver by downloading and installing a new version from the URL: "
              "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to "
              "install a PyTorch version that has been compiled with your version of the CUDA driver.")
NO_IMAGE = ("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
            "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
             "a driver from http://www.nvidia.com/Download/index.aspx")
UNKNOWN = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, "
           "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available "
           "devices to be zero.")


@pytest.mark.parametrize("text, kb_id", [
    (DRIVER_OLD, "driver-too-old"),
    (NO_IMAGE, "no-kernel-image"),
    (NO_DRIVER, "cuda-unavailable"),
    (UNKNOWN, "cuda-unavailable"),
    ("AssertionError: Torch not compiled with CUDA enabled", "cuda-unavailable"),
    ("RuntimeError: CUDA error: out of memory", None),
])
def test_classify_real_texts(text, kb_id):
    assert cuda_runtime.classify(text) == kb_id


@pytest.mark.parametrize("value, hides", [
    (None, False), ("0", False), ("0,1", False), ("GPU-8f2c1a", False),
    ("", True), ("-1", True), ("abc", True), ("-1,0", True),
])
def test_visible_devices(value, hides):
    assert (cuda_runtime.visible_devices_problem(value) is not None) == hides


def test_workload_runs_and_checks_its_result_on_cpu():
    got = cuda_runtime.run_steps(torch, "cpu", n=1000)
    assert got["correct"] and got["result"] == 1000 * 999 / 2
    assert set(got["steps_ms"]) == {"allocate", "launch", "synchronize", "free"}
    assert all(v >= 0 for v in got["steps_ms"].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict of a torch without CUDA")
def test_cpu_only_torch_fails_when_a_gpu_scan_was_asked():
    out = cuda_runtime.run(ProbeContext(torch=torch, device="cpu", options={"requested_device": "cuda:0"}))
    assert out.status is Status.FAIL
    assert [f.kb_id for f in out.findings] == ["cuda-unavailable"]
    if torch.version.cuda is None:  # a CPU-only build; a CUDA build without a GPU says "no driver"
        assert "torch.version.cuda = None" in out.findings[0].evidence
    assert out.findings[0].severity == "error"
    assert cuda_runtime.run(ProbeContext(torch=torch, device="cpu",
                                         options={"requested_device": "all"})).status is Status.FAIL


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict of a torch without CUDA")
@pytest.mark.parametrize("options", [{"requested_device": "auto"}, {}])
def test_auto_fallback_to_the_cpu_is_a_warning(options):
    # TEAM decision: with no --device the scan falls back to the CPU and says why, as a warning.
    out = cuda_runtime.run(ProbeContext(torch=torch, device="cpu", options=options))
    assert out.status is Status.WARN
    (finding,) = out.findings
    assert finding.kb_id == "cuda-unavailable" and finding.severity == "warning"
    assert "the scan ran on cpu" in out.summary


@pytest.mark.parametrize("requested", ["cpu", "privateuseone:0"])
def test_explicit_non_cuda_request_skips_with_reason(requested):
    out = cuda_runtime.run(ProbeContext(torch=torch, device=requested.replace("privateuseone:0", "cpu"),
                                        options={"requested_device": requested}))
    assert out.status is Status.SKIPPED and "was asked for" in out.summary
    assert out.findings == []


def test_a_poisoned_launch_is_a_result_not_a_crash():
    # A sticky error in the tiny kernel: the probe reports it; empty_cache is not tried (D1).
    import cudasim

    with cudasim.simulated() as (sim_torch, state):
        state.poison(cudasim.sticky_text("an illegal memory access was encountered", "cudaErrorIllegalAddress"))
        out = cuda_runtime.run(ProbeContext(torch=sim_torch, device="cuda:1",
                                            options={"requested_device": "cuda:1"}))
    assert out.status is Status.FAIL and "illegal memory access" in out.summary
    assert ("empty_cache", None) not in state.log


def test_hidden_devices_are_the_reason_when_the_build_has_cuda(monkeypatch):
    fake_version = type("V", (), {"cuda": "12.8", "hip": None})
    fake_cuda = type("C", (), {"is_available": staticmethod(lambda: False),
                               "device_count": staticmethod(lambda: 0),
                               "init": staticmethod(lambda: None)})
    fake_torch = type("T", (), {"version": fake_version, "cuda": fake_cuda, "__version__": "2.8.0+cu128"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    kb_id, reason, _ = cuda_runtime.why_unavailable(fake_torch)
    assert kb_id == "cuda-unavailable" and "CUDA_VISIBLE_DEVICES" in reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_runtime_passes():
    out = cuda_runtime.run(ProbeContext(torch=torch, device="cuda:0", options={"requested_device": "cuda:0"}))
    assert out.status is Status.PASS and out.findings == [], out.summary
    assert out.details["correct"] and "context" in out.details["steps_ms"]


def _fake_torch(cuda_version, error=None, version="2.8.0+cu128"):
    def init():
        if error:
            raise RuntimeError(error)

    fake_version = type("V", (), {"cuda": cuda_version, "hip": None})
    fake_cuda = type("C", (), {"is_available": staticmethod(lambda: False),
                               "device_count": staticmethod(lambda: 0), "init": staticmethod(init)})
    return type("T", (), {"version": fake_version, "cuda": fake_cuda, "__version__": version})


def _unavailable(monkeypatch, tmp_path, fake_torch, driver_text):
    """The probe's finding under `--device cuda:0` on a machine whose /proc driver file says
    `driver_text` (None: no driver loaded)."""
    path = tmp_path / "version"
    if driver_text is not None:
        path.write_text(driver_text)
    monkeypatch.setattr(cuda_runtime, "DRIVER_FILE", str(path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = cuda_runtime.run(ProbeContext(torch=fake_torch, device="cpu", options={"requested_device": "cuda:0"}))
    assert out.status is Status.FAIL
    [finding] = out.findings
    assert finding.kb_id == "cuda-unavailable"
    return finding


DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 2025\nGCC version: gcc 12\n"


def test_cpu_only_build_without_a_driver_leads_with_the_driver(monkeypatch, tmp_path):
    """The reviewer's machine: a CPU-only torch and no NVIDIA driver. No CUDA build of torch runs
    without a driver, so the default page's one step is the driver; the CUDA build of the same
    torch (with the index to install it from) comes second; nothing about nvidia_uvm."""
    finding = _unavailable(monkeypatch, tmp_path, _fake_torch(None, version="2.13.0+cpu"), None)
    first, second = finding.steps
    assert "install the driver" in first
    assert "CPU-only build" in second and "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu" in second
    assert not any("nvidia_uvm" in s for s in finding.steps)
    assert any("missing" in e for e in finding.evidence)


def test_cpu_only_build_with_a_driver_names_it(monkeypatch, tmp_path):
    finding = _unavailable(monkeypatch, tmp_path, _fake_torch(None, version="2.13.0+cpu"), DRIVER)
    assert len(finding.steps) == 1 and "driver 570.86.15 supports" in finding.steps[0]


def test_cuda_build_without_a_driver_wants_the_driver(monkeypatch, tmp_path):
    finding = _unavailable(monkeypatch, tmp_path, _fake_torch("12.8", "Found no NVIDIA driver on your system."), None)
    assert len(finding.steps) == 1 and "install the driver" in finding.steps[0]


def test_driver_loaded_but_init_failing_is_the_uvm_case(monkeypatch, tmp_path):
    finding = _unavailable(monkeypatch, tmp_path, _fake_torch("12.8", "CUDA unknown error - this may be due to an "
                                                              "incorrectly set up environment"), DRIVER)
    assert len(finding.steps) == 1 and "nvidia_uvm" in finding.steps[0] and "570.86.15" in finding.steps[0]


def test_the_steps_replace_the_entrys_generic_list_in_the_report(monkeypatch, tmp_path):
    """Rendered (-v and Markdown) the finding's own steps stand where the entry's list would, and
    survive the JSON round trip and its schema."""
    from gpudoctor.reports import render
    from gpudoctor.reports.model import ProbeResult, Report, report_from_dict

    finding = _unavailable(monkeypatch, tmp_path, _fake_torch(None, version="2.13.0+cpu"), None)
    report = Report(results=[ProbeResult(probe="cuda-runtime", title="t", status=Status.FAIL, summary="s",
                                         duration_s=0.1, device=None, findings=[finding])])
    again = report_from_dict(json.loads(render.render_json(report)))
    assert again.results[0].findings[0].steps == finding.steps
    md = render.render_markdown(again)
    assert "1. no NVIDIA driver is loaded here" in md and "2. torch 2.13.0+cpu is a CPU-only build" in md
    assert "nvidia_uvm" not in md
