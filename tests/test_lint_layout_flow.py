"""GPU009's layout judgement, both ways, on extensions written for these tests: what a binding's
raw read really depends on (a dispatch header between the binding and the launcher, a local that
views a parameter, strides handed to a kernel that ignores them), and which tensors the project's
own Python callers pass dense (an autograd Function's forward called through `apply`, the tensors
its backward gets back from `ctx.saved_tensors`, buffers and parameters, `x.new()`, advanced
indexing, `**kwargs` of the module's own dicts, functions called through an alias)."""
from __future__ import annotations

from lint_helpers import lint_tree, marked_lines

# A dispatch header that names no torch header and reads nothing: it only picks the CUDA version.
DISPATCH_H = """
#pragma once
#include "cuda/blur_cuda.h"

at::Tensor blur_forward(const at::Tensor &input, const at::Tensor &weight, int k) {
  if (input.is_cuda()) {
    return blur_cuda_forward(input, weight, k);
  }
  AT_ERROR("CPU not supported");
}

at::Tensor blur_backward(const at::Tensor &grad, const at::Tensor &input, const at::Tensor &weight, int k) {
  return blur_cuda_backward(grad, input, weight, k);
}
"""

BLUR_CU = """
#include <ATen/ATen.h>
#include "cuda/blur_cuda.h"

__global__ void blur_kernel(const float *x, const float *w, float *y, int n, int sx, int sw) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * w[i % 9];
}

at::Tensor blur_cuda_forward(const at::Tensor &input, const at::Tensor &weight, int k) {
  AT_ASSERTM(input.type().is_cuda(), "input must be a CUDA tensor");   // the device only
  auto out = at::empty_like(input, at::MemoryFormat::Contiguous);
  blur_kernel<<<1, 256>>>(input.data<float>(),          // <- forward input
                          weight.data<float>(),         // the module's own parameter
                          out.data<float>(), input.numel(), input.stride(0), weight.stride(0));
  return out;
}

at::Tensor blur_cuda_backward(const at::Tensor &grad, const at::Tensor &input, const at::Tensor &weight, int k) {
  TORCH_CHECK(input.is_contiguous(), "input");
  auto grad_input = at::zeros_like(input);
  for (int b = 0; b < input.size(0); b++) {
    auto grad_b = grad.select(0, b);
    auto input_b = input.select(0, b);
    blur_kernel<<<1, 256>>>(grad_b.data<float>(),       // <- a select of the unchecked gradient
                            input_b.data<float>(),      // a select of a checked tensor
                            grad_input.data<float>(), 1, 0, 0);
  }
  return grad_input;
}
"""

BIND_CPP = """
#include <torch/extension.h>
#include "blur.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("blur_forward", &blur_forward);
  m.def("blur_backward", &blur_backward);
}
"""

BLUR_PY = """
import torch
from torch import nn
from torch.autograd import Function

import _blur_ext as _backend


class _Blur(Function):
    @staticmethod
    def forward(ctx, input, weight, k):
        ctx.save_for_backward(input, weight)
        ctx.k = k
        return _backend.blur_forward(input, weight, k)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        return _backend.blur_backward(grad_output, input, weight, ctx.k), None, None


blur = _Blur.apply


class Blur(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
        self.weight = nn.Parameter(torch.Tensor(9))

    def forward(self, x):
        return blur(x, self.weight, self.k)
"""


def _found(result):
    return sorted((f.path.rsplit("/", 1)[-1], f.line) for f in result.findings)


def _tree(tmp_path, **extra):
    files = {"src/blur.h": DISPATCH_H, "src/cuda/blur_cuda.cu": BLUR_CU, "src/cuda/blur_cuda.h": "#pragma once\n",
             "src/bind.cpp": BIND_CPP, "blur.py": BLUR_PY}
    files.update(extra)
    return lint_tree(tmp_path, files, select=["GPU009"])


def test_reads_reached_through_a_dispatch_header_and_views_of_parameters(tmp_path):
    """The header between binding and launcher names no torch header: it is still read, so the
    forward's unchecked input is found (its only check is the device); the weight is the module's
    nn.Parameter(torch.Tensor(9)), dense, passed through the Function's apply. In the backward a
    select of the unchecked gradient is reported under the gradient; a select of the checked
    input is not. The weight's strides go to a kernel that never reads them: no check either way."""
    result = _tree(tmp_path)
    cu = marked_lines(BLUR_CU, "// <-")
    assert _found(result) == [("blur_cuda.cu", cu[0]), ("blur_cuda.cu", cu[1])]
    backward = next(f for f in result.findings if f.line == cu[1])
    assert "`grad`" in backward.message and "grad_b.data" in backward.message


def test_strides_handed_to_a_kernel_count_only_where_it_reads_them(tmp_path):
    """blur_kernel ignores sx: input.stride(0) protects nothing. A kernel that indexes with the
    stride it is given (here through a macro that pastes the name, `X##_stride`) reads the tensor
    with its strides: no finding."""
    strided = BLUR_CU.replace("y[i] = x[i] * w[i % 9];", "y[i] = AT(x, i) * w[i % 9];").replace(
        "__global__", "#define AT(T, i) T[(i) * T##_stride]\n__global__", 1).replace(
        "int n, int sx, int sw", "int n, int x_stride, int sw")
    result = _tree(tmp_path, **{"src/cuda/blur_cuda.cu": strided})
    assert [line for _, line in _found(result)] == [marked_lines(strided, "// <-")[1]]


def test_strides_through_a_local_to_a_kernel_that_ignores_them(tmp_path):
    """`auto xs = make_long4(x.stride(0), ...)` handed to a kernel whose body never names xs: the
    read is reported; the same local read by the kernel protects it."""
    launcher = """
    #include <torch/extension.h>
    __global__ void k(const float *x, long4 xs, float *y, int n) { y[0] = x[0]; }
    __global__ void k2(const float *x, long4 xs, float *y, int n) { y[0] = x[xs.x]; }

    void run(at::Tensor &x, at::Tensor &y) {
      const long4 xs = make_long4(x.stride(0), x.stride(1), x.stride(2), x.stride(3));
      k<<<1, 1>>>(x.data_ptr<float>(), xs, y.data_ptr<float>(), 1);   // <-
    }

    void run2(at::Tensor &x, at::Tensor &y) {
      const long4 xs = make_long4(x.stride(0), x.stride(1), x.stride(2), x.stride(3));
      TORCH_CHECK(y.is_contiguous());
      k2<<<1, 1>>>(x.data_ptr<float>(), xs, y.data_ptr<float>(), 1);
    }

    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); m.def("run2", &run2); }
    """
    result = lint_tree(tmp_path, {"k.cu": launcher}, select=["GPU009"])
    line = marked_lines(launcher, "// <-")[0]
    assert sorted((f.line, f.message.split()[0]) for f in result.findings) == \
        [(line, "x.data_ptr()"), (line, "y.data_ptr()")]


def test_saved_tensors_and_apply_callers_decide(tmp_path):
    """The backward's input comes from ctx.saved_tensors: what the forward saved, and the forward's
    parameter is what the callers of apply pass. A caller that passes a transposed tensor makes the
    saved input unprotected too (the C++ backward no longer checks it here)."""
    cu = BLUR_CU.replace('TORCH_CHECK(input.is_contiguous(), "input");', "")
    result = _tree(tmp_path, **{"src/cuda/blur_cuda.cu": cu})
    lines = marked_lines(cu, "// <-")
    input_b = next(i for i, line in enumerate(cu.strip("\n").splitlines(), 1) if "input_b.data" in line)
    assert [line for _, line in _found(result)] == sorted(lines + [input_b])


def test_dense_tensors_the_python_callers_make(tmp_path):
    """Every tensor the Python side hands over is dense: x.new(...).zero_(), an asserted input, a
    `.contiguous()` rebinding, `nn.Parameter(torch.Tensor(...))`, advanced indexing
    (`feats[order]`, `x[mask]`), `torch.where(mask)[0].int()` and a zeros_like of it, a buffer
    from `torch.from_numpy(np.zeros(...).astype(...))`, `torch.gather` results, tuples assigned
    pairwise, and a `**` of the module's own dict. No finding."""
    ext = """
    #include <torch/extension.h>
    __global__ void k(const float *a, int n) {}
    void op(at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor d, at::Tensor e, at::Tensor f) {
      k<<<1, 1>>>(a.data_ptr<float>(), 1); k<<<1, 1>>>(b.data_ptr<float>(), 1);
      k<<<1, 1>>>(c.data_ptr<float>(), 1); k<<<1, 1>>>(d.data_ptr<float>(), 1);
      k<<<1, 1>>>(e.data_ptr<float>(), 1); k<<<1, 1>>>(f.data_ptr<float>(), 1);
    }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("op", &op); }
    """
    py = """
    import numpy as np
    import torch
    from torch.autograd import Function
    import op_ext


    def pack(n):
        q = np.zeros((n, 4), dtype=np.uint32)
        q = q.astype(np.int32)
        return torch.from_numpy(q)


    class Cache:
        def __init__(self, n):
            self.scales = torch.empty(n, 2)
            self.packed = pack(n)

        def specs(self):
            return {f"f": self.scales}


    class _Op(Function):
        @staticmethod
        def forward(ctx, feats, coords, ranks):
            assert ranks.is_contiguous()
            kept = torch.ones(feats.shape[0], dtype=torch.bool)
            starts = torch.where(kept)[0].int()
            lengths = torch.zeros_like(starts)
            coords = coords.int()
            out = feats.new(feats.shape[0]).zero_()
            ctx.save_for_backward(starts, lengths, coords)
            return out

        @staticmethod
        def backward(ctx, grad):
            starts, lengths, coords = ctx.saved_tensors
            grad = grad.contiguous()
            rows = torch.gather(grad, 0, starts.long().view(-1, 1).expand(-1, grad.shape[1]))
            wrapper(grad, coords, lengths, starts, rows, **Cache(4).specs())
            return grad, None, None


    def wrapper(a, b, c, d, e, f):
        return op_ext.op(a, b, c, d, e, f)


    def run(feats, coords, ranks):
        order = ranks.argsort()
        feats, coords, ranks = feats[order], coords[order], ranks[order]
        return _Op.apply(feats, coords, ranks)
    """
    result = lint_tree(tmp_path, {"op.cpp": ext, "op.py": py}, select=["GPU009"])
    assert result.findings == []
    # the same module with one caller passing a transposed tensor: that argument is named
    bad = py.replace("wrapper(grad, coords", "wrapper(grad.t(), coords")
    result = lint_tree(tmp_path, {"op.cpp": ext, "op.py": bad}, select=["GPU009"])
    assert [f.message.split()[0] for f in result.findings] == ["a.data_ptr()"]
    assert "passes `grad.t()`" in result.findings[0].message


def test_wrappers_called_through_an_alias_and_keyword_spread(tmp_path):
    """`run = run_f16 if half else run_i4; run(**self.specs(), k=...)`: both wrappers are called
    there, and their `kv` comes from the module's dict, a torch.empty buffer. A dict entry that is
    a transposed tensor is not dense."""
    ext = """
    #include <torch/extension.h>
    __global__ void k(const void *a, int n) {}
    void run_i4(at::Tensor kv, at::Tensor k) { k<<<1, 1>>>(kv.data_ptr(), 1); k<<<1, 1>>>(k.data_ptr(), 1); }
    void run_f16(at::Tensor kv, at::Tensor k) { k<<<1, 1>>>(kv.data_ptr(), 1); k<<<1, 1>>>(k.data_ptr(), 1); }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run_i4", &run_i4); m.def("run_f16", &run_f16); }
    """
    py = """
    import torch
    import kv_ext as _CUDA


    def run_i4(kv, k):
        return _CUDA.run_i4(kv, k)


    def run_f16(kv, k):
        return _CUDA.run_f16(kv, k)


    class Cache:
        def __init__(self, n, half):
            self.half = half
            self.buf = torch.empty(n, 2)

        def specs(self):
            return {"kv": self.buf}

        def update(self, k):
            run = run_f16 if self.half else run_i4
            run(**self.specs(), k=torch.cat([k, k]).view(-1, 2))
    """
    result = lint_tree(tmp_path, {"kv.cpp": ext, "kv.py": py}, select=["GPU009"])
    assert result.findings == []
    bad = py.replace('{"kv": self.buf}', '{"kv": self.buf.t()}')
    result = lint_tree(tmp_path, {"kv.cpp": ext, "kv.py": bad}, select=["GPU009"])
    assert sorted(f.message.split()[0] for f in result.findings) == ["kv.data_ptr()", "kv.data_ptr()"]
