"""The project's promises about itself: the README's first two commands are the set-up and the
test command CI runs, the documentation's index is the knowledge base, and the probe registry is
the set of probe modules."""
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
    first, second = setup_commands(repo_root / "README.md")
    assert "gpudoctor scan" in first, "the README's first command installs gpudoctor and runs gpudoctor scan"
    assert command in second, f"the README's second command must run CI's test command: {command}"
    # The documentation's home page shows the same two commands.
    assert setup_commands(repo_root / "docs" / "index.md") == (first, second)


def setup_commands(path) -> tuple[str, str]:
    """The first two commands of a page: the command lines of its first shell block."""
    block = re.search(r"^```sh\n(.*?)^```", path.read_text(), re.S | re.M)
    assert block, f"{path.name} has no shell block"
    commands = [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) >= 2, commands
    return commands[0], commands[1]


def test_ci_runs_the_suite_where_a_path_looks_like_a_secret(repo_root):
    """.ci/run runs the README's command in a copy of the checkout under a path with a space and
    40-character runs of letters and digits (an AWS secret key's form, and mktemp's tmp.XXXXXXXXXX
    followed by /main/tests/fixtures/run/dtype): a test or a redaction rule that depends on where
    the checkout lives fails in CI, not only on a user's machine."""
    ci = (repo_root / ".ci" / "run").read_text()
    root = re.search(r'^root="\$work/([^"]+)"$', ci, re.M)
    assert root, ".ci/run lost the folder it copies the checkout into"
    folder = root.group(1)
    assert " " in folder
    assert re.search(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9]{0,39}[A-Z])(?=[A-Za-z0-9]{0,39}[a-z])(?=[A-Za-z0-9]{0,39}[0-9])[A-Za-z0-9]{40}(?![A-Za-z0-9/+])", folder)
    assert re.search(r"/tmp\.[A-Za-z0-9]{10}$", folder) and 'checkout="$root/main"' in ci
    assert ci.index('cd "$checkout"') < ci.index("# --- the README's test command")


def test_docs_index_is_the_knowledge_base(repo_root):
    page = (repo_root / "docs" / "explain.md").read_text()
    block = re.search(r"<!-- kb-index:start -->\n(.*)<!-- kb-index:end -->", page, re.S)
    assert block, "docs/explain.md lost its kb-index markers"
    table = subprocess.run([sys.executable, "-m", "gpudoctor", "list", "--markdown"],
                           capture_output=True, text=True, check=True).stdout
    assert block.group(1) == table, "stale index: run python tools/docs_tables.py"


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


def test_gpudoctor_does_not_depend_on_torch(repo_root):
    """What pip resolves for `pip install .`: no torch and no CUDA wheels, only in extras."""
    import importlib.metadata

    base = [r for r in importlib.metadata.requires("gpudoctor") or [] if "extra ==" not in r]
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in base]
    assert "torch" not in names and not [n for n in names if n.startswith("nvidia-") and n != "nvidia-ml-py"]
    first, _ = setup_commands(repo_root / "README.md")
    # Where torch is: install gpudoctor alone, then scan.
    assert first == "python3 -m pip install . && gpudoctor scan"


def test_readme_is_written_for_users(repo_root):
    """The set-up speaks to a user on their own machine: nothing about the build machines (their
    local torch file, their index), nor CI's internals (docs/development.md holds those). No torch
    yet: one line that makes an environment with the CPU build of torch, numpy beside it (torch
    warns "Failed to initialize NumPy" without it), then the same install and scan. The test
    command says how long it takes and names the quick subset; its venv is ignored by git."""
    for page in ("README.md", "docs/index.md"):
        text = (repo_root / page).read_text()
        setup = text[text.index("## Set up"):]
        setup = setup[:setup.index("\n## ", 5)]
        for phrase in ("these machines", "local CPU wheel", "a normal index", "local file", ".ci/run", "CI "):
            assert phrase not in setup, (page, phrase)
        blocks = re.findall(r"^```sh\n(.*?)^```", setup, re.S | re.M)
        commands = [line for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]
        no_torch = commands[2]
        assert no_torch.startswith("python3 -m venv .venv && . .venv/bin/activate && python -m pip install torch numpy "
                                   "--index-url https://download.pytorch.org/whl/cpu && ")
        assert no_torch.endswith(" && python -m pip install . && gpudoctor scan")
        assert "pytorch.org/get-started/locally" in setup
        assert re.search(r"about \d+ minutes on two cores", setup) and '-m "not slow"' in setup
        assert "gpudoctor @ git+https://" in setup
    ignored = (repo_root / ".gitignore").read_text().splitlines()
    assert "/.venv-test/" in ignored and "/.venv/" in ignored


def test_the_test_environment_imports_torch_without_the_numpy_warning():
    """The recipe installs numpy with torch: `import torch` without it warns "Failed to initialize
    NumPy" in every run (a `gpudoctor run` ticket included)."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("torch") is None:
        pytest.skip("no torch in this environment (the torch-free run)")
    proc = subprocess.run([sys.executable, "-c", "import torch; torch.zeros(2).sum()"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Failed to initialize NumPy" not in proc.stderr


def test_set_up_never_replaces_an_installed_torch(repo_root, tmp_path):
    """README set-up (1), resolved by pip itself: `pip install .` into an environment whose torch is
    2.5.1 installs gpudoctor and nothing else."""
    import json

    import pytest

    try:
        import setuptools
    except ImportError:
        pytest.skip("needs setuptools here to build gpudoctor's metadata offline")
    declared = re.search(r'requires = \["setuptools>=(\d+)"', (repo_root / "pyproject.toml").read_text())
    assert declared, "pyproject.toml's build-system.requires changed form"
    if int(setuptools.__version__.split(".")[0]) < int(declared.group(1)):
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build backend gpudoctor declares")
    site = tmp_path / "site"
    dist = site / "torch-2.5.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1\n")
    (dist / "RECORD").write_text("")
    report = tmp_path / "report.json"
    env = dict(__import__("os").environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", str(report), str(repo_root)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert names == ["gpudoctor"]


def test_lint_on_its_own_checkout_prints_nothing(repo_root):
    """`gpudoctor lint .` on this checkout: the project's [tool.gpudoctor.lint] excludes its test
    fixtures (failure patterns on purpose) and names the probes and tests that write a pattern as
    their workload or data; anything else is a finding to fix. The fixtures still have findings
    without the configuration (--isolated): the exclusion hides them, it does not lose them."""
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "lint", "--format", "json", "."], cwd=repo_root,
                          capture_output=True, text=True, timeout=600)
    import json

    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["findings"] == [] and data["errors"] == [], proc.stdout[:2000]
    assert data["files_checked"] > 100
    fixtures = subprocess.run([sys.executable, "-m", "gpudoctor", "lint", "--isolated", "-q", "tests/fixtures/lint_corpus"],
                              cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert fixtures.returncode == 1 and fixtures.stdout.count(" GPU0") > 50


def test_every_package_is_in_the_wheel(repo_root):
    """pyproject.toml lists the packages the wheel holds by name: a package folder missing from
    the list installs nothing, and the command that imports it fails only once installed (the
    editable checkout finds every folder)."""
    from gpudoctor.knowledge.kb import tomllib  # tomli on Python 3.10

    listed = set(tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    doctor = repo_root / "doctor"
    folders = {"gpudoctor." + ".".join(p.parent.relative_to(doctor).parts) for p in doctor.rglob("*/__init__.py")}
    assert folders | {"gpudoctor", "gpudoctor.probes", "gpudoctor.reports"} == listed
