"""GPU009 (data-ptr-unchecked): an extension reads data_ptr() of a tensor argument never checked or made contiguous.

Its documentation (what `gpudoctor explain GPU009` prints, and its row in docs/lint.md) and its
prefilter, as data. Its check is C++'s and crosses files: gpudoctor.lint.cpprules (per file, and
resolved over the project) with gpudoctor.lint.pycallers for the Python callers of a binding.
"""
from __future__ import annotations

from gpudoctor.lint.rules import CPP, PYTHON, Rule

RULE = Rule(
    code="GPU009",
    name="data-ptr-unchecked",
    kb_id="noncontiguous-kernel-input",
    title="an extension reads data_ptr() of a tensor argument never checked or made contiguous",
    # Python files are read only for the bindings' callers, in the cross-file step
    kinds=(CPP, PYTHON),
    # raw reads, or the bindings and dispatchers that call the functions reading them (a
    # dispatch header of the project's own, included with quotes, is one)
    prefilter=((b"data_ptr", b".data<", b"TORCH_LIBRARY", b"PYBIND11_MODULE", b'#include "'),),
    # a binding used, not defined (torch/library.h defines TORCH_LIBRARY)
    pattern=((rb"data_ptr", rb"\.data<", rb"^[ \t]*(?:TORCH_LIBRARY\w*|PYBIND11_MODULE)[ \t]*\(",
              rb'^[ \t]*#[ \t]*include[ \t]*"'),),
    what=(
        "In C++/CUDA extension code (it includes torch headers, binds with PYBIND11_MODULE / "
        "TORCH_LIBRARY, or launches kernels on ATen tensors), a function or bound lambda reads "
        "x.data_ptr() / data_ptr<T>() / data<T>() / mutable_ / const_data_ptr of a Tensor parameter "
        "x nowhere checked (x.is_contiguous(), or a macro or helper whose body checks it: "
        "CHECK_INPUT is read where the file or its project headers define it), made contiguous or "
        "read with its strides; a device or dtype check is not a contiguity check. A function "
        "whose every caller passes checked or contiguous tensors is fine: the bindings "
        "(TORCH_LIBRARY_IMPL, PYBIND11_MODULE) name the entry points, and the project's Python "
        "calls of a binding (through its Python wrappers) are callers; a call passing a tensor "
        "not known to be dense is named. "
        "One finding per function and tensor, at its first read (the reads in the other launch "
        "branches are the same fix)."
    ),
    why=(
        "A raw pointer is read as dense row-major memory. A transposed, permuted, sliced or "
        "expanded tensor has the same data_ptr() with other strides, so the kernel computes on the "
        "wrong elements (silently wrong results that no synchronisation fixes) or reads past the end."
    ),
    example="torch::Tensor forward(torch::Tensor x) {\n  kernel<<<grid, block>>>(x.data_ptr<float>(), x.numel());",
    fix='TORCH_CHECK(x.is_contiguous(), "x must be contiguous");   // or: auto xc = x.contiguous(); use xc.data_ptr<float>()',
    fix_safety="display-only: whether to reject or to copy (and where) is a design choice of the extension.",
    near_misses=(
        "Reads of one-element tensors (TORCH_CHECK(x.numel() == 1)), reads after x.contiguous(), "
        "after a contiguity check or macro, of tensors created in the "
        "function (torch::empty), of tensors a same-layout helper of the file compares with a checked "
        "one (TORCH_CHECK(has_same_layout(dy, x))), pointer comparisons and alignment checks inside "
        "TORCH_CHECK, and functions whose callers check or whose every Python call passes "
        "torch.empty / torch.zeros / .contiguous() tensors (or a .view() of one, or a registered "
        "buffer made so), do not fire; x.add(...) on a tensor is not a call of a binding named add. "
        "A sizes comparison (dy.sizes() == x.sizes()) is not a layout check."
    ),
)
