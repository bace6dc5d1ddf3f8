"""GPU011 (module-after-cast) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu011_module_after_cast.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

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
