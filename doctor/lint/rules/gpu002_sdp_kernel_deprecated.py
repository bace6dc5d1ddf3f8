"""GPU002 (sdp-kernel-deprecated): torch.backends.cuda.sdp_kernel() is deprecated.

Its documentation (what `gpudoctor explain GPU002` prints, and its row in docs/lint.md) and its
prefilter, as data; and its check (`check`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from gpudoctor.lint.model import DISPLAY_ONLY, SAFE, Edit, Finding, Fix
from gpudoctor.lint.pysource import PySource, any_of, finding
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyrules import Facts

RULE = Rule(
    code="GPU002",
    name="sdp-kernel-deprecated",
    kb_id="sdp-kernel-deprecated",
    level="warning",
    title="torch.backends.cuda.sdp_kernel() is deprecated",
    kinds=(PYTHON,),
    prefilter=((b"sdp_kernel",),),
    what="A use of torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=..., enable_cudnn=...).",
    why=(
        "Since PyTorch 2.3 it is a deprecated shim (FutureWarning) over "
        "torch.nn.attention.sdpa_kernel and will be removed; the warning names contextlib.py, not "
        "your line, so it is hard to find by hand."
    ),
    example="with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):",
    fix=(
        "with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):  "
        "# from torch.nn.attention import SDPBackend, sdpa_kernel. The list holds the backends whose "
        "flag was true, in the shim's order; enable_cudnn defaults to True, so cuDNN is listed unless "
        "the old call turned it off (drop it by hand if the code predates PyTorch 2.3 and meant "
        "'memory-efficient only')."
    ),
    fix_safety=(
        "safe: when every enable_* argument is a literal True/False the new call is exactly what the "
        "shim runs (PyTorch >= 2.3), and the import is added after the module's imports. With a "
        "computed flag the fix is display-only."
    ),
    near_misses="torch.nn.attention.sdpa_kernel itself, and a function merely named sdp_kernel in your own module, do not fire.",
)


_SDP_ORDER = (("enable_flash", "FLASH_ATTENTION"), ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
              ("enable_math", "MATH"), ("enable_cudnn", "CUDNN_ATTENTION"))


_SDP_POSITIONAL = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")


_SDP = "torch.backends.cuda.sdp_kernel"


def check(src: PySource, facts: Facts | None = None) -> list[Finding]:
    out: list[Finding] = []
    call_funcs: set[int] = set()
    calls: list[ast.Call] = []
    refs: list[ast.AST] = []
    for node, _ in src.nodes_on_lines(src.lines_matching(any_of(src.spellings(_SDP))), (ast.Call, ast.Attribute, ast.Name)):
        if isinstance(node, ast.Call) and src.qualname(node.func) == _SDP:
            calls.append(node)
            call_funcs.add(id(node.func))
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
            refs.append(node)
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    for node in refs:
        if id(node) not in call_funcs and src.qualname(node) == _SDP:
            out.append(finding(src, node, "GPU002",
                                "torch.backends.cuda.sdp_kernel is deprecated (FutureWarning since PyTorch 2.3) and "
                                "will be removed: use torch.nn.attention.sdpa_kernel with a list of SDPBackend values",
                                Fix(DISPLAY_ONLY, "use torch.nn.attention.sdpa_kernel([...SDPBackend...])")))
    for call in calls:
        backends = _sdp_backends(call)
        message = ("torch.backends.cuda.sdp_kernel() is deprecated (FutureWarning since PyTorch 2.3) and will be "
                   "removed: use torch.nn.attention.sdpa_kernel(")
        if backends is None:
            out.append(finding(src, call, "GPU002", message + "[...]) listing the backends whose flag is true",
                                Fix(DISPLAY_ONLY, "list the SDPBackend members whose enable_* flag is true")))
            continue
        listed = "[" + ", ".join(f"SDPBackend.{b}" for b in backends) + "]"
        fix = _sdp_fix(src, call, listed)
        out.append(finding(src, call, "GPU002", message + listed + ")", fix))
    return out


def _sdp_backends(call: ast.Call) -> list[str] | None:
    flags = {name: True for name in _SDP_POSITIONAL}
    if len(call.args) > len(_SDP_POSITIONAL):
        return None
    for name, arg in zip(_SDP_POSITIONAL, call.args):
        if isinstance(arg, ast.Starred) or not (isinstance(arg, ast.Constant) and isinstance(arg.value, bool)):
            return None
        flags[name] = arg.value
    for kw in call.keywords:
        if kw.arg not in flags or not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
            return None
        flags[kw.arg] = kw.value.value
    return [backend for name, backend in _SDP_ORDER if flags[name]]


def _sdp_fix(src: PySource, call: ast.Call, listed: str) -> Fix:
    description = "use sdpa_kernel(%s) (from torch.nn.attention import SDPBackend, sdpa_kernel)" % listed
    have = src.imports.get("sdpa_kernel") == "torch.nn.attention.sdpa_kernel" and \
        src.imports.get("SDPBackend") == "torch.nn.attention.SDPBackend"
    bound = _module_bindings(src)
    if not have and (("sdpa_kernel" in bound and src.imports.get("sdpa_kernel") != "torch.nn.attention.sdpa_kernel")
                     or ("SDPBackend" in bound and src.imports.get("SDPBackend") != "torch.nn.attention.SDPBackend")):
        return Fix(DISPLAY_ONLY, description)
    edits = []
    start, end = src.span(call)
    edits.append(Edit(start, end, f"sdpa_kernel({listed})"))
    if not have:
        if not src.import_nodes:
            return Fix(DISPLAY_ONLY, description)
        last = src.import_nodes[-1]
        pos = src.offset(last.end_lineno, last.end_col_offset)  # type: ignore[arg-type]
        edits.append(Edit(pos, pos, src.newline + "from torch.nn.attention import SDPBackend, sdpa_kernel"))
    return Fix(SAFE, description, tuple(edits))


def _module_bindings(src: PySource) -> set[str]:
    """Names bound anywhere in the file that could shadow the fix's imports."""
    names = set(src.imports) | {n.name for n in src.functions} | {c.name for c in src.classes}
    for name in ("sdpa_kernel", "SDPBackend"):
        if re.search(r"\b%s\s*(=|,[^\n]*=)|as\s+%s\b" % (name, name), src.text):
            names.add(name)
    return names
