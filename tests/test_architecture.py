"""The import directions of gpudoctor's packages, read from the source with `ast` (nothing is
imported). doctor/__init__.py and each package's `__init__` docstring state them; this pins them:

- layers, lowest first: the foundation (gpudoctor.knowledge, gpudoctor.safetext, gpudoctor.output,
  the probe contract gpudoctor.probes.base and the registry), gpudoctor.reports, the capabilities
  (scan, explain, ticket, lint, fleet, patch, and the probe modules), the CLI layer (gpudoctor.cli,
  gpudoctor.entry, gpudoctor.__main__). A module imports its own layer or lower ones, never higher
  (one named exception below, with its reason). The root package `gpudoctor` is the namespace:
  anyone may import it (its `__version__`), and it re-exports `check_module` lazily.
- a capability imports another capability's modules only where CROSS allows it;
- no module imports another package's private (`_`-prefixed) module or name;
- nothing outside gpudoctor.scan imports the worker, and the worker side (what
  gpudoctor.scan.worker reaches) imports only the standard library and its own few modules at
  module level: it runs in the target interpreter, where gpudoctor is not installed;
- no module of gpudoctor imports torch at module level.

That the CLI process never imports torch is also checked by running it: tests/test_cli_explain.py
(`explain` in a fresh interpreter), tests/test_entry.py (the console script before a scan) and
tests/test_environment.py (the environment collectors).
"""
from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"gpudoctor": ROOT / "doctor", "gpudoctor.probes": ROOT / "probes", "gpudoctor.reports": ROOT / "reports"}

CLI = ("gpudoctor.cli", "gpudoctor.entry", "gpudoctor.__main__")
CAPABILITIES = ("scan", "explain", "ticket", "lint", "fleet", "patch")
FOUNDATION = ("gpudoctor.knowledge", "gpudoctor.safetext", "gpudoctor.output", "gpudoctor.probes.base")
LAYERS = ("foundation", "reports", "capability", "cli")

# What one capability may import from another (module names or package prefixes ending in ".").
CROSS: dict[str, tuple[str, ...]] = {
    "scan": ("gpudoctor.fleet.launch",),  # a scan records the job it ran in (Slurm, torchrun, Ray)
    "explain": (),
    # match the output; scan the probes it names; the patch for the user's code
    "ticket": ("gpudoctor.explain.", "gpudoctor.scan.runner", "gpudoctor.patch."),
    "lint": ("gpudoctor.explain.explanation", "gpudoctor.scan.fatbin"),  # rule pages; arch flags vs binaries
    "fleet": ("gpudoctor.scan.runner", "gpudoctor.scan.environment"),  # one scan per rank or node
    # lint's public preview of `lint --fix`, its rule table and its fix grades
    "patch": ("gpudoctor.lint", "gpudoctor.lint.rules", "gpudoctor.lint.model"),
    "probes": ("gpudoctor.scan.fatbin",),  # arch-compat reads the binaries' architectures
}

# Imports against the layer order, each with its reason.
UPWARD = {
    ("gpudoctor.reports.redact", "gpudoctor.scan.torchenv"):
        "redaction keeps the environment variables that the worker's allow-list records",
}

# The worker side: what gpudoctor.scan.worker may reach.
WORKER_SIDE = ("gpudoctor", "gpudoctor.scan", "gpudoctor.scan.worker", "gpudoctor.scan.protocol",
               "gpudoctor.scan.torchenv", "gpudoctor.scan.fatbin", "gpudoctor.probes", "gpudoctor.probes.")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (a name imported from a module is in `name`)
    name: str | None
    line: int
    top: bool  # at module level (not in a function, not under TYPE_CHECKING)


def find_modules(sources: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every .py under the source folders (a folder mapped to a package of
    its own is read under that name only)."""
    out: dict[str, Path] = {}
    folders = {folder.resolve() for folder in sources.values()}
    for package, folder in sources.items():
        for path in sorted(folder.rglob("*.py")):
            if any(parent.resolve() in folders and parent.resolve() != folder.resolve() for parent in path.parents):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def read_imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def walk(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = False
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(name, alias.name, None, child.lineno, top))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = name.split(".") if _is_package(path) else name.split(".")[:-1]
                    package = package[: len(package) - child.level + 1]
                    base = ".".join(package + ([child.module] if child.module else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        found.append(Import(name, sub, None, child.lineno, top))
                    else:
                        found.append(Import(name, base, alias.name, child.lineno, top))
            walk(child, inner)

    walk(tree, True)
    return found


def layer(module: str) -> str | None:
    if module == "gpudoctor":
        return None  # the namespace: see the module docstring
    if module in CLI:
        return "cli"
    if module == "gpudoctor.probes" or any(module == f or module.startswith(f + ".") for f in FOUNDATION):
        return "foundation"
    if module.startswith("gpudoctor.reports"):
        return "reports"
    if capability(module):
        return "capability"
    return None


def capability(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in CAPABILITIES:
        return parts[1]
    if len(parts) == 3 and parts[1] == "probes" and parts[2] != "base":
        return "probes"
    return None


def _package(module: str, modules: dict[str, Path]) -> str:
    return module if _is_package(modules[module]) else module.rpartition(".")[0]


def _allowed(target: str, allowed: tuple[str, ...]) -> bool:
    return any(target == a or (a.endswith(".") and target.startswith(a)) for a in allowed)


def violations(sources: dict[str, Path]) -> list[str]:
    """Every import that breaks a rule of the module docstring, as 'file:line: what'."""
    modules = find_modules(sources)
    graph = {name: read_imports(name, path, modules) for name, path in modules.items()}
    out: list[str] = []

    base = Path(os.path.commonpath([str(folder) for folder in sources.values()]))

    def say(imp: Import, what: str) -> None:
        out.append(f"{modules[imp.source].relative_to(base)}:{imp.line}: {imp.source} imports "
                   f"{imp.target}{'.' + imp.name if imp.name else ''}: {what}")

    for source, imports in graph.items():
        for imp in imports:
            if imp.target.split(".")[0] == "torch" and imp.top:
                say(imp, "torch at module level")
            if not imp.target.startswith("gpudoctor"):
                continue
            target_short = imp.target.rpartition(".")[2]
            if target_short.startswith("_") and not target_short.startswith("__") \
                    and imp.target.rpartition(".")[0] != _package(source, modules):
                say(imp, "another package's private module")
            if imp.name and imp.name.startswith("_") and not imp.name.startswith("__") and imp.target in modules \
                    and _package(imp.target, modules) != _package(source, modules):
                say(imp, "another package's private name")
            if imp.target == "gpudoctor.scan.worker" and not source.startswith("gpudoctor.scan"):
                say(imp, "only gpudoctor.scan imports the worker")
            have, want = layer(source), layer(imp.target)
            if have is not None and want is not None and LAYERS.index(want) > LAYERS.index(have) \
                    and (source, imp.target) not in UPWARD:
                say(imp, f"the {have} layer imports the {want} layer")
            mine, theirs = capability(source), capability(imp.target)
            if mine and theirs and mine != theirs and not _allowed(imp.target, CROSS[mine]):
                say(imp, f"{mine} may import only {', '.join(CROSS[mine]) or 'nothing'} of another capability")

    worker = "gpudoctor.scan.worker"
    if worker in graph:
        seen, todo = {worker}, [worker]
        while todo:
            for imp in graph[todo.pop()]:
                if imp.top and imp.target.split(".")[0] not in sys.stdlib_module_names | {"gpudoctor", "__future__"}:
                    say(imp, "the worker side imports only the standard library at module level")
                if not imp.target.startswith("gpudoctor"):
                    continue
                if not _allowed(imp.target, WORKER_SIDE):
                    say(imp, "outside the worker side (it runs where gpudoctor is not installed)")
                elif imp.target in graph and imp.target not in seen and imp.target != "gpudoctor":
                    seen.add(imp.target)
                    todo.append(imp.target)
    return out


def test_every_module_has_a_layer():
    modules = find_modules(SOURCES)
    assert "gpudoctor.scan.worker" in modules and "gpudoctor.reports.redact" in modules
    assert [m for m in modules if m != "gpudoctor" and layer(m) is None] == []


def test_import_directions_hold():
    assert violations(SOURCES) == []


def test_every_package_says_what_it_may_import_and_who_imports_it():
    for name, path in find_modules(SOURCES).items():
        if _is_package(path) and name.count(".") == 1:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            assert "May import" in doc and "mported by" in doc, name


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in {"doctor/__init__.py": "", "probes/__init__.py": "", "reports/__init__.py": "",
                      "probes/base.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {"gpudoctor": tmp_path / "doctor", "gpudoctor.probes": tmp_path / "probes",
            "gpudoctor.reports": tmp_path / "reports"}


@pytest.mark.parametrize("files, expected", [
    ({"doctor/lint/__init__.py": "", "doctor/lint/x.py": "from gpudoctor.cli import app\n", "doctor/cli.py": ""},
     "the capability layer imports the cli layer"),
    ({"reports/model.py": "from gpudoctor.explain import matcher\n", "doctor/explain/__init__.py": "",
      "doctor/explain/matcher.py": ""}, "the reports layer imports the capability layer"),
    ({"doctor/knowledge/__init__.py": "", "doctor/knowledge/kb.py": "import gpudoctor.reports.render\n",
      "reports/render.py": ""}, "the foundation layer imports the reports layer"),
    ({"doctor/fleet/__init__.py": "", "doctor/fleet/m.py": "from gpudoctor.scan.worker import main\n",
      "doctor/scan/__init__.py": "", "doctor/scan/worker.py": ""}, "only gpudoctor.scan imports the worker"),
    ({"doctor/explain/__init__.py": "", "doctor/explain/m.py": "def f():\n    from gpudoctor.scan import runner\n",
      "doctor/scan/__init__.py": "", "doctor/scan/runner.py": ""}, "explain may import only nothing"),
    ({"doctor/lint/__init__.py": "", "doctor/lint/m.py": "from gpudoctor.probes import _attention\n",
      "probes/_attention.py": ""}, "another package's private module"),
    ({"doctor/lint/__init__.py": "", "doctor/lint/m.py": "from gpudoctor.reports.redact import _rules\n",
      "reports/redact.py": "_rules = 1\n"}, "another package's private name"),
    ({"doctor/scan/__init__.py": "", "doctor/scan/worker.py": "from gpudoctor.scan import torchenv\n",
      "doctor/scan/torchenv.py": "import rich\n"}, "the worker side imports only the standard library"),
    ({"doctor/scan/__init__.py": "", "doctor/scan/worker.py": "def f():\n    from gpudoctor import output\n",
      "doctor/output.py": ""}, "outside the worker side"),
    ({"probes/p.py": "import torch\n"}, "torch at module level"),
])
def test_a_planted_violation_is_caught(tmp_path, files, expected):
    found = violations(_tree(tmp_path, files))
    assert any(expected in line for line in found), found


def test_the_same_imports_done_right_are_not_flagged(tmp_path):
    files = {"doctor/cli.py": "from gpudoctor.lint import x\n", "doctor/lint/__init__.py": "",
             "doctor/lint/x.py": "from gpudoctor.scan import fatbin\nfrom . import y\n", "doctor/lint/y.py": "",
             "doctor/scan/__init__.py": "", "doctor/scan/fatbin.py": "import struct\n",
             "doctor/scan/worker.py": "from gpudoctor.scan import fatbin\nfrom gpudoctor.probes import base\n",
             "probes/_attention.py": "", "probes/p.py": "from gpudoctor.probes import _attention\n"
                                                       "def run():\n    import torch\n"}
    assert violations(_tree(tmp_path, files)) == []
