"""Names as Python binds them: a rule looks at what a call refers to, through `import x as y`,
`from x import y as z`, `from x import *`, module aliases and module-level aliases
(`attention = F.scaled_dot_product_attention`), not at how this file happens to spell it. And the
near misses: the same spelling bound to something else stays silent."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

ALIASES = """
import torch
import torch.nn.functional as F
import xformers.ops as xo
from torch.backends.cuda import sdp_kernel as sk
from torch.backends import cuda as tbc
from xformers.ops import memory_efficient_attention as mea
from flash_attn import flash_attn_func as faf
from torch.nn.functional import softmax as sm
from torch import nn as tnn

attend = F.scaled_dot_product_attention


def kernels():
    with sk(enable_math=False):  # <- GPU002
        pass
    with tbc.sdp_kernel(enable_flash=False):  # <- GPU002
        pass


def xformers_paths(q, k, v):
    a = xo.memory_efficient_attention(q, k, v)  # <- GPU007
    return mea(q, k, v) + a  # <- GPU007


def flash(x, B, N, heads, D):
    q = x.view(B, N, heads, D).transpose(1, 2)
    return faf(q, q, q)  # <- GPU008


def naive(q, k, v):
    scores = torch.matmul(q, k.transpose(-1, -2))  # <- GPU001
    return torch.matmul(sm(scores, dim=-1), v)


def sdpa_output(query, B, H, N, D):
    query = query.view(B, H, N, D)
    out = attend(query, query, query)
    return out.view(B * H, N, D)  # <- GPU003


class Block(tnn.Module):
    def __init__(self):
        super().__init__()
        self.scale = tnn.Parameter(torch.ones(4))

    def half_(self):
        self.scale = self.scale.half()  # <- GPU005
"""


def _marks(source: str) -> dict[str, list[int]]:
    import textwrap

    out: dict[str, list[int]] = {}
    for i, line in enumerate(textwrap.dedent(source).lstrip("\n").splitlines(), 1):
        if "# <- " in line:
            out.setdefault(line.split("# <- ")[1].split()[0], []).append(i)
    return out


def test_rules_see_through_import_aliases(tmp_path):
    result = lint_source(tmp_path, ALIASES)
    expected = _marks(ALIASES)
    found = {code: lines(result, code) for code in {f.code for f in result.findings}}
    assert found == expected


def test_an_aliased_sdp_kernel_gets_the_same_fix(tmp_path):
    result = lint_source(tmp_path, ALIASES, select=["GPU002"])
    first = min(result.findings, key=lambda f: f.line)
    assert first.fix.applicability == "safe"
    assert "[SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]" in first.message


STAR = """
from torch.backends.cuda import *
from flash_attn import *

def f(x, B, N, heads, D):
    with sdp_kernel(enable_math=False):  # <-
        q = x.view(B, N, heads, D).transpose(1, 2)
        return flash_attn_func(q, q, q)  # <-
"""


def test_star_imports_of_the_modules_that_export_the_name(tmp_path):
    result = lint_source(tmp_path, STAR, select=["GPU002", "GPU008"])
    assert sorted(f.line for f in result.findings) == marked_lines(STAR)


NEAR_MISSES = """
import torch
from mylib.attention import sdp_kernel as sk
from mylib import memory_efficient_attention as mea
from torch.backends.cuda import *

def sdp_kernel(**flags):
    return flags

attend = my_attention


def f(q, k, v, x, B, N, H, D):
    with sk(enable_math=False):
        pass
    with sdp_kernel(enable_math=False):
        pass
    y = mea(q, k, v)
    z = 0
    q3 = q.view(B, H, N, D)
    out = attend(q3, q3, q3)
    return out.view(B * H, N, D), y, z
"""


def test_names_bound_to_something_else_stay_silent(tmp_path):
    assert lint_source(tmp_path, NEAR_MISSES).findings == []


REBOUND = """
import torch.nn.functional as F
from torch.backends.cuda import sdp_kernel

def sdp_kernel(**flags):  # the file's own definition wins from here on
    return flags

attend = F.scaled_dot_product_attention
attend = lambda q, k, v: q

def f(q, B, H, N, D):
    with sdp_kernel(enable_math=False):
        pass
    q = q.view(B, H, N, D)
    out = attend(q, q, q)
    return out.view(B * H, N, D)
"""


def test_a_name_bound_twice_at_module_level_is_not_followed(tmp_path):
    assert lint_source(tmp_path, REBOUND, select=["GPU002", "GPU003"]).findings == []


SCOPED = """
def new_api(q):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        return q

def old_api(q, flags):
    from torch.backends.cuda import sdp_kernel as sdpa_kernel
    with sdpa_kernel(**flags):  # <-
        return q
"""


def test_an_import_inside_a_function_binds_the_name_there_only(tmp_path):
    result = lint_source(tmp_path, SCOPED, select=["GPU002"])
    assert lines(result, "GPU002") == marked_lines(SCOPED)
