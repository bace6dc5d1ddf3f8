"""Scenarios shared by the level tests: the sdpa-backends probe on the CPU, and on the simulated
CUDA device of tests/cudasim.py with SDPA choosing cuDNN attention for fp16/bf16 as torch 2.11
does on an H100 (docs/validation/h100-torch2.11.0.json), which is where the quick level cuts cells.

`cells(outcome)` is a matrix as comparable lines: "BACKEND dtype/case status"."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.nn.attention import SDPBackend

REAL_CHOICE = torch._fused_sdp_choice


def h100_choice(q: Any, k: Any, v: Any, mask: Any = None, *args: Any, **kwargs: Any) -> int:
    """SDPA's choice as torch 2.11 makes it on sm_90: cuDNN for fp16/bf16 with a contiguous last
    dimension, the CPU's own choice otherwise (math for strided inputs, as on the H100)."""
    if q.dtype in (torch.float16, torch.bfloat16) and q.stride(-1) == 1:
        return int(SDPBackend.CUDNN_ATTENTION.value)
    return int(REAL_CHOICE(q, k, v, mask, *args, **kwargs))


@contextlib.contextmanager
def h100_like(monkeypatch: Any) -> Iterator[tuple[Any, Any]]:
    import cudasim

    with cudasim.simulated() as (sim_torch, state):
        monkeypatch.setattr(torch, "_fused_sdp_choice", h100_choice)
        yield sim_torch, state


def cells(outcome: Any) -> list[str]:
    details = outcome.details
    lines = [f"{backend} {key} {text.split('(', 1)[0]}"
             for backend, row in details["matrix"].items() for key, text in row.items()]
    lines += [f"DEFAULT {key} {text.split(': ', 1)[1].split('(', 1)[0]}"
              for key, text in details["default_path"].items()]
    return lines
