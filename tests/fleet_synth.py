"""Synthetic node reports for the fleet tests and benchmarks/bench_merge.py.

`node_report(i, ...)` builds the JSON report one `srun --ntasks-per-node=1 gpudoctor scan --device
all --format json -o -` task would write on node i of a Slurm job of 8-GPU H100 nodes: the per-device
results are a real scan's (tests/fixtures/fleet/cpu-scan.json) repeated for cuda:0..7, the
environment carries NVML, torch, the Slurm launcher and NCCL sections. The numbers that the tests
judge (versions, GEMM TFLOP/s, PCIe links, ...) are parameters, written into the report: nothing is
measured on this shared machine.
"""
from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

TEMPLATE = pathlib.Path(__file__).parent / "fixtures" / "fleet" / "cpu-scan.json"
_BASE: dict[str, Any] | None = None

H100 = "NVIDIA H100 80GB HBM3"
NOMINAL = {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0}


def base() -> dict[str, Any]:
    global _BASE
    if _BASE is None:
        _BASE = json.loads(TEMPLATE.read_text())
    return _BASE


def gpu(index: int, model: str = H100, **overrides: Any) -> dict[str, Any]:
    out = {
        "index": index,
        "name": model,
        "capability": "9.0",
        "memory": {"total": 85520809984, "used": 1 << 30, "free": 85520809984 - (1 << 30)},
        "compute_processes": 0,
        "ecc": {"enabled": True, "pending": False, "volatile_uncorrected": 0, "volatile_corrected": 0,
                "aggregate_uncorrected": 0, "aggregate_corrected": 3},
        "throttle_reasons": ["gpu_idle"],
        "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
        "temperature_c": 33,
        "persistence_mode": True,
        "vbios": "96.00.99.00.01",
        "row_remapping": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "clocks_mhz": {"sm": 345, "sm_max": 1980, "sm_applications": 1755,
                       "memory": 2619, "memory_max": 2619, "memory_applications": 2619},
        "power": {"limit_w": 700.0, "default_limit_w": 700.0},
        "nvlink": {"active_links": 18, "version": 4},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def node_report(
    index: int,
    nodes: int = 4,
    gpus: int = 8,
    *,
    job: str = "4242",
    prefix: str = "gpu",
    torch: str = "2.13.0+cu130",
    driver: str = "580.65.06",
    nccl: str = "2.27.7",
    tflops: dict[int, float] | None = None,
    gpu_overrides: dict[int, dict[str, Any]] | None = None,
    nccl_env: dict[str, str] | None = None,
    statuses: dict[tuple[str, int], str] | None = None,
    redacted: bool = False,
    launcher: bool = True,
) -> dict[str, Any]:
    """The report of Slurm task `index` (node `index`, rank `index`) of a `nodes`-node job.
    `tflops[gpu]` sets that GPU's bf16 GEMM throughput (default 700); `statuses[(probe, gpu)]`
    sets a probe's verdict there."""
    template = base()
    report = copy.deepcopy({k: v for k, v in template.items() if k != "results"})
    host = f"{prefix}{index:03d}"
    env = report["environment"]
    env["torch"].update({"version": torch, "built_with_cuda": "13.0", "cuda_available": True, "device_count": gpus,
                         "cudnn": {"compiled": "9.13.0", "loaded": "9.13.0", "version": 91300, "enabled": True},
                         "nccl": nccl,
                         "devices": [{"index": i, "name": H100, "capability": "9.0", "total_memory": 85520809984,
                                      "sm_count": 132} for i in range(gpus)]})
    env["nvml"] = {"available": True, "driver_version": driver, "cuda_driver_version": "13.0",
                   "nvml_version": "13.580.65.06", "device_count": gpus,
                   "gpus": [gpu(i, **((gpu_overrides or {}).get(i, {}))) for i in range(gpus)]}
    env["packages"]["installed"]["nvidia-nccl-cu13"] = {"version": nccl, "installer": "pip"}
    env["fleet"] = {
        "launcher": {
            "kind": "slurm", "job_id": job, "rank": index, "local_rank": 0, "world_size": nodes,
            "local_world_size": None, "node_index": index, "num_nodes": nodes,
            "slurm": {"job_id": job, "step_id": "0", "num_nodes": nodes, "node_id": index, "proc_id": index,
                      "local_id": 0, "ntasks": nodes, "tasks_per_node": f"1(x{nodes})"},
            "torchrun": None,
            "hostname": {"name": f"{host}.cluster.example", "slurm_node_name": host,
                         "node_list": f"{prefix}[000-{nodes - 1:03d}]", "master_addr": None},
        } if launcher else {"kind": None, "hostname": {"name": f"{host}.cluster.example"}},
        "nccl": {"env": dict(nccl_env if nccl_env is not None else {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}),
                 "plugins": [{"kind": "net", "file": "libnccl-net.so", "path": "/usr/lib/libnccl-net.so", "size": 1}]},
        "network": {"ports": [{"device": f"mlx5_{i}", "port": "1", "state": "ACTIVE", "rate_gbps": 400.0,
                               "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"} for i in range(gpus)]},
    }
    if redacted:
        env["fleet"]["launcher"].pop("hostname", None)
    report["redacted"] = redacted
    results = []
    for g in range(gpus):
        for r in template["results"]:
            r = copy.deepcopy(r)
            r["device"] = f"cuda:{g}"
            status = (statuses or {}).get((r["probe"], g))
            if status:
                r["status"] = status
                r["summary"] = f"{r['probe']} says {status} on cuda:{g}"
            if r["probe"] == "matmul-sanity":
                bf16 = (tflops or {}).get(g, 700.0)
                r["details"]["throughput"] = {
                    "gpu": H100, "peak_label": "H100 SXM", "peak_comparison": "done",
                    "measured": [{"mode": mode, "size": 4096, "tflops": bf16 * NOMINAL[mode] / 989.0,
                                  "median_ms": 0.2, "nominal_tflops": NOMINAL[mode],
                                  "fraction_of_nominal": bf16 / 989.0, "slow": False}
                                 for mode in ("bf16", "fp16", "tf32")],
                }
            results.append(r)
    report["results"] = results
    return recount(report)


def recount(report: dict[str, Any]) -> dict[str, Any]:
    """The summary a scan writes for the report's results (after a test edits a status): a report
    whose summary disagrees with its results is refused by every reader."""
    report["summary"] = {s: sum(r["status"] == s for r in report["results"])
                         for s in ("pass", "warn", "fail", "skipped", "crashed", "timed_out")}
    return report


def write(tmp_path: pathlib.Path, reports: list[dict[str, Any]], prefix: str = "scan") -> list[str]:
    paths = []
    for i, report in enumerate(reports):
        path = tmp_path / f"{prefix}-{i}.json"
        path.write_text(json.dumps(report))
        paths.append(str(path))
    return paths
