"""Shared fixtures: the repository root, a skip marker for tests that need a CUDA device, and a
clean skip for test modules that need torch where torch is not installed.

CI runs the suite twice: in the README's environment (torch CPU build, Python 3.11) and on the
lowest declared Python without torch (`.ci/run`), where only the torch-free parts (explain, list,
reading and rendering reports, the CLI's conventions) run and the rest skips with its reason.
"""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
_NO_TORCH = "needs torch, which is not installed in this environment"
# Fixtures are data, never tests: the lint corpora hold other projects' code shapes, the run and
# probe fixtures programs that crash on purpose. (One ignore here rather than a conftest.py in each
# folder: a second module named `conftest` shadows this one for `import conftest`.)
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return ROOT


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A test module that imports torch at the top cannot be collected without it: that is a skip
    # (the module needs torch), not an error. Any other import error still fails the run.
    outcome = yield
    report = outcome.get_result()
    if (not HAVE_TORCH and report.failed and isinstance(collector, pytest.Module)
            and "No module named 'torch'" in str(report.longrepr)):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {_NO_TORCH}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("torch") and not HAVE_TORCH:
            item.add_marker(pytest.mark.skip(reason=_NO_TORCH))
    # GPU tests skip with their reason where torch sees no CUDA device (CI, this machine).
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    try:
        import torch

        have_cuda = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU tests either
        have_cuda = False
    if not have_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device; torch.cuda.is_available() is False here")
        for item in gpu_items:
            item.add_marker(skip)
