"""GPU011's value flow (issue 33): objects cast to a lower precision followed through names,
attributes of self and the project's functions, and modules added to them by any means. The
fixtures are our own code: the script a new user tries, the forms PyTorch offers for adding a
module, and DiffSynth's Fantasy World structure across modules (a pipeline loaded in bf16 in one
module, a mode of the DiT that builds float32 adapters, heads, Parameters and a ModuleList of
blocks in another, called later from a third)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lint_helpers import lines, lint_source, lint_tree, marked_lines

NEW_USER = """
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
model = model.to(torch.bfloat16)
model.append(nn.Linear(32, 8))  # <-
x = torch.randn(4, 16, dtype=torch.bfloat16)
print(model(x).shape)
"""


def test_the_script_a_new_user_tries(tmp_path):
    result = lint_source(tmp_path, NEW_USER, select=["GPU011"])
    assert lines(result, "GPU011") == marked_lines(NEW_USER)
    f = result.findings[0]
    assert f.kb_id == "dtype-mismatch" and "model.append(...)" in f.message and "line 5" in f.message


def test_the_script_really_fails_as_the_finding_says(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "try_bf16.py"
    script.write_text(textwrap.dedent(NEW_USER).lstrip("\n"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "mat1 and mat2 must have the same dtype" in run.stderr
    fixed = script.read_text().replace("model.append(nn.Linear(32, 8))", "model.append(nn.Linear(32, 8).to(torch.bfloat16))")
    script.write_text(fixed)
    assert lint_source(tmp_path, fixed, select=["GPU011"]).findings == []
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


ANY_MEANS = """
import torch
import torch.nn as nn


def grow(model, blocks, heads):
    model.half()
    model.head = nn.Linear(8, 8)  # <-
    model[3] = nn.Linear(8, 8)  # <-
    model.append(nn.Conv2d(8, 8, 3))  # <-
    model.insert(0, nn.LayerNorm(8))  # <-
    model.extend([nn.ReLU(), nn.Linear(8, 8)])  # <-
    model.add_module("proj", nn.Linear(8, 8))  # <-
    model.register_module("gate", nn.Linear(8, 1))  # <-
    model.register_parameter("scale", nn.Parameter(torch.ones(8)))  # <-
    setattr(model, "extra", nn.Linear(8, 8))  # <-
    heads = heads.bfloat16()
    heads.update({"depth": nn.Linear(8, 1)})  # <-
    return model


class Trainer:
    def __init__(self, net):
        self.net = net.to(dtype=torch.bfloat16)

    def add_head(self):
        self.net.blocks["cls"] = nn.Linear(8, 2)  # <-


def near_misses(model, blocks):
    model.half()
    model.append(nn.ReLU())                                 # no weights
    model.add_module("proj", nn.Linear(8, 8, dtype=torch.float16))
    model.register_buffer("mask", torch.ones(8))            # a buffer, not a module
    model.extend([nn.Linear(8, 8)])
    model.to(torch.float16)                                 # converted afterwards
    blocks.append(nn.Linear(8, 8))                          # blocks was never cast
    model = build()                                         # a new object: no longer the cast one
    model.append(nn.Linear(8, 8))
    return model


def added_before_the_cast(model):
    model.append(nn.Linear(8, 8))
    model[0] = nn.Linear(8, 8)
    return model.bfloat16()


def cast_back_to_float(model):
    model = model.half()
    model = model.float()
    model.append(nn.Linear(8, 8))
"""


def test_modules_added_to_a_cast_model_by_any_means(tmp_path):
    result = lint_source(tmp_path, ANY_MEANS, select=["GPU011"])
    assert lines(result, "GPU011") == marked_lines(ANY_MEANS)


def test_each_form_really_fails(tmp_path):
    """What the finding claims, run: a module added after the cast keeps float32 weights."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    for add in (lambda m: m.append(nn.Linear(8, 8)), lambda m: m.add_module("p", nn.Linear(8, 8)),
                lambda m: setattr(m, "p", nn.Linear(8, 8)), lambda m: m.insert(0, nn.Linear(8, 8)),
                lambda m: m.register_module("p", nn.Linear(8, 8))):
        model = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
        add(model)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    model = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
    model.register_parameter("scale", nn.Parameter(torch.ones(8)))
    assert model.scale.dtype == torch.float32


# --- DiffSynth's Fantasy World, in outline: four modules, the late mode called from three places -----

STUDIO = {
    "studio/__init__.py": "",
    "studio/models/__init__.py": "",
    "studio/models/dit.py": """
        import torch
        import torch.nn as nn


        class DiTBlock(nn.Module):
            def __init__(self, dim, heads):
                super().__init__()
                self.heads = heads
                self.attn = nn.Linear(dim, 3 * dim)
                self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
                self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

            def forward(self, x, t_mod):
                shift, scale = (self.modulation.to(dtype=t_mod.dtype, device=t_mod.device) + t_mod).chunk(2, dim=1)
                return self.ffn(self.attn(x)[..., : x.shape[-1]] * (1 + scale) + shift)


        class GeoBlock(DiTBlock):
            def __init__(self, original, dim):
                super().__init__(dim, original.heads)
                self.load_state_dict(original.state_dict())
                self.adapter = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim))


        class DiT(nn.Module):
            def __init__(self, dim=64, layers=4):
                super().__init__()
                self.dim = dim
                self.blocks = nn.ModuleList([DiTBlock(dim, 4) for _ in range(layers)])

            def enable_world_mode(self, split=2):
                from .heads import CameraHead, DepthHead

                self.world = True
                self.pose_enc = nn.Linear(9, self.dim)  # <-
                self.token_camera = nn.Parameter(torch.randn(1, 1, self.dim) * 0.02)  # <-
                self.register_parameter("tokens_register", nn.Parameter(torch.randn(1, 4, self.dim)))  # <-
                self.head_camera = CameraHead(self.dim)  # <-
                self.head_depth = DepthHead(self.dim)
                self.camera_adapters = nn.ModuleList([nn.Linear(self.dim, self.dim) for _ in range(split)])  # <-
                self.geo_blocks = nn.ModuleList([GeoBlock(self.blocks[i], self.dim) for i in range(split, len(self.blocks))])  # <-
                self._build_fusion(split)
                for p in self.blocks.parameters():
                    p.requires_grad = False

            def _build_fusion(self, split):
                self.fusion = nn.ModuleList()
                for _ in range(split):
                    self.fusion.append(nn.Linear(2 * self.dim, self.dim))  # <-
        """,
    "studio/models/heads.py": """
        import torch.nn as nn


        class CameraHead(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, 9))

            def forward(self, tokens):
                return self.mlp(tokens)


        class DepthHead(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Conv2d(dim, 1, 1)

            def forward(self, x):
                return self.proj(x.to(self.proj.weight.dtype))
        """,
    "studio/core/__init__.py": "",
    "studio/core/loader.py": """
        import torch


        def load_model(model_class, path, torch_dtype=torch.bfloat16, device="cpu"):
            model = model_class()
            model.load_state_dict(torch.load(path), assign=True)
            model = model.to(dtype=torch_dtype, device=device)
            return model.eval()
        """,
    "studio/pipelines/__init__.py": "",
    "studio/pipelines/video.py": """
        import torch

        from ..core.loader import load_model
        from ..models.dit import DiT


        class VideoPipeline:
            def __init__(self, device="cuda", torch_dtype=torch.bfloat16):
                self.device, self.torch_dtype, self.dit = device, torch_dtype, None

            @staticmethod
            def from_pretrained(torch_dtype=torch.bfloat16, device="cuda", paths=()):
                pipe = VideoPipeline(device=device, torch_dtype=torch_dtype)
                for path in paths:
                    pipe.dit = load_model(DiT, path, torch_dtype=torch_dtype, device=device)
                return pipe
        """,
    "examples/train.py": """
        import torch

        from studio.pipelines.video import VideoPipeline


        class TrainingModule(torch.nn.Module):
            def __init__(self, paths, task="world:stage1"):
                super().__init__()
                self.pipe = VideoPipeline.from_pretrained(torch_dtype=torch.bfloat16, paths=paths)
                self.pipe = self.split_units(task, self.pipe)
                self.task = task

            def split_units(self, task, pipe):
                return pipe

            def setup(self):
                if self.task.startswith("world"):
                    self.pipe.dit.enable_world_mode(split=2)
        """,
}


def _found(result, root):
    return sorted((f.path.replace("\\", "/").split(str(root).replace("\\", "/") + "/", 1)[-1], f.line)
                  for f in result.findings if f.code == "GPU011")


def _expected():
    return sorted(("studio/models/dit.py", n) for n in marked_lines(STUDIO["studio/models/dit.py"]))


def test_late_modules_of_a_mode_called_after_the_pipeline_cast(tmp_path):
    """Adapters, heads, Parameters (one registered), a ModuleList of blocks (GeoBlock: its base
    casts one parameter to the input, not the input to its weights) and modules a helper adds:
    reported at each creation; a head that casts its input to its weights is not."""
    result = lint_tree(tmp_path, STUDIO, select=["GPU011"])
    assert _found(result, tmp_path) == _expected()
    first = next(f for f in result.findings if f.line == marked_lines(STUDIO["studio/models/dit.py"])[0])
    assert "self.pipe.dit.enable_world_mode() is called at " in first.message and "examples/train.py:18" in first.message
    assert "stored on self by __init__()" in first.message


def test_the_cast_reaches_the_mode_through_a_parameter_in_another_module(tmp_path):
    files = {k: v for k, v in STUDIO.items() if k != "examples/train.py"}
    files["examples/ckpt.py"] = """
        def load_world_checkpoint(pipe, path, stage="stage1"):
            pipe.dit.enable_world_mode(split=2)
            return pipe.dit.load_state_dict(path, strict=False)
        """
    files["examples/infer.py"] = """
        import torch

        from ckpt import load_world_checkpoint
        from studio.pipelines.video import VideoPipeline


        def main(paths, ckpt):
            pipe = VideoPipeline.from_pretrained(torch_dtype=torch.bfloat16, paths=paths)
            load_world_checkpoint(pipe, ckpt)
        """
    result = lint_tree(tmp_path, files, select=["GPU011"])
    assert _found(result, tmp_path) == _expected()
    assert "passed as pipe by " in result.findings[0].message and "infer.py:9" in result.findings[0].message


def test_the_cast_reaches_the_mode_through_a_return_value(tmp_path):
    files = {k: v for k, v in STUDIO.items() if k != "examples/train.py"}
    files["examples/build.py"] = """
        import torch

        from studio.pipelines.video import VideoPipeline


        def build_pipe(paths, dtype=torch.bfloat16):
            return VideoPipeline.from_pretrained(torch_dtype=dtype, paths=paths)
        """
    files["examples/run.py"] = """
        from build import build_pipe


        def main(paths):
            pipe = build_pipe(paths)
            pipe.dit.enable_world_mode()
        """
    result = lint_tree(tmp_path, files, select=["GPU011"])
    assert _found(result, tmp_path) == _expected()
    assert "returned by build_pipe()" in result.findings[0].message


def test_no_cast_anywhere_no_finding(tmp_path):
    files = dict(STUDIO)
    files["examples/train.py"] = files["examples/train.py"].replace("torch_dtype=torch.bfloat16, ", "")
    assert _found(lint_tree(tmp_path, files, select=["GPU011"]), tmp_path) == []


def test_the_fixed_mode_converts_everything_it_built(tmp_path):
    """The fix the field note applied: convert each new module at the end of the mode, the
    ModuleLists item by item, the Parameters through .data."""
    fixed = STUDIO["studio/models/dit.py"].replace("""                for p in self.blocks.parameters():
                    p.requires_grad = False
""", """                for p in self.blocks.parameters():
                    p.requires_grad = False
                ref = next(self.blocks[0].parameters())
                self.pose_enc = self.pose_enc.to(dtype=ref.dtype, device=ref.device)
                self.token_camera.data = self.token_camera.data.to(dtype=ref.dtype, device=ref.device)
                self.tokens_register.data = self.tokens_register.data.to(dtype=ref.dtype)
                self.head_camera = self.head_camera.to(dtype=ref.dtype, device=ref.device)
                self.head_depth.to(dtype=ref.dtype)
                for i, adapter in enumerate(self.camera_adapters):
                    self.camera_adapters[i] = adapter.to(dtype=ref.dtype, device=ref.device)
                for i, block in enumerate(self.geo_blocks):
                    self.geo_blocks[i] = block.to(dtype=ref.dtype, device=ref.device)
                for layer in self.fusion:
                    layer.to(dtype=ref.dtype)
""")
    files = dict(STUDIO, **{"studio/models/dit.py": fixed})
    assert _found(lint_tree(tmp_path, files, select=["GPU011"]), tmp_path) == []
