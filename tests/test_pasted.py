"""Text as people paste it (gpudoctor.explain.pasted and the matcher): every form is recognised as the
plain message is, at the same line, and the evidence quotes the user's own line as pasted."""
from __future__ import annotations

import pytest

from gpudoctor.explain.matcher import match_chunks, match_text
from gpudoctor.explain.pasted import join_wrapped, normalise

DEVICE = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) should be the same"
ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
TRAILER = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
           "below might be incorrect.")
SDP_WARNING = ("/usr/local/lib/python3.10/dist-packages/torch/backends/cuda/__init__.py:342: FutureWarning: "
               "torch.backends.cuda.sdp_kernel() is deprecated. In the future, this context manager will be "
               "removed. Please see, torch.nn.attention.sdpa_kernel() for the new context manager, with updated "
               "signature.")


def best(text: str):
    matches = match_text(text)
    assert matches, text
    return matches[0]


def test_a_markdown_quote_is_read_as_the_message_and_quoted_as_pasted():
    text = "> " + ILLEGAL + "\n> " + TRAILER + "\n> > nested: " + DEVICE + "\n"
    m = best(text)
    assert (m.id, m.first_line) == ("illegal-memory-access", 1)
    assert m.evidence[0] == "> " + ILLEGAL
    device = next(x for x in match_text(text) if x.id == "device-mismatch")
    assert device.first_line == 3 and device.evidence[0].startswith("> > nested: RuntimeError")


def test_a_message_wrapped_over_lines_is_joined_and_quoted_whole():
    text = ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type\n"
            "(torch.HalfTensor) should be the same\n")
    m = best(text)
    assert (m.id, m.first_line) == ("device-mismatch", 1)
    assert m.confidence >= 0.85  # the whole message, not a fragment
    assert m.evidence[0] == DEVICE
    assert any("CUDA tensor" in fact for fact in m.decided_by)  # the facts after the break count


def test_a_wrapped_line_that_continues_with_a_capital_letter_is_joined_where_a_template_ends_inside_it():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total capacity of\n"
            "31.36 GiB of which 20.11 GiB is free.\n")
    m = best(text)
    assert m.id == "attention-oom"
    assert m.captures.get("capacity") == "31.36 GiB"  # read across the break
    assert any("larger than the whole GPU (31.36 GiB total)" in fact for fact in m.decided_by)


def test_a_terminal_that_broke_words_at_its_width_is_joined_without_a_space():
    width = 60
    flat = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) should be the same"
    broken = "\n".join(flat[i:i + width] for i in range(0, len(flat), width))  # "...HalfTe" / "nsor)..."
    assert any(len(line) == width for line in broken.splitlines())
    joined, spans = join_wrapped(broken)
    assert joined.splitlines()[0] == flat and spans == {0: 2}
    assert best(broken).id == "device-mismatch"


def test_a_future_warning_with_its_file_and_line_is_recognised_flat_and_wrapped():
    flat = SDP_WARNING + "\n  warnings.warn(\n"
    assert best(flat).id == "sdp-kernel-deprecated"
    words = SDP_WARNING.split(" ")
    wrapped = "\n".join(" ".join(words[i:i + 11]) for i in range(0, len(words), 11)) + "\n  warnings.warn(\n"
    assert "sdp_kernel() is deprecated" not in wrapped.replace("\n", "") or "\n" in wrapped
    m = best(wrapped)
    assert (m.id, m.first_line) == ("sdp-kernel-deprecated", 1)
    assert m.evidence[0] == SDP_WARNING  # the user's lines, joined


def test_html_entities_from_a_web_page_are_undone_and_the_line_quoted_as_pasted():
    pasted = DEVICE.replace("(", "&#40;").replace(")", "&#41;") + "\nTypeError: can&#39;t convert &quot;x&quot;\n"
    m = best(pasted)
    assert m.id == "device-mismatch"
    assert m.evidence[0] == DEVICE.replace("(", "&#40;").replace(")", "&#41;")
    assert normalise("a &lt;b&gt; &amp; &#39;c&#39; &#10; d") == "a <b> & 'c' &#10; d"  # never a new line


def test_a_line_number_gutter_is_removed_when_the_numbers_count_up():
    text = "41 | Traceback (most recent call last):\n42 | " + ILLEGAL + "\n43 | " + TRAILER + "\n"
    m = best(text)
    assert (m.id, m.first_line) == ("illegal-memory-access", 2)
    assert m.evidence[0] == "42 | " + ILLEGAL
    assert normalise("  7  a\n  8  b\n  9  c") == "a\nb\nc"
    assert normalise("12:00:01 a\n12:00:02 b\n12:00:03 c") == "12:00:01 a\n12:00:02 b\n12:00:03 c"  # times, not a gutter
    assert normalise("3 | a\n7 | b\n2 | c") == "3 | a\n7 | b\n2 | c"  # numbers that do not count up


def test_frames_without_the_first_line_of_the_traceback_or_of_the_message():
    frames = ('  File "/home/u/miniconda3/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1518, '
              'in _wrapped_call_impl\n    return self._call_impl(*args, **kwargs)\n'
              '  File "/home/u/x/model.py", line 88, in forward\n    x = self.conv(x)\n')
    assert best(frames + DEVICE + "\n").id == "device-mismatch"
    # An out-of-memory message whose first line ("CUDA out of memory. Tried to allocate ...") was not copied.
    rest = ("GPU 0 has a total capacity of 23.65 GiB of which 9.06 MiB is free. Including non-PyTorch memory, this "
            "process has 23.63 GiB memory in use. Of the allocated memory 22.99 GiB is allocated by PyTorch, and "
            "190.40 MiB is reserved by PyTorch but unallocated.\n")
    m = best(frames + rest)
    assert m.id == "cuda-oom" and m.captures.get("capacity") == "23.65 GiB"


@pytest.mark.parametrize("prose", [
    ("我在运行训练的时候遇到了这个问题：\n{error}\n请问是什么原因？显卡是 RTX 5090。", 2),
    ("実行すると次のエラーが出ます：{error}（CUDA_LAUNCH_BLOCKING=1 でも同じ）", 1),
    ("При запуске обучения получаю ошибку: «{error}» — что делать?", 1),
])
def test_prose_in_another_language_around_the_message(prose):
    template, line = prose
    m = best(template.format(error=ILLEGAL))
    assert (m.id, m.first_line) == ("illegal-memory-access", line)


def test_full_width_punctuation_from_an_input_method_is_read_as_ascii():
    wide = DEVICE.replace("(", "（").replace(")", "）").replace(": ", "：")
    m = best(wide)
    assert m.id == "device-mismatch" and m.evidence[0] == wide
    assert normalise("“quoted” ‘x’\u3000y") == "\"quoted\" 'x' y"


def test_every_form_keeps_the_line_count_and_a_large_log_is_not_joined():
    for text in ["> a\n> b", "1 | a\n2 | b\n3 | c", "&quot;a&quot;\nb", "a（b）\nc"]:
        assert normalise(text).count("\n") == text.count("\n")
    long = ("x" * 70 + "\n" + "continued in lower case\n") * 2000
    joined, spans = join_wrapped(long)
    assert spans and joined.count("\n") == long.count("\n")
    # The matcher joins pasted text only: in a log chunk larger than 64 KB the two lines of a
    # wrapped message are not read as one (the device facts after the break are not seen).
    head, tail = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type\n", "(torch.HalfTensor) should be the same\n"
    pasted = best(head + tail)
    logged = [m.confidence for m in match_chunks(["pad\n" * 20000 + head, tail]) if m.id == "device-mismatch"]
    assert pasted.id == "device-mismatch" and max(logged, default=0.0) < pasted.confidence


def test_a_line_longer_than_anything_wraps_at_was_printed_whole():
    # A 170-character log line followed by the C++ runtime's own lower-case line: two records.
    text = ("CUDA Error: misaligned address (716) /code/include/attention/prefill.cuh: line 1918 at function "
            "cudaLaunchKernel((void*)kernel, nblks, nthrs, args, smem_size, stream)\n"
            "terminate called after throwing an instance of 'std::invalid_argument'\n")
    assert join_wrapped(text) == (text, {})
    m = best(text)
    assert m.id == "misaligned-address" and "terminate" not in m.evidence[0]


def test_lines_that_start_a_record_of_their_own_are_not_joined():
    text = ("[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered and more words here\n"
            "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered and more words here\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED with more words\n"
            "error: identifier \"__hmul2\" is undefined in this translation unit, with more words than forty\n"
            "(RayWorker pid=123) INFO something that is long enough to have been wrapped by the terminal\n"
            "(pid=124) more\n")
    assert join_wrapped(text) == (text, {})


def test_url_encoded_text_from_a_link_is_decoded_and_quoted_as_pasted():
    pasted = "import error\n\nlibtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister\n"
    m = best(pasted)
    assert (m.id, m.first_line) == ("nccl-version-mismatch", 3)
    assert m.evidence[0] == "libtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister"
    assert normalise("100% done, 5% left\na%0Ab%20c%20d") == "100% done, 5% left\na%0Ab c d"  # never a new line
