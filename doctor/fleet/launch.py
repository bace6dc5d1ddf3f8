"""What a scan records about the job it ran in, for `gpudoctor merge` and the distributed scan.

`node_environment()` is the `fleet` section of every scan report (collected by the parent, without
torch, next to the NVML section):

- `launcher`: the launcher and this process's place in the job, read from the variables Slurm
  (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, `SLURM_JOB_NUM_NODES`, `SLURM_NODEID`, `SLURM_PROCID`,
  `SLURM_LOCALID`, `SLURM_NTASKS`) and torchrun (`RANK`, `LOCAL_RANK`, `GROUP_RANK`,
  `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`) set. torchrun's
  numbers win for ranks when both are present (`srun torchrun ...`); Slurm's win for the job and
  the node list. Every host name (this node's, Slurm's node list, `MASTER_ADDR`) sits under the
  single key `launcher.hostname`, whose every value redaction treats as a host name
  (reports/redact.py): a redacted report says `<host>` for this node and `<host-N>` or `<ip-N>`
  for the others, and keeps the node's index (Slurm's node id, torchrun's group rank), which is
  how `gpudoctor merge` tells redacted reports apart. Real names are in a report only with
  `--no-redact`; the merge then replaces them by `node-N` itself (unless `merge --no-redact`).
- `nccl`: every `NCCL_*` and `TORCH_NCCL_*` variable (the values of secret-named ones are never
  recorded: `reports.redact.is_secret_name`) and the NCCL
  plugin libraries (net, tuner, profiler, env) found where NCCL's dlopen would look.
- `network`: InfiniBand / RoCE ports from /sys/class/infiniband (state, rate, link layer): what
  the inter-node links should give.

Standard library only; every read is bounded and guarded (a part that cannot be read says why).
"""
from __future__ import annotations

import os
import re
import socket
from typing import Any, Mapping


# Prefixes of the variables that change NCCL's behaviour: compared across nodes by `merge`.
NCCL_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "TORCH_NCCL_")
_VALUE_MAX = 400

# Where NCCL's dlopen() looks for plugins besides LD_LIBRARY_PATH: the system folders and the
# places the cloud images install them (AWS OFI, HPC-X / SHARP, GCP's gIB/FasTrak).
PLUGIN_DIRS: tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib64",
    "/opt/aws-ofi-nccl/lib",
    "/opt/hpcx/nccl_rdma_sharp_plugin/lib",
    "/usr/local/gib/lib64",
    "/usr/local/nvidia/lib64",
)
_PLUGIN_FILE = re.compile(r"^libnccl-(net|tuner|profiler|env)([-_.][A-Za-z0-9_.+-]*)?\.so(\.[0-9.]+)?$")
_MAX_IB_DEVICES = 64


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value.lstrip("-").isdigit():
            return int(value)
    return None


def _text(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value[:_VALUE_MAX]
    return None


def launcher_info(environ: Mapping[str, str] | None = None, hostname: str | None = None) -> dict[str, Any]:
    """This process's place in a Slurm / torchrun job (all None outside one)."""
    env = os.environ if environ is None else environ
    slurm = None
    if env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"):
        slurm = {
            "job_id": _text(env, "SLURM_JOB_ID", "SLURM_JOBID"),
            "step_id": _text(env, "SLURM_STEP_ID", "SLURM_STEPID"),
            "num_nodes": _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
            "node_id": _int(env, "SLURM_NODEID"),
            "proc_id": _int(env, "SLURM_PROCID"),
            "local_id": _int(env, "SLURM_LOCALID"),
            "ntasks": _int(env, "SLURM_NTASKS", "SLURM_NPROCS"),
            "tasks_per_node": _text(env, "SLURM_TASKS_PER_NODE"),
        }
    torchrun = None
    if env.get("TORCHELASTIC_RUN_ID") or (env.get("RANK") and env.get("LOCAL_RANK") and env.get("WORLD_SIZE")):
        torchrun = {
            "run_id": _text(env, "TORCHELASTIC_RUN_ID"),
            "restart_count": _int(env, "TORCHELASTIC_RESTART_COUNT"),
            "rank": _int(env, "RANK"),
            "local_rank": _int(env, "LOCAL_RANK"),
            "group_rank": _int(env, "GROUP_RANK"),
            "world_size": _int(env, "WORLD_SIZE"),
            "local_world_size": _int(env, "LOCAL_WORLD_SIZE"),
            "group_world_size": _int(env, "GROUP_WORLD_SIZE"),
        }
    kind = "torchrun" if torchrun else "slurm" if slurm else None
    t, s = torchrun or {}, slurm or {}

    def pick(a: Any, b: Any) -> Any:
        return a if a is not None else b

    if hostname is None:
        try:
            hostname = socket.gethostname()
        except OSError:
            hostname = ""
    return {
        "kind": kind,
        # The job: Slurm's allocation when there is one (it names the nodes), else torchrun's run.
        "job_id": s.get("job_id") or t.get("run_id"),
        "rank": pick(t.get("rank"), s.get("proc_id")),
        "local_rank": pick(t.get("local_rank"), s.get("local_id")),
        "world_size": pick(t.get("world_size"), s.get("ntasks")),
        "local_world_size": t.get("local_world_size"),
        # Slurm's node id is the node's position in the node list, so it names missing nodes.
        "node_index": pick(s.get("node_id"), t.get("group_rank")),
        "num_nodes": pick(s.get("num_nodes"), t.get("group_world_size")),
        "slurm": slurm,
        "torchrun": torchrun,
        # Everything that names a host, under the one key redaction drops.
        "hostname": {
            "name": hostname or None,
            "slurm_node_name": _text(env, "SLURMD_NODENAME"),
            "node_list": _text(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST") if slurm else None,
            "master_addr": _text(env, "MASTER_ADDR") if torchrun else None,
        },
    }


def nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    from gpudoctor.reports.redact import MASK, is_secret_name

    env = os.environ if environ is None else environ
    out = {}
    for name in sorted(env):
        if name.startswith(NCCL_ENV_PREFIXES):
            out[name] = MASK if is_secret_name(name) else env[name][:_VALUE_MAX]
    return out


def nccl_plugins(environ: Mapping[str, str] | None = None, dirs: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """NCCL plugin libraries in LD_LIBRARY_PATH and the usual folders, in search order."""
    env = os.environ if environ is None else environ
    if dirs is None:
        ld = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
        dirs = (*ld, *PLUGIN_DIRS)
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    for folder in dirs[:64]:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            match = _PLUGIN_FILE.match(name)
            if not match:
                continue
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                size = os.path.getsize(real)
            except OSError:
                size = None
            found.append({"kind": match.group(1), "file": name, "path": path, "size": size})
    return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(256).strip()
    except OSError:
        return None


_RATE = re.compile(r"^([0-9.]+)\s*Gb/sec")


def network_ports(root: str = "/sys/class/infiniband") -> dict[str, Any]:
    """InfiniBand and RoCE ports: device, port, state, rate in Gb/s, link layer."""
    try:
        devices = sorted(os.listdir(root))[:_MAX_IB_DEVICES]
    except FileNotFoundError:
        return {"ports": [], "note": "no InfiniBand/RoCE devices (/sys/class/infiniband is absent)"}
    except OSError as exc:
        return {"available": False, "reason": f"cannot list {root}: {exc.strerror or exc}"}
    ports = []
    for device in devices:
        base = os.path.join(root, device, "ports")
        try:
            numbers = sorted(os.listdir(base))[:8]
        except OSError:
            continue
        for number in numbers:
            folder = os.path.join(base, number)
            state = _read(os.path.join(folder, "state")) or ""
            rate_text = _read(os.path.join(folder, "rate")) or ""
            match = _RATE.match(rate_text)
            ports.append({
                "device": device,
                "port": number,
                "state": state.split(":", 1)[-1].strip() or None,
                "rate_gbps": float(match.group(1)) if match else None,
                "rate": rate_text or None,
                "link_layer": _read(os.path.join(folder, "link_layer")),
            })
    return {"ports": ports}


def node_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The report's `fleet` section (see the module docstring). Never raises."""
    out: dict[str, Any] = {}
    for key, fn in (("launcher", lambda: launcher_info(environ)),
                    ("nccl", lambda: {"env": nccl_env(environ), "plugins": nccl_plugins(environ)}),
                    ("network", network_ports)):
        try:
            out[key] = fn()
        except Exception as exc:  # context for the merge; never a reason to lose the scan
            out[key] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    return out
