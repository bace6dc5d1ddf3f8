"""Release-ready: one PEP 440 version, read by the build from `gpudoctor.__version__`; the wheel
that the build makes installs into a fresh virtual environment and runs there (`scan`, `explain`,
`lint`) from its own files, not from this checkout.

`.ci/run` does the rest with the network a release needs: `python -m build` (the sdist, and the
wheel built from it), `twine check --strict`, the wheel installed with its dependencies resolved
from the index, the README's first command in a fresh environment, and an install from a git URL.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

# PEP 440's public version, canonical form (no local label: a release is what an index accepts).
PEP440 = re.compile(r"^(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
# What a copy of the checkout leaves out: environments, builds, caches.
IGNORED = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "site", "*.egg-info", "__pycache__",
                                 ".pytest_cache", ".whl", ".gl", "validation-out")


def test_the_version_is_pep_440_with_one_source(repo_root):
    import gpudoctor

    assert PEP440.match(gpudoctor.__version__), gpudoctor.__version__
    project = (repo_root / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', project, re.M)
    assert not re.search(r'^version = "', project, re.M), "the version is written in doctor/__init__.py only"
    assert 'version = { attr = "gpudoctor.__version__" }' in project
    init = (repo_root / "doctor" / "__init__.py").read_text()
    assert len(re.findall(r'^__version__ = "[^"]+"$', init, re.M)) == 1


def test_pre_commit_docs_name_a_real_tag_of_this_version(repo_root):
    """The pre-commit snippet's `rev:` is the tag of this version (created with the release), never a
    placeholder; the README's git install line names the same tag."""
    import gpudoctor

    tag = f"v{gpudoctor.__version__}"
    lint = (repo_root / "docs" / "lint.md").read_text()
    assert f"rev: {tag}" in lint and "<tag" not in lint and "<gpudoctor's repository URL>" not in lint
    hooks = (repo_root / ".pre-commit-hooks.yaml").read_text()
    assert f"rev: {tag}" in hooks and "<this repository's URL>" not in hooks
    assert f"git+https://github.com/gpudoctor/gpudoctor@{tag}" in (repo_root / "README.md").read_text()


def _copy(repo_root, tmp_path):
    """The checkout's own files, copied: a build writes build/ and *.egg-info beside the sources."""
    dest = tmp_path / "src"
    shutil.copytree(repo_root, dest, ignore=IGNORED)
    return dest


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs_from_its_own_files(repo_root, tmp_path):
    pytest.importorskip("setuptools", minversion="77", reason="builds the wheel offline with setuptools >= 77")
    import gpudoctor

    src = _copy(repo_root, tmp_path)
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = list(dist.glob("*.whl"))
    assert wheel.name == f"gpudoctor-{gpudoctor.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    # One import namespace; the data files the code reads at run time are in it.
    assert {n.split("/")[0] for n in names} == {"gpudoctor", f"gpudoctor-{gpudoctor.__version__}.dist-info"}
    for needed in ("gpudoctor/knowledge/misaligned-address.toml", "gpudoctor/reports/schema.json",
                   "gpudoctor/reports/fleet_schema.json", "gpudoctor/probes/contiguity.py",
                   "gpudoctor/scan/worker.py"):
        assert needed in names, needed
    assert not [n for n in names if "/tests/" in n or n.startswith(("doctor/", "probes/", "reports/"))]
    metadata = zipfile.ZipFile(wheel).read(f"gpudoctor-{gpudoctor.__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {gpudoctor.__version__}\n" in metadata
    assert not [line for line in metadata.splitlines()
                if line.startswith("Requires-Dist: torch") and "extra ==" not in line]

    # A fresh environment with the wheel alone; its dependencies (typer, rich, nvidia-ml-py, and
    # torch for the scan where this environment has it) are seen through a path file, because the
    # index is not for tests (.ci/run installs it from the index too).
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (env_dir / site.split(str(env_dir) + "/", 1)[1] / "_test_deps.pth").write_text("\n".join(ours) + "\n")
    work = tmp_path / "elsewhere"  # nowhere near the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def gpudoctor_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(env_dir / "bin" / "gpudoctor"), *args], capture_output=True, text=True,
                              timeout=600, cwd=work, env=env)

    where = subprocess.run([str(python), "-c", "import gpudoctor; print(gpudoctor.__file__)"], capture_output=True,
                           text=True, cwd=work, env=env)
    assert where.stdout.strip().startswith(str(env_dir)), where.stdout + where.stderr

    version = gpudoctor_("-V")
    assert version.returncode == 0 and version.stdout == f"gpudoctor {gpudoctor.__version__}\n"
    explained = gpudoctor_("explain", "misaligned-address")
    assert explained.returncode == 0 and "misaligned-address" in explained.stdout
    (work / "model.py").write_text("import torch\n\n\ndef f(x):\n    y = x.transpose(1, 2)\n"
                                   "    return y.view(x.size(0), -1)\n")
    linted = gpudoctor_("lint", "model.py")
    assert linted.returncode == 1 and "model.py:6:" in linted.stdout and "GPU003" in linted.stdout
    scanned = gpudoctor_("scan", "--probe", "contiguity", "--format", "json", "-o", "-")
    report = json.loads(scanned.stdout)
    assert report["tool"]["version"] == gpudoctor.__version__
    if report["environment"]["torch"].get("available") is False:  # the torch-free run: the verdict says so
        assert scanned.returncode == 1 and report["verdict"]["fix_first"] == "torch-import-failed"
    else:
        assert scanned.returncode == 0, scanned.stderr[-3000:]
        assert [(r["probe"], r["status"]) for r in report["results"]] == [("contiguity", "pass")]
        assert report["verdict"]["healthy"] is True
