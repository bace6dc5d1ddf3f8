"""The Python rules of `gpudoctor lint` together on our own snippets. Each rule's own tests are in
tests/test_lint_gpuNNN_<name>.py, beside its module doctor/lint/rules/gpuNNN_<name>.py."""
from __future__ import annotations

import pytest

from lint_helpers import lint_source


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


def test_view_of_a_transposed_parameter_really_fails(tmp_path):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError) as exc:
        x.transpose(1, 2).view(x.size(0), -1)
    from gpudoctor.knowledge import kb

    entry = kb.load_entry("view-stride")
    assert any(p.regex.search(str(exc.value)) for p in entry.patterns if p.role == "anchor")
    assert torch.equal(x.transpose(1, 2).reshape(x.size(0), -1), x.transpose(1, 2).contiguous().view(2, -1))
