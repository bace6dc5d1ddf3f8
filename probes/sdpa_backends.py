"""Probe `sdpa-backends`: every scaled_dot_product_attention backend, forced one at a time, forward
and backward, on a small matrix of dtypes and shapes, checked against an fp32 reference.

A refused backend is not a failure: SDPA refuses cases a kernel does not cover and says why in
UserWarnings ("Flash attention kernel not used because: ..."), which are captured as the reason.
What fails the probe is a kernel that ran and gave wrong numbers or raised, or the default path
having no kernel at all. The default choice (`torch._fused_sdp_choice`) is recorded per case so a
silent fallback to the math backend, which materialises the full score matrix, is visible.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.probes import _attention as att
from gpudoctor.probes.base import Finding, Outcome, ProbeContext, ProbeSpec, Status, error_text

SPEC = ProbeSpec(
    id="sdpa-backends",
    title="SDPA backends (flash, memory-efficient, cuDNN, math)",
    timeout_s=60.0,
    emits=("sdp-kernel-deprecated", *att.KERNEL_ERROR_IDS),  # sdpa-no-kernel is among them
    description="Forces each SDPA backend on fp16/bf16/fp32 and a few shapes, forward and backward, "
                "and compares against an fp32 reference.",
)

# SDPBackend member names, in the order SDPA itself prefers fused kernels.
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Case:
    name: str
    heads: int = 4
    kv_heads: int = 4
    seq: int = 64
    head_dim: int = 64
    mask: bool = False
    causal: bool = False
    # Inputs whose last dimension is not contiguous (a transposed view): every fused kernel must
    # refuse them, so this case shows a real refusal, with its reason, on every device.
    strided: bool = False

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads


CASES = (
    Case("d64"),
    Case("d128", head_dim=128),
    Case("d256", head_dim=256),
    Case("mask", mask=True),
    Case("causal", causal=True),
    Case("gqa", heads=8, kv_heads=2),
    Case("strided", strided=True),
)

NO_KERNEL = "no available kernel"  # CUDA: one space before "Aborting"; CPU: two
NOT_VIABLE = "no viable backend"  # the backend has no implementation on this device at all


def _inputs(torch: Any, case: Case, device: str, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape_q = (1, case.heads, case.seq, case.head_dim)
    shape_kv = (1, case.kv_heads, case.seq, case.head_dim)
    tensors = {
        "q": torch.randn(shape_q, generator=gen),
        "k": torch.randn(shape_kv, generator=gen),
        "v": torch.randn(shape_kv, generator=gen),
        "grad": torch.randn(shape_q, generator=gen),
        "mask": None,
    }
    if case.mask:
        # Padding-style boolean mask: the last quarter of the keys is hidden from every query.
        keep = torch.ones(case.seq, case.seq, dtype=torch.bool)
        keep[:, -case.seq // 4:] = False
        tensors["mask"] = keep
    if case.strided:
        for name in ("q", "k", "v"):
            tensors[name] = tensors[name].transpose(-1, -2).contiguous().transpose(-1, -2)
    return {k: (t.to(device) if t is not None else None) for k, t in tensors.items()}


def _leaf(base: dict[str, Any], name: str, dtype: Any) -> Any:
    # A copy even when the dtype already matches: gradients must not accumulate on shared inputs.
    # empty_like + copy_ keeps the input's strides, which the strided case depends on.
    src = base[name]
    out = src.new_empty(src.shape).as_strided(src.shape, src.stride()).to(dtype)
    return out.copy_(src).requires_grad_(True)


def _sdpa_call(torch: Any, case: Case, q: Any, k: Any, v: Any, mask: Any) -> Any:
    kwargs: dict[str, Any] = {"attn_mask": mask, "is_causal": case.causal}
    if case.gqa:
        kwargs["enable_gqa"] = True
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def _forward(torch: Any, case: Case, base: dict[str, Any], dtype: Any) -> tuple[Any, ...]:
    q, k, v = (_leaf(base, n, dtype) for n in ("q", "k", "v"))
    return _sdpa_call(torch, case, q, k, v, base["mask"]), q, k, v


def _reference(torch: Any, case: Case, base: dict[str, Any], dtype: Any) -> tuple[Any, ...]:
    # Reference on the dtype-rounded inputs, so only the kernel's own error is measured.
    q, k, v = (_leaf(base, n, dtype).detach().float().requires_grad_(True) for n in ("q", "k", "v"))
    out = att.reference_attention(torch, q, k, v, causal=case.causal, attn_mask=base["mask"])
    att.backward(out, base["grad"].to(dtype).float())
    return out.detach(), q.grad, k.grad, v.grad


def run_cell(torch: Any, backend: Any, case: Case, base: dict[str, Any], dtype: Any,
             ref: tuple[Any, ...]) -> dict[str, Any]:
    """One backend on one case: ok / mismatch (with errors) / refused (reasons) / unavailable /
    error (exact text). Never raises for a kernel's failure."""
    from torch.nn.attention import sdpa_kernel

    dname = att.dtype_name(dtype)
    cell: dict[str, Any] = {"backend": backend.name, "dtype": dname, "case": case.name}
    stage = "forward"
    with att.capture() as said:
        try:
            with sdpa_kernel([backend]):
                out, q, k, v = _forward(torch, case, base, dtype)
                stage = "backward"
                att.backward(out, base["grad"].to(dtype))
            got = (out.detach(), q.grad, k.grad, v.grad)
            stage = "done"
        except Exception as exc:  # noqa: BLE001 - a kernel failure is the measurement
            cell["text"] = error_text(exc)
            cell["stage"] = stage
    reasons = att.refusal_reasons(said.warnings)
    if stage != "done":
        low = cell["text"].lower()
        if NO_KERNEL in low:
            cell.update(status="refused", reasons=reasons)
        elif NOT_VIABLE in low:
            cell.update(status="unavailable", reasons=reasons)
        else:
            cell.update(status="error", reasons=reasons)
        return cell
    fwd = att.max_abs_error(torch, got[0], ref[0])
    bwd = max(att.max_abs_error(torch, g, r) for g, r in zip(got[1:], ref[1:]))
    ok = fwd <= att.FWD_TOL[dname] and bwd <= att.BWD_TOL[dname]
    cell.update(status="ok" if ok else "mismatch", fwd_err=fwd, bwd_err=bwd)
    del got
    return cell


def cell_text(cell: dict[str, Any]) -> str:
    """The matrix entry a person reads: ok / refused(reason) / error(text) / mismatch(max err)."""
    status = cell["status"]
    if cell.get("stage") == "backward":
        status = f"{status} in backward"
    if cell["status"] in ("ok", "mismatch"):
        return f"{status}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
    if cell["status"] == "unavailable":
        return "unavailable(no kernel for this device type)"
    if cell["status"] == "refused":
        why = "; ".join(cell.get("reasons") or []) or cell.get("text", "")
        return f"{status}({why})"
    return f"{status}({cell.get('text', '')})"


def default_choice(torch: Any, case: Case, q: Any, k: Any, v: Any, mask: Any) -> str:
    """The backend SDPA picks with every backend enabled (what user code gets), or "unknown"."""
    from torch.nn.attention import SDPBackend

    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "unknown"
    try:
        kwargs = {"enable_gqa": True} if case.gqa else {}
        index = int(choose(q, k, v, mask, 0.0, case.causal, **kwargs))
    except Exception as exc:  # noqa: BLE001
        return f"error({att.clean_message(error_text(exc))})"
    names = {int(member.value): name for name, member in SDPBackend.__members__.items()}
    return names.get(index, str(index))


def sdpa_params(torch: Any, q: Any, k: Any, v: Any, mask: Any, causal: bool, gqa: bool) -> Any:
    """SDPAParams across versions: 7 arguments since enable_gqa (2.5), 6 before."""
    cls = torch.backends.cuda.SDPAParams
    try:
        return cls(q, k, v, mask, 0.0, causal, gqa)
    except TypeError:
        return cls(q, k, v, mask, 0.0, causal)


def why_not_fused(torch: Any, case: Case, q: Any, k: Any, v: Any, mask: Any) -> dict[str, list[str]]:
    """On CUDA, each fused backend's own debug reasons for these inputs (TORCH_WARN, captured)."""
    checks = {
        "FLASH_ATTENTION": "can_use_flash_attention",
        "EFFICIENT_ATTENTION": "can_use_efficient_attention",
        "CUDNN_ATTENTION": "can_use_cudnn_attention",
    }
    reasons: dict[str, list[str]] = {}
    try:
        params = sdpa_params(torch, q, k, v, mask, case.causal, case.gqa)
    except Exception as exc:  # noqa: BLE001
        return {"SDPAParams": [error_text(exc)]}
    for name, attr in checks.items():
        check = getattr(torch.backends.cuda, attr, None)
        if check is None:
            continue
        with att.capture() as said:
            try:
                usable = bool(check(params, debug=True))
            except Exception as exc:  # noqa: BLE001
                usable, said.warnings[:] = False, [error_text(exc)]
        if not usable:
            reasons[name] = att.refusal_reasons(said.warnings) or ["refused without a reason"]
    return reasons


def sdp_kernel_deprecation(torch: Any) -> str | None:
    """The FutureWarning text if `torch.backends.cuda.sdp_kernel` is the deprecated API here."""
    legacy = getattr(torch.backends.cuda, "sdp_kernel", None)
    if legacy is None:
        return None
    with att.capture() as said:
        try:
            with legacy(enable_flash=True, enable_math=True, enable_mem_efficient=True):
                pass
        except Exception:  # noqa: BLE001 - only the warning matters here
            pass
    for text, category in zip(said.warnings, said.categories):
        if category in ("FutureWarning", "DeprecationWarning") and "sdp_kernel" in text:
            return text
    return None


def recommend(cells: list[dict[str, Any]]) -> tuple[str, str]:
    """The fused backend that ran correctly on the most cases (SDPA's priority breaks ties);
    math only when no fused kernel works here."""
    strided = {c.name for c in CASES if c.strided}
    cells = [c for c in cells if c["case"] not in strided]
    scores = {b: sum(1 for c in cells if c["backend"] == b and c["status"] == "ok") for b in BACKENDS}
    total = len({(c["dtype"], c["case"]) for c in cells})
    fused = [b for b in BACKENDS if b != "MATH" and scores[b] > 0]
    best = max(fused, key=lambda b: (scores[b], -BACKENDS.index(b))) if fused else "MATH"
    return best, f"ok on {scores[best]}/{total} cases"


def run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    from torch.nn.attention import SDPBackend

    started = time.perf_counter()
    backends = [getattr(SDPBackend, name) for name in BACKENDS if hasattr(SDPBackend, name)]
    cells: list[dict[str, Any]] = []
    defaults: dict[str, str] = {}
    default_errors: list[dict[str, Any]] = []
    fallbacks: list[dict[str, Any]] = []
    poisoned = ""
    for case_index, case in enumerate(CASES):
        base = _inputs(torch, case, ctx.device, seed=1234 + case_index)
        for dname in DTYPES:
            dtype = getattr(torch, dname)
            key = f"{dname}/{case.name}"
            ref = _reference(torch, case, base, dtype)
            q, k, v = (base[n].to(dtype) for n in ("q", "k", "v"))
            choice = default_choice(torch, case, q, k, v, base["mask"])
            defaults[key] = choice
            with att.capture() as said:
                try:
                    # The path user code takes, with nothing forced.
                    _sdpa_call(torch, case, q, k, v, base["mask"])
                except Exception as exc:  # noqa: BLE001
                    default_errors.append({"case": key, "text": error_text(exc),
                                           "reasons": att.refusal_reasons(said.warnings)})
            if ctx.is_cuda and choice == "MATH" and dname != "float32" and not case.strided:
                fallbacks.append({"case": key, "why": why_not_fused(torch, case, q, k, v, base["mask"])})
            for backend in backends:
                if poisoned:
                    cells.append({"backend": backend.name, "dtype": dname, "case": case.name,
                                  "status": "error", "text": f"not run: {poisoned}"})
                    continue
                cell = run_cell(torch, backend, case, base, dtype, ref)
                cells.append(cell)
                if cell["status"] == "error" and att.is_cuda_error(cell["text"]):
                    poisoned = f"CUDA context poisoned earlier ({cell['backend']} {key})"
                ctx.sync() if not poisoned else None
            del ref, q, k, v
        del base
    att.free(torch, ctx.device)

    matrix: dict[str, dict[str, str]] = {}
    for cell in cells:
        matrix.setdefault(cell["backend"], {})[f"{cell['dtype']}/{cell['case']}"] = cell_text(cell)
    best, why_best = recommend(cells)
    findings: list[Finding] = []
    broken = [c for c in cells if c["status"] in ("error", "mismatch")]
    for cell in broken:
        where = f"{cell['backend']} {cell['dtype']}/{cell['case']}"
        if cell["status"] == "mismatch":
            continue  # no knowledge-base entry says why a kernel computes wrong numbers: details
        kb_id = att.classify_kernel_error(cell["text"])
        if kb_id:
            findings.append(Finding(kb_id, f"{where} raised", (cell["text"], where)))
    for err in default_errors:
        findings.append(Finding(
            "sdpa-no-kernel",
            f"SDPA has no kernel for {err['case']} with the default backend selection",
            (err["text"], *err["reasons"], _flags(torch)),
        ))
    for fb in fallbacks:
        evidence = [f"{b}: {'; '.join(r)}" for b, r in fb["why"].items()]
        findings.append(Finding(
            "sdpa-no-kernel",
            f"SDPA silently falls back to the math backend for {fb['case']} "
            "(full score matrix in memory)",
            (f"torch._fused_sdp_choice -> MATH for {fb['case']}", *evidence),
            severity="warning",
        ))
    deprecated = sdp_kernel_deprecation(torch)
    if deprecated:
        # Information only: the old API still works; the finding carries the replacement.
        findings.append(Finding(
            "sdp-kernel-deprecated",
            "torch.backends.cuda.sdp_kernel() is deprecated in this torch: use torch.nn.attention.sdpa_kernel()",
            (f"FutureWarning: {deprecated}", f"torch {torch.__version__}"),
            severity="warning",
        ))

    counts = {s: sum(1 for c in cells if c["status"] == s)
              for s in ("ok", "refused", "unavailable", "mismatch", "error")}
    details = {
        "device": ctx.device,
        "torch": str(torch.__version__),
        "matrix": matrix,
        "counts": counts,
        "recommended_backend": best,
        "recommended_because": why_best,
        "default_choice": defaults,
        "unavailable": {c["backend"]: c["text"] for c in cells if c["status"] == "unavailable"},
        "default_errors": default_errors,
        "math_fallbacks": [fb["case"] for fb in fallbacks],
        "mismatches": [{k: c[k] for k in ("backend", "dtype", "case", "fwd_err", "bwd_err")}
                       for c in cells if c["status"] == "mismatch"],
        "tolerances": {"forward": att.FWD_TOL, "backward": att.BWD_TOL},
        "global_flags": _flags(torch),
        "sdp_kernel_deprecated": bool(deprecated),
        "elapsed_s": round(time.perf_counter() - started, 3),
    }
    summary = (f"{counts['ok']} ok, {counts['refused'] + counts['unavailable']} refused, "
               f"{counts['mismatch']} mismatched, {counts['error']} errors; "
               f"recommended backend {best} ({why_best})")
    if broken or default_errors:
        status = Status.FAIL
    elif fallbacks:
        status = Status.WARN
    else:
        status = Status.PASS
    return Outcome(status, summary, details, findings)


def _flags(torch: Any) -> str:
    cuda = torch.backends.cuda
    names = ("flash", "mem_efficient", "math", "cudnn")
    got = []
    for name in names:
        check = getattr(cuda, f"{name}_sdp_enabled", None)
        if check is not None:
            got.append(f"{name}={'on' if check() else 'off'}")
    return "global SDPA flags: " + ", ".join(got)
