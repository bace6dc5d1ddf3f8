"""GPU003 (view-after-transpose) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu003_view_after_transpose.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

VIEW_POSITIVE = """
import torch
import torch.nn.functional as F

class Attention:
    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).view(B, N, C)  # <-
        return x

def sdpa_back(query, key, value, B, H, N, D):
    query = query.view(B, H, N, D)
    key = key.view(B, H, N, D)
    value = value.view(B, H, N, D)
    out = F.scaled_dot_product_attention(query, key, value)
    return out.view(B * H, N, D)  # <-

def branches(self, x, B, N, C):
    q = self.q(x).reshape(B, N, self.heads, C // self.heads).permute(0, 2, 1, 3)
    if self.fused:
        y = F.scaled_dot_product_attention(q, q, q)
    else:
        y = (q @ q.transpose(-2, -1)).softmax(-1) @ q
    return y.transpose(1, 2).view(B, N, C)  # <-

def flatten_all(x):
    y = x.permute(0, 2, 3, 1)
    return y.view(-1)  # <-

def mT(a):
    b = a.view(4, 8).mT
    return b.view(32)  # <-
"""


VIEW_NEAR_MISSES = """
import torch
import torch.nn.functional as F

def split_only(x, B, N, H, D):
    y = x.view(B, N, H, D).transpose(1, 2)
    return y.view(B, H, N, 2, D // 2)          # splits the last dimension only

def tokens_to_image(x):
    B, L, C = x.shape
    H = W = int(L ** 0.5)
    return x.transpose(1, 2).view(B, C, H, W)  # splits L

def adjacent_merge(x):
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).view(B, H * W, C)   # H and W stay adjacent in memory

def made_contiguous(x, B, N, C):
    y = x.transpose(1, 2).contiguous()
    return y.view(B, N, C)

def reassigned(x, B, N, C):
    y = x.transpose(1, 2)
    y = torch.zeros(B, N, C)
    return y.view(B * N, C)

def reshape_is_fine(x, B, N, C):
    return x.transpose(1, 2).reshape(B, N, C)

def dtype_view(x):
    return x.transpose(0, 1).view(torch.int16)

def unknown_origin(x, B, N, C):
    return x.view(B, N, C)                     # nothing known about x

def sdpa_split(q, k, v, B, H, N, D):
    q = q.view(B, H, N, D)
    out = F.scaled_dot_product_attention(q, k, v)
    return out.view(B, H, N, 2, D // 2)        # splitting works for every backend layout
"""


def test_view_after_transpose_fires(tmp_path):
    result = lint_source(tmp_path, VIEW_POSITIVE, select=["GPU003"])
    assert lines(result, "GPU003") == marked_lines(VIEW_POSITIVE)
    sdpa = [f for f in result.findings if "scaled_dot_product_attention" in f.message]
    assert sdpa, "the SDPA-output finding names the backend-dependent layout"
    f = result.findings[0]
    assert f.kb_id == "view-stride" and f.fix.applicability == "safe"
    # the finding points at the `view` name itself
    text = VIEW_POSITIVE.lstrip("\n").splitlines()[f.line - 1]
    assert text[f.col - 1:f.col - 1 + 4] == "view"


def test_view_near_misses(tmp_path):
    assert lint_source(tmp_path, VIEW_NEAR_MISSES, select=["GPU003"]).findings == []


PARAM_VIEWS = """
import torch

class Encoder(torch.nn.Module):
    def forward(self, x):
        b = x.size(0)
        return self.fc(x.transpose(1, 2).view(b, -1))  # <-

def pool(hidden):
    return hidden.transpose(1, 2).view(hidden.shape[0], -1)  # <-

def topk_accuracy(output, target, k):
    _, pred = output.topk(k, 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand(k, -1))
    return correct[:k].view(-1).float().sum()  # <-
"""


PARAM_VIEW_NEAR_MISSES = """
import torch

def to_image(x, b, c, h, w):
    return x.transpose(1, 2).view(b, c, h, w)          # splits: fine whatever the rank

def by_row(x, rows):
    return x.transpose(1, 2).view(rows, -1)            # rows: not known to be dim 0

def first_then_swap(x):
    b = x.size(0)
    return x.transpose(0, 1).view(b, -1)               # a 2-D x works: the rank decides

def topk_fixed(output, target, k):
    _, pred = output.topk(k, 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand(k, -1))
    return correct[:k].reshape(-1).float().sum()
"""


def test_view_of_a_parameter_transposed_here(tmp_path):
    result = lint_source(tmp_path, PARAM_VIEWS, select=["GPU003"])
    assert lines(result, "GPU003") == marked_lines(PARAM_VIEWS)
    assert lint_source(tmp_path, PARAM_VIEW_NEAR_MISSES, select=["GPU003"]).findings == []
