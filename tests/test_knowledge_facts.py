"""Facts the knowledge base states, checked against the tools and the torch that decide them.

An entry that says what nvcc embeds, which layout SDPA returns or what the deprecated sdp_kernel
shim enables is only as good as that claim: these tests build with nvcc and read the result back,
run SDPA (and its CUDA kernels' meta registrations) on the CPU, and compare the shim with the
entry's patch, so that a wrong statement fails here rather than in a user's hands.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import pytest

from gpudoctor.knowledge import kb
from gpudoctor.scan.fatbin import CodeTarget, coverage, read_fatbin
from gpudoctor.lint import archflags

# The GPUs a build "for today's GPUs" must serve: A100, RTX 30xx, RTX 40xx/L4, H100/H200, B200,
# B300, RTX 50xx, DGX Spark.
CURRENT = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]
KERNEL = "__global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n"


def _nvcc_version() -> tuple[int, int]:
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(flags) -> the CodeTargets nvcc really embedded in an object built with them."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    root = tmp_path_factory.mktemp("nvcc")
    (root / "k.cu").write_text(KERNEL)
    cache: dict[str, set[CodeTarget]] = {}

    def run(flags: list[str]) -> set[CodeTarget]:
        key = " ".join(flags)
        if key not in cache:
            out = root / f"k{len(cache)}.o"
            proc = subprocess.run(["nvcc", *flags, "-c", str(root / "k.cu"), "-o", str(out)],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            report = read_fatbin(out)
            assert report.error is None, report.error
            cache[key] = set(report.targets)
        return cache[key]

    return run


def names(targets) -> set[str]:
    return {t.name for t in targets}


def runs(targets, cap) -> bool:
    return coverage(targets, cap).ok


# --- no-kernel-image: what nvcc embeds -----------------------------------------------------------


@pytest.mark.nvcc
def test_a_lone_arch_flag_embeds_ptx_and_runs_on_newer_gpus(build):
    entry = kb.load_entry("no-kernel-image")
    lone = build(["-arch=sm_86"])
    assert names(lone) == {"sm_86", "compute_86"}
    assert all(runs(lone, cap) for cap in [(8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
    assert not runs(lone, (8, 0))
    # ... while the -gencode spelling of "8.6" (what TORCH_CUDA_ARCH_LIST="8.6" becomes) has none.
    sass_only = build(["-gencode", "arch=compute_86,code=sm_86"])
    assert names(sass_only) == {"sm_86"}
    assert [cap for cap in CURRENT if runs(sass_only, cap)] == [(8, 6), (8, 9)]
    assert build(["-arch=compute_86", "-code=sm_86"]) == sass_only
    # The entry says so, and no longer says the opposite.
    blob = " ".join(entry.why) + " ".join(m.truth for m in entry.misconceptions)
    assert "compute_86 PTX" in blob and "[sm_86,compute_86]" in blob
    assert not any("`-arch=sm_86` embeds SASS for compute capability 8.6 only" in m.truth
                   for m in entry.misconceptions)


@pytest.mark.nvcc
def test_arch_specific_targets_run_on_one_gpu_only(build):
    specific = build(["-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]"])
    assert names(specific) == {"sm_90a", "compute_90a"}
    assert [cap for cap in CURRENT if runs(specific, cap)] == [(9, 0)]
    b200 = build(["-gencode", "arch=compute_100a,code=sm_100a"])
    assert [cap for cap in CURRENT if runs(b200, cap)] == [(10, 0)]  # not the B300 (10.3)
    family = build(["-gencode", "arch=compute_100f,code=sm_100f"])
    assert [cap for cap in CURRENT if runs(family, cap)] == [(10, 0), (10, 3)]


@pytest.mark.nvcc
def test_the_arch_specific_shorthand_adds_generic_ptx_in_nvcc_13(build):
    """`-arch=sm_90a` embeds compute_90 PTX besides sm_90a and compute_90a (nvcc 13.0), so it
    JITs on newer GPUs; the entry states this for nvcc 13.0 and the lint does not flag it."""
    if _nvcc_version() < (13, 0):
        pytest.skip("the generic PTX of -arch=sm_90a is checked on nvcc 13.0 and later")
    shorthand = build(["-arch=sm_90a"])
    assert names(shorthand) == {"sm_90a", "compute_90a", "compute_90"}
    assert all(runs(shorthand, cap) for cap in CURRENT if cap >= (9, 0))


@pytest.mark.nvcc
def test_the_patch_serves_every_current_gpu_and_the_old_flags_do_not(build):
    """The entry's own patch: its `-` flags fail where its comment says, its `+` flags run on
    every current GPU (A100 to RTX 50xx and DGX Spark)."""
    patch = kb.load_entry("no-kernel-image").patch

    def flags(sign: str) -> list[str]:
        lines = [ln[1:] for ln in patch.splitlines() if ln.startswith(sign)]
        words = re.findall(r'"(-gencode|arch=[^"]+|-arch=[^"]+)"', "\n".join(lines))
        assert words, f"no nvcc flags on the {sign!r} lines of the patch"
        return words

    before, after = build(flags("-")), build(flags("+"))
    assert [cap for cap in CURRENT if not runs(before, cap)] == [(8, 0), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]
    assert all(runs(after, cap) for cap in CURRENT), {cap: coverage(after, cap).describe() for cap in CURRENT}
    assert any(t.kind == "ptx" and t.sm == 120 for t in after), "PTX for GPUs after sm_120"


def test_the_recommended_arch_lists_serve_every_current_gpu():
    """Every TORCH_CUDA_ARCH_LIST the entry and GPU006 recommend covers A100 to RTX 50xx (a list
    like "8.6;9.0;12.0+PTX" leaves the B200 without a kernel: PTX only runs on newer GPUs)."""
    from gpudoctor.lint import rules

    entry = kb.load_entry("no-kernel-image")
    texts = [*entry.fix, rules.BY_CODE["GPU006"].fix, rules.BY_CODE["GPU006"].why]
    lists = {m for text in texts for m in re.findall(r'TORCH_CUDA_ARCH_LIST=\\?"([0-9.;+PTX]+)\\?"', text)}
    lists = {v for v in lists if len(v.split(";")) > 1}  # the recommendations, not the "8.6" example
    assert lists
    for value in lists:
        t = archflags.torch_arch_targets([archflags.Tok(value, 0)])
        targets = [CodeTarget(n // 10, n % 10, "sass") for n in t.sass] + \
                  [CodeTarget(n // 10, n % 10, "ptx") for n in t.ptx]
        missing = [cap for cap in CURRENT if not runs(targets, cap)]
        assert not missing, f"TORCH_CUDA_ARCH_LIST={value} has no kernel for {missing}"


# --- attention-oom / view-stride: the layout of SDPA's output --------------------------------------

torch_only = pytest.mark.torch


def _torch():
    return pytest.importorskip("torch")


def _bnhd_strides(B, H, N, D):
    """Strides of a (B, H, N, D) view of a contiguous (B, N, H, D) buffer."""
    return (N * H * D, D, H * D, 1)


@torch_only
def test_sdpa_output_follows_the_query_layout_on_the_cpu():
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn import functional as F

    B, N, H, D = 2, 16, 4, 8
    torch.manual_seed(0)
    # The usual projection code: (B, N, H*D) -> (B, N, H, D) -> transpose to (B, H, N, D).
    q, k, v = (torch.randn(B, N, H * D).view(B, N, H, D).transpose(1, 2) for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fused = F.scaled_dot_product_attention(q, k, v)
    with sdpa_kernel([SDPBackend.MATH]):
        math = F.scaled_dot_product_attention(q, k, v)
    assert fused.stride() == _bnhd_strides(B, H, N, D) and not fused.is_contiguous()
    assert math.is_contiguous()
    torch.testing.assert_close(fused, math)
    # So the same .view works on one backend and not on the other; reshape works on both.
    fused.transpose(1, 2).view(B, N, H * D)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        math.transpose(1, 2).view(B, N, H * D)
    torch.testing.assert_close(fused.transpose(1, 2).reshape(B, N, H * D),
                               math.transpose(1, 2).reshape(B, N, H * D))


@torch_only
def test_the_cuda_kernels_output_layouts_from_torchs_meta_registrations():
    """torch's meta kernels (what torch.compile and FakeTensor trust about the CUDA kernels):
    flash and cuDNN follow the query, memory-efficient always returns (B, N, H, D) memory."""
    torch = _torch()
    ops = torch.ops.aten
    B, N, H, D = 2, 16, 4, 8
    contiguous = torch.empty(B, H, N, D, device="meta")
    transposed = torch.empty(B, N, H, D, device="meta").transpose(1, 2)
    efficient = getattr(ops, "_scaled_dot_product_efficient_attention", None)
    flash = getattr(ops, "_scaled_dot_product_flash_attention", None)
    cudnn = getattr(ops, "_scaled_dot_product_cudnn_attention", None)
    if efficient is None or flash is None:
        pytest.skip("this torch has no SDPA CUDA ops")
    for q in (contiguous, transposed):
        assert efficient(q, q, q, None, False)[0].stride() == _bnhd_strides(B, H, N, D)
        assert flash(q, q, q)[0].stride() == q.stride()
        if cudnn is not None:
            assert cudnn(q, q, q, None, False)[0].stride() == q.stride()
    entry = kb.load_entry("attention-oom")
    truths = " ".join(m.truth for m in entry.misconceptions)
    assert "memory-efficient" in truths and "query's layout" in truths and ".reshape()" in truths
    assert "in the common cases" not in truths


# --- sdp-kernel-deprecated: the patch is the shim ---------------------------------------------------


@torch_only
def test_the_sdp_kernel_patch_enables_exactly_what_the_shim_enables():
    torch = _torch()
    cuda = torch.backends.cuda
    if not hasattr(cuda, "sdp_kernel") or not hasattr(cuda, "cudnn_sdp_enabled"):
        pytest.skip("this torch has no sdp_kernel shim with cuDNN")
    from torch.nn import functional as real_F

    seen: list[tuple[bool, bool, bool, bool]] = []

    class RecordingF:
        """F whose SDPA records which backends are enabled when it is called."""

        def __getattr__(self, name):
            return getattr(real_F, name)

        @staticmethod
        def scaled_dot_product_attention(*args, **kwargs):
            seen.append((cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                         cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled()))
            return real_F.scaled_dot_product_attention(*args, **kwargs)

    patch = kb.load_entry("sdp-kernel-deprecated").patch
    before, after = patch.split("# --- after ---")
    outputs = []
    for code in (before.split("# --- before ---")[1], after):
        namespace = {"torch": torch, "nn": torch.nn, "F": RecordingF()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            exec(compile(code, "<patch>", "exec"), namespace)
        outputs.append(namespace["out"])
    assert len(seen) == 2
    assert seen[0] == seen[1], f"shim enables (flash, efficient, math, cudnn)={seen[0]}, the patch {seen[1]}"
    assert seen[0][3], "the shim keeps cuDNN on unless enable_cudnn=False"
    torch.testing.assert_close(outputs[0], outputs[1])
