"""GPU008 (flash-attn-layout) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu008_flash_attn_layout.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

FLASH_POSITIVE = """
from flash_attn import flash_attn_func
from einops import rearrange

def processor(attn, hidden_states, batch_size):
    query = attn.to_q(hidden_states)
    key = attn.to_k(hidden_states)
    value = attn.to_v(hidden_states)
    head_dim = key.shape[-1] // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    return flash_attn_func(query, key, value)  # <-

def einops_layout(q, k, v, heads):
    q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=heads) for t in (q, k, v))
    q = rearrange(q, "b n (h d) -> b h n d", h=heads)
    return flash_attn_func(q, k, v)  # <-

def transposed_v_only(Q, K, V):
    V = V.transpose(1, 2)
    return flash_attn_func(Q, K, V)  # <-
"""


FLASH_NEAR_MISSES = """
from flash_attn import flash_attn_func
from einops import rearrange

def right_layout(x, B, N, heads, head_dim):
    q = x.view(B, N, heads, head_dim)
    return flash_attn_func(q, q, q)

def einops_right(q, heads):
    q = rearrange(q, "b n (h d) -> b n h d", h=heads)
    return flash_attn_func(q, q, q)

def transposed_back(q, k, v):
    return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

def all_transposed(q, k, v):
    q = q.transpose(1, 2)
    k = k.transpose(1, 2)
    v = v.transpose(1, 2)
    return flash_attn_func(q, k, v)

def unknown(q, k, v):
    return flash_attn_func(q, k, v)
"""


def test_flash_attn_layout_fires(tmp_path):
    result = lint_source(tmp_path, FLASH_POSITIVE, select=["GPU008"])
    assert lines(result, "GPU008") == marked_lines(FLASH_POSITIVE)
    assert all(f.kb_id == "flash-attn-unsupported" for f in result.findings)


def test_flash_attn_near_misses(tmp_path):
    assert lint_source(tmp_path, FLASH_NEAR_MISSES, select=["GPU008"]).findings == []


FLASH_MORE = """
import torch
from flash_attn import flash_attn_func, flash_attn_qkvpacked_func

class Packed(torch.nn.Module):
    def forward(self, x, rotary):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        qkv = torch.stack([q, k, v], dim=2)
        return flash_attn_qkvpacked_func(qkv)  # <-

    def right(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, s, self.heads, self.head_dim)
        k = k.view(b, s, self.heads, self.head_dim)
        v = v.view(b, s, self.heads, self.head_dim)
        return flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2))

def compare(B, N, H, d):
    Q = torch.randn(B, N, H, d)
    K = torch.randn(B, N, H, d)
    V = torch.randn(B, N, H, d)
    V = V.transpose(1, 2)
    return flash_attn_func(Q, K, V)  # <-

def compare_all(B, N, H, d):
    Q = torch.randn(B, N, H, d).transpose(1, 2)
    K = torch.randn(B, N, H, d).transpose(1, 2)
    V = torch.randn(B, N, H, d).transpose(1, 2)
    return flash_attn_func(Q, K, V)          # every one (B, H, N, d): sizes unknown to us as heads
"""


def test_flash_attn_packed_and_one_transposed(tmp_path):
    result = lint_source(tmp_path, FLASH_MORE, select=["GPU008"])
    assert lines(result, "GPU008") == marked_lines(FLASH_MORE)
    packed, odd = sorted(result.findings, key=lambda f: f.line)
    assert "(batch, heads, 3, seqlen, head_dim)" in packed.message
    assert "only v went through transpose(1, 2)" in odd.message
