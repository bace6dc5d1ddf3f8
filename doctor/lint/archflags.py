"""GPU006: what a set of CUDA build flags compiles for, and the build-file scanners (CMake, shell
scripts, Makefiles, Dockerfiles). The Python side (setup.py, cpp_extension.load) collects its flag
lists in `pyrules` and judges them here.

nvcc semantics (checked with nvcc 13.0 --dryrun):
  -arch=sm_86 alone                 SASS sm_86 + PTX compute_86 (nvcc's shorthand)
  -arch=compute_86 alone            PTX compute_86 only
  -arch=compute_86 -code=sm_86      SASS sm_86 only
  -gencode arch=compute_86,code=sm_86               SASS only
  -gencode arch=compute_86,code=[sm_86,compute_86]  SASS + PTX
TORCH_CUDA_ARCH_LIST "8.6" gives -gencode arch=compute_86,code=sm_86 (no PTX); "8.6+PTX" adds
PTX. CMake CUDA_ARCHITECTURES "86" is real + virtual (PTX included), "86-real" SASS only.

torch.utils.cpp_extension drops its own arch flags (those from TORCH_CUDA_ARCH_LIST) as soon as
any user flag mentions "arch", so a hard-coded flag decides alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudoctor.lint.model import Edit

FLAG_HINT = re.compile(r"-arch\b|--gpu-architecture|-gencode|--generate-code|arch=compute_|-code\b|--gpu-code|"
                       r"CMAKE_CUDA_ARCHITECTURES|TORCH_CUDA_ARCH_LIST|CUDA_ARCHITECTURES")
_ARCH = re.compile(r"^(sm|compute|lto)_(\d+)([af]?)$")
_VARIABLE = re.compile(r"\$|%[sd]|\{\}|\{[A-Za-z_]")
_TORCH_ENTRY = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", re.IGNORECASE)
_CMAKE_ENTRY = re.compile(r"^(\d+)([af]?)(-real|-virtual)?$")


@dataclass(frozen=True)
class Tok:
    """One flag word and the file offset of its first character (None when not known exactly)."""

    text: str
    start: int | None = None


@dataclass
class Targets:
    sass: set[int] = field(default_factory=set)
    ptx: set[int] = field(default_factory=set)
    unknown: bool = False  # a variable or something not understood
    special: bool = False  # native / all / arch-specific (sm_90a): deliberate, never judged
    lone_arch: Tok | None = None  # -arch=sm_XY without -code
    shell: bool = False
    anchor: Tok | None = None  # where to report
    fixes: list[Edit] = field(default_factory=list)  # edits that only add PTX

    @property
    def archs(self) -> set[int]:
        return self.sass | self.ptx


@dataclass(frozen=True)
class Verdict:
    anchor: Tok
    message: str
    edits: tuple[Edit, ...]


def _fmt(arch: int) -> str:
    return f"sm_{arch}"


def _cc(arch: int) -> str:
    return f"{arch // 10}.{arch % 10}"


def _arch_word(word: str, t: Targets) -> tuple[str, int] | None:
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
    if m.group(3):
        t.special = True  # sm_90a / sm_100f: architecture-specific on purpose
        return None
    return m.group(1), int(m.group(2))


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
    arch_value: tuple[Tok, str] | None = None
    code_value: tuple[Tok, str] | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        word = tok.text
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        m = re.match(r"^(-arch|--gpu-architecture|-code|--gpu-code|-gencode|--generate-code)(=(.*))?$", word)
        if not m:
            if word.startswith("-DCMAKE_CUDA_ARCHITECTURES="):
                _cmake_values([Tok(word.split("=", 1)[1], _shift(tok, word.index("=") + 1))], t)
            elif word.startswith("-DTORCH_CUDA_ARCH_LIST="):
                _torch_values([Tok(word.split("=", 1)[1], _shift(tok, word.index("=") + 1))], t)
            elif word.startswith("arch=compute_") and i > 0 and tokens[i - 1].text in ("-gencode", "--generate-code"):
                pass  # consumed below with its flag
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
            arch_value = (tok, value)
        else:
            code_value = (value_tok, value)
        i += 1
    if arch_value is not None:
        tok, value = arch_value
        parsed = _arch_word(value, t)
        if parsed and code_value is None:
            kind, n = parsed
            if kind == "sm":
                t.sass.add(n)
                t.ptx.add(n)
                t.lone_arch = tok
            elif kind == "compute":
                t.ptx.add(n)
    if code_value is not None:
        vtok, value = code_value
        codes = []
        for w in _split_list(value):
            p = _arch_word(w, t)
            if p:
                codes.append(p)
                (t.sass if p[0] == "sm" else t.ptx).add(p[1])
        virtual = _arch_word(arch_value[1], Targets()) if arch_value else None
        if codes and all(k == "sm" for k, _ in codes) and len(codes) == 1 and virtual and virtual[0] == "compute" \
                and virtual[1] == codes[0][1] and vtok.start is not None and value == vtok.text:
            n = codes[0][1]
            end = vtok.start + len(value)
            t.fixes.append(Edit(end, end, f",compute_{n}"))
    return t


def _shift(tok: Tok, n: int) -> Tok | None:
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
            (t.sass if p[0] == "sm" else t.ptx).add(p[1])
    if virtual and len(codes) == 1 and codes[0][0] == "sm" and codes[0][1] == virtual[1] and value.start is not None:
        code_text = m.group(2)
        start = value.start + m.start(2)
        if code_text == f"sm_{virtual[1]}":
            n = virtual[1]
            if t.shell:
                end = start + len(code_text)
                t.fixes.append(Edit(end, end, f" -gencode arch=compute_{n},code=compute_{n}"))
            else:
                t.fixes.append(Edit(start, start + len(code_text), f"[sm_{n},compute_{n}]"))


def _torch_values(values: list[Tok], t: Targets) -> None:
    for v in values:
        text = v.text.strip().strip("\"'")
        if _VARIABLE.search(text):
            t.unknown = True
            continue
        offset = v.text.find(text) if v.start is not None else -1
        pos = 0
        for entry in re.split(r"[;\s,]+", text):
            if not entry:
                continue
            where = text.find(entry, pos)
            pos = where + len(entry)
            m = _TORCH_ENTRY.match(entry)
            if not m:
                t.special = True  # named architectures (Ampere, Hopper) and anything else
                continue
            if m.group(3):
                t.special = True
                continue
            n = int(m.group(1)) * 10 + int(m.group(2))
            t.sass.add(n)
            if m.group(4):
                t.ptx.add(n)
            elif v.start is not None and offset >= 0:
                end = v.start + offset + where + len(entry)
                t.fixes.append(Edit(end, end, "+PTX"))
        if t.anchor is None:
            t.anchor = v


def _cmake_values(values: list[Tok], t: Targets) -> None:
    for v in values:
        text = v.text.strip().strip("\"'")
        if _VARIABLE.search(text):
            t.unknown = True
            continue
        offset = v.text.find(text) if v.start is not None else -1
        pos = 0
        for entry in re.split(r"[;\s]+", text):
            if not entry:
                continue
            where = text.find(entry, pos)
            pos = where + len(entry)
            if entry.lower() in ("native", "all", "all-major", "off", "false"):
                t.special = True
                continue
            m = _CMAKE_ENTRY.match(entry)
            if not m:
                t.unknown = True
                continue
            if m.group(2):
                t.special = True
                continue
            n = int(m.group(1))
            kind = m.group(3)
            if kind != "-virtual":
                t.sass.add(n)
            if kind != "-real":
                t.ptx.add(n)
            elif v.start is not None and offset >= 0:
                start = v.start + offset + where + len(m.group(1))
                t.fixes.append(Edit(start, start + len("-real"), ""))
        if t.anchor is None:
            t.anchor = v


def torch_arch_targets(values: list[Tok]) -> Targets:
    t = Targets()
    _torch_values(values, t)
    return t


def cmake_arch_targets(values: list[Tok]) -> Targets:
    t = Targets()
    _cmake_values(values, t)
    return t


def judge(t: Targets, what: str) -> Verdict | None:
    """The GPU006 verdict for one set of targets, or None (several architectures, PTX, a
    variable, or a deliberate choice such as native or sm_90a)."""
    if t.unknown or t.special or len(t.archs) != 1 or t.anchor is None:
        return None
    (n,) = t.archs
    newer = "sm_90 (H100), sm_100 (B200), sm_120 (RTX 50xx)" if n < 90 else "sm_120 (RTX 50xx)" if n < 120 else "newer GPUs"
    if not t.ptx:
        return Verdict(t.anchor, (
            f"{what}: SASS for {_fmt(n)} only and no PTX, so every GPU of another architecture "
            f"(e.g. {'sm_80 (A100), ' if n != 80 else ''}{newer}) fails with 'no kernel image is "
            f"available'; add PTX ({_cc(n)}+PTX / code=[sm_{n},compute_{n}]) or list every target"),
            tuple(t.fixes))
    if t.lone_arch is not None and t.sass == {n}:
        return Verdict(t.lone_arch, (
            f"{what}: a hard-coded -arch={_fmt(n)} builds SASS for {_cc(n)} plus compute_{n} PTX, so GPUs older "
            f"than {_cc(n)} have no kernel image and newer ones JIT-compile the PTX at first launch; "
            f"it also overrides TORCH_CUDA_ARCH_LIST in torch.utils.cpp_extension. List your targets "
            f"with -gencode or TORCH_CUDA_ARCH_LIST instead"), ())
    return None


# --- build files -------------------------------------------------------------------------------


def _strip_hash_comments(text: str) -> str:
    """Blank out # comments (outside quotes) keeping offsets; shell, CMake, Make, Dockerfile."""
    out = list(text)
    i, n = 0, len(text)
    quote = None
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;(") and not text.startswith("#[[", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
            continue
        elif c == "#" and text.startswith("#[[", i):  # CMake bracket comment
            j = text.find("]]", i)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        elif c == "\n":
            quote = None if quote == "'" else quote
        i += 1
    return "".join(out)


_WORD = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+")


def _words(text: str, base: int) -> list[Tok]:
    """Shell-ish words with offsets; a quoted word keeps its quotes in .text only when it holds
    spaces (so `"-gencode arch=..."` splits into its flags)."""
    toks: list[Tok] = []
    for m in _WORD.finditer(text):
        w = m.group()
        if w[:1] in "\"'" and w[-1:] == w[:1] and len(w) >= 2:
            inner = w[1:-1]
            for m2 in re.finditer(r"\S+", inner):
                toks.append(Tok(m2.group(), base + m.start() + 1 + m2.start()))
        else:
            toks.append(Tok(w, base + m.start()))
    return toks


_ASSIGN_TORCH = re.compile(r"(?:^|[\s;(])(?:export\s+|ENV\s+|ARG\s+|set\(\s*|-D)?TORCH_CUDA_ARCH_LIST(?:\s*[=\s]\s*|\s+)"
                           r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\";)]+)")


def scan_build(text: str, kind: str) -> list[Verdict]:
    """GPU006 in a CMakeLists.txt / *.cmake ("cmake"), Makefile ("make"), Dockerfile or shell
    script ("shell")."""
    clean = _strip_hash_comments(text)
    out: list[Verdict] = []
    # TORCH_CUDA_ARCH_LIST assignments, judged together for the file: several different values
    # are alternatives (one per GPU) and are left alone.
    values = [Tok(m.group(1), m.start(1)) for m in _ASSIGN_TORCH.finditer(clean)]
    if values:
        texts = {v.text.strip("\"'") for v in values}
        if len(texts) == 1:
            for v in values:
                verdict = judge(torch_arch_targets([v]), "TORCH_CUDA_ARCH_LIST")
                if verdict:
                    out.append(verdict)
    if kind == "cmake":
        archs = [Tok(m.group(2), m.start(2)) for m in re.finditer(
            r"(CMAKE_CUDA_ARCHITECTURES|CUDA_ARCHITECTURES)[\s\"]+(\"[^\"]*\"|[^\s)\"]+(?:[ \t]+[0-9][^\s)\"]*)*)", clean)]
        archs = [a for a in archs if not a.text.startswith("$")] if archs else []
        if archs:
            verdict = judge(cmake_arch_targets(archs), "CUDA_ARCHITECTURES")
            if verdict:
                out.append(verdict)
        flags = [t for t in _words(clean, 0)]
        flags = [t for t in flags if t.text.strip("\")") and not t.text.startswith(("CMAKE_CUDA_ARCH", "CUDA_ARCH"))]
        verdict = judge(nvcc_targets([Tok(t.text.rstrip(")"), t.start) for t in flags if _flagish(t.text)],
                                     shell=True), "the nvcc flags")
        if verdict and any(FLAG_HINT.search(t.text) for t in flags):
            out.append(verdict)
        return out
    if kind == "make":
        flags = [t for t in _words(clean, 0) if _flagish(t.text)]
        verdict = judge(nvcc_targets(flags, shell=True), "the nvcc flags")
        if verdict:
            out.append(verdict)
        return out
    # shell / Dockerfile: one nvcc command per logical line
    for start, line in _logical_lines(clean):
        if not re.search(r"(^|[\s;&|/])nvcc(\s|$)", line):
            continue
        words = _words(line, start)
        verdict = judge(nvcc_targets([w for w in words if _flagish(w.text)], shell=True), "this nvcc command")
        if verdict:
            out.append(verdict)
        cm = [w for w in words if w.text.startswith("-DCMAKE_CUDA_ARCHITECTURES=")]
        if cm:
            verdict = judge(nvcc_targets(cm), "CMAKE_CUDA_ARCHITECTURES")
            if verdict:
                out.append(verdict)
    for start, line in _logical_lines(clean):
        if "nvcc" not in line and "-DCMAKE_CUDA_ARCHITECTURES=" in line:
            verdict = judge(nvcc_targets([w for w in _words(line, start) if w.text.startswith("-DCMAKE_CUDA_ARCH")]),
                            "CMAKE_CUDA_ARCHITECTURES")
            if verdict:
                out.append(verdict)
    return out


def _flagish(word: str) -> bool:
    return bool(re.match(r"^(-arch|--gpu-architecture|-code|--gpu-code|-gencode|--generate-code|arch=|sm_|compute_|"
                         r"-DCMAKE_CUDA_ARCHITECTURES|-DTORCH_CUDA_ARCH_LIST|\[?sm_|\"?arch=)", word))


def _logical_lines(text: str):
    """(offset, line) for each line, joining backslash continuations (offsets stay exact: the
    backslash-newline is replaced by two spaces)."""
    start = 0
    buf = []
    pos = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        if body.endswith("\\"):
            buf.append(body[:-1] + " " * (1 + len(line) - len(body)))
            pos += len(line)
            continue
        buf.append(line)
        yield start, "".join(buf)
        pos += len(line)
        start = pos
        buf = []
    if buf:
        yield start, "".join(buf)
