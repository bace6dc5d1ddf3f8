"""Tests for `gpudoctor.check_module`: seed 002's fp32 adapter inside a bf16 model, integer buffers
that are not mismatches, a meta-device parameter, a clean model; then the suggested fix is applied
and the model must check clean and run forward. Before/after: the broken model really raises the
dtype error, and the naive Parameter reassignment really raises the TypeError the fix warns about."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import gpudoctor
from gpudoctor.scan.modcheck import ModuleCheck, check_module


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.bn = nn.BatchNorm1d(dim)  # buffers: running stats (float), num_batches_tracked (int64)
        self.register_buffer("pos_ids", torch.arange(8))  # int64 buffer: never a dtype mismatch
        self.adapter: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.attn(x))
        if self.adapter is not None:
            x = x + self.adapter(x)
        return x


class Model(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim) for _ in range(2)])
        self.token = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token
        for block in self.blocks:
            x = block(x)
        return x


def _seed_002_model() -> Model:
    model = Model().to(torch.bfloat16)
    # Added after the pipeline converted the model: created in the default fp32.
    model.blocks[1].adapter = nn.Sequential(nn.SiLU(), nn.Linear(16, 16))
    return model


def test_exported_lazily_from_the_package():
    assert gpudoctor.check_module is check_module


def test_clean_model_has_no_mismatches():
    result = check_module(Model().to(torch.bfloat16))
    assert isinstance(result, ModuleCheck)
    assert result.ok and result.mismatches == () and result.kb_ids == ()
    assert result.reference_dtype == torch.bfloat16
    assert result.reference_device == torch.device("cpu")
    assert result.fix_kwargs() == {} and result.fixes() == ()
    assert "no dtype or device mismatches" in str(result)
    with pytest.raises(AttributeError):
        result.mismatches = ()  # frozen


def test_fp32_adapter_in_bf16_model_is_named():
    model = _seed_002_model()
    result = check_module(model)
    assert result.reference_dtype == torch.bfloat16
    assert [(m.name, m.kind, m.attribute, m.found, m.expected) for m in result.mismatches] == [
        ("blocks.1.adapter.1.weight", "parameter", "dtype", "torch.float32", "torch.bfloat16"),
        ("blocks.1.adapter.1.bias", "parameter", "dtype", "torch.float32", "torch.bfloat16"),
    ]
    assert result.kb_ids == ("dtype-mismatch",)
    assert result.mismatches[0].numel == 256 and result.mismatches[0].module_path == "blocks.1.adapter.1"
    # Integer buffers are present and ignored for dtype.
    names = {n for n, _ in model.named_buffers()}
    assert {"blocks.0.pos_ids", "blocks.0.bn.num_batches_tracked"} <= names
    text = str(result)
    assert "blocks.1.adapter.1.weight" in text and "[dtype-mismatch]" in text
    assert "model.to(dtype=torch.bfloat16)" in text
    assert "parameter-reassign" in text


def test_majority_is_by_element_count_not_tensor_count():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(2, 2).to(torch.float16), nn.Linear(2, 2).to(torch.float16))
    result = check_module(model)
    assert result.reference_dtype == torch.float32
    assert {m.name for m in result.mismatches} == {"1.weight", "1.bias", "2.weight", "2.bias"}


def test_float_buffer_mismatch_is_reported_int_buffer_is_not():
    model = Model().to(torch.bfloat16)
    model.blocks[0].register_buffer("scale", torch.ones(4))  # float32 buffer in a bf16 model
    result = check_module(model)
    assert [(m.name, m.kind) for m in result.mismatches] == [("blocks.0.scale", "buffer")]


def test_before_and_after_the_suggested_fix():
    model = _seed_002_model()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):
        model(x)
    result = check_module(model)
    assert result.fix_kwargs() == {"dtype": torch.bfloat16}
    model.to(**result.fix_kwargs())
    assert check_module(model).ok
    out = model(x)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 16)


def test_parameter_reassignment_raises_as_the_fix_warns():
    model = Model()
    with pytest.raises(TypeError, match=r"cannot assign 'torch\.BFloat16Tensor' as parameter 'token' "
                                        r"\(torch\.nn\.Parameter or None expected\)"):
        model.token = model.token.to(torch.bfloat16)
    # The documented alternative works and checks clean.
    model.token.data = model.token.data.to(torch.bfloat16)
    assert [m.name for m in check_module(model).mismatches] == ["token"]  # rest is still fp32
    model.to(torch.bfloat16)
    assert check_module(model).ok


def test_meta_parameter_is_a_device_mismatch_and_to_empty_fixes_it():
    model = Model()
    model.blocks[0].adapter = nn.Linear(16, 16, device="meta")
    result = check_module(model)
    assert result.reference_device == torch.device("cpu")
    assert [(m.name, m.attribute, m.found, m.kb_id) for m in result.mismatches] == [
        ("blocks.0.adapter.weight", "device", "meta", "device-mismatch"),
        ("blocks.0.adapter.bias", "device", "meta", "device-mismatch"),
    ]
    # model.to() cannot help meta tensors: the fix says to_empty, through get_submodule.
    assert result.fix_kwargs() == {}
    assert result.fixes()[0].startswith("model.get_submodule('blocks.0.adapter').to_empty(device='cpu')")
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        model.to("cpu")
    adapter = model.get_submodule("blocks.0.adapter")
    adapter.to_empty(device="cpu")
    adapter.reset_parameters()
    assert check_module(model).ok
    assert torch.isfinite(model(torch.randn(2, 16))).all()


def test_model_without_tensors():
    result = check_module(nn.ReLU())
    assert result.ok and result.reference_dtype is None and result.reference_device is None
    assert result.parameters == 0 and result.buffers == 0


@pytest.mark.gpu
def test_cpu_parameter_in_cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    model = Model().cuda()
    model.blocks[1].adapter = nn.Linear(16, 16)
    result = check_module(model)
    assert {m.name for m in result.mismatches} == {"blocks.1.adapter.weight", "blocks.1.adapter.bias"}
    model.to(**result.fix_kwargs())
    assert check_module(model).ok
