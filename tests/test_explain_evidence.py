"""Evidence over keywords, a log rather than a line, and what `explain` prints.

* Facts in the text decide between look-alike entries, and the deciding fact is shown.
* Near-misses (a word that looks like an entry's, a cause no entry covers) stay unmatched or low.
* In a long log the first root cause ranks above its consequences, and every match says which
  line of the input it came from, counted across chunks.
* The text report: verdict first, the id whole, evidence neither cut mid-word nor repeated,
  patches and URLs never folded, pasted text shown as text (markup and escape sequences inert).
* The Markdown report and the JSON 1.1 fields.
"""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gpudoctor.knowledge import kb
from gpudoctor.explain.explanation import Explanation, render_markdown, render_text, to_json
from gpudoctor.explain.matcher import CONFIDENT, match_chunks, match_text


def best(text: str):
    matches = match_text(text)
    return matches[0] if matches else None


def confident(text: str) -> list[str]:
    return [m.id for m in match_text(text) if m.confidence >= CONFIDENT and not m.context_only]


# --- facts decide between look-alikes ------------------------------------------------------------


def test_legacy_type_names_carry_the_device():
    m = best("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) should be the same")
    assert m.id == "device-mismatch"
    assert any("CUDA tensor" in fact for fact in m.decided_by), m.decided_by


def test_same_device_legacy_types_are_a_dtype_mismatch():
    m = best("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same")
    assert m.id == "dtype-mismatch"
    assert "device-mismatch" not in confident(
        "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same")


def test_backend_type_names_carry_the_device():
    m = best("RuntimeError: Expected object of type CUDABFloat16Type but found type CPUBFloat16Type for argument #2 'mat2'")
    assert m.id == "device-mismatch", [(x.id, x.confidence) for x in match_text(
        "RuntimeError: Expected object of type CUDABFloat16Type but found type CPUBFloat16Type for argument #2 'mat2'")]


def test_a_meta_device_is_not_a_device_mismatch():
    m = best("RuntimeError: Tensor on device meta is not on the expected device cuda:0!")
    assert m.id == "meta-tensor"
    assert any("meta device" in fact for fact in m.decided_by)


def test_fp8_gemm_sizes_beside_a_bare_cublaslt_status_mean_a_layout_rule():
    text = ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul with "
            "transpose_mat1 1 transpose_mat2 0 m 4096 n 24 k 4096 mat1_ld 4096 mat2_ld 4096 result_ld 4096 abcType 28\n")
    m = best(text)
    assert m.id == "fp8-layout"
    assert any("n=24" in fact for fact in m.decided_by), m.decided_by


def test_a_message_cut_at_the_end_of_the_line_still_counts_with_its_facts():
    m = best("RuntimeError: Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be th")
    assert m is not None and m.id == "device-mismatch" and m.decided_by


def test_one_weak_word_is_not_a_confident_match():
    assert confident("the loss was contiguous with the previous run") == []
    assert confident("we import torch in the notebook") == []


# --- near-misses ---------------------------------------------------------------------------------


def test_inductor_layout_bug_saying_contiguous_is_not_the_user_contiguous_fix():
    text = ("  File \"/usr/lib/python3.11/site-packages/torch/_inductor/compile_fx.py\", line 1100, in compile_fx\n"
            "  File \"/usr/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py\", line 489, in _fn\n"
            "RuntimeError: (*bias): last dimension must be contiguous\n")
    assert "noncontiguous-kernel-input" not in confident(text)


def test_not_resizable_storage_from_data_loading_is_not_an_allocator_bug():
    text = ("  File \"/usr/lib/python3.10/site-packages/torch/utils/data/_utils/collate.py\", line 162, in collate_tensor_fn\n"
            "    return torch.stack(batch, 0, out=out)\n"
            "RuntimeError: Trying to resize storage that is not resizable\n")
    assert confident(text) == []


def test_xformers_operator_listing_whose_cause_is_an_input_rule_is_unmatched():
    text = ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 257, 6, 64) (torch.float32)\n"
            "`fa2F@v2.5.7-pt` is not supported because:\n"
            "    device=cpu (supported: {'cuda'})\n"
            "    dtype=torch.float32 (supported: {torch.float16, torch.bfloat16})\n"
            "`cutlassF-pt` is not supported because:\n"
            "    device=cpu (supported: {'cuda'})\n")
    assert confident(text) == []


def test_the_async_trailer_is_not_the_cause_of_a_synchronous_cuda_error():
    text = ("RuntimeError: CUDA error: operation not permitted when stream is capturing\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")
    assert confident(text) == []


def test_undefined_symbol_in_torch_itself_is_an_import_failure_not_an_extension():
    text = "ImportError: /env/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister"
    assert best(text).id != "extension-abi-mismatch"
    own = "ImportError: /env/lib/python3.8/site-packages/torch/_C.cpython-38-x86_64-linux-gnu.so: undefined symbol: _ZN3c104impl8GPUTrace13gpuTraceStateE"
    assert best(own).id == "torch-import-failed"
    ext = "ImportError: /env/lib/python3.8/site-packages/torchvision/_C.so: undefined symbol: _ZN3c106detail19maybe_wrap_dim_slowEllb"
    assert best(ext).id == "extension-abi-mismatch"


def test_a_missing_library_is_the_extensions_when_the_failing_import_is_the_extensions():
    # The loader's "cannot open shared object file" names a library, not who needed it: torch's own
    # import (its frames, or none) stays an import failure; an extension's import frame, or the
    # libraries only torch 1.8-1.12's split CUDA build had, make it an extension built for another
    # torch or CUDA.
    own = ('  File "/env/lib/python3.10/site-packages/torch/__init__.py", line 199, in <module>\n'
           "    from torch._C import *  # noqa: F403\n"
           "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n")
    assert best(own).id == "torch-import-failed"
    ext = ('  File "/env/lib/python3.10/site-packages/apex/optimizers/fused_adam.py", line 40, in __init__\n'
           '    fused_adam_cuda = importlib.import_module("fused_adam_cuda")\n'
           "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n")
    assert best(ext).id == "extension-abi-mismatch"
    assert "torch-import-failed" not in confident(ext)
    split = ("UserWarning: Failed to load image Python extension: libtorch_cuda_cu.so: cannot open shared "
             "object file: No such file or directory\n")
    assert best(split).id == "extension-abi-mismatch"
    bare = "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n"
    assert confident(bare) == [] or best(bare).id == "torch-import-failed"



@pytest.mark.parametrize("import_line", [
    "import exllamav2_ext",
    "import quant_kernels  # fused dequantise",
    "from mylib import fused_dense_lib",
    "----> 7 import my_inference_engine  # with CUDA kernels",     # IPython's arrow on the failing line
])
def test_compiled_kernel_modules_by_their_conventional_suffixes_own_the_missing_library(import_line):
    # exllamav2_ext, exllama_kernels, awq_inference_engine, fused_dense_lib: the suffixes compiled
    # kernel modules carry. Their missing libcudart is the extension's build, even when `import
    # torch` lines from an IPython cell's context stand above them.
    text = ('      2 import torch\n      3 import torch.nn as nn\n' if import_line.startswith("---->") else "")
    text += f"{import_line}\nImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n"
    assert best(text).id == "extension-abi-mismatch"
    assert "torch-import-failed" not in confident(text)


def test_a_pure_python_module_name_is_not_read_as_a_compiled_extension():
    text = ("    import kernels_overview\n"
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n")
    assert "extension-abi-mismatch" not in confident(text)


@pytest.mark.parametrize("text, expected", [
    # torch's own messages in another case or another form
    ("Getting 'cannot re-initialize cuda in forked subprocess' every time my loader starts", "cuda-fork-reinit"),
    ('    "Cannot re-initialize CUDA in forked subprocess. " + msg)', "cuda-fork-reinit"),
    ("RuntimeError: expected self and mask to be on the same device, but got mask on cpu and self on cuda:0",
     "device-mismatch"),
    ("RuntimeError: expected self and mask to be on the same device, but got mask on cuda:1 and self on cuda:0",
     "device-mismatch"),
    # a library's own wording of a known cause
    ("RuntimeError: CUDA has been initialized before the `notebook_launcher` could create a forked subprocess.",
     "cuda-fork-reinit"),
    ("ERROR! Intel® Extension for PyTorch* needs to work with PyTorch 2.5.*, but PyTorch 2.6.0+cpu is found. "
     "Please switch to the matching version and run again.", "extension-abi-mismatch"),
    ("RuntimeError: CK only supports head dimension at most 256", "flash-attn-unsupported"),
    # a _scaled_mm meta check cut off before its message
    ("E0101 fake_tensor.py:2558] failed while attempting to run meta for aten._scaled_mm.default\n"
     '  File "/env/torch/_meta_registrations.py", line 6244, in meta_scaled_mm\n    torch._check(\n',
     "fp8-layout"),
])
def test_long_tail_wordings_of_known_causes(text, expected):
    assert best(text).id == expected
    assert expected in confident(text)


@pytest.mark.parametrize("text, expected", [
    # Triton 3.x's ptxas step (Blackwell under an older bundled ptxas)
    ("ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'\n"
     "triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error", "torch-compile-failed"),
    # an extension file named without the CPython tag
    ("ImportError: /env/site-packages/flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
     "flash-attn-unsupported"),
    # a custom backend's runtime out of memory on a materialised score matrix
    ("TT_FATAL: Out of Memory: Not enough space to allocate 21474836480 B DRAM buffer across 12 banks\n"
     "the decomposed attention built the (1, 24, 30000, 30000) scores tensor", "attention-oom"),
])
def test_long_tail_wordings_of_known_causes_round6(text, expected):
    assert best(text).id == expected
    assert expected in confident(text)


def test_a_custom_backend_oom_without_attention_evidence_is_the_plain_oom():
    text = "Out of Memory: Not enough space to allocate 1073741824 B L1 buffer across 64 banks"
    assert best(text).id == "cuda-oom"
    assert "attention-oom" not in confident(text)


@pytest.mark.parametrize("listing", ["torch_npu 2.4.0", "torch-npu==2.4.0", "torch-mlu 1.20.0"])
def test_torch_not_compiled_with_cuda_beside_another_backend_is_not_a_missing_gpu(listing):
    text = f"{listing}\nAssertionError: Torch not compiled with CUDA enabled\n"
    assert "cuda-unavailable" not in confident(text)
    plain = "AssertionError: Torch not compiled with CUDA enabled\n"
    assert "cuda-unavailable" in confident(plain)

def test_a_meta_failure_of_another_op_is_not_an_fp8_layout_rule():
    text = "failed while attempting to run meta for aten.index_put_.default\n"
    assert "fp8-layout" not in confident(text)


def test_a_same_device_pair_is_not_a_device_mismatch():
    text = "expected self and mask to be on the same device, but got mask on meta and self on cuda:0"
    assert "device-mismatch" not in confident(text)

# --- a log, not a line ---------------------------------------------------------------------------


DSA_LOG = (
    "epoch 3 step 100 loss 2.31\n"                                                                          # 1
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [5,0,0], thread: [64,0,0] "
    "Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` failed.\n"              # 2
    "Traceback (most recent call last):\n"                                                                  # 3
    "RuntimeError: CUDA error: device-side assert triggered\n"                                              # 4
    + "".join(f"[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered\n" for r in range(100))  # 5-104
    + "[rank0]:[E602 11:17:52.185053341 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 "
      "milliseconds before timing out.\n"                                                                    # 105
)


def test_the_first_device_side_assert_is_the_root_and_the_errors_after_it_are_consequences():
    out = match_text(DSA_LOG)
    assert out[0].id == "device-side-assert" and not out[0].context_only
    assert out[0].first_line == 2
    later = {m.id: m for m in out[1:]}
    for follower in ("illegal-memory-access", "nccl-watchdog-timeout"):
        assert follower in later, [m.id for m in out]
        assert later[follower].context_only
        assert later[follower].consequence_of == ("device-side-assert", 2)
    assert later["nccl-watchdog-timeout"].first_line == 105


def test_line_numbers_are_counted_across_chunks():
    lines = DSA_LOG.splitlines(keepends=True)
    chunks = ["".join(lines[:3]), "".join(lines[3:50]), "".join(lines[50:])]
    whole = {m.id: (m.first_line, m.lines) for m in match_text(DSA_LOG)}
    chunked = {m.id: (m.first_line, m.lines) for m in match_chunks(chunks)}
    assert chunked == whole


def test_a_timeout_alone_is_the_answer_but_after_an_error_it_is_a_consequence():
    timeout = DSA_LOG.splitlines()[-1] + "\n"
    assert best(timeout).id == "nccl-watchdog-timeout"
    nccl_first = "RuntimeError: NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details)\n" + timeout
    out = match_text(nccl_first)
    assert out[0].id == "nccl-error"
    assert [m for m in out if m.id == "nccl-watchdog-timeout"][0].consequence_of == ("nccl-error", 1)


# --- the text report -----------------------------------------------------------------------------


def _render(text: str, width: int = 80, color: bool = False) -> str:
    matches = tuple(match_text(text))
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, emoji=False)
    render_text(Explanation(matches, matches[0].entry if matches else None), console)
    return buf.getvalue()


def test_the_verdict_comes_first_with_cause_fix_and_line():
    out = _render("some noise\nmore noise\nRuntimeError: CUDA error: misaligned address\n").splitlines()
    assert out[0] == "misaligned-address"
    assert "from line 3 of the input" in out[2]
    assert out[3].startswith("Cause:")
    assert any(line.startswith("Fix:") for line in out[3:10])


@pytest.mark.parametrize("width", [20, 40, 80])
def test_the_id_is_never_truncated(width):
    out = _render("RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n", width=width)
    assert out.splitlines()[0] == "flash-attn-unsupported"


def test_patch_lines_and_urls_are_never_folded_at_80_columns():
    for entry in kb.load_all():
        matches = ()
        buf = io.StringIO()
        render_text(Explanation(matches, entry), Console(file=buf, width=80, color_system=None))
        out = buf.getvalue().splitlines()
        for line in entry.patch.strip("\n").splitlines():
            if line.strip():
                assert line.rstrip() in out, (entry.id, line)
        for ref in entry.references:
            assert "  " + ref.url in out, (entry.id, ref.url)


def test_patch_lines_survive_colour_too():
    entry = next(e for e in kb.load_all() if e.id == "torch-import-failed")
    buf = io.StringIO()
    render_text(Explanation((), entry), Console(file=buf, width=80, force_terminal=True, color_system="standard"))
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).splitlines()
    for line in entry.patch.strip("\n").splitlines():
        assert line.rstrip() in plain, line


def test_evidence_is_not_cut_mid_word_and_not_repeated():
    tail = " ".join(f"word{i}" for i in range(200))
    text = f"RuntimeError: CUDA error: misaligned address {tail}\nRuntimeError: CUDA error: misaligned address {tail}\n"
    out = _render(text)
    verdict = out.split("the full story")[0]
    words = [w for line in verdict.splitlines() for w in line.split()]
    assert all(w.startswith("word") and w[4:].rstrip("…").isdigit() for w in words if w.startswith("word"))
    assert verdict.count("misaligned address word0") <= 1


def test_pasted_markup_and_escape_sequences_stay_inert():
    text = ("[rank0]: [link=https://evil.example]click[/link] [/] [bold]x[/bold] "
            "\x1b]8;;https://evil.example\x07here\x1b]8;;\x07 RuntimeError: CUDA error: misaligned address\n")
    for color in (False, True):
        out = _render(text, color=color)
        assert "\x1b]" not in out and "\x07" not in out
        assert "[rank0]:" in out
        assert "[link=https://evil.example]click[/link]" in out
        assert "[/]" in out and "[bold]x[/bold]" in out


def test_nothing_user_facing_mentions_internal_notes():
    import re

    for entry in kb.load_all():
        buf = io.StringIO()
        render_text(Explanation((), entry), Console(file=buf, width=100, color_system=None))
        text = buf.getvalue() + to_json(Explanation((), entry)) + render_markdown(Explanation((), entry))
        assert not re.search(r"seed ?0[0-9][0-9]|field note|internal case notes", text, re.I), entry.id


# --- Markdown and JSON ---------------------------------------------------------------------------


def test_markdown_report():
    text = "x\nRuntimeError: CUDA error: misaligned address\n[/] `tick` *star*\n"
    matches = tuple(match_text(text))
    md = render_markdown(Explanation(matches, matches[0].entry))
    assert md.startswith("## `misaligned-address`: ")
    assert "from line 2 of the input" in md
    assert "**Cause:**" in md and "**Fix:**" in md
    assert "```" in md and "### References" in md
    assert render_markdown(Explanation((), None)) == "No GPU failure recognised in this text.\n"


def test_json_1_1_fields():
    matches = tuple(match_text(DSA_LOG))
    data = json.loads(to_json(Explanation(matches, matches[0].entry)))
    assert data["schema_version"] == "1.3"  # 1.2 and 1.3 add fields; every 1.1 field is still there
    assert data["code_patch"] is None  # 1.3: no traceback naming a file here
    assert data["verdict"]["id"] == "device-side-assert" and data["verdict"]["line"] == 2
    assert data["verdict"]["kind"] == "entry" and data["platform"] is None and data["unrecognised"] is None
    assert data["verdict"]["cause"] and data["verdict"]["quick_fix"]
    first = data["matches"][0]
    assert first["line"] == 2 and first["evidence_lines"][0] == 2
    assert len(first["evidence_lines"]) == len(first["evidence"])
    follower = next(m for m in data["matches"] if m["id"] == "nccl-watchdog-timeout")
    assert follower["consequence_of"] == {"id": "device-side-assert", "line": 2}
    assert isinstance(first["decided_by"], list) and isinstance(first["against"], list)
    entry = data["entry"]
    assert entry["misconceptions"] is not None and "corrections" in entry  # 1.0 readers keep their field


# --- a reading that needs a fact, and an error inside a wrapper ----------------------------------


def test_a_bare_cublaslt_status_without_fp8_facts_is_the_cublas_status_error():
    """The FP8 layout reading of a cuBLASLt status needs a fact (FP8 operand types, FP8 sizes,
    _scaled_mm): without one it stays under confident and does not demote the generic entry."""
    text = ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul with "
            "transpose_mat1 1 transpose_mat2 0\n")
    out = match_text(text)
    assert out[0].id == "cublas-status-error" and not out[0].context_only
    fp8 = [m for m in out if m.id == "fp8-layout"]
    assert not fp8 or fp8[0].confidence < CONFIDENT
    with_fact = match_text(text.rstrip("\n") + " m 4096 n 24 k 4096\n")
    assert with_fact[0].id == "fp8-layout" and with_fact[0].decided_by
    with_stack = match_text("  File \"fp8.py\", line 9, in f\n    y = torch._scaled_mm(a, b)\n" + text)
    assert with_stack[0].id == "fp8-layout"


WATCHDOG = ("[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated with "
            "exception: CUDA error: {inner}\n")


@pytest.mark.parametrize("inner, expected", [
    ("unspecified launch failure", "async-error-reporting"),  # generic, yet inside a wrapper it decides
    ("an illegal memory access was encountered", "illegal-memory-access"),
    ("misaligned address", "misaligned-address"),
])
def test_an_error_inside_the_nccl_watchdog_decides_and_the_watchdog_is_its_context(inner, expected):
    out = match_text(WATCHDOG.format(inner=inner) + "CUDA kernel errors might be asynchronously reported at some "
                     "other API call, so the stacktrace below might be incorrect.\n")
    assert out[0].id == expected and not out[0].context_only
    watchdog = next(m for m in out if m.id == "nccl-watchdog-timeout")
    assert watchdog.context_only and watchdog.consequence_of == (expected, 1)


def test_an_error_on_the_line_after_the_wrapper_is_inside_it_too():
    text = ("terminate called after throwing an instance of 'c10::DistBackendError'\n"
            "  what():  [PG 0 Rank 3] Process group watchdog thread terminated with exception:\n"
            "CUDA error: an illegal memory access was encountered\n")
    assert match_text(text)[0].id == "illegal-memory-access"


def test_a_watchdog_timeout_alone_is_still_the_watchdog():
    text = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n")
    out = match_text(text)
    assert out[0].id == "nccl-watchdog-timeout" and not out[0].context_only


# --- the long tail: third-party kernels, device backends, host asserts ---------------------------


@pytest.mark.parametrize("cond, expected", [
    ("B.stride(-1) == 1", "noncontiguous-kernel-input"),                       # mamba-ssm selective scan
    ("x.stride(2) == 1 || x.stride(1) == 1", "noncontiguous-kernel-input"),     # causal-conv1d
    ("a.stride(1) == 1 && c.stride(1) == 1", "noncontiguous-kernel-input"),     # vLLM cutlass_scaled_mm
    ("b.dtype() == at::kFloat8_e4m3fn", "fp8-layout"),                          # torch._scaled_mm
])
def test_a_torch_check_without_a_message_is_read_by_its_condition(cond, expected):
    m = best(f"RuntimeError: Expected {cond} to be true, but got false.  (Could this error message be improved?  "
             "If so, please report an enhancement request to PyTorch.)\n")
    assert m.id == expected and m.confidence >= CONFIDENT
    assert any(cond in fact for fact in m.decided_by)


def test_a_torch_check_on_something_else_is_not_a_layout_rule():
    for cond in ("x.is_cuda()", "dprops->major >= 8", "mha_graph->execute(handle, variant_pack, ws).is_good()"):
        ids = confident(f"RuntimeError: Expected {cond} to be true, but got false.\n")
        assert "noncontiguous-kernel-input" not in ids and "fp8-layout" not in ids, (cond, ids)


def test_a_closing_quote_ends_the_word_it_quotes():
    assert best("ModuleNotFoundError: No module named 'torch'").id == "torch-import-failed"
    assert best("ModuleNotFoundError: No module named torch").id == "torch-import-failed"  # quotes lost
    assert "torch-import-failed" not in confident("ModuleNotFoundError: No module named 'torch_mlu.core'")


def test_a_host_assert_is_not_a_device_side_assert():
    device = ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
              "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.\n")
    assert best(device).id == "device-side-assert"
    generic_device = "kernel.cu:12: f: block: [1,0,0], thread: [7,0,0] Assertion `i < n` failed.\n"
    assert best(generic_device).id == "device-side-assert"
    host = ("python: /src/csrc/ops.cu:408: int igemmlt(cublasLtHandle_t, int, int, int): Assertion `false' failed.\n"
            "Aborted (core dumped)\n")
    assert "device-side-assert" not in confident(host)
    triton = ("python3: /project/lib/Tools/LinearLayout.cpp:562: mlir::triton::LinearLayout "
              "mlir::triton::LinearLayout::reshapeOuts(llvm::ArrayRef<std::pair<mlir::StringAttr, int> >) const: "
              "Assertion `getTotalOutDimSize() == 1' failed.\n")
    assert best(triton).id == "torch-compile-failed" and "device-side-assert" not in confident(triton)


def test_torch_not_compiled_with_cuda_beside_another_device_backend_is_not_a_missing_gpu():
    text = (">>> import torch, torch_npu\n>>> torch.ones(2).to(3)\n"
            "AssertionError: Torch not compiled with CUDA enabled\n")
    assert "cuda-unavailable" not in confident(text)
    assert best("AssertionError: Torch not compiled with CUDA enabled\n").id == "cuda-unavailable"


def test_a_cuda_error_in_a_worker_is_a_fork_only_beside_the_worker():
    inner = "RuntimeError: CUDA error: initialization error\n"
    assert "cuda-fork-reinit" not in confident(inner)
    worker = ("RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
              '  File "/x/torch/utils/data/_utils/worker.py", line 308, in _worker_loop\n' + inner)
    m = best(worker)
    assert m.id == "cuda-fork-reinit" and m.confidence >= CONFIDENT


@pytest.mark.parametrize("backend, expected", [("flex", "attention-oom"), ("flash_2", "cuda-oom")])
def test_an_out_of_memory_after_a_log_naming_a_materialising_attention_backend(backend, expected):
    text = (f"[olmo_core.nn.attention:471] Using attention backend '{backend}'\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 2.11 GiB is free.\n")
    assert best(text).id == expected


def test_a_device_backends_out_of_memory_is_the_out_of_memory_and_a_corrupt_size_is_not():
    npu = ("RuntimeError: NPU out of memory. Tried to allocate 5.03 GiB (NPU 3; 60.96 GiB total capacity; 49.47 GiB "
           "already allocated; 1.32 GiB free; 57.55 GiB reserved in total by PyTorch)\n")
    m = best(npu)
    assert m.id == "cuda-oom" and m.captures.get("capacity") == "60.96 GiB"
    assert confident("NPU out of memory. Tried to allocate more than 1EB memory\n") == []


def test_a_device_runtime_refusing_to_register_memory_that_is_not_page_aligned():
    for text in ("[DRV] Invalid para. va=0x12d6371b8000 page_size=2097152\n[GE] Failed to connect, ErrorNo: 503900\n",
                 "aclrtHostRegister failed with EINVAL (Src_va is zero or not page alignment)\n"):
        assert best(text).id == "custom-allocator", text
