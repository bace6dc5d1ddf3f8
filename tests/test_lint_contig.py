"""GPU012: a strided view (transpose, permute, .t(), .T, .mT, ...) passed to a kernel that checks
that its input is contiguous, a Triton-style Python launcher that asserts it or a C++ extension
function that TORCH_CHECKs it, directly or through wrappers and across modules. The fixtures are
our own code, written with the shapes such launchers and extensions have (an `assert
x.is_contiguous()` at the top of a launcher, a CHECK_CONTIGUOUS macro in the binding's file)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lint_helpers import lines, lint_source, lint_tree, marked_lines

LAUNCHER = """
import torch


def rms_norm_fwd(x, weight, eps=1e-6):
    assert x.is_contiguous(), "x must be contiguous"
    assert all(t.is_contiguous() for t in (weight,))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def norm(x, weight):
    return rms_norm_fwd(x, weight)


def strict(x, *, weight):
    if not x.is_contiguous():
        raise RuntimeError("x must be contiguous")
    return x * weight
"""

CALLS = """
import torch
from .ops import norm, rms_norm_fwd, strict
from . import ops


def forward(h, w, flag):
    a = rms_norm_fwd(h.transpose(1, 2), w)  # <-
    h = h.permute(0, 2, 1)
    b = norm(h, w)  # <-
    q, k = h.mT, h[0].t()
    c = ops.rms_norm_fwd(q.float(), weight=w)  # <-
    d = strict(k.detach(), weight=w)  # <-
    e = rms_norm_fwd(torch.transpose(h, 0, 1), w)  # <-
    f = rms_norm_fwd(w, h[0].t())  # <- the weight is checked too
    return a, b, c, d, e, f


def near_misses(h, w, flag):
    rms_norm_fwd(h.transpose(1, 2).contiguous(), w)  # made dense
    rms_norm_fwd(h, w)  # a parameter: whatever the caller passes
    rms_norm_fwd(h.transpose(1, 1), w)  # an identity
    rms_norm_fwd(h.permute(0, 1, 2), w)  # an identity
    rms_norm_fwd(h.mT.to(memory_format=torch.contiguous_format), w)
    v = h.transpose(1, 2)
    if flag:
        v = v.contiguous()
    rms_norm_fwd(v, w)  # assigned in a branch on the way
    for _ in range(2):
        u = h
        rms_norm_fwd(u, w)
        u = h.t()
    torch.nn.functional.layer_norm(h.t(), (4,))  # a library function
    return [rms_norm_fwd(t, w) for t in (h.t(),)]  # a comprehension's variable
"""


def test_launchers_wrappers_and_modules(tmp_path):
    result = lint_tree(tmp_path / "p", {"pkg/__init__.py": "", "pkg/ops.py": LAUNCHER, "pkg/model.py": CALLS},
                       select=["GPU012"])
    found = [(f.path.rsplit("/", 1)[-1], f.line) for f in result.findings]
    marked = marked_lines(CALLS)
    assert found == [("model.py", n) for n in marked]
    by_line = {f.line: f for f in result.findings}
    weight_line = marked[5]
    wrapper = by_line[marked[1]].message
    assert "norm() hands `x` to rms_norm_fwd(), which asserts `x.is_contiguous()`" in wrapper
    assert "strided view (line 8) made by .permute()" in wrapper
    assert "raises unless `x.is_contiguous()`" in by_line[marked[3]].message
    assert by_line[weight_line].message.startswith("`h[0].t()` is a strided view made by .t()") and \
        "`weight.is_contiguous()`" in by_line[weight_line].message
    assert all(f.kb_id == "noncontiguous-kernel-input" and f.fix.applicability == "unsafe" for f in result.findings)


def test_fix_makes_the_argument_dense_and_the_call_runs(tmp_path):
    torch = pytest.importorskip("torch")
    del torch
    root = tmp_path / "p"
    main = """
    import torch
    from pkg.model import forward

    h = torch.randn(2, 4, 4)
    w = torch.ones(4)
    print(sum(float(t.sum()) for t in forward(h, w, False)))
    """
    lint_tree(root, {"pkg/__init__.py": "", "pkg/ops.py": LAUNCHER, "pkg/model.py": CALLS, "main.py": main},
              select=["GPU012"])
    failed = subprocess.run([sys.executable, "main.py"], cwd=root, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "AssertionError: x must be contiguous" in failed.stderr
    fixed = subprocess.run([sys.executable, "-m", "gpudoctor", "lint", "--isolated", "--fix", "--unsafe-fixes",
                            "--select", "GPU012", "."], cwd=root, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    text = (root / "pkg/model.py").read_text()
    assert "rms_norm_fwd(h.transpose(1, 2).contiguous(), w)  # <-" in text and "b = norm(h.contiguous(), w)" in text
    clean = subprocess.run([sys.executable, "main.py"], cwd=root, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    again = subprocess.run([sys.executable, "-m", "gpudoctor", "lint", "--isolated", "--select", "GPU012", "pkg"],
                           cwd=root, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "GPU012" not in again.stdout


EXTENSION = r"""
#include <torch/extension.h>

#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CONTIGUOUS(x)

torch::Tensor scale_fwd(torch::Tensor x, double s) {
  CHECK_INPUT(x);
  auto out = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] = src[i] * s;
  return out;
}

torch::Tensor shift_fwd(torch::Tensor x) {
  return x + 1;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale_fwd", &scale_fwd, "scale");
  m.def("shift_fwd", &shift_fwd, "shift");
}
"""

EXTENSION_CALLS = """
from pkg import _C


def scale(x, s):
    return _C.scale_fwd(x, s)


def run(h):
    a = _C.scale_fwd(h.transpose(0, 1), 2.0)  # <-
    b = scale(h.T, 3.0)  # <-
    c = _C.scale_fwd(h.t().contiguous(), 2.0)
    d = _C.shift_fwd(h.t())  # shift_fwd checks nothing
    return a, b, c, d
"""


def test_a_binding_whose_cpp_function_checks(tmp_path):
    result = lint_tree(tmp_path / "p", {"csrc/ext.cpp": EXTENSION, "pkg/__init__.py": "", "pkg/run.py": EXTENSION_CALLS},
                       select=["GPU012"])
    assert [f.code for f in result.findings] == ["GPU012", "GPU012"]
    assert lines(result, "GPU012") == marked_lines(EXTENSION_CALLS)
    first = result.findings[0].message
    assert "scale_fwd() is bound to the extension's C++ function scale_fwd()" in first and "csrc/ext.cpp" in first
    # GPU009 alone: the extension checks its input, so its raw reads are fine; GPU012 is not reported
    only9 = lint_tree(tmp_path / "q", {"csrc/ext.cpp": EXTENSION, "pkg/__init__.py": "", "pkg/run.py": EXTENSION_CALLS},
                      select=["GPU009"])
    assert only9.findings == []


def test_another_frameworks_function_of_the_same_name_is_not_the_binding(tmp_path):
    """A project with a Paddle version beside its PyTorch one (RT-DETR's rtdetr_paddle) calls
    `paddle.matmul(q.transpose(...))`: Paddle's function, not the extension's binding of that name."""
    paddle = """
        import paddle
        import paddle.nn.functional as PF


        def attend(h):
            return paddle.scale_fwd(h.transpose([0, 2, 1]), 2.0)
        """
    files = {"csrc/ext.cpp": EXTENSION, "pkg/__init__.py": "", "pkg/run.py": EXTENSION_CALLS, "pkg/pd.py": paddle}
    result = lint_tree(tmp_path, files, select=["GPU012"])
    assert [f.path.rsplit("/", 1)[-1] for f in result.findings] == ["run.py", "run.py"]


def test_a_file_alone_reports_what_it_can_see(tmp_path):
    """A launcher and its caller in one script, the form a notebook or a benchmark has."""
    script = LAUNCHER + textwrap.dedent("""
    h = torch.randn(2, 3, 4)
    out = rms_norm_fwd(h.transpose(0, 1), torch.ones(4))  # <-
    """)
    result = lint_source(tmp_path, script, select=["GPU012"])
    assert lines(result, "GPU012") == marked_lines(script)


MULTILINE_CHECK = """
def gelu_fwd(x):
    assert (
        x.is_contiguous()
    ), "x must be contiguous"
    return x


def gelu(h):
    return gelu_fwd(h.permute(1, 0))  # <-
"""


def test_the_prefilters_lose_no_gpu012_finding(tmp_path):
    """The worker parses a Python file for GPU012 only when it mentions `is_contiguous` (or a
    binding or CHECK_), and the callers are read only by the cross-file step: with the
    prefilters off (engine.lint(unfiltered=True)) the same findings, on launchers across
    modules, a check spread over lines, a C++ binding that checks, and the patch fixture."""
    import pathlib
    import shutil

    from gpudoctor.lint import engine

    trees = {
        "py": {"pkg/__init__.py": "", "pkg/ops.py": LAUNCHER, "pkg/model.py": CALLS, "pkg/gelu.py": MULTILINE_CHECK},
        "ext": {"csrc/ext.cpp": EXTENSION, "pkg/__init__.py": "", "pkg/run.py": EXTENSION_CALLS},
    }
    roots = []
    for name, files in trees.items():
        lint_tree(tmp_path / name, files, select=["GPU012"])  # writes the files
        roots.append(tmp_path / name)
    fixture = pathlib.Path(__file__).parent / "fixtures" / "patch" / "mamba_norm"
    shutil.copytree(fixture, tmp_path / "mamba")
    roots.append(tmp_path / "mamba")
    for root in roots:
        key = lambda r: sorted((f.path, f.line, f.col, f.code) for f in r.findings)  # noqa: E731
        normal, _, _ = engine.lint([str(root)], select=["GPU012"], isolated=True, jobs=1)
        unfiltered, _, _ = engine.lint([str(root)], select=["GPU012"], isolated=True, jobs=1, unfiltered=True)
        assert normal.findings and key(unfiltered) == key(normal), root.name
    gelu = [f for f in engine.lint([str(tmp_path / "py")], select=["GPU012"], isolated=True, jobs=1)[0].findings
            if f.path.endswith("gelu.py")]
    assert [f.line for f in gelu] == marked_lines(MULTILINE_CHECK)


DOCSTRING_EXAMPLE = '''"""A module docstring that shows an example at column 0:

def looks_like(x):
    assert x.is_contiguous()
"""
'''

FIRST_LOOK = '''import torch


@torch.no_grad()
def decorated(x, w):
    assert x.is_contiguous() and w.is_contiguous()
    return x @ w


def signature_over_lines(
    x,
    y,
):
    if not x.is_contiguous():
        raise ValueError("x")
    return x + y


async def later(x):
    assert x.is_contiguous()
    return x


class Launcher:
    def method(self, x):
        assert x.is_contiguous()  # a method: not a module-level function


def does_not_check(x):
    return x.is_contiguous()
'''


def test_the_first_look_finds_what_the_whole_tree_finds():
    """A Python file only GPU012 wants is not parsed whole: the module-level functions that
    check are read from the pieces of text that mention is_contiguous. It finds what the whole
    syntax tree gives; a piece that does not parse (a column-0 `def` in a string) sends the file
    to the whole parse."""
    import ast

    from gpudoctor.lint import pycontig
    from gpudoctor.lint.pysource import PySource

    def whole(text):
        return pycontig.checking_functions(PySource("m.py", text, ast.parse(text), "m", False))

    assert whole(FIRST_LOOK) == ("decorated", "later", "signature_over_lines")
    assert pycontig.checking_functions_in_text(FIRST_LOOK, "m.py") == whole(FIRST_LOOK)
    assert pycontig.checking_functions_in_text(DOCSTRING_EXAMPLE + FIRST_LOOK, "m.py") is None
    cut = 'def f(x):\n    s = """\ndef g(y):\n"""\n    assert x.is_contiguous()\n'
    assert whole(cut) == ("f",) and pycontig.checking_functions_in_text(cut, "m.py") is None
    assert pycontig.checking_functions_in_text("import torch\nx = 1\n", "m.py") == ()
    for name, text in (("LAUNCHER", LAUNCHER), ("MULTILINE_CHECK", MULTILINE_CHECK)):
        text = textwrap.dedent(text)
        assert pycontig.checking_functions_in_text(text, "m.py") == whole(text) != (), name
