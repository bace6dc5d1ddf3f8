"""Before/after reproductions on the CPU. For every entry whose failure reproduces without a GPU:
run the entry's own "before" fragment and capture the real torch error (or warning), check the
entry's own patterns recognise that exact message, run the entry's own "after" fragment, and
compare its numbers with an independent reference."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from gpudoctor.knowledge import kb  # noqa: E402
from gpudoctor.explain.matcher import Matcher  # noqa: E402


def halves(entry_id: str) -> tuple[str, str]:
    entry = kb.load_entry(entry_id)
    assert entry is not None and entry.patch_lang == "python"
    before, sep, after = entry.patch.partition("# --- after ---")
    assert sep and "# --- before ---" in before, f"{entry_id}: patch needs before/after markers"
    return before.split("# --- before ---", 1)[1], after


def recognised(entry_id: str, message: str) -> bool:
    matcher = Matcher([kb.load_entry(entry_id)])
    matcher.feed(message + "\n")
    return [m.id for m in matcher.results()] == [entry_id]


def run(code: str, **names) -> dict:
    namespace = {"torch": torch, "nn": nn, "F": F, **names}
    exec(compile(code, "<patch>", "exec"), namespace)
    return namespace


def reproduce(entry_id: str, error: type[BaseException], **names) -> dict:
    before, after = halves(entry_id)
    with pytest.raises(error) as info:
        run(before, **names)
    message = f"{type(info.value).__name__}: {info.value}"
    assert recognised(entry_id, message), f"{entry_id} does not recognise torch's own message: {message}"
    return run(after, **names)


def test_dtype_mismatch():
    ns = reproduce("dtype-mismatch", RuntimeError)
    head, x, out = ns["head"], ns["x"], ns["out"]
    assert out.dtype == x.dtype == torch.bfloat16
    reference = x.double() @ head.weight.double().t() + head.bias.double()
    torch.testing.assert_close(out.double(), reference, rtol=2e-2, atol=2e-2)


def test_parameter_reassign():
    ns = reproduce("parameter-reassign", TypeError)
    module = ns["m"]
    params = dict(module.named_parameters())
    assert params and all(isinstance(p, nn.Parameter) for p in params.values()), "fix must keep the Parameter"
    (param,) = params.values()
    torch.manual_seed(0)
    reference = torch.randn(4).to(param.dtype) * 2
    torch.testing.assert_close(ns["out"], reference)


def test_view_stride():
    ns = reproduce("view-stride", RuntimeError)
    x, out = ns["x"], ns["out"]
    assert not x.is_contiguous()
    reference = torch.tensor(x.tolist()).flatten(start_dim=1)  # logical order, no view machinery
    torch.testing.assert_close(out, reference.reshape(out.shape))


def test_device_mismatch_with_the_meta_device():
    # The weights live on "meta" (the CPU-only stand-in for an accelerator), the input on the CPU.
    # A message that names the meta device is a meta-tensor case (weights never loaded), and the
    # knowledge base decides so from the device in the text, not from the words "same device".
    before, after = halves("device-mismatch")
    with pytest.raises(RuntimeError) as info:
        run(before, device=torch.device("meta"))
    matcher = Matcher(kb.load_all())
    matcher.feed(f"RuntimeError: {info.value}\n")
    best = matcher.results()[0]
    assert best.id == "meta-tensor" and any("meta device" in d for d in best.decided_by), info.value
    ns = run(after, device=torch.device("meta"))
    assert ns["out"].device.type == "meta"
    # The same fix on a real device gives the right numbers.
    cpu = run(halves("device-mismatch")[1], device=torch.device("cpu"))
    model, x = cpu["model"], cpu["x"]
    torch.testing.assert_close(cpu["out"], x @ model.weight.t() + model.bias)


def test_sdp_kernel_deprecated():
    before, after = halves("sdp-kernel-deprecated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = run(before)
    deprecations = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert deprecations, "torch.backends.cuda.sdp_kernel no longer warns: update the entry"
    message = f"FutureWarning: {deprecations[0].message}"
    assert recognised("sdp-kernel-deprecated", message), message
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the fix must not warn
        new = run(after)
    torch.testing.assert_close(new["out"], old["out"])


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor any aten op produced: the score matrix, for naive attention."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_attention_oom_scaled_down():
    before, after = halves("attention-oom")
    with LargestAllocation() as naive_mode:
        naive = run(before)
    with LargestAllocation() as fused_mode:
        fused = run(after)
    q, k = naive["query"], naive["key"]
    score_bytes = q.shape[0] * q.shape[1] * k.shape[1] * q.element_size()
    assert naive_mode.largest >= score_bytes, "the naive path materialises the (B*H, N, M) scores"
    assert fused_mode.largest < score_bytes, "the fused path must not"
    torch.testing.assert_close(fused["out"], naive["out"], rtol=1e-5, atol=1e-5)
    # And the seed's out-of-memory text for it is recognised as attention-oom.
    text = ("    attention_scores = torch.baddbmm(\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
            "capacity of 31.36 GiB of which 20.11 GiB is free.")
    matcher = Matcher(kb.load_all())
    matcher.feed(text)
    assert matcher.results()[0].id == "attention-oom"
