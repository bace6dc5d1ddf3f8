"""GPU002 (sdp-kernel-deprecated) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu002_sdp_kernel_deprecated.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

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
