"""GPU001 (naive-attention): hand-written attention materialises the full score matrix.

Its documentation (what `gpudoctor explain GPU001` prints, and its row in docs/lint.md) and its
prefilter, as data; and the finding it makes of hand-written attention the dataflow of
gpudoctor.lint.pyflow reports (`finding_for`, called by gpudoctor.lint.pyrules).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix
from gpudoctor.lint.pysource import PySource, call_name, finding, walk
from gpudoctor.lint.rules import PYTHON, Rule

if TYPE_CHECKING:
    from gpudoctor.lint.pyvalues import AttentionEvent

# GPU001: a product of two operands (not a decorator's @).
ATTENTION_PRODUCT_ANY = (rb"bmm\(", rb"matmul\(", rb"einsum\(", rb"[\w)\]][ \t]*@[ \t]*[\w(]")
ATTENTION_PRODUCT = b"|".join(ATTENTION_PRODUCT_ANY)

RULE = Rule(
    code="GPU001",
    name="naive-attention",
    kb_id="attention-oom",
    level="warning",
    title="hand-written attention materialises the full score matrix",
    kinds=(PYTHON,),
    # a softmax, or probabilities from a helper (get_attention_scores, another module's)
    prefilter=((b"softmax", b"get_attention_scores", b"probs", b"scores"), (b"bmm", b"matmul", b"@", b"einsum")),
    pattern=(ATTENTION_PRODUCT_ANY,),
    what=(
        "A product of two activations (torch.baddbmm / bmm / matmul / einsum / @, typically q and "
        "k transposed) whose result goes through a softmax and is then multiplied with a third "
        "tensor (v): attention computed by hand. The finding points at the product that creates "
        "the score matrix; when the scores come from a helper (diffusers' get_attention_scores, or a "
        "function of another module that returns a softmax of a product, or the raw product), at the "
        "helper call in the function that multiplies with the values."
    ),
    why=(
        "The score matrix holds batch x heads x query_len x key_len elements, quadratic in the "
        "sequence length, and the softmax allocates another one of the same size (twice that when "
        "it upcasts to float32). Video and high-resolution diffusion models reach tens or hundreds "
        "of GiB for that one tensor (a ControlVideo run asked for 112.50 GiB on a 32 GiB GPU). "
        "Fused kernels (torch.nn.functional.scaled_dot_product_attention, xformers, flash_attn) "
        "never build the matrix and need memory linear in the sequence length."
    ),
    example=(
        "scores = torch.baddbmm(empty, query, key.transpose(-1, -2), beta=0, alpha=scale)\n"
        "probs = scores.softmax(dim=-1)\n"
        "out = torch.bmm(probs, value)"
    ),
    fix=(
        "Use F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale) on (B, H, N, D) "
        "tensors. From (B*H, N, D) inputs: q.view(B, H, N, D) for each of q, k, v, then "
        "out.reshape(B * H, N, D) afterwards (reshape, not view: see GPU003)."
    ),
    fix_safety=(
        "display-only: the rewrite must keep the mask semantics (additive vs boolean), the scale, "
        "any upcast to float32 and the head layout, so it is left to you; the maths is the same, "
        "float rounding differs slightly. Compare outputs on a small input before switching."
    ),
    near_misses=(
        "A baddbmm/bmm/matmul whose result is not passed through a softmax and then into another "
        "product (a linear layer, a bias-add GEMM, a gating softmax that is not multiplied with "
        "values) does not fire, and neither does a product with a module weight (self.weight), "
        "attention over query slices taken in a loop (sliced attention: the slice bounds its memory), "
        "or a helper that only returns probabilities (the processor that multiplies them changes), "
        "or a branch beside F.scaled_dot_product_attention (a fallback) unless the constructor's "
        "defaults select it (attention_mode=\"math\", enable_flash_attn=False)."
    ),
)


def _beside_sdpa(src: PySource, node: ast.AST) -> bool:
    """Hand-written attention in one branch of an `if` whose other branch calls PyTorch's SDPA is
    a deliberate fallback (old torch, export, a debug flag), not the path that runs. A branch
    beside xformers or flash_attn is different: that is what runs when those packages are
    missing or fail on a new GPU, so it is still reported."""
    line = node.lineno  # type: ignore[attr-defined]
    for st, scope in src.stmts:
        if not isinstance(st, ast.If) or not (st.lineno <= line <= st.end_lineno):  # type: ignore[operator]
            continue
        for here, other in ((st.body, st.orelse), (st.orelse, st.body)):
            if here and other and here[0].lineno <= line <= here[-1].end_lineno:  # type: ignore[operator]
                text = "".join(src.lines[other[0].lineno - 1:other[-1].end_lineno])
                if "scaled_dot_product_attention" in text:
                    return not _default_branch(src, st, line, scope)
    return False


_UNKNOWN = object()


def _default_branch(src: PySource, st: ast.If, line: int, scope: ast.AST) -> bool:
    """Whether the if/elif chain `st` takes the branch holding `line` when the class's switches
    have their constructor defaults (`attention_mode="math"`, `enable_flash_attn=False` stored as
    self.attention_mode / self.enable_flash_attn): then the hand-written branch is what runs
    unless a caller asks otherwise, and SDPA beside it does not excuse it."""
    defaults: dict[str, object] = {}
    for cls in src.classes:
        if not (cls.lineno <= line <= cls.end_lineno):  # type: ignore[operator]
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                a = fn.args
                positional = a.posonlyargs + a.args
                pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults)) + \
                    [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                given = {x.arg: d.value for x, d in pairs if isinstance(d, ast.Constant)}
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in given:
                        for t in n.targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                defaults[t.attr] = given[n.value.id]
    if not defaults:
        return False
    local: dict[str, list[ast.expr]] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and n.lineno < st.lineno:
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        local.setdefault(t.id, []).append(n.value)

    def value(e: ast.AST, depth: int = 0) -> object:
        if depth > 6:
            return _UNKNOWN
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
            return defaults.get(e.attr, _UNKNOWN)
        if isinstance(e, ast.Name):
            assigned = local.get(e.id, [])
            return value(assigned[0], depth + 1) if len(assigned) == 1 else _UNKNOWN
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = value(e.operand, depth + 1)
            return _UNKNOWN if v is _UNKNOWN else not v
        if isinstance(e, ast.BoolOp):
            unknown = False
            for part in e.values:
                v = value(part, depth + 1)
                if v is _UNKNOWN:
                    unknown = True
                elif isinstance(e.op, ast.And) and not v:
                    return False
                elif isinstance(e.op, ast.Or) and v:
                    return True
            return _UNKNOWN if unknown else isinstance(e.op, ast.And)
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
            left, right = value(e.left, depth + 1), value(e.comparators[0], depth + 1)
            if isinstance(e.comparators[0], (ast.Tuple, ast.List, ast.Set)):
                items = [value(x, depth + 1) for x in e.comparators[0].elts]
                if left is _UNKNOWN or _UNKNOWN in items:
                    return _UNKNOWN
                found = left in items
                return found if isinstance(e.ops[0], ast.In) else not found
            if left is _UNKNOWN or right is _UNKNOWN or isinstance(e.ops[0], (ast.In, ast.NotIn)):
                return _UNKNOWN
            return (left == right) if isinstance(e.ops[0], ast.Eq) else (left != right)
        return _UNKNOWN

    node: ast.If | None = st
    while node is not None:
        v = value(node.test)
        if v is _UNKNOWN:
            return False
        branch = node.body if v else node.orelse
        if not branch:
            return False
        if branch[0].lineno <= line <= branch[-1].end_lineno:  # type: ignore[operator]
            if len(branch) == 1 and isinstance(branch[0], ast.If) and not v and \
                    branch[0].lineno <= line <= branch[0].end_lineno:  # type: ignore[operator]
                node = branch[0]  # an elif: decide its own test
                continue
            return True
        return False
    return False


def _chunked(src: PySource, node: ast.AST) -> bool:
    """Scores of a slice of the queries taken in a loop (`for i in range(0, n, step): s =
    q[:, i:i + step] @ k.T`): sliced attention, whose memory the step bounds (the remedy the
    knowledge base itself gives when SDPA is not available), not the full matrix."""
    if isinstance(node, ast.Call):
        operands = list(node.args)
    elif isinstance(node, ast.BinOp):
        operands = [node.left, node.right]
    else:
        return False
    bounds = set()
    for op in operands:
        while isinstance(op, ast.Call) and isinstance(op.func, ast.Attribute):  # q[:, i:j].float()
            op = op.func.value
        if isinstance(op, ast.Subscript):
            parts = op.slice.elts if isinstance(op.slice, ast.Tuple) else [op.slice]
            for p in parts:
                if isinstance(p, ast.Slice):
                    bounds |= {n.id for b in (p.lower, p.upper) if b is not None for n in walk([b])
                               if isinstance(n, ast.Name)}
    if not bounds:
        return False
    line = node.lineno  # type: ignore[attr-defined]
    for st, _ in src.stmts:
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)) and st.lineno < line <= st.end_lineno:  # type: ignore[operator]
            bound_here = {n.id for n in walk([st.target]) if isinstance(n, ast.Name)} if not isinstance(st, ast.While) else set()
            for inner in walk(st.body):
                if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    bound_here |= {n.id for t in targets for n in walk([t]) if isinstance(n, ast.Name)}
            if bounds & bound_here:
                return True
    return False


def _finding(src: PySource, ev: AttentionEvent) -> Finding:
    node = ev.scores
    what = f"{call_name(node)}()" if isinstance(node, ast.Call) else "this @ product"
    message = (f"hand-written attention: {what} builds the full score matrix (batch x heads x N x M), which a "
               f"softmax normalises and line {ev.product.lineno} multiplies with the values; memory grows "
               f"with the square of the sequence length: use F.scaled_dot_product_attention")  # type: ignore[attr-defined]
    return finding(src, node, "GPU001", message,
                    Fix(DISPLAY_ONLY, "replace the product, softmax and product with "
                        "F.scaled_dot_product_attention(q, k, v, attn_mask=..., scale=...) on (B, H, N, D) tensors"))


def finding_for(src: PySource, ev: AttentionEvent) -> Finding | None:
    """The finding for hand-written attention the dataflow reports, or None where it is a fallback
    beside SDPA that does not run by default, or computed in chunks."""
    return None if _beside_sdpa(src, ev.scores) or _chunked(src, ev.scores) else _finding(src, ev)
