"""The documentation's pictures (docs/pictures/*.svg) are what the current code prints: each is
rendered again by tools/make_pictures.py, through the real CLI, and compared with the committed
file. A change to a renderer, a probe summary or a knowledge-base entry that a picture shows fails
here until `python tools/make_pictures.py` is run; the pages that show the pictures are checked to
embed them."""
from __future__ import annotations

import html
import importlib.util
import pathlib
import re
import sys
from importlib.metadata import version

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("make_pictures", ROOT / "tools" / "make_pictures.py")
make_pictures = importlib.util.module_from_spec(_spec)
sys.modules["make_pictures"] = make_pictures
_spec.loader.exec_module(make_pictures)

PICTURES = make_pictures.PICTURES_MADE
STALE = "stale picture: run python tools/make_pictures.py"


def screen_text(svg: str) -> list[str]:
    """The lines of terminal text an SVG shows (rich's export: one <text> per styled run, placed
    by x on the line given by y)."""
    runs = re.findall(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg, re.S)
    lines: dict[float, list[tuple[float, str]]] = {}
    for x, y, text in runs:
        lines.setdefault(float(y), []).append((float(x), html.unescape(text).replace("\xa0", " ")))
    return ["".join(t for _, t in sorted(parts)).rstrip() for _, parts in sorted(lines.items())]


@pytest.mark.parametrize("picture", PICTURES, ids=[p.name for p in PICTURES])
def test_picture_is_what_the_code_prints_now(picture):
    path = ROOT / "docs" / "pictures" / picture.name
    assert path.exists(), f"docs/pictures/{picture.name} is missing: run python tools/make_pictures.py"
    committed = path.read_text(encoding="utf-8")
    fresh = make_pictures.render(picture)
    if make_pictures.rich_version_of(committed) == version("rich"):
        assert fresh == committed, STALE
    else:  # made with another rich, whose SVG template may differ: the screen must still be the same
        assert screen_text(fresh) == screen_text(committed), STALE


def test_rendering_is_deterministic():
    """No clock, no machine: two renderings are the same file, whatever this machine is called."""
    picture = PICTURES[0]
    assert make_pictures.render(picture) == make_pictures.render(picture)


def test_the_pictures_show_what_they_say():
    shown = {p.name: screen_text((ROOT / "docs" / "pictures" / p.name).read_text()) for p in PICTURES}
    h100, cpu, explain = shown["scan-h100.svg"], shown["scan-cpu.svg"], shown["explain.svg"]
    assert h100[0] == h100[-1] == "gpudoctor: healthy" and any("NVIDIA H100 80GB HBM3" in line for line in h100)
    assert cpu[0] == "gpudoctor: healthy, 1 warning: cuda-unavailable"
    assert explain[0] == "misaligned-address"
    # the patch for the user's own file, under the verdict, with the command that applies it
    patch, run = shown["explain-patch.svg"], shown["run-patch.svg"]
    assert patch[0] == "misaligned-address" and "Patch for wan/modules/attention.py  (GPU004" in patch[9]
    assert "+        N_t, N_h, N_w = (int(v) for v in shape)" in patch
    assert any(line.startswith("  Apply it: gpudoctor lint --fix --unsafe-fixes --select GPU004 ") for line in patch)
    assert run[0].startswith("gpudoctor: `python train.py` exited with code 1")
    assert any(line.startswith("Patch for diffsynth/models/wan_video_dit.py  (GPU011") for line in run)
    assert any(line.startswith("  Apply it: gpudoctor lint --fix --unsafe-fixes --select GPU011 ") for line in run)
    # Nothing of the machine that made them, and nothing cut: summaries wrap at the width.
    for lines in shown.values():
        assert all(len(line) <= make_pictures.WIDTH for line in lines)
        assert not any("…" in line for line in lines)
        assert not any(re.search(r"/(root|work|tmp)/", line) for line in lines)


def test_every_picture_is_shown_in_the_documentation():
    pages = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
    for picture in PICTURES:
        assert any(f"![{picture.alt}](pictures/{picture.name})" in text for text in pages.values()), picture.name


def test_the_pictures_load_nothing_from_a_network():
    """rich's SVG export fetches Fira Code from a CDN; the committed pictures use local fonts and
    render offline."""
    for picture in PICTURES:
        svg = (ROOT / "docs" / "pictures" / picture.name).read_text()
        style = svg[svg.index("<style>"):svg.index("</style>")]
        assert "url(" not in style and "@font-face" not in style and "cdnjs" not in svg, picture.name
        assert "monospace" in style


def _example() -> dict:
    import json

    return json.loads((ROOT / make_pictures.CPU_EXAMPLE).read_text())


def test_the_cpu_picture_is_a_current_quick_scan():
    """The CPU picture's report is what a scan writes today: the current schema, the quick level,
    a verdict, and one result per probe of the registry, in its order."""
    from gpudoctor import probes
    from gpudoctor.reports.model import SCHEMA_VERSION

    report = _example()
    assert report["schema_version"] == SCHEMA_VERSION, "stale example: python tools/make_pictures.py --scan"
    assert report["level"] == "quick" and report["verdict"]["healthy"] is True
    assert [r["probe"] for r in report["results"]] == [m.SPEC.id for m in probes.load_builtin()]
    assert report["invocation"]["command"].startswith("gpudoctor scan --python ~/proj/.venv/bin/python")


@pytest.mark.slow
def test_a_fresh_scan_gives_the_cpu_pictures_verdicts(tmp_path):
    """Where the example was made (torch 2.13.0 on the CPU), scanning again gives every probe the
    verdict and the findings the picture shows: a probe whose behaviour changed fails here until
    `python tools/make_pictures.py --scan` is run."""
    torch = pytest.importorskip("torch")
    report = _example()
    made_with = report["environment"]["torch"]["version"]
    if torch.__version__ != made_with or torch.cuda.is_available():
        pytest.skip(f"the example is torch {made_with} on the CPU; this is torch {torch.__version__}")
    out = tmp_path / "fresh.json"
    make_pictures.cpu_scan(str(out))
    import json

    def verdicts(data: dict) -> list:
        return [(r["probe"], r["status"], sorted(f["kb_id"] for f in r["findings"])) for r in data["results"]]

    assert verdicts(json.loads(out.read_text())) == verdicts(report), "stale: python tools/make_pictures.py --scan"
