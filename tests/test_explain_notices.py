"""What `explain` answers when the cause is no NVIDIA CUDA entry (issue 28): another platform (the
CUDA entries do not apply; the platform's own tools do), a primary CUDA error no entry explains
(the trailer never outranks it), a hardware fault, a kernel resource limit, and causes named in
prose or half-quoted. Texts are real reports' forms, each with its source."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.explain.matcher import analyse_text
from gpudoctor.knowledge import kb, notices

TRAILER = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
           "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
           "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})


def verdict_of(text: str) -> tuple[str | None, str | None, str | None]:
    """(entry id, platform id, unrecognised message) of what explain answers."""
    a = analyse_text(text)
    v = a.verdict
    return (v.id if v else None, a.platform.id if a.platform else None,
            a.unrecognised.message if a.unrecognised else None)


# --- other platforms --------------------------------------------------------------------------------

# (text, the platform, the entry that still applies there or None) -- sources in the comments.
PLATFORM_TEXTS = [
    # run-llama/llama_index#8743: Apple MPS out of memory; the CUDA allocator's advice does not apply
    ("RuntimeError: MPS backend out of memory (MPS allocated: 2.44 GB, other allocations: 4.34 GB, max allowed: "
     "6.77 GB). Tried to allocate 10.58 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable "
     "upper limit for memory allocations (may cause system failure).", "mps", None),
    # lshqqytiger/ZLUDA#138: a cuBLAS call ZLUDA does not implement
    ("Torch detected GPU: Radeon RX Vega [ZLUDA] VRAM 8176MB Arch 8.8 Cores 56\n"
     "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasSgemm( handle, opa, opb, m, n, k, "
     "&alpha, a, lda, b, ldb, &beta, c, ldc)`", "zluda", None),
    # pytorch/pytorch#190972: Intel XPU through Level Zero
    ("RuntimeError: level_zero backend failed with error: 40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)", "xpu", None),
    # etched-ai/open-oasis#27: ROCm without code for the card (fixed with HSA_OVERRIDE_GFX_VERSION)
    ("RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously reported at some "
     "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
     "AMD_SERIALIZE_KERNEL=3", "rocm", "no-kernel-image"),
    # the NPU caching allocator is CUDA's: the out-of-memory entry applies, with the NPU's own tools
    ("RuntimeError: NPU out of memory. Tried to allocate 5.03 GiB (NPU 3; 60.97 GiB total capacity; 53.20 GiB "
     "already allocated; 53.20 GiB current active; 1.36 GiB free; 58.57 GiB reserved in total by PyTorch)",
     "npu", "cuda-oom"),
    # an Intel XPU out-of-memory from torch's XPU allocator (intel/torch-xpu-ops#5046)
    ("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of "
     "16.48 GiB of which 16.07 GiB is free.", "xpu", "cuda-oom"),
    ("RuntimeError: synNodeCreateWithId failed for node: spatial_convolution with synStatus 26 [Generic failure].",
     "hpu", None),
    ("ModuleNotFoundError: No module named 'torch_mlu.core'", "mlu", None),
    ("RuntimeError: MUSA error: an illegal memory access was encountered", "musa", "illegal-memory-access"),
]


@pytest.mark.parametrize("text, platform, entry", PLATFORM_TEXTS, ids=[p + "-" + str(e) for _, p, e in PLATFORM_TEXTS])
def test_the_platform_is_recognised_and_only_entries_that_apply_there_are_verdicts(text, platform, entry):
    got_entry, got_platform, _ = verdict_of(text)
    assert (got_entry, got_platform) == (entry, platform)
    for m in analyse_text(text).matches:
        assert m.entry.applies_on(platform) or m.context_only, m.id


def test_an_mps_out_of_memory_gets_the_mps_advice_not_cudas():
    text = PLATFORM_TEXTS[0][0]
    r = invoke("explain", text)
    assert r.exit_code == 1  # no entry is the verdict
    out = r.stdout
    assert out.splitlines()[0] == "Not NVIDIA CUDA: Apple MPS (Metal)"
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in out and "PYTORCH_CUDA_ALLOC_CONF" not in out
    assert "cuda-oom  does not apply on mps" in out
    data = json.loads(invoke("explain", "--format", "json", text).stdout)
    assert data["schema_version"] == "1.3"
    assert data["verdict"]["kind"] == "platform" and data["verdict"]["id"] is None
    assert data["verdict"]["platform"] == "mps" and data["entry"] is None
    assert data["platform"]["cuda_entries_apply"] is False and data["platform"]["line"] == 1
    assert data["matches"][0]["not_on_platform"] == "mps" and data["matches"][0]["context_only"]
    md = invoke("explain", "--format", "md", text).stdout
    assert md.startswith("## Not NVIDIA CUDA: Apple MPS (Metal)") and "### What applies" in md
    quiet = invoke("explain", "-q", text).stdout.splitlines()
    assert quiet[0] == "mps  Not NVIDIA CUDA: Apple MPS (Metal)"


def test_a_platform_beside_an_entry_that_applies_there_accompanies_it():
    text = PLATFORM_TEXTS[3][0]
    r = invoke("explain", text)
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == "no-kernel-image"
    assert "Platform: AMD ROCm (HIP)" in r.stdout and "On AMD ROCm (HIP)" in r.stdout
    assert "HIP_LAUNCH_BLOCKING" in r.stdout and "HSA_OVERRIDE_GFX_VERSION" in r.stdout
    data = json.loads(invoke("explain", "--format", "json", text).stdout)
    assert data["verdict"]["kind"] == "entry" and data["verdict"]["platform"] == "rocm"
    assert data["platform"]["cuda_entries_apply"] is True
    async_match = next(m for m in data["matches"] if m["id"] == "async-error-reporting")
    assert async_match["not_on_platform"] == "rocm"


@pytest.mark.parametrize("line", [
    "ROCM used to build PyTorch: N/A",
    "HIP runtime version: N/A",
    "MIOpen runtime version: N/A",
    "Is XPU available: False",
    "No ROCm runtime is found, using ROCM_HOME='/opt/rocm'",
    "Is MPS available: False",
])
def test_environment_dumps_that_name_every_platform_name_none(line):
    text = "RuntimeError: CUDA error: misaligned address\n" + line + "\n"
    entry, platform, _ = verdict_of(text)
    assert (entry, platform) == ("misaligned-address", None)


def test_every_platform_notice_loads_and_every_entry_names_known_platforms():
    ids = set(notices.platform_ids())
    assert {"rocm", "zluda", "mps", "xpu", "npu", "hpu", "musa", "mlu"} <= ids
    for notice in notices.platforms():
        assert notice.steps and notice.references and notice.markers
        for marker in notice.markers:
            m = marker.regex  # compiles: a bad regex fails here
            assert m.pattern == marker.source
    assert notices.load(notices.UNRECOGNISED).steps
    for entry in kb.load_all():
        assert set(entry.platforms) <= ids | {notices.CUDA}, entry.id


def test_every_labelled_other_platform_text_keeps_its_label():
    """The held-out labels that name an entry on another platform (an NPU out-of-memory is
    cuda-oom: the same allocator and fix) stay right: the entry applies there."""
    from pathlib import Path

    for path in sorted((Path(__file__).parent / "fixtures" / "heldout").glob("*/*.txt")):
        label = path.parent.name
        analysis = analyse_text(path.read_text(encoding="utf-8").partition("\n")[2])
        if analysis.platform is not None and label != "none":
            assert analysis.verdict is not None and analysis.verdict.id == label, path.name


# --- a primary error no entry explains outranks the trailer ------------------------------------------


@pytest.mark.parametrize("text, message", [
    # Comfy-Org/ComfyUI#2931 (4x P100)
    ("RuntimeError: CUDA error: operation not supported\n" + TRAILER, "operation not supported"),
    # Comfy-Org/ComfyUI#4994: the whole trailer on the same line
    ("CUDA error: operation not supported CUDA kernel errors might be asynchronously reported at some other API "
     "call, so the stacktrace below might be incorrect. For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
     "operation not supported"),
    # index-tts/index-tts#677 (a title)
    ("torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing CUDA kernel errors "
     "might be asynchronously reported at some other API call, so the stacktrace below might be incorr",
     "operation not permitted when stream is capturing"),
    # a newer torch names the error's code on the next line
    ("torch.AcceleratorError: CUDA error: invalid argument\nSearch for `cudaErrorInvalidValue' in "
     "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n" + TRAILER,
     "invalid argument"),
    # the NCCL watchdog wraps it: the wrapper does not explain it either
    ("[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: CUDA error: "
     "operation not supported\n" + TRAILER, "operation not supported"),
])
def test_a_trailer_or_wrapper_never_outranks_an_unexplained_primary_error(text, message):
    entry, platform, unrecognised = verdict_of(text)
    assert (entry, platform, unrecognised) == (None, None, message)
    for m in analyse_text(text).matches:
        assert m.context_only and m.confidence <= 0.25


def test_the_unrecognised_error_is_said_with_generic_first_steps():
    text = "RuntimeError: CUDA error: operation not supported\n" + TRAILER
    r = invoke("explain", text)
    assert r.exit_code == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0] == "Unrecognised CUDA error: operation not supported"
    assert "line 1: RuntimeError: CUDA error: operation not supported" in r.stdout
    assert "First steps" in r.stdout and "CUDA_LAUNCH_BLOCKING=1" in r.stdout
    assert "async-error-reporting  context" in r.stdout
    data = json.loads(invoke("explain", "--format", "json", text).stdout)
    assert data["verdict"]["kind"] == "unrecognised" and data["verdict"]["error"] == "operation not supported"
    assert data["unrecognised"]["line"] == 1 and data["entry"] is None


def test_a_primary_error_an_entry_explains_keeps_that_entry():
    assert verdict_of("RuntimeError: CUDA error: misaligned address\n" + TRAILER)[0] == "misaligned-address"
    # A launch failure is the asynchronous-reporting entry's own reading (a kernel faulted earlier).
    assert verdict_of("RuntimeError: CUDA error: unspecified launch failure\n" + TRAILER)[0] == "async-error-reporting"
    # The trailer alone is still that entry.
    assert verdict_of(TRAILER)[0] == "async-error-reporting"


# --- hardware faults and kernel resource limits ----------------------------------------------------------


@pytest.mark.parametrize("text", [
    # jade-hpc-gpu/jade-hpc-gpu.github.io#194
    "RuntimeError: CUDA error: uncorrectable ECC error encountered\n" + TRAILER,
    # kohya-ss/sd-scripts#1434: the ECC error inside the NCCL watchdog too
    "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: CUDA error: "
    "uncorrectable ECC error encountered\n" + TRAILER,
    "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    "[30709s] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "Remapping Failure Occurred        : Yes",
])
def test_a_hardware_fault_is_named_as_one(text):
    assert verdict_of(text)[0] == "gpu-hardware-fault"
    assert all(m.context_only for m in analyse_text(text).matches if m.id == "async-error-reporting")


def test_application_xids_are_not_hardware():
    # Xid 31 is the GPU's MMU catching the program's illegal address: the program is at fault.
    text = ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000. MMU Fault: ENGINE GRAPHICS\n")
    assert verdict_of(text)[0] == "illegal-memory-access"
    assert verdict_of("NVRM: Xid (PCI:0000:08:00): 13, Graphics Exception")[0] is None


def test_the_hardware_verdict_names_the_xid_and_what_it_means():
    r = invoke("explain", "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")
    assert "Xid 79 in the kernel log: GPU has fallen off the bus" in r.stdout
    assert "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER" in r.stdout and "dcgmi diag -r 3" in r.stdout
    assert "CUDA_LAUNCH_BLOCKING=1 python" not in r.stdout


@pytest.mark.parametrize("text", [
    # vllm-project/vllm#12498
    "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 66560, Hardware limit: "
    "65536. Reducing block sizes or `num_stages` may help.",
    # inside torch.compile: the inner error decides
    "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nOutOfResources: out of resource: shared "
    "memory, Required: 131074, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.",
    # a hand-written kernel (HazyResearch/ThunderKittens#37)
    "[4090 attn] cudaCheckError(): too many resources requested for launch",
    "RuntimeError: CUDA error: too many resources requested for launch\n" + TRAILER,
])
def test_a_kernel_resource_limit_is_named_as_one(text):
    assert verdict_of(text)[0] == "kernel-resource-limit"


def test_the_resource_limit_verdict_quotes_both_numbers():
    r = invoke("explain", "triton.runtime.errors.OutOfResources: out of resource: shared memory, "
               "Required: 98304, Hardware limit: 49152. Reducing block sizes or `num_stages` may help.")
    assert "The kernel asked for 98304 bytes of shared memory; this GPU allows 49152 per block." in r.stdout


# --- the distinctive phrase is enough ---------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    # Lmy0217/PyTorch-aarch64#3 (Jetson Nano)
    ("I successfully install the torch on my jetson nano(Jetpack 4.4 [L4T 32.4.3]),but cuda.is_available() "
     "returns false", "cuda-unavailable"),
    ("torch.cuda.is_available() is False inside the container", "cuda-unavailable"),
    # naseemap47/streamlit-yolo#22 (a title)
    ("Cuda available: False, in jetson orin nx", "cuda-unavailable"),
    # pytorch/pytorch#168065 (GB200) and #160162 (GH200 / GB200)
    ("On aarch64, `pip install torch` resulted in the CPU version?", "cuda-unavailable"),
    ("if people use pytorch on GH200 / GB200 , their `pip install torch` will install the CPU version.",
     "cuda-unavailable"),
    # sgl-project/sglang#3784 (a title)
    ("[Bug] Watchdog caught collective operation timeout", "nccl-watchdog-timeout"),
    # VichyTong/CodeJudge#2 (a title without the colon)
    ("undefined symbol ncclCommRegister", "nccl-version-mismatch"),
])
def test_a_cause_named_in_prose_or_half_quoted_is_recognised(text, expected):
    assert verdict_of(text)[0] == expected


@pytest.mark.parametrize("text", [
    "Is CUDA available: False",  # collect_env's line: every dump carries it, whatever the failure
    "pip install torch installs the CPU version on my laptop",  # no aarch64 host: nothing to go on
    "if torch.cuda.is_available() else 'cpu'",  # code, not a finding
])
def test_near_misses_of_those_phrases_name_nothing(text):
    assert verdict_of(text)[0] is None


def test_a_pasted_text_reads_only_the_notices_it_can_name_and_answers_alike():
    """A pasted text (one chunk) reads only the platform notices whose marker keywords it holds
    (gpudoctor.knowledge.kbcache); the answer is the one every notice gives."""
    from pathlib import Path

    from gpudoctor.explain.matcher import Matcher

    texts = [t for t, _, _ in PLATFORM_TEXTS]
    texts += [p.read_text(encoding="utf-8").partition("\n")[2]
              for p in sorted((Path(__file__).parent / "fixtures" / "heldout").glob("*/r[456]-*.txt"))]
    for text in texts:
        lazy = analyse_text(text)
        full = Matcher()
        full.feed(text)
        matches = full.results()
        assert (lazy.platform.id if lazy.platform else None) == (full.platform.id if full.platform else None)
        assert [m.id for m in lazy.matches] == [m.id for m in matches]


def test_the_platform_table_in_the_docs_is_current(repo_root):
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("docs_tables", repo_root / "tools" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    page = (repo_root / "docs" / "explain.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- platforms:start -->\n(.*)<!-- platforms:end -->", page, re.S)
    assert block, "docs/explain.md lost its platforms markers"
    assert block.group(1) == tables.platforms_table(), "stale table: run python tools/docs_tables.py"
