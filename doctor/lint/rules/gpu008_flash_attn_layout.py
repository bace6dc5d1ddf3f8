"""GPU008 (flash-attn-layout): flash_attn_func gets (batch, heads, seqlen, head_dim) tensors.

Its documentation (what `gpudoctor explain GPU008` prints, and its row in docs/lint.md) and its
prefilter, as data; and the finding it makes of the call the dataflow of gpudoctor.lint.pyflow
reports (`finding_for`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pysource import PySource, finding
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyvalues import FlashLayoutEvent

RULE = Rule(
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
)


def finding_for(src: PySource, ev: FlashLayoutEvent) -> Finding:
    return finding(src, ev.arg, "GPU008", ev.detail,
                   Fix(DISPLAY_ONLY, "pass (batch, seqlen, heads, head_dim) tensors: drop or undo the transpose(1, 2)"))
