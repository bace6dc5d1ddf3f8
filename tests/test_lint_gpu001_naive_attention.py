"""GPU001 (naive-attention) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu001_naive_attention.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

ATTENTION_POSITIVE = """
import torch

class CrossFrameAttention:
    def _attention(self, query, key, value, attention_mask=None):
        attention_scores = torch.baddbmm(  # <-
            torch.empty(query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype),
            query, key.transpose(-1, -2), beta=0, alpha=self.scale,
        )
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        if self.upcast_softmax:
            attention_scores = attention_scores.float()
        attention_probs = attention_scores.softmax(dim=-1)
        attention_probs = attention_probs.to(value.dtype)
        return torch.bmm(attention_probs, value)

def vit_block(q, k, v, scale):
    attn = (q @ k.transpose(-2, -1)) * scale  # <-
    attn = attn.softmax(dim=-1)
    attn = F.dropout(attn, 0.1)
    return attn @ v

def einsum_attention(q, k, v):
    sim = torch.einsum("b h i d, b h j d -> b h i j", q, k)  # <-
    return torch.einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)

def one_liner(q, k, v):
    return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.125, dim=-1).matmul(v)  # <-

class Module:
    def forward(self, q, k, v):
        scores = torch.bmm(q, k.transpose(1, 2))  # <-
        probs = self.attn_drop(self.softmax(scores))
        return torch.bmm(probs, v)

class Attention:
    def get_attention_scores(self, query, key):
        scores = torch.baddbmm(self.empty(query, key), query, key.transpose(-1, -2), beta=0, alpha=self.scale)
        return scores.softmax(dim=-1)

class AttnProcessor:
    def __call__(self, attn, hidden_states):
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        attention_probs = attn.get_attention_scores(query, key)  # <-
        return torch.bmm(attention_probs, value)

def fallback(q, k, v, fused):
    if fused:
        return F.scaled_dot_product_attention(q, k, v)
    else:
        attn = (q @ k.transpose(-2, -1)).softmax(-1)     # a fallback beside SDPA: not reported
        return attn @ v

def beside_xformers(q, k, v, use_xformers):
    if use_xformers:
        return xformers.ops.memory_efficient_attention(q, k, v)
    attn = torch.bmm(q, k.transpose(1, 2))  # <-
    return torch.bmm(attn.softmax(-1), v)
"""


ATTENTION_NEAR_MISSES = """
import torch
import torch.nn.functional as F

def linear_with_bias(bias, x, w):
    return torch.baddbmm(bias, x, w)           # a batched GEMM, no softmax

def gating(x, router):
    logits = x @ router                        # softmax over experts, never multiplied again
    return logits.softmax(dim=-1)

def classifier(self, x):
    return (x @ self.weight.t()).softmax(-1) @ self.proj.weight   # products with parameters

def fused(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)

def log_probs(q, k, v):
    s = q @ k.transpose(-1, -2)
    return torch.log_softmax(s, dim=-1)        # not a probability matrix multiplied with v
"""


def test_naive_attention_fires_at_the_score_product(tmp_path):
    result = lint_source(tmp_path, ATTENTION_POSITIVE, select=["GPU001"])
    assert lines(result, "GPU001") == marked_lines(ATTENTION_POSITIVE)
    f = result.findings[0]
    assert f.kb_id == "attention-oom" and "scaled_dot_product_attention" in f.message
    assert f.fix.applicability == "display-only" and not f.fix.edits


def test_naive_attention_near_misses(tmp_path):
    assert lint_source(tmp_path, ATTENTION_NEAR_MISSES, select=["GPU001"]).findings == []


DEFAULT_MODE = """
import torch
import torch.nn.functional as F
from torch import nn


class Mixer(nn.Module):
    def __init__(self, dim, heads=8, backend="eager", fused=False):
        super().__init__()
        self.backend = backend
        self.fused = fused
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.backend == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        elif self.backend == "eager":
            w = (q @ k.transpose(-2, -1)).softmax(dim=-1)  # <- the default backend
            out = w @ v
        else:
            raise ValueError(self.backend)
        use_fused = self.fused and x.shape[1] > 64
        if use_fused:
            out = F.scaled_dot_product_attention(out, k, v)
        else:
            w = (out @ k.transpose(-2, -1)).softmax(dim=-1)  # <- fused=False by default
            out = w @ v
        return out
"""


def test_hand_written_attention_that_is_the_default_branch_beside_sdpa(tmp_path):
    """SDPA beside the eager branch excuses it only when the eager branch is not what the
    constructor's defaults select (backend="eager", fused=False)."""
    result = lint_source(tmp_path, DEFAULT_MODE, select=["GPU001"])
    assert lines(result, "GPU001") == marked_lines(DEFAULT_MODE)
    sdpa_default = DEFAULT_MODE.replace('backend="eager", fused=False', 'backend="sdpa", fused=True')
    assert lines(lint_source(tmp_path, sdpa_default, select=["GPU001"]), "GPU001") == []
    # a switch whose default is not a literal (a module setting) decides nothing: left alone
    chosen = DEFAULT_MODE.replace('backend="eager", fused=False', "backend=BACKEND, fused=FUSED")
    assert lines(lint_source(tmp_path, chosen, select=["GPU001"]), "GPU001") == []
