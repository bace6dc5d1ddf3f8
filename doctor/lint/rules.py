"""The lint rules as data: code, knowledge-base id, the file kinds each reads, the cheap substring
prefilter that decides whether a file is parsed for it, and each rule's own documentation (what
it finds, why that breaks, an example, the fix and how safe the fix is). `gpudoctor explain
GPU003` prints `describe("GPU003")` next to the knowledge-base entry.

This module is pure data and imports nothing heavy: the checkers live in `pyrules`, `archflags`
and `cpprules`, and are imported only when a lint runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# File kinds (engine.classify tells them from file names).
PYTHON, CPP, BUILD = "python", "cpp", "build"

CODE_RE = re.compile(r"^GPU\d{3}$", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str  # kebab-case, for people
    kb_id: str
    title: str
    kinds: tuple[str, ...]
    # Prefilter: every group must have at least one of its byte strings in the file. Only files
    # that pass are parsed for this rule (TorchFix's "torch" prefilter, made per rule).
    prefilter: tuple[tuple[bytes, ...], ...]
    what: str
    why: str
    example: str
    fix: str
    fix_safety: str  # "safe" / "unsafe" / "display-only", then why
    near_misses: str
    # Optional regexes over the raw bytes, checked after the substring groups pass: every element
    # must match; an element that is a tuple matches when any of its regexes does (separate
    # regexes, each with its literal prefix, are several times faster than one alternation).
    pattern: bytes | tuple[bytes | tuple[bytes, ...], ...] | None = None
    # How bad a finding is, in SARIF's words (GitHub code scanning and annotations use them):
    # "error" fails or computes wrong results when it runs, "warning" costs memory or time or
    # is deprecated, "note" is informational.
    level: str = "error"

    def wants(self, data: bytes, seen: dict | None = None) -> bool:
        """Whether the file's bytes pass this rule's prefilter. `seen`: what the other rules'
        checks of the same file found (a substring or pattern is searched once per file)."""
        seen = {} if seen is None else seen
        for group in self.prefilter:
            for s in group:
                hit = seen.get(s)
                if hit is None:
                    hit = seen[s] = s in data
                if hit:
                    break
            else:
                return False
        if self.pattern is None:
            return True
        patterns = self.pattern if isinstance(self.pattern, tuple) else (self.pattern,)
        for p in patterns:
            alternatives = p if isinstance(p, tuple) else (p,)
            for a in alternatives:
                key = (a,)  # a regex, kept apart from a substring spelt the same
                hit = seen.get(key)
                if hit is None:
                    hit = seen[key] = _compiled(a).search(data) is not None
                if hit:
                    break
            else:
                return False
        return True


_CASTS = (b".to(", b".half(", b".bfloat16(", b".float(", b".double(", b".cuda(", b".cpu(", b".type(")
_PATTERNS: dict[bytes, re.Pattern[bytes]] = {}


def _compiled(pattern: bytes) -> re.Pattern[bytes]:
    if pattern not in _PATTERNS:
        _PATTERNS[pattern] = re.compile(pattern, re.M)
    return _PATTERNS[pattern]


# GPU001: a product of two operands (not a decorator's @).
ATTENTION_PRODUCT_ANY = (rb"bmm\(", rb"matmul\(", rb"einsum\(", rb"[\w)\]][ \t]*@[ \t]*[\w(]")
ATTENTION_PRODUCT = b"|".join(ATTENTION_PRODUCT_ANY)
# GPU003: something that makes a tensor non-contiguous (`.T`, not `.Tensor`).
NONCONTIGUOUS = (rb"\.(?:transpose|permute|swapaxes|swapdims)\(|\.mT\b|\.t\(\)|\.T\b|scaled_dot_product_attention"
                 rb"|rearrange\(")
# GPU004: a tensor built from sizes.
SIZE_TENSOR = rb"ensor\([^\n]*(?:\.shape|\.size\(|torch\.(?:long|int)|_sizes?\b)"  # torch.tensor / LongTensor
# GPU004: a tuple unpacked from, or a for loop over, a (subscripted) name; or a shape= keyword
# given a subscript.
_UNPACK = (rb"^[ \t]*(?:for[ \t]+(?:\w+[ \t]*,[ \t]*)?\(?)?\w+[ \t]*,[ \t]*\w+(?:[ \t]*,[ \t]*\w+)*\)?[ \t]*"
           rb"(?:=|in)[ \t]*(?:enumerate\()?[\w.]+(?:\[[^\]\n]*\])?\)?[ \t]*:?[ \t]*(?:#.*)?$"
           rb"|(?:shape|size|sizes)[ \t]*=[ \t]*[\w.]+\[",
           # a reduction of one (`seq_lens.max()`), or one element picked (`pages = pages[0]`)
           rb"\.(?:max|min|sum|prod|amax|amin)\(\)",
           rb"^[ \t]*(\w+)[ \t]*=[ \t]*\1\[-?\d+\][ \t]*(?:#.*)?$",
           # sizes put in a dict of keyword arguments for `**kwargs` (`dict(grid_sizes=...)`, `{"grid_sizes": ...}`)
           rb"(?:sizes|shapes)[\"']?[ \t]*[=:][ \t]*[\w\"'(]",
           # or returned to the caller
           rb"^[ \t]*return[ \t]+(?:torch\.(?:stack|tensor|as_tensor)\(|\w*(?:size|shape|grid|lens)\w*[ \t]*$)")

RULES: tuple[Rule, ...] = (
    Rule(
        code="GPU001",
        name="naive-attention",
        kb_id="attention-oom",
        level="warning",
        title="hand-written attention materialises the full score matrix",
        kinds=(PYTHON,),
        # a softmax, or probabilities from a helper (get_attention_scores, another module's)
        prefilter=((b"softmax", b"get_attention_scores", b"probs", b"scores"), (b"bmm", b"matmul", b"@", b"einsum")),
        pattern=(ATTENTION_PRODUCT_ANY,),
        what=(
            "A product of two activations (torch.baddbmm / bmm / matmul / einsum / @, typically q and "
            "k transposed) whose result goes through a softmax and is then multiplied with a third "
            "tensor (v): attention computed by hand. The finding points at the product that creates "
            "the score matrix; when the scores come from a helper (diffusers' get_attention_scores, or a "
            "function of another module that returns a softmax of a product, or the raw product), at the "
            "helper call in the function that multiplies with the values."
        ),
        why=(
            "The score matrix holds batch x heads x query_len x key_len elements, quadratic in the "
            "sequence length, and the softmax allocates another one of the same size (twice that when "
            "it upcasts to float32). Video and high-resolution diffusion models reach tens or hundreds "
            "of GiB for that one tensor (a ControlVideo run asked for 112.50 GiB on a 32 GiB GPU). "
            "Fused kernels (torch.nn.functional.scaled_dot_product_attention, xformers, flash_attn) "
            "never build the matrix and need memory linear in the sequence length."
        ),
        example=(
            "scores = torch.baddbmm(empty, query, key.transpose(-1, -2), beta=0, alpha=scale)\n"
            "probs = scores.softmax(dim=-1)\n"
            "out = torch.bmm(probs, value)"
        ),
        fix=(
            "Use F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale) on (B, H, N, D) "
            "tensors. From (B*H, N, D) inputs: q.view(B, H, N, D) for each of q, k, v, then "
            "out.reshape(B * H, N, D) afterwards (reshape, not view: see GPU003)."
        ),
        fix_safety=(
            "display-only: the rewrite must keep the mask semantics (additive vs boolean), the scale, "
            "any upcast to float32 and the head layout, so it is left to you; the maths is the same, "
            "float rounding differs slightly. Compare outputs on a small input before switching."
        ),
        near_misses=(
            "A baddbmm/bmm/matmul whose result is not passed through a softmax and then into another "
            "product (a linear layer, a bias-add GEMM, a gating softmax that is not multiplied with "
            "values) does not fire, and neither does a product with a module weight (self.weight), "
            "attention over query slices taken in a loop (sliced attention: the slice bounds its memory), "
            "or a helper that only returns probabilities (the processor that multiplies them changes), "
            "or a branch beside F.scaled_dot_product_attention (a fallback) unless the constructor's "
            "defaults select it (attention_mode=\"math\", enable_flash_attn=False)."
        ),
    ),
    Rule(
        code="GPU002",
        name="sdp-kernel-deprecated",
        kb_id="sdp-kernel-deprecated",
        level="warning",
        title="torch.backends.cuda.sdp_kernel() is deprecated",
        kinds=(PYTHON,),
        prefilter=((b"sdp_kernel",),),
        what="A use of torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=..., enable_cudnn=...).",
        why=(
            "Since PyTorch 2.3 it is a deprecated shim (FutureWarning) over "
            "torch.nn.attention.sdpa_kernel and will be removed; the warning names contextlib.py, not "
            "your line, so it is hard to find by hand."
        ),
        example="with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):",
        fix=(
            "with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):  "
            "# from torch.nn.attention import SDPBackend, sdpa_kernel. The list holds the backends whose "
            "flag was true, in the shim's order; enable_cudnn defaults to True, so cuDNN is listed unless "
            "the old call turned it off (drop it by hand if the code predates PyTorch 2.3 and meant "
            "'memory-efficient only')."
        ),
        fix_safety=(
            "safe: when every enable_* argument is a literal True/False the new call is exactly what the "
            "shim runs (PyTorch >= 2.3), and the import is added after the module's imports. With a "
            "computed flag the fix is display-only."
        ),
        near_misses="torch.nn.attention.sdpa_kernel itself, and a function merely named sdp_kernel in your own module, do not fire.",
    ),
    Rule(
        code="GPU003",
        name="view-after-transpose",
        kb_id="view-stride",
        title=".view() merges dimensions of a transposed, permuted or SDPA-output tensor",
        kinds=(PYTHON,),
        prefilter=((b".view(",), (b"transpose", b"permute", b"swap", b".mT", b".t()", b".T", b"scaled_dot_product_attention",
                                  b"rearrange")),
        pattern=NONCONTIGUOUS,
        what=(
            "x.view(...) where x is, in the same function, the result of transpose / permute / .t() / "
            ".mT / .T or of F.scaled_dot_product_attention (or a value derived from one of those "
            "without a copy), and the view merges dimensions whose memory is not adjacent. The linter "
            "follows names through the function (reassignment and .contiguous() end the tracking) and "
            "matches the view's sizes against the tensor's symbolic shape to tell merging from splitting. "
            "A parameter transposed here counts too: y.transpose(1, 2).view(y.size(0), -1) merges the two "
            "swapped dimensions whatever y's rank; .t(), comparisons (eq) and basic slices keep a "
            "tensor's layout (pred.t().eq(target)[:k].view(-1))."
        ),
        why=(
            "view() never copies, so it can only merge dimensions that are adjacent in memory; after a "
            "transpose they are not, and view raises 'view size is not compatible with input tensor's "
            "size and stride'. SDPA's output layout depends on the backend: the memory-efficient and "
            "flash kernels return (B, H, N, D) tensors laid out as (B, N, H, D), the math kernel (CPU) a "
            "contiguous one, so a view that works on one machine fails on another."
        ),
        example="out = (attn @ v).transpose(1, 2).view(B, N, C)",
        fix="out = (attn @ v).transpose(1, 2).reshape(B, N, C)   # or .contiguous().view(B, N, C)",
        fix_safety=(
            "safe: reshape returns the same values, as a view when one is possible (so it never copies "
            "where view would have worked) and a copy otherwise. If the code writes through the result "
            "expecting to modify the original tensor, that never worked here (view raised), so there is "
            "nothing to keep."
        ),
        near_misses=(
            "A view that only splits a dimension (x.transpose(1, 2).view(B, N, H, 2, D // 2)), a view "
            "that merges dimensions still adjacent in memory (x.permute(0, 2, 3, 1).view(B, H * W, C)), "
            "a view after .contiguous() or after reassigning the name, x.view(dtype), and views of "
            "tensors whose origin the linter cannot see do not fire."
        ),
    ),
    Rule(
        code="GPU004",
        name="shape-tensor-arithmetic",
        kb_id="misaligned-address",
        level="warning",
        title="shape values held as tensors are used in arithmetic before int() / .tolist()",
        kinds=(PYTHON,),
        prefilter=((b"torch.tensor(", b"as_tensor(", b"LongTensor(", b"IntTensor(", b"new_tensor(", b"torch.stack("),
                   (b".shape", b".size()", b"torch.long", b"torch.int")),
        pattern=(SIZE_TENSOR, _UNPACK),
        what=(
            "Names unpacked from (or iterated over) a 1-D tensor of sizes, such as "
            "`N_t, N_h, N_w = grid_sizes[0]` where grid_sizes = torch.stack([torch.tensor(u.shape[2:]) ...]), "
            "or a reduction of one (`seq_lens.max()`, `.sum()`), then multiplied, added or used as sizes "
            "(a new tensor's, range(), a slice bound) before int(), .item() or .tolist(), reported at the "
            "binding or the reduction (one finding per group of bindings). The sizes are followed through "
            "lists and dicts of them, per-sample subscripts and loop variables (`f, h, w = sizes[i]`), "
            "attributes of self (stored in __init__, read in forward), what the project's functions return, "
            "and into the functions of other modules they are handed to (imports, submodule classes, the "
            "elements of a ModuleList, `**kwargs`, super(), forwards rebound with types.MethodType); the "
            "finding there names the caller. A shape= argument given a row of such a tensor is reported at "
            "the call only where the callee cannot be followed."
        ),
        why=(
            "Each element is a 0-d tensor: on a CUDA tensor every operation on it is a kernel launch and "
            "int() synchronises with the GPU, so an error left by an earlier asynchronous kernel (a "
            "misaligned address in an FP8/FP4 or attention kernel) is reported at this innocent line; "
            "the shape arithmetic itself cannot misalign anything. It also costs a sync per op and "
            "breaks torch.compile graphs."
        ),
        example=("grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])\n"
                 "N_t, N_h, N_w = grid_sizes[0]\nexpected_tokens = int(N_t * N_h * N_w)"),
        fix="N_t, N_h, N_w = grid_sizes[0].tolist()   # Python ints\nexpected_tokens = N_t * N_h * N_w",
        fix_safety=(
            "unsafe: the values become Python numbers (.tolist() where the tensor is unpacked; where "
            "another module passes it, `N_t, N_h, N_w = (int(v) for v in shape)` at the binding, which "
            "also accepts the ints other callers pass); code that later needs the values as tensors (a "
            "torch op on them, .item(), .to()) would change, so check the uses. Re-run with "
            "CUDA_LAUNCH_BLOCKING=1 to find the kernel that really failed."
        ),
        near_misses=(
            "Unpacking x.shape (ints), iterating grid_sizes.tolist(), converting with int() or .item() "
            "before any arithmetic, comparing a reduction (assert seq_lens.max() <= seq_len), unpacking "
            "tuples of tensors (torch.chunk), integer tensors that are not sizes (token ids), and callees "
            "in other modules that convert what they receive (shape.tolist()) or receive x.shape (ints) do "
            "not fire."
        ),
    ),
    Rule(
        code="GPU005",
        name="parameter-reassign",
        kb_id="parameter-reassign",
        title="an nn.Parameter is assigned a plain tensor (.to(), .half(), a computed tensor) or converted and thrown away",
        kinds=(PYTHON,),
        prefilter=((b"Parameter", b".weight", b".bias"),),
        pattern=((rb"^[ \t]*([\w.]+)[ \t]*=[ \t]*\1\.(?:to|half|float|double|bfloat16|cuda|cpu|type|type_as)\(",
                  rb"Parameter\(.*\)\.(?:to|half|float|double|bfloat16|cuda|cpu)\(",
                  # a conversion of an attribute as a statement of its own, its result thrown away
                  rb"^[ \t]*\w+\.\w+(?:\.\w+)*\.(?:to|half|float|double|bfloat16|cuda|cpu|type)\([^\n]*\)[ \t]*(?:#[^\n]*)?$",
                  # self.p = f(... self.p ...): a tensor computed from the parameter
                  rb"^[ \t]*(self\.\w+)[ \t]*=[ \t]*[^\n=]*\b\1\b"),),
        what=(
            "`self.p = self.p.to(...)` (or .half() / .float() / .cuda() / ...) where self.p is an "
            "nn.Parameter (created with nn.Parameter / register_parameter in the same class, or the "
            "weight / bias of a standard nn module); `self.p = nn.Parameter(t).to(...)`; "
            "`self.p = F.softmax(self.p)` or any other tensor computed from the parameter, assigned "
            "back to its name outside __init__; and `self.p.half()` / `self.p.to(...)` as a statement "
            "of its own, whose result is thrown away."
        ),
        why=(
            "Parameter.to() returns a plain Tensor whenever it converts, and so does every operation "
            "on a parameter. nn.Module.__setattr__ refuses a plain tensor for a registered parameter: "
            "TypeError: cannot assign 'torch.cuda.BFloat16Tensor' as parameter 'p' (torch.nn.Parameter "
            "or None expected). It only works while the conversion is a no-op, so it breaks on the "
            "first machine where dtype or device differ. `nn.Parameter(t).to(device)` assigned for the "
            "first time silently registers nothing: the attribute is a plain tensor, missing from "
            "parameters(), the optimizer and the state dict. And unlike Module.to() / .half(), which "
            "convert a module in place, a parameter's conversion never changes the parameter: "
            "`self.p.half()` alone does nothing, the parameter stays float32 next to a half model."
        ),
        example="self.token = nn.Parameter(torch.zeros(1, dim))\n...\nself.token = self.token.to(dtype=dtype, device=device)",
        fix="self.token.data = self.token.data.to(dtype=dtype, device=device)   # or convert the module: self.to(dtype=..., device=...)",
        fix_safety=(
            "safe: assigning .data converts the parameter in place; it stays the same registered "
            "nn.Parameter (requires_grad and optimizer references kept). For "
            "nn.Parameter(t).to(x) the fix moves the conversion inside: nn.Parameter(t.to(x)). A "
            "thrown-away conversion gets an unsafe fix (self.p.data = self.p.data.half(): the dtype the "
            "code meant, which it never had); a computed tensor a display-only one (use a local name)."
        ),
        near_misses=(
            "`self.m = self.m.to(dtype)` and `self.m.half()` on a submodule (Module.to converts in place "
            "and returns the module), `self.p.data = self.p.data.to(...)`, `w = F.softmax(self.p)` into "
            "a local name, `self.p.to(x) + y` inside an expression, buffers and attributes not known "
            "to be parameters do not fire."
        ),
    ),
    Rule(
        code="GPU006",
        name="no-kernel-for-newer-gpus",
        kb_id="no-kernel-image",
        title="CUDA build flags leave newer GPUs without a kernel (no PTX)",
        kinds=(PYTHON, BUILD),
        prefilter=((b"-arch", b"gencode", b"generate-code", b"arch=compute_", b"ARCH_LIST", b"CUDA_ARCHITECTURES",
                    b"gpu-architecture", b"-code"),),
        # (a flag starts a word: not "multi-arch " or "# mypy: disable-error-code=")
        pattern=((rb"[\s\"'\[(,=]-arch[= \"']", rb"--gpu-architecture", rb"-gencode", rb"--generate-code",
                  rb"arch=compute_", rb"TORCH_CUDA_ARCH_LIST", rb"CUDA_ARCHITECTURES", rb"[\s\"'\[(,=]-code[= ]"),),
        what=(
            "nvcc flags (-arch / -code / -gencode / --gpu-architecture in extra_cuda_cflags, "
            "extra_compile_args, CMake flags, Makefiles and shell commands), TORCH_CUDA_ARCH_LIST or "
            "CMAKE_CUDA_ARCHITECTURES values after which a GPU in use today that is newer than the "
            "build's newest target (H100 sm_90, B200 sm_100, B300 sm_103, RTX 50xx sm_120, DGX Spark "
            "sm_121) gets no kernel: no SASS that fits and no PTX to JIT-compile. Flags are collected "
            "per list (including later appends), per CMake/Make file and per nvcc command."
        ),
        why=(
            "SASS for sm_XY runs only on GPUs of the same major version with minor >= Y; PTX runs on "
            "its own architecture and every newer one; arch-specific code (sm_90a, sm_100a) runs on "
            "exactly one compute capability and family code (sm_100f) within its major version. "
            "`-gencode arch=compute_86,code=sm_86`, TORCH_CUDA_ARCH_LIST=\"8.6\" or \"7.0;8.0;8.6\", "
            "CMake's \"86-real\" and `-gencode arch=compute_90a,code=sm_90a` embed no PTX that a newer "
            "GPU can use, so an H100, B200 or RTX 5090 gets 'no kernel image is available for "
            "execution on the device' at the first launch. A lone -arch=sm_86 is not this case: nvcc "
            "adds compute_86 PTX to it, which newer GPUs JIT-compile."
        ),
        example='extra_cuda_cflags=["-gencode", "arch=compute_86,code=sm_86"]\nexport TORCH_CUDA_ARCH_LIST="7.0;8.0;8.6"',
        fix=(
            'Add PTX for the newest target ("8.6" -> "8.6+PTX", code=sm_86 -> code=[sm_86,compute_86], '
            'CMake "86-real" -> "86"), or list every GPU family you run on plus PTX for the newest: '
            'TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0;10.0;12.0+PTX".'
        ),
        fix_safety=(
            "safe: where the fix only adds PTX to the newest generic target (\"8.6\" -> \"8.6+PTX\", "
            "code=sm_86 -> code=[sm_86,compute_86], \"86-real\" -> \"86\") the same SASS is built, plus "
            "PTX that newer GPUs JIT-compile at first launch. Builds whose newest targets are "
            "arch-specific get a display-only fix: their kernels may need those features, so only the "
            "author can choose a generic target or a build per GPU family."
        ),
        near_misses=(
            "A lone -arch=sm_XY (its PTX runs on newer GPUs), any list with PTX of a generic target "
            "(+PTX, code=compute_XY, CMake \"86\", nvcc 13.0's -arch=sm_90a), lists that reach the "
            "newest family (\"8.0;9.0;10.0;12.0\"), builds that leave out only older GPUs or gaps "
            "between their targets (\"12.0\", \"8.0;12.0\"), family targets of the newest family "
            "(sm_120f), -arch=native/all, named architectures (Ampere), several alternative "
            "TORCH_CUDA_ARCH_LIST values in one file (unless picked by the CUDA toolkit's version alone, "
            "as cross-compile defaults are: then each is judged), and flags built from variables do not "
            "fire; a list name concatenated into the flags counts with the literal words and appends it "
            "has at that point."
        ),
    ),
    Rule(
        code="GPU007",
        name="xformers-attention",
        kb_id="xformers-flash-invalid-argument",
        level="note",
        title="xformers attention call site (informational: the SDPA route for Blackwell)",
        kinds=(PYTHON,),
        prefilter=((b"xformers", b"memory_efficient_attention"),),
        what=(
            "A call to enable_xformers_memory_efficient_attention() (diffusers) or "
            "xformers.ops.memory_efficient_attention(...)."
        ),
        why=(
            "xformers 0.0.30-0.0.32 wheels dispatch fp16/bf16 attention to their bundled "
            "FlashAttention-3 kernel, which is Hopper-only: on Blackwell (RTX 50xx / RTX PRO 6000 "
            "sm_120, B200 sm_100) it fails with 'CUDA error (flash_fwd_launch_template.h): invalid "
            "argument' or is refused as '(too new)'. PyTorch's SDPA has kernels built for these GPUs "
            "in cu128+ wheels and is what diffusers uses by default on torch >= 2.0."
        ),
        example="pipe.enable_xformers_memory_efficient_attention()\nout = xformers.ops.memory_efficient_attention(q, k, v)",
        fix=(
            "Drop the enable_xformers_memory_efficient_attention() call (diffusers then uses SDPA); "
            "replace memory_efficient_attention(q, k, v) on (B, N, H, D) tensors with "
            "F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)."
        ),
        fix_safety=(
            "display-only: it changes which kernel runs (speed and memory, not the maths), and the "
            "attn_bias types of xformers have no one-line SDPA equivalent."
        ),
        near_misses=(
            "disable_xformers_memory_efficient_attention(), is_xformers_available() and definitions "
            "of these functions do not fire."
        ),
    ),
    Rule(
        code="GPU008",
        name="flash-attn-layout",
        kb_id="flash-attn-unsupported",
        title="flash_attn_func gets (batch, heads, seqlen, head_dim) tensors",
        kinds=(PYTHON,),
        prefilter=((b"flash_attn",),),
        what=(
            "flash_attn_func / flash_attn_qkvpacked_func / flash_attn_kvpacked_func called with q, k or "
            "v whose dimension 1 is known (in the same function) to be the heads dimension: split from "
            "the hidden size with view/reshape/rearrange and moved in front of the sequence with "
            "transpose(1, 2) (the SDPA layout); or with only some of q, k, v transposed from the "
            "layout the others share."
        ),
        why=(
            "flash_attn wants (batch, seqlen, nheads, headdim), SDPA wants (batch, nheads, seqlen, "
            "headdim). Given the SDPA layout, flash_attn reads heads as sequence positions: shape "
            "checks fail, or when the sizes happen to agree it silently computes the wrong attention."
        ),
        example="q = q.view(B, N, H, D).transpose(1, 2)   # SDPA layout\nout = flash_attn_func(q, k, v)",
        fix="Pass (B, N, H, D) tensors: drop the transpose(1, 2) (or transpose back) for all of q, k and v, and transpose the output if the caller expects (B, H, N, D).",
        fix_safety="display-only: which transposes to drop depends on what else uses the tensors.",
        near_misses=("q.view(B, N, H, D) passed directly, rearrange(..., 'b n (h d) -> b n h d'), q, k, v stacked on "
                     "dim 2 from (b, s, h, d) tensors for the packed call, all three transposed alike, and tensors "
                     "of unknown layout do not fire."),
    ),
    Rule(
        code="GPU009",
        name="data-ptr-unchecked",
        kb_id="noncontiguous-kernel-input",
        title="an extension reads data_ptr() of a tensor argument never checked or made contiguous",
        # Python files are read only for the bindings' callers, in the cross-file step
        kinds=(CPP, PYTHON),
        # raw reads, or the bindings and dispatchers that call the functions reading them (a
        # dispatch header of the project's own, included with quotes, is one)
        prefilter=((b"data_ptr", b".data<", b"TORCH_LIBRARY", b"PYBIND11_MODULE", b'#include "'),),
        # a binding used, not defined (torch/library.h defines TORCH_LIBRARY)
        pattern=((rb"data_ptr", rb"\.data<", rb"^[ \t]*(?:TORCH_LIBRARY\w*|PYBIND11_MODULE)[ \t]*\(",
                  rb'^[ \t]*#[ \t]*include[ \t]*"'),),
        what=(
            "In C++/CUDA extension code (it includes torch headers, binds with PYBIND11_MODULE / "
            "TORCH_LIBRARY, or launches kernels on ATen tensors), a function or bound lambda reads "
            "x.data_ptr() / data_ptr<T>() / data<T>() / mutable_ / const_data_ptr of a Tensor parameter "
            "x nowhere checked (x.is_contiguous(), or a macro or helper whose body checks it: "
            "CHECK_INPUT is read where the file or its project headers define it), made contiguous or "
            "read with its strides; a device or dtype check is not a contiguity check. A function "
            "whose every caller passes checked or contiguous tensors is fine: the bindings "
            "(TORCH_LIBRARY_IMPL, PYBIND11_MODULE) name the entry points, and the project's Python "
            "calls of a binding (through its Python wrappers) are callers; a call passing a tensor "
            "not known to be dense is named. "
            "One finding per function and tensor, at its first read (the reads in the other launch "
            "branches are the same fix)."
        ),
        why=(
            "A raw pointer is read as dense row-major memory. A transposed, permuted, sliced or "
            "expanded tensor has the same data_ptr() with other strides, so the kernel computes on the "
            "wrong elements (silently wrong results that no synchronisation fixes) or reads past the end."
        ),
        example="torch::Tensor forward(torch::Tensor x) {\n  kernel<<<grid, block>>>(x.data_ptr<float>(), x.numel());",
        fix='TORCH_CHECK(x.is_contiguous(), "x must be contiguous");   // or: auto xc = x.contiguous(); use xc.data_ptr<float>()',
        fix_safety="display-only: whether to reject or to copy (and where) is a design choice of the extension.",
        near_misses=(
            "Reads of one-element tensors (TORCH_CHECK(x.numel() == 1)), reads after x.contiguous(), "
            "after a contiguity check or macro, of tensors created in the "
            "function (torch::empty), of tensors a same-layout helper of the file compares with a checked "
            "one (TORCH_CHECK(has_same_layout(dy, x))), pointer comparisons and alignment checks inside "
            "TORCH_CHECK, and functions whose callers check or whose every Python call passes "
            "torch.empty / torch.zeros / .contiguous() tensors (or a .view() of one, or a registered "
            "buffer made so), do not fire; x.add(...) on a tensor is not a call of a binding named add. "
            "A sizes comparison (dy.sizes() == x.sizes()) is not a layout check."
        ),
    ),
    Rule(
        code="GPU010",
        name="allocator-mismatch",
        kb_id="custom-allocator",
        title="custom allocator: size not a multiple of the alignment, or freed with the wrong function",
        kinds=(CPP,),
        # (alloc / Alloc / memalign: a gate implied by the next group, three scans instead of ten
        # for the many headers that allocate nothing)
        prefilter=((b"alloc", b"Alloc", b"memalign"),
                   (b"aligned_alloc", b"_aligned_malloc", b"posix_memalign", b"memalign(", b"malloc(", b"calloc(",
                    b"cudaMalloc", b"cudaHostAlloc", b"hipMalloc", b"alloc_cpu("),
                   (b"free", b"Free", b"deleter", b"aligned_alloc"),
                   # PyTorch backend / allocator code, not any C program
                   (b"c10/", b"ATen/", b"torch/", b"DataPtr", b"PrivateUse1", b"privateuseone", b"Allocator")),
        what=(
            "aligned_alloc(alignment, size) where size is not provably a multiple of alignment; memory "
            "from _aligned_malloc released with free (or malloc'd memory with _aligned_free, new with "
            "free, cudaMalloc with free, ...); a c10::Allocator whose allocate() and deleter use "
            "different allocation families (DataPtr{ptr, ctx, &free, device} for _aligned_malloc memory)."
        ),
        why=(
            "aligned_alloc requires size to be a multiple of alignment (C11/C++17; some C libraries "
            "return NULL, others misbehave). Freeing memory with a function from another family "
            "corrupts the heap or crashes later, far from the bug, and PyTorch trusts an allocator "
            "completely: the DataPtr's deleter is the only thing that frees a tensor's storage."
        ),
        example="void* data = aligned_alloc(64, nbytes);\n...\nvoid* p = _aligned_malloc(n, 64);\nfree(p);",
        fix=(
            "Round the size up: aligned_alloc(64, (nbytes + 63) / 64 * 64); free with the matching "
            "function (_aligned_free, cudaFree, delete[]); or use c10::alloc_cpu / c10::free_cpu "
            "(64-byte aligned, PyTorch's own)."
        ),
        fix_safety="display-only: an allocator change affects every tensor of the backend; review and test it.",
        near_misses=(
            "Sizes rounded up in the same function ((n + 63) / 64 * 64, & ~63, an align/round helper), "
            "checked with %, or literal multiples; allocation and release from the same family do not fire."
        ),
    ),
    Rule(
        code="GPU011",
        name="module-after-cast",
        kb_id="dtype-mismatch",
        title="a submodule or parameter is created after the model was cast and is never converted",
        kinds=(PYTHON,),
        prefilter=((b"nn.", b"Module", b"Parameter", b"dtype", b".half()", b".bfloat16()"),),
        # a cast (the cross-file call site) or an nn module assigned to self (the creators)
        pattern=((rb"self\.\w+\s*=\s*(?:nn|torch\.nn)\.[A-Z]", rb"torch_dtype\s*=", rb"\.(?:half|bfloat16)\(\)",
                  rb"\.to\([^)\n]*(?:dtype|bfloat16|float16|half)",
                  # a builder function of the project (build_projector) and a method that calls one
                  rb"return[ \t]+(?:nn|torch\.nn)\.[A-Z]", rb"self\.\w+\s*=\s*\w*(?:build|make|create)_\w*\("),),
        what=(
            "After a module was cast (`.to(dtype)`, `.half()`, `.bfloat16()`, from_pretrained(torch_dtype=...); "
            "also when it arrives through a parameter, an attribute of self or a project function's return), "
            "a new nn module or nn.Parameter without dtype= is added to it by any means (an attribute, "
            "model[3] = ..., append, insert, extend, add_module, register_module, register_parameter, update, "
            "setattr) and never converted. Also a method other than __init__ (and not called from it) that adds "
            "float32 submodules or parameters to self (an enable_*_mode(), with the helpers it calls), when "
            "another module calls it on an object after casting it: reported at each creation, naming the call "
            "and the cast. Classes of other modules count by the project's class table (weights of their own, "
            "of a base or of a class they build; not a class that casts its inputs to its weights)."
        ),
        why=(
            "New modules are created in float32. Next to a bfloat16 / float16 model their matmuls get "
            "mixed operands and fail: RuntimeError: mat1 and mat2 must have the same dtype, but got "
            "BFloat16 and Float."
        ),
        example="model.to(torch.bfloat16)\nmodel.head = nn.Linear(1024, 10)",
        fix=("model.head = nn.Linear(1024, 10).to(dtype=torch.bfloat16)   # or one model.to(...) after every module exists\n"
             "# in a late method: ref_param = next(self.parameters()) first, then\n"
             "self.head = Head(dim).to(device=ref_param.device, dtype=ref_param.dtype)"),
        fix_safety=(
            "unsafe: in a late method, its first line takes the weights the model already has (ref_param = "
            "next(self.parameters())) and each module it creates is converted to their dtype and device, a "
            "parameter's data inside nn.Parameter(...); new weights are rounded to the model's precision, and "
            "a model without parameters has no reference. Display-only elsewhere: the right dtype and device "
            "are those of the model the module joins."
        ),
        near_misses=(
            "Modules converted later with module.to(...) (in place, or item by item: "
            "self.blocks[i] = block.to(...)), Parameters converted through .data, classes that cast their "
            "inputs to their weights (a class casting one of its own parameters to the input still "
            "fires), classes without weights, objects reassigned to something else after the cast, "
            "modules created in __init__ or in a builder it calls, modules created with dtype=/device=, "
            "modules converted later in the same function, and casts to float32 do not fire."
        ),
    ),
    Rule(
        code="GPU012",
        name="strided-into-checking-kernel",
        kb_id="noncontiguous-kernel-input",
        title="a transposed or permuted view is passed to a kernel that checks that its input is contiguous",
        # Python: the functions that check (their callers are read by the cross-file step); C++:
        # the extension functions whose checks decide (GPU009's reading: bindings, macros, helpers)
        kinds=(PYTHON, CPP),
        prefilter=((b"is_contiguous", b"PYBIND11_MODULE", b"TORCH_LIBRARY", b"CHECK_"),),
        what=(
            "A call passes a strided view (x.transpose(...), .permute(...), .t(), .T, .mT, .movedim(...), "
            ".swapaxes(...), made at the call or assigned to the name it passes in straight-line code, and "
            "kept through .to() / .float() / .clone() and the like) to a kernel that checks that argument's "
            "contiguity: a Python function of the project that asserts it (assert x.is_contiguous(), "
            "if not x.is_contiguous(): raise, as Triton launchers do), a C++ extension function bound for "
            "Python that checks it (TORCH_CHECK(x.is_contiguous()), CHECK_INPUT; read as GPU009 reads it), "
            "or a function that hands the parameter on unchanged to one of those. Reported at the argument."
        ),
        why=(
            "A view made by a transpose or permute shares the storage with other strides, so it is not "
            "contiguous, and the kernel refuses it where it checks: AssertionError, 'x must be contiguous', "
            "'Expected x.is_contiguous() to be true'. The traceback ends inside the kernel's wrapper; the "
            "argument to change is at the call."
        ),
        example=("def fwd(x):\n    assert x.is_contiguous()\n    return _launch(x)\n\n"
                 "y = fwd(h.transpose(1, 2))"),
        fix="y = fwd(h.transpose(1, 2).contiguous())",
        fix_safety=(
            "unsafe: .contiguous() copies a strided view, so a kernel that writes into that argument "
            "(an output buffer passed in) writes into the copy; for inputs it is what the kernel asked for."
        ),
        near_misses=(
            "Views made contiguous (.contiguous(), memory_format=), identity transposes and permutes, "
            "names assigned in a branch or a loop on the way to the call, parameters, unpacked iterables, "
            "kernels that copy (x = x.contiguous()) or read strides instead of checking, checks after the "
            "parameter was rebound, methods and autograd.Function.apply, and library functions "
            "(torch, numpy, einops) do not fire."
        ),
    ),
)

BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}


def select(select: list[str] | None, ignore: list[str] | None) -> tuple[Rule, ...]:
    """The rules chosen by code prefixes (`GPU0`, `GPU003`) and `ALL`; ignore wins over select.
    Raises ValueError naming a selector that matches no rule."""

    def matches(selector: str) -> list[Rule]:
        s = selector.strip().upper()
        if s == "ALL":
            return list(RULES)
        found = [r for r in RULES if r.code.startswith(s)]
        if not s or not found:
            raise ValueError(f"unknown rule code {selector!r} (codes are {RULES[0].code}..{RULES[-1].code}, or ALL)")
        return found

    chosen = {r.code for sel in (select or ["ALL"]) for r in matches(sel)}
    dropped = {r.code for sel in (ignore or []) for r in matches(sel)}
    return tuple(r for r in RULES if r.code in chosen and r.code not in dropped)


@dataclass(frozen=True)
class RuleDoc:
    rule: Rule

    def to_dict(self) -> dict[str, str]:
        r = self.rule
        return {"code": r.code, "name": r.name, "kb_id": r.kb_id, "title": r.title,
                "applies_to": ", ".join(r.kinds), "what": r.what, "why": r.why, "example": r.example,
                "fix": r.fix, "fix_safety": r.fix_safety, "near_misses": r.near_misses}


def describe(code: str) -> RuleDoc | None:
    """The documentation of a lint rule by code (case-insensitive), or None."""
    rule = BY_CODE.get(code.strip().upper())
    return RuleDoc(rule) if rule else None


def markdown_table() -> str:
    """The rule table in docs/lint.md (python tools/docs_tables.py writes it there)."""
    rows = ["| code | finds | knowledge-base id | fix |", "| --- | --- | --- | --- |"]
    for r in RULES:
        safety = r.fix_safety.split(":", 1)[0]
        rows.append(f"| `{r.code}` | {r.title.replace('|', chr(92) + '|')} | `{r.kb_id}` | {safety} |")
    return "\n".join(rows) + "\n"
