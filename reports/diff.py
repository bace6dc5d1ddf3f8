"""`gpudoctor diff A.json B.json`: what differs between two reports, the differences that explain a
changed verdict first.

`facts(report)` flattens a report's environment into named facts (versions, driver, GPUs and their
architectures, torch's arch list, loaded CUDA libraries, environment variables, system).
`diff_reports(a, b)` compares the facts and the probe verdicts and ranks the differences:

1. A verdict changed when a probe ran on both sides (a status other than `skipped`) and its status
   or its findings' ids differ, or when it failed, crashed or timed out on one side and did not
   run on the other (results are paired by probe and device, then by probe alone, so `cuda:0` on
   one machine meets `cuda:1` on the other). A probe that ran in one report only and did not fail
   there is a *coverage* difference (`Diff.coverage`): the other report has no verdict to compare
   (it ran a subset with `--probe`, or skipped the probe), so no cause is sought for it.
   `torch-import`, which a scan reports only when torch cannot be imported, counts as passed in a
   report whose torch was imported.
2. "Known to cause" is derived from data, not written per pair: a probe can detect an id when the
   knowledge-base entry lists the probe in `probes` or the probe's SPEC lists the id in `emits`; an
   environment fact bears on the ids that `BEARS_ON` (below) names for it. A difference is
   *linked* to a changed verdict when its fact bears on an id that the probe reported on the worse
   side (score 3), or on an id the probe can detect (score 2); unlinked differences score 0.
3. A torch that is missing or cannot be imported on one side is the cause of every failure there:
   that difference scores 4, ranks first and is linked to every changed verdict whose worse side
   it is on. Facts that only an imported torch reports (its CUDA build, SDPA settings, the CUDA
   libraries it loaded) are then *not measured* on that side (`Diff.unmeasured`), not differences.
4. Differences are ranked by score, then by `CATEGORIES` order (driver before packages), then by
   name. Each changed verdict lists the differences linked to it, strongest first.
5. Reports made at different scan levels (`gpudoctor scan --level`; a report without one predates
   levels and ran what is now "deep") are compared on the same terms: verdicts (status and finding
   ids), never the matrices in the details, where quick runs fewer cells by design. The header
   says the levels differ, so that a changed verdict is read with that in mind.

Renderers: `render_text` (rich, on a Console), `render_markdown`, `render_json`; every value from a
report is printed through `gpudoctor.safetext.visible`, and in Markdown through
`gpudoctor.reports.markdown`. Standard library only outside render_text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpudoctor.reports import markdown as md
from gpudoctor.reports.model import lookup
from gpudoctor.safetext import visible

if TYPE_CHECKING:
    from rich.console import Console

# 1.1: each side's scan `level`, and `levels_differ`; 1.2: `coverage` (probes that ran in one report
# only), `unmeasured` (facts one side could not measure) and `summary` (the verdict line).
DIFF_SCHEMA_VERSION = "1.2"
CATEGORIES = ("driver", "torch", "gpu", "arch", "libraries", "packages", "python", "env", "system")
_SEVERITY = {"pass": 0, "skipped": 1, "warn": 2, "fail": 3, "crashed": 3, "timed_out": 3}
_VALUE_CHARS = 300
TORCH_IMPORT_PROBE = "torch-import"  # gpudoctor.scan.runner's result for a failed torch import
# Environment sections that the worker collects after importing torch: where torch could not be
# imported, their facts were not measured on that side.
_TORCH_SECTIONS = ("torch", "cuda_libraries")

# Which environment facts bear on which knowledge-base ids: the one hand-written table of the
# ranking. A key ending in ":" matches every fact that starts with it. Kept small and defensible:
# each row is a mechanism, not a correlation.
BEARS_ON: dict[str, tuple[str, ...]] = {
    # torch's version decides which kernels, backends, checks and deprecations exist.
    "torch": ("sdpa-no-kernel", "sdp-kernel-deprecated", "flash-attn-unsupported", "xformers-build-mismatch",
              "xformers-flash-invalid-argument", "extension-abi-mismatch", "no-kernel-image", "fp8-layout",
              "fp8-unsupported-gpu", "attention-oom", "misaligned-address", "cublas-status-error"),
    # The CUDA version torch was built for: which GPUs have kernels, which driver it needs.
    "torch.cuda": ("no-kernel-image", "driver-too-old", "cuda-unavailable", "extension-abi-mismatch",
                   "xformers-build-mismatch", "fp8-unsupported-gpu", "cublas-status-error"),
    "torch.cuda_available": ("cuda-unavailable",),
    "torch.arch_list": ("no-kernel-image",),
    "torch.sdp": ("sdpa-no-kernel", "attention-oom", "sdp-kernel-deprecated"),
    "cudnn": ("sdpa-no-kernel",),
    # Compiled extensions are built for one Python ABI.
    "python": ("extension-abi-mismatch", "xformers-build-mismatch"),
    "driver": ("driver-too-old", "cuda-unavailable", "no-kernel-image", "cublas-status-error"),
    "driver.cuda": ("driver-too-old", "cuda-unavailable", "no-kernel-image"),
    # The GPU's architecture decides kernel availability and FP8 support; its memory, OOMs.
    "gpus": ("no-kernel-image", "fp8-unsupported-gpu", "flash-attn-unsupported", "xformers-flash-invalid-argument",
             "sdpa-no-kernel", "attention-oom", "cuda-oom"),
    "gpu.capability": ("no-kernel-image", "fp8-unsupported-gpu", "flash-attn-unsupported",
                       "xformers-flash-invalid-argument", "sdpa-no-kernel"),
    "package:xformers": ("xformers-build-mismatch", "xformers-flash-invalid-argument", "extension-abi-mismatch"),
    "package:flash-attn": ("flash-attn-unsupported", "extension-abi-mismatch"),
    "package:flash-attn-3": ("flash-attn-unsupported", "extension-abi-mismatch"),
    "package:nvidia-cublas": ("cublas-status-error", "fp8-layout"),
    "package:nvidia-cudnn": ("sdpa-no-kernel",),
    "package:nvidia-cuda-runtime": ("driver-too-old", "cuda-unavailable"),
    "cuda_lib:cublas": ("cublas-status-error", "fp8-layout"),
    "cuda_lib:cublaslt": ("cublas-status-error", "fp8-layout"),
    "cuda_lib:cudnn": ("sdpa-no-kernel",),
    "cuda_lib:cudart": ("driver-too-old", "cuda-unavailable", "extension-abi-mismatch"),
    "cuda_lib.flags": ("cublas-status-error", "driver-too-old", "extension-abi-mismatch"),
    "env:PYTORCH_CUDA_ALLOC_CONF": ("cuda-oom", "attention-oom", "custom-allocator"),
    "env:PYTORCH_ALLOC_CONF": ("cuda-oom", "attention-oom", "custom-allocator"),
    "env:CUDA_VISIBLE_DEVICES": ("cuda-unavailable",),
    "env:CUDA_LAUNCH_BLOCKING": ("async-error-reporting",),
    "env:TORCH_CUDA_ARCH_LIST": ("no-kernel-image", "extension-abi-mismatch"),
    "env:XFORMERS_": ("xformers-build-mismatch", "xformers-flash-invalid-argument"),
    "env:FLASH_ATTENTION_": ("flash-attn-unsupported",),
    "system.wsl": ("cuda-unavailable", "driver-too-old"),
    "system.container": ("cuda-unavailable",),
}


def bears_on(key: str) -> tuple[str, ...]:
    """The knowledge-base ids the fact `key` bears on (see BEARS_ON)."""
    if key in BEARS_ON:
        return BEARS_ON[key]
    for prefix, ids in BEARS_ON.items():
        if prefix.endswith(":") or prefix.endswith("_"):
            if key.startswith(prefix):
                return ids
    for prefix, ids in BEARS_ON.items():  # "package:nvidia-cublas" covers nvidia-cublas-cu12
        if ":" in prefix and key.startswith(prefix + "-"):
            return ids
    return ()


def detectable_by(probe: str, kb: Iterable[Any] | None = None,
                  emits: Mapping[str, Iterable[str]] | None = None) -> set[str]:
    """The ids `probe` can detect: entries that list it in `probes`, and its SPEC's `emits`."""
    if kb is None:
        from gpudoctor.knowledge.kb import load_all

        kb = load_all()
    if emits is None:
        emits = probe_emits()
    ids = {e.id for e in kb if probe in e.probes}
    ids.update(emits.get(probe, ()))
    return ids


def probe_emits() -> dict[str, tuple[str, ...]]:
    from gpudoctor.probes import load_builtin

    return {m.SPEC.id: tuple(m.SPEC.emits) for m in load_builtin()}


# --- facts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    key: str
    category: str
    label: str
    value: Any  # a string, or a sorted list of strings


def _section(env: dict[str, Any], name: str) -> dict[str, Any]:
    value = env.get(name)
    if isinstance(value, dict) and value.get("available") is not False:
        return value
    return {}


def _s(value: Any) -> str:
    return visible(str(value), _VALUE_CHARS)


def facts(report: dict[str, Any]) -> dict[str, Fact]:
    """The environment facts of a report's dict, by key."""
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    out: dict[str, Fact] = {}

    def put(key: str, category: str, label: str, value: Any) -> None:
        if value is None or value == "" or value == []:
            return
        if isinstance(value, (list, tuple, set)):
            value = sorted({_s(v) for v in value})
        else:
            value = _s(value)
        out[key] = Fact(key, category, label, value)

    torch = _section(env, "torch")
    missing = torch_missing(report)
    if missing:
        put("torch", "torch", "torch", missing)
    if torch:
        put("torch", "torch", "torch", torch.get("version"))
        put("torch.cuda", "torch", "torch built for CUDA", torch.get("built_with_cuda") or "none (CPU or ROCm build)")
        if isinstance(torch.get("cuda_available"), bool):
            put("torch.cuda_available", "torch", "CUDA available to torch", "yes" if torch["cuda_available"] else "no")
        arch = torch.get("arch_list")
        put("torch.arch_list", "arch", "torch arch list", arch if isinstance(arch, list) else ([arch] if arch else None))
        cudnn = torch.get("cudnn")
        if isinstance(cudnn, dict):
            put("cudnn", "libraries", "cuDNN (loaded by torch)", cudnn.get("loaded"))
        sdp = torch.get("sdp")
        if isinstance(sdp, dict):
            put("torch.sdp", "torch", "SDPA backends enabled", [f"{k}={v}" for k, v in sorted(sdp.items())])
        devices = [d for d in torch.get("devices") or [] if isinstance(d, dict)]
        put("gpu.capability", "gpu", "GPU compute capabilities",
            [f"sm_{str(d.get('capability')).replace('.', '')}" for d in devices if d.get("capability")] or None)
        if devices:
            put("gpus", "gpu", "GPUs (torch)", [f"{d.get('name')} ({_gib(d.get('total_memory'))})" for d in devices])
    nvml = _section(env, "nvml")
    raw_nvml = env.get("nvml")
    if isinstance(raw_nvml, dict) and raw_nvml.get("available") is False:
        put("driver", "driver", "NVIDIA driver", "none (NVML not available)")
    if nvml.get("available"):
        put("driver", "driver", "NVIDIA driver", nvml.get("driver_version"))
        put("driver.cuda", "driver", "CUDA version the driver supports", nvml.get("cuda_driver_version"))
        gpus = [g for g in nvml.get("gpus") or [] if isinstance(g, dict)]
        if gpus and "gpus" not in out:
            put("gpus", "gpu", "GPUs", [f"{g.get('name')} ({_gib(lookup(g, 'memory', 'total'))})" for g in gpus])
        if gpus and "gpu.capability" not in out:
            put("gpu.capability", "gpu", "GPU compute capabilities",
                [f"sm_{str(g.get('capability')).replace('.', '')}" for g in gpus if g.get("capability")] or None)
    python = _section(env, "python")
    put("python", "python", "Python", python.get("version"))
    packages = _section(env, "packages")
    installed = packages.get("installed") if isinstance(packages.get("installed"), dict) else {}
    for name, info in sorted(installed.items()):
        if name == "torch" and "torch" in out:
            continue
        version = info.get("version") if isinstance(info, dict) else info
        dup = info.get("duplicates") if isinstance(info, dict) else None
        if isinstance(dup, list) and dup:
            version = f"{version} (also {', '.join(map(str, dup))})"
        put(f"package:{name}", "packages", name, version)
    for name in packages.get("not_installed") or []:
        if name == "torch" and "torch" in out:
            continue
        if isinstance(name, str) and f"package:{name}" not in out:
            put(f"package:{name}", "packages", name, "not installed")
    libs = _section(env, "cuda_libraries")
    for lib, info in sorted((libs.get("libraries") or {}).items()):
        if not isinstance(info, dict):
            continue
        loaded = [c for c in info.get("loaded") or [] if isinstance(c, dict)]
        versions = [str(c.get("version") or "?") for c in loaded]
        put(f"cuda_lib:{lib}", "libraries", f"lib{lib} loaded", ", ".join(versions) if versions else "not loaded")
    flags = [f.get("detail") for f in libs.get("flags") or [] if isinstance(f, dict)]
    put("cuda_lib.flags", "libraries", "CUDA library warnings", flags or None)
    env_vars = env.get("env_vars") if isinstance(env.get("env_vars"), dict) else {}
    for name, value in sorted(env_vars.items()):
        if name != "available" and name != "reason":
            put(f"env:{name}", "env", name, value)
    system = _section(env, "system")
    if system:
        put("system.os", "system", "OS", " ".join(str(x) for x in (system.get("distribution") or system.get("os"),
                                                                  system.get("kernel")) if x))
        container = system.get("container")
        if isinstance(container, dict):
            put("system.container", "system", "container", container.get("kind") or "none" if container.get("detected") else "none")
        wsl = system.get("wsl")
        if isinstance(wsl, dict):
            put("system.wsl", "system", "WSL", f"WSL{wsl.get('version') or ''}" if wsl.get("detected") else "no")
    return out


def _gib(value: Any) -> str:
    return f"{value / 2**30:.0f} GiB" if isinstance(value, (int, float)) and not isinstance(value, bool) else "? GiB"


def torch_missing(report: dict[str, Any]) -> str | None:
    """"not installed" or "cannot be imported (...)" when the report's torch could not be imported,
    else None."""
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    section = env.get("torch")
    failed = any(r.get("probe") == TORCH_IMPORT_PROBE and r.get("status") in ("fail", "crashed", "timed_out")
                 for r in _results(report))
    if not failed and not (isinstance(section, dict) and section.get("available") is False):
        return None
    not_installed = lookup(env, "packages", "not_installed")
    if isinstance(not_installed, list) and "torch" in not_installed:
        return "not installed"
    reason = section.get("reason") if isinstance(section, dict) else None
    first = str(reason or "").strip().splitlines()[:1]
    return f"cannot be imported ({_s(first[0])[:120]})" if first else "cannot be imported"


def _unmeasured_sections(report: dict[str, Any]) -> set[str]:
    """The torch-side sections a report could not collect because its torch did not import."""
    if torch_missing(report) is None:
        return set()
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    return {name for name in _TORCH_SECTIONS if not _section(env, name)}


def _fact_section(key: str) -> str | None:
    """Which torch-side section a fact comes from (None: another section)."""
    if key.startswith("cuda_lib"):
        return "cuda_libraries"
    if key.startswith("torch.") or key in ("cudnn", "gpus", "gpu.capability"):
        return "torch"
    return None


# --- verdicts ------------------------------------------------------------------------------------


@dataclass
class Verdict:
    probe: str
    device_a: str | None
    device_b: str | None
    a: str | None  # status on A, None when the probe did not run there
    b: str | None
    findings_a: list[str]
    findings_b: list[str]
    explained_by: list[dict[str, Any]] = field(default_factory=list)
    summary_a: str | None = None  # the result's summary on each side (why it was skipped)
    summary_b: str | None = None

    @property
    def change(self) -> str:
        if self.a is None:
            return "only-b"
        if self.b is None:
            return "only-a"
        sa, sb = _SEVERITY.get(self.a, 0), _SEVERITY.get(self.b, 0)
        if sb > sa:
            return "worse"
        if sb < sa:
            return "better"
        return "changed" if (self.a != self.b or self.findings_a != self.findings_b) else "same"

    @property
    def worse_side_ids(self) -> list[str]:
        """The ids reported on the side that is worse (or on the side that has them)."""
        if self.change == "better" or self.change == "only-a":
            return sorted(set(self.findings_a) - set(self.findings_b)) or self.findings_a
        return sorted(set(self.findings_b) - set(self.findings_a)) or self.findings_b

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe, "device_a": self.device_a, "device_b": self.device_b,
            "a": self.a, "b": self.b, "change": self.change,
            "findings_a": self.findings_a, "findings_b": self.findings_b,
            "explained_by": self.explained_by,
        }


def _results(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report.get("results") or [] if isinstance(r, dict)]


def _device(result: dict[str, Any] | None) -> str | None:
    return _s(result["device"]) if result and result.get("device") is not None else None


def _finding_ids(result: dict[str, Any] | None) -> list[str]:
    findings = (result or {}).get("findings") or []
    return sorted({_s(f.get("kb_id")) for f in findings if isinstance(f, dict)})


def pair_results(a: dict[str, Any], b: dict[str, Any]) -> list[Verdict]:
    """Results of A and B paired by (probe, device), then leftovers by probe, in A's order. A
    report whose torch was imported has passed `torch-import` (a scan reports it only when it
    fails)."""
    ra, rb = _results(a), _results(b)
    for mine, theirs, report in ((ra, rb, a), (rb, ra, b)):
        if (any(r.get("probe") == TORCH_IMPORT_PROBE for r in theirs)
                and not any(r.get("probe") == TORCH_IMPORT_PROBE for r in mine) and torch_missing(report) is None):
            mine.insert(0, {"probe": TORCH_IMPORT_PROBE, "device": None, "status": "pass", "summary": "torch imported",
                            "findings": []})
    free = list(range(len(rb)))  # indices of B's results not paired yet
    matched: list[int | None] = [None] * len(ra)
    for same_device in (True, False):
        for i, x in enumerate(ra):
            if matched[i] is not None:
                continue
            j = next((j for j in free if rb[j].get("probe") == x.get("probe")
                      and (not same_device or rb[j].get("device") == x.get("device"))), None)
            if j is not None:
                free.remove(j)
                matched[i] = j
    pairs = [(x, rb[j] if j is not None else None) for x, j in zip(ra, matched)] + [(None, rb[j]) for j in free]
    out = []
    for x, y in pairs:
        out.append(Verdict(
            probe=_s((x or y or {}).get("probe")),
            device_a=_device(x), device_b=_device(y),
            a=_s(x.get("status")) if x else None,
            b=_s(y.get("status")) if y else None,
            findings_a=_finding_ids(x), findings_b=_finding_ids(y),
            summary_a=_s(x.get("summary") or "") if x else None,
            summary_b=_s(y.get("summary") or "") if y else None,
        ))
    return out


def _ran(status: str | None) -> bool:
    return status is not None and status != "skipped"


@dataclass
class Coverage:
    """A probe that ran in one report only, and why the other report has no verdict for it."""

    probe: str
    device: str | None
    ran_on: str  # "a" or "b"
    status: str  # its status where it ran
    other: str  # "not in the scan", or "skipped: <summary>"

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "device": self.device, "ran_on": self.ran_on, "status": self.status,
                "other": self.other}


def _coverage(v: Verdict) -> Coverage | None:
    """The coverage difference `v` is, or None when it is a verdict to compare (both sides ran, or
    the side that ran has a problem) or neither side ran."""
    ran_a, ran_b = _ran(v.a), _ran(v.b)
    if ran_a == ran_b:
        return None
    side = "a" if ran_a else "b"
    status = v.a if ran_a else v.b
    if status in ("fail", "crashed", "timed_out"):
        return None  # a failure stays a verdict: what the other side did not run cannot excuse it
    other_status, other_summary = (v.b, v.summary_b) if ran_a else (v.a, v.summary_a)
    other = "not in the scan" if other_status is None else f"skipped: {other_summary or 'no reason given'}"
    return Coverage(v.probe, v.device_a if ran_a else v.device_b, side, status or "", other)


# --- the diff ------------------------------------------------------------------------------------


@dataclass
class Difference:
    key: str
    category: str
    label: str
    a: Any
    b: Any
    score: int = 0
    explains: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {"key": self.key, "category": self.category, "label": self.label, "a": self.a, "b": self.b,
               "score": self.score, "explains": self.explains}
        if isinstance(self.a, list) or isinstance(self.b, list):
            la, lb = set(self.a or []), set(self.b or [])
            out["added"] = sorted(lb - la)
            out["removed"] = sorted(la - lb)
        return out


@dataclass
class Diff:
    a: dict[str, Any]  # who: file, created, tool version, counts
    b: dict[str, Any]
    verdicts: list[Verdict]  # those that changed, most severe first
    differences: list[Difference]  # ranked
    coverage: list[Coverage] = field(default_factory=list)  # probes that ran in one report only
    unmeasured: dict[str, list[str]] = field(default_factory=dict)  # side -> labels it could not measure

    @property
    def verdicts_changed(self) -> bool:
        return bool(self.verdicts)

    @property
    def levels_differ(self) -> bool:
        return self.a.get("level") != self.b.get("level")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": DIFF_SCHEMA_VERSION,
            "kind": "gpudoctor-diff",
            "summary": summary_line(self),
            "a": self.a,
            "b": self.b,
            "verdicts_changed": self.verdicts_changed,
            "levels_differ": self.levels_differ,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "coverage": [c.to_dict() for c in self.coverage],
            "unmeasured": self.unmeasured,
            "differences": [d.to_dict() for d in self.differences],
        }


def _who(report: dict[str, Any], name: str) -> dict[str, Any]:
    counts = {s: 0 for s in _SEVERITY}
    for r in _results(report):
        if r.get("status") in counts:
            counts[r["status"]] += 1
    level = report.get("level") if report.get("level") in ("quick", "deep") else "deep"
    probes = lookup(report, "invocation", "options", "probes")
    return {"file": _s(name), "created": _s(report.get("created", "")),
            "tool_version": _s(lookup(report, "tool", "version") or ""), "level": level, "counts": counts,
            "only_probes": sorted({_s(p) for p in probes}) if isinstance(probes, list) else []}


def _worse_side(v: Verdict) -> str:
    return "a" if v.change in ("better", "only-a") else "b"


def diff_reports(a: dict[str, Any], b: dict[str, Any], *, name_a: str = "A", name_b: str = "B",
                 kb: Iterable[Any] | None = None, emits: Mapping[str, Iterable[str]] | None = None) -> Diff:
    """Compare two report dicts (already validated) and rank what differs (module docstring)."""
    if kb is None:
        from gpudoctor.knowledge.kb import load_all

        kb = load_all()
    kb = tuple(kb)
    if emits is None:
        emits = probe_emits()
    fa, fb = facts(a), facts(b)
    gaps = {"a": _unmeasured_sections(a), "b": _unmeasured_sections(b)}
    differences = []
    unmeasured: dict[str, list[str]] = {}
    for key in list(fa) + [k for k in fb if k not in fa]:
        x, y = fa.get(key), fb.get(key)
        va, vb = (x.value if x else None), (y.value if y else None)
        if va == vb:
            continue
        ref = x or y
        absent = "a" if x is None else "b" if y is None else None
        if absent and _fact_section(key) in gaps[absent]:
            unmeasured.setdefault(absent, []).append(ref.label)  # type: ignore[union-attr]
            continue
        differences.append(Difference(key, ref.category, ref.label, va, vb))  # type: ignore[union-attr]

    paired = [v for v in pair_results(a, b) if v.change != "same"]
    coverage = [c for c in map(_coverage, paired) if c is not None]
    verdicts = [v for v in paired if _coverage(v) is None and (_ran(v.a) or _ran(v.b))]
    missing = {"a": torch_missing(a), "b": torch_missing(b)}
    for v in verdicts:
        reported = set(v.worse_side_ids)
        possible = detectable_by(v.probe, kb, emits)
        for d in differences:
            if d.key == "torch" and missing[_worse_side(v)] is not None and missing[_worse_side(v)] in (d.a, d.b):
                # No torch on the worse side: every failure there follows from it.
                d.explains.append({"probe": v.probe, "kb_id": "torch-import-failed", "link": "root"})
                d.score = max(d.score, 4)
                continue
            ids = set(bears_on(d.key))
            strong = sorted(ids & reported)
            weak = sorted((ids & possible) - reported)
            if strong:
                link = {"probe": v.probe, "kb_id": strong[0], "link": "reported"}
                d.score = max(d.score, 3)
            elif weak:
                link = {"probe": v.probe, "kb_id": weak[0], "link": "detectable"}
                d.score = max(d.score, 2)
            else:
                continue
            d.explains.append(link)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    differences.sort(key=lambda d: (-d.score, order.get(d.category, len(order)), d.key))
    strength = {"root": 0, "reported": 1, "detectable": 2}
    for v in verdicts:
        linked = []
        for d in differences:
            for link in d.explains:
                if link["probe"] == v.probe:
                    linked.append({"key": d.key, "label": d.label, "kb_id": link["kb_id"], "link": link["link"]})
        v.explained_by = sorted(linked, key=lambda e: strength.get(e["link"], 3))  # stable: rank kept
    verdicts.sort(key=lambda v: (
        {"worse": 0, "only-b": 1, "changed": 2, "better": 3, "only-a": 4}[v.change],
        -max(_SEVERITY.get(v.a or "", 0), _SEVERITY.get(v.b or "", 0)), v.probe))
    return Diff(_who(a, name_a), _who(b, name_b), verdicts, differences, coverage, unmeasured)


# --- rendering -----------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, list):
        return ", ".join(value) if value else "(none)"
    return str(value)


def _change_text(d: Difference) -> str:
    if isinstance(d.a, list) and isinstance(d.b, list):
        la, lb = set(d.a), set(d.b)
        parts = []
        if lb - la:
            parts.append("+" + " +".join(sorted(lb - la)))
        if la - lb:
            parts.append("-" + " -".join(sorted(la - lb)))
        return " ".join(parts)
    return f"{_value(d.a)} -> {_value(d.b)}"


def _status(v: Verdict, side: str) -> str:
    status = v.a if side == "a" else v.b
    if status is None:
        return "(not run)"
    ids = v.findings_a if side == "a" else v.findings_b
    return status + (f" [{', '.join(ids)}]" if ids else "")


def _verdict_head(v: Verdict) -> str:
    device = v.device_b or v.device_a
    where = f" on {device}" if device else ""
    if v.device_a and v.device_b and v.device_a != v.device_b:
        where = f" on {v.device_a} / {v.device_b}"
    return f"{v.probe}{where}: {_status(v, 'a')} -> {_status(v, 'b')}"


def _link_text(link: dict[str, Any], side: str = "") -> str:
    if link["link"] == "root":
        where = f" on {side.upper()}" if side else ""
        return f"torch cannot be imported{where}: every probe that needs it fails or is skipped there"
    how = "reports" if link["link"] == "reported" else "checks for"
    return f"bears on {link['kb_id']}, which {link.get('probe', 'the probe')} {how}"


def _difference(diff: Diff, key: str) -> Difference:
    return next(d for d in diff.differences if d.key == key)


def _cause(diff: Diff, v: Verdict) -> str:
    """The likeliest cause of `v`, in a few words, or what says there is none."""
    if not v.explained_by:
        return "no environment difference is known to bear on it"
    d = _difference(diff, v.explained_by[0]["key"])
    return f"likely: {d.label} {_change_text(d)}"


def levels_note(diff: Diff) -> str:
    """One line when A and B ran at different scan levels, else empty."""
    if not diff.levels_differ:
        return ""
    return (f"A ran at the {diff.a['level']} level and B at the {diff.b['level']} level: verdicts are "
            "compared, the matrices in the details differ in size by design")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def coverage_groups(diff: Diff) -> list[tuple[str, str, list[str]]]:
    """Coverage differences grouped: (side it ran on, why the other has no verdict, probes)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for c in diff.coverage:
        groups.setdefault((c.ran_on, c.other), []).append(c.probe + (f" on {c.device}" if c.device else ""))
    return [(side, why, probes) for (side, why), probes in groups.items()]


def _coverage_head(diff: Diff, side: str, why: str, n: int) -> str:
    other = "B" if side == "a" else "A"
    only = diff.b["only_probes"] if side == "a" else diff.a["only_probes"]
    if why == "not in the scan":
        why = f"not in {other}'s scan" + (f" (made with --probe {' --probe '.join(only)})" if only else "")
    else:
        why = why.replace("skipped: ", f"skipped on {other}: ", 1)
    return f"{_plural(n, 'probe')} ran on {side.upper()} only, {why}"


def summary_line(diff: Diff) -> str:
    """The verdict in one line (`gpudoctor diff -q`, and the first line of the text): which
    verdicts changed and the likeliest cause of the first, how many probes ran in one report
    only, and how many environment differences there are."""
    parts = []
    if diff.verdicts:
        first = diff.verdicts[0]
        parts.append(f"{_plural(len(diff.verdicts), 'verdict')} changed, first {_verdict_head(first)}")
        parts.append(_cause(diff, first))
    else:
        parts.append("same verdicts on A and B" + (" where both ran" if diff.coverage else ""))
    for side in ("a", "b"):
        n = sum(c.ran_on == side for c in diff.coverage)
        if n:
            parts.append(f"{_plural(n, 'probe')} ran on {side.upper()} only")
    differences = _plural(len(diff.differences), "environment difference")
    if diff.levels_differ:
        differences += f"; levels {diff.a['level']} / {diff.b['level']}"
    parts.append(differences)
    return visible("; ".join(parts), 2000)


def render_text(diff: Diff, console: "Console", *, verbose: bool = False) -> None:
    """The diff for people: the verdict line first (the cause of the first changed verdict), then
    changed verdicts with their likeliest causes (three each; every one with `verbose`), the
    probes that ran in one report only, and every difference, most relevant first."""
    from rich.text import Text

    def say(text: str = "", style: str = "", indent: int = 0) -> None:
        console.print(Text(" " * indent + text, style=style), highlight=False, soft_wrap=True)

    a, b = diff.a, diff.b
    say(f"gpudoctor: {summary_line(diff)}", "bold")
    say(f"A: {a['file']} (gpudoctor {a['tool_version']}, {a['created']}, {a['level']} level)")
    say(f"B: {b['file']} (gpudoctor {b['tool_version']}, {b['created']}, {b['level']} level)")
    if diff.levels_differ:
        say(levels_note(diff), "yellow")
    say()
    if diff.verdicts:
        say(f"Verdicts that changed ({len(diff.verdicts)})", "bold underline")
        for v in diff.verdicts:
            style = "bold red" if v.change in ("worse", "only-b") else "green" if v.change == "better" else ""
            say(_verdict_head(v), style, 2)
            links = v.explained_by if verbose else v.explained_by[:3]
            for e in links:
                d = _difference(diff, e["key"])
                say(f"likely: {d.label} {_change_text(d)} ({_link_text(dict(e, probe=v.probe), _worse_side(v))})",
                    indent=4)
            if len(links) < len(v.explained_by):
                say(f"... {len(v.explained_by) - len(links)} more (-v shows them)", "dim", 4)
            if not v.explained_by:
                say("no environment difference is known to bear on this probe", "dim", 4)
    else:
        say("Every probe that ran in both reports has the same verdict." if diff.coverage
            else "Every probe has the same verdict on A and B.", "bold green")
    if diff.coverage:
        say()
        say(f"Ran in one report only ({len(diff.coverage)}): coverage, not a changed verdict", "bold underline")
        for side, why, probes in coverage_groups(diff):
            say(_coverage_head(diff, side, why, len(probes)), indent=2)
            say(", ".join(probes), "dim", 4)
    for side in ("a", "b"):
        if diff.unmeasured.get(side):
            say()
            say(f"Not measured on {side.upper()}, where torch could not be imported: "
                + ", ".join(diff.unmeasured[side]), "dim")
    say()
    if diff.differences:
        say(f"Differences, most relevant first ({len(diff.differences)})", "bold underline")
        for n, d in enumerate(diff.differences, 1):
            why = f"  <- {_link_text(d.explains[0], _root_side(diff, d))}" if d.explains else ""
            say(f"{n}. {d.label}: {_change_text(d)}{why}", "bold" if d.score else "", 2)
            if verbose:
                for link in d.explains[1:]:
                    say(f"<- {_link_text(link, _root_side(diff, d))}", indent=6)
    else:
        say("The environments do not differ in anything gpudoctor compares.")


def _root_side(diff: Diff, d: Difference) -> str:
    """The side whose torch is missing, for a root-cause difference."""
    if d.key != "torch":
        return ""
    return "a" if isinstance(d.a, str) and (d.a == "not installed" or d.a.startswith("cannot be imported")) else "b"


def render_markdown(diff: Diff) -> str:
    def cell(value: Any) -> str:
        return md.code_span(value, table=True)

    a, b = diff.a, diff.b
    out = ["## gpudoctor diff", "",
           f"**{md.text(summary_line(diff))}**", "",
           f"- **A**: {md.code_span(a['file'])}, gpudoctor {md.code_span(a['tool_version'])}, {md.code_span(a['created'])}",
           f"- **B**: {md.code_span(b['file'])}, gpudoctor {md.code_span(b['tool_version'])}, {md.code_span(b['created'])}",
           ""]
    out[4] += f", {md.text(a['level'])} level"
    out[5] += f", {md.text(b['level'])} level"
    if diff.levels_differ:
        out += [f"**{md.text(levels_note(diff))}**", ""]
    if diff.verdicts:
        out += [f"### Verdicts that changed ({len(diff.verdicts)})", "",
                "| Probe | A | B | Most likely because |", "|---|---|---|---|"]
        for v in diff.verdicts:
            because = []
            for e in v.explained_by[:3]:
                d = _difference(diff, e["key"])
                because.append(f"{cell(d.label)} {cell(_change_text(d))} "
                               f"({md.text(_link_text(dict(e, probe=v.probe), _worse_side(v)))})")
            out.append(f"| {cell(v.probe)} | {cell(_status(v, 'a'))} | **{cell(_status(v, 'b'))}** | "
                       + ("<br>".join(because) or "no known link") + " |")
    else:
        out += ["Every probe that ran in both reports has the same verdict." if diff.coverage
                else "Every probe has the same verdict on A and B."]
    if diff.coverage:
        out += ["", f"### Ran in one report only ({len(diff.coverage)}): coverage, not a changed verdict", ""]
        for side, why, probes in coverage_groups(diff):
            out.append(f"- {md.text(_coverage_head(diff, side, why, len(probes)))}: "
                       + ", ".join(md.code_span(p) for p in probes))
    for side in ("a", "b"):
        if diff.unmeasured.get(side):
            out += ["", f"Not measured on {side.upper()}, where torch could not be imported: "
                    + ", ".join(md.code_span(label) for label in diff.unmeasured[side])]
    out += ["", f"### Differences, most relevant first ({len(diff.differences)})", ""]
    if diff.differences:
        out += ["| # | What | A | B | Explains |", "|---:|---|---|---|---|"]
        for n, d in enumerate(diff.differences, 1):
            why = md.cell("; ".join(_link_text(e, _root_side(diff, d)) for e in d.explains[:3]))
            out.append(f"| {n} | {cell(d.label)} | {cell(_value(d.a))} | {cell(_value(d.b))} | {why} |")
    else:
        out.append("The environments do not differ in anything gpudoctor compares.")
    return "\n".join(out) + "\n"


def render_json(diff: Diff) -> str:
    return json.dumps(diff.to_dict(), indent=2, ensure_ascii=False) + "\n"
