"""The interpreter's attention operations (a mixin of `gpudoctor.lint.pyflow.Interp`): products of
two activations (the score matrix of hand-written attention, GPU001), softmax, PyTorch's SDPA
(whose output layout depends on the backend: GPU003) and flash_attn's layout (GPU008).
"""
from __future__ import annotations

import ast
from dataclasses import replace
from typing import Any

from gpudoctor.lint.pysource import dotted, kwarg
from gpudoctor.lint.pyvalues import (TV, AttentionEvent, FlashLayoutEvent, _FLASH, _as_tv, _blank, _identity)


class AttentionOps:
    """Attention on abstract tensors; mixed into Interp (uses `self.events`)."""

    def product(self, a: Any, b: Any, node: ast.AST, anode: ast.AST | None, bnode: ast.AST | None) -> TV:
        a, b = _as_tv(a), _as_tv(b)
        if _blank(a) and a.attn_origin is not None and not self._weightish(bnode):
            # probabilities @ values, if the helper returns probabilities
            a = replace(a, attn="probs", cond=(a.opaque, "probs"))  # type: ignore[arg-type]
        probs = a if a.attn == "probs" else b if b.attn == "probs" else None
        if probs is not None and self._weightish(bnode if probs is a else anode):
            probs = None  # probabilities times a parameter: a classifier, not attention
        rank = max(a.rank, b.rank) if a.rank is not None and b.rank is not None and min(a.rank, b.rank) >= 2 else None
        dims = None
        if rank is not None and a.dims and b.dims and a.rank == b.rank:
            dims = a.dims[:-1] + (b.dims[-1],)
        roles = None
        if rank is not None and b.roles and a.roles and a.rank == b.rank:
            roles = b.roles[:-2] + (a.roles[-2], b.roles[-1])
        out = TV(rank=rank, dims=dims, layouts=frozenset({_identity(rank)}) if rank else None, roles=roles)
        if probs is not None:
            origin = probs.attn_origin
            if origin is not None and id(origin) not in self._attn_reported:
                if probs.cond is None:
                    self._attn_reported.add(id(origin))
                self.events.append(AttentionEvent(origin, node, probs.cond))
            return out
        if self._weightish(anode) or self._weightish(bnode):
            return out
        return replace(out, attn="scores", attn_origin=node)

    @staticmethod
    def _weightish(node: ast.AST | None) -> bool:
        """self.weight, self.proj.weight (also transposed or cast): a module's parameter, not an
        activation."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("t", "transpose", "to", "float", "half", "type_as", "permute"):
            node = node.func.value
        if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
            node = node.value
        if not isinstance(node, ast.Attribute):
            return False
        key = dotted(node)
        return bool(key) and key.startswith("self.")  # type: ignore[union-attr]

    def softmax(self, v: Any) -> TV:
        tv = _as_tv(v)
        if tv.attn == "scores":
            return TV(rank=tv.rank, dims=tv.dims, roles=tv.roles, attn="probs", attn_origin=tv.attn_origin,
                      cond=tv.cond)
        if _blank(tv) and tv.attn_origin is not None:
            # the softmax of a helper's result: probabilities if the helper returns scores
            return TV(attn="probs", attn_origin=tv.attn_origin, cond=(tv.opaque, "scores"))  # type: ignore[arg-type]
        return TV(rank=tv.rank, dims=tv.dims, roles=tv.roles)

    def sdpa(self, q: TV, v: TV, node: ast.Call) -> TV:
        r = q.rank
        dims = None
        if q.dims and v.dims and r:
            dims = q.dims[:-1] + (v.dims[-1],)
        if r is None:
            return TV(roles=q.roles)
        layouts = {_identity(r)}
        if r == 4:
            layouts.add((0, 2, 1, 3))  # memory-efficient: always (B, N, H, D) memory
        if q.layouts:
            layouts |= set(q.layouts)  # flash and cuDNN: the output is laid out like the query
        return TV(rank=r, dims=dims, layouts=frozenset(layouts), origin=node, origin_kind="sdpa", roles=q.roles)

    def flash(self, name: str, node: ast.Call, args: list[Any], kws: dict[str, Any]) -> None:
        params = _FLASH[name]
        vals = []
        for i, p in enumerate(params):
            n = node.args[i] if i < len(node.args) else kwarg(node, p)
            vals.append((p, n, args[i] if i < len(args) else kws.get(p)))
        for p, n, v in vals:
            packed = p in ("qkv", "kv")
            if isinstance(v, TV) and v.rank == (5 if packed else 4) and v.roles and v.roles[1] == "heads" and \
                    n is not None:
                what = ("(batch, heads, 3, seqlen, head_dim)" if p == "qkv" else "(batch, heads, 2, seqlen, head_dim)") \
                    if packed else "(batch, heads, seqlen, head_dim) (the SDPA layout)"
                wants = "(batch, seqlen, 3, heads, head_dim): stack (b, s, h, d) tensors on dim 2" if p == "qkv" else \
                    "(batch, seqlen, 2, heads, head_dim)" if p == "kv" else "(batch, seqlen, heads, head_dim)"
                self.events.append(FlashLayoutEvent(node, n, f"{p} is laid out {what}; {name} wants {wants}"))
                return
        if name == "flash_attn_func" and len(vals) == 3:
            tvs = [v if isinstance(v, TV) else None for _, _, v in vals]
            dims = [t.dims if t is not None and t.rank == 4 and t.dims and all(t.dims) else None for t in tvs]
            if all(dims) and len(set(dims)) == 2:
                # q, k, v built with the same sizes, one of them transposed on the way
                for i, d in enumerate(dims):
                    others = {x for j, x in enumerate(dims) if j != i}
                    if len(others) == 1 and d == (lambda o: (o[0], o[2], o[1], o[3]))(next(iter(others))) and \
                            tvs[i].t12 % 2 == 1:  # type: ignore[union-attr]
                        p, n, _ = vals[i]
                        kept = [q for j, (q, _, _) in enumerate(vals) if j != i]
                        self.events.append(FlashLayoutEvent(
                            node, n, f"only {p} went through transpose(1, 2), not {', '.join(kept)}: {name} wants "
                                     f"all of q, k, v in (batch, seqlen, heads, head_dim)"))
                        return
        if name == "flash_attn_func" and len(vals) == 3 and all(isinstance(n, ast.Name) for _, n, _ in vals):
            tvs = [_as_tv(v) for _, _, v in vals]
            if all(t.src for t in tvs) and len({t.t12 % 2 for t in tvs}) > 1:
                moved = [p for (p, _, _), t in zip(vals, tvs) if t.t12 % 2]
                kept = [p for (p, _, _), t in zip(vals, tvs) if not t.t12 % 2]
                where = next(n for (p, n, _), t in zip(vals, tvs) if t.t12 % 2)
                self.events.append(FlashLayoutEvent(
                    node, where, f"only {', '.join(moved)} went through transpose(1, 2), not "
                                 f"{', '.join(kept)}: {name} wants all of q, k, v in (batch, seqlen, "
                                 f"heads, head_dim)"))
