"""The project pass: values that cross modules. Each test is a small project of our own, in the
shape of the public projects issue 21 names (a helper in one module, its caller in another), with
its near misses beside it."""
from __future__ import annotations

from lint_helpers import lint_tree


def found(result, code):
    return sorted((f.path.rsplit("/", 1)[-1] if "/" in f.path else f.path, f.line)
                  for f in result.findings if f.code == code)


# --- GPU001: scores from a helper, multiplied in another module -------------------------------------

ATTENTION_PROJECT = {
    "vid/__init__.py": "",
    "vid/models/__init__.py": "",
    "vid/models/attention.py": """
        import torch

        class Attention(torch.nn.Module):
            def get_attention_scores(self, query, key, mask=None):
                scores = torch.baddbmm(self.empty(query, key), query, key.transpose(-1, -2), beta=0, alpha=self.scale)
                return scores.softmax(dim=-1)

            def raw_scores(self, query, key):
                return torch.bmm(query, key.transpose(1, 2)) * self.scale

            def pooled(self, x):
                return x.mean(dim=1)
        """,
    "vid/pipelines/__init__.py": "",
    "vid/pipelines/frames.py": """
        import torch

        class FrameProcessor:
            def __call__(self, attn, hidden_states):
                query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
                attention_probs = attn.get_attention_scores(query, key)
                return torch.bmm(attention_probs, value)

        class RawProcessor:
            def __call__(self, attn, q, k, v):
                weights = attn.raw_scores(q, k).softmax(dim=-1)
                return torch.bmm(weights, v)

        class NotAttention:
            def __call__(self, attn, x, v):
                pooled_scores = attn.pooled(x)
                return torch.bmm(pooled_scores, v)

        def chunked(attn, q, k, v, step):
            out = torch.empty_like(q)
            for i in range(0, q.shape[1], step):
                end = i + step
                s = torch.bmm(q[:, i:end], k.transpose(1, 2)).softmax(dim=-1)
                out[:, i:end] = torch.bmm(s, v)
            return out
        """,
}


def test_attention_scores_from_a_helper_in_another_module(tmp_path):
    result = lint_tree(tmp_path, ATTENTION_PROJECT, select=["GPU001"])
    # the helper call in each processor; the helper itself (probabilities only), a helper that
    # returns no scores, and attention over query slices stay silent
    assert found(result, "GPU001") == [("frames.py", 6), ("frames.py", 11)]


def test_a_library_helper_is_known_without_its_source(tmp_path):
    files = {"proc.py": """
        import torch

        class AttnProcessor:
            def __call__(self, attn, hidden_states, mask=None):
                q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
                attention_probs = attn.get_attention_scores(q, k, mask)
                return torch.bmm(attention_probs, v)
        """}
    assert found(lint_tree(tmp_path, files, select=["GPU001"]), "GPU001") == [("proc.py", 6)]


# --- GPU011: modules created late, in a method another module calls after the cast ------------------

LATE_MODULES = {
    "studio/__init__.py": "",
    "studio/models/__init__.py": "",
    "studio/models/extras.py": """
        import torch.nn as nn

        class Bridge(nn.Module):
            def __init__(self, dim):
                super().__init__()
                layer = nn.TransformerEncoderLayer(dim, 8, batch_first=True)
                self.layers = nn.TransformerEncoder(layer, 2)

        class CastingHead(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.fc = nn.Linear(dim, 4)

            def forward(self, x):
                return self.fc(x.to(self.fc.weight.dtype))

        class Marker:
            def __init__(self, dim):
                self.dim = dim
        """,
    "studio/models/dit.py": """
        import torch
        import torch.nn as nn

        from .extras import Bridge, CastingHead, Marker

        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.ffn = nn.Linear(dim, dim)

        class DiT(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.dim = dim
                self.blocks = nn.ModuleList([Block(dim) for _ in range(4)])

            def enable_world_mode(self):
                ref = next(self.blocks.parameters())
                self.bridge = Bridge(self.dim)  # <-
                self.token = nn.Parameter(torch.randn(1, 1, self.dim) * 0.02)  # <-
                self.extra_blocks = nn.ModuleList([Block(self.dim) for _ in range(2)])  # <-
                self.head = CastingHead(self.dim)
                self.marker = Marker(self.dim)
                self.pose = Bridge(self.dim)
                self.adapters = nn.ModuleList([nn.Linear(self.dim, self.dim, dtype=ref.dtype) for _ in range(2)])
                self.fused = nn.ModuleList([Block(self.dim) for _ in range(2)]).to(dtype=ref.dtype)
                self.pose.to(dtype=ref.dtype, device=ref.device)
                self.token.to(dtype=ref.dtype)
        """,
    "studio/train.py": """
        import torch

        from studio.pipeline import Pipeline

        class Trainer:
            def __init__(self):
                self.pipe = Pipeline.from_pretrained("ckpt", torch_dtype=torch.bfloat16)
                self.pipe.dit.enable_world_mode()
        """,
}


def test_modules_created_late_fire_where_they_are_created(tmp_path):
    from lint_helpers import marked_lines

    result = lint_tree(tmp_path, LATE_MODULES, select=["GPU011"])
    expected = [("dit.py", n) for n in marked_lines(LATE_MODULES["studio/models/dit.py"])]
    # a class that casts its inputs, a class without weights, a module converted with .to()
    # later, modules created with dtype= or converted where they are built stay silent; the
    # token's .to() thrown away does not convert it
    assert found(result, "GPU011") == expected
    bridge = result.findings[0]
    assert "self.bridge" in bridge.message and "train.py:8" in bridge.message and "line 7" in bridge.message


def test_modules_created_late_need_the_late_call(tmp_path):
    files = dict(LATE_MODULES)
    files["studio/train.py"] = """
        import torch

        from studio.pipeline import Pipeline

        class Trainer:
            def __init__(self):
                self.pipe = Pipeline.from_pretrained("ckpt")
                self.pipe.dit.enable_world_mode()
                self.pipe.to(torch.bfloat16)
        """
    assert lint_tree(tmp_path, files, select=["GPU011"]).findings == []


# --- GPU004: rows of a tensor of sizes handed to another module --------------------------------------

SHAPES_PROJECT = {
    "talk/__init__.py": "",
    "talk/utils/__init__.py": "",
    "talk/utils/maps.py": """
        import torch

        def attn_map(q, k, shape, masks=None):
            frames, height, width = shape  # <-
            tokens = height * width
            return q[:, :tokens] @ k.transpose(-1, -2)

        def attn_map_fixed(q, k, shape):
            frames, height, width = shape.tolist()
            return q[:, :height * width]
        """,
    "talk/modules/__init__.py": "",
    "talk/modules/audio.py": """
        import torch.nn as nn
        from einops import rearrange

        class AudioAttention(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def forward(self, x, context, shape=None):
                n_t, n_h, n_w = shape  # <-
                x = rearrange(x, "b (t s) c -> (b t) s c", t=n_t)
                return self.proj(x) * (n_h * n_w)

        class MultiAudioAttention(AudioAttention):
            def forward(self, x, context, shape=None, speakers=1):
                if speakers == 1:
                    return super().forward(x, context, shape)
                n_t, _, _ = shape  # <-
                return [x] * n_t
        """,
    "talk/modules/model.py": """
        import torch
        import torch.nn as nn

        from ..utils.maps import attn_map, attn_map_fixed
        from .audio import MultiAudioAttention

        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.audio = MultiAudioAttention(dim)

            def forward(self, x, context, grid_sizes, speakers):
                m = attn_map(x, x, grid_sizes[0])
                m2 = attn_map_fixed(x, x, grid_sizes[0])
                return self.audio(x, context, shape=grid_sizes[0], speakers=speakers) + m + m2

        class Model(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.blocks = nn.ModuleList([Block(dim) for _ in range(2)])

            def forward(self, x, context, speakers):
                grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
                kwargs = dict(context=context, grid_sizes=grid_sizes, speakers=speakers)
                for block in self.blocks:
                    x = block(x, **kwargs)
                return x
        """,
}


def test_a_row_of_sizes_is_followed_into_other_modules(tmp_path):
    from lint_helpers import marked_lines

    result = lint_tree(tmp_path, SHAPES_PROJECT, select=["GPU004"])
    expected = sorted([("maps.py", n) for n in marked_lines(SHAPES_PROJECT["talk/utils/maps.py"])] +
                      [("audio.py", n) for n in marked_lines(SHAPES_PROJECT["talk/modules/audio.py"])])
    # at each binding in the callees (through the import, the submodule's class, and super());
    # not at the call, and not in the callee that converts with .tolist()
    assert found(result, "GPU004") == expected
    by_line = {(f.path.rsplit("/", 1)[-1], f.line): f for f in result.findings}
    assert "`grid_sizes[0]`, a row of a tensor of sizes, at " in by_line[("maps.py", 4)].message
    assert "model.py:13" in by_line[("maps.py", 4)].message
    base = by_line[("audio.py", 10)].message
    assert "handed on by forward()" in base and "model.py:15" in base


def test_a_callee_that_cannot_be_followed_leaves_the_finding_at_the_call(tmp_path):
    files = {"model.py": """
        import torch
        import torch.nn as nn
        from elsewhere import build_audio

        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.audio = build_audio(dim)

            def forward(self, x, context):
                grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
                return self.audio(x, context, shape=grid_sizes[0])
        """}
    assert found(lint_tree(tmp_path, files, select=["GPU004"]), "GPU004") == [("model.py", 12)]


def test_sizes_as_ints_cross_modules_silently(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/maps.py": """
            def attn_map(q, shape):
                frames, height, width = shape
                return q[:, :height * width]
            """,
        "pkg/model.py": """
            import torch
            from .maps import attn_map

            def forward(x):
                grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
                a = attn_map(x, x[0].shape[1:])
                b = attn_map(x, grid_sizes[0].tolist())
                return a, b
            """,
    }
    assert lint_tree(tmp_path, files, select=["GPU004"]).findings == []


def test_the_project_pass_beside_the_cpp_steps_gives_the_same_findings(tmp_path, monkeypatch):
    """On a machine with a core to spare the Python project pass runs in a forked child beside the
    C++ and GPU012 steps: the same findings as run in line; and when the child dies without an
    answer, the pass runs in the parent (nothing is lost)."""
    import os

    from gpudoctor.lint import crossfile, engine

    lint_tree(tmp_path, LATE_MODULES)
    key = lambda findings: sorted((f.path, f.line, f.col, f.code) for f in findings)  # noqa: E731

    def project(beside: bool):
        _, by_path, tasks = engine.lint([str(tmp_path)], isolated=True, jobs=1)
        found, failed = crossfile.cross_file(by_path, tasks, beside=beside)
        return key(found), failed

    beside, in_line = project(True), project(False)
    assert beside == in_line and ("dit.py" in "".join(p for p, *_ in beside[0]))

    parent = os.getpid()
    real = crossfile._python_cross_file

    def dies_in_the_child(*args):
        if os.getpid() != parent:
            os._exit(3)
        return real(*args)

    monkeypatch.setattr(crossfile, "_python_cross_file", dies_in_the_child)
    assert project(True) == in_line
