"""Proof by reproduction, on the CPU: a script of several modules (the bad value made in one file,
the failure in another) fails; `gpudoctor run` prints the diff of the user's file and the command
that applies it; running that command changes the files exactly as the diff said; the script then
runs clean, and gives the numbers the field notes' own fix gives (or the fix written by hand).

The misaligned address of the talking-video model is a CUDA failure that no CPU reproduces: its
recorded traceback goes through `explain`, and the proof is that the patched model does no tensor
arithmetic on the shape values any more (the kernels and the synchronisation that reported the
earlier failure there) and computes the same video."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import gpudoctor, needs_torch
from test_patch import FIXTURES, apply_diff, copy, lint_command

pytestmark = needs_torch


def python(root: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=300)


def last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.strip().splitlines()[-1]


# The field note's own fix of the video DiT: every new module converted at the end of the method
# that creates it, the parameter by reassignment (which is the next failure).
NOTES_CONVERSION = """
        # convert every new module to the dtype and device of the main model
        ref_param = next(self.blocks[0].parameters())
        target_dtype = ref_param.dtype
        target_device = ref_param.device
        self.latent_bridge = self.latent_bridge.to(dtype=target_dtype, device=target_device)
        self.token_camera = self.token_camera.to(dtype=target_dtype, device=target_device)
        for i, block in enumerate(self.geo_blocks):
            self.geo_blocks[i] = block.to(dtype=target_dtype, device=target_device)
"""


def notes_conversion(root: Path) -> None:
    dit = root / "diffsynth" / "models" / "wan_video_dit.py"
    last = "        self.geo_blocks = nn.ModuleList([GeoDiTBlock(self.blocks[i], self.dim) for i in range(split_layer)])\n"
    assert last in dit.read_text()
    dit.write_text(dit.read_text().replace(last, last + NOTES_CONVERSION))


def fail_patch_apply_clean(tmp_path: Path, name: str, argv: list[str], entry: str, rule: str,
                           applicability: str, prepare=None) -> tuple[Path, dict, str]:
    """The whole cycle; returns the copy, the patch (run.json's) and the clean run's last line."""
    root = copy(tmp_path, name)
    if prepare is not None:
        prepare(root)
    failed = python(root, *argv)
    assert failed.returncode != 0, failed.stdout
    r = gpudoctor("run", "-o", str(tmp_path / "run.json"), "--", sys.executable, *argv, cwd=str(root))
    assert r.returncode == failed.returncode
    err = r.stderr.decode()
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["schema_version"] == "1.3" and record["diagnosis"]["entry"]["id"] == entry
    code = record["diagnosis"]["code_patch"]
    assert code["status"] == "found", code
    [patch] = [p for p in code["patches"] if p["diff"]]
    assert (patch["rule"], patch["applicability"]) == (rule, applicability)
    # what the terminal showed: the diff, and the command
    assert f"Patch for {', '.join(patch['files'])}" in err
    assert all(line in err for line in patch["diff"].splitlines() if line.startswith(("+", "-")))
    command = re.search(r"Apply it: (.+)", err).group(1).strip()
    assert command == patch["command"]
    expected = apply_diff(root, patch["diff"])
    fixed = lint_command(command, root)
    assert fixed.returncode == 0, fixed.stderr
    for path, text in expected.items():
        assert (root / path).read_text() == text, path
    clean = python(root, *argv)
    assert clean.returncode == 0, clean.stderr[-2000:]
    return root, patch, last_line(clean)


def test_dtype_mismatch_of_modules_built_after_the_cast(tmp_path):
    """The video DiT's late branch: the diff converts each new module to the dtype and device of
    the weights the model has, which is what the note's own fix does at the end of the method."""
    _, patch, ours = fail_patch_apply_clean(tmp_path / "a", "fantasy_world", ["train.py"], "dtype-mismatch",
                                             "GPU011", "unsafe")
    assert patch["file"] == "diffsynth/models/wan_video_dit.py" and "train.py" in patch["command"]
    assert patch["diff"].count(".to(device=ref_param.device, dtype=ref_param.dtype)") == 3
    assert "where the module is created after the model was cast" in patch["where"]
    # the note's fix (convert every new module at the end of the method), its parameter made to
    # work by the next test's patch, gives the same video
    _, _, notes = fail_patch_apply_clean(tmp_path / "b", "fantasy_world", ["train.py"],
                                         "parameter-reassign", "GPU005", "safe", notes_conversion)
    assert ours == notes and ours.startswith("ok (1, 8, 32) torch.bfloat16 ")


def test_parameter_reassigned_by_the_conversion(tmp_path):
    """The note's own fix of the video DiT reassigns a parameter with a converted plain tensor."""
    _, patch, _ = fail_patch_apply_clean(tmp_path, "fantasy_world", ["train.py"], "parameter-reassign",
                                         "GPU005", "safe", notes_conversion)
    assert patch["where"] == f"The patch changes line {patch['lines'][0]}, the line the traceback stops at."
    assert "+        self.token_camera.data = self.token_camera.data.to(dtype=target_dtype, device=target_device)" \
        in patch["diff"]


def test_deprecated_sdp_kernel_as_an_error(tmp_path):
    """-W error::FutureWarning turns the deprecation into the failure; the patched attention
    computes the same video as the deprecated shim did."""
    warned = python(copy(tmp_path / "warned", "controlvideo_sdpa"), "inference.py")
    assert warned.returncode == 0 and "sdp_kernel()` is deprecated" in warned.stderr
    _, patch, clean = fail_patch_apply_clean(tmp_path / "strict", "controlvideo_sdpa",
                                             ["-W", "error::FutureWarning", "inference.py"],
                                             "sdp-kernel-deprecated", "GPU002", "safe")
    assert "+        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):" \
        in patch["diff"]
    assert clean == last_line(warned)


def test_view_after_transpose_in_another_module(tmp_path):
    """The attention lab's reference: the tensor is made and multiplied in one module and merged
    back with .view() in another; the diff gives what `.contiguous().view()` by hand gives."""
    root, patch, clean = fail_patch_apply_clean(tmp_path / "a", "fa_lab", ["bench.py"], "view-stride", "GPU003", "safe")
    assert patch["command"] == "gpudoctor lint --fix --select GPU003 fa/layout.py"
    by_hand = copy(tmp_path / "b", "fa_lab")
    layout = by_hand / "fa" / "layout.py"
    layout.write_text(layout.read_text().replace(".transpose(1, 2).view(", ".transpose(1, 2).contiguous().view("))
    assert clean == last_line(python(by_hand, "bench.py")) and clean.startswith("reference (2, 16, 64) ")


def test_strided_view_into_a_kernel_that_checks(tmp_path):
    """The Mamba-style mixer hands the convolution's (batch, length, channels) view, a transpose,
    to a fused RMSNorm launcher that asserts its input is contiguous, in another module. The
    diff makes the argument dense at the call, which is what `.contiguous()` by hand gives, and the
    launcher's numbers are those of torch's own RMSNorm."""
    root, patch, clean = fail_patch_apply_clean(tmp_path / "a", "mamba_norm", ["run.py"], "noncontiguous-kernel-input",
                                                "GPU012", "unsafe")
    assert patch["file"] == "model/mixer.py" and "kernels/rms_norm.py" in patch["command"]
    by_hand = copy(tmp_path / "b", "mamba_norm")
    mixer = by_hand / "model" / "mixer.py"
    mixer.write_text(mixer.read_text().replace("rms_norm_fwd(h.transpose(1, 2),", "rms_norm_fwd(h.transpose(1, 2).contiguous(),"))
    assert clean == last_line(python(by_hand, "run.py")) and clean.startswith("ok (2, 12, 16) ")
    reference = copy(tmp_path / "c", "mamba_norm")
    mixer = reference / "model" / "mixer.py"
    mixer.write_text(mixer.read_text().replace(
        "rms_norm_fwd(h.transpose(1, 2), self.norm_weight)",
        "torch.nn.functional.rms_norm(h.transpose(1, 2), (16,), self.norm_weight, 1e-6)"))
    assert abs(float(clean.split()[-1]) - float(last_line(python(reference, "run.py")).split()[-1])) < 1e-3


_COUNT = '''
import torch
from torch.overrides import TorchFunctionMode

from wan.modules.multitalk_model import WanModel

ARITHMETIC = {"__mul__", "__rmul__", "mul", "__add__", "__radd__", "__floordiv__", "__rfloordiv__",
              "floor_divide", "__truediv__", "__rtruediv__"}


class Count(TorchFunctionMode):
    n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ARITHMETIC and any(
                isinstance(a, torch.Tensor) and a.dim() == 0 for a in args):
            Count.n += 1
        return func(*args, **(kwargs or {}))


torch.manual_seed(0)
model = WanModel().eval()
latents = [torch.randn(4, 3, 4, 4)]
audio = torch.randn(3, 5, 16)
with torch.no_grad(), Count():
    video = model(latents, audio)
print(Count.n, float(video.sum()))
'''


def test_shape_tensors_in_arithmetic_from_the_recorded_traceback(tmp_path, monkeypatch):
    from test_patch import explain_json

    root = copy(tmp_path, "multitalk")
    (root / "count.py").write_text(_COUNT)
    before = last_line(python(root, "count.py")).split()
    assert int(before[0]) > 0  # the shape values are 0-d tensors: tensor arithmetic (a kernel each on CUDA)
    patch = explain_json(root, "traceback.txt", monkeypatch)["code_patch"]["patches"][0]
    expected = apply_diff(root, patch["diff"])
    assert lint_command(patch["command"], root).returncode == 0
    assert (root / "wan/modules/attention.py").read_text() == expected["wan/modules/attention.py"]
    after = last_line(python(root, "count.py")).split()
    assert after == ["0", before[1]]  # no arithmetic on tensors left, the same video
    # the note's own fix (int() of each value in the callee) is the same conversion at the same line
    by_hand = shutil.copytree(FIXTURES / "multitalk", tmp_path / "by_hand")
    attention = by_hand / "wan/modules/attention.py"
    attention.write_text(attention.read_text().replace(
        "        N_t, N_h, N_w = shape\n",
        "        N_t, N_h, N_w = shape\n"
        "        N_t = int(N_t) if isinstance(N_t, torch.Tensor) else int(N_t)\n"
        "        N_h = int(N_h) if isinstance(N_h, torch.Tensor) else int(N_h)\n"
        "        N_w = int(N_w) if isinstance(N_w, torch.Tensor) else int(N_w)\n"))
    (by_hand / "count.py").write_text(_COUNT)
    assert last_line(python(by_hand, "count.py")).split() == after


@pytest.mark.parametrize("name", ["fantasy_world", "controlvideo_sdpa", "fa_lab", "mamba_norm"])
def test_the_fixtures_are_untouched_by_the_tests(name):
    """The cycle runs on copies: the fixtures still hold the bugs."""
    text = "\n".join(p.read_text() for p in (FIXTURES / name).rglob("*.py"))
    assert "ref_param.device, dtype=ref_param.dtype" not in text and "sdpa_kernel(" not in text
    assert ".data = self.token_camera.data" not in text and ".transpose(1, 2).reshape(B, N, H * d)" not in text
    assert ".transpose(1, 2).contiguous()" not in text
