"""Before/after on the CPU: code the linter flags really fails (or warns) with the error its
knowledge-base entry names, `gpudoctor lint --fix` rewrites it, and the fixed code runs and
gives the same numbers as a hand-written reference."""
from __future__ import annotations

import textwrap
import warnings

import pytest
from typer.testing import CliRunner

from gpudoctor.knowledge import kb
from gpudoctor.cli import app

torch = pytest.importorskip("torch")


def _fix(tmp_path, source: str, *extra: str) -> tuple[str, str]:
    path = tmp_path / "case.py"
    path.write_text(textwrap.dedent(source).lstrip())
    r = CliRunner().invoke(app, ["lint", str(path), "--fix", "-q", *extra])
    assert r.exit_code in (0, 1), r.output
    return textwrap.dedent(source).lstrip(), path.read_text()


def _run(source: str) -> dict:
    scope: dict = {}
    exec(compile(source, "<case>", "exec"), scope)
    return scope


def _entry_matches(kb_id: str, message: str) -> bool:
    entry = kb.load_entry(kb_id)
    return any(p.regex.search(message) for p in entry.patterns if p.role == "anchor")


def test_view_after_transpose(tmp_path):
    before, after = _fix(tmp_path, """
        import torch

        def merge_heads(x, B, N, H, D):
            y = x.view(B, N, H, D).transpose(1, 2)
            return y.view(B * H, N, D)

        torch.manual_seed(0)
        x = torch.randn(2, 5, 3 * 4)
        """)
    with pytest.raises(RuntimeError) as exc:
        _run(before)["merge_heads"](torch.randn(2, 5, 12), 2, 5, 3, 4)
    assert _entry_matches("view-stride", str(exc.value))
    assert "y.reshape(B * H, N, D)" in after
    scope = _run(after)
    x = scope["x"]
    expected = x.view(2, 5, 3, 4).transpose(1, 2).contiguous().view(6, 5, 4)
    assert torch.equal(scope["merge_heads"](x, 2, 5, 3, 4), expected)


def test_sdpa_output_layout_follows_the_query(tmp_path):
    """The same `.transpose(1, 2).view` works or fails depending on the query's layout: the
    linter flags it either way, and reshape works for both."""
    source = """
        import torch
        import torch.nn.functional as F

        def attend(q, k, v, B, N, H, D):
            q = q.view(B, H, N, D)
            out = F.scaled_dot_product_attention(q, k, v)
            return out.transpose(1, 2).view(B, N, H * D)
        """
    before, after = _fix(tmp_path, source)
    B, N, H, D = 2, 5, 3, 4
    torch.manual_seed(0)
    q = torch.randn(B * H, N, D)
    with pytest.raises(RuntimeError) as exc:
        _run(before)["attend"](q, q.view(B, H, N, D), q.view(B, H, N, D), B, N, H, D)
    assert _entry_matches("view-stride", str(exc.value))
    got = _run(after)["attend"](q, q.view(B, H, N, D), q.view(B, H, N, D), B, N, H, D)
    ref = torch.nn.functional.scaled_dot_product_attention(*(q.view(B, H, N, D),) * 3)
    assert torch.allclose(got, ref.transpose(1, 2).reshape(B, N, H * D))


def test_parameter_reassign(tmp_path):
    before, after = _fix(tmp_path, """
        import torch
        import torch.nn as nn

        class World(nn.Module):
            def __init__(self):
                super().__init__()
                self.token = nn.Parameter(torch.arange(4.0))

            def convert(self, dtype):
                self.token = self.token.to(dtype)
                return self

        class Offsets(nn.Module):
            def __init__(self):
                super().__init__()
                self.offset = nn.Parameter(torch.ones(3)).to(torch.float64)
        """)
    scope = _run(before)
    with pytest.raises(TypeError) as exc:
        scope["World"]().convert(torch.float64)
    assert _entry_matches("parameter-reassign", str(exc.value))
    assert not list(scope["Offsets"]().parameters())  # silently unregistered
    scope = _run(after)
    w = scope["World"]().convert(torch.float64)
    assert isinstance(w.token, torch.nn.Parameter) and w.token.dtype == torch.float64
    assert torch.equal(w.token.detach(), torch.arange(4.0, dtype=torch.float64))
    offsets = scope["Offsets"]()
    assert [p.dtype for p in offsets.parameters()] == [torch.float64]


def test_sdp_kernel(tmp_path):
    before, after = _fix(tmp_path, """
        import torch
        import torch.nn.functional as F

        def attend(q):
            with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False):
                return F.scaled_dot_product_attention(q, q, q)
        """)
    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = _run(before)["attend"](q)
    assert any(issubclass(w.category, FutureWarning) and "sdp_kernel" in str(w.message) for w in caught)
    assert "from torch.nn.attention import SDPBackend, sdpa_kernel" in after
    assert "sdpa_kernel([SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION])" in after
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = _run(after)["attend"](q)
    assert not [w for w in caught if "sdp_kernel" in str(w.message)]
    assert torch.equal(old, new)


def test_shape_tensors_become_ints(tmp_path):
    before, after = _fix(tmp_path, """
        import torch

        def tokens(latents):
            grid_sizes = torch.stack([torch.tensor(u.shape[1:], dtype=torch.long) for u in latents])
            N_t, N_h, N_w = grid_sizes[0]
            return N_t * N_h * N_w
        """, "--unsafe-fixes")
    latents = [torch.zeros(4, 3, 5, 7)]
    old = _run(before)["tokens"](latents)
    new = _run(after)["tokens"](latents)
    assert isinstance(old, torch.Tensor) and type(new) is int and int(old) == new == 105
