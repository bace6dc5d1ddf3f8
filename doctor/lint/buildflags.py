"""GPU006 in build files: the CUDA architecture flags of CMake files, Makefiles, shell scripts,
Dockerfiles and cog.yaml (`scan_build`), read as text with their comments blanked out, their
line continuations joined and their branches on the CUDA toolkit's version followed; each flag
list is judged by gpudoctor.lint.archflags, which reads the lists and says what runs where.
"""
from __future__ import annotations

import re

from gpudoctor.lint.archflags import (_TOOLKIT_NAME, FLAG_HINT, Targets, Tok, Verdict, _union, cmake_arch_targets, judge,
                                      nvcc_targets, toolkit_below, torch_arch_targets)

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


def cog_commands(text: str) -> str:
    """The shell commands of a Cog build file (`cog.yaml`: `build:` / `run:` / `- command`), each
    at its own offset, with everything else blanked (newlines kept), so that the shell scanner
    reads them and only them. Items may be plain (`- cmd`), quoted, `- command: cmd` mappings or
    block scalars (`- |` followed by more-indented lines). A small reader of this one shape, not a
    YAML parser: anything else is left out (read as nothing)."""
    out = [c if c == "\n" else " " for c in text]
    lines = text.splitlines(keepends=True)
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line)

    def indent(s: str) -> int:
        return len(s) - len(s.lstrip(" "))

    def keep(a: int, b: int) -> None:
        out[a:b] = text[a:b]

    build_indent = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\n")
        body = line.strip()
        if body.startswith("build:") and body[6:].strip() in ("", "#"):
            build_indent = indent(line)
        elif build_indent is not None and body and indent(line) <= build_indent and not body.startswith("#"):
            build_indent = None if not body.startswith("build:") else indent(line)
        if build_indent is not None and indent(line) > build_indent and re.match(r"run:\s*(#.*)?$", body):
            run_indent = indent(line)
            i += 1
            block: int | None = None  # the indent a block scalar's lines are deeper than
            while i < len(lines):
                item = lines[i].rstrip("\n")
                stripped = item.strip()
                if stripped and indent(item) <= run_indent and not stripped.startswith("-"):
                    break
                if stripped and indent(item) < run_indent:
                    break
                if block is not None and stripped and indent(item) > block:
                    keep(starts[i], starts[i] + len(item))
                    i += 1
                    continue
                block = None
                m = re.match(r"(\s*-\s+)(?:(command:\s*))?(.*)$", item) or \
                    re.match(r"(\s*)(command:\s*)(.*)$", item)
                if m:
                    value = m.group(3)
                    offset = starts[i] + m.end(2 if m.group(2) else 1)
                    if value.strip() in ("|", ">", "|-", ">-"):
                        block = indent(item)
                    elif value and not value.startswith(("mounts:", "#")):
                        if value[:1] in "\"'" and value.rstrip()[-1:] == value[:1]:
                            keep(offset + 1, offset + len(value.rstrip()) - 1)
                        else:
                            keep(offset, offset + len(value))
                i += 1
            continue
        i += 1
    return "".join(out)


def scan_build(text: str, kind: str) -> list[Verdict]:
    """GPU006 in a CMakeLists.txt / *.cmake ("cmake"), Makefile ("make"), Dockerfile or shell
    script ("shell"), or a Cog build file's run commands ("cog")."""
    if kind == "cog":
        text, kind = cog_commands(text), "shell"
    clean = _strip_hash_comments(text)
    out: list[Verdict] = []
    # TORCH_CUDA_ARCH_LIST assignments, judged together per scope: several different values in
    # one scope are alternatives (one per GPU) and are left alone. A Dockerfile's ENV / ARG set
    # it for every later step; a value exported inside one RUN step holds for that step only.
    dockerfile = kind == "shell" and re.search(r"(?im)^\s*FROM\s+\S", clean) is not None
    run_steps = [(m.start(), m.end()) for m in re.finditer(r"(?ims)^[ \t]*RUN\b(?:[^\n]*\\\n)*[^\n]*", clean)] \
        if dockerfile else []
    scopes: dict[int, list[Tok]] = {}
    for m in _ASSIGN_TORCH.finditer(clean):
        step = next((i for i, (a, b) in enumerate(run_steps) if a <= m.start(1) < b), -1)
        scopes.setdefault(step, []).append(Tok(m.group(1), m.start(1)))
    for values in scopes.values():
        texts = {v.text.strip("\"'") for v in values}
        if len(texts) == 1:
            for v in values:
                verdict = judge(torch_arch_targets([v]), "TORCH_CUDA_ARCH_LIST")
                if verdict:
                    out.append(verdict)
    if kind == "cmake":
        # CMAKE_CUDA_ARCHITECTURES (set / list(APPEND)) is one value for every target; a target's
        # own CUDA_ARCHITECTURES property replaces it for that target and is judged alone.
        variable, properties = [], []
        for m in re.finditer(r"(CMAKE_CUDA_ARCHITECTURES|CUDA_ARCHITECTURES)[\s\"]+"
                             r"(\"[^\"]*\"|[^\s)\"]+(?:[ \t]+[0-9][^\s)\"]*)*)", clean):
            if m.group(2).startswith("$"):
                continue
            (variable if m.group(1).startswith("CMAKE_") else properties).append(Tok(m.group(2), m.start(2)))
        words = [t for t in _words(clean, 0)]
        words = [t for t in words if t.text.strip("\")") and not t.text.startswith(("CMAKE_CUDA_ARCH", "CUDA_ARCH"))]
        from_flags = nvcc_targets([Tok(t.text.rstrip(")"), t.start) for t in words if _flagish(t.text)], shell=True)
        if not any(FLAG_HINT.search(t.text) for t in words):
            from_flags = Targets()
        # Values set in branches chosen by the CUDA toolkit's version are alternatives, each
        # judged (with the rest of the file's values) against the GPUs its toolkit builds for.
        branch = _cmake_branches(clean)
        by_branch: dict[tuple, list[Tok]] = {}
        for tok in variable:
            tests = tuple(t for t in branch(tok.start or 0) if _TOOLKIT_NAME.search(t[0]))
            by_branch.setdefault(tests, []).append(tok)
        base = by_branch.pop((), [])
        chosen = [(base + toks, toolkit_below(list(tests))) for tests, toks in by_branch.items()] or \
            ([(base, None)] if base else [])
        groups = [(cmake_arch_targets(toks), "CUDA_ARCHITECTURES", bound) for toks, bound in chosen] or \
            [(Targets(), "CUDA_ARCHITECTURES", None)]
        groups += [(cmake_arch_targets([p]), "this target's CUDA_ARCHITECTURES", None) for p in properties]
        for part, what, bound in groups:
            # CUDA_ARCHITECTURES and hand-written nvcc flags feed the same builds: reported only
            # when the two together still leave newer GPUs without a kernel.
            if part.archs and from_flags.archs and judge(_union(part, from_flags), "", bound) is None:
                continue
            verdict = judge(part, what, bound)
            if verdict:
                out.append(verdict)
        if not (any(p.archs for p, _, _ in groups) and from_flags.archs and
                all(judge(_union(p, from_flags), "", b) is None for p, _, b in groups if p.archs)):
            verdict = judge(from_flags, "the nvcc flags")
            if verdict:
                out.append(verdict)
        return out
    if kind == "make":
        out += _make_flags(clean)
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


_CMAKE_IF = re.compile(r"(?im)^[ \t]*(if|elseif|else|endif)[ \t]*\(")


def _cmake_branches(clean: str):
    """A function: offset -> the tests of the CMake if() blocks around it, each with True (in the
    branch the test opens) or False (in a later elseif/else of it)."""
    starts: list[int] = [0]
    snapshots: list[tuple[tuple[str, bool], ...]] = [()]
    stack: list[tuple[list[str], str | None]] = []  # per open if: earlier tests of the chain, the current one

    def now() -> tuple[tuple[str, bool], ...]:
        out: list[tuple[str, bool]] = []
        for earlier, current in stack:
            out += [(t, False) for t in earlier]
            if current is not None:
                out.append((current, True))
        return tuple(out)

    for m in _CMAKE_IF.finditer(clean):
        word = m.group(1).lower()
        depth, i = 1, m.end()
        while i < len(clean) and depth:
            depth += {"(": 1, ")": -1}.get(clean[i], 0)
            i += 1
        test = clean[m.end():i - 1].strip()
        if word == "if":
            stack.append(([], test))
        elif word in ("elseif", "else") and stack:
            earlier, current = stack[-1]
            stack[-1] = (earlier + ([current] if current is not None else []), test if word == "elseif" else None)
        elif word == "endif" and stack:
            stack.pop()
        starts.append(i)
        snapshots.append(now())

    def tests_at(offset: int) -> tuple[tuple[str, bool], ...]:
        import bisect

        return snapshots[bisect.bisect_right(starts, offset) - 1]

    return tests_at


_MAKE_ASSIGN = re.compile(r"^[ \t]*(?:override[ \t]+|export[ \t]+)?([A-Za-z_][A-Za-z0-9_.]*)[ \t]*(\?=|:=|::=|\+=|=)(.*)$")


def _make_flags(clean: str) -> list[Verdict]:
    """A Makefile's nvcc builds: each recipe line that runs nvcc, with the flags of the
    variables it expands ($(NVCCFLAGS)); variables no nvcc line uses are judged on their own.
    Two recipes are two builds (a profiling target's -arch=sm_86 does not give the main target
    PTX)."""
    variables: dict[str, list[Tok]] = {}
    commands: list[tuple[list[Tok], set[str]]] = []
    for start, line in _logical_lines(clean):
        m = _MAKE_ASSIGN.match(line)
        if m and not line.startswith("\t"):
            name, op, value = m.group(1), m.group(2), m.group(3)
            toks = [t for t in _words(value, start + m.start(3)) if _flagish(t.text)]
            variables[name] = (variables.get(name, []) if op == "+=" else []) + toks
            continue
        if re.search(r"(^|[\s;&|/(])(?:nvcc|\$[({]NVCC[)}])(\s|$)", line):
            used = set(re.findall(r"\$[({]([A-Za-z_][A-Za-z0-9_.]*)[)}]", line))
            commands.append(([t for t in _words(line, start) if _flagish(t.text)], used))
    out = []
    used_anywhere: set[str] = set()
    for own, used in commands:
        used_anywhere |= used
        toks = own + [t for name in sorted(used) for t in variables.get(name, [])]
        verdict = judge(nvcc_targets(sorted(toks, key=lambda t: t.start or 0), shell=True), "the nvcc flags")
        if verdict:
            out.append(verdict)
    for name, toks in variables.items():
        if name not in used_anywhere and toks:
            verdict = judge(nvcc_targets(toks, shell=True), f"the nvcc flags in {name}")
            if verdict:
                out.append(verdict)
    unique = {(v.anchor.start, v.message): v for v in out}
    return list(unique.values())


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
