"""`gpudoctor lint`: find the known GPU failure patterns of the knowledge base in source code
before it runs (Python via `ast`; C++/CUDA via tree-sitter's CUDA grammar; setup.py, CMake,
Makefiles, shell scripts, Dockerfiles and cog.yaml for build flags) and print the fix.

Modules: `rules`, a package with one module per rule, named after it
(`rules/gpu003_view_after_transpose.py`): the rule's documentation and prefilter as data, and its
check or the entry point to it; `rules/__init__` holds the `Rule` type and the registry (`RULES`,
`select`, `describe`). `model` (findings and graded fixes), `engine` (discovery, prefilter,
workers, suppressions), `crossfile` (the project steps after every file: GPU009, GPU012, the Python
project pass), `pysource` / `pyflow` (with its mixins `pylayout`, `pyattention`, `pysizes`,
`pycalls`) / `pyrules` (the Python rules by their table, and the dataflow they share), `castflow`
(GPU011's casts), `pycontig` (GPU012), `cpp` (the C++/CUDA parser), `cpprules` / `cppresolve` /
`cppalloc` (GPU009 per file and across files, GPU010), `pycallers` (GPU009's Python callers),
`pyarch` / `buildflags` / `archflags` (GPU006: CUDA architecture flags in Python, in build files,
and their verdict), `config` ([tool.gpudoctor.lint]), `fixes` and `autofix` (diffs and atomic
writes), `render`, `cli`, and `explain` (`gpudoctor explain GPU003`).

Nothing is imported here: `gpudoctor explain` imports `gpudoctor.lint.rules` alone, and only for
an argument that looks like a lint code. One public function lives here for the other commands:
`preview(paths, select, unsafe_fixes=...)`, what `gpudoctor lint --fix --select ... PATHS` would
write, without writing (gpudoctor.patch prints it under a diagnosis); it imports the engine when
called.

May import: the standard library, tree_sitter and tree_sitter_cuda (`cpp`, when a C++ file is
parsed), gpudoctor.knowledge, gpudoctor.explain (`explain`: a rule's
page), gpudoctor.scan.fatbin (`archflags`), gpudoctor.reports.markdown, gpudoctor.output and
gpudoctor.safetext. Never the rest of gpudoctor.scan, the CLI layer, or torch. Imported by: the
CLI layer, and gpudoctor.patch (`preview` and `rules`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.lint.model import LintResult


def preview(paths: list[str], select: list[str], *, unsafe_fixes: bool = False,
            max_files: int | None = None, required: tuple[str, ...] = ()) -> "LintResult | None":
    """Lint `paths` (files or folders, read as `gpudoctor lint` reads them: the configuration,
    the default excludes) with the rules `select`, and fill `diffs` with what `gpudoctor lint --fix
    --select ... [--unsafe-fixes] PATHS` would write, path -> unified diff, writing nothing. None
    when more than `max_files` files would be read, or when the walk leaves out one of the files
    `required` (the configuration excludes it: named on their own, they are read). Raises
    ValueError for a bad path, code or configuration, as the command does."""
    import os

    from gpudoctor.lint import engine, fixes
    from gpudoctor.lint.model import FileError

    if max_files is not None or required:
        found = engine.discover(paths, select, None, False)
        if max_files is not None and len(found) > max_files:
            return None
        walked = {os.path.realpath(task.path) for task, _ in found}
        # named on their own, the required files the rules read (a C++ rule reads no Python file)
        named = engine.discover(list(required), select, None, False) if required else []
        if any(os.path.realpath(task.path) not in walked for task, _ in named):
            return None
    result, by_path, tasks = engine.lint(paths, select, None, False, 1)
    for path in sorted({f.path for f in result.findings if fixes.applicable(f, unsafe_fixes)}):
        task, fr = tasks[path], by_path[path]
        try:
            original, new, _ = fixes.fix_file(task, fr, unsafe_fixes, fixes.cross_file(result.findings, fr))
        except (fixes.FixError, OSError, UnicodeError) as exc:
            result.errors.append(FileError(path, f"not fixed: {exc}"))
            continue
        if new != original:
            result.diffs[path] = fixes.unified_diff(path, original, new)
    return result
