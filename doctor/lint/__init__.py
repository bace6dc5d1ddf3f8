"""`gpudoctor lint`: find the known GPU failure patterns of the knowledge base in source code
before it runs (Python via `ast`; C++/CUDA via tree-sitter's CUDA grammar; setup.py, CMake,
Makefiles, shell scripts, Dockerfiles and cog.yaml for build flags) and print the fix.

Modules: `rules` (the rules as data and their documentation; cheap to import), `model`
(findings and graded fixes), `engine` (discovery, prefilter, workers, suppressions, cross-file
step), `pysource` / `pyflow` (with its mixins `pylayout`, `pyattention`, `pysizes`,
`pycalls`) / `pyrules` (Python), `cpp` (the C++/CUDA parser), `cpprules` / `cppalloc` (GPU009,
GPU010), `pycallers` (GPU009's Python callers), `archflags`
(CUDA architecture flags), `config` ([tool.gpudoctor.lint]), `fixes` (diffs and atomic writes),
`render`, `cli`, and `explain` (`gpudoctor explain GPU003`).

Nothing is imported here: `gpudoctor explain` imports `gpudoctor.lint.rules` alone, and only for
an argument that looks like a lint code.

May import: the standard library, tree_sitter and tree_sitter_cuda (`cpp`, when a C++ file is
parsed), gpudoctor.knowledge, gpudoctor.explain (`explain`: a rule's
page), gpudoctor.scan.fatbin (`archflags`), gpudoctor.reports.markdown, gpudoctor.output and
gpudoctor.safetext. Never the rest of gpudoctor.scan, the CLI layer, or torch. Imported by: the
CLI layer.
"""
