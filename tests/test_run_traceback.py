"""Reading Python tracebacks and C++ stack traces out of program output (gpudoctor.ticket.pytrace)."""
from __future__ import annotations

import subprocess
import sys

from gpudoctor.ticket import pytrace

SIMPLE = """\
loading
Traceback (most recent call last):
  File "/home/alice/proj/train.py", line 40, in <module>
    main()
  File "/home/alice/proj/train.py", line 31, in main
    loss = model(x).sum()
           ^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1778, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 134, in forward
    return F.linear(input, self.weight, self.bias)
           ~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half
after
"""


def test_frames_exception_and_the_innermost_user_frame():
    (tb,) = pytrace.parse_tracebacks(SIMPLE)
    assert [f.line for f in tb.frames] == [40, 31, 1778, 134]
    assert tb.frames[1].code == "loss = model(x).sum()"  # the caret line is not taken for code
    assert tb.exception == "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half"
    assert tb.exception_type == "RuntimeError"
    user = pytrace.user_frame(tb)
    assert (user.file, user.line, user.function) == ("/home/alice/proj/train.py", 31, "main")
    call = pytrace.library_call(tb)
    assert call.function == "_wrapped_call_impl"


def test_the_real_python_traceback_of_a_subprocess():
    code = "def f():\n    return 1 / 0\n\nf()\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    (tb,) = pytrace.parse_tracebacks(out)
    assert tb.exception.startswith("ZeroDivisionError")
    user = pytrace.user_frame(tb)
    assert (user.file, user.line, user.function) == ("<string>", 2, "f")


def test_multi_line_messages_and_chained_exceptions():
    text = """\
Traceback (most recent call last):
  File "a.py", line 3, in run
    kernel()
RuntimeError: CUDA error: misaligned address
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "a.py", line 9, in <module>
    run()
ValueError: wrapped
"""
    first, second = pytrace.parse_tracebacks(text)
    assert first.message[1].startswith("CUDA kernel errors might be asynchronously reported")
    assert len(first.message) == 3
    assert second.exception == "ValueError: wrapped"
    # The failure the matcher recognised is the first one, although it is not the last.
    chosen = pytrace.failing_traceback([first, second], ("RuntimeError: CUDA error: misaligned address",))
    assert chosen is first
    assert pytrace.failing_traceback([first, second], ()) is second


def test_interleaved_torchrun_ranks_are_read_apart():
    text = """\
[rank0]: Traceback (most recent call last):
[rank1]: Traceback (most recent call last):
[rank0]:   File "/work/train.py", line 12, in <module>
[rank1]:   File "/work/train.py", line 12, in <module>
[rank0]:     step()
[rank1]:     step()
[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered
[rank1]: torch.OutOfMemoryError: CUDA out of memory.
"""
    tbs = pytrace.parse_tracebacks(text)
    assert [(tb.prefix, tb.exception_type) for tb in tbs] == [
        ("[rank0]: ", "RuntimeError"), ("[rank1]: ", "torch.OutOfMemoryError")]
    assert all(pytrace.user_frame(tb).line == 12 for tb in tbs)


def test_colours_indentation_and_repeats():
    text = (
        "    Traceback (most recent call last):\n"
        '      File "\x1b[35mrec.py\x1b[0m", line \x1b[35m2\x1b[0m, in \x1b[35mf\x1b[0m\n'
        "        return f()\n"
        "      [Previous line repeated 996 more times]\n"
        "    \x1b[1;35mRecursionError\x1b[0m: maximum recursion depth exceeded\n"
    )
    (tb,) = pytrace.parse_tracebacks(text)
    assert tb.frames[0].file == "rec.py" and tb.frames[0].code == "return f()"
    assert tb.exception == "RecursionError: maximum recursion depth exceeded"


def test_library_frames():
    lib = [
        "/usr/lib/python3.11/runpy.py", "/opt/venv/lib/python3.12/site-packages/torch/x.py",
        "/usr/local/lib/python3.10/dist-packages/xformers/ops.py", "<frozen runpy>",
        "C:\\Python311\\Lib\\site-packages\\torch\\nn\\functional.py",
    ]
    user = ["/home/bob/train.py", "<string>", "<stdin>", "model/lib/python_utils.py", "/srv/app/libs/x.py"]
    for path in lib:
        assert pytrace.Frame(path, 1, "f", "").is_library, path
    for path in user:
        assert not pytrace.Frame(path, 1, "f", "").is_library, path


def test_all_library_frames_fall_back_to_the_innermost():
    text = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\n'
            '  File "/v/lib/python3.11/site-packages/pkg/cli.py", line 5, in main\n    boom()\nKeyError: 1\n')
    (tb,) = pytrace.parse_tracebacks(text)
    assert pytrace.user_frame(tb).line == 5


def test_incomplete_tracebacks_are_not_invented():
    assert pytrace.parse_tracebacks("") == []
    assert pytrace.parse_tracebacks("Traceback (most recent call last):\n") == []
    assert pytrace.parse_tracebacks('Traceback (most recent call last):\n  File "a.py", line 1, in f\n') == []
    assert pytrace.parse_tracebacks('Traceback (most recent call last):\n  File "a.py", line 1, in f\n   indented junk\n') == []


def test_cpp_operator():
    text = ("Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 (most recent call first):\n"
            "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96\n"
            "frame #4: at::_ops::_scaled_mm::call(at::Tensor const&) + 0x1f1\n"
            "frame #9: at::_ops::linear::call(at::Tensor const&) + 0x1f1\n")
    assert pytrace.cpp_operator(text) == "aten::_scaled_mm"  # the innermost operator
    assert pytrace.cpp_operator("no stack here") is None


def test_hostile_input_is_bounded():
    line = '  File "' + "a" * 5_000_000 + '", line 1, in f\n'
    many = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 100_000 + "E: x\n"
    assert pytrace.parse_tracebacks("Traceback (most recent call last):\n" + line + "E: x\n") == []
    (tb,) = pytrace.parse_tracebacks(many)
    assert len(tb.frames) == pytrace._MAX_FRAMES
