"""The C++/CUDA rules: unchecked data_ptr reads across an extension's files (GPU009) and custom
allocator mistakes (GPU010), with the tokenizer's promise that comments and strings never count."""
from __future__ import annotations

import textwrap

from gpudoctor.lint import cpp
from lint_helpers import lint_tree, marked_lines

BINDINGS = """
#include <torch/extension.h>
#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

torch::Tensor scale_cuda(torch::Tensor x, torch::Tensor out);
void add_cuda(const torch::Tensor& x, torch::Tensor y);

torch::Tensor scale(torch::Tensor x, torch::Tensor out) {
  CHECK_INPUT(x);
  CHECK_INPUT(out);
  return scale_cuda(x, out);
}

void add(torch::Tensor x, torch::Tensor y) {
  CHECK_CUDA(x);                                  // device only: not a contiguity check
  auto yc = y.contiguous();
  add_cuda(x, yc);
}

void copy_rows(torch::Tensor dst, torch::Tensor src) {
  TORCH_CHECK(dst.data_ptr() != src.data_ptr(), "no aliasing");   // a comparison, not a read
  auto src_c = src.contiguous();
  float* d = dst.data_ptr<float>();               // <- dst: never checked
  const float* s = src_c.data_ptr<float>();
  /* src.data_ptr<float>() in a comment */
  const char* msg = "src.data_ptr<float>() in a string";
}

void strided(torch::Tensor x) {
  auto* p = x.data_ptr<float>();
  launch(p, x.stride(0), x.stride(1));            // stride-aware
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", &scale);
  m.def("add", &add);
  m.def("copy_rows", &copy_rows);
  m.def("strided", &strided);
}
"""

KERNELS = """
#include <torch/types.h>
__global__ void k(const float* x, float* y, int n) {}

torch::Tensor scale_cuda(torch::Tensor x, torch::Tensor out) {
  k<<<1, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());   // callers checked both
  return out;
}

void add_cuda(const torch::Tensor& x, torch::Tensor y) {
  k<<<1, 256>>>(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), x.numel());   // <-
}

void unbound_helper(torch::Tensor x) {             // nobody here calls or binds it: left alone
  k<<<1, 1>>>(x.data_ptr<float>(), nullptr, 1);
}
"""


def _by_file(result):
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.message.split("(")[0]) for f in result.findings)


def test_data_ptr_across_the_extension(tmp_path):
    result = lint_tree(tmp_path, {"ext.cpp": BINDINGS, "kernels.cu": KERNELS}, select=["GPU009"])
    got = [(f.path.rsplit("/", 1)[-1], f.line, f.message.split("(")[0]) for f in result.findings]
    # add() passes x unchecked to add_cuda (y went through .contiguous()); copy_rows reads dst
    assert got == [("ext.cpp", marked_lines(BINDINGS, "// <-")[0], "dst.data_ptr"),
                   ("kernels.cu", marked_lines(KERNELS, "// <-")[0], "x.const_data_ptr")]
    assert all(f.kb_id == "noncontiguous-kernel-input" for f in result.findings)


def test_kernels_alone_report_nothing(tmp_path):
    """Without the bindings the entry points are unknown: precision first."""
    result = lint_tree(tmp_path, {"kernels.cu": KERNELS}, select=["GPU009"])
    assert result.findings == []


def test_pytorch_internal_code_is_not_extension_code(tmp_path):
    source = KERNELS.replace("#include <torch/types.h>", '#include "ATen/native/Foo.h"').replace(
        "torch::Tensor", "Tensor")
    result = lint_tree(tmp_path, {"Foo.cuh": source, "b.cpp": BINDINGS.replace("torch::Tensor", "Tensor")
                                  .replace("#include <torch/extension.h>", "")}, select=["GPU009"])
    assert [f for f in result.findings if f.path.endswith("Foo.cuh")] == []


ALLOC = """
#include <c10/core/Allocator.h>
#include <cstdlib>
#define POOL_BYTES (1024 * 1024)

struct EchoAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    size_t aligned_size = ((nbytes + 63) / 64) * 64;          // rounded up: fine
    void* data = aligned_alloc(64, aligned_size);
    return {data, data, &free, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free; }
};

void* exact(size_t nbytes) { return aligned_alloc(64, nbytes); }   // <-
void* pool() { return aligned_alloc(64, POOL_BYTES); }
void* masked(size_t n) { return aligned_alloc(64, (n + 63) & ~size_t(63)); }
void* literal() { return aligned_alloc(64, 4096); }
void* odd() { return aligned_alloc(64, 100); }                     // <-

void windows(size_t n) {
  void* p = _aligned_malloc(n, 64);
  free(p);                                                          // <-
  void* q = _aligned_malloc(n, 64);
  _aligned_free(q);
  float* r = new float[n];
  delete r;                                                         // <-
  void* d = nullptr;
  cudaMalloc(&d, n);
  cudaFree(d);
}

static void host_free(void* p) { cudaFreeHost(p); }

struct HostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = _aligned_malloc(nbytes, 64);
    return {data, data, &free, c10::Device(c10::DeviceType::PrivateUse1, 0)};   // <-
  }
};

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    cudaMallocHost(&data, nbytes);
    return {data, data, &host_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
};
"""


def test_allocator_findings(tmp_path):
    from lint_helpers import marked_lines

    result = lint_tree(tmp_path, {"alloc.cpp": ALLOC}, select=["GPU010"])
    assert sorted(f.line for f in result.findings) == marked_lines(ALLOC, "// <-")
    assert all(f.kb_id == "custom-allocator" for f in result.findings)


def test_allocator_rule_ignores_c_programs_that_are_not_pytorch_backends(tmp_path):
    source = "#include <stdlib.h>\nint main(){ float* a = aligned_alloc(32, 100); free(a); return 0; }\n"
    assert lint_tree(tmp_path, {"bench.c": source}, select=["GPU010"]).findings == []
    # The rule's own gate, not only its prefilter: with the prefilters off (engine.lint(unfiltered=
    # True)) a C library's aligned_alloc wrapper (libcu++'s, in CUDA's headers) is not judged either.
    from gpudoctor.lint import engine

    wrapper = "void* aligned_alloc(size_t n, size_t a) { return ::aligned_alloc(a, n); }\nvoid f(void* p) { free(p); }\n"
    (tmp_path / "aligned_alloc.h").write_text(wrapper)
    unfiltered, _, _ = engine.lint([str(tmp_path / "aligned_alloc.h")], isolated=True, select=["GPU010"], unfiltered=True)
    assert unfiltered.findings == []


def test_the_parser_skips_comments_strings_and_directives():
    text = r'''
    // x.data_ptr() in a line comment
    /* x.data_ptr()
       across lines */
    const char* a = "x.data_ptr() \" still a string";
    auto r = R"delim(x.data_ptr() )" not the end )delim";
    char c = '"';
    #define M(x) x.data_ptr() \
        continued
    int real = y.data_ptr();
    '''
    parsed = cpp.CppFile(text)
    assert [cpp.text_of(n) for n in parsed.find("field_expression")] == ["y.data_ptr"]
    macro = parsed.macros["M"]
    assert macro.params == ["x"] and macro.body.split() == ["x.data_ptr()", "continued"]


def test_a_macro_body_is_read_as_code_not_as_text():
    """A commented-out line in a macro's body is not part of it; a #define inside a comment or
    a string defines nothing."""
    text = r'''
    #define CHECK_INPUT(x) CHECK_CUDA(x); /* CHECK_CONTIGUOUS(x) */ \
        CHECK_DTYPE(x)
    // #define NOT_A_MACRO(x) x.is_contiguous()
    const char* s = "#define ALSO_NOT(x)";
    #include "checks.h"
    /* #include "commented.h" */
    '''
    parsed = cpp.CppFile(text)
    assert set(parsed.macros) == {"CHECK_INPUT"} and parsed.includes == ["checks.h"]
    calls = [cpp.callee(n)[0] for n in cpp.walk(parsed.macros["CHECK_INPUT"].body_tree()) if n.type == "call_expression"]
    assert calls == ["CHECK_CUDA", "CHECK_DTYPE"]


def test_functions_are_found_with_their_parameters():
    text = """
    namespace ext {
    torch::Tensor forward(const torch::Tensor& q, torch::Tensor k, int64_t n = 4) {
      auto f = [&](int i) { return i; };
      if (n) { return q; }
      return k;
    }
    struct S { S(int a) : a_(a) {} int a_; };
    template <typename T>
    void Launcher<T>::run(at::Tensor* p, std::vector<at::Tensor> v, c10::optional<at::Tensor> o) const {}
    }
    """
    fns = cpp.CppFile(textwrap.dedent(text)).functions()
    assert [f.name for f in fns] == ["forward", "S", "run"]  # the lambda belongs to forward
    assert [(p.name, p.tensor) for p in fns[0].params] == [("q", True), ("k", True), ("n", False)]
    # a pointer, a list and an optional are not tensors whose data_ptr() the rule follows
    assert [(p.name, p.tensor) for p in fns[2].params] == [("p", False), ("v", False), ("o", False)]


def test_a_binding_file_without_raw_reads_still_names_the_entry_points(tmp_path):
    """The registration and dispatch live in a file with no data_ptr at all; the reads in the
    kernel file are reported through them. A dtype or device check is not a contiguity check; a
    one-element tensor is dense whatever its strides."""
    files = {
        "csrc/ops.cpp": """
            #include <torch/script.h>
            torch::Tensor basis_cuda(torch::Tensor pseudo, torch::Tensor sizes, torch::Tensor scale);

            torch::Tensor basis(torch::Tensor pseudo, torch::Tensor sizes, torch::Tensor scale) {
              if (pseudo.device().is_cuda()) {
                return basis_cuda(pseudo, sizes, scale);
              }
              AT_ERROR("CPU path elsewhere");
            }

            TORCH_LIBRARY(spline_ops, m) {
              m.def("basis", &basis);
            }
            """,
        "csrc/cuda/basis_cuda.cu": """
            #include <ATen/cuda/CUDAContext.h>
            #include <torch/extension.h>
            #define CHECK_CUDA(x) AT_ASSERTM(x.device().is_cuda(), #x " must be CUDA tensor")

            torch::Tensor basis_cuda(torch::Tensor pseudo, torch::Tensor sizes, torch::Tensor scale) {
              CHECK_CUDA(pseudo);
              TORCH_CHECK(sizes.scalar_type() == at::kLong, "sizes must be int64");
              TORCH_CHECK(scale.numel() == 1, "one scale");
              auto out = at::empty({pseudo.size(0)}, pseudo.options());
              auto sizes_data = sizes.data_ptr<int64_t>();  // <-
              auto scale_data = scale.data_ptr<float>();
              AT_DISPATCH_FLOATING_TYPES(pseudo.scalar_type(), "basis", [&] {
                auto pseudo_data = pseudo.data_ptr<scalar_t>();  // <-
                auto out_data = out.data_ptr<scalar_t>();
              });
              return out;
            }
            """,
    }
    result = lint_tree(tmp_path, files, select=["GPU009"])
    got = sorted((f.path.rsplit("/", 1)[-1], f.line) for f in result.findings)
    assert got == [("basis_cuda.cu", n) for n in marked_lines(files["csrc/cuda/basis_cuda.cu"], "// <-")]


def test_allocations_per_branch_and_new_in_a_conditional(tmp_path):
    files = {"alloc.cpp": """
        #include <c10/core/Allocator.h>
        #include <cstdlib>

        static void npu_free(void* ptr) {
        #ifdef _WIN32
          free(ptr);
        #else
          free(ptr);
        #endif
        }

        struct NpuAllocator final : at::Allocator {
          at::DataPtr allocate(size_t nbytes) override {
            void* data = nullptr;
        #ifdef _WIN32
            data = _aligned_malloc(nbytes, 64);  // <-
        #else
            data = aligned_alloc(64, (nbytes + 63) / 64 * 64);
        #endif
            return {data, data, &npu_free, at::Device(at::DeviceType::PrivateUse1, 0)};
          }
        };

        struct Scratch final : at::Allocator {
          at::DataPtr allocate(size_t nbytes) override {
            uint8_t* data = nbytes ? new uint8_t[nbytes] : nullptr;
            return {data, data, &free, at::Device(at::DeviceType::PrivateUse1, 0)};  // <-
          }
        };

        struct Fine final : at::Allocator {
          at::DataPtr allocate(size_t nbytes) override {
            void* data = nbytes ? aligned_alloc(64, (nbytes + 63) / 64 * 64) : nullptr;
            return {data, data, &free, at::Device(at::DeviceType::CPU)};
          }
        };
        """}
    result = lint_tree(tmp_path, files, select=["GPU010"])
    assert sorted(f.line for f in result.findings) == marked_lines(files["alloc.cpp"], "// <-")


# --- GPU009: the project's own Python callers of a binding, and same-layout helpers -----------

RING_EXT = """
#include <torch/extension.h>

__global__ void ring_kernel(const float* x, float* out, float* work, const float* bias, int n) {}

void ring_step(torch::Tensor x, torch::Tensor out, torch::Tensor work, torch::Tensor bias) {
  TORCH_CHECK(x.is_cuda(), "x must be CUDA");
  ring_kernel<<<1, 128>>>(x.data_ptr<float>(),      // <- x
                          out.data_ptr<float>(),
                          work.data_ptr<float>(),
                          bias.data_ptr<float>(), x.numel());
}

void ring_init(torch::Tensor state) {
  ring_kernel<<<1, 1>>>(nullptr, state.data_ptr<float>(), nullptr, nullptr, 0);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ring_step", &ring_step);
  m.def("ring_init", &ring_init);
}
"""

RING_PY = """
import torch
from ringlib._ext import ring_init, ring_step

_no_bias = torch.empty(0)


def make_workspace(n, device):
    spaces = {"ring_state": torch.zeros(n, device=device)}
    ring_init(spaces["ring_state"])
    return spaces


class Ring(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("scratch", torch.zeros(n))

    def forward(self, x, bias=None):
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        b = bias.contiguous() if bias is not None else _no_bias
        ring_step(x, out, self.scratch, b)  # <- the call
        return out
"""


def _gpu009(result):
    return [(f.path.rsplit("/", 1)[-1], f.line, f.message) for f in result.findings if f.code == "GPU009"]


def test_python_callers_that_allocate_protect_the_binding(tmp_path):
    """out (empty_like with contiguous_format), work (a registered buffer made by torch.zeros),
    bias (.contiguous() or a module-level torch.empty) and ring_init's state (a dict entry made
    by torch.zeros) are dense at every call; x is whatever forward() was given."""
    files = {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/ring.py": RING_PY}
    got = _gpu009(lint_tree(tmp_path, files))
    assert [(name, line) for name, line, _ in got] == [("ring.cpp", marked_lines(RING_EXT, "// <- x")[0])]
    message = got[0][2]
    assert f"ring.py:{marked_lines(RING_PY, '# <- the call')[0]} passes `x`" in message
    # GPU009 alone reads the same Python callers
    assert _gpu009(lint_tree(tmp_path, {}, select=["GPU009"])) == got


def test_python_callers_without_allocation_keep_the_findings(tmp_path):
    """Without Python callers every unchecked read stays; a preserve_format copy of a parameter
    (empty_like(x)) keeps x's strides and proves nothing."""
    py = RING_PY.replace("torch.empty_like(x, memory_format=torch.contiguous_format)", "torch.empty_like(x)")
    got = _gpu009(lint_tree(tmp_path, {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/ring.py": py}))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["out", "x"]
    bare = tmp_path / "bare"
    got = _gpu009(lint_tree(bare, {"csrc/ring.cpp": RING_EXT}))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["bias", "out", "state", "work", "x"]


RING_FLOW_PY = """
import torch
from ringlib._ext import ring_init, ring_step


def pack(w):
    q = torch.tensor(w.cpu().numpy()).to(w.device)
    return q.contiguous()


def reset(n):
    ring_init(torch.zeros(n))


class Scaled(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scratch = torch.nn.Parameter(scale.data)  # another class's `scratch`


class Ring(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("scratch", torch.zeros(n))

    @classmethod
    def build(cls, w):
        ring = cls(8)
        ring.scratch = pack(w)  # a project function that returns a dense tensor
        return ring

    def forward(self, x, bias):
        x = -torch.exp(x.float().contiguous()) * 0.5  # elementwise ops keep a dense layout
        out = torch.zeros(x.shape, device=x.device)
        b = bias.contiguous()
        ring_step(x, out, self.scratch, b)
        out = torch.sum(out, dim=0)  # rebound after the call: not what the call was given
        b = b.t()
        return out + b
"""


def test_what_the_call_is_given_is_followed_through_the_project(tmp_path):
    """Value flow at a binding's Python call: a name is what it holds *at the call* (RWKV's
    `gw = torch.zeros(...)`, reduced by torch.sum after the call), elementwise ops and arithmetic
    keep a dense tensor dense (`-torch.exp(w.contiguous())`), a call of the module's own function
    is what its returns are (llm-awq's `pack_intweight(...)`), and `self.scratch` in one class is
    not what another class of the module stores under that name."""
    files = {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/ring.py": RING_FLOW_PY}
    assert _gpu009(lint_tree(tmp_path, files)) == []
    for old, new, arg in ((".float().contiguous()) * 0.5", ".float()) * 0.5", "x"),
                          ("return q.contiguous()", "return q.t()", "work"),
                          ("b = bias.contiguous()", "b = bias", "bias")):
        changed = tmp_path / arg
        got = _gpu009(lint_tree(changed, {**files, "ringlib/ring.py": RING_FLOW_PY.replace(old, new)}))
        assert [m.split(".data_ptr")[0] for _, _, m in got] == [arg], (old, got)


def test_one_call_that_is_not_fresh_keeps_the_finding_and_is_named(tmp_path):
    other = """
        import torch
        from ringlib._ext import ring_init


        def reset(states):
            ring_init(torch.zeros(8))
            for s in states:
                ring_init(s.t())  # <-
        """
    files = {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/ring.py": RING_PY,
             "ringlib/reset.py": other}
    got = _gpu009(lint_tree(tmp_path, files))
    states = [m for _, _, m in got if m.startswith("state.")]
    assert len(states) == 1 and f"reset.py:{marked_lines(other)[0]} passes `s.t()`" in states[0]


def test_a_python_wrapper_of_the_same_name_is_followed_to_its_callers(tmp_path):
    """`def ring_step(x)` in Python calls the binding `_ext.ring_step` with its own parameter:
    the wrapper's callers decide. run() passes torch.zeros: dense; ring_init has no caller at
    all and stays reported. A second caller passing a transposed tensor is named."""
    wrapper = """
        import torch
        from ringlib import _ext


        def ring_step(x):
            out = torch.empty(x.shape)
            _ext.ring_step(x, out, torch.zeros(4), torch.empty(0))
            return out


        def run():
            return ring_step(torch.zeros(4))
        """
    files = {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/wrap.py": wrapper}
    got = _gpu009(lint_tree(tmp_path, files))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["state"]
    caller = """
        from ringlib.wrap import ring_step


        def step_transposed(h):
            return ring_step(h.transpose(0, 1))  # <-
        """
    got = _gpu009(lint_tree(tmp_path, {"ringlib/use.py": caller}))
    x = [m for _, _, m in got if m.startswith("x.")]
    assert len(x) == 1 and f"use.py:{marked_lines(caller)[0]} passes `h.transpose(0, 1)`" in x[0]


def test_a_method_call_is_not_a_call_of_the_binding(tmp_path):
    """`acc.add(delta)` on a tensor, `self.add(...)` and `np.add(...)` do not call the binding
    `add`; `ops.add(...)` on the loaded extension does, and its dense arguments protect it."""
    ext = RING_EXT.replace('m.def("ring_step", &ring_step);', 'm.def("add", &ring_step);')
    py = """
        import numpy as np
        import torch
        from torch.utils.cpp_extension import load

        ops = load(name="ring", sources=["csrc/ring.cpp"])


        class Acc:
            def add(self, a, b, c, d):
                return a

            def step(self, acc, delta):
                acc.add(delta.t(), delta, delta, delta)
                self.add(delta.t(), delta, delta, delta)
                np.add(delta.t(), delta)
                z = torch.zeros(8)
                ops.add(z, z.view(2, 4), torch.empty(8), z.contiguous())
        """
    got = _gpu009(lint_tree(tmp_path, {"csrc/ring.cpp": ext, "acc.py": py}))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["state"]


LAYOUT_EXT = """
#include <torch/extension.h>

static bool same_strides(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); i++)
    if (a.size(i) != b.size(i) || a.stride(i) != b.stride(i)) return false;
  return true;
}

torch::Tensor act_grad(torch::Tensor x, torch::Tensor g, torch::Tensor ref) {
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  TORCH_CHECK(g.numel() == 0 || same_strides(g, x), "g must have x's layout");
  TORCH_CHECK(ref.sizes() == x.sizes(), "ref must have x's shape");   // sizes only
  auto y = torch::empty_like(x);
  launch(x.data_ptr<float>(), g.data_ptr<float>(), ref.data_ptr<float>(), y.data_ptr<float>());  // <-
  return y;
}

torch::Tensor pair(torch::Tensor p, torch::Tensor q) {
  TORCH_CHECK(same_strides(p, q), "p and q must match");   // compared, but neither is checked
  launch(p.data_ptr<float>(), q.data_ptr<float>(), nullptr, nullptr);  // <- pair
  return p;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("act_grad", &act_grad);
  m.def("pair", &pair);
}
"""


def test_a_same_layout_helper_ties_a_tensor_to_a_checked_one(tmp_path):
    """g is compared stride by stride with the checked x: dense. ref only has x's sizes, and p
    and q are compared with each other but neither is checked: all three are reported."""
    got = _gpu009(lint_tree(tmp_path, {"ext.cpp": LAYOUT_EXT}, select=["GPU009"]))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["p", "q", "ref"]


# --- what a real parser sees: lambdas, macros from headers, dispatcher registrations -------------

LAMBDA_EXT = """
#include <torch/extension.h>
__global__ void k(const float* x, float* y, int n) {}

torch::Tensor forward_impl(torch::Tensor x) {
  k<<<1, 256>>>(x.data_ptr<float>(), nullptr, x.numel());   // <- forward_impl
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", [](torch::Tensor x, torch::Tensor out) {
    TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
    k<<<1, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());   // <- scale
  });
  m.def("scale_fresh", [](torch::Tensor x) {
    k<<<1, 256>>>(x.data_ptr<float>(), nullptr, x.numel());
  }, py::arg("x"));
  m.def("forward", [](torch::Tensor x) { return forward_impl(x); });
}
"""


def test_bindings_written_as_lambdas_are_entry_points(tmp_path):
    """A lambda handed to m.def is a function of its own: its reads are checked against its own
    parameters, its calls pass its parameters on, and the project's Python calls of its name
    are its callers (scale_fresh gets torch.zeros at its only call)."""
    py = """
        import torch
        from ext import _C


        def run(x):
            _C.scale_fresh(torch.zeros(4))
            return _C.forward(x)
        """
    got = _gpu009(lint_tree(tmp_path, {"csrc/ext.cpp": LAMBDA_EXT, "ext/__init__.py": "", "ext/run.py": py}))
    want = marked_lines(LAMBDA_EXT, "// <-")
    assert sorted(line for _, line, _ in got) == want
    scale = next(m for _, line, m in got if line == want[1])
    assert scale.startswith("x.data_ptr() reads") and 'the lambda bound as "scale"' in scale


UTILS_H = """
#pragma once
#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
// the contiguity check was commented out when channels-last inputs were tried
#define CHECK_INPUT(x) CHECK_CUDA(x); // CHECK_CONTIGUOUS(x)
#define CHECK_INPUT_STRICT(x) \\
  CHECK_CUDA(x);              \\
  CHECK_CONTIGUOUS(x)
"""

MACRO_EXT = """
#include <torch/extension.h>
#include "utils.h"

void loose(torch::Tensor a) {
  CHECK_INPUT(a);
  launch(a.data_ptr<float>());   // <-
}

void strict(torch::Tensor b) {
  CHECK_INPUT_STRICT(b);
  launch(b.data_ptr<float>());
}

void unknown(torch::Tensor c) {
  VERIFY_DENSE_LAYOUT(c);        // defined in no linted file: judged by its name, and it names no check
  launch(c.data_ptr<float>());   // <-
}

void named(torch::Tensor d) {
  CHECK_IS_CONTIGUOUS(d);        // defined in no linted file: its name says it checks contiguity
  launch(d.data_ptr<float>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("loose", &loose);
  m.def("strict", &strict);
  m.def("unknown", &unknown);
  m.def("named", &named);
}
"""


def test_macros_are_read_by_their_body_in_the_headers_a_file_includes(tmp_path):
    """CHECK_INPUT's name promises a check, but its body (in a project header with no data_ptr
    of its own) has the contiguity check commented out: it checks the device only. Another
    folder's header that defines CHECK_INPUT properly does not decide for this file."""
    other = MACRO_EXT.replace("void ", "void other_").replace('&', '&other_').replace('"loose"', '"o1"') \
        .replace('"strict"', '"o2"').replace('"unknown"', '"o3"').replace('"named"', '"o4"')
    files = {"csrc/utils.h": UTILS_H, "csrc/ext.cu": MACRO_EXT,
             "vendored/utils.h": UTILS_H.replace("// CHECK_CONTIGUOUS(x)", "CHECK_CONTIGUOUS(x)"),
             "vendored/other.cu": other}
    got = _gpu009(lint_tree(tmp_path, files))
    assert sorted((name, line) for name, line, _ in got) == [("ext.cu", n) for n in marked_lines(MACRO_EXT, "// <-")] + \
        [("other.cu", marked_lines(MACRO_EXT, "// <-")[1])]


DISPATCH_EXT = """
#include <ATen/ATen.h>
#include <torch/library.h>

template <typename scalar_t>
__global__ void gather_kernel(const scalar_t* src, const int64_t* idx, scalar_t* out, int64_t n) {}

template <typename scalar_t>
void launch_gather(const at::Tensor& src, const at::Tensor& idx, at::Tensor& out) {
  gather_kernel<scalar_t><<<(idx.numel() + 255) / 256, 256>>>(
      src.data_ptr<scalar_t>(),       // <- src
      idx.data_ptr<int64_t>(),        // <- idx
      out.data_ptr<scalar_t>(), idx.numel());
}

at::Tensor gather_cuda(const at::Tensor& src, const at::Tensor& idx) {
  auto out = at::empty({idx.numel()}, src.options());
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "gather", [&] { launch_gather<scalar_t>(src, idx, out); });
  return out;
}

TORCH_LIBRARY(myops, m) {
  m.def("gather(Tensor src, Tensor idx) -> Tensor");
}

TORCH_LIBRARY_IMPL(myops, CUDA, m) {
  m.impl("gather", TORCH_FN(gather_cuda));
}
"""


def test_dispatcher_registrations_templates_and_kernel_launches(tmp_path):
    """TORCH_LIBRARY_IMPL names the entry point; the template launcher is called from a lambda
    inside AT_DISPATCH (part of gather_cuda) with the entry point's parameters and a fresh
    tensor; the Python caller passes a transposed tensor, and the finding names it."""
    py = """
        import torch


        def gather_rows(table, index):
            return torch.ops.myops.gather(table.t(), index.contiguous())  # <-
        """
    got = _gpu009(lint_tree(tmp_path, {"csrc/gather.cu": DISPATCH_EXT, "ops/__init__.py": "", "ops/gather.py": py}))
    assert [(line, m.split(".data_ptr")[0]) for _, line, m in got] == \
        [(marked_lines(DISPATCH_EXT, "// <- src")[0], "src")]
    assert f"gather.py:{marked_lines(py)[0]} passes `table.t()`" in got[0][2]
    # without Python callers both reads of the entry point's tensors are reported
    got = _gpu009(lint_tree(tmp_path / "alone", {"csrc/gather.cu": DISPATCH_EXT}))
    assert sorted(line for _, line, _ in got) == marked_lines(DISPATCH_EXT, "// <- ")


SHAPES_EXT = """
#include <torch/extension.h>
#define CHECK_DO(x) do { TORCH_CHECK((x).is_contiguous(), #x); } while (0)
#define CHECK_ALL(...) check_all({__VA_ARGS__})
#define CHECK_DEVICES(...) check_devices({__VA_ARGS__})
#define CHECK_TENSOR(x, nd) TORCH_CHECK(x.dim() == nd); TORCH_CHECK(x.is_contiguous())

static void check_dense(const at::Tensor& t) { TORCH_CHECK(t.is_contiguous(), "dense"); }
static void check_cuda(const at::Tensor& t) { TORCH_CHECK(t.is_cuda(), "cuda"); }
void check_all(std::initializer_list<at::Tensor> ts) { for (auto& t : ts) TORCH_CHECK(t.is_contiguous()); }
void check_devices(std::initializer_list<at::Tensor> ts) { for (auto& t : ts) TORCH_CHECK(t.is_cuda()); }

#ifdef WITH_CUDA
TORCH_API std::vector<at::Tensor> a_fwd(at::Tensor& a) {
  CHECK_DO(a);
  launch(a.data_ptr<float>());
  return {a};
}
#endif

C10_EXPORT at::Tensor b_fwd(const at::Tensor& b, int64_t n) {
  CHECK_TENSOR(b, 2);
  check_cuda(b);
  launch(b.data_ptr<float>());
  return b;
}

at::Tensor c_fwd(const at::Tensor& c, const at::Tensor& c2) {
  check_dense(c);
  check_cuda(c2);                                  // a helper that checks the device only
  launch(c.data_ptr<float>(), c2.data_ptr<float>());   // <- c2
  return c;
}

at::Tensor d_fwd(const at::Tensor& d, const at::Tensor& e) {
  CHECK_ALL(d, e);
  CHECK_DEVICES(d, e);
  launch(d.data_ptr<float>(), e.data_ptr<float>());
  return d;
}

at::Tensor g_fwd(const at::Tensor& g) {
  CHECK_DEVICES(g);
  launch((g).data_ptr<float>());                   // <- g
  return g;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("a", &a_fwd, "doc", py::arg("a"));
  m.def("b", &b_fwd);
  m.def("c", &c_fwd);
  m.def("d", &d_fwd);
  m.def("g", &g_fwd);
}
"""


def test_checks_in_the_shapes_extensions_write_them(tmp_path):
    """do { ... } while (0) with a parenthesised argument, a variadic macro handing {__VA_ARGS__}
    to a helper that checks each element in a range-for, a macro with more arguments than the
    tensor, a helper function of the file, in an #ifdef, behind TORCH_API / C10_EXPORT: all
    checks. The same shapes checking the device only are not."""
    got = _gpu009(lint_tree(tmp_path, {"csrc/ext.cu": SHAPES_EXT}))
    assert sorted((line, m.split(".data_ptr")[0]) for _, line, m in got) == \
        [(marked_lines(SHAPES_EXT, "// <- c2")[0], "c2"), (marked_lines(SHAPES_EXT, "// <- g")[0], "g")]


def test_a_method_of_an_object_the_extension_made_is_a_call_of_its_binding(tmp_path):
    """`ws = _C.Ring(n)` is a pybind11 object: `ws.ring_step(...)` calls the bound method, and the
    transposed tensor it passes is named."""
    ext = RING_EXT.replace('m.def("ring_step", &ring_step);',
                           'py::class_<Ring>(m, "Ring").def(py::init<int>()).def("ring_step", &ring_step);')
    py = """
        import torch
        from ringlib import _C


        def run(h):
            ws = _C.Ring(4)
            ws.ring_step(h.t(), torch.empty(4), torch.zeros(4), torch.empty(0))  # <-
        """
    got = _gpu009(lint_tree(tmp_path, {"csrc/ring.cpp": ext, "ringlib/__init__.py": "", "ringlib/run.py": py}))
    x = [m for _, _, m in got if m.startswith("x.")]
    assert len(x) == 1 and f"run.py:{marked_lines(py)[0]} passes `h.t()`" in x[0]
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["state", "x"]


def test_fresh_tensors_at_the_python_call_protect_the_kernel(tmp_path):
    """torch.empty at the call, a buffer registered as torch.empty(...), a .view() of a fresh
    tensor (kept across `out = out.view(...)`) are contiguous; a .view() of a parameter is
    whatever the caller passed."""
    py = """
        import torch
        from torch import nn
        from ringlib import _ext


        class Ring(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("work", torch.empty(n, 2), persistent=False)

            def forward(self, x, bias):
                out = torch.empty(x.numel())
                out = out.view(-1, 2)
                x = x.view(-1, 2)
                _ext.ring_step(x, out, self.work.view(-1), torch.empty(8).view(2, 4))  # <-
                return out
        """
    got = _gpu009(lint_tree(tmp_path, {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/m.py": py}))
    assert sorted(m.split(".data_ptr")[0] for _, _, m in got) == ["state", "x"]
    x = next(m for _, _, m in got if m.startswith("x."))
    assert f"m.py:{marked_lines(py)[0]} passes `x`" in x


def test_a_method_call_of_the_same_name_is_not_a_call_of_the_binding(tmp_path):
    """`buf.ring_init(s.t())` is a method of some object, not the extension's ring_init: it
    neither protects nor blames the binding's argument."""
    other = """
        import torch
        from ringlib._ext import ring_init


        def reset(states, pool):
            ring_init(torch.zeros(8))
            for s in states:
                pool.ring_init(s.t())
        """
    files = {"csrc/ring.cpp": RING_EXT, "ringlib/__init__.py": "", "ringlib/ring.py": RING_PY,
             "ringlib/reset.py": other}
    got = _gpu009(lint_tree(tmp_path, files))
    assert [m for _, _, m in got if m.startswith("state.")] == []
