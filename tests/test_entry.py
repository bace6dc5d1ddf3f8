"""The console script's entry point (gpudoctor.entry): a scan's first worker starts before the
CLI imports typer and rich; every other command starts nothing and never imports the spawner."""
from __future__ import annotations

import subprocess
import sys

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# Runs the entry point in a fresh interpreter and prints what happened, as JSON, at exit.
PROBE = r"""
import atexit, json, subprocess, sys
seen = {"popen": [], "launch": []}
real_init = subprocess.Popen.__init__
def init(self, args, *a, **k):
    seen["popen"].append(list(args)[:2] if not isinstance(args, str) else [args])
    real_init(self, args, *a, **k)
subprocess.Popen.__init__ = init
if sys.argv[1] == "scan":
    import gpudoctor.scan.spawn as spawn
    real_launch = spawn.launch
    def launch(python, torch="no"):
        seen["launch"].append({"torch": torch, "typer": "typer" in sys.modules, "rich": "rich" in sys.modules,
                               "cli": "gpudoctor.cli" in sys.modules})
        return real_launch(python, torch)
    spawn.launch = launch
@atexit.register
def report():
    seen["spawn_imported"] = "gpudoctor.scan.spawn" in sys.modules
    sys.stderr.write("\nSEEN " + json.dumps(seen) + "\n")
sys.argv = ["gpudoctor", *sys.argv[1:]]
from gpudoctor.entry import main
main()
"""


def _run(*args: str) -> dict:
    import json

    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("SEEN ")]
    assert line, proc.stderr[-2000:]
    return {"rc": proc.returncode, **json.loads(line[-1][5:])}


def test_console_script_and_python_m_use_the_entry_module(repo_root):
    with open(repo_root / "pyproject.toml", "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert scripts == {"gpudoctor": "gpudoctor.entry:main"}
    assert "from gpudoctor.entry import main" in (repo_root / "doctor" / "__main__.py").read_text()


def test_explain_starts_nothing_and_never_imports_the_spawner():
    seen = _run("explain", "misaligned-address")
    assert seen["rc"] == 0
    assert seen["popen"] == [] and seen["spawn_imported"] is False


@pytest.mark.torch
def test_a_scan_starts_its_worker_before_the_cli_imports_typer_and_rich():
    pytest.importorskip("torch")
    seen = _run("scan", "--device", "cpu", "--probe", "contiguity", "--format", "json")
    assert seen["rc"] == 0
    first = seen["launch"][0]
    assert first == {"torch": "full", "typer": False, "rich": False, "cli": False}
    assert len(seen["launch"]) == 1  # the runner claimed the early worker: none started twice
