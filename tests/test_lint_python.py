"""The Python rules of `gpudoctor lint` on our own snippets: each rule fires on the marked lines
(`# <-`) and on nothing else, and each has near-misses that must stay silent."""
from __future__ import annotations

import pytest

from lint_helpers import lines, lint_source, marked_lines

# --- GPU001 naive attention --------------------------------------------------------------------

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


# --- GPU002 sdp_kernel ------------------------------------------------------------------------

SDP_POSITIVE = """
import torch
from torch.backends.cuda import sdp_kernel
import torch.backends.cuda as tbc

def f(q, k, v):
    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):  # <-
        pass
    with sdp_kernel(True, False, False, False):  # <-
        pass
    with tbc.sdp_kernel(enable_math=flag):  # <-
        pass
    ctx = torch.backends.cuda.sdp_kernel  # <-
"""


def test_sdp_kernel_fires_and_lists_the_same_backends(tmp_path):
    result = lint_source(tmp_path, SDP_POSITIVE, select=["GPU002"])
    assert lines(result, "GPU002") == marked_lines(SDP_POSITIVE)
    by_line = {f.line: f for f in result.findings}
    first, second, computed, ref = (by_line[n] for n in marked_lines(SDP_POSITIVE))
    # enable_cudnn defaults to True in the shim, so it stays in the list
    assert "[SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]" in first.message
    assert first.fix.applicability == "safe"
    assert "[SDPBackend.FLASH_ATTENTION]" in second.message
    assert computed.fix.applicability == "display-only"  # a computed flag: no edit
    assert ref.fix.applicability == "display-only"


def test_sdp_kernel_near_misses(tmp_path):
    source = """
    import torch
    from torch.nn.attention import sdpa_kernel, SDPBackend

    def sdp_kernel(x):              # our own function of that name
        return x

    with sdpa_kernel([SDPBackend.MATH]):
        sdp_kernel(1)
    """
    assert lint_source(tmp_path, source, select=["GPU002"]).findings == []


# --- GPU003 view after transpose --------------------------------------------------------------

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


# --- GPU004 shape tensors ------------------------------------------------------------------------

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


# --- GPU005 parameter reassignment ------------------------------------------------------------

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


# --- GPU007 xformers ---------------------------------------------------------------------------

XFORMERS = """
import xformers.ops
import xformers.ops as xops
from xformers.ops import memory_efficient_attention

def run(pipe, q, k, v):
    pipe.enable_xformers_memory_efficient_attention()  # <-
    a = xformers.ops.memory_efficient_attention(q, k, v)  # <-
    b = xops.memory_efficient_attention(q, k, v, attn_bias=None)  # <-
    c = memory_efficient_attention(q, k, v)  # <-
    pipe.disable_xformers_memory_efficient_attention()
    return a, b, c
"""


def test_xformers_call_sites(tmp_path):
    result = lint_source(tmp_path, XFORMERS, select=["GPU007"])
    assert lines(result, "GPU007") == marked_lines(XFORMERS)
    assert all(f.kb_id == "xformers-flash-invalid-argument" for f in result.findings)
    assert all("Blackwell" in f.message for f in result.findings)


def test_xformers_near_misses(tmp_path):
    source = """
    from diffusers.utils import is_xformers_available

    class Pipe:
        def enable_xformers_memory_efficient_attention(self):   # a definition, not a call
            pass

    def memory_efficient_attention(q, k, v):                     # our own function of that name
        return q

    def run(pipe, q):
        if is_xformers_available():
            pipe.disable_xformers_memory_efficient_attention()
        return memory_efficient_attention(q, q, q)
    """
    assert lint_source(tmp_path, source, select=["GPU007"]).findings == []


# --- GPU008 flash_attn layout ------------------------------------------------------------------

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


# --- GPU011 modules created after a cast --------------------------------------------------------

AFTER_CAST = """
import torch
import torch.nn as nn

def build(model):
    model.to(torch.bfloat16)
    model.head = nn.Linear(1024, 10)  # <-
    model.norm = nn.LayerNorm(1024, dtype=torch.bfloat16)
    model.adapter = nn.Linear(1024, 1024)
    model.adapter.to(torch.bfloat16)
    model.extra = nn.Linear(4, 4).to(dtype=torch.bfloat16)
    return model

def early(model):
    model.head = nn.Linear(1024, 10)     # created before the cast: converted by it
    model.half()
    return model
"""


def test_module_after_cast_in_one_function(tmp_path):
    result = lint_source(tmp_path, AFTER_CAST, select=["GPU011"])
    assert lines(result, "GPU011") == marked_lines(AFTER_CAST)
    assert result.findings[0].kb_id == "dtype-mismatch"


def test_module_after_cast_across_files(tmp_path):
    from lint_helpers import lint_tree

    files = {
        "model.py": """
            import torch.nn as nn

            class Adapter(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.fc = nn.Linear(dim, dim)

            class DiT(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.blocks = nn.ModuleList([nn.Linear(dim, dim)])
                    self._build_head()

                def _build_head(self):
                    self.head = nn.Linear(4, 4)          # called from __init__: fine

                def enable_world_mode(self, dim):
                    self.bridge = Adapter(dim)  # <-
                    self.token = nn.Parameter(torch.zeros(1, dim))  # <-
                    for p in self.blocks.parameters():
                        p.requires_grad = False

                def enable_safe_mode(self, dim):
                    self.bridge = Adapter(dim)
                    ref = next(self.blocks.parameters())
                    self.bridge.to(dtype=ref.dtype, device=ref.device)
            """,
        "train.py": """
            import torch
            from model import DiT

            def main(dit):
                pipe = Pipeline.from_pretrained("x", torch_dtype=torch.bfloat16)
                pipe.dit.enable_world_mode(1024)
                pipe.dit.enable_safe_mode(1024)
            """,
    }
    from lint_helpers import marked_lines as ml

    result = lint_tree(tmp_path, files, select=["GPU011"])
    found = [(f.path.rsplit("/", 1)[-1], f.line) for f in result.findings]
    # at each module the method creates (the place to change), naming the call and the cast
    assert found == [("model.py", line) for line in ml(files["model.py"])]
    assert "self.bridge" in result.findings[0].message and "train.py:6" in result.findings[0].message


@pytest.mark.parametrize("code", ["GPU001", "GPU003", "GPU004", "GPU005", "GPU008"])
def test_clean_modern_code_is_clean(tmp_path, code):
    """Idiomatic current code (SDPA, reshape, ints, module.to) gives no finding for any rule."""
    source = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.token = nn.Parameter(torch.zeros(1, dim))

        def forward(self, x, grid_sizes):
            B, N, C = x.shape
            q, k, v = self.qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v)
            out = out.transpose(1, 2).reshape(B, N, C)
            f, h, w = grid_sizes[0].tolist()
            return self.proj(out), f * h * w
    """
    assert lint_source(tmp_path, source, select=[code]).findings == []


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


def test_thrown_away_half_really_does_nothing_and_the_fix_converts(tmp_path):
    torch = pytest.importorskip("torch")
    source = """
    import torch
    import torch.nn as nn

    class Lora(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Parameter(torch.zeros(2, 3))

        def half_lora(self):
            self.down.half()
            return self
    """
    from typer.testing import CliRunner

    from gpudoctor.cli import app
    import textwrap

    path = tmp_path / "lora.py"
    path.write_text(textwrap.dedent(source).lstrip())
    scope: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    assert scope["Lora"]().half_lora().down.dtype == torch.float32  # the bug: nothing happened
    r = CliRunner().invoke(app, ["lint", str(path), "--fix", "--unsafe-fixes", "-q"])
    assert r.exit_code == 0, r.output
    assert "self.down.data = self.down.data.half()" in path.read_text()
    scope = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    fixed = scope["Lora"]().half_lora()
    assert fixed.down.dtype == torch.float16 and isinstance(fixed.down, torch.nn.Parameter)


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


def test_view_of_a_transposed_parameter_really_fails(tmp_path):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError) as exc:
        x.transpose(1, 2).view(x.size(0), -1)
    from gpudoctor.knowledge import kb

    entry = kb.load_entry("view-stride")
    assert any(p.regex.search(str(exc.value)) for p in entry.patterns if p.role == "anchor")
    assert torch.equal(x.transpose(1, 2).reshape(x.size(0), -1), x.transpose(1, 2).contiguous().view(2, -1))


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
