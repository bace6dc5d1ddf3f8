"""Shared fixtures: the repository root, and a skip marker for tests that need a CUDA device."""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return ROOT


def pytest_collection_modifyitems(config, items):
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
