"""The field notes' own projects, on their real files (issue 33): tools/lint_real_projects.py
materialises each project's Python files at a pinned commit from a local mirror of its public
repository (never into this repository) and lints them. Runs where the mirror exists (the research
tools' `fetch` makes one under /work/.mirror, or $GPUDOCTOR_MIRRORS), skips elsewhere."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("lint_real_projects", ROOT / "tools" / "lint_real_projects.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


TOOL = _tool()
MIRRORS = pathlib.Path(__import__("os").environ.get("GPUDOCTOR_MIRRORS", "/work/.mirror"))


@pytest.mark.parametrize("project", TOOL.PROJECTS, ids=[p.name for p in TOOL.PROJECTS])
def test_real_files_give_the_judged_findings(project):
    if not TOOL.available(project, MIRRORS):
        pytest.skip(f"no mirror of {project.repo} at {project.commit[:10]} under {MIRRORS}")
    report = TOOL.measure(project, MIRRORS)
    assert report["files"] > 0
    assert report["missed"] == [] and report["unexpected"] == [], report


def test_each_expected_site_is_on_its_project_and_rule():
    for p in TOOL.PROJECTS:
        assert len(p.commit) == 40 and all(c in "0123456789abcdef" for c in p.commit)
        assert all(rule in p.rules for rule, _, _ in p.expected)
    sites = {(p.name, path, line) for p in TOOL.PROJECTS for _, path, line in p.expected}
    assert ("multitalk", "wan/distributed/xdit_context_parallel.py", 481) in sites
    assert len([s for s in sites if s[0] == "fantasy-world-bf16"]) == 10


def test_no_mirror_is_exit_2(tmp_path, capsys):
    assert TOOL.main(["--mirrors", str(tmp_path)]) == 2
    assert "no mirror" in capsys.readouterr().err
