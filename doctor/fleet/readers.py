"""`gpudoctor merge`'s readers: scan reports in, one `Member` per report out.

- reading: files, folders of `*.json` and `-`, through gpudoctor.reports.load (`load_documents`:
  bounded, strict, validated as `gpudoctor report` validates, so a file `report` refuses is
  refused here for the same reason); a file may hold several reports one after another; a
  pretty-printed report is skimmed (the per-result details a merge never reads are cut before
  JSON parsing); many files are read in parallel on idle cores. A report that cannot be read is
  returned as such, for the merge to name (`unreadable-report`).
- what one report says: `member_from_report` turns a report into a `Member` (where it ran, its
  job and rank, versions, NCCL settings, GPUs and their hardware state, probe verdicts, GEMM
  throughput), every untrusted value bounded (`_text`).

gpudoctor.fleet.merge compares the members and names what differs (the fleet findings).
Standard library only: no torch, no rich.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from gpudoctor.fleet.model import ERROR, WARNING
from gpudoctor.reports import load
from gpudoctor.reports.model import lookup

if TYPE_CHECKING:  # the node a report was placed in; merge.py imports this module
    from gpudoctor.fleet.merge import Node

MAX_REPORT_BYTES = load.MAX_REPORT_BYTES  # an 8-GPU node report is ~350 KB; anything this big is not one
TEXT_LIMIT = 300  # characters of an untrusted value kept in a finding


class MergeInputError(Exception):
    """The inputs cannot be merged at all: a path that does not exist, nothing readable (exit 2)."""


# --- reading ----------------------------------------------------------------------------------------

# One document from the inputs: a report dict, or why it could not be read. The reading is
# gpudoctor.reports.load's, the one reader every command uses: the same files are refused with the
# same reason by `merge` as by `report`.
Loaded = load.Document


def _paths(inputs: Sequence[str]) -> list[str]:
    files: list[str] = []
    for path in inputs:
        if path == "-":
            files.append(path)
        elif os.path.isdir(path):
            found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".json"))
            if not found:
                raise MergeInputError(f"{path}: no *.json reports in this folder")
            files.extend(found)
        elif not os.path.lexists(path):
            raise MergeInputError(f"{path}: no such file")
        else:
            files.append(path)
    if not files:
        raise MergeInputError("no reports given")
    return files


def parse_documents(raw: bytes | str, label: str) -> list[Loaded]:
    """Every report in `raw` (one, or several written one after another), each validated."""
    return load.parse_documents(raw, label)


def load_inputs(inputs: Sequence[str], limit: int = MAX_REPORT_BYTES) -> list[Loaded]:
    """Read every input. Raises MergeInputError only for paths that do not exist."""
    loaded: list[Loaded] = []
    for path in _paths(inputs):
        loaded.extend(load.load_documents(path, limit=limit))
    return loaded


def _members_of(chunk: list[str]) -> list[tuple[str, "Member | None", str | None]]:
    """Read and extract a batch of files (runs in a pool worker for big merges)."""
    out: list[tuple[str, Member | None, str | None]] = []
    same: dict[tuple[str, str | None, str, str], tuple[str, str | None, str, str]] = {}
    for path in chunk:
        for d in load.load_documents(path):
            member = member_from_report(d.data, d.label, 0) if d.data is not None else None
            if member is not None:
                # Nodes of one fleet mostly report the same rows: one object for equal rows, which
                # pickle sends back from a pool worker once (a 1,000-node batch was 20 MB, 4x less).
                member.results = [same.setdefault(row, row) for row in member.results]
            out.append((d.label, member, d.error))
    return out


# Below this many files one process is faster than starting a pool.
PARALLEL_FROM = 64


def _idle_cores(limit: int = 16) -> int:
    """Processes worth starting: the cores this process may use that the load average leaves idle.
    On a busy machine a pool only adds its own cost (workers fight for the same cores and every
    extracted report is pickled back), so a loaded 2-core box reads in one process."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(limit, cores, math.ceil(cores - busy)))


def load_members(inputs: Sequence[str], jobs: int | None = None) -> tuple[list["Member"], list[Loaded]]:
    """Read and extract every input, in parallel (fork) when there are many files and idle cores
    (`_idle_cores`; GPUDOCTOR_MERGE_JOBS=N overrides): reading and parsing ~330 KB of JSON per
    node is most of a 1,000-node merge. Order is kept."""
    files = _paths(inputs)
    if jobs is None:
        env = os.environ.get("GPUDOCTOR_MERGE_JOBS", "")
        jobs = int(env) if env.isdigit() and int(env) > 0 else _idle_cores()
    batches: list[list[tuple[str, Member | None, str | None]]]
    if jobs > 1 and len(files) >= PARALLEL_FROM and "-" not in files and hasattr(os, "fork"):
        import concurrent.futures
        import multiprocessing

        size = max(8, len(files) // (jobs * 4))
        chunks = [files[i:i + size] for i in range(0, len(files), size)]
        try:
            with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
                batches = list(pool.map(_members_of, chunks))
        except (OSError, concurrent.futures.process.BrokenProcessPool):
            batches = [_members_of(files)]  # no processes to be had: do it here
    else:
        batches = [_members_of(files)]
    members: list[Member] = []
    unreadable: list[Loaded] = []
    for batch in batches:
        for label, member, error in batch:
            if member is not None:
                member.position = len(members)
                members.append(member)
            else:
                unreadable.append(Loaded(label, error=error))
    return members, unreadable


# --- what one report says -----------------------------------------------------------------------


def _text(value: Any, limit: int = TEXT_LIMIT) -> str | None:
    """A bounded string from untrusted data (None stays None; containers are not text)."""
    if value is None or isinstance(value, (dict, list)):
        return None
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _unavailable(section: Any) -> str | None:
    if isinstance(section, dict) and section.get("available") is False:
        return f"unavailable: {_text(section.get('reason'), 120)}"
    if isinstance(section, str) and section.startswith("not available"):
        return _text(section, 160)
    return None


@dataclass
class Gpu:
    index: int
    name: str | None
    raw: dict[str, Any]
    values: dict[str, str] = field(default_factory=dict)  # drift label -> value (see _HW_DRIFT)


@dataclass
class Member:
    """One input report: a node (one scan per node) or one rank (torchrun)."""

    label: str
    position: int
    hostname: str | None = None  # real names: only in reports made with --no-redact
    slurm_name: str | None = None
    fqdn_names: tuple[str, ...] = ()
    node_index: int | None = None
    num_nodes: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    job_id: str | None = None
    launcher: str | None = None
    node_list: str | None = None
    created: str | None = None
    duration_s: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    nccl_env: dict[str, str] = field(default_factory=dict)
    gpu_count: int | None = None
    gpus: list[Gpu] = field(default_factory=list)
    results: list[tuple[str, str | None, str, str]] = field(default_factory=list)  # probe, device, status, summary
    gemm: list[dict[str, Any]] = field(default_factory=list)
    visible: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES entries
    node: Node | None = None

    @property
    def real_name(self) -> str | None:
        return self.slurm_name or self.hostname

    def gpu_label(self, device: str | None) -> str | None:
        """"cuda:1 (GPU 5)" when CUDA_VISIBLE_DEVICES maps it elsewhere, else "cuda:N" / None."""
        if not device:
            return None
        kind, _, index = device.partition(":")
        if kind == "cuda" and index.isdigit() and int(index) < len(self.visible) and self.visible[int(index)].isdigit():
            nvml = self.visible[int(index)]
            return device if nvml == index else f"{device} (GPU {nvml})"
        return device


def _versions(env: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    torch = env.get("torch")
    why = _unavailable(torch)
    if why or not isinstance(torch, dict):
        out["torch"] = why or "not reported"
    else:
        out["torch"] = _text(torch.get("version")) or "unknown"
        out["torch CUDA"] = _text(torch.get("built_with_cuda")) or "none (CPU build)"
        cudnn = torch.get("cudnn")
        out["cuDNN"] = (_text(cudnn.get("loaded")) or _text(cudnn.get("version")) or "unknown") if isinstance(cudnn, dict) \
            else _text(cudnn) or "unknown"
        out["NCCL"] = _text(torch.get("nccl")) or "unknown"
    nvml = env.get("nvml")
    why = _unavailable(nvml)
    out["driver"] = why or _text(lookup(nvml, "driver_version")) or "not reported"
    out["CUDA driver"] = why or _text(lookup(nvml, "cuda_driver_version")) or "not reported"
    out["python"] = _unavailable(env.get("python")) or _text(lookup(env, "python", "version")) or "not reported"
    installed = lookup(env, "packages", "installed")
    if isinstance(installed, dict):
        for name, info in installed.items():
            version = _text(lookup(info, "version"), 80)
            if isinstance(name, str) and version:
                out[f"package {name[:80]}"] = version
    plugins = lookup(env, "fleet", "nccl", "plugins")
    if isinstance(plugins, list):
        names = sorted({_text(lookup(p, "file"), 120) or "?" for p in plugins if isinstance(p, dict)})
        out["NCCL plugins"] = ", ".join(names) if names else "none found"
    return out


def _nccl_env(env: dict[str, Any]) -> dict[str, str]:
    """The node's NCCL variables; a secret-named one (NCCL_..._TOKEN) is compared as present, never
    by value (its value must not reach a finding)."""
    from gpudoctor.reports.redact import MASK, is_secret_name

    values = lookup(env, "fleet", "nccl", "env")
    out: dict[str, str] = {}
    if isinstance(values, dict):
        for name, value in values.items():
            if isinstance(name, str) and name.startswith(("NCCL_", "TORCH_NCCL_")) and len(name) < 100:
                out[name] = MASK if is_secret_name(name) else (_text(value) or "")
    return out


def _host(value: Any) -> str | None:
    """A real host name from a report, or None: a redacted report holds placeholders (`<host>`,
    `<host-2>`, `<redacted>`), which name no node (every node's own name is `<host>` there)."""
    text = _text(value, 4096)
    if not text or not text.strip() or (text.startswith("<") and text.endswith(">")):
        return None
    return text


def _gemm(results: list[Any]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        if not isinstance(r, dict) or r.get("probe") != "matmul-sanity":
            continue
        throughput = lookup(r, "details", "throughput")
        measured = lookup(throughput, "measured")
        if not isinstance(measured, list):
            continue
        device = _text(r.get("device"), 40)
        model = _text(lookup(throughput, "peak_label"), 80) or _text(lookup(throughput, "gpu"), 80)
        for m in measured:
            tflops = _num(lookup(m, "tflops"))
            mode = _text(lookup(m, "mode"), 20)
            if tflops is None or not mode:
                continue
            out.append({"device": device, "model": model, "mode": mode, "tflops": tflops,
                        "nominal": _num(lookup(m, "nominal_tflops"))})
    return out


def member_from_report(data: dict[str, Any], label: str, position: int) -> Member:
    """What the merge needs from one scan report (tolerant of any part being missing or odd)."""
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    launcher = lookup(env, "fleet", "launcher")
    launcher = launcher if isinstance(launcher, dict) else {}
    names = launcher.get("hostname") if isinstance(launcher.get("hostname"), dict) else {}
    m = Member(
        label=label,
        position=position,
        hostname=_host(names.get("name")),
        slurm_name=_host(names.get("slurm_node_name")),
        node_list=_host(names.get("node_list")),
        node_index=_int(launcher.get("node_index")),
        num_nodes=_int(launcher.get("num_nodes")),
        rank=_int(launcher.get("rank")),
        local_rank=_int(launcher.get("local_rank")),
        world_size=_int(launcher.get("world_size")),
        local_world_size=_int(launcher.get("local_world_size")),
        job_id=_text(launcher.get("job_id"), 120),
        launcher=_text(launcher.get("kind"), 40),
        created=_text(data.get("created"), 60),
        duration_s=_num(data.get("duration_s")),
    )
    m.versions = _versions(env)
    tool = _text(lookup(data, "tool", "version"), 40)
    if tool:
        m.versions["gpudoctor"] = tool
    if m.versions:
        # The scan level decides how many cells each matrix ran (a report without one ran "deep"):
        # nodes scanned at different levels are a drift worth a warning, not a fault.
        m.versions["scan level"] = data.get("level") if data.get("level") in ("quick", "deep") else "deep"
    m.nccl_env = _nccl_env(env)
    cvd = lookup(env, "env_vars", "CUDA_VISIBLE_DEVICES")
    m.visible = [v.strip() for v in cvd.split(",")] if isinstance(cvd, str) else []
    nvml = env.get("nvml")
    if isinstance(nvml, dict) and nvml.get("available") is not False:
        m.gpu_count = _int(nvml.get("device_count"))
        for gpu in nvml.get("gpus") or []:
            if isinstance(gpu, dict) and _int(gpu.get("index")) is not None:
                m.gpus.append(Gpu(_int(gpu.get("index")), _text(gpu.get("name"), 120), gpu,  # type: ignore[arg-type]
                                  {label: v for label, path, _ in _HW_DRIFT if (v := _hw_value(gpu, *path)) is not None}))
    elif isinstance(lookup(env, "torch", "device_count"), int) and lookup(env, "torch", "cuda_available"):
        m.gpu_count = lookup(env, "torch", "device_count")
    results = data.get("results") or []
    matmul = []
    append = m.results.append
    for r in results:
        try:
            probe, status, device, summary = r["probe"], r["status"], r.get("device"), r.get("summary")
        except (TypeError, KeyError):
            continue
        if type(probe) is not str or type(status) is not str:
            continue
        if type(summary) is not str:
            summary = ""
        elif len(summary) > TEXT_LIMIT:
            summary = summary[:TEXT_LIMIT] + "…"
        append((probe[:80], device[:40] if type(device) is str else None, status[:20], summary))
        if probe == "matmul-sanity":
            matmul.append(r)
    m.gemm = _gemm(matmul)
    return m


def _hw_value(raw: dict[str, Any], *path: str) -> str | None:
    value: Any = raw
    for key in path:
        if type(value) is not dict:
            return None
        value = value.get(key)
    if value is None:
        return None
    kind = type(value)
    if kind is str:
        if value.startswith("not available"):
            return None  # "cannot tell" is not a difference in hardware state
        return value if len(value) <= 80 else value[:80] + "…"
    if kind is dict or kind is list:
        return None
    return _text(value, 80)


_HW_DRIFT: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("VBIOS", ("vbios",), WARNING),
    ("PCIe max generation", ("pcie", "max_gen"), WARNING),
    ("PCIe max width", ("pcie", "max_width"), WARNING),
    ("ECC mode", ("ecc", "enabled"), WARNING),
    ("max SM clock (MHz)", ("clocks_mhz", "sm_max"), WARNING),
    ("max memory clock (MHz)", ("clocks_mhz", "memory_max"), WARNING),
    ("applications SM clock (MHz)", ("clocks_mhz", "sm_applications"), WARNING),
    ("applications memory clock (MHz)", ("clocks_mhz", "memory_applications"), WARNING),
    ("power limit (W)", ("power", "limit_w"), WARNING),
    ("active NVLink links", ("nvlink", "active_links"), ERROR),
    ("persistence mode", ("persistence_mode",), WARNING),
)
