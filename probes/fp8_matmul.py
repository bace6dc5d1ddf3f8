"""The `fp8-matmul` probe: does `torch._scaled_mm` work here, and which FP8 layout rules does it enforce?

The probe runs one aligned, correct FP8 matmul (mat1 row-major, mat2 column-major, float32 scalar
scales, an explicit `out_dtype`) and checks it against a float64 reference of the dequantised inputs.
It then breaks the rules one at a time (a dimension not divisible by 16, a row-major mat2, a
transposed mat1, a storage offset off the 16-byte grid, fp16 or (M,)-shaped scales, no `out_dtype`)
and records, per case, what this torch on this device really does: the exact error, a bare cuBLASLt
status, a silently accepted call with correct numbers, or wrong numbers. Every case is also run on
the `meta` device, which holds the contract that torch.compile and fake tensors enforce: eager
kernels (the CPU one above all) accept layouts that the compiled path rejects.

A finding is what a user can act on here: the aligned call failing (fail), a rule broken with
silently wrong numbers or a sticky fault (warning), a GPU without FP8 when the user asked for this
probe. How this torch enforces the rules otherwise (clear error, bare cuBLASLt status, accepted
eagerly) is recorded in the details. Only a sticky CUDA error stops the remaining cases, and the one
case that may fault (the misaligned operand) runs last. torch 2.4's `_scaled_mm` (keyword scales,
`(out, amax)` returned) is detected from the op's schema.

All cases run in this one worker process (no subprocess): a sticky fault costs the rest of this
probe's cases only, and the runner's worker isolation keeps it from the other probes. Levels
(`ctx.level`): the eager matrix is the same at both. `quick` checks torch.compile's contract (the
meta kernels, whose first use imports torch's meta registrations and sympy) only for the cases
where it can change a verdict or a finding's evidence: a rule case that ran eagerly (correct or
wrong numbers: `accepted` vs `tolerated`; not `no-out-dtype`'s documented float8 result), a
sticky fault, or a control case that failed. A rule
that eager already refuses with a clear, non-sticky error is `enforced` or `cryptic` whatever the
meta kernel says, so its contract is `not-checked` at quick (the reason says so); on an H100 with
torch 2.11 that is every rule case, and the meta path is never imported. `deep` checks every case.

Worker-side module: standard library only at import; torch arrives as `ctx.torch`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudoctor.probes.base import (
    ProbeFinding,
    Outcome,
    ProbeContext,
    ProbeSpec,
    Status,
    error_text,
    is_sticky_cuda_error,
    skipped,
)

SPEC = ProbeSpec(
    id="fp8-matmul",
    title="FP8 matmul (torch._scaled_mm) and its layout rules",
    timeout_s=60.0,
    emits=("fp8-layout", "fp8-unsupported-gpu"),
    needs=("torch",),
    gpu_memory_mib=64,
    description=(
        "Runs torch._scaled_mm on aligned FP8 inputs against a dequantised reference, then breaks "
        "each layout rule once and records the exact error, cuBLASLt status or wrong result."
    ),
)

# Small on purpose: every dimension a multiple of 16, M deliberately different from N and K so a
# swapped operand cannot pass by accident.
M, K, N = 32, 64, 48
UNALIGNED = 40  # a multiple of 8 but not of 16
OFFSET_BYTES = 8  # float8 elements are one byte: 8 elements put mat1 off the 16-byte grid
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_CAPABILITY = (8, 9)  # Ada (sm_89) and Hopper (sm_90) and newer have FP8 tensor cores
CAPABILITY_MESSAGE = "is only supported on CUDA devices with compute capability"

# Worst error relative to the largest reference value that still counts as correct, per output dtype.
# float8 outputs (no out_dtype) round to 3 (e4m3) or 2 (e5m2) mantissa bits: 2^-4 and 2^-3.
_TOLERANCE = {"float32": 1e-3, "bfloat16": 1.6e-2, "float16": 4e-3,
              "float8_e4m3fn": 0.07, "float8_e5m2": 0.14}
NO_KERNEL = "Could not run 'aten::_scaled_mm' with arguments from the"  # the dispatcher's text


def scaled_mm_caller(torch: Any) -> tuple[Any, str]:
    """How `torch._scaled_mm` is called in this torch, read from its schema
    (`torch.ops.aten._scaled_mm.default._schema`): since 2.5 the scales are positional and the
    result is one tensor; torch 2.4 takes them as keywords (`scale_a=`, `scale_b=`) and returns
    `(out, amax)`. Returns a function (a, b, scale_a, scale_b, **kwargs) -> tensor and the form."""
    keyword_scales = False
    try:
        schema = torch.ops.aten._scaled_mm.default._schema
        keyword_scales = any(arg.name == "scale_a" and arg.kwarg_only for arg in schema.arguments)
    except Exception:  # noqa: BLE001 - no schema to read: assume the current signature
        pass

    def call(a: Any, b: Any, scale_a: Any, scale_b: Any, **kwargs: Any) -> Any:
        if keyword_scales:
            out = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, **kwargs)
        else:
            out = torch._scaled_mm(a, b, scale_a, scale_b, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    form = ("torch 2.4: scale_a=/scale_b= keywords, (out, amax) returned" if keyword_scales
            else "positional scales, one tensor returned")
    return call, form


@dataclass(frozen=True)
class Case:
    """One call of `torch._scaled_mm`: the correct one, or one that breaks exactly one rule."""

    name: str
    rule: str  # the rule the case breaks; empty for the correct control cases
    fix: str
    m: int = M
    k: int = K
    n: int = N
    mat1: str = "row-major"  # "row-major" | "transposed" | "offset"
    mat2: str = "col-major"  # "col-major" | "row-major"
    scale: str = "scalar-fp32"  # "scalar-fp32" | "scalar-fp16" | "vector-m"
    out_dtype: str | None = "bfloat16"


CASES: tuple[Case, ...] = (
    Case("aligned", "", ""),
    Case("m-not-16", "", "", m=30),  # control: M needs no alignment
    Case(
        "k-not-16",
        "K (mat1's trailing dimension) must be divisible by 16",
        "pad K with zeros to a multiple of 16 in both operands "
        "(torch.nn.functional.pad(a, (0, pad)) and the matching rows of mat2): zeros leave the "
        "product unchanged",
        k=UNALIGNED,
    ),
    Case(
        "n-not-16",
        "both dimensions of mat2 (K and N) must be divisible by 16",
        "pad N with zeros to a multiple of 16 and slice the output back to N columns",
        n=UNALIGNED,
    ),
    Case(
        "mat2-row-major",
        "mat2 must be column-major",
        "b = b.t().contiguous().t() (same values, column-major strides)",
        mat2="row-major",
    ),
    Case(
        "mat1-transposed",
        "mat1 must be row-major and contiguous (not a transposed view)",
        "a = a.contiguous()",
        mat1="transposed",
    ),
    Case(
        "scale-fp16",
        "tensor-wise scales must be float32 scalars",
        "scale_a = scale_a.float(); scale_b = scale_b.float()",
        scale="scalar-fp16",
    ),
    Case(
        "scale-shape-m",
        "scale_a must be a float32 scalar (tensor-wise) or (M, 1) together with a (1, N) scale_b "
        "(row-wise)",
        "scale_a = scale_a.reshape(M, 1) with scale_b of shape (1, N), or one scalar per tensor",
        scale="vector-m",
    ),
    Case(
        "no-out-dtype",
        "pass out_dtype: without it the result is float8 (or a cuBLASLt error on some builds)",
        "torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)",
        out_dtype=None,
    ),
    # Last: the one case that may fault on the device (a cuBLASLt status, or a sticky misaligned
    # address), so that it cannot take the other rules' results with it.
    Case(
        "mat1-storage-offset",
        "operands must start on a 16-byte-aligned address",
        "a = a.clone() (.contiguous() returns the same misaligned view when it is already "
        "contiguous)",
        mat1="offset",
    ),
)


CONTRACT_SKIPPED = ("off CUDA the meta-device check is opt-in (it imports sympy): "
                    "gpudoctor scan --probe-option fp8_compile_contract=1")


CONTRACT_QUICK = ("quick level: torch.compile's contract cannot change this case's verdict (eager refused "
                  "it with a clear error, or did not run it); --level deep checks it too")


def contract_matters(case: Case, eager: dict[str, Any]) -> bool:
    """Whether torch.compile's contract (the meta kernel) can change this case's verdict or the
    evidence of a finding: `_verdict` reads it only when eager returned correct numbers, and
    `_evidence` prints it for the findings (the aligned case failing, wrong numbers, a sticky
    fault). A case not run (context poisoned) has nothing to compare."""
    outcome = eager.get("outcome")
    if outcome == "not-run":
        return False
    if not case.rule:
        return outcome != "correct"
    if outcome == "error":
        return is_sticky_cuda_error(eager.get("error", ""))
    if outcome == "correct" and str(eager.get("out_dtype", "")).startswith("float8"):
        return False  # `documented`: a float8 result without out_dtype, judged before the contract
    return True


def run(ctx: ProbeContext) -> Outcome:
    with ctx.device_guard():
        return _run(ctx)


def _run(ctx: ProbeContext) -> Outcome:
    torch = ctx.torch
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return skipped(f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn")

    call, form = scaled_mm_caller(torch)
    details: dict[str, Any] = {"shape_mkn": [M, K, N], "fp8_dtype": "float8_e4m3fn", "scaled_mm_form": form}
    findings: list[ProbeFinding] = []
    capability = _capability(torch, ctx.device)
    if capability is not None:
        details["capability"] = f"{capability[0]}.{capability[1]}"
    too_old = capability is not None and capability < MIN_CAPABILITY and not torch.version.hip
    asked = SPEC.id in (ctx.options.get("requested_probes") or ())
    if too_old and not asked:
        # Nothing to act on unless FP8 is wanted here: `--probe fp8-matmul` runs it anyway.
        return skipped(f"this GPU (compute capability {details['capability']}) has no FP8 tensor "
                       "cores: torch._scaled_mm needs sm_89 (Ada), sm_90 (Hopper) or newer "
                       "(gpudoctor scan --probe fp8-matmul checks it anyway)", **details)

    cases: list[dict[str, Any]] = []
    poisoned = ""
    # The compile contract (meta kernels) matters where FP8 runs; off CUDA it is opt-in because
    # the meta path imports sympy, which alone costs more than the rest of a CPU scan's probes.
    check_contract = bool(ctx.options.get("fp8_compile_contract", ctx.is_cuda))
    for case in CASES:
        entry: dict[str, Any] = {"case": case.name, "rule": case.rule, "fix": case.fix}
        if poisoned:
            entry["eager"] = {"outcome": "not-run", "reason": f"CUDA context poisoned: {poisoned}"}
        else:
            entry["eager"] = _attempt(torch, case, ctx.device, ctx.sync, call)
            if entry["eager"].get("outcome") == "error":
                # Only a sticky error poisons: a CUBLAS_STATUS_* is reported once and harmless.
                poisoned = ctx.poisoned(entry["eager"]["error"]) or ""
        if not check_contract:
            entry["compile_contract"] = {"outcome": "not-checked", "reason": CONTRACT_SKIPPED}
        elif not ctx.deep and not contract_matters(case, entry["eager"]):
            entry["compile_contract"] = {"outcome": "not-checked", "reason": CONTRACT_QUICK}
        else:
            entry["compile_contract"] = _attempt(torch, case, "meta", lambda: None, call)
        cases.append(entry)
    details["cases"] = cases
    if not ctx.deep and check_contract:
        details["contract_not_checked"] = [c["case"] for c in cases
                                           if c["compile_contract"].get("reason") == CONTRACT_QUICK]
    details["scaled_mm_v2"] = _try_v2(torch, ctx.device, ctx.sync) if not poisoned else {
        "outcome": "not-run", "reason": f"CUDA context poisoned: {poisoned}"}
    if poisoned:
        details["context_poisoned"] = poisoned
    for c in cases:
        c["verdict"] = _verdict(c) if c["rule"] else c["eager"]["outcome"]

    aligned = cases[0]["eager"]
    if not ctx.is_cuda and NO_KERNEL in aligned.get("error", ""):
        # torch 2.4 has no CPU kernel for _scaled_mm: a fact about the build, nothing to fix.
        return skipped(f"torch {torch.__version__} has no torch._scaled_mm kernel for {ctx.device}",
                       **details)
    if too_old or CAPABILITY_MESSAGE in aligned.get("error", ""):
        findings.append(
            ProbeFinding(
                "fp8-unsupported-gpu",
                f"this GPU (compute capability {details.get('capability', '?')}) has no FP8 matmul; "
                "torch._scaled_mm needs sm_89 (Ada) or sm_90 (Hopper) or newer",
                evidence=tuple(
                    filter(None, [f"capability {details.get('capability')}", aligned.get("error")])
                ),
                severity="warning",
            )
        )
        return Outcome(Status.WARN, f"FP8 matmul unsupported on {ctx.device} (capability "
                       f"{details.get('capability')})", details, findings)
    if aligned["outcome"] != "correct":
        findings.append(
            ProbeFinding(
                "fp8-layout",
                "the aligned, correctly laid out FP8 matmul "
                + ("failed" if aligned["outcome"] == "error" else "gave wrong numbers"),
                evidence=_evidence(cases[0]),
            )
        )
        return Outcome(Status.FAIL, f"aligned torch._scaled_mm on {ctx.device}: {aligned['outcome']}",
                       details, findings)
    status, summary = Status.PASS, f"aligned torch._scaled_mm on {ctx.device} is correct"
    # What a user can act on: a rule this torch breaks with *silently wrong numbers*. A rule that
    # is enforced with a bare cuBLASLt status ("cryptic"), or accepted eagerly although
    # torch.compile rejects it ("accepted"), is how this torch behaves: details, not findings.
    broken = [c for c in cases if c["rule"] and c["verdict"] in ("wrong", "poisons")]
    rules = [c for c in cases if c["rule"]]
    summary += "; " + _rules_sentence(rules, ctx.device)
    if broken:
        status = Status.WARN
        findings.append(
            ProbeFinding(
                "fp8-layout",
                f"on {ctx.device}, breaking these FP8 layout rules gives silently wrong numbers or "
                "a sticky CUDA error that ends the process: "
                + ", ".join(f"{c['case']} ({c['verdict']})" for c in broken),
                evidence=tuple(line for c in broken for line in _evidence(c)),
                severity="warning",
            )
        )
    if poisoned:
        summary += f"; the CUDA context was poisoned: {poisoned}"
    return Outcome(status, summary, details, findings)


# How each verdict reads in the summary: (singular, plural), after the count.
_VERDICT_WORDS = {
    "enforced": ("is refused with a clear error", "are refused with a clear error"),
    "cryptic": ("is refused with a bare cuBLASLt or CUDA status (no word about FP8)",
                "are refused with a bare cuBLASLt or CUDA status (no word about FP8)"),
    "wrong": ("gives silently wrong numbers", "give silently wrong numbers"),
    "poisons": ("breaks the CUDA context until the process restarts",
                "break the CUDA context until the process restarts"),
    "accepted": ("runs on {device} although torch.compile refuses it",
                 "run on {device} although torch.compile refuses them"),
    "tolerated": ("runs on {device} and under torch.compile", "run on {device} and under torch.compile"),
    "runs-eagerly": ("runs on {device} (torch.compile's stricter check not tried)",
                     "run on {device} (torch.compile's stricter check not tried)"),
    "documented": ("returns a float8 result as documented (no out_dtype)",
                   "return a float8 result as documented (no out_dtype)"),
    "not-run": ("was not run", "were not run"),
}


def _rules_sentence(rules: list[dict[str, Any]], device: str) -> str:
    """`of 8 layout rules broken on purpose, 6 run on cpu ... and 1 is refused with a clear
    error`: the tally in words a PyTorch user reads without the verdict names of the details."""
    parts = []
    for verdict, n in sorted(_tally(rules).items(), key=lambda item: (-item[1], item[0])):
        one, many = _VERDICT_WORDS.get(verdict, (verdict, verdict))
        parts.append(f"{n} {(one if n == 1 else many).format(device=device)}")
    what = "layout rule" if len(rules) == 1 else "layout rules"
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"of {len(rules)} {what} broken on purpose, {listed}"


def _tally(rules: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in rules:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return counts


def _capability(torch: Any, device: str) -> tuple[int, int] | None:
    if not device.startswith("cuda"):
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _verdict(entry: dict[str, Any]) -> str:
    """How a rule-breaking case fared eagerly: `enforced` (a clear torch error), `cryptic` (a
    cuBLASLt status or CUDA error with no FP8 wording), `wrong` (numbers), `accepted` (correct
    numbers although the compiled path rejects the call), `not-run`, `documented` (no out_dtype:
    a float8 result as documented, correct to float8 precision), `poisons` (a sticky CUDA error:
    the process must restart) or `tolerated` (both accept)."""
    eager = entry["eager"]
    if eager["outcome"] == "correct" and str(eager.get("out_dtype", "")).startswith("float8"):
        return "documented"
    if eager["outcome"] == "error" and is_sticky_cuda_error(eager.get("error", "")):
        return "poisons"
    if eager["outcome"] == "error":
        return "cryptic" if eager.get("kind") in ("cublas-status", "cuda-error") else "enforced"
    if eager["outcome"] == "wrong":
        return "wrong"
    if eager["outcome"] == "not-run":
        return "not-run"
    contract = entry["compile_contract"]["outcome"]
    if contract == "not-checked":
        return "runs-eagerly"
    return "accepted" if contract == "error" else "tolerated"


def _evidence(entry: dict[str, Any]) -> tuple[str, ...]:
    eager, contract = entry["eager"], entry["compile_contract"]
    head = f"{entry['case']}: {entry['rule'] or 'correct call'}"
    if eager["outcome"] == "error":
        got = f"eager raised {eager['error']}"
    elif eager["outcome"] == "not-run":
        got = f"eager not run ({eager['reason']})"
    else:
        got = (
            f"eager returned {eager['out_dtype']} with relative error {eager['rel_error']:.3g} "
            f"({eager['outcome']})"
        )
    lines = [head, f"  inputs: {eager.get('inputs', contract.get('inputs', ''))}", f"  {got}"]
    if contract["outcome"] == "not-checked":
        lines.append(f"  torch.compile/meta: not checked ({contract['reason']})")
    else:
        lines.append(
            "  torch.compile/meta: "
            + (f"raises {contract['error']}" if contract["outcome"] == "error" else "accepts")
        )
    if entry["fix"]:
        lines.append(f"  fix: {entry['fix']}")
    return tuple(lines)


def _build(torch: Any, case: Case, device: str) -> dict[str, Any]:
    """The operands of one case, quantised on the CPU from a fixed seed, laid out on `device`."""
    f8 = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(8)
    a_hp = torch.randn(case.m, case.k, generator=gen)
    b_hp = torch.randn(case.n, case.k, generator=gen)  # mat2 as (N, K) rows: .t() is column-major
    sa = float(a_hp.abs().max()) / FP8_MAX
    sb = float(b_hp.abs().max()) / FP8_MAX
    a_q = (a_hp / sa).to(f8)
    b_q = (b_hp / sb).to(f8)

    # The layout is made on the target device: moving a strided view copies it into a fresh,
    # contiguous, aligned tensor and would erase the very defect under test.
    if case.mat1 == "transposed":
        a = a_q.t().contiguous().to(device).t()
    elif case.mat1 == "offset":
        flat = torch.cat([torch.zeros(OFFSET_BYTES, dtype=torch.uint8), a_q.view(torch.uint8).flatten()])
        a = flat.to(device).view(f8)[OFFSET_BYTES:].view(case.m, case.k)
    else:
        a = a_q.to(device)
    b_cm = b_q.to(device).t()
    b = b_cm.contiguous() if case.mat2 == "row-major" else b_cm

    if case.scale == "scalar-fp16":
        scale_a = torch.tensor(sa, dtype=torch.float16)
        scale_b = torch.tensor(sb, dtype=torch.float16)
    elif case.scale == "vector-m":
        scale_a = torch.full((case.m,), sa, dtype=torch.float32)
        scale_b = torch.tensor(sb, dtype=torch.float32)
    else:
        scale_a = torch.tensor(sa, dtype=torch.float32)
        scale_b = torch.tensor(sb, dtype=torch.float32)
    kwargs = {} if case.out_dtype is None else {"out_dtype": getattr(torch, case.out_dtype)}
    return {
        "a": a,
        "b": b,
        "scale_a": scale_a.to(device),
        "scale_b": scale_b.to(device),
        "kwargs": kwargs,
        "a_q": a_q,
        "b_q": b_q.t(),
    }


def _describe(ops: dict[str, Any]) -> str:
    a, b, sa, sb = ops["a"], ops["b"], ops["scale_a"], ops["scale_b"]
    out = ops["kwargs"].get("out_dtype")
    return (
        f"mat1 {tuple(a.shape)} stride {tuple(a.stride())} offset {a.storage_offset()}; "
        f"mat2 {tuple(b.shape)} stride {tuple(b.stride())}; "
        f"scale_a {str(sa.dtype).replace('torch.', '')} {tuple(sa.shape)}, "
        f"scale_b {str(sb.dtype).replace('torch.', '')} {tuple(sb.shape)}; "
        f"out_dtype {str(out).replace('torch.', '') if out is not None else 'omitted'}"
    )


def _attempt(torch: Any, case: Case, device: str, sync: Any, call: Any = None) -> dict[str, Any]:
    """One case: build the operands on `device`, call, synchronise, compare; every step that
    touches the device inside the `try`, so that a fault is this case's result."""
    call = call or scaled_mm_caller(torch)[0]
    result: dict[str, Any] = {}
    stage = "setup"
    try:
        ops = _build(torch, case, device)
        result["inputs"] = _describe(ops)
        stage = "call"
        out = call(ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], **ops["kwargs"])
        sync()
        result["out_dtype"] = str(out.dtype).replace("torch.", "")
        if device == "meta":
            result["outcome"] = "ok"
            return result
        stage = "compare"
        sa = ops["scale_a"].double().cpu()
        sa = sa.reshape(-1, 1) if sa.dim() == 1 else sa
        ref = (ops["a_q"].double() * sa) @ (ops["b_q"].double() * ops["scale_b"].double().cpu())
        got = out.double().cpu()
    except Exception as exc:  # noqa: BLE001 - an error is the measurement
        text = error_text(exc)
        result.update(outcome="error", error=text, kind="setup" if stage == "setup" else _error_kind(text))
        return result
    if tuple(got.shape) != tuple(ref.shape):
        result.update(outcome="wrong", rel_error=float("inf"), note=f"shape {tuple(got.shape)}")
        return result
    rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    # Judged at the precision of what came back: without out_dtype that is float8, as documented.
    tol = _TOLERANCE.get(result["out_dtype"], _TOLERANCE["bfloat16"])
    result.update(rel_error=rel, outcome="correct" if rel <= tol else "wrong", tolerance=tol)
    return result


def _error_kind(text: str) -> str:
    if "CUBLAS_STATUS" in text:
        return "cublas-status"
    if "CUDA error" in text:
        return "cuda-error"
    if "cuBLASLt" in text:
        return "cublaslt-layout"
    return "torch-check"


def _try_v2(torch: Any, device: str, sync: Any) -> dict[str, Any]:
    """The v2 API (`torch.nn.functional.scaled_mm` with ScalingType recipes) on the aligned case."""
    fn = getattr(torch.nn.functional, "scaled_mm", None)
    recipes = getattr(torch.nn.functional, "ScalingType", None)
    if fn is None or recipes is None:
        return {"present": False}
    try:
        ops = _build(torch, CASES[0], device)
        tensorwise = recipes.TensorWise
        out = fn(ops["a"], ops["b"], ops["scale_a"], tensorwise, ops["scale_b"], tensorwise,
                 output_dtype=torch.bfloat16)
        sync()
        ref = (ops["a_q"].double() * ops["scale_a"].double().cpu()) @ (
            ops["b_q"].double() * ops["scale_b"].double().cpu()
        )
        rel = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    except Exception as exc:  # noqa: BLE001
        return {"present": True, "outcome": "error", "error": error_text(exc)}
    ok = rel <= _TOLERANCE["bfloat16"]
    return {"present": True, "outcome": "correct" if ok else "wrong", "rel_error": rel}
