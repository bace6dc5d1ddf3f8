"""What a scan records about its job (Slurm, torchrun), NCCL and the network, and that a redacted
report keeps none of the host names."""
from __future__ import annotations

import json

from gpudoctor.scan import environment
from gpudoctor.fleet.launch import launcher_info, nccl_env, nccl_plugins, network_ports, node_environment
from gpudoctor.reports.redact import Redactor, redact_report

SLURM = {
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "2",
    "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURMD_NODENAME": "gpu03",
}
TORCHRUN = {
    "RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "run7", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500",
}


def test_slurm():
    info = launcher_info(SLURM, hostname="gpu03.cluster")
    assert info["kind"] == "slurm"
    assert (info["job_id"], info["rank"], info["node_index"], info["num_nodes"], info["world_size"]) == ("4242", 2, 2, 4, 4)
    assert info["hostname"] == {"name": "gpu03.cluster", "slurm_node_name": "gpu03", "node_list": "gpu[01-04]",
                                "master_addr": None}


def test_torchrun_and_torchrun_under_slurm():
    info = launcher_info(TORCHRUN, hostname="h")
    assert info["kind"] == "torchrun"
    assert (info["job_id"], info["rank"], info["local_rank"], info["node_index"], info["num_nodes"]) == ("run7", 5, 1, 1, 2)
    both = launcher_info({**SLURM, **TORCHRUN}, hostname="h")
    # torchrun's ranks, Slurm's job and node numbering (it names nodes in the node list).
    assert (both["kind"], both["rank"], both["world_size"], both["job_id"], both["node_index"]) == ("torchrun", 5, 8, "4242", 2)


def test_outside_a_job():
    info = launcher_info({}, hostname="h")
    assert info["kind"] is None and info["rank"] is None and info["slurm"] is None and info["torchrun"] is None


def test_nccl_variables_and_plugins(tmp_path):
    env = {"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_AUTH_TOKEN": "s3cr3t", "PATH": "/bin"}
    assert nccl_env(env) == {"NCCL_AUTH_TOKEN": "<redacted>", "NCCL_IB_HCA": "mlx5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    for name in ("libnccl-net.so", "libnccl-net-ofi.so", "libnccl-tuner.so.1", "libnccl.so.2", "libcudart.so"):
        (tmp_path / name).write_bytes(b"x")
    found = nccl_plugins({}, dirs=(str(tmp_path), "/nonexistent"))
    assert sorted((p["kind"], p["file"]) for p in found) == [
        ("net", "libnccl-net-ofi.so"), ("net", "libnccl-net.so"), ("tuner", "libnccl-tuner.so.1")]


def test_network_ports(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    [p] = network_ports(str(tmp_path))["ports"]
    assert (p["device"], p["state"], p["rate_gbps"], p["link_layer"]) == ("mlx5_0", "ACTIVE", 400.0, "InfiniBand")
    assert network_ports(str(tmp_path / "absent"))["ports"] == []


def test_a_redacted_report_keeps_the_node_index_but_no_host_name():
    env = {**SLURM, **TORCHRUN, "NCCL_COMM_ID": "gpu01:29501", "NCCL_SOCKET_IFNAME": "=eth0"}
    section = node_environment(env)
    section["launcher"]["hostname"]["name"] = "gpu03.cluster"
    report = {"schema_version": "1.0", "redacted": False, "environment": {"fleet": section}, "results": []}
    redactor = Redactor(home="/home/alice", user="alice", host="gpu03.cluster", environ=env)
    text = json.dumps(redact_report(report, redactor))
    for name in ("gpu01", "gpu03", "gpu[01-04]", "cluster"):
        assert name not in text
    fleet = json.loads(text)["environment"]["fleet"]
    launcher = fleet["launcher"]
    assert launcher["node_index"] == 2 and launcher["rank"] == 5
    # This node is <host> wherever it is named; the others get their own placeholders.
    assert launcher["hostname"]["name"] == launcher["hostname"]["slurm_node_name"] == "<host>"
    assert launcher["hostname"]["node_list"].startswith("<host-")
    master = launcher["hostname"]["master_addr"]
    assert master.startswith("<host-") and fleet["nccl"]["env"]["NCCL_COMM_ID"] == f"{master}:29501"
    assert fleet["nccl"]["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"


def test_a_generic_host_name_is_still_this_machine_under_a_hostname_key():
    # "vm" is too common a word to hunt in text, but a `hostname` section names a host.
    section = node_environment({})
    section["launcher"]["hostname"]["name"] = "vm"
    report = {"environment": {"fleet": section, "system": {"note": "a vm image"}}, "results": []}
    out = redact_report(report, Redactor(home="/home/alice", user="alice", host="vm", environ={}))
    assert out["environment"]["fleet"]["launcher"]["hostname"]["name"] == "<host>"
    assert out["environment"]["system"]["note"] == "a vm image"


class FakeNvml:
    """Just what gpu_fleet_fields calls, with NVLink links 0-3 up and the rest absent."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_NVLINK_MAX_LINKS = 0, 1, 18

    def nvmlDeviceGetVbiosVersion(self, h): return b"96.00.99.00.01"
    def nvmlDeviceGetRemappedRows(self, h): return (1, 0, 1, 0)
    def nvmlDeviceGetClockInfo(self, h, kind): return (345, 2619)[kind]
    def nvmlDeviceGetMaxClockInfo(self, h, kind): return (1980, 2619)[kind]
    def nvmlDeviceGetApplicationsClock(self, h, kind): raise RuntimeError("Not Supported")
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return 700000
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h): return 700000

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link > 5:
            raise RuntimeError("Invalid Argument")
        return int(link < 4)

    def nvmlDeviceGetNvLinkVersion(self, h, link): return 4


def test_gpu_fleet_fields():
    out = environment.gpu_fleet_fields(FakeNvml(), object())
    assert out["vbios"] == "96.00.99.00.01"
    assert out["row_remapping"] == {"correctable": 1, "uncorrectable": 0, "pending": True, "failed": False}
    assert out["clocks_mhz"]["sm_max"] == 1980 and out["clocks_mhz"]["sm_applications"].startswith("not available")
    assert out["power"] == {"limit_w": 700.0, "default_limit_w": 700.0}
    assert out["nvlink"] == {"active_links": 4, "version": 4}


def test_collect_environment_has_the_fleet_section(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_NODEID", "0")
    section = environment.fleet_section()
    assert section["launcher"]["kind"] == "slurm" and section["launcher"]["job_id"] == "77"
