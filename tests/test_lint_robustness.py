"""A rule that fails on a file costs that rule on that file only: the failure is an internal
error naming the file and the rule in every output, the other rules and files are linted, and
the exit code (3) says so. And every rule runs over every file of large real trees (the
installed torch package with its C++ headers, a CUDA toolkit) without one."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import textwrap

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.lint import buildflags, cppalloc, cppresolve, cpprules, engine, rules
from gpudoctor.lint.rules import gpu005_parameter_reassign
from lint_helpers import TWO_FINDINGS

runner = CliRunner()
SARIF_SCHEMA = pathlib.Path(__file__).resolve().parent / "fixtures" / "sarif" / "sarif-2.1.0-subset.schema.json"

PY = TWO_FINDINGS.replace("import torch.nn as nn\n", "import torch.nn as nn\n# BOOM: the test breaks GPU005 on this file\n", 1)
ALLOC = textwrap.dedent("""
    // BOOM: the test breaks GPU010 on this file
    #include <c10/core/Allocator.h>
    void* exact(size_t nbytes) { return aligned_alloc(64, nbytes); }
    """).lstrip()
EXT = textwrap.dedent("""
    #include <torch/extension.h>
    void f(torch::Tensor x) { launch(x.data_ptr<float>()); }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
    """).lstrip()


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """A project, and GPU006, GPU005 and GPU010 made to raise on the files that say BOOM."""
    files = {
        "CMakeLists.txt": "# BOOM\nset(CMAKE_CUDA_ARCHITECTURES 80-real)\n",
        "sub/CMakeLists.txt": "set(CMAKE_CUDA_ARCHITECTURES 80-real)\n",
        "model.py": PY,
        "alloc.cpp": ALLOC,
        "ext.cpp": EXT,
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    scan_build, reassign, allocs = buildflags.scan_build, gpu005_parameter_reassign.check, cppalloc.allocator_findings

    def boom(real, text):
        if "BOOM" in text:
            raise TypeError("unsupported operand type(s) for +: 'Tok' and 'int'")
        return real

    monkeypatch.setattr(buildflags, "scan_build", lambda text, kind: boom(scan_build(text, kind), text))
    monkeypatch.setattr(gpu005_parameter_reassign, "check", lambda src, facts=None: boom(reassign(src), src.text))
    monkeypatch.setattr(cppalloc, "allocator_findings", lambda path, cpp: boom(allocs(path, cpp), cpp.text))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(*args):
    return runner.invoke(app, ["lint", ".", "--isolated", "--jobs", "1", *args])


FAILED = [("CMakeLists.txt", "GPU006"), ("alloc.cpp", "GPU010"), ("model.py", "GPU005")]


def test_a_failing_rule_costs_that_rule_on_that_file_only(broken):
    r = _invoke("--format", "json")
    assert r.exit_code == 3, r.output
    data = json.loads(r.stdout)
    assert [(e["path"], e["rule"]) for e in data["internal_errors"]] == FAILED
    assert all("TypeError: unsupported operand" in e["message"] and "test_lint_robustness.py" not in e["message"]
               for e in data["internal_errors"])
    # everything else was linted: the other rules on the same files, the same rule on other files
    got = sorted((f["path"], f["code"]) for f in data["findings"])
    assert got == [("ext.cpp", "GPU009"), ("model.py", "GPU003"), ("sub/CMakeLists.txt", "GPU006")]
    assert data["errors"] == []
    # stderr names each one, says what it is, and there is no traceback
    assert "Traceback" not in r.output
    for path, code in FAILED:
        assert f"{path}: internal error in {code}" in r.stderr
    assert "gpudoctor bug" in r.stderr and "3 internal errors" in r.stderr


def test_internal_errors_in_every_output_format(broken):
    text = _invoke()
    assert text.exit_code == 3 and text.stdout.count("\n") == 3  # the three findings, nothing else on stdout
    md = _invoke("--format", "md").stdout
    assert "Internal errors" in md and "`alloc.cpp`: `GPU010`" in md
    gh = _invoke("--format", "github").stdout
    assert gh.count("title=gpudoctor lint%3A internal error::") == 3 and "file=model.py," in gh
    sarif = json.loads(_invoke("--format", "sarif").stdout)
    [run] = sarif["runs"]
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert run["invocations"][0]["executionSuccessful"] is False
    assert sorted((n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], n["associatedRule"]["id"])
                  for n in notes) == FAILED
    driver = run["tool"]["driver"]
    assert all(driver["rules"][n["associatedRule"]["index"]]["id"] == n["associatedRule"]["id"] for n in notes)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SARIF_SCHEMA).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    assert not [e.message for e in validator.iter_errors(sarif)]


def test_a_failing_cross_file_step_costs_its_rule_only(broken, monkeypatch):
    def fails(*args, **kwargs):
        raise KeyError("callers")

    monkeypatch.setattr(cppresolve, "resolve_data_ptr", fails)
    data = json.loads(_invoke("--format", "json").stdout)
    assert (None, "GPU009") in [(e["path"], e["rule"]) for e in data["internal_errors"]]
    assert sorted((f["path"], f["code"]) for f in data["findings"]) == [("model.py", "GPU003"),
                                                                        ("sub/CMakeLists.txt", "GPU006")]


def test_a_failure_outside_every_rule_costs_that_file(tmp_path, monkeypatch):
    """Even a failure in the engine's own per-file code (here: reading the suppressions) costs
    one file's findings, reported, and the run goes on."""
    (tmp_path / "a.py").write_text("x = 1  # gpudoctor: ignore\ny = torch.zeros(1).transpose(0, 1).view(-1)\n")
    (tmp_path / "b.py").write_text("import torch\ny = torch.zeros(2, 3).transpose(0, 1).view(-1)\n")

    def fails(text, kind):
        raise IndexError("list index out of range")

    monkeypatch.setattr(engine, "_suppressions", fails)
    result, _, _ = engine.lint([str(tmp_path)], isolated=True, jobs=1)
    assert [(os.path.basename(e.path), e.code) for e in result.internal_errors] == [("a.py", None)]
    assert [os.path.basename(f.path) for f in result.findings] == ["b.py"]


# --- every rule over every file of large real trees ------------------------------------------------


def _real_trees() -> list[str]:
    trees = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.origin:
            trees.append(os.path.dirname(spec.origin))  # its .py files and torch/include's headers
    except (ImportError, ValueError):
        pass
    for cuda in sorted(glob.glob("/usr/local/cuda*/")):
        real = os.path.realpath(cuda)
        samples = os.path.join(real, "samples")
        tree = samples if os.path.isdir(samples) else os.path.join(real, "include")
        if os.path.isdir(tree) and tree not in trees:
            trees.append(tree)
    return trees


@pytest.mark.slow
@pytest.mark.parametrize("tree", _real_trees() or [pytest.param(None, marks=pytest.mark.skip(
    reason="neither torch nor a CUDA toolkit is installed here"))])
def test_every_rule_over_every_file_of_a_real_tree(tree, capsys):
    """Every rule on every file, the prefilters off (engine.lint(exhaustive=True)): no exception
    escapes and no rule fails. Files that cannot be linted are allowed (torch ships a file of
    Python 3.12 syntax); they are counted, not hidden."""
    result, by_path, tasks = engine.lint([tree], isolated=True, exhaustive=True)
    kinds = {k: sum(1 for t in tasks.values() if t.kind == k) for k in (rules.PYTHON, rules.CPP, rules.BUILD)}
    with capsys.disabled():
        print(f"\n{tree}: {kinds[rules.PYTHON]} Python, {kinds[rules.CPP]} C++/CUDA, {kinds[rules.BUILD]} build files; "
              f"{len(result.findings)} findings, {len(result.errors)} not linted, "
              f"{len(result.internal_errors)} internal errors")
    assert [e.describe() for e in result.internal_errors] == []
    assert result.files_checked == len(tasks) and sum(kinds.values()) > 1000
    assert all(e.message.startswith(("cannot parse", "cannot decode", "binary file")) for e in result.errors), \
        result.errors


def test_without_the_cpp_parser_the_cpp_files_are_reported_not_linted(tmp_path, monkeypatch):
    """tree-sitter is a dependency; if it cannot be loaded (a broken install, an incompatible
    grammar) the C++ rules say so for each file they needed, never skip it silently, and the
    Python rules still run."""
    import builtins

    from gpudoctor.lint import cpp

    (tmp_path / "ext.cpp").write_text(EXT)
    (tmp_path / "model.py").write_text(PY)
    real_import = builtins.__import__

    def no_tree_sitter(name, *args, **kwargs):
        if name.startswith("tree_sitter"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(cpp, "_PARSER", None)
    monkeypatch.setattr(builtins, "__import__", no_tree_sitter)
    monkeypatch.chdir(tmp_path)
    r = _invoke("--format", "json")
    assert r.exit_code == 2, r.output
    data = json.loads(r.stdout)
    assert [(e["path"], e["message"].split(":")[0]) for e in data["errors"]] == [("ext.cpp", "not linted for GPU009/GPU010")]
    assert "tree-sitter" in data["errors"][0]["message"] and data["internal_errors"] == []
    assert {f["code"] for f in data["findings"]} == {"GPU003", "GPU005"}


def test_a_cpp_file_over_the_parser_limit_is_reported_not_linted(tmp_path, monkeypatch):
    monkeypatch.setattr(cpprules, "MAX_PARSE_BYTES", 100)
    (tmp_path / "ext.cpp").write_text(EXT)
    result, _, _ = engine.lint([str(tmp_path)], isolated=True, jobs=1)
    assert [(os.path.basename(e.path), e.message) for e in result.errors] == \
        [("ext.cpp", "not linted for GPU009/GPU010: larger than 100 bytes, the limit of the C++ parser")]
    assert result.internal_errors == [] and result.findings == []


@pytest.mark.slow
@pytest.mark.parametrize("tree", _real_trees()[:1] or [pytest.param(None, marks=pytest.mark.skip(
    reason="torch is not installed here"))])
def test_the_prefilters_skip_no_file_with_a_finding(tree):
    """The byte prefilters (which files are read and parsed for a rule) and the per-function
    trigger words (which functions the dataflow interprets) only save time: with them off
    (engine.lint(unfiltered=True): every file parsed for every rule, every function interpreted,
    the rules' own gates still on) the installed torch tree gives exactly the same findings."""
    normal, _, _ = engine.lint([tree], isolated=True)
    unfiltered, _, _ = engine.lint([tree], isolated=True, unfiltered=True)
    key = lambda r: sorted((f.path, f.line, f.col, f.code) for f in r.findings)  # noqa: E731
    assert key(unfiltered) == key(normal)
    assert unfiltered.internal_errors == []
