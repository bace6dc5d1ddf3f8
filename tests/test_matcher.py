"""The matcher's rules (see gpudoctor.explain.matcher's docstring), first on small synthetic entries so
each rule is tested in isolation, then on the real knowledge base."""
from __future__ import annotations

import pytest

from gpudoctor.knowledge import kb
from gpudoctor.explain.matcher import Matcher, match_chunks, match_text
from gpudoctor.knowledge.predicates import parse_size
from kb_helpers import outside_the_knowledge_base

TRAILER = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
)


def _entry(entry_id, patterns, **extra):
    data = {"id": entry_id, "title": entry_id, "cause": "c", "quick_fix": "q", "applicability": "safe", "what": "w", "why": ["a"],
            "fix": ["b"], "patch": "p", "references": [{"url": "https://example.org"}], "examples": [],
            "patterns": patterns, **extra}
    return kb.parse_entry(data, f"{entry_id}.toml")


def _pat(name, keyword, regex, weight, role="anchor", **extra):
    return {"name": name, "keyword": keyword, "regex": regex, "weight": weight, "role": role, **extra}


GENERIC = _entry("trailer", [_pat("t", "asynchronously reported", r"asynchronously reported", 0.9)],
                 generic=True, specificity=5)
SPECIFIC = _entry("specific", [_pat("s", "misaligned", r"CUDA error: misaligned address", 0.95)], specificity=80)
OOM = _entry("plain-oom", [_pat("oom", "out of memory",
                                r"out of memory\. Tried to allocate (?P<requested>[\d.]+ [KMGT]iB).*?"
                                r"total capacity of (?P<capacity>[\d.]+ [KMGT]iB)", 0.9)], specificity=40)
ATTN_OOM = _entry("attn-oom", [
    _pat("oom", "out of memory",
         r"out of memory\. Tried to allocate (?P<requested>[\d.]+ [KMGT]iB)(?:.*?total capacity of (?P<capacity>[\d.]+ [KMGT]iB))?", 0.9),
    _pat("baddbmm", "baddbmm", r"torch\.baddbmm", 0.3, role="support"),
], min_support=1, supersedes=["plain-oom"], specificity=70, facts=["allocation-exceeds-gpu"])


def ranked(entries, text):
    m = Matcher(entries)
    m.feed(text)
    return m.results()


def test_generic_trailer_alone_is_the_answer():
    out = ranked([GENERIC, SPECIFIC], TRAILER)
    assert [m.id for m in out] == ["trailer"]
    assert not out[0].context_only and out[0].confidence >= 0.9


def test_a_trailer_never_outranks_a_primary_error_no_entry_explains():
    """Rule 10: the primary error line decides. Nothing here explains `unspecified launch
    failure`, so the trailer is context and the matcher names the error it could not explain."""
    m = Matcher([GENERIC, SPECIFIC])
    m.feed("RuntimeError: CUDA error: unspecified launch failure\n" + TRAILER)
    out = m.results()
    assert [x.id for x in out] == ["trailer"] and out[0].context_only and out[0].confidence <= 0.25
    assert m.unrecognised is not None
    assert (m.unrecognised.message, m.unrecognised.line) == ("unspecified launch failure", 1)
    # An entry that explains the primary line keeps the trailer as its context, as before.
    m = Matcher([GENERIC, SPECIFIC])
    m.feed("RuntimeError: CUDA error: misaligned address\n" + TRAILER)
    assert [x.id for x in m.results()] == ["specific", "trailer"] and m.unrecognised is None


def test_generic_trailer_beside_a_specific_error_is_only_context():
    out = ranked([GENERIC, SPECIFIC], "RuntimeError: CUDA error: misaligned address\n" + TRAILER)
    assert [m.id for m in out] == ["specific", "trailer"]
    assert out[1].context_only and out[1].confidence <= 0.25


def test_support_patterns_alone_never_match():
    assert ranked([ATTN_OOM], "  File x.py, line 3, in f\n    s = torch.baddbmm(e, q, k)\n") == []


def test_oom_without_attention_evidence_is_the_plain_oom():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 1.2 GiB is free.\n")
    assert [m.id for m in ranked([OOM, ATTN_OOM], text)] == ["plain-oom"]


def test_oom_with_attention_in_the_stack_supersedes_the_plain_oom():
    text = ("    attention_scores = torch.baddbmm(\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 1.2 GiB is free.\n")
    out = ranked([OOM, ATTN_OOM], text)
    assert [m.id for m in out] == ["attn-oom", "plain-oom"]
    assert out[1].context_only and out[1].confidence < out[0].confidence


def test_allocation_larger_than_the_gpu_is_attention_evidence_and_captured():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
            "capacity of 31.36 GiB of which 20.1 GiB is free.\n")
    out = ranked([OOM, ATTN_OOM], text)
    assert out[0].id == "attn-oom"
    assert out[0].captures == {"requested": "112.50 GiB", "capacity": "31.36 GiB"}
    assert any("larger than the whole GPU" in e for e in out[0].evidence)


def test_parse_size_units():
    assert parse_size("112.50 GiB") == int(112.5 * 2**30)
    assert parse_size("20 MiB") == 20 * 2**20
    assert parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("lots") is None


def test_keyword_is_searched_case_insensitively_when_asked():
    entry = _entry("ci", [_pat("x", "no kernel image", r"no kernel image is available", 0.9, ignore_case=True)])
    assert [m.id for m in ranked([entry], "CUDA ERROR: NO KERNEL IMAGE IS AVAILABLE for execution\n")] == ["ci"]


def test_ansi_colour_codes_are_ignored():
    text = "\x1b[31mRuntimeError\x1b[0m: CUDA error: \x1b[1mmisaligned address\x1b[0m\n"
    assert [m.id for m in ranked([SPECIFIC], text)] == ["specific"]


def _templated(entry_id, text, **extra):
    return _entry(entry_id, [], templates=[{"text": text, "project": "p", "file": "f", "versions": "v"}], **extra)


def test_an_anchor_that_needs_support_matches_only_beside_it():
    """Rule 3: a reading of another entry's message (needs_support) alone matches nothing; with a
    support pattern of its entry it counts."""
    reading = _entry("fork", [_pat("err", "initialization error", r"CUDA error: initialization error", 0.45,
                                   needs_support=True),
                              _pat("worker", "worker process", r"DataLoader worker process", 0.5, role="support")])
    assert ranked([reading], "RuntimeError: CUDA error: initialization error\n") == []
    beside = ranked([reading], "Caught RuntimeError in DataLoader worker process 0.\n"
                               "RuntimeError: CUDA error: initialization error\n")
    assert [m.id for m in beside] == ["fork"] and beside[0].confidence > 0.7


def test_opening_words_on_a_line_another_template_matches_whole_are_a_look_alike():
    """Rule 2: a template's opening words count as the message wrapped or retyped, unless another
    entry's template matches that line whole (two messages that start alike)."""
    fp8 = _templated("fp8", "CUBLAS_STATUS_NOT_SUPPORTED when calling `CUBLAS_STATUS_NOT_SUPPORTED`")
    blas = _templated("blas", "CUDA error: {status:word} when calling `{call}`")
    line = "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasSgemmStridedBatched( handle)`\n"
    assert [m.id for m in ranked([fp8, blas], line)] == ["blas"]
    # Alone (nothing else reads the line), the same opening words still count, as a fragment.
    retyped = "CUBLAS_STATUS_NOT_SUPPORTED when calling scaled_gemm, see the log above\n"
    out = ranked([fp8, blas], retyped)
    assert [m.id for m in out] == ["fp8"] and out[0].score < 0.9  # the raw score: a fragment weighs less


def test_chunked_input_equals_whole_input():
    lines = [f"INFO step {i} loss=0.{i % 97}" for i in range(5000)]
    lines[4000] = "RuntimeError: CUDA error: misaligned address"
    text = "\n".join(lines) + "\n" + TRAILER
    whole = ranked([GENERIC, SPECIFIC], text)
    m = Matcher([GENERIC, SPECIFIC])
    pieces = text.splitlines(keepends=True)
    for i in range(0, len(pieces), 333):
        m.feed("".join(pieces[i:i + 333]))
    assert [(x.id, x.confidence) for x in m.results()] == [(x.id, x.confidence) for x in whole]


# --- the real knowledge base ----------------------------------------------------------------------

REAL_IDS = {e.id for e in kb.load_all()}
needs = lambda *ids: pytest.mark.skipif(not set(ids) <= REAL_IDS, reason=f"entries {ids} not written")


@needs("async-error-reporting", "misaligned-address")
def test_real_trailer_variants_defer_to_the_specific_error():
    for trailer in (
        TRAILER,
        TRAILER.replace("CUDA_LAUNCH_BLOCKING=1", "CUDA_LAUNCH_BLOCKING=1.")
        + "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n",
    ):
        out = match_text("torch.AcceleratorError: CUDA error: misaligned address\n" + trailer)
        assert out[0].id == "misaligned-address"
        assert [m.id for m in out if m.context_only] == ["async-error-reporting"]
        alone = match_text("RuntimeError: CUDA error: unspecified launch failure\n" + trailer)
        assert alone[0].id == "async-error-reporting" and not alone[0].context_only


@needs("attention-oom", "cuda-oom")
def test_real_attention_oom_is_attention_oom_with_the_numbers():
    text = ("  File \"models/attention.py\", line 351, in _attention\n"
            "    attention_scores = torch.baddbmm(\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
            "capacity of 31.36 GiB of which 20.11 GiB is free. Of the allocated memory 9.8 GiB is allocated "
            "by PyTorch, and 1.2 GiB is reserved by PyTorch but unallocated.\n")
    out = match_text(text)
    assert out[0].id == "attention-oom"
    assert out[0].captures.get("requested") == "112.50 GiB"
    plain = match_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
                       "total capacity of 23.65 GiB of which 3.06 MiB is free.\n")
    assert plain[0].id == "cuda-oom"


@pytest.mark.parametrize("text", [
    "ValueError: too many values to unpack (expected 2)",
    "ModuleNotFoundError: No module named 'pandas'",
    "KeyError: 'model.layers.0.weight'",
    "FileNotFoundError: [Errno 2] No such file or directory: 'config.json'",
    "AssertionError: shapes differ",
])
def test_errors_outside_the_knowledge_base_get_no_confident_match(text):
    # Common Python errors of GPU code that no entry covers; the day one does, this names it.
    outside_the_knowledge_base(text)


def test_large_log_with_the_error_at_the_end_is_found():
    noise = "".join(f"[2026-11-22 10:00:{i % 60:02d}] INFO train step {i} loss 0.{i:05d} lr 1e-4\n" for i in range(120_000))
    chunks = [noise[i:i + 1_000_000] for i in range(0, len(noise), 1_000_000)]
    # re-cut at line ends as textinput does
    fixed, carry = [], ""
    for c in chunks:
        c = carry + c
        cut = c.rfind("\n") + 1
        fixed.append(c[:cut])
        carry = c[cut:]
    fixed.append(carry + "RuntimeError: CUDA error: misaligned address\n")
    out = match_chunks(fixed)
    assert out and out[0].id == "misaligned-address"
