"""Where people run linters: every output format behind the one renderer interface, SARIF 2.1.0
as GitHub code scanning requires it, GitHub Actions workflow commands escaped as GitHub's toolkit
does, and the pre-commit hooks (manifest, the files they pass, --force-exclude)."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.cli import LINT_FORMATS as FORMATS
from gpudoctor.lint import engine, render, rules
from gpudoctor.lint.model import FileError, Finding, Fix, LintResult
from lint_helpers import TWO_FINDINGS

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "tests" / "fixtures" / "sarif" / "sarif-2.1.0-subset.schema.json"
runner = CliRunner()

SOURCE = TWO_FINDINGS + textwrap.dedent("""

    def moved(x, B, N, H, D):
        y = x.view(B, N, H, D).transpose(1, 2)
        return y.view(B, H * N, D)


    with torch.backends.cuda.sdp_kernel(enable_flash=True):
        pass
    """).lstrip(" ")


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text(SOURCE)
    (tmp_path / "pkg" / "broken.py").write_text("import torch\nx = y.transpose(1, 2).view(\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args):
    return runner.invoke(app, ["lint", *map(str, args)])


def test_every_format_has_a_renderer_and_the_command_offers_each():
    assert tuple(render.RENDERERS) == FORMATS == render.FORMATS
    result = LintResult(findings=[Finding("a.py", 1, 1, "GPU003", "view-stride", "m", Fix("display-only", "d"))])
    for fmt in FORMATS:
        assert render.render(fmt, result), fmt
    r = invoke("--help")
    assert all(f in r.stdout for f in FORMATS)


# --- SARIF ---------------------------------------------------------------------------------------


def _sarif(project, *extra):
    r = invoke("pkg", "--format", "sarif", *extra)
    assert r.exit_code == 2, r.output  # findings, and a file that does not parse
    return json.loads(r.stdout)


def test_sarif_validates_against_the_sarif_2_1_0_schema(project):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    data = _sarif(project)
    assert not [e.message for e in validator.iter_errors(data)]
    # the schema is not a formality: a misspelt or missing property fails it
    data["runs"][0]["results"][0]["ruleID"] = "GPU003"
    assert list(validator.iter_errors(data))
    del data["runs"][0]["results"][0]["ruleID"]
    del data["runs"][0]["results"][0]["message"]
    assert list(validator.iter_errors(data))


def test_sarif_has_what_github_code_scanning_requires(project):
    """The properties GitHub's "SARIF support for code scanning" marks required, with explicit,
    non-empty values, and its limits (one tool per run, at most 10 locations per result)."""
    data = _sarif(project)
    assert data["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json" and data["version"] == "2.1.0"
    [run] = data["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "gpudoctor" and driver["semanticVersion"]
    ids = [r["id"] for r in driver["rules"]]
    assert ids == [r.code for r in rules.RULES]
    for rule in driver["rules"]:
        for key in ("shortDescription", "fullDescription", "help"):
            assert rule[key]["text"].strip(), (rule["id"], key)
        assert len(rule["name"]) <= 255 and len(rule["shortDescription"]["text"]) <= 1024
        assert len(rule["fullDescription"]["text"]) <= 1024
        assert rule["help"]["markdown"].strip()
        assert rule["defaultConfiguration"]["level"] in ("note", "warning", "error")
        assert rule["properties"]["precision"] in ("very-high", "high", "medium", "low")
        assert rule["properties"]["problem.severity"] in ("error", "warning", "recommendation")
    results = run["results"]
    assert sorted(r["ruleId"] for r in results) == ["GPU002", "GPU003", "GPU003", "GPU005"]
    for r in results:
        assert driver["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["message"]["text"].strip()
        assert 1 <= len(r["locations"]) <= 10
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"] == {"uri": "pkg/model.py", "uriBaseId": "%SRCROOT%"}
        region = loc["region"]
        for key in ("startLine", "startColumn", "endLine", "endColumn"):
            assert isinstance(region[key], int) and region[key] >= 1, key
        assert (region["endLine"], region["endColumn"]) > (region["startLine"], region["startColumn"])
        assert re.fullmatch(r"[0-9a-f]{16}:\d+", r["partialFingerprints"]["primaryLocationLineHash"])
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == project.resolve().as_uri() + "/"
    view = next(r for r in results if r["ruleId"] == "GPU003")
    assert view["level"] == "error" and view["locations"][0]["physicalLocation"]["region"]["startLine"] == 7
    [invocation] = run["invocations"]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert note["level"] == "error" and "cannot parse" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "pkg/broken.py"


def test_sarif_fingerprints_survive_moved_lines_and_tell_twins_apart(project):
    before = {r["locations"][0]["physicalLocation"]["region"]["startLine"]: r["partialFingerprints"]
              for r in _sarif(project)["runs"][0]["results"]}
    path = project / "pkg" / "model.py"
    path.write_text("# a new first line\n\n" + path.read_text())
    after = {r["locations"][0]["physicalLocation"]["region"]["startLine"] - 2: r["partialFingerprints"]
             for r in _sarif(project)["runs"][0]["results"]}
    assert after == before
    # the two identical `return y.view(B, H * N, D)` lines are two alerts, not one
    prints = [p["primaryLocationLineHash"] for line, p in before.items() if line in (7, 21)]
    assert len(set(prints)) == 2 and {p.split(":")[1] for p in prints} == {"1", "2"}


def test_sarif_carries_safe_fixes_as_character_replacements(project):
    data = _sarif(project)
    text = (project / "pkg" / "model.py").read_text()
    view = next(r for r in data["runs"][0]["results"] if r["ruleId"] == "GPU003")
    [fix] = view["fixes"]
    [change] = fix["artifactChanges"]
    [rep] = change["replacements"]
    start, length = rep["deletedRegion"]["charOffset"], rep["deletedRegion"]["charLength"]
    assert text[start:start + length] == "view" and rep["insertedContent"]["text"] == "reshape"


def test_sarif_paths_outside_the_folder_are_absolute_file_uris(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "src" / "a b.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = invoke(tmp_path / "src", "--format", "sarif")
    data = json.loads(r.stdout)
    uris = {res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for res in data["runs"][0]["results"]}
    assert uris == {(tmp_path / "src" / "a b.py").as_uri()}
    monkeypatch.chdir(tmp_path)
    data = json.loads(invoke("src", "--format", "sarif").stdout)
    assert {res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for res in data["runs"][0]["results"]} == {"src/a%20b.py"}


def test_sarif_suffix_picks_the_format(project):
    r = invoke("pkg", "-o", "lint.sarif")
    assert r.exit_code == 2 and r.stdout == ""
    assert json.loads((project / "lint.sarif").read_text())["version"] == "2.1.0"


def test_sarif_with_no_findings_is_a_valid_empty_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("import torch\n\ndef f(x):\n    return x.transpose(1, 2).reshape(2, -1)\n")
    r = invoke(".", "--format", "sarif")
    assert r.exit_code == 0
    run = json.loads(r.stdout)["runs"][0]
    assert run["results"] == [] and run["invocations"][0]["executionSuccessful"] is True
    assert len(run["tool"]["driver"]["rules"]) == len(rules.RULES)


# --- GitHub Actions annotations --------------------------------------------------------------------

_COMMAND = re.compile(r"^::(error|warning|notice) (?P<props>[^:]*)::(?P<message>.*)$")


def test_github_annotations(project):
    r = invoke("pkg", "--format", "github")
    assert r.exit_code == 2
    lines = r.stdout.splitlines()
    parsed = [_COMMAND.match(line) for line in lines]
    assert all(parsed), lines
    props = [dict(p.split("=", 1) for p in m["props"].split(",")) for m in parsed]
    view = next(p for p, m in zip(props, parsed) if "GPU003" in m["message"])
    assert view["file"] == "pkg/model.py" and view["line"] == "7" and int(view["col"]) >= 1
    assert {"endLine", "endColumn", "title"} <= set(view) and view["title"] == "gpudoctor GPU003 (view-stride)"
    levels = {m["message"].split()[0]: m.group(1) for m in parsed if m["message"].startswith("GPU")}
    assert levels == {"GPU002": "warning", "GPU003": "error", "GPU005": "error"}
    broken = next(p for p, m in zip(props, parsed) if p["file"] == "pkg/broken.py")
    assert broken["title"] == "gpudoctor lint%3A not linted"


def test_github_escapes_properties_and_data_as_the_toolkit_does():
    f = Finding("dir,1/odd:name%.py", 3, 4, "GPU007", "xformers-flash-invalid-argument", "50%\r\nof it: a, b",
                Fix("display-only", "d"), 3, 9)
    out = render.github(LintResult(findings=[f], errors=[FileError("x.py", "line one\nline two")]),
                        render.Context(root="."))
    first, second = out.splitlines()
    assert first == ("::notice file=dir%2C1/odd%3Aname%25.py,line=3,col=4,endLine=3,endColumn=9,"
                     "title=gpudoctor GPU007 (xformers-flash-invalid-argument)::GPU007 50%25%0Aof it: a, b")
    assert second == "::error file=x.py,title=gpudoctor lint%3A not linted::line one%0Aline two"
    assert "\r" not in out and out.count("\n") == 2


# --- pre-commit ----------------------------------------------------------------------------------


def _hooks():
    yaml = pytest.importorskip("yaml")
    return {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def test_pre_commit_manifest_is_valid():
    hooks = _hooks()
    assert set(hooks) == {"gpudoctor-lint", "gpudoctor-lint-fix"}
    for hook in hooks.values():
        assert {"id", "name", "entry", "language"} <= set(hook)
        assert hook["language"] == "python" and hook["entry"].startswith("gpudoctor lint ")
        assert "--force-exclude" in hook["entry"].split() and hook["require_serial"] is True
    assert "--fix" in hooks["gpudoctor-lint-fix"]["entry"].split()
    assert "--fix" not in hooks["gpudoctor-lint"]["entry"].split()
    try:
        from pre_commit.clientlib import load_manifest
    except ImportError:
        return  # pre-commit is not a dependency; where it is installed, its own validator agrees
    assert [h["id"] for h in load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))] == list(hooks)


@pytest.mark.parametrize("name", [
    "a.py", "src/m.PY", "k.cu", "k.cuh", "x.cpp", "x.cc", "x.cxx", "x.c++", "x.c", "x.h", "x.hpp", "x.hh", "x.hxx",
    "x.inl", "x.ipp", "CMakeLists.txt", "sub/CMakeLists.txt", "cmake/cuda.cmake", "Makefile", "sub/makefile",
    "GNUmakefile", "rules.mk", "build.sh", "run.bash", "Dockerfile", "docker/Dockerfile.cuda", "x.dockerfile",
    "cmakelists.txt", "notes.txt", "a.pyi", "a.ipynb", "setup.cfg", "README.md", "x.cuh.bak", "Makefile.am",
    "dockerfiles/readme.md", "pyproject.toml", "a.pyc",
])
def test_pre_commit_files_pattern_is_what_lint_reads(name):
    """pre-commit passes only the files its pattern matches, and lint refuses a file of a kind it
    does not read: the two must agree name for name."""
    for hook in _hooks().values():
        matched = re.search(hook["files"], name) is not None
        assert matched == (engine.classify(name) is not None), (hook["id"], name)


def test_pre_commit_runs_the_hook_entry_on_the_files_it_is_given(project):
    entry = _hooks()["gpudoctor-lint-fix"]["entry"].split()
    assert entry[:2] == ["gpudoctor", "lint"]
    (project / "pyproject.toml").write_text('[tool.gpudoctor.lint]\nexclude = ["pkg/broken.py", "vendor/**"]\n')
    (project / "vendor").mkdir()
    (project / "vendor" / "v.py").write_text(SOURCE)
    (project / ".venv").mkdir()
    (project / ".venv" / "site.py").write_text(SOURCE)
    files = ["pkg/model.py", "pkg/broken.py", "vendor/v.py", ".venv/site.py"]
    r = invoke(*entry[2:], *files)
    assert r.exit_code == 0 and "fixed 4 findings; 1 file checked" in r.stderr, r.output  # all safe fixes
    assert "y.reshape(B, H * N, D)" in (project / "pkg" / "model.py").read_text()
    assert (project / "vendor" / "v.py").read_text() == SOURCE  # excluded: named, yet not touched
    assert (project / ".venv" / "site.py").read_text() == SOURCE
    assert "broken.py" not in r.output
    # without --force-exclude a named file is linted whatever the configuration says
    r = invoke("vendor/v.py")
    assert r.exit_code == 1 and "vendor/v.py:7:" in r.stdout
