"""The isolated runner: fake probes that segfault, abort, hang, exit, print garbage, raise and hog
memory are results, the healthy ones still pass, and no process outlives the scan; devices are
placed as TEAM.md decided (auto, explicit CUDA without CUDA, bad devices); the GPU memory check
reads NVML once per scan and checks the right GPU or says it cannot."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

from gpudoctor.scan import runner
from gpudoctor.probes.base import Status
from gpudoctor.scan.runner import ScanOptions, UsageError, run_scan
from gpudoctor.scan.worker import jsonable

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


def _cuda_available() -> bool:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True)
    return out.stdout.strip().endswith("True")


def clone(tmp_path: pathlib.Path, name: str, new_id: str) -> str:
    """A copy of a fake probe under another id (ids are unique in a scan)."""
    old_id = {"ok": "fake-ok", "torch_ok": "fake-torch"}[name]
    path = tmp_path / f"{new_id.replace('-', '_')}.py"
    path.write_text((FAKES / f"{name}.py").read_text().replace(f'id="{old_id}"', f'id="{new_id}"'))
    return str(path)


def test_faults_become_results_and_nothing_survives(tmp_path, monkeypatch):
    pidfile = tmp_path / "hang.pids"
    monkeypatch.setenv("GPUDOCTOR_FAKE_PIDFILE", str(pidfile))
    ok2, ok3, ok4 = (clone(tmp_path, "ok", f"fake-ok-{i}") for i in (2, 3, 4))
    files = [*fake("ok", "noisy", "raises"), ok2, *fake("segfault", "abort", "hang", "exit3", "garbage"),
             ok3, *fake("memhog"), ok4, *fake("broken_import")]
    report = run_scan(ScanOptions(probe_files=tuple(files), builtin=False, entry_points=False,
                                  collect_environment=False))

    by_id: dict[str, list] = {}
    for r in report.results:
        by_id.setdefault(r.probe, []).append(r)
    assert all(len(results) == 1 for results in by_id.values())
    ok = [by_id[i][0] for i in ("fake-ok", "fake-ok-2", "fake-ok-3", "fake-ok-4")]
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
    assert "waiting forever" in hang.stderr_tail
    exited = by_id["fake-exit"][0]
    assert (exited.status, exited.exit_code, exited.signal) == (Status.CRASHED, 3, None)
    assert "leaving now" in exited.stderr_tail
    garbage = by_id["fake-garbage"][0]
    assert garbage.status is Status.CRASHED and "garbage on the protocol channel" in garbage.summary
    hog = by_id["fake-memhog"][0]
    assert hog.status is Status.CRASHED and hog.summary == "MemoryError"
    broken = by_id["broken-import"][0]
    assert broken.status is Status.CRASHED and "gpudoctor_no_such_module" in broken.summary

    # A fresh worker after each death; the isolated memhog ran last, in a worker of its own, but
    # the report keeps the order of the probe files.
    assert ok[1].details["pid"] != ok[2].details["pid"] == ok[3].details["pid"]  # memhog not between
    ids = [r.probe for r in report.results]
    assert ids.index("fake-memhog") < ids.index("fake-ok-4")
    assert report.has_problems

    # Details JSON cannot carry were coerced, and the whole report serialises strictly.
    assert ok[0].details["nan"] == "nan" and ok[0].details["pairs"] == {"(1, 2)": "tuple key"}
    json.dumps(report.to_dict(), allow_nan=False)

    # No worker, and not the child the hanging probe started, outlives the scan.
    worker_pid, child_pid = map(int, pidfile.read_text().split())
    assert not _alive(child_pid) and not _alive(worker_pid)
    assert _children(os.getpid()) == []


@pytest.mark.torch
def test_auto_device_needs_and_cwd_shadowing(tmp_path, monkeypatch):
    # A torch.py in the cwd would shadow torch if the worker kept '' on sys.path.
    (tmp_path / "torch.py").write_text("raise SystemExit('the cwd shadowed torch')\n")
    monkeypatch.chdir(tmp_path)
    events = []
    report = run_scan(options("torch_ok", "needs_cuda", "needs_xformers", "ok",
                              collect_environment=True, attn_shape=(1, 2, 64, 32)), events.append)
    res = {r.probe: r for r in report.results}
    torch_env = report.environment["torch"]
    assert torch_env["import_s"] > 0 and "system" in report.environment
    # auto: cuda:0 where torch can use CUDA, else the CPU; no note, nothing "moved".
    expected = "cuda:0" if torch_env.get("cuda_available") else "cpu"
    assert report.environment["scan"]["devices"] == [expected]
    assert report.environment["scan"]["requested_device"] == "auto"
    assert res["fake-torch"].status is Status.PASS and res["fake-torch"].device == expected
    assert "device_note" not in res["fake-torch"].details
    if expected == "cpu":
        skip = res["fake-cuda"]
        assert skip.status is Status.SKIPPED and skip.summary.startswith("needs a CUDA device")
    assert res["fake-xformers"].status is Status.SKIPPED
    assert "xformers is not installed" in res["fake-xformers"].summary
    assert res["fake-ok"].details["options"] == {"attn_shape": [1, 2, 64, 32], "requested_device": "auto",
                                                 "level": "quick"}  # the scan's default level
    # Progress says where each probe really runs, before it runs.
    starts = {e.probe: e.device for e in events if e.kind == "start"}
    assert starts["fake-torch"] == expected == res["fake-torch"].device


@pytest.mark.skipif(_cuda_available(), reason="checks the behaviour on a machine without CUDA")
@pytest.mark.torch  # the worker must import torch to know whether CUDA is usable
def test_explicit_cuda_without_cuda_runs_only_what_can_say_why(tmp_path):
    # A probe that can report cuda-unavailable runs (on the CPU, to say why); the other torch
    # probes are skipped with the reason, never moved to the CPU; a probe without torch still runs.
    sayer = tmp_path / "sayer.py"
    sayer.write_text((FAKES / "torch_ok.py").read_text().replace('id="fake-torch"', 'id="fake-sayer"')
                     .replace("timeout_s=30", "timeout_s=30, emits=('cuda-unavailable',)"))
    events = []
    report = run_scan(ScanOptions(probe_files=(*fake("torch_ok", "ok"), str(sayer)), builtin=False,
                                  entry_points=False, collect_environment=False, device="cuda:0"),
                      events.append)
    res = {r.probe: r for r in report.results}
    reason = report.environment["torch"]["cuda_unavailable_reason"]
    assert res["fake-torch"].status is Status.SKIPPED and res["fake-torch"].device == "cuda:0"
    assert res["fake-torch"].summary == f"cuda:0 was asked for, but CUDA is not usable here: {reason}"
    assert res["fake-sayer"].status is Status.PASS and res["fake-sayer"].device == "cpu"
    assert res["fake-sayer"].details["device_note"] == reason
    assert res["fake-sayer"].details["requested_device"] == "cuda:0"
    assert res["fake-ok"].status is Status.PASS
    assert {e.probe: e.device for e in events if e.kind == "start"}["fake-sayer"] == "cpu"


@pytest.mark.torch  # the worker must import torch to know whether CUDA is usable
def test_nonexistent_cuda_index_and_unknown_device_type_are_usage_errors():
    info = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, check=True)
    count = int(info.stdout.split()[-1])
    if count:  # with CUDA, an index past the last device is a usage error
        with pytest.raises(UsageError, match=rf"--device cuda:{count}: no such CUDA device; torch sees {count}"):
            run_scan(options("torch_ok", device=f"cuda:{count}"))
    # torch's own device parser judges other device strings
    with pytest.raises(UsageError, match="--device nosuchdevice:0: RuntimeError"):
        run_scan(options("torch_ok", device="nosuchdevice:0"))
    assert _children(os.getpid()) == []


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


def test_bad_python_device_and_timeouts_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such executable"):
        run_scan(options("ok", python=str(tmp_path / "nope")))
    with pytest.raises(UsageError, match="not a working Python"):
        runner.resolve_python("/bin/true")
    for device in ("cuda:zero", "cuda:-1", "", "gpu 0", "x" * 100):
        with pytest.raises(UsageError, match="--device"):
            run_scan(options("ok", device=device))
    for value in (float("nan"), float("inf"), 1e300, -1.0, 0.0, "5"):
        with pytest.raises(UsageError, match="--timeout .*must be a number of seconds"):
            run_scan(options("ok", timeout=value))
    assert _children(os.getpid()) == []


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


class _FakeNvml:
    """pynvml as far as the memory check uses it: two GPUs, counting nvmlInit calls."""

    def __init__(self, free=(8 << 30, 100 << 20), uuids=("GPU-aaaaaaaa-0000-0000-0000-000000000000",
                                                        "GPU-bbbbbbbb-0000-0000-0000-000000000000")):
        self.free, self.uuids, self.inits, self.shutdowns = free, uuids, 0, 0
        self.names = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.free)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 0

    def nvmlDeviceGetMemoryInfo(self, h):
        class Info:
            free = self.free[h]
        return Info()


def _scan_with(monkeypatch, nv, uuids):
    monkeypatch.setattr("gpudoctor.scan.environment._nvml", lambda: (nv.nvmlInit(), nv)[1])
    scan = runner._Scan(ScanOptions(), sys.executable, None)
    scan.torch_info = {"cuda_available": True}
    scan.hello = {"device_uuids": uuids}
    return scan


def test_memory_budget_uses_one_nvml_session_and_the_device_uuid(monkeypatch):
    nv = _FakeNvml()
    # torch says cuda:0 is the GPU NVML lists second (as CUDA's FASTEST_FIRST order may have it),
    # although CUDA_VISIBLE_DEVICES=0,1 alone suggests NVML's GPU 0.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    scan = _scan_with(monkeypatch, nv, ["bbbbbbbb-0000-0000-0000-000000000000",
                                        "aaaaaaaa-0000-0000-0000-000000000000"])
    from gpudoctor.scan.environment import nvml_info

    assert nvml_info(session=scan.nvml)["device_count"] == 2  # the environment's read, same session
    entry = {"gpu_memory_mib": 512, "needs": ["torch"]}
    reason, note = scan._memory_check(runner._Task(entry, "cuda:0", True))
    assert reason.startswith("the GPU is busy: 100 MiB free on cuda:0") and "512 MiB" in reason
    assert scan._memory_check(runner._Task(entry, "cuda:1", True)) == (None, None)  # 8 GiB free
    assert scan._memory_check(runner._Task(entry, "cpu", True)) == (None, None)
    scan.nvml.close()
    assert (nv.inits, nv.shutdowns) == (1, 1)  # one NVML session for the whole scan (D21)


def test_memory_check_says_so_when_the_gpu_cannot_be_known(monkeypatch):
    nv = _FakeNvml()
    nv.names = ("NVIDIA H100 80GB HBM3", "NVIDIA RTX A4000")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    scan = _scan_with(monkeypatch, nv, [None, None])  # a torch without device UUIDs
    reason, note = scan._memory_check(runner._Task({"gpu_memory_mib": 512, "needs": ["torch"]}, "cuda:1", True))
    assert reason is None  # not skipped on a guess, and not checked against the wrong GPU
    assert note.startswith("free GPU memory not checked: CUDA_DEVICE_ORDER is FASTEST_FIRST and the GPUs differ")
    scan.nvml.close()


@pytest.mark.parametrize("index, uuid, env, names, expected", [
    # torch's UUID settles it, whatever the environment says.
    (0, "58fb8e2b-0f5a-9e07-59b4-7d9d9e10ce6b", {"CUDA_VISIBLE_DEVICES": "3"}, None,
     ("uuid", "58fb8e2b0f5a9e0759b47d9d9e10ce6b")),
    # PCI_BUS_ID order: CUDA's indices are NVML's, through CUDA_VISIBLE_DEVICES.
    (1, None, {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, None, ("index", 3)),
    # FASTEST_FIRST (the default) agrees with bus order only when every GPU is the same model.
    (1, None, {"CUDA_VISIBLE_DEVICES": "2,3"}, ["H100"] * 4, ("index", 3)),
    (0, None, {}, ["H100", "A4000"], ("unknown", "CUDA_DEVICE_ORDER is FASTEST_FIRST")),
    (0, None, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, ["H100", "A4000"], ("index", 0)),
    # UUID and MIG entries name the device themselves (a prefix is enough for CUDA).
    (1, None, {"CUDA_VISIBLE_DEVICES": "0,GPU-58fb8e2b"}, None, ("uuid", "58fb8e2b")),
    (0, None, {"CUDA_VISIBLE_DEVICES": "MIG-8c1fd4a7-3d4e-5b6f-8a9b-0c1d2e3f4a5b"}, None,
     ("uuid", "8c1fd4a73d4e5b6f8a9b0c1d2e3f4a5b")),
    (0, None, {"CUDA_VISIBLE_DEVICES": "MIG-GPU-58fb8e2b-0f5a-9e07-59b4-7d9d9e10ce6b/1/0"}, None,
     ("unknown", "old form")),
    (2, None, {"CUDA_VISIBLE_DEVICES": "0,1"}, None, ("unknown", "has no entry 2")),
])
def test_cuda_to_nvml(index, uuid, env, names, expected):
    from gpudoctor.scan.environment import cuda_to_nvml

    kind, value = cuda_to_nvml(index, uuid, env, names)
    assert kind == expected[0]
    if kind == "unknown":
        assert expected[1] in value
    else:
        assert value == expected[1]


def test_nvml_uuid_prefix_and_mig_lookup(monkeypatch):
    from gpudoctor.scan.environment import NvmlSession

    nv = _FakeNvml()
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 1 if h == 1 else 0
    nv.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, j: 2
    nv.free = (1 << 30, 2 << 30, 3 << 30)
    nv.uuids = (*nv.uuids, "MIG-cccccccc-1111-2222-3333-444444444444")
    nv.nvmlDeviceGetCount = lambda: 2
    monkeypatch.setattr("gpudoctor.scan.environment._nvml", lambda: (nv.nvmlInit(), nv)[1])
    session = NvmlSession()
    assert session.free_memory(("uuid", "bbbbbbbb")) == 2 << 30  # a prefix, as CUDA accepts
    assert session.free_memory(("uuid", "cccccccc111122223333444444444444")) == 3 << 30  # a MIG instance
    assert session.free_memory(("uuid", "dddd")) is None  # no such device: cannot tell
    session.close()
    assert nv.inits == 1


def test_context_poisoned_syncs_the_probes_own_device():
    from gpudoctor.scan.worker import _context_poisoned

    synced = []

    class Cuda:
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def synchronize(device=None):
            synced.append(device)
            if device == "cuda:3":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    class Torch:
        cuda = Cuda

    assert _context_poisoned(Torch, "cuda:3").startswith("RuntimeError: CUDA error: an illegal memory access")
    assert _context_poisoned(Torch, "cuda:1") is None
    # A probe on the CPU never creates a context on GPU 0 by synchronising "the current device".
    assert _context_poisoned(Torch, "cpu") is None
    assert synced == ["cuda:3", "cuda:1"]


@pytest.mark.parametrize("text, restart", [
    ("CUDA error: unspecified launch failure", True),
    ("CUDA error: an uncorrectable ECC error was encountered", True),  # not in the worker's old list
    ("CUDA error: Misaligned Address", True),  # however it is cased
    ("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul", False),  # reported once
])
def test_a_probe_that_raises_a_sticky_cuda_error_ends_its_worker(text, restart):
    import types

    from gpudoctor.scan.worker import run_task

    def run(ctx):
        raise RuntimeError(text)

    modules = {"k": types.SimpleNamespace(run=run)}
    result = run_task({"key": "k", "device": "cpu", "needs": []}, modules, None, {}, lambda m: None)
    assert result["status"] == "crashed"
    assert bool(result.get("restart")) is restart


def test_jsonable_coerces_instead_of_dying():
    class Bad:
        def __repr__(self):
            raise RuntimeError("no repr")

    out = jsonable({"x": float("inf"), (1, 2): {3}, "bad": Bad(), "s": Status.PASS})
    assert out == {"x": "inf", "(1, 2)": [3], "bad": "<unrepresentable Bad: no repr>", "s": "pass"}
    json.dumps(out, allow_nan=False)


@pytest.mark.torch  # the worker must import torch to know whether CUDA is usable
def test_device_all_runs_per_scan_probes_once():
    report = run_scan(options("once", "torch_ok", device="all"))
    devices = report.environment["scan"]["devices"]
    count = report.environment["torch"].get("device_count") or 0
    assert devices == ([f"cuda:{i}" for i in range(count)] or ["cuda:0"])
    once = [r for r in report.results if r.probe == "fake-once"]
    assert len(once) == 1 and once[0].device is None and once[0].status is Status.PASS
    per_device = [r for r in report.results if r.probe == "fake-torch"]
    assert len(per_device) == len(devices)
    if not count:  # "all" is an explicit CUDA request: without CUDA the torch probes say why
        assert per_device[0].status is Status.SKIPPED and "CUDA is not usable here" in per_device[0].summary


@pytest.mark.gpu
def test_poisoned_cuda_context_gets_a_fresh_worker():
    report = run_scan(options("poison", "torch_ok", "ok", device="cuda:0"))
    poison, after, ok = report.results
    assert poison.details.get("context_poisoned"), poison.details
    assert after.status is Status.PASS and after.device == "cuda:0"
    assert report.environment["scan"]["workers"] == 2
