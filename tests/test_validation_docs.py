"""The committed renderings under docs/validation/ (`<name>.md` beside `<name>.json`) are what
`gpudoctor report <name>.json --format md` prints with the current code: a rendering older than
the code that renders it (a patch the knowledge base no longer gives, a layout that changed) fails
here. Regenerate with

    for f in docs/validation/*.json; do [ -f "${f%.json}.md" ] && gpudoctor report "$f" --format md -o "${f%.json}.md"; done
"""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app

VALIDATION = Path(__file__).resolve().parents[1] / "docs" / "validation"
RENDERED = sorted(p for p in VALIDATION.glob("*.md") if p.with_suffix(".json").exists())


def test_there_are_committed_renderings_to_check():
    assert len(RENDERED) >= 2


@pytest.mark.parametrize("page", RENDERED, ids=lambda p: p.name)
def test_a_committed_rendering_is_what_the_code_prints_now(page: Path):
    r = CliRunner().invoke(app, ["report", str(page.with_suffix(".json")), "--format", "md"],
                           env={"NO_COLOR": "1", "COLUMNS": "100"})
    assert r.exit_code in (0, 1), r.output  # 1: the report has findings
    assert r.stdout == page.read_text(encoding="utf-8"), (
        f"{page.relative_to(VALIDATION.parents[1])} is stale: gpudoctor report {page.with_suffix('.json').name} "
        f"--format md -o {page.name}")
