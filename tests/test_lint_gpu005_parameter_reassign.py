"""GPU005 (parameter-reassign) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu005_parameter_reassign.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

PARAM_POSITIVE = """
import torch
import torch.nn as nn

class World(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.token_camera = nn.Parameter(torch.zeros(1, dim))
        self.register_parameter("tokens_register", nn.Parameter(torch.zeros(4, dim)))
        self.head = nn.Linear(dim, dim)

    def convert(self, dtype, device):
        self.token_camera = self.token_camera.to(dtype=dtype, device=device)  # <-
        self.tokens_register = self.tokens_register.half()  # <-
        self.head.weight = self.head.weight.to(dtype)  # <-

    def fresh(self, device):
        self.offset = nn.Parameter(torch.zeros(3)).to(device)  # <-

class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        self.weight = self.weight.to(torch.float64)  # <-
        return x

m = nn.Module()
m.token = nn.Parameter(torch.randn(4))
m.token = m.token.to(torch.float64)  # <-
"""


PARAM_NEAR_MISSES = """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.token = nn.Parameter(torch.zeros(dim))
        self.register_buffer("mask", torch.ones(dim))
        self.cache = torch.zeros(dim)

    def convert(self, dtype):
        self.proj = self.proj.to(dtype)                       # Module.to returns the module
        self.token.data = self.token.data.to(dtype)           # in place
        self.token = nn.Parameter(self.token.to(dtype))       # re-wrapped
        self.cache = self.cache.to(dtype)                     # a plain tensor attribute
        self.mask = self.mask.to(dtype)                       # a buffer: tensors are accepted
"""


def test_parameter_reassign_fires(tmp_path):
    result = lint_source(tmp_path, PARAM_POSITIVE, select=["GPU005"])
    assert lines(result, "GPU005") == marked_lines(PARAM_POSITIVE)
    assert all(f.fix.applicability == "safe" and f.fix.edits for f in result.findings)


def test_parameter_reassign_near_misses(tmp_path):
    assert lint_source(tmp_path, PARAM_NEAR_MISSES, select=["GPU005"]).findings == []


THROWN_AWAY = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Lora(nn.Module):
    def __init__(self, base, r):
        super().__init__()
        self.base = base
        self.down = nn.Parameter(torch.zeros(r, base.in_features))
        self.mix = nn.Parameter(torch.ones(r) / r)
        self.register_buffer("scale", torch.ones(1))

    def half_lora(self):
        self.base.half()                                  # a module: converted in place
        self.down.half()  # <-
        self.down.to(dtype=torch.bfloat16)  # <-
        self.scale.half()                                 # a buffer: not known to be a parameter
        y = self.down.to(torch.float16) + 1               # used, not thrown away
        return y

    def forward(self, x):
        self.mix = F.softmax(self.mix, dim=0)  # <-
        weights = F.softmax(self.mix, dim=0)              # a local name
        self.down.data = self.down.data * 0.5             # in place on .data
        return x @ self.down.t() * weights.sum()
"""


def test_a_parameter_conversion_thrown_away_and_a_computed_tensor_assigned(tmp_path):
    result = lint_source(tmp_path, THROWN_AWAY, select=["GPU005"])
    assert lines(result, "GPU005") == marked_lines(THROWN_AWAY)
    by_line = {f.line: f for f in result.findings}
    half, to, computed = (by_line[n] for n in marked_lines(THROWN_AWAY))
    assert half.fix.applicability == "unsafe" and "in place" in half.message
    assert computed.fix.applicability == "display-only" and "local name" in computed.message
