"""Held-out accuracy of `gpudoctor explain`: real error texts from public trackers that are not
among any knowledge-base entry's examples, stored under `tests/fixtures/heldout/<expected-id>/`
(first line `# source: <url>`). Every text must rank its folder's entry first; texts under
`none/` are outside the knowledge base and must get no confident match."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor import kb
from gpudoctor.matcher import match_text

HELDOUT = Path(__file__).parent / "fixtures" / "heldout"
CASES = sorted(HELDOUT.glob("*/*.txt"))
CONFIDENT = 0.5


def _read(path: Path) -> tuple[str, str]:
    head, _, body = path.read_text(encoding="utf-8").partition("\n")
    return head, body


def test_heldout_set_is_well_formed():
    ids = {e.id for e in kb.load_all()}
    folders = {p.parent.name for p in CASES}
    assert len(CASES) >= 80
    assert "none" in folders
    assert folders - {"none"} <= ids, f"folders that are not knowledge-base ids: {folders - ids - {'none'}}"
    for path in CASES:
        head, body = _read(path)
        assert head.startswith("# source: http"), path
        assert body.strip(), path


def test_heldout_texts_are_not_knowledge_base_examples():
    # A held-out text copied from an entry's own examples would measure memory, not recognition.
    sources = {ex.source for e in kb.load_all() for ex in e.examples}
    reused = [p.name for p in CASES if _read(p)[0].removeprefix("# source: ").strip() in sources]
    assert not reused


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_heldout_text_is_classified_as_its_folder(path: Path):
    expected = path.parent.name
    matches = match_text(_read(path)[1])
    ranked = [(m.id, round(m.confidence, 2)) for m in matches[:3]]
    if expected == "none":
        assert not matches or matches[0].confidence < CONFIDENT, ranked
    else:
        assert matches and matches[0].id == expected, ranked
