"""GPU012 (strided-into-checking-kernel): a transposed or permuted view is passed to a kernel that checks that its input is contiguous.

Its documentation (what `gpudoctor explain GPU012` prints, and its row in docs/lint.md) and its
prefilter, as data; and its check. In Python files `check` records the file's functions that
check a parameter's contiguity (gpudoctor.lint.pycontig), whose callers the cross-file step reads;
in C++ files the extension functions that check are GPU009's reading (gpudoctor.lint.cpprules).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.lint.rules import CPP, PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.model import Finding
    from gpudoctor.lint.pyrules import Facts
    from gpudoctor.lint.pysource import PySource

RULE = Rule(
    code="GPU012",
    name="strided-into-checking-kernel",
    kb_id="noncontiguous-kernel-input",
    title="a transposed or permuted view is passed to a kernel that checks that its input is contiguous",
    # Python: the functions that check (their callers are read by the cross-file step); C++:
    # the extension functions whose checks decide (GPU009's reading: bindings, macros, helpers)
    kinds=(PYTHON, CPP),
    prefilter=((b"is_contiguous", b"PYBIND11_MODULE", b"TORCH_LIBRARY", b"CHECK_"),),
    what=(
        "A call passes a strided view (x.transpose(...), .permute(...), .t(), .T, .mT, .movedim(...), "
        ".swapaxes(...), made at the call or assigned to the name it passes in straight-line code, and "
        "kept through .to() / .float() / .clone() and the like) to a kernel that checks that argument's "
        "contiguity: a Python function of the project that asserts it (assert x.is_contiguous(), "
        "if not x.is_contiguous(): raise, as Triton launchers do), a C++ extension function bound for "
        "Python that checks it (TORCH_CHECK(x.is_contiguous()), CHECK_INPUT; read as GPU009 reads it), "
        "or a function that hands the parameter on unchanged to one of those. Reported at the argument."
    ),
    why=(
        "A view made by a transpose or permute shares the storage with other strides, so it is not "
        "contiguous, and the kernel refuses it where it checks: AssertionError, 'x must be contiguous', "
        "'Expected x.is_contiguous() to be true'. The traceback ends inside the kernel's wrapper; the "
        "argument to change is at the call."
    ),
    example=("def fwd(x):\n    assert x.is_contiguous()\n    return _launch(x)\n\n"
             "y = fwd(h.transpose(1, 2))"),
    fix="y = fwd(h.transpose(1, 2).contiguous())",
    fix_safety=(
        "unsafe: .contiguous() copies a strided view, so a kernel that writes into that argument "
        "(an output buffer passed in) writes into the copy; for inputs it is what the kernel asked for."
    ),
    near_misses=(
        "Views made contiguous (.contiguous(), memory_format=), identity transposes and permutes, "
        "names assigned in a branch or a loop on the way to the call, parameters, unpacked iterables, "
        "kernels that copy (x = x.contiguous()) or read strides instead of checking, checks after the "
        "parameter was rebound, methods and autograd.Function.apply, and library functions "
        "(torch, numpy, einops) do not fire."
    ),
)


def check(src: PySource, facts: Facts) -> list[Finding]:
    """No finding from the file alone: its functions that check contiguity, for the cross-file step."""
    from gpudoctor.lint import pycontig

    facts.contig_checkers = pycontig.checking_functions(src)
    return []
