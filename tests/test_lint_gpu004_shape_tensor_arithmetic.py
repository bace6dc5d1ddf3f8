"""GPU004 (shape-tensor-arithmetic) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu004_shape_tensor_arithmetic.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

SHAPES_POSITIVE = """
import torch

def forward(x):
    grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
    N_t, N_h, N_w = grid_sizes[0]  # <-
    expected_tokens = int(N_t * N_h * N_w)
    for f, h, w in grid_sizes:  # <-
        seq_len = f * h * w
    return expected_tokens

class Block:
    def forward(self, x, grid_sizes):
        return self.audio_cross_attn(x, shape=grid_sizes[0])  # <-

class Model:
    def forward(self, x):
        grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
        return self.block(x, grid_sizes=grid_sizes)
"""


SHAPES_NEAR_MISSES = """
import torch

def fixed(x):
    grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
    for i, (f, h, w) in enumerate(grid_sizes.tolist()):
        seq_len = f * h * w
    N_t, N_h, N_w = grid_sizes[0].tolist()
    a = N_t * N_h
    t, hh, ww = grid_sizes[0]
    t, hh, ww = int(t), int(hh), int(ww)
    return a + t * hh * ww

def shapes_are_ints(x):
    B, N, C = x.shape
    return B * N * C

def chunks(x):
    a, b = torch.chunk(x, 2)
    return a * b

def data_tensor():
    t = torch.tensor([0.5, 1.5])
    u, v = t
    return u + v                     # not sizes
"""


def test_shape_tensors_fire(tmp_path):
    result = lint_source(tmp_path, SHAPES_POSITIVE, select=["GPU004"])
    assert lines(result, "GPU004") == marked_lines(SHAPES_POSITIVE)
    first = result.findings[0]
    assert first.kb_id == "misaligned-address" and ".tolist()" in first.message
    assert first.fix.applicability == "unsafe" and first.fix.edits


def test_shape_tensor_near_misses(tmp_path):
    assert lint_source(tmp_path, SHAPES_NEAR_MISSES, select=["GPU004"]).findings == []


def test_shape_keyword_is_not_flagged_when_this_file_handles_it(tmp_path):
    source = """
    import torch

    def attend(x, shape=None):
        N_t, N_h, N_w = shape  # <-
        return int(N_t * N_h * N_w)

    def caller(x):
        grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
        return attend(x, shape=grid_sizes[0])
    """
    result = lint_source(tmp_path, source, select=["GPU004"])
    # the callee is in this file: reported where its values are unpacked, not at the call
    assert lines(result, "GPU004") == marked_lines(source)
