"""The isolated runner: fake probes that segfault, abort, hang, exit, print garbage, raise and hog
memory are results, the healthy ones still pass, and no process outlives the scan."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import time

import pytest

from gpudoctor import runner
from gpudoctor.probes.base import Status
from gpudoctor.runner import ScanOptions, UsageError, resolve_device, run_scan
from gpudoctor.worker import jsonable

FAKES = pathlib.Path(__file__).parent / "fixtures" / "fake_probes"


def fake(*names: str) -> tuple[str, ...]:
    return tuple(str(FAKES / f"{name}.py") for name in names)


def options(*names: str, **kw) -> ScanOptions:
    kw.setdefault("collect_environment", False)
    return ScanOptions(probe_files=fake(*names), builtin=False, entry_points=False, **kw)


def _children(pid: int) -> list[str]:
    """Live (non-zombie) processes whose parent is `pid`, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(stat[:80])
    return found


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_faults_become_results_and_nothing_survives(tmp_path, monkeypatch):
    pidfile = tmp_path / "hang.pids"
    monkeypatch.setenv("GPUDOCTOR_FAKE_PIDFILE", str(pidfile))
    opts = options("ok", "noisy", "raises", "ok", "segfault", "abort", "hang", "exit3", "garbage",
                   "ok", "memhog", "ok", "broken_import")
    report = run_scan(opts)

    by_id: dict[str, list] = {}
    for r in report.results:
        by_id.setdefault(r.probe, []).append(r)
    ok = by_id["fake-ok"]
    assert [r.status for r in ok] == [Status.PASS] * 4
    assert by_id["fake-noisy"][0].status is Status.PASS  # prints never reach the protocol

    raised = by_id["fake-raise"][0]
    assert raised.status is Status.CRASHED
    assert raised.summary == "RuntimeError: fake failure 42"
    assert "raises.py" in raised.stderr_tail and raised.signal is None
    # The worker survived the exception: the probe after it ran in the same process.
    assert ok[1].details["pid"] == ok[0].details["pid"] == by_id["fake-noisy"][0].details["pid"]

    seg = by_id["fake-segfault"][0]
    assert (seg.status, seg.signal, seg.exit_code) == (Status.CRASHED, "SIGSEGV", None)
    assert "Segmentation fault" in seg.stderr_tail and len(seg.stderr_tail) <= runner.STDERR_TAIL
    abort = by_id["fake-abort"][0]
    assert (abort.status, abort.signal) == (Status.CRASHED, "SIGABRT")
    assert "assertion failed in a fake kernel" in abort.stderr_tail
    hang = by_id["fake-hang"][0]
    assert hang.status is Status.TIMED_OUT and "1.5 s" in hang.summary
    assert "waiting forever" in hang.stderr_tail and hang.duration_s > 1.4
    exited = by_id["fake-exit"][0]
    assert (exited.status, exited.exit_code, exited.signal) == (Status.CRASHED, 3, None)
    assert "leaving now" in exited.stderr_tail
    garbage = by_id["fake-garbage"][0]
    assert garbage.status is Status.CRASHED and "garbage on the protocol channel" in garbage.summary
    hog = by_id["fake-memhog"][0]
    assert hog.status is Status.CRASHED and hog.summary == "MemoryError"
    broken = by_id["broken-import"][0]
    assert broken.status is Status.CRASHED and "gpudoctor_no_such_module" in broken.summary

    # A fresh worker after each death; the isolated probe had one of its own.
    assert len({ok[1].details["pid"], ok[2].details["pid"], ok[3].details["pid"]}) == 3
    assert report.has_problems

    # Details JSON cannot carry were coerced, and the whole report serialises strictly.
    assert ok[0].details["nan"] == "nan" and ok[0].details["pairs"] == {"(1, 2)": "tuple key"}
    json.dumps(report.to_dict(), allow_nan=False)

    # No worker, and not the child the hanging probe started, outlives the scan.
    worker_pid, child_pid = map(int, pidfile.read_text().split())
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a speed claim
    while (_alive(child_pid) or _alive(worker_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid) and not _alive(worker_pid)
    assert _children(os.getpid()) == []


@pytest.mark.torch
def test_device_fallback_needs_and_cwd_shadowing(tmp_path, monkeypatch):
    # A torch.py in the cwd would shadow torch if the worker kept '' on sys.path.
    (tmp_path / "torch.py").write_text("raise SystemExit('the cwd shadowed torch')\n")
    monkeypatch.chdir(tmp_path)
    report = run_scan(options("torch_ok", "needs_cuda", "needs_xformers", "ok",
                              collect_environment=True, attn_shape=(1, 2, 64, 32)))
    res = {r.probe: r for r in report.results}
    torch_env = report.environment["torch"]
    assert torch_env["import_s"] > 0 and "system" in report.environment
    if torch_env.get("cuda_available"):
        assert res["fake-torch"].device == "cuda:0" and res["fake-cuda"].status is Status.PASS
    else:
        moved = res["fake-torch"]
        assert (moved.status, moved.device) == (Status.PASS, "cpu")
        assert moved.details["requested_device"] == "cuda:0"
        assert moved.details["device_note"] == torch_env["cuda_unavailable_reason"]
        skip = res["fake-cuda"]
        assert skip.status is Status.SKIPPED and skip.summary.startswith("needs a CUDA device")
    assert res["fake-xformers"].status is Status.SKIPPED
    assert "xformers is not installed" in res["fake-xformers"].summary
    assert res["fake-ok"].details["options"] == {"attn_shape": [1, 2, 64, 32], "requested_device": "cuda:0"}


def test_cpu_device_has_no_note_and_probe_selection():
    report = run_scan(options("ok", "raises", "noisy", device="cpu", probes=("fake-ok", "fake-raise"),
                              skip=("fake-raise",)))
    assert [r.probe for r in report.results] == ["fake-ok"]
    assert report.results[0].device == "cpu" and "requested_device" not in report.results[0].details
    assert not report.has_problems


def test_unknown_probe_is_a_usage_error_with_a_suggestion():
    with pytest.raises(UsageError, match=r"unknown probe 'fake-okk' \(did you mean 'fake-ok'\?\)"):
        run_scan(options("ok", probes=("fake-okk",)))
    assert _children(os.getpid()) == []


def test_bad_python_and_device_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such executable"):
        run_scan(options("ok", python=str(tmp_path / "nope")))
    with pytest.raises(UsageError, match="not a working Python"):
        runner.resolve_python("/bin/true")
    with pytest.raises(UsageError, match="--device"):
        run_scan(options("ok", device="cuda:zero"))


def test_list_probes_needs_no_torch_and_reports_load_errors():
    probes, errors = runner.list_probes(options("ok", "hang", "broken_import"))
    assert [p["id"] for p in probes] == ["fake-ok", "fake-hang"]
    assert probes[1]["timeout_s"] == 1.5 and probes[0]["needs"] == []
    assert len(errors) == 1 and "gpudoctor_no_such_module" in errors[0]["error"]


@pytest.mark.torch
def test_other_interpreter_without_gpudoctor(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    # torch lives in our venv, not the base interpreter: expose that folder (a bare path entry, so
    # its .pth files, gpudoctor's editable finder among them, are not processed).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(site, "torch_from_test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(python), "-c", "import gpudoctor"], capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0, "gpudoctor must not be importable in the target"

    # An extra probe offered by a package of the target through the entry-point group.
    pathlib.Path(site, "gd_extra_probe.py").write_text((FAKES / "once.py").read_text().replace(
        "fake-once", "fake-entry-point"))
    dist = pathlib.Path(site, "gd_extra_probe-0.1.dist-info")
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gd-extra-probe\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.probes]\nextra = gd_extra_probe\n")

    report = run_scan(ScanOptions(python=str(python), probe_files=fake("ok", "torch_ok"), builtin=False,
                                  collect_environment=False))
    assert [(r.probe, r.status) for r in report.results] == [
        ("fake-ok", Status.PASS), ("fake-torch", Status.PASS), ("fake-entry-point", Status.PASS)]
    assert report.results[0].details["python"] == str(python)
    assert report.environment["scan"]["python"] == str(python)


def test_memory_budget_skips_a_busy_gpu(monkeypatch):
    class Worker:
        torch_info = {"cuda_available": True}

    calls = []
    monkeypatch.setattr(runner, "gpu_free_memory", lambda index: calls.append(index) or 100 << 20)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    scan = runner._Scan(ScanOptions(), sys.executable, None)
    task = runner._Task({"gpu_memory_mib": 512, "needs": ["torch"]}, "cuda:1", True)
    reason = scan._memory_skip(task, "cuda:1", Worker())
    assert reason.startswith("the GPU is busy: 100 MiB free on cuda:1") and "512 MiB" in reason
    assert calls == [3]  # cuda:1 under CUDA_VISIBLE_DEVICES=2,3 is NVML's GPU 3
    assert scan._memory_skip(task, "cpu", Worker()) is None


def test_resolve_device():
    no_cuda = {"importable": True, "cuda_available": False, "cuda_unavailable_reason": "no driver"}
    two = {"importable": True, "cuda_available": True, "device_count": 2}
    assert resolve_device("cuda:0", no_cuda) == ("cpu", "no driver")
    assert resolve_device("cuda:1", two) == ("cuda:1", None)
    assert resolve_device("cuda:2", two) == ("cpu", "cuda:2 does not exist: 2 CUDA device(s) visible")
    assert resolve_device("privateuseone:0", two) == ("privateuseone:0", None)
    assert resolve_device("cuda:0", {}) == ("cuda:0", None)  # torch not imported: no opinion


def test_jsonable_coerces_instead_of_dying():
    class Bad:
        def __repr__(self):
            raise RuntimeError("no repr")

    out = jsonable({"x": float("inf"), (1, 2): {3}, "bad": Bad(), "s": Status.PASS})
    assert out == {"x": "inf", "(1, 2)": [3], "bad": "<unrepresentable Bad: no repr>", "s": "pass"}
    json.dumps(out, allow_nan=False)


def test_device_all_runs_per_scan_probes_once():
    report = run_scan(options("once", "torch_ok", device="all"))
    devices = report.environment["scan"]["devices"]
    count = report.environment["torch"].get("device_count") or 0
    assert devices == ([f"cuda:{i}" for i in range(count)] or ["cuda:0"])
    once = [r for r in report.results if r.probe == "fake-once"]
    assert len(once) == 1 and once[0].device is None and once[0].status is Status.PASS
    assert len([r for r in report.results if r.probe == "fake-torch"]) == len(devices)


@pytest.mark.gpu
def test_poisoned_cuda_context_gets_a_fresh_worker():
    report = run_scan(options("poison", "torch_ok", "ok"))
    poison, after, ok = report.results
    assert poison.details.get("context_poisoned"), poison.details
    assert after.status is Status.PASS and after.device == "cuda:0"
    assert report.environment["scan"]["workers"] == 2
