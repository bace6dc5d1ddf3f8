"""GPU007 (xformers-attention) on our own snippets: it fires on the marked lines (`# <-`)
and on nothing else, and its near misses stay silent. The rule lives in
doctor/lint/rules/gpu007_xformers_attention.py."""
from __future__ import annotations

from lint_helpers import lines, lint_source, marked_lines

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
