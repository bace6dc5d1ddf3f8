"""GPU007 (xformers-attention): xformers attention call site (informational: the SDPA route for Blackwell).

Its documentation (what `gpudoctor explain GPU007` prints, and its row in docs/lint.md) and its
prefilter, as data; and its check (`check`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pysource import PySource, any_of, call_name, finding
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyrules import Facts

RULE = Rule(
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
)


def check(src: PySource, facts: Facts | None = None) -> list[Finding]:
    out: list[Finding] = []
    spelt = src.spellings("xformers.ops.memory_efficient_attention") | {"memory_efficient_attention"}
    for node, _ in src.nodes_on_lines(src.lines_matching(any_of(spelt)), (ast.Call,)):
        assert isinstance(node, ast.Call)
        name = call_name(node)
        if isinstance(node.func, ast.Name):
            name = (src.qualname(node.func) or name).rsplit(".", 1)[-1]
        if name == "enable_xformers_memory_efficient_attention" and isinstance(node.func, ast.Attribute):
            out.append(finding(src, node, "GPU007", (
                "enable_xformers_memory_efficient_attention(): xformers 0.0.30-0.0.32 run a Hopper-only "
                "FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120: 'invalid argument' or "
                "'too new'); without this call diffusers uses PyTorch SDPA, which has kernels for them"),
                Fix(DISPLAY_ONLY, "drop the call (diffusers uses SDPA by default on torch >= 2.0)")))
        elif name == "memory_efficient_attention":
            q = src.qualname(node.func) or ""
            if q.startswith("xformers.") or q in ("xops.memory_efficient_attention",):
                out.append(finding(src, node, "GPU007", (
                    "xformers.ops.memory_efficient_attention: xformers 0.0.30-0.0.32 dispatch fp16/bf16 inputs to a "
                    "Hopper-only FlashAttention-3 kernel that fails on Blackwell GPUs (sm_100 / sm_120); "
                    "F.scaled_dot_product_attention on (B, H, N, D) tensors runs there"),
                    Fix(DISPLAY_ONLY, "F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), "
                                      "v.transpose(1, 2)).transpose(1, 2) for (B, N, H, D) inputs")))
    return out
