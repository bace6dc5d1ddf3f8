"""The project's promises about itself: the README's test command is what CI runs, the README's
index is the knowledge base, and the probe registry is the set of probe modules."""
from __future__ import annotations

import re
import subprocess
import sys


def test_readme_shows_the_command_ci_runs(repo_root):
    ci = (repo_root / ".ci" / "run").read_text()
    block = re.search(r"# --- the README's test command \(keep in sync\) ---\n(.*)\n# --- end", ci)
    assert block, ".ci/run lost the markers around the README's test command"
    command = block.group(1)
    start = ci.index(command)
    assert "-m pytest" in command and start < ci.index("-m pytest") < start + len(command), \
        "the README's command is the first test run in .ci/run"
    readme = (repo_root / "README.md").read_text()
    assert command in readme, f"README must show CI's test command: {command}"
    assert "gpudoctor scan" in readme.split("## Commands")[0], "the first set-up command runs gpudoctor scan"


def test_readme_index_is_the_knowledge_base(repo_root):
    readme = (repo_root / "README.md").read_text()
    block = re.search(r"<!-- kb-index:start -->\n(.*)<!-- kb-index:end -->", readme, re.S)
    assert block, "README lost its kb-index markers"
    table = subprocess.run([sys.executable, "-m", "gpudoctor", "list", "--markdown"],
                           capture_output=True, text=True, check=True).stdout
    assert block.group(1) == table, "stale index: run python tools/readme_index.py"


def test_probe_registry_matches_the_probe_modules(repo_root):
    from gpudoctor import probes

    modules = sorted(p.stem for p in (repo_root / "probes").glob("*.py")
                     if p.stem not in ("__init__", "base") and not p.stem.startswith("_"))
    assert sorted(probes.BUILTIN) == modules
    specs = [m.SPEC for m in probes.load_builtin()]
    ids = [s.id for s in specs]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "arch-compat"
    for spec in specs:
        assert re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", spec.id)
        assert spec.timeout_s > 0 and spec.title


def test_no_top_level_probes_or_reports_modules_are_installed():
    import importlib.util

    for name in ("probes", "reports", "doctor"):
        spec = importlib.util.find_spec(name)
        assert spec is None or "site-packages" not in (spec.origin or ""), f"top-level {name} installed"
