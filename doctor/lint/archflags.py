"""GPU006: what a set of CUDA build flags compiles for, and which GPUs get no kernel from it. The
flag lists come from build files (gpudoctor.lint.buildflags: CMake, shell scripts, Makefiles,
Dockerfiles, cog.yaml) and from Python (gpudoctor.lint.pyarch: setup.py, cpp_extension.load);
both are judged here.

nvcc semantics (checked with nvcc 13.0: --dryrun, and real builds read back with cuobjdump and
gpudoctor.scan.fatbin; tests/test_lint_build.py and tests/test_knowledge_facts.py hold them):
  -arch=sm_86 alone                 SASS sm_86 + PTX compute_86 (nvcc's shorthand)
  -arch=sm_90a alone                SASS sm_90a + PTX compute_90a + PTX compute_90 (nvcc 13.0)
  -arch=compute_86 alone            PTX compute_86 only
  -arch=compute_86 -code=sm_86      SASS sm_86 only
  -gencode arch=compute_86,code=sm_86               SASS only
  -gencode arch=compute_86,code=[sm_86,compute_86]  SASS + PTX
  -arch=sm_XY together with -gencode                both: the shorthand's images are added
TORCH_CUDA_ARCH_LIST "8.6" gives -gencode arch=compute_86,code=sm_86 (no PTX); "8.6+PTX" adds
PTX; "9.0a" gives code=sm_90a. CMake CUDA_ARCHITECTURES "86" is real + virtual (PTX included),
"86-real" SASS only.

What runs where is `gpudoctor.scan.fatbin.runs_on`: SASS within its major version (minor >= its own),
PTX on its architecture and every newer one, `a` (arch-specific) code on exactly one compute
capability, `f` (family) code within the major version.

The verdict (precision over recall): a build is reported when a GPU in use today that is NEWER
than the build's newest target gets no kernel from it (no SASS that fits and no PTX to JIT): that
is the "works on my RTX 4090, 'no kernel image' on the H100 / B200 / RTX 5090" failure. Older GPUs
left out, gaps between listed targets, and lists that reach the newest family are choices, not
findings; so are a lone -arch=sm_XY (its PTX JITs on newer GPUs), native/all, named architectures
and flags built from variables.

torch.utils.cpp_extension drops its own arch flags (those from TORCH_CUDA_ARCH_LIST) as soon as
any user flag mentions "arch", so a hard-coded flag decides alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

from gpudoctor.scan.fatbin import CodeTarget, coverage
from gpudoctor.lint.model import Edit

FLAG_HINT = re.compile(r"-arch\b|--gpu-architecture|-gencode|--generate-code|arch=compute_|-code\b|--gpu-code|"
                       r"CMAKE_CUDA_ARCHITECTURES|TORCH_CUDA_ARCH_LIST|CUDA_ARCHITECTURES")
_ARCH = re.compile(r"^(sm|compute|lto)_(\d+)([af]?)$")
_VARIABLE = re.compile(r"\$|%[sd]|\{\}|\{[A-Za-z_]")
_TORCH_ENTRY = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", re.IGNORECASE)
_CMAKE_ENTRY = re.compile(r"^(\d+)([af]?)(-real|-virtual)?$")

# The GPUs people run PyTorch on today, by compute capability: a build is judged by which of
# these it leaves without a kernel. (Jetson parts are left out: their builds are made for them.)
GPUS: dict[tuple[int, int], str] = {
    (7, 0): "V100",
    (7, 5): "T4",
    (8, 0): "A100",
    (8, 6): "RTX 30xx",
    (8, 9): "RTX 40xx",
    (9, 0): "H100",
    (10, 0): "B200",
    (10, 3): "B300",
    (12, 0): "RTX 50xx",
    (12, 1): "DGX Spark",
}


# The first CUDA toolkit that builds for each of them (nvcc's supported -arch values by release):
# a build chosen for an older toolkit cannot give them a kernel of their own, whatever it lists.
FIRST_TOOLKIT: dict[tuple[int, int], tuple[int, int]] = {
    (7, 0): (9, 0),
    (7, 5): (10, 0),
    (8, 0): (11, 0),
    (8, 6): (11, 1),
    (8, 9): (11, 8),
    (9, 0): (11, 8),
    (10, 0): (12, 8),
    (10, 3): (12, 9),
    (12, 0): (12, 8),
    (12, 1): (12, 9),
}


@dataclass(frozen=True)
class Tok:
    """One flag word and the file offset of its first character (None when not known exactly)."""

    text: str
    start: int | None = None


@dataclass
class Targets:
    """What one set of flags builds. `sass`/`ptx` hold the generic targets (86 for sm_86 /
    compute_86); `variant` the arch- and family-specific ones (sm_90a, compute_100f)."""

    sass: set[int] = field(default_factory=set)
    ptx: set[int] = field(default_factory=set)
    variant: set[CodeTarget] = field(default_factory=set)
    unknown: bool = False  # a variable or something not understood
    special: bool = False  # native / all / named architectures (Ampere): deliberate, never judged
    shell: bool = False
    anchor: Tok | None = None  # where to report when the newest target's own place is not known
    fixes: dict[int, list[Edit]] = field(default_factory=dict)  # per architecture: edits that only add PTX
    where: dict[int, Tok] = field(default_factory=dict)  # per architecture: the entry that names it

    @property
    def archs(self) -> set[int]:
        return self.sass | self.ptx | {t.sm for t in self.variant}

    def code_targets(self) -> list[CodeTarget]:
        return ([CodeTarget(n // 10, n % 10, "sass") for n in self.sass]
                + [CodeTarget(n // 10, n % 10, "ptx") for n in self.ptx] + sorted(self.variant))

    def add(self, kind: str, n: int, variant: str = "") -> None:
        if kind == "lto":
            return  # LTO-IR is linked, never loaded: it runs nowhere as is
        if variant:
            self.variant.add(CodeTarget(n // 10, n % 10, "sass" if kind == "sm" else "ptx", variant))
        else:
            (self.sass if kind == "sm" else self.ptx).add(n)

    def fix(self, n: int, edit: Edit) -> None:
        self.fixes.setdefault(n, []).append(edit)

    def note(self, n: int, tok: Tok | None) -> None:
        """`tok` names architecture `n` (the place a finding about it points at)."""
        if tok is not None and tok.start is not None:
            self.where[n] = tok


@dataclass(frozen=True)
class Verdict:
    anchor: Tok
    message: str
    edits: tuple[Edit, ...]
    hint: str = ""  # the display-only fix when there are no edits


def _fmt(arch: int) -> str:
    return f"sm_{arch}"


def _cc(arch: int) -> str:
    return f"{arch // 10}.{arch % 10}"


def _arch_word(word: str, t: Targets) -> tuple[str, int, str] | None:
    """("sm" | "compute" | "lto", 86, "" | "a" | "f"), or None (marking `t` unknown or special)."""
    word = word.strip().strip("\"'\\")
    if word in ("native", "all", "all-major") or word.startswith(("all", "native")):
        t.special = True
        return None
    if _VARIABLE.search(word) or not word:
        t.unknown = True
        return None
    m = _ARCH.match(word)
    if not m:
        t.unknown = True
        return None
    return m.group(1), int(m.group(2)), m.group(3)


def _split_list(value: str) -> list[str]:
    value = value.strip().strip("\"'\\")
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v for v in re.split(r"[,\s]+", value.strip("\"'\\")) if v]


def nvcc_targets(tokens: list[Tok], shell: bool = False) -> Targets:
    """What nvcc builds for these flag words (one nvcc command line, or one flag list). With
    `shell`, a fix never writes `[...]` (a glob pattern to the shell): it adds a second -gencode
    for the PTX instead."""
    t = Targets()
    t.shell = shell
    arch_value: str | None = None
    arch_tok: Tok | None = None
    code_value: tuple[Tok, str] | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        word = tok.text
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        m = re.match(r"^(-arch|--gpu-architecture|-code|--gpu-code|-gencode|--generate-code)(=(.*))?$", word)
        if not m:
            if word.startswith(("-DCMAKE_CUDA_ARCHITECTURES=", "-DTORCH_CUDA_ARCH_LIST=")):
                value = _shift(tok, word.index("=") + 1)
                (_cmake_values if word.startswith("-DCMAKE_") else _torch_values)([value], t)
            i += 1
            continue
        flag, value = m.group(1), m.group(3)
        value_tok = _shift(tok, len(flag) + 1) if value is not None else None
        if value is None:
            if nxt is None:
                t.unknown = True
                break
            value, value_tok = nxt.text, nxt
            i += 1
        value_tok = Tok(value, value_tok.start if value_tok else None)
        if t.anchor is None:
            t.anchor = tok
        if flag in ("-gencode", "--generate-code"):
            _gencode(value_tok, t)
        elif flag in ("-arch", "--gpu-architecture"):
            arch_value, arch_tok = value, value_tok
        else:
            code_value = (value_tok, value)
        i += 1
    if arch_value is not None:
        parsed = _arch_word(arch_value, t)
        if parsed:
            t.note(parsed[1], arch_tok)
        if parsed and code_value is None:
            kind, n, variant = parsed
            if kind == "sm":
                t.add("sm", n, variant)
                t.add("compute", n, variant)
                if variant:
                    t.add("compute", n)  # nvcc 13.0 adds the generic PTX as well
            elif kind == "compute":
                t.add("compute", n, variant)
    if code_value is not None:
        vtok, value = code_value
        codes = []
        for w in _split_list(value):
            p = _arch_word(w, t)
            if p:
                codes.append(p)
                t.add(p[0], p[1], p[2])
                t.note(p[1], vtok)
        virtual = _arch_word(arch_value, Targets()) if arch_value else None
        if len(codes) == 1 and codes[0][0] == "sm" and not codes[0][2] and virtual and virtual[0] == "compute" \
                and virtual[1:] == codes[0][1:] and vtok.start is not None and value == vtok.text:
            n = codes[0][1]
            end = vtok.start + len(value)
            t.fix(n, Edit(end, end, f",compute_{n}"))
    return t


def _shift(tok: Tok, n: int) -> Tok:
    """The rest of `tok` after its first `n` characters (`-arch=` + `sm_86`: the value)."""
    return Tok(tok.text[n:], tok.start + n if tok.start is not None else None)


def _gencode(value: Tok, t: Targets) -> None:
    m = re.match(r"^[\"']?arch=([^,]+),code=(.+?)[\"']?$", value.text)
    if not m:
        t.unknown = True
        return
    virtual = _arch_word(m.group(1), t)
    codes = []
    for w in _split_list(m.group(2)):
        p = _arch_word(w, t)
        if p:
            codes.append(p)
            t.add(p[0], p[1], p[2])
            t.note(p[1], value)
    if virtual and not virtual[2] and len(codes) == 1 and codes[0] == ("sm", virtual[1], "") \
            and value.start is not None:
        code_text = m.group(2)
        start = value.start + m.start(2)
        if code_text == f"sm_{virtual[1]}":
            n = virtual[1]
            if t.shell:
                end = start + len(code_text)
                t.fix(n, Edit(end, end, f" -gencode arch=compute_{n},code=compute_{n}"))
            else:
                t.fix(n, Edit(start, start + len(code_text), f"[sm_{n},compute_{n}]"))


def _list_entries(values: list[Tok], t: Targets, separators: str) -> Iterator[tuple[str, int | None]]:
    """(entry, file offset of the entry or None) for each entry of architecture-list values
    (TORCH_CUDA_ARCH_LIST, CUDA_ARCHITECTURES); a value built from a variable marks `t` unknown,
    and the first other value becomes `t`'s anchor."""
    for v in values:
        text = v.text.strip().strip("\"'")
        if _VARIABLE.search(text):
            t.unknown = True
            continue
        base = v.start + v.text.find(text) if v.start is not None else None
        pos = 0
        for entry in re.split(separators, text):
            if not entry:
                continue
            where = text.find(entry, pos)
            pos = where + len(entry)
            yield entry, (base + where if base is not None else None)
        if t.anchor is None:
            t.anchor = v


def _torch_values(values: list[Tok], t: Targets) -> None:
    for entry, at in _list_entries(values, t, r"[;\s,]+"):
        m = _TORCH_ENTRY.match(entry)
        if not m:
            t.special = True  # named architectures (Ampere, Hopper) and anything else
            continue
        n = int(m.group(1)) * 10 + int(m.group(2))
        variant = m.group(3).lower()
        t.add("sm", n, variant)
        t.note(n, Tok(entry, at))
        if m.group(4):
            t.add("compute", n, variant)
        elif not variant and at is not None:
            end = at + len(entry)
            t.fix(n, Edit(end, end, "+PTX"))


def _cmake_values(values: list[Tok], t: Targets) -> None:
    for entry, at in _list_entries(values, t, r"[;\s]+"):
        if entry.lower() in ("native", "all", "all-major", "off", "false"):
            t.special = True
            continue
        m = _CMAKE_ENTRY.match(entry)
        if not m:
            t.unknown = True
            continue
        n, variant, kind = int(m.group(1)), m.group(2), m.group(3)
        t.note(n, Tok(entry, at))
        if kind != "-virtual":
            t.add("sm", n, variant)
        if kind != "-real":
            t.add("compute", n, variant)
        elif not variant and at is not None:
            start = at + len(m.group(1))
            t.fix(n, Edit(start, start + len("-real"), ""))


def torch_arch_targets(values: list[Tok]) -> Targets:
    t = Targets()
    _torch_values(values, t)
    return t


def cmake_arch_targets(values: list[Tok]) -> Targets:
    t = Targets()
    _cmake_values(values, t)
    return t


def left_out(t: Targets, toolkit_below: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """The GPUs (`GPUS`) newer than the build's newest target that get no kernel from it; with
    `toolkit_below`, only those a toolkit older than that version can build for (a branch taken
    only with such a toolkit)."""
    targets = t.code_targets()
    if not targets:
        return []
    newest = max((x.major, x.minor) for x in targets)
    return [cap for cap in GPUS if cap > newest and not coverage(targets, cap).ok
            and (toolkit_below is None or FIRST_TOOLKIT[cap] < toolkit_below)]


# --- arch lists chosen by the CUDA toolkit's version ----------------------------------------

_TOOLKIT_NAME = re.compile(r"cuda\w*version|version\w*cuda|bare_metal|nvcc\w*version|CUDA_VERSION|version\.cuda|"
                           r"cuda_major|cuda_minor|CUDAToolkit_VERSION|CMAKE_CUDA_COMPILER_VERSION|CUDA_VERSION_MAJOR|"
                           r"CUDAToolkit_VERSION_MAJOR|cuda_ver|CUDA_VER", re.I)
_OPS = {">=": ">=", "<=": "<=", ">": ">", "<": "<", "==": "==", "!=": "!=",
        "VERSION_GREATER_EQUAL": ">=", "VERSION_LESS_EQUAL": "<=", "VERSION_GREATER": ">", "VERSION_LESS": "<",
        "VERSION_EQUAL": "==", "GREATER_EQUAL": ">=", "LESS_EQUAL": "<=", "GREATER": ">", "LESS": "<", "EQUAL": "=="}
_NEGATE = {">=": "<", "<": ">=", ">": "<=", "<=": ">", "==": "!=", "!=": "=="}
_COMPARISON = re.compile(r"(?P<lhs>[\w.()\[\]\"'${}]+?)\s*(?P<op>>=|<=|==|!=|>|<|\bVERSION_GREATER_EQUAL\b|"
                         r"\bVERSION_LESS_EQUAL\b|\bVERSION_GREATER\b|\bVERSION_LESS\b|\bVERSION_EQUAL\b|"
                         r"\bGREATER_EQUAL\b|\bLESS_EQUAL\b|\bGREATER\b|\bLESS\b|\bEQUAL\b)\s*(?P<rhs>\(\s*\d+\s*,\s*\d+\s*\)|\S+)")


def _version_literal(text: str, major_only: bool) -> tuple[int, int] | None:
    """(12, 8) from `Version("12.8")`, `"12.8"`, `(12, 8)`, `12.8`, `12080` (CUDA_VERSION), or
    `12` when the compared name is a major version."""
    text = text.strip()
    while text.count(")") > text.count("("):  # the rest of the test: `if(X VERSION_LESS 12.8)`
        text = text[:text.rindex(")")]
    m = re.match(r"""^(?:\w+\()?["']?(\d+)\.(\d+)(?:\.\d+)?["']?\)?$""", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.match(r"^\(\s*(\d+)\s*,\s*(\d+)\s*\)$", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.match(r"""^["']?(\d+)["']?$""", text)
    if m:
        n = int(m.group(1))
        if major_only and n < 100:
            return n, 0
        if n >= 9000:
            return n // 1000, (n % 1000) // 10
    return None


def python_branch(tree, text: str, node) -> tuple[int, int] | None:
    """`toolkit_below` for a node of a Python file: the tests of the `if` statements it sits in
    (the body or the else), by line ranges."""
    import ast

    line = getattr(node, "lineno", None)
    if line is None:
        return None
    tests: list[tuple[str, bool]] = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.If) or not (n.lineno <= line <= (n.end_lineno or n.lineno)):
            continue
        body_end = n.body[-1].end_lineno or n.body[-1].lineno
        if n.body[0].lineno <= line <= body_end:
            tests.append((ast.get_source_segment(text, n.test) or "", True))
        elif n.orelse and n.orelse[0].lineno <= line:
            tests.append((ast.get_source_segment(text, n.test) or "", False))
    return toolkit_below(tests)


def toolkit_below(tests: list[tuple[str, bool]]) -> tuple[int, int] | None:
    """The version the CUDA toolkit is older than in a branch, from the tests of the `if`s around
    it (each with True: inside its body, False: inside its else), in Python or CMake spelling:
    `bare_metal_version >= Version("12.8")` False gives (12, 8); `int(bare_metal_major) == 11`
    True gives (12, 0). None when no test bounds the toolkit from above."""
    bound: tuple[int, int] | None = None
    for text, holds in tests:
        text = re.sub(r"\s+", " ", text).strip()
        negated = False
        while True:
            m = re.match(r"^(?:not\s+|NOT\s+|!\s*)(.*)$", text)
            if not m:
                break
            text, negated = m.group(1).strip(), not negated
            if text.startswith("(") and text.endswith(")"):
                text = text[1:-1].strip()
        holds = holds != negated
        parts = re.split(r"\s+(?:and|AND)\s+|\s*&&\s*", text) if holds else [text]
        if not holds and re.search(r"\s(?:and|or|AND|OR)\s|&&|\|\|", text):
            continue  # `not (a and b)`: either may fail, nothing is known
        for part in parts:
            if re.search(r"\s(?:or|OR)\s|\|\|", part):
                continue
            m = _COMPARISON.search(part)
            if not m:
                continue
            lhs, op, rhs = m.group("lhs"), _OPS[m.group("op")], m.group("rhs")
            if not _TOOLKIT_NAME.search(lhs) and _TOOLKIT_NAME.search(rhs):
                lhs, rhs = rhs, lhs
                op = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}.get(op, op)
            if not _TOOLKIT_NAME.search(lhs) or re.search(r"minor", lhs, re.I):
                continue
            major_only = bool(re.search(r"major", lhs, re.I))
            version = _version_literal(rhs, major_only)
            if version is None:
                continue
            if not holds:
                op = _NEGATE[op]
            upper = None
            if major_only:
                if op in ("<",):
                    upper = (version[0], 0)
                elif op in ("<=", "=="):
                    upper = (version[0] + 1, 0)
            elif op == "<":
                upper = version
            elif op in ("<=", "=="):
                upper = (version[0], version[1] + 1)
            if upper is not None and (bound is None or upper < bound):
                bound = upper
    return bound


def _built(t: Targets) -> str:
    """"SASS for sm_80, sm_86 and no PTX", "only sm_90a code (it runs on 9.0 alone)"."""
    generic = sorted(t.sass)
    parts = []
    if generic:
        parts.append("SASS for " + ", ".join(_fmt(n) for n in generic))
    variant = sorted(t.variant, key=lambda x: (x.sm, x.variant))
    specific = list(dict.fromkeys(f"sm_{x.sm}{x.variant}" for x in variant))
    if specific:
        runs = list(dict.fromkeys(f"{x.major}.{x.minor}" + ("" if x.variant == "a" else f"-{x.major}.x")
                                  for x in variant))
        parts.append(f"architecture-specific {', '.join(specific)} code (it runs on {', '.join(runs)} only)")
    if t.ptx:
        parts.append("PTX for " + ", ".join(f"compute_{n}" for n in sorted(t.ptx)))
    else:
        parts.append("no PTX newer GPUs could JIT-compile")
    return " and ".join(parts) if len(parts) < 3 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _union(a: Targets, b: Targets) -> Targets:
    return Targets(sass=a.sass | b.sass, ptx=a.ptx | b.ptx, variant=a.variant | b.variant,
                   unknown=a.unknown or b.unknown, special=a.special or b.special, anchor=a.anchor or b.anchor,
                   fixes={**a.fixes, **b.fixes}, where={**a.where, **b.where})


def judge(t: Targets, what: str, toolkit: tuple[int, int] | None = None) -> Verdict | None:
    """The GPU006 verdict for one set of targets: reported when GPUs newer than the build's
    newest target get no kernel (see the module docstring); None otherwise, and for variables,
    native/all and named architectures. `toolkit`: the build is chosen for CUDA toolkits older
    than this version (`toolkit_below`), so only the GPUs such a toolkit builds for are judged."""
    if t.unknown or t.special or t.anchor is None or not t.archs:
        return None
    missing = left_out(t, toolkit)
    if not missing:
        return None
    families: dict[int, list[tuple[int, int]]] = {}
    for cap in missing:
        families.setdefault(cap[0], []).append(cap)
    named = ", ".join("/".join(_fmt(c[0] * 10 + c[1]) for c in caps) + f" ({', '.join(GPUS[c] for c in caps)})"
                      for caps in families.values())
    newest_generic = max(t.sass | t.ptx, default=None)
    edits = tuple(t.fixes.get(newest_generic, ())) if newest_generic is not None else ()
    if newest_generic is not None:
        n = newest_generic
        spelling = (f"{_cc(n)}+PTX" if "TORCH_CUDA_ARCH_LIST" in what else
                    f"\"{n}\" instead of \"{n}-real\"" if "CUDA_ARCHITECTURES" in what else
                    f"code=[sm_{n},compute_{n}]")
        advice = f"add PTX for the newest target ({spelling}) so that newer GPUs JIT-compile it, or list their architectures"
    else:
        advice = ("add a target for them (their own sm_XY, or generic compute_XY PTX if the kernels build "
                  "without the architecture-specific features)")
    message = f"{what}: {_built(t)}, so {named} fail with 'no kernel image is available'; {advice}"
    hint = ("list every GPU family you run on and add PTX for the newest "
            "(TORCH_CUDA_ARCH_LIST=\"8.0;8.6;9.0;10.0;12.0+PTX\")")
    # reported at the newest target: the entry the fix changes
    newest = max(t.code_targets(), key=lambda x: (x.major, x.minor))
    anchor = t.where.get(newest.major * 10 + newest.minor) or t.anchor
    return Verdict(anchor, message, edits, hint)
