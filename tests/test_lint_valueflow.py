"""GPU004's value flow (issue 33): sizes held as tensors followed where real code carries them.
Each fixture is our own code in the shape of the public projects the issue names: MultiTalk /
InfiniteTalk's four `shape=grid_sizes[0]` sites across modules (a dict of keyword arguments
handed to every block of a ModuleList, a submodule's class, `super()`, `super(Cls, self)` in a
function bound with types.MethodType, a helper of another module), and a close relative's
lists of size tensors, per-sample unpacking, attributes of self and reductions. The near misses
sit beside them."""
from __future__ import annotations

from lint_helpers import lines, lint_source, lint_tree, marked_lines


def found(result, code="GPU004", root=None):
    """(path relative to the linted folder, line) of each finding of `code`."""
    def rel(path):
        path = path.replace("\\", "/")
        return path.split(str(root).replace("\\", "/") + "/", 1)[-1] if root else path.rsplit("/", 1)[-1]
    return sorted((rel(f.path), f.line) for f in result.findings if f.code == code)


# --- MultiTalk's structure: four sites, three modules away from where the tensor is made ----------

TALK = {
    "talk/__init__.py": "",
    "talk/pipeline.py": """
        import types

        import torch

        from .modules.model import TalkModel


        class TalkPipeline:
            def __init__(self, ckpt, use_sp=False):
                self.model = TalkModel.load(ckpt)
                if use_sp:
                    from .distributed.sp import sp_audio_forward, sp_model_forward, sp_self_attn_forward

                    for block in self.model.blocks:
                        block.self_attn.forward = types.MethodType(sp_self_attn_forward, block.self_attn)
                        block.audio_attn.forward = types.MethodType(sp_audio_forward, block.audio_attn)
                    self.model.forward = types.MethodType(sp_model_forward, self.model)

            def generate(self, latents, audio):
                return self.model(latents, audio)
        """,
    "talk/modules/__init__.py": "",
    "talk/modules/model.py": """
        import torch
        import torch.nn as nn

        from .block import TalkBlock


        class TalkModel(nn.Module):
            def __init__(self, dim=64, layers=2):
                super().__init__()
                self.embed = nn.Conv3d(16, dim, kernel_size=(1, 2, 2), stride=(1, 2, 2))
                self.blocks = nn.ModuleList([TalkBlock(dim) for _ in range(layers)])

            def forward(self, latents, audio):
                x = [self.embed(u.unsqueeze(0)) for u in latents]
                grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
                x = torch.cat([u.flatten(2).transpose(1, 2) for u in x])
                kwargs = dict(audio=audio, grid_sizes=grid_sizes)
                for block in self.blocks:
                    x = block(x, **kwargs)
                return x
        """,
    "talk/modules/block.py": """
        import torch.nn as nn

        from ..utils.maps import token_map
        from .audio import MultiAudioAttention


        class SelfAttention(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.qkv = nn.Linear(dim, 3 * dim)

            def forward(self, x, grid_sizes):
                q, k, v = self.qkv(x).chunk(3, dim=-1)
                ref = token_map(q, k, grid_sizes[0])
                return v, ref


        class TalkBlock(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.self_attn = SelfAttention(dim)
                self.audio_attn = MultiAudioAttention(dim)

            def forward(self, x, audio, grid_sizes):
                y, ref = self.self_attn(x, grid_sizes)
                return x + y + self.audio_attn(x, audio, shape=grid_sizes[0], ref=ref)
        """,
    "talk/modules/audio.py": """
        import torch.nn as nn


        class AudioAttention(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def forward(self, x, audio, shape=None, ref=None):
                frames, height, width = shape  # <- site 1
                tokens = int(frames * height * width)
                return self.proj(x[:, :tokens])


        class MultiAudioAttention(AudioAttention):
            def forward(self, x, audio, shape=None, ref=None, speakers=1):
                if speakers == 1:
                    return super().forward(x, audio, shape, ref)
                frames, _, _ = shape  # <- site 2
                per_frame = [x.shape[1] // 4] * frames
                return x.repeat(1, len(per_frame), 1)
        """,
    "talk/utils/__init__.py": "",
    "talk/utils/maps.py": """
        import torch


        def token_map(q, k, shape, split=2):
            frames, height, width = shape  # <- site 3
            per_frame = height * width
            return (q[:, :per_frame] @ k[:, :per_frame].transpose(-1, -2)).mean(-1)


        def frame_split(total_frames, per_frame, world, rank):
            tokens = total_frames * per_frame
            return tokens // world, rank
        """,
    "talk/distributed/__init__.py": "",
    "talk/distributed/sp.py": """
        import torch

        from ..modules.audio import MultiAudioAttention
        from ..utils.maps import frame_split, token_map


        def sp_model_forward(self, latents, audio):
            x = [self.embed(u.unsqueeze(0)) for u in latents]
            grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
            x = torch.cat([u.flatten(2).transpose(1, 2) for u in x])
            for block in self.blocks:
                x = block(x, audio=audio, grid_sizes=grid_sizes)
            return x


        def sp_self_attn_forward(self, x, grid_sizes):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return v, token_map(q, k, grid_sizes[0])


        def sp_audio_forward(self, x, audio, shape=None, ref=None, speakers=1):
            frames, height, width = shape  # <- site 4
            count, rank = frame_split(frames, height * width, 2, 0)
            if speakers == 1:
                return super(MultiAudioAttention, self).forward(x, audio, shape, ref)
            return x[:, :count]
        """,
}


def _expected(files):
    return sorted((path, n) for path, text in files.items() for n in marked_lines(text))


def test_all_four_sites_across_modules(tmp_path):
    result = lint_tree(tmp_path, TALK, select=["GPU004"])
    assert found(result, root=tmp_path) == _expected(TALK)


def test_the_distributed_forward_is_reached_only_through_its_rebinding(tmp_path):
    """sp_audio_forward is never called by name: the pipeline binds it in place of each block's
    audio_attn.forward with types.MethodType, under `if use_sp:`, importing it there."""
    files = dict(TALK)
    files["talk/pipeline.py"] = files["talk/pipeline.py"].replace(
        "block.audio_attn.forward = types.MethodType(sp_audio_forward, block.audio_attn)", "pass")
    result = lint_tree(tmp_path, files, select=["GPU004"])
    assert found(result, root=tmp_path) == [p for p in _expected(TALK) if not p[0].endswith("sp.py")]


def test_the_finding_names_the_chain_of_callers(tmp_path):
    result = lint_tree(tmp_path, TALK, select=["GPU004"])
    by_place = {(f.path.replace("\\", "/").split("/talk/", 1)[-1], f.line): f.message for f in result.findings}
    sp = by_place[("distributed/sp.py", 22)]
    assert "`grid_sizes[0]` handed on by forward() at " in sp and "block.py:26" in sp
    # the first caller that makes the tensor, in path order: the sequence-parallel model forward
    assert "`grid_sizes`, a tensor of sizes, at " in sp and "distributed/sp.py:12" in sp
    audio = by_place[("modules/audio.py", 10)]
    assert "`shape` handed on by forward() at " in audio and "audio.py:18" in audio


def test_sizes_converted_before_they_travel_are_quiet(tmp_path):
    files = dict(TALK)
    files["talk/modules/model.py"] = files["talk/modules/model.py"].replace(
        "kwargs = dict(audio=audio, grid_sizes=grid_sizes)", "kwargs = dict(audio=audio, grid_sizes=grid_sizes.tolist())")
    files["talk/distributed/sp.py"] = files["talk/distributed/sp.py"].replace(
        "x = block(x, audio=audio, grid_sizes=grid_sizes)", "x = block(x, audio=audio, grid_sizes=grid_sizes.tolist())")
    assert found(lint_tree(tmp_path, files, select=["GPU004"])) == []


# --- a close relative: lists, per-sample unpacking, attributes of self, reductions ----------------

RELATIVE = """import torch
import torch.nn as nn


class Patcher(nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.grid = torch.tensor([list(s) for s in shapes], dtype=torch.long, device="cuda")
        self.register_buffer("lens", torch.tensor([s[0] * s[1] * s[2] for s in shapes], dtype=torch.long))

    def forward(self, x):
        f, h, w = self.grid[0]  # <- stored on self in __init__
        n = self.lens.max()  # <- reduced, used as a size
        out = x.new_zeros(x.shape[0], n, x.shape[-1])
        return out.view(f * h * w, -1)


def patchify(videos):
    sizes = [torch.tensor(v.shape[1:], dtype=torch.long) for v in videos]
    tokens = []
    for i in range(len(sizes)):
        f, h, w = sizes[i]  # <- per sample
        tokens.append(f * h * w)
    rows = []
    for v in videos:
        rows.append(torch.tensor(v.shape[1:], dtype=torch.long))
    for f, h, w in rows:  # <- loop over a list filled in a loop
        print(f * h)
    seq_lens = torch.tensor([v.size(1) for v in videos], dtype=torch.long, device=videos[0].device)
    max_len = seq_lens.max()  # <-
    padded = torch.zeros(len(videos), max_len, 16)
    total = seq_lens.sum()  # <-
    flat = torch.empty(total, 16)
    cpu_lens = torch.tensor([v.size(1) for v in videos], dtype=torch.long)
    on_cpu = torch.zeros(cpu_lens.max(), 16)  # a CPU element as a size: __index__, no kernel, no sync
    return padded, flat, tokens, on_cpu


def fine(videos, seq_len):
    seq_lens = torch.tensor([v.size(1) for v in videos], dtype=torch.long)
    assert seq_lens.max() <= seq_len
    max_len = seq_lens.max().item()
    n = int(seq_lens.sum())
    sizes = [torch.tensor(v.shape[1:], dtype=torch.long).tolist() for v in videos]
    for f, h, w in sizes:
        print(f * h * w)
    ids = torch.tensor([len(v) for v in videos], dtype=torch.long)
    return torch.zeros(max_len, n)
"""


def test_lists_loops_attributes_and_reductions(tmp_path):
    result = lint_source(tmp_path, RELATIVE, select=["GPU004"])
    assert lines(result, "GPU004") == marked_lines(RELATIVE)
    by_line = {f.line: f for f in result.findings}
    reduced = by_line[marked_lines(RELATIVE)[-1]]
    assert "`seq_lens.sum()` reduces a tensor of sizes to a 0-d tensor" in reduced.message
    assert reduced.fix.applicability == "unsafe" and reduced.fix.edits[0].text == ".item()"


# --- what the project's functions return, followed into their callers ---------------------------

RETURNS = {
    "vid/__init__.py": "",
    "vid/patch.py": """
        import torch


        def patch_grid(latents):
            return torch.stack([torch.tensor(u.shape[1:], dtype=torch.long) for u in latents])


        def token_lengths(latents):
            return torch.tensor([u.size(1) for u in latents], dtype=torch.long).cuda()


        def as_ints(latents):
            return [list(u.shape[1:]) for u in latents]
        """,
    "vid/model.py": """
        import torch

        from .patch import as_ints, patch_grid, token_lengths


        class Model(torch.nn.Module):
            def forward(self, latents):
                grid = patch_grid(latents)
                f, h, w = grid[0]  # <-
                lens = token_lengths(latents)
                longest = lens.max()  # <-
                out = torch.zeros(len(latents), longest, 8)
                for f2, h2, w2 in as_ints(latents):
                    out = out[:, : f2 * h2 * w2]
                return out.view(f * h * w, -1)
        """,
}


def test_sizes_returned_by_another_module_are_followed_into_the_caller(tmp_path):
    result = lint_tree(tmp_path, RETURNS, select=["GPU004"])
    assert found(result, root=tmp_path) == _expected(RETURNS)
    grid = next(f for f in result.findings if f.line == marked_lines(RETURNS["vid/model.py"])[0])
    assert "what patch_grid() returns, a tensor of sizes" in grid.message and "patch.py" in grid.message


# --- GPU001: a helper of the file that biases the scores and returns them -------------------------

BIASED = """
import torch


def add_rel_bias(attn, q, table, size):
    h, w = size
    attn = attn.view(q.shape[0], h * w, h * w) + table[None]
    return attn


def masked(scores, mask):
    scores = scores.masked_fill(mask, float("-inf"))
    return scores


class Block(torch.nn.Module):
    def forward(self, q, k, v, table, size, mask=None):
        attn = (q * self.scale) @ k.transpose(-2, -1)  # <-
        if self.use_rel_pos:
            attn = add_rel_bias(attn, q, table, size)
        if mask is not None:
            attn = masked(attn, mask)
        attn = attn.softmax(dim=-1)
        return attn @ v

    def pooled(self, q, k, table, size):
        attn = q @ k.transpose(-2, -1)
        attn = add_rel_bias(attn, q, table, size)
        return attn.softmax(dim=-1).mean(1)   # a map, never multiplied with values
"""


def test_scores_through_a_helper_that_biases_them(tmp_path):
    result = lint_source(tmp_path, BIASED, select=["GPU001"])
    assert lines(result, "GPU001") == marked_lines(BIASED)


KEPT = """
import torch
from einops import rearrange


def bounded(q, k, v):
    scores = torch.bmm(q, k.transpose(1, 2))  # <-
    scores = torch.clamp(scores - scores.max(), min=-50000, max=50000)
    return torch.bmm(scores.softmax(dim=-1), v)


def permuted(q, k, v):
    w = torch.einsum("bij,bjk->bik", q, k)  # <-
    w = torch.nn.functional.softmax(w, dim=2)
    w = rearrange(w, "b i j -> b j i")
    return torch.einsum("bij,bjk->bik", v, w)


def clamped_map(q, k):
    scores = torch.clamp(torch.bmm(q, k.transpose(1, 2)), max=50.0)
    return scores.softmax(dim=-1).sum(1)      # a map: no product with values
"""


def test_scores_kept_through_torch_elementwise_functions_and_rearrange(tmp_path):
    result = lint_source(tmp_path, KEPT, select=["GPU001"])
    assert lines(result, "GPU001") == marked_lines(KEPT)
