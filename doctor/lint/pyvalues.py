"""The values `gpudoctor.lint.pyflow`'s interpreter binds names to, and the events it reports.

* Symbolic sizes (`Sym`): a coefficient times named factors with integer exponents, so that
  `H * (C // H) == C` and `B * N` matches a merge of the dimensions B and N.
* Abstract values: a tensor (`TV`: rank, symbolic sizes, candidate memory layouts, dimension
  roles, whether it is an attention score matrix or holds sizes), a shape (`ShapeV`), a tuple, a
  named value, an iterator.
* Events the rules in `gpudoctor.lint.pyrules` turn into findings (GPU001, GPU003, GPU004,
  GPU008), and the small helpers on layouts and dimension groups that the interpreter and the
  events share.

Split out of pyflow.py so that the interpreter (one class, `Interp`) reads on its own; nothing
here knows about `ast` beyond the node an event points at. Standard library only.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

# --- symbolic sizes --------------------------------------------------------------------------


class Sym:
    __slots__ = ("coef", "factors")

    def __init__(self, coef: Fraction | int = 1, factors: tuple[tuple[str, int], ...] = ()) -> None:
        self.coef = Fraction(coef)
        self.factors = factors

    @staticmethod
    def named(name: str) -> "Sym":
        return Sym(1, ((name, 1),))

    def _combine(self, other: "Sym", sign: int) -> "Sym":
        exps = dict(self.factors)
        for name, e in other.factors:
            exps[name] = exps.get(name, 0) + sign * e
        factors = tuple(sorted((n, e) for n, e in exps.items() if e))
        coef = self.coef * other.coef if sign > 0 else (self.coef / other.coef if other.coef else Fraction(0))
        return Sym(coef, factors)

    def __mul__(self, other: "Sym") -> "Sym":
        return self._combine(other, 1)

    def __truediv__(self, other: "Sym") -> "Sym":
        return self._combine(other, -1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self.coef == other.coef and self.factors == other.factors

    def __hash__(self) -> int:
        return hash((self.coef, self.factors))

    def is_one(self) -> bool:
        return self.coef == 1 and not self.factors

    def __repr__(self) -> str:
        parts = [str(self.coef)] if self.coef != 1 or not self.factors else []
        parts += [n if e == 1 else f"{n}^{e}" for n, e in self.factors]
        return "*".join(parts)


WILD = "-1"  # a -1 in a view/reshape


def prod(syms) -> Sym:
    out = Sym(1)
    for s in syms:
        out = out * s
    return out


# --- abstract values -------------------------------------------------------------------------


@dataclass(frozen=True)
class TV:
    """An abstract tensor."""

    rank: int | None = None
    dims: tuple[Sym | None, ...] | None = None
    layouts: frozenset[tuple[int, ...]] | None = None  # None: unknown (taken as contiguous)
    origin: ast.AST | None = None  # what made it possibly non-contiguous
    origin_kind: str = ""
    roles: tuple[str | None, ...] | None = None
    attn: str | None = None  # "scores" | "probs"
    attn_origin: ast.AST | None = None
    sizes: bool = False  # an integer tensor holding sizes
    scalar_of: ast.AST | None = None  # a 0-d element of a size tensor: the unpacked value node
    src: str | None = None  # the parameter this came from by transposes(1, 2) only
    t12: int = 0  # how many transpose(1, 2) since `src`
    # The result of a call this file cannot see into (`attn.get_attention_scores(q, k)`, a helper
    # of another module): its name, for the project pass to look up.
    opaque: str | None = None
    # a size tensor (or an element of one) that came from this parameter, seeded by the project
    # pass (a caller in another module passes a tensor of sizes to it)
    seed: str | None = None
    # probabilities only if `cond[0]` returns `cond[1]` ("scores": the softmax of an opaque
    # result; "probs": an opaque result used as probabilities)
    cond: tuple[str, str] | None = None
    # a tensor of sizes (or an element of one) known to be on the CPU: built with torch.tensor /
    # as_tensor / stack and no device. Its elements used directly as sizes (`x.repeat(1, t[1])`,
    # a view's sizes, range()) are turned into ints by __index__: no kernel, no sync, left alone;
    # arithmetic on them still makes tensors (reported).
    cpu: bool = False


@dataclass(frozen=True)
class ShapeV:
    """x.shape / x.size(): the owner's dims."""

    owner: TV
    owner_name: str | None
    dims: tuple[Sym | None, ...] | None


@dataclass(frozen=True)
class TupleV:
    items: tuple[Any, ...]
    homogeneous: bool = False  # a list comprehension: items[0] is every element


@dataclass(frozen=True)
class Named:
    """A name or attribute chain with no known value: a parameter, a global, self.heads."""

    key: str


@dataclass(frozen=True)
class IterV:
    elem: Any


@dataclass(frozen=True)
class DictV:
    """A dict literal, dict(...) or a dict filled key by key: its string keys and their values
    (followed into `f(**d)`, `d["k"]`)."""

    items: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str) -> Any:
        return next((v for k, v in self.items if k == key), None)

    def set(self, key: str, value: Any) -> "DictV":
        return DictV(tuple((k, v) for k, v in self.items if k != key) + ((key, value),))


# --- values that cross functions ----------------------------------------------------------------
#
# What the project pass carries from a caller to a callee (an argument), from a callee to its
# callers (a return value) or between methods (an attribute of self): the part of an abstract
# value GPU004 needs, without ast nodes, so that it pickles and compares cheaply.
#   ("t", r)                  a tensor of sizes of rank r (2: a table, 1: a row, 0: one element)
#   ("c", r)                  the same, known to be on the CPU
#   ("l", inner)              a list or tuple whose every element is `inner`
#   ("u", (inner | None, ...)) a tuple of fixed length (`return out, sizes, offsets`)
#   ("d", ((key, inner), ...)) a dict holding those entries
Carried = tuple


def export(v: Any, depth: int = 0) -> Carried | None:
    """The carried form of an abstract value, or None when it holds no sizes."""
    if depth > 3:
        return None
    if isinstance(v, TV):
        if v.sizes and v.rank in (0, 1, 2):
            return ("c" if v.cpu else "t", v.rank)
        return None
    if isinstance(v, TupleV) and v.items:
        inner = [export(i, depth + 1) for i in v.items]
        if inner[0] is not None and all(i == inner[0] for i in inner):
            return ("l", inner[0])
        if not v.homogeneous and len(inner) <= 8 and any(i is not None for i in inner):
            return ("u", tuple(inner))
        return None
    if isinstance(v, DictV):
        entries = tuple((k, c) for k, c in ((k, export(i, depth + 1)) for k, i in v.items) if c is not None)
        return ("d", entries) if entries else None
    return None


def materialise(c: Carried, seed: str | None, node: ast.AST | None) -> Any:
    """The abstract value of a carried one, as received by a parameter (`seed`: its name, so that
    what follows from it is told from what the callee makes itself) or returned at the call
    `node` (its 0-d elements are reported there)."""
    kind, inner = c
    if kind in ("t", "c"):
        if inner == 0:
            return TV(rank=0, scalar_of=node, seed=seed, cpu=kind == "c")
        return TV(rank=inner, sizes=True, seed=seed, cpu=kind == "c")
    if kind == "l":
        return TupleV((materialise(inner, seed, node),), homogeneous=True)
    if kind == "u":
        return TupleV(tuple(materialise(i, seed, node) if i is not None else None for i in inner))
    return DictV(tuple((k, materialise(i, seed, node)) for k, i in inner))


def describe(c: Carried) -> str:
    """`a row of a tensor of sizes`: a carried value in words, for messages."""
    kind, inner = c
    if kind in ("t", "c"):
        return {2: "a tensor of sizes", 1: "a row of a tensor of sizes", 0: "a 0-d tensor of sizes"}[inner]
    if kind == "u":
        return "a tuple holding " + ", ".join(describe(i) for i in inner if i is not None)
    if kind == "l":
        if inner[0] in ("t", "c"):
            return {2: "a list of tensors of sizes", 1: "a list of rows of sizes held as tensors",
                    0: "a list of 0-d tensors of sizes"}[inner[1]]
        return "a list holding sizes as tensors"
    return "a dict holding " + ", ".join(f"{describe(i)} under '{k}'" for k, i in inner)


# --- events the rules turn into findings ------------------------------------------------------


@dataclass(frozen=True)
class ViewEvent:  # GPU003
    call: ast.Call
    origin: ast.AST
    origin_kind: str


@dataclass(frozen=True)
class AttentionEvent:  # GPU001
    scores: ast.AST
    product: ast.AST
    # (callee, kind): attention only if the project's `callee` returns attention "scores" or
    # "probs" (its result went through a softmax, or was used as probabilities, here)
    cond: tuple[str, str] | None = None


@dataclass(frozen=True)
class ShapeTensorEvent:  # GPU004, arithmetic on 0-d size tensors
    use: ast.AST
    unpacked: ast.AST  # the size-tensor expression that was unpacked (or reduced: seq_lens.max())
    seed: str | None = None  # the seeded parameter it came from (project pass)


@dataclass(frozen=True)
class SizeCall:  # sizes held as tensors (a table, a row, a list of them) passed to a call
    call: ast.Call
    slot: int | str  # positional index or keyword
    carried: Carried
    value: ast.expr
    seed: str | None  # the seeded parameter it came from, or None for a tensor made here
    fn: ast.AST | None  # the function making the call
    shown: str | None = None  # how to name the value when `value` is not it (`**kwargs`)


@dataclass(frozen=True)
class ShapeArgEvent:  # GPU004, a row of a size tensor passed as shape=
    value: ast.expr
    keyword: str


@dataclass(frozen=True)
class FlashLayoutEvent:  # GPU008
    call: ast.Call
    arg: ast.expr
    detail: str


# --- helpers -----------------------------------------------------------------------------------

_HEADS = {"heads", "num_heads", "n_heads", "nheads", "num_attention_heads", "n_head", "num_head",
          "attn_heads", "head_num", "heads_num", "num_q_heads", "num_kv_heads", "n_kv_heads",
          "num_key_value_heads", "kv_heads", "nh", "n_heads_q", "heads_per_rank", "local_heads",
          "num_local_heads", "num_heads_per_partition"}
_HDIM = {"head_dim", "dim_head", "head_size", "d_head", "headdim", "d_k", "dk", "hd", "head_dims",
         "attention_head_size", "dim_per_head", "kv_channels", "hidden_size_per_head", "head_channels"}
_ELEMENTWISE = {
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_not",
    "float", "half", "bfloat16", "double", "to", "type", "type_as", "cuda", "cpu", "detach", "clone",
    "masked_fill", "masked_fill_", "mul", "mul_", "div", "div_", "add", "add_", "sub", "sub_", "clamp",
    "clamp_", "neg", "abs", "exp", "sigmoid", "tanh", "relu", "gelu", "silu", "requires_grad_",
    "nan_to_num", "nan_to_num_", "sqrt", "rsqrt", "pow", "square", "scale_", "fill_diagonal_",
}
_CREATE = {"zeros", "ones", "empty", "randn", "rand", "full", "zeros_like", "ones_like", "empty_like",
           "randn_like", "rand_like", "full_like", "arange", "randint"}
_SIZE_METHODS = {"view", "reshape", "expand", "repeat", "new_zeros", "new_ones", "new_empty", "new_full"}
_FLASH = {"flash_attn_func": ("q", "k", "v"), "flash_attn_kvpacked_func": ("q", "kv"), "flash_attn_qkvpacked_func": ("qkv",),
          "flash_attn_with_kvcache": ("q",)}
_SHAPE_KW = re.compile(r"(^|_)(shape|shapes|size|sizes|grid_size|grid_sizes)$")
_INT_DTYPES = {"long", "int", "int64", "int32", "int16", "short", "uint8"}
# Reductions of a tensor of sizes: with no dim, a 0-d tensor (`seq_lens.max()`).
REDUCTIONS = {"max", "min", "sum", "prod", "amax", "amin"}


_MISSING = object()


def join_values(values: list[Any]) -> Any:
    """The join of the values a name holds on several paths (None: unknown). Tensors join as
    `_join_tv` says; tensors of sizes of one rank stay tensors of sizes; a list still empty on
    one path and holding sizes on another holds sizes; dicts join key by key."""
    first = values[0]
    if all(v == first for v in values[1:]):
        return first
    if all(isinstance(v, TV) for v in values):
        if all(v.sizes for v in values) and all(v.rank == first.rank for v in values):
            return TV(rank=first.rank, sizes=True, seed=next((v.seed for v in values if v.seed), None),
                      layouts=first.layouts if all(v.layouts == first.layouts for v in values) else None,
                      cpu=all(v.cpu for v in values))
        if all(v.rank == 0 and v.scalar_of is not None for v in values):
            return TV(rank=0, scalar_of=first.scalar_of, seed=next((v.seed for v in values if v.seed), None),
                      cpu=all(v.cpu for v in values))
        joined = _join_tv(values)
        if joined is None and first.attn and all(v.attn == first.attn and v.attn_origin is first.attn_origin and
                                                  v.cond == first.cond for v in values):
            # the same score matrix on every path (biased on one: `if rel_pos: attn = add_rel_pos(attn)`)
            return TV(rank=first.rank if all(v.rank == first.rank for v in values) else None, attn=first.attn,
                      attn_origin=first.attn_origin, cond=first.cond)
        return joined
    if all(isinstance(v, TupleV) for v in values):
        full = [v for v in values if v.items]
        if full and all(v.homogeneous for v in full):
            inner = join_values([v.items[0] for v in full])
            return TupleV((inner,), homogeneous=True) if inner is not None else None
        return None
    if all(isinstance(v, DictV) for v in values):
        keys = sorted({k for v in values for k, _ in v.items})
        out = []
        for k in keys:
            present = [v.get(k) for v in values if any(kk == k for kk, _ in v.items)]
            joined = join_values(present) if all(p is not None for p in present) else None
            if joined is not None:
                out.append((k, joined))
        return DictV(tuple(out))
    return None


def _join_tv(values: list[Any]) -> TV | None:
    """Tensors from different paths: the same rank and known layouts join into one value whose
    candidate layouts are all of theirs (a view that fails on any path is reported)."""
    if not all(isinstance(v, TV) for v in values):
        return None
    first = values[0]
    if first.rank is None or any(v.rank != first.rank or v.layouts is None for v in values):
        return None
    layouts = frozenset().union(*(v.layouts for v in values))  # type: ignore[arg-type]
    origin = next((v for v in values if v.origin is not None), None)
    same = lambda attr: getattr(first, attr) if all(getattr(v, attr) == getattr(first, attr) for v in values) else None  # noqa: E731
    return TV(rank=first.rank, dims=same("dims"), layouts=layouts, origin=origin.origin if origin else None,
              origin_kind=origin.origin_kind if origin else "", roles=same("roles"))


def _identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def _relabel(keys: list[float]) -> tuple[int, ...]:
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    out = [0] * len(keys)
    for rank, i in enumerate(order):
        out[i] = rank
    return tuple(out)


def _norm(d: int, rank: int) -> int | None:
    d = d + rank if d < 0 else d
    return d if 0 <= d < rank else None


# Calls whose result is never an attention matrix of the project's making.
_NOT_HELPERS = frozenset({"len", "range", "enumerate", "zip", "int", "float", "str", "list", "tuple", "dict", "set",
                          "isinstance", "getattr", "hasattr", "print", "super", "min", "max", "sum", "abs", "any",
                          "all", "sorted", "type", "item", "tolist", "size", "dim", "numel", "format", "join",
                          "keys", "values", "items", "get", "append", "extend", "pop", "update", "split"})
_LIBRARIES = ("torch.", "math.", "numpy.", "np.", "einops.", "xformers.", "flash_attn.", "os.", "sys.", "re.")

# Position embeddings applied to q and k keep their shape and layout.
_SHAPE_KEEPING = re.compile(r"rotary|rope|rotate|pos_emb|position_emb", re.I)

# Helpers of libraries whose result is the softmax of a score matrix (diffusers' Attention and
# CrossAttention: baddbmm(q, k^T) then softmax).
PROBS_HELPERS = frozenset({"get_attention_scores"})


def _blank(v: Any) -> bool:
    """An opaque call result about which nothing else is known: arithmetic treats it as it
    treats an unknown value."""
    return isinstance(v, TV) and v.opaque is not None and v.rank is None and v.attn is None and v.cond is None


def _as_tv(v: Any) -> TV:
    if isinstance(v, TV):
        return v
    if isinstance(v, Named) and "." not in v.key:
        return TV(src=v.key)  # a parameter (or global) used as a tensor
    return TV()


def _role_of_name(key: str | None) -> str | None:
    if not key:
        return None
    last = key.rsplit(".", 1)[-1]
    low = last.lower()
    if low in _HEADS or (low.endswith("heads") and "dim" not in low):
        return "heads"
    if low in _HDIM or low.endswith("head_dim") or low.endswith("head_size"):
        return "hdim"
    return None


def match_groups(src: tuple[Sym | None, ...], tgt: list[Any]) -> list[tuple[list[int], list[int]]] | None:
    """Pair consecutive runs of source dims with runs of target dims of equal size (symbolic),
    skipping size-1 dims; None when the sizes cannot be matched."""
    if any(s is None for s in src) or any(t is None for t in tgt):
        return None
    wild = [j for j, t in enumerate(tgt) if t is WILD]
    if len(wild) > 1:
        return None
    tgt = list(tgt)
    if wild:
        rest = prod(t for t in tgt if t is not WILD)
        tgt[wild[0]] = prod(src) / rest  # type: ignore[arg-type]
    S = [(i, s) for i, s in enumerate(src) if not s.is_one()]  # type: ignore[union-attr]
    T = [(j, t) for j, t in enumerate(tgt) if not t.is_one()]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(S) and j < len(T):
        found = None
        for total in range(2, len(S) - i + len(T) - j + 1):
            for a in range(1, total):
                b = total - a
                if a > len(S) - i or b > len(T) - j:
                    continue
                if prod(s for _, s in S[i:i + a]) == prod(t for _, t in T[j:j + b]):
                    found = (a, b)
                    break
            if found:
                break
        if not found:
            return None
        a, b = found
        groups.append(([k for k, _ in S[i:i + a]], [k for k, _ in T[j:j + b]]))
        i, j = i + a, j + b
    if i != len(S) or j != len(T):
        return None
    return groups


def _merge_ok(group: list[int], pos: tuple[int, ...], ones: set[int]) -> bool:
    """Whether consecutive source dims (ignoring size-1 ones) are adjacent in memory, in order."""
    live = [d for d in range(len(pos)) if d not in ones]
    mem = {d: r for r, d in enumerate(sorted(live, key=lambda d: pos[d]))}
    g = [d for d in group if d not in ones]
    return all(mem[b] == mem[a] + 1 for a, b in zip(g, g[1:]))


def _regroup_layout(pos: tuple[int, ...], groups, ones: set[int], tgt_rank: int) -> tuple[int, ...]:
    keys = [float(10 ** 6 + j) for j in range(tgt_rank)]  # size-1 target dims go innermost
    for sidx, tidx in groups:
        base = float(pos[sidx[0]])
        for k, j in enumerate(tidx):
            keys[j] = base + k / (len(tidx) + 1)
    return _relabel(keys)
