"""GPU004 on size tables held as device tensors, on code written for these tests: a table built from
a list of (h, w) tuples on the activations' device, handed to a submodule's forward and on to a
staticmethod, returned in a tuple by a submodule and used as view sizes and split sizes; a page
count computed element by element from sequence lengths on the device; and, the other way, a table
left on the CPU whose elements are used directly as sizes (no kernel, no sync: quiet)."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

LEVELS = """import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    @staticmethod
    def reference_points(spatial_shapes, device):
        points = []
        for lvl, (H_, W_) in enumerate(spatial_shapes):  # <- rows of the device table, unpacked
            ys = torch.linspace(0.5, H_ - 0.5, H_, device=device)
            points.append(ys / H_)
        return torch.cat(points)

    def forward(self, src, spatial_shapes, level_start_index):
        ref = self.reference_points(spatial_shapes, device=src.device)
        return self.proj(src) + ref.mean()


class EncoderOnly(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.encoder = Encoder(dim)

    def forward(self, srcs):
        flat = []
        spatial_shapes = []
        for src in srcs:
            bs, c, h, w = src.shape
            spatial_shape = (h, w)
            spatial_shapes.append(spatial_shape)
            flat.append(src.flatten(2).transpose(1, 2))
        flat = torch.cat(flat, 1)
        spatial_shapes = torch.as_tensor(spatial_shapes, dtype=torch.long, device=flat.device)
        level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
        memory = self.encoder(flat, spatial_shapes, level_start_index)
        return memory, spatial_shapes, level_start_index


class PixelDecoder(nn.Module):
    def __init__(self, dim, levels):
        super().__init__()
        self.levels = levels
        self.transformer = EncoderOnly(dim)

    def forward(self, srcs):
        y, spatial_shapes, level_start_index = self.transformer(srcs)
        bs = y.shape[0]
        sections = [None] * self.levels
        for i in range(self.levels):
            if i < self.levels - 1:
                sections[i] = level_start_index[i + 1] - level_start_index[i]  # <- offsets subtracted
            else:
                sections[i] = y.shape[1] - level_start_index[i]
        parts = torch.split(y, sections, dim=1)
        out = []
        for i, z in enumerate(parts):
            out.append(z.transpose(1, 2).reshape(bs, -1, spatial_shapes[i][0], 4))  # <- a row as view sizes
        return out
"""

PAGES = """import torch


class PagedCache:
    def __init__(self, batch, page, device):
        self.batch, self.page, self.device, self.length = batch, page, device, 0

    def pages_for(self, length):
        return (length + self.page - 1) // self.page

    def specs(self, mask):
        if mask is not None:
            lengths = mask.sum(dim=-1, dtype=torch.int32)
        else:
            lengths = torch.tensor([self.length], dtype=torch.int32, device=self.device).expand(self.batch)
        pages = self.pages_for(lengths)
        if (pages[0] != pages).any():
            raise NotImplementedError("ragged pages")
        pages = pages[0]  # <- a 0-d device tensor, then an arange length and a factor
        last = lengths % self.page
        return {
            "indptr": torch.arange(0, self.batch + 1, device=self.device, dtype=torch.int) * pages,
            "indices": torch.arange(pages, device=self.device, dtype=torch.int),
            "last": last,
        }
"""

CPU_TABLE = """import torch


def embed_time(embed, x):
    grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
    out = embed.repeat(1, 1, grid_sizes[0][1], grid_sizes[0][2], 1)  # CPU elements as sizes: quiet
    tokens = grid_sizes[0][1] * grid_sizes[0][2]  # <- arithmetic still makes tensors
    on_gpu = grid_sizes.cuda()
    again = embed.repeat(1, 1, on_gpu[0][1], 1, 1)  # <- the same table on the device
    return out, tokens, again
"""


def test_a_level_table_through_submodules_returns_and_branches(tmp_path):
    """The table made on the device in EncoderOnly.forward reaches Encoder.forward (a submodule
    built in __init__) and its staticmethod; the tuple EncoderOnly.forward returns brings it back
    to PixelDecoder.forward, where the offsets taken in both branches of an if are one finding
    and a row's elements used as view sizes another. The offsets kept as a tensor (cat of
    new_zeros and the cumsum) and the prod/cumsum over the whole table are not findings."""
    result = lint_source(tmp_path, LEVELS, select=["GPU004"])
    assert sorted(set(lines(result, "GPU004"))) == marked_lines(LEVELS)
    staticmethod_site = next(f for f in result.findings if f.line == marked_lines(LEVELS)[0])
    assert "handed on by forward()" in staticmethod_site.message


def test_page_counts_computed_from_device_lengths(tmp_path):
    """Lengths from a mask's sum with an integer dtype, or a device tensor expanded to the batch:
    the page count a method computes from them element by element is sizes still; its first
    element is a 0-d device tensor used as a factor and as arange's length (one finding, at the
    element). The comparison and the remainder kept as a tensor are not findings."""
    result = lint_source(tmp_path, PAGES, select=["GPU004"])
    assert lines(result, "GPU004") == marked_lines(PAGES)


def test_cpu_tables_fire_only_where_they_make_tensors(tmp_path):
    result = lint_source(tmp_path, CPU_TABLE, select=["GPU004"])
    assert sorted(set(lines(result, "GPU004"))) == marked_lines(CPU_TABLE)
