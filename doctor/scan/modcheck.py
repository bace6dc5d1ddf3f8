"""`gpudoctor.check_module(model)`: find parameters and buffers whose dtype or device differs from
the rest of an `nn.Module`.

Seed 002: adapters built in fp32 inside a bf16 model, found only when a Linear raised "mat1 and mat2
must have the same dtype, but got BFloat16 and Float". The reference dtype is the majority among
floating-point parameters, counted by number of elements; the reference device is the majority
among all parameters and buffers. Integer and bool buffers (position ids, BatchNorm's
num_batches_tracked, masks) are never dtype mismatches: `module.to(dtype=...)` leaves them alone too.

The fix is one `module.to(dtype=..., device=...)` after construction. Reassigning a Parameter
attribute with `self.p = self.p.to(...)` does not work: `Parameter.to()` returns a plain Tensor and
`nn.Module.__setattr__` raises "cannot assign 'torch.FloatTensor' as parameter 'p'
(torch.nn.Parameter or None expected)" (knowledge base `parameter-reassign`); `p.data =
p.data.to(...)` or `module.to(...)` is the way. Parameters on the meta device hold no data:
`module.to_empty(device=...)` and then initialising or loading the weights is their fix.

The result is a frozen object; `str()` of it is a readable report. Nothing here prints.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["Mismatch", "ModuleCheck", "check_module"]


@dataclass(frozen=True)
class Mismatch:
    """One tensor that disagrees with the model's reference dtype or device."""

    name: str  # qualified name, as in named_parameters() / named_buffers()
    kind: str  # "parameter" or "buffer"
    attribute: str  # "dtype" or "device"
    found: str  # e.g. "torch.float32", "meta"
    expected: str
    numel: int
    kb_id: str  # "dtype-mismatch" or "device-mismatch"

    @property
    def module_path(self) -> str:
        """The owning submodule's qualified name ("" for the root)."""
        return self.name.rpartition(".")[0]


@dataclass(frozen=True)
class ModuleCheck:
    """What `check_module` found. `reference_dtype` / `reference_device` are torch objects (None
    when the model has no floating tensors / no tensors at all)."""

    model: str  # the model's class name
    reference_dtype: Any
    reference_device: Any
    mismatches: tuple[Mismatch, ...]
    parameters: int  # number of parameter tensors inspected
    buffers: int

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def kb_ids(self) -> tuple[str, ...]:
        return tuple(sorted({m.kb_id for m in self.mismatches}))

    def fix_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the one `model.to(**kwargs)` call that fixes the dtype and
        (non-meta) device mismatches; empty when there is nothing to fix that way."""
        kwargs: dict[str, Any] = {}
        if any(m.attribute == "dtype" for m in self.mismatches):
            kwargs["dtype"] = self.reference_dtype
        if any(m.attribute == "device" and m.found != "meta" for m in self.mismatches):
            kwargs["device"] = self.reference_device
        return kwargs

    def fixes(self) -> tuple[str, ...]:
        """The suggested fixes, as lines of code and advice."""
        if self.ok:
            return ()
        lines = []
        # Meta tensors first: model.to(device=...) raises on them until they have storage.
        meta = sorted({m.module_path for m in self.mismatches if m.found == "meta"})
        for path in meta:
            target = _module_expr(path)
            lines.append(
                f"{target}.to_empty(device={_show(self.reference_device)}) then initialise it "
                "(reset_parameters()) or load its weights: meta tensors hold no data, .to() cannot copy them"
            )
        kwargs = self.fix_kwargs()
        if kwargs:
            args = ", ".join(f"{k}={_show(v)}" for k, v in kwargs.items())
            lines.append(f"model.to({args})  # once, after constructing or adding the submodules")
        if any(m.kind == "parameter" and m.attribute == "dtype" for m in self.mismatches):
            lines.append(
                "not `self.p = self.p.to(...)`: Parameter.to() returns a plain Tensor and the assignment "
                "raises TypeError (parameter-reassign); use module.to(...) or p.data = p.data.to(...)"
            )
        return tuple(lines)

    def __str__(self) -> str:
        head = (
            f"{self.model}: {self.parameters} parameters, {self.buffers} buffers; reference dtype "
            f"{_show(self.reference_dtype)}, device {_show(self.reference_device)}"
        )
        if self.ok:
            return head + "\nno dtype or device mismatches"
        width = max(len(m.name) for m in self.mismatches)
        rows = [
            f"  {m.name:<{width}}  {m.kind:<9}  {m.attribute:<6}  {m.found} (expected {m.expected}), "
            f"{m.numel} elements  [{m.kb_id}]"
            for m in self.mismatches
        ]
        fixes = [f"  {line}" for line in self.fixes()]
        note = (
            "(ignore what is intentional: fp32 norms kept for mixed precision, a model split "
            "across devices on purpose)"
        )
        return "\n".join([head, f"{len(self.mismatches)} mismatches:", *rows, "fix:", *fixes, note])


def _module_expr(path: str) -> str:
    """Python that reaches the submodule at `path`: attribute access where every part is an
    identifier, `get_submodule` where a ModuleList index is in the way."""
    if not path:
        return "model"
    if all(part.isidentifier() for part in path.split(".")):
        return f"model.{path}"
    return f"model.get_submodule({path!r})"


def _show(value: Any) -> str:
    text = str(value)
    return f"'{text}'" if not text.startswith("torch.") and value is not None else text


def _majority(weights: Counter, order: list[Any]) -> Any:
    """The key with the most elements; ties go to the one seen first."""
    if not weights:
        return None
    return max(order, key=lambda k: (weights[k], -order.index(k)))


def check_module(model: Any) -> ModuleCheck:
    """Report parameters and buffers of `model` whose dtype or device differs from the rest.

    The reference dtype is the majority (by element count) among floating-point parameters, or
    among floating-point buffers for a model without floating parameters; the reference device is
    the majority over all parameters and buffers. Integer and bool tensors are checked for device
    only."""
    tensors = [("parameter", n, t) for n, t in model.named_parameters()]
    tensors += [("buffer", n, t) for n, t in model.named_buffers()]

    dtype_weights: Counter = Counter()
    dtype_order: list[Any] = []
    float_params = [(k, n, t) for k, n, t in tensors if k == "parameter" and t.is_floating_point()]
    pool = float_params or [(k, n, t) for k, n, t in tensors if t.is_floating_point()]
    for _, _, t in pool:
        if t.dtype not in dtype_weights:
            dtype_order.append(t.dtype)
        dtype_weights[t.dtype] += t.numel()
    ref_dtype = _majority(dtype_weights, dtype_order)

    device_weights: Counter = Counter()
    device_order: list[Any] = []
    for _, _, t in tensors:
        if t.device not in device_weights:
            device_order.append(t.device)
        device_weights[t.device] += max(t.numel(), 1)
    ref_device = _majority(device_weights, device_order)

    mismatches = []
    for kind, name, t in tensors:
        if t.is_floating_point() and ref_dtype is not None and t.dtype != ref_dtype:
            mismatches.append(
                Mismatch(name, kind, "dtype", str(t.dtype), str(ref_dtype), t.numel(), "dtype-mismatch")
            )
        if t.device != ref_device:
            mismatches.append(
                Mismatch(name, kind, "device", str(t.device), str(ref_device), t.numel(), "device-mismatch")
            )
    return ModuleCheck(
        model=type(model).__name__,
        reference_dtype=ref_dtype,
        reference_device=ref_device,
        mismatches=tuple(mismatches),
        parameters=sum(1 for k, _, _ in tensors if k == "parameter"),
        buffers=sum(1 for k, _, _ in tensors if k == "buffer"),
    )
