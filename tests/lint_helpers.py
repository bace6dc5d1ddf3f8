"""Helpers for the lint tests: lint a snippet written to a temporary file and look at findings
by code and line. Snippets are our own code, written for these tests."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gpudoctor.lint import engine


def lint_source(tmp_path: Path, source: str, name: str = "snippet.py", select: list[str] | None = None):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    result, _, _ = engine.lint([str(path)], select=select, isolated=True, jobs=1)
    return result


def lint_tree(root: Path, files: dict[str, str], select: list[str] | None = None, jobs: int = 1):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    result, _, _ = engine.lint([str(root)], select=select, isolated=True, jobs=jobs)
    return result


def lines(result, code: str) -> list[int]:
    return sorted(f.line for f in result.findings if f.code == code)


def codes(result) -> list[str]:
    return sorted(f.code for f in result.findings)


def marked_lines(source: str, marker: str = "# <-") -> list[int]:
    """Lines of a (dedented, left-stripped) snippet that carry the marker comment."""
    text = textwrap.dedent(source).lstrip("\n")
    return [i for i, line in enumerate(text.splitlines(), 1) if marker in line]


# A module with one GPU003 finding (merge_heads) and one GPU005 finding (M.cast), the base of the
# CLI, integration and robustness tests' projects (each adds its own lines).
TWO_FINDINGS = """\
import torch
import torch.nn as nn


def merge_heads(x, B, N, H, D):
    y = x.view(B, N, H, D).transpose(1, 2)
    return y.view(B, H * N, D)


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.zeros(4))

    def cast(self, dtype):
        self.token = self.token.to(dtype)
"""
