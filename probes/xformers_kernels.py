"""Probe `xformers`: does the installed xformers load against this torch, and does each of its
attention operators compute what torch's SDPA computes on this device?

`python -m xformers.info` only reports whether an operator was built; gates on capability, dtype
and head dim are checked at dispatch, so "available" operators still fail (the "(too new)" case on
sm_120, or "CUDA error: invalid argument" from the flash kernels on new GPUs, seed 001). Here each
operator really runs, forward and backward, in xformers' (B, M, H, K) layout.
"""
from __future__ import annotations

import importlib
import re
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import Finding, Outcome, ProbeContext, ProbeSpec, Status, error_text, skipped

SPEC = ProbeSpec(
    id="xformers",
    title="xformers memory-efficient attention operators",
    timeout_s=90.0,
    emits=("xformers-build-mismatch", "xformers-flash-invalid-argument", *att.KERNEL_ERROR_IDS),
    needs=("torch", "xformers"),
    description="Imports xformers, lists its fmha operators and runs each against torch SDPA.",
)

# fmha submodules that define FwOp/BwOp pairs, newest first; absent ones are skipped.
OPERATOR_MODULES = ("flash3", "flash", "cutlass_blackwell", "cutlass", "ck")
SHAPES = ((2, 128, 4, 64), (2, 128, 4, 128))  # (B, M, H, K)

FIX = ("route attention through torch SDPA (F.scaled_dot_product_attention) instead of xformers; "
       "in diffusers set the SDPA processor, pipe.unet.set_attn_processor(AttnProcessor2_0()), "
       "instead of enable_xformers_memory_efficient_attention()")

_BUILD = re.compile(r"built for:\s*PyTorch\s+(?P<torch>\S+)\s+with CUDA\s+(?P<cuda>[^\s(]+)\s*"
                    r"\(you have (?P<have>[^)]+)\)")


def classify(text: str) -> str | None:
    """The knowledge-base id for an xformers import or dispatch text, or None."""
    low = text.lower()
    if "can't load c++/cuda extensions" in low or "xformers was built for" in low:
        return "xformers-build-mismatch"
    if "wasn't build with cuda support" in low or "operator wasn't built" in low:
        return "xformers-build-mismatch"
    if "invalid argument" in low or "(too new)" in low:
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
    """xformers' dispatcher declining the inputs (dtype, device, head dim), as opposed to a failure.
    "(too new)" is excluded: the operator claims availability on a GPU it cannot serve."""
    low = text.lower()
    return ("not supported because" in low or "no operator found" in low) and "(too new)" not in low


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
                 shape: tuple[int, int, int, int], causal: bool) -> dict[str, Any]:
    """One operator on one case against SDPA: ok / mismatch / refused / error, with the text."""
    b, m, h, k = shape
    gen = torch.Generator(device="cpu").manual_seed(b * m + h * k + causal)
    q, kk, v, grad = (torch.randn(b, m, h, k, generator=gen).to(device=device, dtype=dtype)
                      for _ in range(4))
    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"dtype": dname, "shape": list(shape), "causal": causal}
    bias = xops.LowerTriangularMask() if causal else None
    leaves = [t.clone().requires_grad_(bw is not None) for t in (q, kk, v)]
    stage = "forward"
    try:
        op = (fw, bw) if bw is not None else fw
        out = xops.memory_efficient_attention(*leaves, attn_bias=bias, op=op)
        if bw is not None:
            stage = "backward"
            att.backward(out, grad)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        text = error_text(exc)
        cell.update(status="refused" if is_refusal(text) else "error", stage=stage, text=text)
        return cell
    # The reference: SDPA in (B, H, M, K), computed in fp32 from the same rounded inputs.
    ref_leaves = [t.detach().float().transpose(1, 2).requires_grad_(True) for t in (q, kk, v)]
    ref = att.reference_attention(torch, *ref_leaves, causal=causal)
    cell["fwd_err"] = att.max_abs_error(torch, out, ref.transpose(1, 2))
    cell["bwd_err"] = 0.0
    if bw is not None:
        att.backward(ref, grad.float().transpose(1, 2))
        cell["bwd_err"] = max(att.max_abs_error(torch, x.grad, r.grad.transpose(1, 2))
                              for x, r in zip(leaves, ref_leaves))
    ok = cell["fwd_err"] <= att.FWD_TOL[dname] and cell["bwd_err"] <= att.BWD_TOL[dname]
    cell["status"] = "ok" if ok else "mismatch"
    return cell


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


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    xformers, xops, noise, failure = _import_xformers()
    if failure and "No module named 'xformers'" in failure:
        return skipped("xformers is not installed", error=failure)
    details: dict[str, Any] = {"import_messages": noise}
    findings: list[Finding] = []
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
            findings.append(Finding("xformers-build-mismatch",
                                    f"xformers {version} cannot load its C++/CUDA extensions", tuple(evidence)))
            break
    if failure:
        return Outcome(Status.FAIL, f"importing xformers failed: {failure.splitlines()[0]}", details,
                       findings or [Finding("xformers-build-mismatch", "xformers does not import",
                                            (failure,))])

    operators = list_operators(xops)
    dtypes = (torch.float16, torch.bfloat16) if ctx.is_cuda else (torch.float32,)
    table: dict[str, dict[str, str]] = {}
    cells_all = []
    poisoned = False
    for entry in operators:
        row: dict[str, str] = {}
        for dtype in dtypes:
            for shape in SHAPES:
                for causal in (False, True):
                    if poisoned:
                        continue
                    cell = run_operator(torch, xops, entry["fw"], entry["bw"], ctx.device, dtype, shape, causal)
                    cell["operator"] = entry["name"]
                    cells_all.append(cell)
                    key = f"{cell['dtype']}/K={shape[3]}{'/causal' if causal else ''}"
                    row[key] = _cell_text(cell)
                    # A CUDA error poisons the context on a real GPU; later launches prove nothing.
                    poisoned = ctx.is_cuda and cell["status"] == "error" and att.is_cuda_error(cell["text"])
        table[entry["name"]] = row
    att.free(torch, ctx.device)
    details["operators"] = [{"module": e["module"], "name": e["name"],
                             "claims_available": e["claims_available"]} for e in operators]
    details["matrix"] = table

    for cell in cells_all:
        if cell["status"] != "error" and not (cell["status"] == "refused" and "(too new)" in cell.get("text", "")):
            continue
        kb_id = classify(cell["text"])
        if kb_id:
            where = f"{cell['operator']} {cell['dtype']} shape(B,M,H,K)={cell['shape']} causal={cell['causal']}"
            evidence = [cell["text"], where, f"xformers {version}, torch {torch.__version__}"]
            if kb_id == "xformers-flash-invalid-argument":
                evidence.append(f"fix: {FIX}")
            findings.append(Finding(kb_id, f"xformers {cell['operator']} failed: "
                                    f"{cell['text'].splitlines()[0][:120]}", tuple(evidence)))
    counts = {s: sum(1 for c in cells_all if c["status"] == s) for s in ("ok", "refused", "mismatch", "error")}
    details["counts"] = counts
    if any(f.kb_id == "xformers-flash-invalid-argument" for f in findings):
        details["fix"] = FIX
    if not operators:
        return Outcome(Status.WARN, f"xformers {version} defines no fmha operators", details, findings)
    if counts["ok"] == 0 and not counts["error"] and not counts["mismatch"] and not ctx.is_cuda:
        return skipped(f"xformers {version} has no operator for device {ctx.device}", **details)
    status = Status.FAIL if counts["error"] or counts["mismatch"] or findings else Status.PASS
    summary = (f"xformers {version}: {len(operators)} operators, {counts['ok']} ok, {counts['refused']} "
               f"refused, {counts['mismatch']} mismatched, {counts['error']} errors")
    return Outcome(status, summary, details, findings)


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] in ("ok", "mismatch"):
        return f"{cell['status']}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
    first = " ".join(cell["text"].split())[:160]
    return f"{cell['status']}({cell['stage']}: {first})"
