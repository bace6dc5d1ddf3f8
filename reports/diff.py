"""`gpudoctor diff A.json B.json`: what differs between two reports, the differences that explain a
changed verdict first.

`facts(report)` flattens a report's environment into named facts (versions, driver, GPUs and their
architectures, torch's arch list, loaded CUDA libraries, environment variables, system).
`diff_reports(a, b)` compares the facts and the probe verdicts and ranks the differences:

1. A verdict changed when a probe's status or its findings' ids differ between A and B (results are
   paired by probe and device, then by probe alone, so `cuda:0` on one machine meets `cuda:1` on
   the other).
2. "Known to cause" is derived from data, not written per pair: a probe can detect an id when the
   knowledge-base entry lists the probe in `probes` or the probe's SPEC lists the id in `emits`; an
   environment fact bears on the ids that `BEARS_ON` (below) names for it. A difference is
   *linked* to a changed verdict when its fact bears on an id that the probe reported on the worse
   side (score 3), or on an id the probe can detect (score 2); unlinked differences score 0.
3. Differences are ranked by score, then by `CATEGORIES` order (driver before packages), then by
   name. Each changed verdict lists the differences linked to it, strongest first.
4. Reports made at different scan levels (`gpudoctor scan --level`; a report without one predates
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

DIFF_SCHEMA_VERSION = "1.1"  # 1.1: each side's scan `level`, and `levels_differ`
CATEGORIES = ("driver", "torch", "gpu", "arch", "libraries", "packages", "python", "env", "system")
_SEVERITY = {"pass": 0, "skipped": 1, "warn": 2, "fail": 3, "crashed": 3, "timed_out": 3}
_VALUE_CHARS = 300

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
    """Results of A and B paired by (probe, device), then leftovers by probe, in A's order."""
    ra, rb = _results(a), _results(b)
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
        ))
    return out


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
            "a": self.a,
            "b": self.b,
            "verdicts_changed": self.verdicts_changed,
            "levels_differ": self.levels_differ,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "differences": [d.to_dict() for d in self.differences],
        }


def _who(report: dict[str, Any], name: str) -> dict[str, Any]:
    counts = {s: 0 for s in _SEVERITY}
    for r in _results(report):
        if r.get("status") in counts:
            counts[r["status"]] += 1
    level = report.get("level") if report.get("level") in ("quick", "deep") else "deep"
    return {"file": _s(name), "created": _s(report.get("created", "")),
            "tool_version": _s(lookup(report, "tool", "version") or ""), "level": level, "counts": counts}


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
    differences = []
    for key in list(fa) + [k for k in fb if k not in fa]:
        x, y = fa.get(key), fb.get(key)
        va, vb = (x.value if x else None), (y.value if y else None)
        if va != vb:
            ref = x or y
            differences.append(Difference(key, ref.category, ref.label, va, vb))  # type: ignore[union-attr]

    verdicts = [v for v in pair_results(a, b) if v.change != "same"]
    for v in verdicts:
        reported = set(v.worse_side_ids)
        possible = detectable_by(v.probe, kb, emits)
        for d in differences:
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
    for v in verdicts:
        linked = []
        for d in differences:
            for link in d.explains:
                if link["probe"] == v.probe:
                    linked.append({"key": d.key, "label": d.label, "kb_id": link["kb_id"], "link": link["link"]})
        v.explained_by = sorted(linked, key=lambda e: e["link"] != "reported")  # stable: rank kept
    verdicts.sort(key=lambda v: (
        {"worse": 0, "only-b": 1, "changed": 2, "better": 3, "only-a": 4}[v.change],
        -max(_SEVERITY.get(v.a or "", 0), _SEVERITY.get(v.b or "", 0)), v.probe))
    return Diff(_who(a, name_a), _who(b, name_b), verdicts, differences)


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


def _link_text(link: dict[str, Any]) -> str:
    how = "reports" if link["link"] == "reported" else "checks for"
    return f"bears on {link['kb_id']}, which {link.get('probe', 'the probe')} {how}"


def levels_note(diff: Diff) -> str:
    """One line when A and B ran at different scan levels, else empty."""
    if not diff.levels_differ:
        return ""
    return (f"A ran at the {diff.a['level']} level and B at the {diff.b['level']} level: verdicts are "
            "compared, the matrices in the details differ in size by design")


def summary_line(diff: Diff) -> str:
    """The verdict in one line (`gpudoctor diff -q`): which verdicts changed, with the likeliest
    cause of the first, or that none did."""
    n = len(diff.differences)
    differences = f"{n} environment difference{'s' * (n != 1)}"
    if diff.levels_differ:
        differences += f"; levels {diff.a['level']} / {diff.b['level']}"
    if not diff.verdicts:
        return f"same verdicts on A and B; {differences}"
    first = diff.verdicts[0]
    line = f"{len(diff.verdicts)} verdict{'s' * (len(diff.verdicts) != 1)} changed, first {_verdict_head(first)}"
    if first.explained_by:
        d = next(d for d in diff.differences if d.key == first.explained_by[0]["key"])
        line += f"; likely: {d.label} {_change_text(d)}"
    return visible(f"{line}; {differences}", 2000)


def render_text(diff: Diff, console: "Console", *, verbose: bool = False) -> None:
    """The diff for people: changed verdicts with their likeliest causes (three each; every one
    with `verbose`), then every difference, most relevant first."""
    from rich.text import Text

    def say(text: str = "", style: str = "", indent: int = 0) -> None:
        console.print(Text(" " * indent + text, style=style), highlight=False, soft_wrap=True)

    a, b = diff.a, diff.b
    say(f"A: {a['file']} (gpudoctor {a['tool_version']}, {a['created']}, {a['level']} level)", "bold")
    say(f"B: {b['file']} (gpudoctor {b['tool_version']}, {b['created']}, {b['level']} level)", "bold")
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
                d = next(d for d in diff.differences if d.key == e["key"])
                say(f"likely: {d.label} {_change_text(d)} ({_link_text(dict(e, probe=v.probe))})", indent=4)
            if len(links) < len(v.explained_by):
                say(f"... {len(v.explained_by) - len(links)} more (-v shows them)", "dim", 4)
            if not v.explained_by:
                say("no environment difference is known to bear on this probe", "dim", 4)
    else:
        say("Every probe has the same verdict on A and B.", "bold green")
    say()
    if diff.differences:
        say(f"Differences, most relevant first ({len(diff.differences)})", "bold underline")
        for n, d in enumerate(diff.differences, 1):
            why = f"  <- {_link_text(d.explains[0])}" if d.explains else ""
            say(f"{n}. {d.label}: {_change_text(d)}{why}", "bold" if d.score else "", 2)
            if verbose:
                for link in d.explains[1:]:
                    say(f"<- {_link_text(link)}", indent=6)
    else:
        say("The environments do not differ in anything gpudoctor compares.")


def render_markdown(diff: Diff) -> str:
    def cell(value: Any) -> str:
        return md.code_span(value, table=True)

    a, b = diff.a, diff.b
    out = ["## gpudoctor diff", "",
           f"- **A**: {md.code_span(a['file'])}, gpudoctor {md.code_span(a['tool_version'])}, {md.code_span(a['created'])}",
           f"- **B**: {md.code_span(b['file'])}, gpudoctor {md.code_span(b['tool_version'])}, {md.code_span(b['created'])}",
           ""]
    out[2] += f", {md.text(a['level'])} level"
    out[3] += f", {md.text(b['level'])} level"
    if diff.levels_differ:
        out += [f"**{md.text(levels_note(diff))}**", ""]
    if diff.verdicts:
        out += [f"### Verdicts that changed ({len(diff.verdicts)})", "",
                "| Probe | A | B | Most likely because |", "|---|---|---|---|"]
        for v in diff.verdicts:
            because = []
            for e in v.explained_by[:3]:
                d = next(d for d in diff.differences if d.key == e["key"])
                because.append(f"{cell(d.label)} {cell(_change_text(d))} "
                               f"({md.text(_link_text(dict(e, probe=v.probe)))})")
            out.append(f"| {cell(v.probe)} | {cell(_status(v, 'a'))} | **{cell(_status(v, 'b'))}** | "
                       + ("<br>".join(because) or "no known link") + " |")
    else:
        out += ["Every probe has the same verdict on A and B."]
    out += ["", f"### Differences, most relevant first ({len(diff.differences)})", ""]
    if diff.differences:
        out += ["| # | What | A | B | Explains |", "|---:|---|---|---|---|"]
        for n, d in enumerate(diff.differences, 1):
            why = md.cell("; ".join(_link_text(e) for e in d.explains[:3]))
            out.append(f"| {n} | {cell(d.label)} | {cell(_value(d.a))} | {cell(_value(d.b))} | {why} |")
    else:
        out.append("The environments do not differ in anything gpudoctor compares.")
    return "\n".join(out) + "\n"


def render_json(diff: Diff) -> str:
    return json.dumps(diff.to_dict(), indent=2, ensure_ascii=False) + "\n"
