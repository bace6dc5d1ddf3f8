"""Probe `xformers`: does the installed xformers load against this torch, and does each of its
attention operators compute what torch's SDPA computes on this device?

`python -m xformers.info` only reports whether an operator was built; gates on capability, dtype
and head dim are checked at dispatch, so "available" operators still fail ("CUDA error: invalid
argument" from the bundled FA3 kernel on Blackwell with xformers 0.0.30-0.0.32). Here each operator
really runs, forward and backward, in xformers' (B, M, H, K) layout.

What decides the verdict is what user code gets: one `memory_efficient_attention` call with
`op=None` per dtype, xformers' own dispatcher choosing. A forced operator that refuses the inputs,
its capability range included ("requires device with capability <= (9, 0) but your GPU has
capability (12, 0) (too new)", as cutlassF and fa3F say on sm_120 while fa2 serves it), is
`refused`, not a failure; a forced operator that raises or computes wrong numbers although the
dispatcher would not pick it is a warning. An xformers whose C++/CUDA extensions do not load
against this torch ("xFormers can't load C++/CUDA extensions") fails with its fix, on every device.
"""
from __future__ import annotations

import importlib
import re
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import (
    ProbeFinding,
    Outcome,
    ProbeContext,
    ProbeSpec,
    Status,
    counted,
    error_text,
    is_sticky_cuda_error,
    skipped,
)

SPEC = ProbeSpec(
    id="xformers",
    title="xformers memory-efficient attention operators",
    timeout_s=90.0,
    emits=("xformers-build-mismatch", "xformers-flash-invalid-argument", *att.KERNEL_ERROR_IDS),
    needs=("torch", "xformers"),
    description="Imports xformers, lists its fmha operators and runs each against torch SDPA.",
    runs_on_cpu=False,
)

# fmha submodules that define FwOp/BwOp pairs, newest first; absent ones are skipped.
OPERATOR_MODULES = ("flash3", "flash", "cutlass_blackwell", "cutlass", "ck")
SHAPES = ((2, 128, 4, 64), (2, 128, 4, 128))  # (B, M, H, K)

FIX = ("route attention through torch SDPA (F.scaled_dot_product_attention) instead of xformers; "
       "in diffusers set the SDPA processor, pipe.unet.set_attn_processor(AttnProcessor2_0()), "
       "instead of enable_xformers_memory_efficient_attention()")

# xformers' fmha/flash.py raises this ImportError when the installed flash_attn is outside the range
# it was built against (0.0.35: ">=2.7.1,<=2.8.4"): `import xformers.ops` fails as a whole.
_FLASH_RANGE = re.compile(r"Requires Flash-Attention version (?P<range>\S+?)\s+but got (?P<got>[^\s.]+(?:\.[^\s.]+)*)")

_BUILD = re.compile(r"built for:\s*PyTorch\s+(?P<torch>\S+)\s+with CUDA\s+(?P<cuda>[^\s(]+)\s*"
                    r"\(you have (?P<have>[^)]+)\)")


def classify(text: str) -> str | None:
    """The knowledge-base id for an xformers import or dispatch text, or None."""
    low = text.lower()
    if "can't load c++/cuda extensions" in low or "xformers was built for" in low:
        return "xformers-build-mismatch"
    # Before "wasn't built": a dispatcher that refuses everything on a Blackwell GPU lists both
    # (fa3F/cutlassF "(too new)", fa2 not built), and the capability range is the cause.
    if "(too new)" in low:
        return "xformers-flash-invalid-argument"
    if "wasn't build with cuda support" in low or "operator wasn't built" in low:
        return "xformers-build-mismatch"
    if "invalid argument" in low:
        return "xformers-flash-invalid-argument"
    return att.classify_kernel_error(text)


def parse_build_mismatch(text: str) -> dict[str, str] | None:
    """What xformers was built for and what is installed, from its import warning."""
    match = _BUILD.search(" ".join(text.split()))
    if not match:
        return None
    return {"built_for_torch": match["torch"], "built_for_cuda": match["cuda"].rstrip(","),
            "installed_torch": match["have"]}


def is_refusal(text: str) -> bool:
    """xformers declining the inputs before any kernel runs (dtype, device, head dim, capability
    range "(too new)" / "(too old)", operator not built): `_ensure_op_supports_or_raise` for a
    forced op ("Operator `...` does not support inputs"), the dispatcher's "No operator found"."""
    low = text.lower()
    return "not supported because" in low or "no operator found" in low or "does not support inputs" in low


def flash_range_mismatch(text: str) -> dict[str, str] | None:
    """The flash_attn version range xformers requires and the version found, from its ImportError."""
    match = _FLASH_RANGE.search(text)
    return {"required": match["range"].rstrip(","), "found": match["got"].rstrip(".")} if match else None


def list_operators(xops: Any) -> list[dict[str, Any]]:
    """The fmha operator pairs this xformers defines, with what `is_available()` claims."""
    fmha = getattr(xops, "fmha", None)
    found = []
    for name in OPERATOR_MODULES:
        mod = getattr(fmha, name, None)
        if mod is None:
            try:
                mod = importlib.import_module(f"{xops.__name__}.fmha.{name}")
            except Exception:  # noqa: BLE001 - an operator module that cannot load is absent
                continue
        fw, bw = getattr(mod, "FwOp", None), getattr(mod, "BwOp", None)
        if fw is None:
            continue
        try:
            claimed = bool(fw.is_available()) if hasattr(fw, "is_available") else None
        except Exception:  # noqa: BLE001
            claimed = False
        found.append({"module": name, "name": str(getattr(fw, "NAME", name)), "fw": fw, "bw": bw,
                      "claims_available": claimed})
    return found


def run_operator(torch: Any, xops: Any, fw: Any, bw: Any, device: str, dtype: Any,
                 shape: tuple[int, int, int, int], causal: bool, backward: bool | None = None
                 ) -> dict[str, Any]:
    """One operator on one case against the fp64 reference: ok / mismatch / refused / error, with
    the text. `fw=None` lets xformers' dispatcher choose (`op=None`), as user code does. The
    device is synchronised and the results compared inside the `try`."""
    backward = bw is not None if backward is None else backward
    b, m, h, k = shape
    gen = torch.Generator(device="cpu").manual_seed(b * m + h * k + causal)
    q, kk, v, grad = (torch.randn(b, m, h, k, generator=gen).to(device=device, dtype=dtype)
                      for _ in range(4))
    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"dtype": dname, "shape": list(shape), "causal": causal}
    bias = xops.LowerTriangularMask() if causal else None
    leaves = [t.clone().requires_grad_(backward) for t in (q, kk, v)]
    op = None if fw is None else (fw, bw) if bw is not None else fw

    def reference() -> tuple[Any, list[Any]]:  # in (B, H, M, K), fp64, from the same rounded inputs
        ref_leaves = [t.detach().double().transpose(1, 2).requires_grad_(True) for t in (q, kk, v)]
        return att.reference_attention(torch, *ref_leaves, causal=causal), ref_leaves

    return att.measure_cell(torch, device, cell, lambda: xops.memory_efficient_attention(*leaves, attn_bias=bias, op=op),
                            grad, leaves, reference, backward, is_refusal)


def _import_xformers() -> tuple[Any, Any, list[str], str]:
    with att.capture(loggers=("xformers",), stderr=True) as said:
        try:
            xformers = importlib.import_module("xformers")
            xops = importlib.import_module("xformers.ops")
            failure = ""
        except Exception as exc:  # noqa: BLE001
            xformers = xops = None
            failure = error_text(exc)
    return xformers, xops, [t for t in said.texts if t.strip()], failure


def build_mismatch_steps(installed: str, build: dict[str, str] | None) -> tuple[str, ...]:
    """The fix for this machine: the xformers built for the installed torch (PyTorch's index for
    its +cuXXX suffix, where xformers publishes a build per torch release), or SDPA without
    xformers. Never a torch downgrade: the torch the user has is the fixed point."""
    version, _, local = installed.partition("+")
    built = f" (this one was built for torch {build['built_for_torch']})" if build else ""
    if local.startswith("cu"):
        install = (f"install the xformers built for torch {installed}{built}: `pip install -U xformers "
                   f"--index-url https://download.pytorch.org/whl/{local}`; if that index has none for "
                   f"torch {version} yet, the xformers release that pins torch=={version}")
    else:
        install = (f"install the xformers built for torch {installed}{built}, from the index torch came from, "
                   "so that pip keeps this torch")
    return (install + "; then `python -m xformers.info` must list the operators as available",
            "or keep this torch and uninstall xformers: torch's F.scaled_dot_product_attention covers "
            "memory-efficient attention (diffusers uses it by default)")


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _import_failure(version: str, failure: str, details: dict[str, Any],
                    findings: list[ProbeFinding]) -> Outcome:
    details["error"] = failure
    first = failure.splitlines()[0]
    flash = flash_range_mismatch(failure)
    if flash:
        # Not a broken xformers build: xformers refuses the flash_attn beside it. No knowledge-base
        # entry covers it; the fix is in the summary and the details.
        fix = (f"install a flash-attn in xformers' range ({flash['required']}), or an xformers "
               f"release built for flash-attn {flash['found']}; XFORMERS_IGNORE_FLASH_VERSION_CHECK=1 "
               "skips the check at your own risk")
        details.update(flash_attn_range=flash, fix=fix)
        return Outcome(Status.FAIL, f"importing xformers.ops failed: xformers requires flash-attn "
                       f"{flash['required']}, found {flash['found']}: {fix}", details, findings)
    kb_id = classify(failure)
    if kb_id and not any(f.kb_id == kb_id for f in findings):
        findings.append(ProbeFinding(kb_id, f"xformers {version} does not import", (failure,)))
    return Outcome(Status.FAIL, f"importing xformers failed: {first}", details, findings)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    xformers, xops, noise, failure = _import_xformers()
    if failure and "No module named 'xformers'" in failure:
        return skipped("xformers is not installed", error=failure)
    details: dict[str, Any] = {"import_messages": noise}
    findings: list[ProbeFinding] = []
    version = str(getattr(xformers, "__version__", "unknown")) if xformers else "unknown"
    details["version"] = version
    for text in noise + ([failure] if failure else []):
        if classify(text) == "xformers-build-mismatch":
            build = parse_build_mismatch(text)
            if build:
                details["build"] = build
            evidence = [text.strip().splitlines()[0]]
            if build:
                evidence.append(f"built for torch {build['built_for_torch']} with CUDA "
                                f"{build['built_for_cuda']}; installed torch {build['installed_torch']}")
            evidence.append("fix: reinstall xformers built for this torch "
                            f"({torch.__version__}), or route attention through torch SDPA")
            findings.append(ProbeFinding("xformers-build-mismatch",
                                    f"xformers {version} cannot load its C++/CUDA extensions", tuple(evidence),
                                    steps=build_mismatch_steps(str(torch.__version__), build)))
            break
    if failure:
        return _import_failure(version, failure, details, findings)

    operators = list_operators(xops)
    dtypes = (torch.float16, torch.bfloat16) if ctx.is_cuda else (torch.float32,)
    table: dict[str, dict[str, str]] = {}
    cells_all: list[dict[str, Any]] = []
    defaults: list[dict[str, Any]] = []
    poisoned = ""
    # What user code gets: xformers' own dispatcher (op=None), once per dtype, forward and backward.
    for dtype in dtypes:
        cell = run_operator(torch, xops, None, None, ctx.device, dtype, SHAPES[0], False, backward=True)
        cell["operator"] = "dispatcher (op=None)"
        defaults.append(cell)
        if cell["status"] == "error":
            poisoned = _poisoned(ctx, cell)
        if poisoned:
            break
    details["default_dispatch"] = {f"{c['dtype']}/K={c['shape'][3]}": _cell_text(c) for c in defaults}
    for entry in operators:
        row: dict[str, str] = {}
        for dtype in dtypes:
            for shape in SHAPES:
                for causal in (False, True):
                    key = f"{att.dtype_name(dtype)}/K={shape[3]}{'/causal' if causal else ''}"
                    if poisoned:
                        row[key] = f"not-run({poisoned})"
                        continue
                    cell = run_operator(torch, xops, entry["fw"], entry["bw"], ctx.device, dtype, shape, causal)
                    cell["operator"] = entry["name"]
                    cells_all.append(cell)
                    row[key] = _cell_text(cell)
                    if cell["status"] == "error":
                        poisoned = _poisoned(ctx, cell)
        table[entry["name"]] = row
    freed = att.free(torch, ctx.device, poisoned)
    details["operators"] = [{"module": e["module"], "name": e["name"],
                             "claims_available": e["claims_available"]} for e in operators]
    details["matrix"] = table
    if poisoned:
        details["context_poisoned"] = poisoned
    if freed:
        details["empty_cache_error"] = freed

    # On CUDA the dispatcher's failure is the user's failure; off CUDA xformers has no operator
    # for the device at all, which is a fact, not a fault.
    default_failed = [c for c in defaults if c["status"] != "ok"] if ctx.is_cuda else \
        [c for c in defaults if c["status"] in ("error", "mismatch")]
    for cell in default_failed:
        if cell["status"] == "mismatch":
            continue
        kb_id = classify(cell["text"])
        if kb_id == "xformers-build-mismatch" and any(f.kb_id == kb_id for f in findings):
            continue  # "No operator found ... wasn't built with CUDA support": the build, said once
        if kb_id:
            findings.append(_finding(kb_id, cell, version, torch, "error"))
    forced_failed = [c for c in cells_all if c["status"] in ("error", "mismatch")]
    for cell in forced_failed:
        if cell["status"] == "mismatch":
            continue
        kb_id = classify(cell["text"])
        if kb_id:
            severity = "error" if is_sticky_cuda_error(cell["text"]) else "warning"
            findings.append(_finding(kb_id, cell, version, torch, severity))
    counts = {s: sum(1 for c in cells_all if c["status"] == s) for s in ("ok", "refused", "mismatch", "error")}
    details["counts"] = counts
    if any(f.kb_id == "xformers-flash-invalid-argument" for f in findings):
        details["fix"] = FIX
    if not operators:
        return Outcome(Status.FAIL if findings else Status.WARN,
                       f"xformers {version} defines no fmha operators", details, findings)
    if (not ctx.is_cuda and not findings and counts["ok"] == 0 and not counts["error"]
            and not counts["mismatch"] and not any(c["status"] == "ok" for c in defaults)):
        return skipped(f"xformers {version} has no operator for device {ctx.device}", **details)
    summary = (f"xformers {version}: its own choice of operator works on "
               f"{sum(1 for c in defaults if c['status'] == 'ok')} of {len(defaults)} cases; forcing each of "
               f"its {counted(len(operators), 'operator')} in turn, "
               + att.forced_sentence(counts["ok"], counts["refused"], counts["mismatch"], counts["error"]))
    if default_failed or poisoned or any(f.severity == "error" for f in findings):
        status = Status.FAIL
    elif forced_failed:
        status = Status.WARN
        summary += " (forced operators the dispatcher does not pick here)"
    else:
        status = Status.PASS
    return Outcome(status, summary, details, findings)


def _poisoned(ctx: ProbeContext, cell: dict[str, Any]) -> str:
    reason = ctx.poisoned(cell["text"])
    return f"CUDA context poisoned by {cell['operator']}: {reason}" if reason else ""


def _finding(kb_id: str, cell: dict[str, Any], version: str, torch: Any, severity: str) -> ProbeFinding:
    where = f"{cell['operator']} {cell['dtype']} shape(B,M,H,K)={cell['shape']} causal={cell['causal']}"
    evidence = [cell["text"], where, f"xformers {version}, torch {torch.__version__}"]
    if kb_id == "xformers-flash-invalid-argument":
        evidence.append(f"fix: {FIX}")
    return ProbeFinding(kb_id, f"xformers {cell['operator']} failed: {cell['text'].splitlines()[0][:120]}",
                   tuple(evidence), severity=severity)


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] in ("ok", "mismatch"):
        return f"{cell['status']}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
    first = " ".join(cell["text"].split())[:160]
    return f"{cell['status']}({cell['stage']}: {first})"
