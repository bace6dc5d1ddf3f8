"""Tests for the `shape-sync` probe: real op counts and timings on the CPU, the status rule, and the
CUDA sync counting where a GPU exists."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.probes import shape_sync  # noqa: E402
from gpudoctor.probes.base import ProbeContext, Status  # noqa: E402


@pytest.fixture(scope="module")
def cpu_outcome():
    return shape_sync.run(ProbeContext(torch=torch, device="cpu"))


def test_counts_ops_and_conversions_on_cpu(cpu_outcome):
    v = cpu_outcome.details["variants"]
    # Field note 000's original: two multiplications on tensors, one int() at the end.
    assert v["tensor-arithmetic"]["calls"] == ["mul", "mul", "__int__"]
    assert (v["tensor-arithmetic"]["tensor_ops"], v["tensor-arithmetic"]["host_conversions"]) == (2, 1)
    # Its fix converts every value: three conversions, i.e. three syncs on CUDA instead of one.
    assert (v["int-each"]["tensor_ops"], v["int-each"]["host_conversions"]) == (0, 3)
    assert v["python-ints"]["calls"] == []
    expected = shape_sync.SHAPE[0] * shape_sync.SHAPE[1] * shape_sync.SHAPE[2]
    assert all(e["value"] == expected and e["correct"] for e in v.values())
    assert "syncs" not in v["tensor-arithmetic"]  # there is no device sync on the CPU


def test_timings_are_details_only(cpu_outcome):
    v = cpu_outcome.details["variants"]
    assert all(e["per_call_us"] > 0 for e in v.values())
    assert "per call" in cpu_outcome.details["timing"]
    assert " us" not in cpu_outcome.summary


class _LoadedClock:
    """A perf_counter on a machine so loaded that every reading is seconds after the last one,
    by a different amount each time."""

    def __init__(self):
        self.now = 0.0
        self.step = 0

    def perf_counter(self):
        self.step += 1
        self.now += 0.5 + (self.step * 7919 % 13)
        return self.now

    monotonic = perf_counter


def test_the_verdict_and_summary_do_not_depend_on_machine_load(cpu_outcome, monkeypatch):
    import types

    monkeypatch.setattr(shape_sync, "time", types.SimpleNamespace(perf_counter=_LoadedClock().perf_counter))
    loaded = shape_sync.run(ProbeContext(torch=torch, device="cpu"))
    assert (loaded.status, loaded.summary, loaded.findings) == \
        (cpu_outcome.status, cpu_outcome.summary, cpu_outcome.findings)
    assert loaded.details["timing"] != cpu_outcome.details["timing"]  # the clock really was different


def test_measured_cost_is_information_not_a_finding(cpu_outcome):
    assert cpu_outcome.status is Status.PASS and cpu_outcome.findings == []
    assert shape_sync.SPEC.emits == ()
    assert cpu_outcome.summary == (
        "a token count from shape values held as cpu tensors: multiplying them takes 2 tensor operations "
        "and 1 conversion to int; calling int() on each first takes 3 conversions; plain Python ints "
        "(x.shape[i]) take no torch calls")
    json.dumps(cpu_outcome.to_dict())


def test_healthy_gpu_passes_with_the_syncs_in_the_details(monkeypatch):
    # Audit D11: int() on a device tensor always syncs, so every healthy GPU used to WARN with a
    # misaligned-address finding. Syncs are counted by the (simulated) sync debug mode.
    import cudasim

    monkeypatch.setattr(shape_sync, "BUSY_SIZE", 64)
    with cudasim.simulated(fast_gemm=True) as (sim_torch, state):
        outcome = shape_sync.run(ProbeContext(torch=sim_torch, device="cuda:0"))
        assert state.sync_debug == 0  # restored
    v = outcome.details["variants"]
    assert (v["tensor-arithmetic"]["syncs"], v["int-each"]["syncs"], v["python-ints"]["syncs"]) == (1, 3, 0)
    assert outcome.status is Status.PASS and outcome.findings == []
    assert "(1 GPU sync)" in outcome.summary and "(3 GPU syncs)" in outcome.summary
    assert "(no GPU syncs)" in outcome.summary
    assert "blocks the host" in outcome.details["blocked_behind_queue"]


def test_note_states_the_measurable_claim(cpu_outcome):
    note = cpu_outcome.details["note"]
    assert "cannot itself cause a misaligned address" in note
    assert "int() line" in note


def test_count_calls_sees_item():
    t = torch.tensor(3.0)
    counted = shape_sync.count_calls(torch, lambda: (t + 1).item())
    assert counted == {"calls": ["add", "item"], "tensor_ops": 1, "host_conversions": 1}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_counts_syncs_and_restores_debug_mode():
    before = torch.cuda.get_sync_debug_mode()
    outcome = shape_sync.run(ProbeContext(torch=torch, device="cuda:0"))
    assert torch.cuda.get_sync_debug_mode() == before
    v = outcome.details["variants"]
    assert v["tensor-arithmetic"]["syncs"] >= 1
    assert v["int-each"]["syncs"] >= 3
    assert v["python-ints"]["syncs"] == 0
    assert outcome.status is Status.PASS and outcome.findings == []
    assert v["tensor-arithmetic"]["blocked_behind_queue_ms"] > v["python-ints"]["blocked_behind_queue_ms"]
