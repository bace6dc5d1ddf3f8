"""Probe `arch-compat`: does this torch, and every CUDA extension installed beside it, carry code
that runs on this GPU?

Predicts "no kernel image is available for execution on the device" before any kernel launches.
torch answers from `torch.cuda.get_arch_list()`; every other library answers from the fatbinary
embedded in its shared objects (read by `gpudoctor.scan.fatbin`, headers only): xformers, flash_attn
(and its top-level `flash_attn_2_cuda*.so`), flash_attn_3, sageattention, bitsandbytes, torch's
own `lib/libtorch_cuda*.so`, JIT-built torch extensions, and any other `*.so` under site-packages
with a `.nv_fatbin` section. The scan is bounded in files and time.

On a CUDA device it compares (SASS of the same major at or below the GPU's minor; PTX at or below
the capability, by JIT; `a`/`f` variants only on their arch/family). Without one it cannot compare:
it skips, listing for which GPUs each library has code.

Only code that can run here is judged. A package that ships one build per CUDA version
(`libbitsandbytes_cuda118.so` ... `_cuda130.so`) is judged by the variant it loads for this torch's
CUDA, as bitsandbytes chooses it; the others are listed, not judged. A library with no code for
the GPU while the rest of its package (torch's arch list, for torch's own libraries) has some is a
warning: part of the package works (torch 2.11's libtorch_cuda_linalg.so has no sm_75, the rest
of torch does). A file not read in full within the time budget (a cold network filesystem) is
listed with what was read; the budget is ours, not the user's problem, and never a warning.
"""
from __future__ import annotations

import fnmatch
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from gpudoctor.scan import fatbin
from gpudoctor.probes.base import ProbeFinding, Outcome, ProbeContext, ProbeSpec, Status, counted, error_text

SPEC = ProbeSpec(
    id="arch-compat",
    title="Architecture coverage: torch and CUDA extensions carry code for this GPU",
    timeout_s=30.0,
    emits=("no-kernel-image",),
    per_device=True,
    gpu_memory_mib=0,
    description=(
        "Reads torch's arch list and the fatbinary of every CUDA extension (xformers, flash_attn, "
        "sageattention, bitsandbytes, torch extensions, ...) and predicts no-kernel-image."
    ),
    runs_on_cpu=False,
)

# Packages known to ship CUDA kernels, as glob patterns relative to a site-packages folder. Their
# files are read whatever their size: only fatbin headers are read, never the payloads.
KNOWN_PATTERNS: tuple[tuple[str, str], ...] = (
    ("xformers", "xformers/**"),
    ("flash_attn", "flash_attn_2_cuda*.so"),
    ("flash_attn", "flash_attn/**"),
    ("flash_attn_3", "flash_attn_3/**"),
    ("flash_attn_3", "flash_attn_3*.so"),
    ("sageattention", "sageattention/**"),
    ("sageattention", "_qattn*.so"),
    ("bitsandbytes", "bitsandbytes/**"),
)
# NVIDIA's own runtime libraries (cuBLAS, cuDNN, NCCL...) ship for every arch and weigh gigabytes;
# they are not what breaks when an extension was built for the wrong GPU.
SKIP_DIRS = frozenset({"nvidia", "__pycache__", "triton", "site-packages.bak"})
DEFAULTS: dict[str, Any] = {
    "arch_compat_budget_s": 5.0,  # wall-clock budget for finding and reading binaries
    "arch_compat_max_files": 4000,  # ELF files examined in the generic walk
    "arch_compat_size_limit_mib": 256,  # generic walk: larger unknown files are listed, not read
}


# One build per CUDA version, as bitsandbytes ships them: libbitsandbytes_cuda126.so,
# libbitsandbytes_cuda118_nocublaslt.so (older releases, for GPUs below sm_75).
_PER_CUDA = re.compile(r"^(?P<stem>.+?)_cuda(?P<ver>\d{3,4})(?P<nocublaslt>_nocublaslt)?\.so$")


def _cuda_tuple(ver: str) -> tuple[int, int]:
    return int(ver[:-1]), int(ver[-1])


def loaded_variant(versions: Sequence[str], torch_cuda: str | None,
                   override: str | None = None) -> str | None:
    """The CUDA version string of the per-CUDA build a package loads, bitsandbytes' rule: the
    BNB_CUDA_VERSION override as given; else torch's CUDA exactly; else the highest version at or
    below it with the same major; else the lowest above it with the same major; else None."""
    if override:
        return override if override in versions else None
    if not torch_cuda:
        return None
    try:
        major, minor = (int(x) for x in torch_cuda.split(".")[:2])
    except ValueError:
        return None
    want = f"{major}{minor}"
    if want in versions:
        return want
    same = sorted((v for v in versions if _cuda_tuple(v)[0] == major), key=_cuda_tuple)
    below = [v for v in same if _cuda_tuple(v) <= (major, minor)]
    above = [v for v in same if _cuda_tuple(v) > (major, minor)]
    return below[-1] if below else above[0] if above else None


def mark_unloaded_variants(libraries: list[dict[str, Any]], torch_cuda: str | None,
                           capability: tuple[int, int] | None) -> None:
    """Set `not_loaded` (the reason) on per-CUDA builds this torch does not load."""
    groups: dict[tuple[str, str], list[tuple[dict[str, Any], re.Match]]] = {}
    for lib in libraries:
        match = _PER_CUDA.match(os.path.basename(lib["path"]))
        if match:
            groups.setdefault((os.path.dirname(lib["path"]), match["stem"]), []).append((lib, match))
    override = os.environ.get("BNB_CUDA_VERSION") or None
    for (_, stem), members in groups.items():
        versions = sorted({m["ver"] for _, m in members})
        chosen = loaded_variant(versions, torch_cuda, override)
        # Below sm_75 old bitsandbytes loads the _nocublaslt build of that version.
        want_nocublaslt = capability is not None and capability < (7, 5) and any(
            m["nocublaslt"] and m["ver"] == chosen for _, m in members)
        why = (f"BNB_CUDA_VERSION={override}" if override else f"torch's CUDA {torch_cuda}")
        for lib, match in members:
            if match["ver"] == chosen and bool(match["nocublaslt"]) == want_nocublaslt:
                lib["loaded_variant"] = True
                continue
            lib["not_loaded"] = (f"{stem}_cuda{chosen}{'_nocublaslt' if want_nocublaslt else ''}.so is "
                                 f"the build loaded for {why}" if chosen else
                                 f"no {stem} build matches {why}")


@dataclass(frozen=True)
class Candidate:
    """A shared object to read: its display name, path and the package it belongs to."""

    label: str
    path: str
    package: str
    unlimited: bool = True  # read whatever its size


def _option(ctx: ProbeContext, key: str) -> Any:
    return ctx.options.get(key, DEFAULTS.get(key))


def site_roots() -> list[str]:
    """The site-packages folders of this interpreter (the target environment)."""
    import site

    roots: list[str] = []
    try:
        roots.extend(site.getsitepackages())
    except Exception:  # virtualenv's old site.py has no getsitepackages
        pass
    try:
        roots.append(site.getusersitepackages())
    except Exception:
        pass
    roots.extend(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    return _existing_dirs(roots)


def extension_dirs() -> list[str]:
    """Where torch.utils.cpp_extension builds JIT extensions: TORCH_EXTENSIONS_DIR, else the
    default under the cache folder."""
    dirs = []
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        dirs.append(os.environ["TORCH_EXTENSIONS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    dirs.append(os.path.join(cache, "torch_extensions"))
    return _existing_dirs(dirs)


def _existing_dirs(paths: Iterable[str]) -> list[str]:
    out, seen = [], set()
    for path in paths:
        if not path or not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


def _is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _walk(top: str, max_depth: int) -> Iterator[str]:
    """Shared objects under `top`, skipping NVIDIA's runtime folders and symlinked folders."""
    base_depth = top.rstrip(os.sep).count(os.sep)
    for dirpath, dirnames, filenames in os.walk(top):
        depth = dirpath.count(os.sep) - base_depth
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in SKIP_DIRS and not d.endswith((".dist-info", ".egg-info")) and depth < max_depth
        )
        for name in sorted(filenames):
            if _is_shared_object(name):
                yield os.path.join(dirpath, name)


def candidates(
    roots: Sequence[str], ext_dirs: Sequence[str], torch_dir: str | None
) -> Iterator[Candidate]:
    """Binaries to read, most important first: torch's CUDA libraries, the known packages, torch
    extensions, then every other shared object under site-packages (read only if small enough)."""
    if torch_dir:
        lib = os.path.join(torch_dir, "lib")
        if os.path.isdir(lib):
            for name in sorted(os.listdir(lib)):
                if _is_shared_object(name) and "cuda" in name:
                    yield Candidate(f"torch/lib/{name}", os.path.join(lib, name), "torch")
    for root in roots:
        try:
            listing = sorted(os.listdir(root))
        except OSError:
            continue
        for package, pattern in KNOWN_PATTERNS:
            head = pattern.split("/", 1)[0]
            if "/" not in pattern:
                for name in listing:
                    if fnmatch.fnmatch(name, pattern) and os.path.isfile(os.path.join(root, name)):
                        yield Candidate(name, os.path.join(root, name), package)
                continue
            for entry in listing:
                folder = os.path.join(root, entry)
                if fnmatch.fnmatch(entry, head) and os.path.isdir(folder):
                    for path in _walk(folder, max_depth=4):
                        yield Candidate(os.path.relpath(path, root), path, package)
    for top in ext_dirs:
        for path in _walk(top, max_depth=4):
            yield Candidate("torch_extensions/" + os.path.relpath(path, top), path, "torch_extensions")
    for root in roots:
        for path in _walk(root, max_depth=6):
            rel = os.path.relpath(path, root)
            package = rel.split(os.sep, 1)[0]
            # torch's own libraries are read whatever their size (headers only).
            yield Candidate(rel, path, package, unlimited=package == "torch")


@dataclass(frozen=True)
class Scan:
    """What the bounded scan read and what it left out."""

    reports: list[tuple[Candidate, fatbin.FatbinReport]]
    left_out: list[str]
    examined: int
    truncated: bool
    elapsed_s: float


def scan_binaries(
    roots: Sequence[str],
    ext_dirs: Sequence[str],
    torch_dir: str | None = None,
    *,
    budget_s: float = 5.0,
    max_files: int = 4000,
    size_limit: int = 256 << 20,
) -> Scan:
    """Read the fatbin of every candidate that has one, within the file and time budgets.
    Never raises for a bad file: its report carries the error."""
    start = time.monotonic()
    seen: set[str] = set()
    reports: list[tuple[Candidate, fatbin.FatbinReport]] = []
    left_out: list[str] = []
    examined = 0
    truncated = False
    for cand in candidates(roots, ext_dirs, torch_dir):
        if time.monotonic() - start > budget_s or examined >= max_files:
            truncated = True
            break
        real = os.path.realpath(cand.path)
        if real in seen:
            continue
        seen.add(real)
        try:
            size = os.path.getsize(real)
        except OSError:
            continue
        if not cand.unlimited and size > size_limit:
            left_out.append(f"{cand.label} ({size >> 20} MiB, over the size limit)")
            continue
        examined += 1
        report = fatbin.read_fatbin(real, deadline=start + budget_s)
        # A known package's file without a fatbin is just Python glue; report only CUDA code,
        # and damaged files wherever they are (they may be CUDA code we could not read).
        if report.has_fatbin or (report.error and cand.unlimited):
            reports.append((cand, report))
    return Scan(reports, left_out, examined, truncated, time.monotonic() - start)


def torch_arch_list(torch: Any) -> tuple[list[str], str | None]:
    """torch's compiled arch list, and why it is empty when it is. Guarded: older torch gated it
    on a working GPU, a CPU build has none."""
    try:
        arches = list(torch.cuda.get_arch_list())
    except Exception as exc:  # broken CUDA init must not break the probe
        return [], error_text(exc)
    if not arches:
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        if flags is not None:
            try:
                arches = (flags() or "").split()
            except Exception:
                pass
    if arches:
        return arches, None
    if getattr(torch.version, "cuda", None) is None:
        return [], "torch is a CPU-only build (torch.version.cuda is None)"
    return [], "torch.cuda.get_arch_list() returned nothing"


def _targets(names: Iterable[str]) -> list[fatbin.CodeTarget]:
    out = []
    for name in names:
        try:
            out.append(fatbin.parse_target(name))
        except ValueError:
            continue
    return out


def _capability_text(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    version = getattr(torch, "__version__", "?")
    arches, arch_reason = torch_arch_list(torch)
    torch_targets = _targets(arches)
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "") or None

    roots = ctx.options.get("arch_compat_roots")
    roots = _existing_dirs(roots) if roots is not None else site_roots()
    exts = ctx.options.get("arch_compat_extension_dirs")
    exts = _existing_dirs(exts) if exts is not None else extension_dirs()
    scan = scan_binaries(
        roots,
        exts,
        torch_dir,
        budget_s=float(_option(ctx, "arch_compat_budget_s")),
        max_files=int(_option(ctx, "arch_compat_max_files")),
        size_limit=int(_option(ctx, "arch_compat_size_limit_mib")) << 20,
    )

    capability: tuple[int, int] | None = None
    gpu = None
    if ctx.is_cuda:
        try:
            capability = tuple(torch.cuda.get_device_capability(ctx.device))  # type: ignore[assignment]
            gpu = torch.cuda.get_device_name(ctx.device)
        except Exception as exc:
            ctx.log(f"arch-compat: no capability for {ctx.device}: {error_text(exc)}")

    torch_entry: dict[str, Any] = {
        "version": version,
        "cuda": getattr(torch.version, "cuda", None),
        "arch_list": arches,
        "runs_on": fatbin.supported_capabilities(torch_targets),
        "note": arch_reason,
    }
    libraries: list[dict[str, Any]] = []
    for cand, report in scan.reports:
        entry = {"name": cand.label, "package": cand.package, **report.to_dict()}
        entry["runs_on"] = fatbin.supported_capabilities(report.targets)
        libraries.append(entry)
    mark_unloaded_variants(libraries, getattr(torch.version, "cuda", None), capability)
    details: dict[str, Any] = {
        "device": ctx.device,
        "gpu": gpu,
        "capability": _capability_text(capability) if capability else None,
        "torch": torch_entry,
        "libraries": libraries,
        "scan": {
            "roots": roots,
            "extension_dirs": exts,
            "examined": scan.examined,
            "left_out": scan.left_out,
            "truncated": scan.truncated,
            "elapsed_s": round(scan.elapsed_s, 3),
        },
    }
    # A damaged file is worth a warning; one cut short by our own time budget is not.
    unreadable = [lib["name"] for lib in libraries if lib["error"] and not lib.get("out_of_time")]
    details["scan"]["not_read_in_full"] = [lib["name"] for lib in libraries if lib.get("out_of_time")]

    if capability is None:
        parts = [f"torch carries {fatbin.describe_targets(torch_targets)}" if torch_targets
                 else (arch_reason or "torch's arch list is empty")]
        readable = len(libraries) - len(unreadable)
        parts.append(f"{counted(scan.examined, 'shared library', 'shared libraries')} read, "
                     f"{readable or 'none'} with CUDA code")
        if unreadable:
            parts.append(f"{len(unreadable)} could not be read")
        reason = f"no CUDA device to compare against on {ctx.device}; " + "; ".join(parts)
        return Outcome(Status.SKIPPED, reason, details)

    return _verdict(capability, gpu, ctx.device, version, torch_targets, arch_reason, libraries,
                    details, unreadable)


def _verdict(
    capability: tuple[int, int],
    gpu: str | None,
    device: str,
    version: str,
    torch_targets: list[fatbin.CodeTarget],
    arch_reason: str | None,
    libraries: list[dict[str, Any]],
    details: dict[str, Any],
    unreadable: list[str],
) -> Outcome:
    sm = fatbin.capability_name(capability)
    gpu_line = f"GPU {gpu or '?'} ({device}), compute capability {_capability_text(capability)}"
    findings: list[ProbeFinding] = []

    def coverage(lib: dict[str, Any]) -> fatbin.Coverage:
        return fatbin.coverage(_targets(lib["sass"] + lib["ptx"]), capability)

    # A package partly covered: some of its binaries (or torch's arch list) run here.
    covered = {lib["package"] for lib in libraries if not lib.get("not_loaded") and coverage(lib).ok}
    if torch_targets and fatbin.coverage(torch_targets, capability).ok:
        covered.add("torch")

    def judge(name: str, targets: Sequence[fatbin.CodeTarget], where: str,
              partial: bool = False, package: str | None = None) -> str | None:
        cov = fatbin.coverage(targets, capability)
        if partial and cov.verdict != "native":
            # Only part of a damaged or slow file was read: what was read may cover the GPU,
            # but the absence of code proves nothing.
            return None
        carries = fatbin.describe_targets(targets)
        runs = ", ".join(fatbin.supported_capabilities(targets)) or "no known GPU"
        evidence = (gpu_line, where, f"carries {carries}", f"runs on {runs}")
        if cov.verdict == "none" and package in covered:
            findings.append(ProbeFinding(
                "no-kernel-image",
                f"{name} has no code for {sm}: it carries {carries}; the rest of {package} runs "
                f"here, the calls into this library fail with no-kernel-image",
                evidence,
                severity="warning",
            ))
        elif cov.verdict == "none":
            findings.append(ProbeFinding(
                "no-kernel-image",
                f"{name} has no code for {sm}: it carries {carries}",
                evidence,
            ))
        elif cov.verdict == "jit":
            findings.append(ProbeFinding(
                "no-kernel-image",
                f"{name} has no SASS for {sm}: it runs only by JIT-compiling {cov.jit} PTX "
                f"(slow first calls; fails if the driver is older than the PTX)",
                evidence,
                severity="warning",
            ))
        return cov.verdict if cov.verdict == "none" else f"{cov.verdict} ({cov.native or cov.jit})"

    if torch_targets:
        details["torch"]["verdict"] = judge(f"torch {version}", torch_targets,
                                            "torch.cuda.get_arch_list()")
    else:
        details["torch"]["verdict"] = None
    for lib in libraries:
        if lib.get("not_loaded"):
            lib["verdict"] = None  # a build for another CUDA version: never loaded here
            continue
        lib["verdict"] = judge(lib["name"], _targets(lib["sass"] + lib["ptx"]), lib["path"],
                               partial=bool(lib["error"]), package=lib["package"])

    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity != "error"]
    checked = len(libraries) - len([lib for lib in libraries if lib["verdict"] is None])
    scope = f"torch and {checked} CUDA binaries" if torch_targets else f"{checked} CUDA binaries"
    info = []
    unloaded = [lib for lib in libraries if lib.get("not_loaded")]
    if unloaded:
        info.append(f"{len(unloaded)} builds for other CUDA versions not judged")
    slow = details["scan"].get("not_read_in_full") or []
    if slow or details["scan"].get("truncated"):
        parts = [f"{len(slow)} binaries not read in full"] if slow else []
        if details["scan"].get("truncated"):
            parts.append("some files not reached")
        info.append(" and ".join(parts) + " within the time budget (more time: gpudoctor scan "
                    "--probe-option arch_compat_budget_s=SECONDS)")
    if errors:
        names = ", ".join(f.summary.split(" has ", 1)[0] for f in errors[:3])
        more = f" and {len(errors) - 3} more" if len(errors) > 3 else ""
        return Outcome(Status.FAIL, f"no code for {sm} in {names}{more}", details, findings)
    notes = []
    jit = [f for f in warnings if "JIT-compiling" in f.summary]
    if jit:
        notes.append(f"{len(jit)} run only by PTX JIT")
    partly = [f.summary.split(" has ", 1)[0] for f in warnings if f not in jit]
    if partly:
        notes.append(f"no code for {sm} in part of a package: {', '.join(partly[:3])}")
    if unreadable:
        notes.append(f"{len(unreadable)} could not be read in full: {', '.join(unreadable[:3])}")
    if not torch_targets:
        notes.append(f"torch's arch list is unknown ({arch_reason})")
    tail = f" ({'; '.join(info)})" if info else ""
    if notes:
        return Outcome(Status.WARN, f"{scope} checked for {sm}; " + "; ".join(notes) + tail, details,
                       findings)
    return Outcome(Status.PASS, f"{scope} carry code for {sm}{tail}", details, findings)
