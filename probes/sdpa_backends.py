"""Probe `sdpa-backends`: the path user code takes through scaled_dot_product_attention, and every
backend forced one at a time, forward and backward, on a small matrix of dtypes and shapes,
checked against an fp64 reference.

What decides the verdict is the default path, with nothing forced: the backend SDPA picks
(`torch._fused_sdp_choice`, recorded per case) must run and give the right numbers, and fp16/bf16
must not fall back silently to the math backend, which materialises the full score matrix. A
forced backend that SDPA would not pick here and that fails is a warning: only code that forces it
meets it (cuDNN attention is deprioritised on sm_80/86/89/120 for exactly that reason). A refused
backend is no failure at all: SDPA refuses what a kernel does not cover and says why in
UserWarnings ("Flash attention kernel not used because: ..."), captured as the reason.

Each cell synchronises and compares inside its own `try`, so an asynchronous kernel fault is that
cell's error; after a sticky one the remaining cells are "not run" and the matrix is still
returned. Forcing cuDNN builds a cuDNN graph per shape (hundreds of milliseconds each), so on CUDA
the forced cuDNN cells run on one dtype only, unless cuDNN is SDPA's own choice, whose cells are the
default path's and cost nothing extra.

Levels (`ctx.level`, `gpudoctor scan --level`). `deep` runs the matrix above, 7 cases x 3 dtypes x
(the default path and 4 forced backends). `quick`, the scan's default, cuts one thing: where SDPA
picks cuDNN attention for *both* float16 and bfloat16 on a case (sm_90 and sm_100 with torch 2.5
and later), the float16 default cell is not run, and neither is forced cuDNN on float16 (it would
build the same graph). On a fresh machine each of those cells builds and JIT-compiles a cuDNN graph,
1.4-2.8 s (0.15 s warm) on an H100: they were half the cold scan. bfloat16's default cell runs the
same cuDNN kernel family on the same shape, so the question "does the path user code takes work
here" is still answered for every case. Everything else runs at both levels because it is what
detects refusals and errors: the forced FLASH, EFFICIENT and MATH cells on every dtype (a forced
failure is a warning), SDPA's choice and the math-fallback check for every (dtype, case) (cheap:
no kernel runs), float32, the strided case, and every default cell whose kernel is not cuDNN
(precompiled kernels cost milliseconds). Cut cells are `not-run` with the reason and
`details.level_cut`; the recommendation votes only on the (dtype, case) pairs both levels ran,
and `recommended_by_dtype` leaves out a dtype with cut cells. What
quick can miss: a cuDNN fault on float16 alone while bfloat16 works on the same shape.

Works on torch 2.4 and later: `enable_gqa` (2.5) is
feature-detected, and `torch.nn.attention.sdpa_kernel` is preferred to the deprecated
`torch.backends.cuda.sdp_kernel`.
"""
from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

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
)

SPEC = ProbeSpec(
    id="sdpa-backends",
    title="SDPA backends (flash, memory-efficient, cuDNN, math)",
    timeout_s=60.0,
    emits=att.KERNEL_ERROR_IDS,  # sdpa-no-kernel is among them
    description="Runs SDPA's default path and forces each backend on fp16/bf16/fp32 and a few shapes, "
                "forward and backward, and compares against an fp64 reference.",
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
# On CUDA a forced cuDNN cell builds a cuDNN graph (forward and backward) per shape, ~0.1-0.4 s
# each; one dtype shows whether the backend works. Its other dtypes run when it is SDPA's choice.
CUDNN_FORCED_DTYPES = ("float16",)


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


def accepts_gqa(torch: Any) -> tuple[bool, str]:
    """Whether this torch's SDPA takes `enable_gqa` (2.5 and later), asked of the function itself
    on tiny CPU tensors: torch 2.4's raises "scaled_dot_product_attention() got an unexpected
    keyword argument 'enable_gqa'"."""
    q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError as exc:
        if "enable_gqa" in str(exc):
            return False, (f"torch {torch.__version__}'s scaled_dot_product_attention has no "
                           "enable_gqa (added in torch 2.5)")
    except Exception:  # noqa: BLE001 - the keyword was accepted; the kernels are judged in cells
        pass
    return True, ""


def backend_forcer(torch: Any) -> tuple[Callable[[Any], Any], str]:
    """A context manager factory that makes SDPA use exactly one backend, and its name:
    `torch.nn.attention.sdpa_kernel` (torch 2.3 and later), else the legacy flags context
    `torch.backends.cuda.sdp_kernel`, whose deprecation warning is the probe's own business."""
    try:
        from torch.nn.attention import sdpa_kernel

        return (lambda backend: sdpa_kernel([backend])), "torch.nn.attention.sdpa_kernel"
    except ImportError:
        pass
    legacy = torch.backends.cuda.sdp_kernel
    accepted = set(inspect.signature(legacy).parameters)
    flags = {"FLASH_ATTENTION": "enable_flash", "EFFICIENT_ATTENTION": "enable_mem_efficient",
             "MATH": "enable_math", "CUDNN_ATTENTION": "enable_cudnn"}

    @contextlib.contextmanager
    def force(backend: Any):
        kwargs = {flag: flags.get(backend.name) == flag for flag in flags.values() if flag in accepted}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            manager = legacy(**kwargs)
            manager.__enter__()
        try:
            yield
        finally:
            manager.__exit__(None, None, None)

    return force, "torch.backends.cuda.sdp_kernel (legacy)"


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
    q, k, v = (_leaf(base, n, dtype).detach().double().requires_grad_(True) for n in ("q", "k", "v"))
    out = att.reference_attention(torch, q, k, v, causal=case.causal, attn_mask=base["mask"])
    att.backward(out, base["grad"].to(dtype).double())
    return out.detach(), q.grad, k.grad, v.grad


def run_cell(torch: Any, backend: Any, case: Case, base: dict[str, Any], dtype: Any,
             ref: tuple[Any, ...], sync: Callable[[], None] = lambda: None,
             force: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """One backend on one case (`backend=None`: nothing forced, the path user code takes):
    ok / mismatch (with errors) / refused (reasons) / unavailable / error (exact text). The
    device is synchronised and the results compared inside the `try`, so an asynchronous kernel
    fault is this cell's error. Never raises for a kernel's failure."""
    if force is None:
        force = backend_forcer(torch)[0]
    dname = att.dtype_name(dtype)
    name = backend.name if backend is not None else "DEFAULT"
    cell: dict[str, Any] = {"backend": name, "dtype": dname, "case": case.name}
    began = time.perf_counter()
    stage = "forward"
    with att.capture() as said:
        try:
            with force(backend) if backend is not None else contextlib.nullcontext():
                out, q, k, v = _forward(torch, case, base, dtype)
                stage = "backward"
                att.backward(out, base["grad"].to(dtype))
            stage = "synchronize"
            sync()
            stage = "compare"
            fwd = att.max_abs_error(torch, out, ref[0])
            bwd = max(att.max_abs_error(torch, g, r) for g, r in zip((q.grad, k.grad, v.grad), ref[1:]))
            stage = "done"
        except Exception as exc:  # noqa: BLE001 - a kernel failure is the measurement
            cell["text"] = error_text(exc)
            cell["stage"] = stage
    cell["ms"] = round((time.perf_counter() - began) * 1e3, 1)
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
    ok = fwd <= att.FWD_TOL[dname] and bwd <= att.BWD_TOL[dname]
    cell.update(status="ok" if ok else "mismatch", fwd_err=fwd, bwd_err=bwd)
    return cell


def cell_text(cell: dict[str, Any]) -> str:
    """The matrix entry a person reads: ok / refused(reason) / error(text) / mismatch(max err)."""
    status = cell["status"]
    if cell.get("stage") in ("backward", "synchronize", "compare"):
        status = f"{status} in {cell['stage']}"
    if cell["status"] in ("ok", "mismatch"):
        text = f"{status}(fwd {cell['fwd_err']:.1e}, bwd {cell['bwd_err']:.1e})"
        return text + (" [SDPA's default]" if cell.get("via") == "default" else "")
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
    """On CUDA, each fused backend's own debug reasons for these inputs (TORCH_WARN, captured).
    The checks read the *current* device's properties: the caller holds the device guard."""
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


def legacy_sdp_kernel(torch: Any) -> str | None:
    """What this torch says when `torch.backends.cuda.sdp_kernel` is used: its deprecation
    warning text, "absent", or None when it is silent. A fact about the build for the details:
    the probe calling it says nothing about the user's code."""
    legacy = getattr(torch.backends.cuda, "sdp_kernel", None)
    if legacy is None:
        return "absent"
    with att.capture() as said:
        try:
            with legacy():
                pass
        except Exception:  # noqa: BLE001 - only the warning matters here
            pass
    for text, category in zip(said.warnings, said.categories):
        if category in ("FutureWarning", "DeprecationWarning") and "sdp_kernel" in text:
            return text
    return None


def recommend(cells: list[dict[str, Any]]) -> tuple[str, str]:
    """The fused backend that ran correctly on the most fp16/bf16 cases (SDPA's priority breaks
    ties); math only when no fused kernel works here. fp32 does not vote: on CUDA only the
    memory-efficient kernel runs fp32, which says nothing about the half-precision workloads
    attention is used for. With no half-precision result at all (a device without fp16
    kernels), every dtype votes. A (dtype, case) pair with a cell cut by the quick level does
    not vote: its backends were not all run."""
    strided = {c.name for c in CASES if c.strided}
    cut = {(c["dtype"], c["case"]) for c in cells if c.get("level_cut")}
    cells = [c for c in cells if c["case"] not in strided and c["backend"] in BACKENDS
             and (c["dtype"], c["case"]) not in cut]
    half = [c for c in cells if c["dtype"] in ("float16", "bfloat16")]
    if any(c["status"] == "ok" for c in half):
        cells = half
    scores = {b: sum(1 for c in cells if c["backend"] == b and c["status"] == "ok") for b in BACKENDS}
    total = len({(c["dtype"], c["case"]) for c in cells})
    dtypes = "/".join(sorted({c["dtype"] for c in cells})) or "no"
    fused = [b for b in BACKENDS if b != "MATH" and scores[b] > 0]
    best = max(fused, key=lambda b: (scores[b], -BACKENDS.index(b))) if fused else "MATH"
    return best, f"works on {scores[best]} of {total} {dtypes} cases"


def _not_run(backend: str, dname: str, case: Case, why: str) -> dict[str, Any]:
    return {"backend": backend, "dtype": dname, "case": case.name, "status": "not-run", "text": why}


CUT_DTYPE, KEPT_DTYPE = "float16", "bfloat16"  # quick: cuDNN's default path on bfloat16 only


def _level_cut(backend: str, dname: str, case: Case) -> dict[str, Any]:
    why = (f"not run at the quick level: SDPA picks cuDNN for {CUT_DTYPE} and {KEPT_DTYPE} here, "
           f"and {KEPT_DTYPE}'s default cell ran it (a cuDNN graph build per cell; --level deep runs both)")
    return {**_not_run(backend, dname, case, why), "level_cut": True}


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard(), att.cpu_threads(ctx.torch, ctx.device):
        return _run(ctx)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    from torch.nn.attention import SDPBackend

    started = time.perf_counter()
    force, forcer = backend_forcer(torch)
    gqa_ok, no_gqa = accepts_gqa(torch)
    cases = [c for c in CASES if gqa_ok or not c.gqa]
    backends = [getattr(SDPBackend, name) for name in BACKENDS if hasattr(SDPBackend, name)]
    cells: list[dict[str, Any]] = []
    defaults: dict[str, str] = {}
    default_cells: list[dict[str, Any]] = []
    fallbacks: list[dict[str, Any]] = []
    level_cut: list[str] = []  # quick: the (dtype/case) keys whose cuDNN default cell was not run
    poisoned = ""
    reference_s = 0.0  # the fp64 references, beside each cell's own time ("ms")
    for case_index, case in enumerate(cases):
        base = _inputs(torch, case, ctx.device, seed=1234 + case_index) if not poisoned else {}
        for dname in DTYPES:
            key = f"{dname}/{case.name}"
            if poisoned:
                why = f"not run: {poisoned}"
                default_cells.append(_not_run("DEFAULT", dname, case, why))
                cells.extend(_not_run(b.name, dname, case, why) for b in backends)
                continue
            dtype = getattr(torch, dname)
            began = time.perf_counter()
            ref = _reference(torch, case, base, dtype)
            reference_s += time.perf_counter() - began
            leaves = [_leaf(base, n, dtype) for n in ("q", "k", "v")]
            choice = default_choice(torch, case, *leaves, base["mask"])
            defaults[key] = choice
            cut = (not ctx.deep and dname == CUT_DTYPE and choice == "CUDNN_ATTENTION"
                   and _choice_on(torch, case, base, KEPT_DTYPE) == "CUDNN_ATTENTION")
            if cut:
                default = {**_level_cut("DEFAULT", dname, case), "choice": choice}
                level_cut.append(key)
            else:
                # The path user code takes, with nothing forced: what decides the verdict.
                default = run_cell(torch, None, case, base, dtype, ref, ctx.sync, force)
                default["choice"] = choice
            default_cells.append(default)
            if default["status"] == "error":
                poisoned = _poison_reason(ctx, default, key)
            if ctx.is_cuda and choice == "MATH" and dname != "float32" and not case.strided:
                fallbacks.append({"case": key, "why": why_not_fused(torch, case, *leaves, base["mask"])})
            for backend in backends:
                if poisoned:
                    cells.append(_not_run(backend.name, dname, case, f"not run: {poisoned}"))
                    continue
                if cut and backend.name == choice:
                    cells.append(_level_cut(backend.name, dname, case))
                    continue
                if backend.name == choice:
                    # SDPA's own choice: the default cell ran exactly this kernel.
                    cells.append({**default, "backend": backend.name, "via": "default"})
                    continue
                if (ctx.is_cuda and backend.name == "CUDNN_ATTENTION"
                        and dname not in CUDNN_FORCED_DTYPES):
                    cells.append(_not_run(backend.name, dname, case,
                                          f"not forced: cuDNN is forced on {', '.join(CUDNN_FORCED_DTYPES)} "
                                          "only (a cuDNN graph build per shape)"))
                    continue
                cell = run_cell(torch, backend, case, base, dtype, ref, ctx.sync, force)
                cells.append(cell)
                if cell["status"] == "error":
                    poisoned = _poison_reason(ctx, cell, key)
            del ref, leaves
        del base
    freed = att.free(torch, ctx.device, poisoned)

    matrix: dict[str, dict[str, str]] = {}
    for cell in cells:
        matrix.setdefault(cell["backend"], {})[f"{cell['dtype']}/{cell['case']}"] = cell_text(cell)
    best, why_best = recommend(cells)
    by_dtype = {d: recommend([c for c in cells if c["dtype"] == d])[0] for d in DTYPES
                if any(c["dtype"] == d and c["status"] == "ok" for c in cells)
                and not any(c["dtype"] == d and c.get("level_cut") for c in cells)}
    findings: list[ProbeFinding] = []
    failed_default = [c for c in default_cells if c["status"] not in ("ok", "not-run")]
    ran_default = [c for c in default_cells if not c.get("level_cut")]
    for cell in failed_default:
        key = f"{cell['dtype']}/{cell['case']}"
        if cell["status"] == "mismatch":
            continue  # no knowledge-base entry says why a kernel computes wrong numbers: details
        no_kernel = cell["status"] in ("refused", "unavailable")  # "No available kernel" / "No viable backend"
        kb_id = "sdpa-no-kernel" if no_kernel else att.classify_kernel_error(cell["text"])
        if kb_id == "sdpa-no-kernel":
            summary = f"SDPA has no kernel for {key} with the default backend selection"
        else:
            summary = f"SDPA's default path ({cell['choice']}) raised on {key}"
        if kb_id:
            findings.append(ProbeFinding(kb_id, summary, (cell["text"], *cell.get("reasons", []),
                                                     f"SDPA's choice: {cell['choice']}", _flags(torch))))
    forced_broken = [c for c in cells if c["status"] in ("error", "mismatch") and c.get("via") != "default"]
    for cell in forced_broken:
        if cell["status"] == "mismatch":
            continue
        where = f"{cell['backend']} {cell['dtype']}/{cell['case']}"
        kb_id = att.classify_kernel_error(cell["text"])
        # A sticky fault is no kernel's private matter: the context is gone for every later kernel.
        sticky = is_sticky_cuda_error(cell["text"])
        if kb_id:
            findings.append(ProbeFinding(
                kb_id, f"{where} raised when forced (SDPA itself picks "
                f"{defaults.get(cell['dtype'] + '/' + cell['case'], '?')} here)",
                (cell["text"], where), severity="error" if sticky else "warning"))
    for fb in fallbacks:
        evidence = [f"{b}: {'; '.join(r)}" for b, r in fb["why"].items()]
        findings.append(ProbeFinding(
            "sdpa-no-kernel",
            f"SDPA silently falls back to the math backend for {fb['case']} "
            "(full score matrix in memory)",
            (f"torch._fused_sdp_choice -> MATH for {fb['case']}", *evidence),
            severity="warning",
        ))

    counts = {s: sum(1 for c in cells if c["status"] == s)
              for s in ("ok", "refused", "unavailable", "mismatch", "error", "not-run")}
    details = {
        "device": ctx.device,
        "torch": str(torch.__version__),
        "matrix": matrix,
        "default_path": {f"{c['dtype']}/{c['case']}": f"{c.get('choice', '?')}: {cell_text(c)}"
                         for c in default_cells},
        "counts": counts,
        "recommended_backend": best,
        "recommended_because": why_best,
        "recommended_by_dtype": by_dtype,
        "default_choice": defaults,
        "unavailable": {c["backend"]: c["text"] for c in cells if c["status"] == "unavailable"},
        "default_errors": [{"case": f"{c['dtype']}/{c['case']}", "text": c["text"],
                            "reasons": c.get("reasons", [])}
                           for c in failed_default if c["status"] != "mismatch"],
        "math_fallbacks": [fb["case"] for fb in fallbacks],
        "mismatches": [{k: c[k] for k in ("backend", "dtype", "case", "fwd_err", "bwd_err")}
                       for c in (*default_cells, *cells) if c["status"] == "mismatch"],
        "forced_failures": [f"{c['backend']} {c['dtype']}/{c['case']}: {cell_text(c)}" for c in forced_broken],
        "tolerances": {"forward": att.FWD_TOL, "backward": att.BWD_TOL},
        "global_flags": _flags(torch),
        "forced_with": forcer,
        "time": {"reference_s": round(reference_s, 3),
                 "default_s": round(sum(c.get("ms", 0) for c in default_cells) / 1e3, 3),
                 "forced_s": round(sum(c.get("ms", 0) for c in cells if c.get("via") != "default") / 1e3, 3),
                 "slowest": [f"{c['backend']} {c['dtype']}/{c['case']}: {c['ms']:.0f} ms"
                             for c in sorted((c for c in (*default_cells, *cells) if c.get("via") != "default"
                                              and "ms" in c), key=lambda c: -c["ms"])[:10]]},
        "legacy_sdp_kernel": legacy_sdp_kernel(torch),
        "elapsed_s": round(time.perf_counter() - started, 3),
    }
    if not gqa_ok:
        details["skipped_cases"] = {"gqa": no_gqa}
    if ctx.is_cuda:
        details["cudnn_forced_dtypes"] = list(CUDNN_FORCED_DTYPES)
    if level_cut:
        details["level_cut"] = {"level": ctx.level, "default_cells": level_cut,
                                "why": _level_cut("DEFAULT", CUT_DTYPE, cases[0])["text"]}
    if poisoned:
        details["context_poisoned"] = poisoned
    if freed:
        details["empty_cache_error"] = freed
    summary = (f"SDPA's own choice of backend works on {sum(1 for c in ran_default if c['status'] == 'ok')} "
               f"of {len(ran_default)} cases" + (" run at the quick level" if level_cut else "") + "; forcing each backend in turn, "
               + att.forced_sentence(counts["ok"], counts["refused"] + counts["unavailable"], counts["mismatch"],
                                     counts["error"])
               + f"; recommended backend {best} ({why_best})")
    if failed_default or poisoned:
        status = Status.FAIL
    elif forced_broken or fallbacks:
        status = Status.WARN
        if forced_broken:
            summary += (f"; {counted(len(forced_broken), 'forced run')} of backends SDPA does not pick "
                        f"here {'fails' if len(forced_broken) == 1 else 'fail'}")
    else:
        status = Status.PASS
    return Outcome(status, summary, details, findings)


def _choice_on(torch: Any, case: Case, base: dict[str, Any], dname: str) -> str:
    """SDPA's choice for this case on another dtype (no kernel runs)."""
    leaves = [_leaf(base, n, getattr(torch, dname)) for n in ("q", "k", "v")]
    return default_choice(torch, case, *leaves, base["mask"])


def _poison_reason(ctx: ProbeContext, cell: dict[str, Any], key: str) -> str:
    """Non-empty when the error left the CUDA context unusable: the rest of the matrix is not run."""
    reason = ctx.poisoned(cell.get("text", ""))
    return f"CUDA context poisoned by {cell['backend']} {key}: {reason}" if reason else ""


def _flags(torch: Any) -> str:
    cuda = torch.backends.cuda
    names = ("flash", "mem_efficient", "math", "cudnn")
    got = []
    for name in names:
        check = getattr(cuda, f"{name}_sdp_enabled", None)
        if check is not None:
            got.append(f"{name}={'on' if check() else 'off'}")
    return "global SDPA flags: " + ", ".join(got)
