"""The documentation site: Material for MkDocs with nothing loaded from another host, a validation
page written for users, and a browser check (tools/check_site.py) that can fail: a page with a
table cut off, a code line cut off and a font from a CDN is caught, the same page fixed passes.
.ci/run runs the check on every built page."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("check_site", ROOT / "tools" / "check_site.py")
check_site = importlib.util.module_from_spec(_spec)
sys.modules["check_site"] = check_site
_spec.loader.exec_module(check_site)


def test_the_theme_is_material_and_loads_nothing_from_another_host():
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^theme:\n(  .*\n)*?  name: material$", config, re.M)
    assert re.search(r"^  font: false$", config, re.M), "Google Fonts: the site must render offline"
    assert "repo_url" not in config, "Material asks GitHub's API for the repository's stars"
    assert not re.search(r"https?://", config.split("nav:")[0].replace("# ", "")), "no remote extra_css/js"
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert "url(" not in css and "@import" not in css


def test_the_validation_page_is_written_for_users():
    """No team shorthand in a page of the site: audit codes, unverified marks, issue numbers."""
    page = (ROOT / "docs" / "validation" / "README.md").read_text()
    for pattern in (r"\bD\d+\b", r"\[U\]", r"[Ii]ssue \d+", "§", r"\baudit\b", "GPU session", "device tool"):
        assert not re.search(pattern, page), pattern
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("\nnav:")[1]
    assert "gpu-sessions.md" not in nav and "/gpu-sessions.md" in config.split("not_in_nav:")[1]
    assert "(gpu-sessions.md)" in (ROOT / "docs" / "development.md").read_text()


_PAGE = """<!doctype html><html><head><meta charset="utf-8">{head}<style>
body {{ margin: 0; font: 16px sans-serif; }}
.md-content {{ width: 700px; margin: 0 auto; }}
.md-content__inner {{ width: 680px; }}
.md-typeset__scrollwrap {{ overflow-x: auto; }}
{css}
</style></head><body><div class="md-content"><div class="md-content__inner">
<div class="md-typeset__scrollwrap"><table><tr><td>code</td><td>{cell}</td></tr></table></div>
<pre><code>{line}</code></pre>
</div></div></body></html>"""
_LONG = "gpudoctor scan --format json -o report.json " * 6


def _site(tmp_path: pathlib.Path, *, broken: bool) -> pathlib.Path:
    site = tmp_path / ("broken" if broken else "fixed")
    site.mkdir()
    if broken:  # a cell that may not wrap, a code line that may not wrap, a font from a CDN
        html = _PAGE.format(head='<link rel="stylesheet" href="https://cdn.example.invalid/font.css">',
                            css="td { white-space: nowrap; } pre > code { display: block; overflow: auto; "
                                "white-space: pre; }", cell=_LONG, line=_LONG)
    else:
        html = _PAGE.format(head="", css="td { overflow-wrap: anywhere; } pre > code { display: block; "
                                         "white-space: pre-wrap; overflow-wrap: anywhere; }",
                            cell=_LONG, line=_LONG)
    (site / "index.html").write_text(html)
    return site


@pytest.mark.skipif(shutil.which("chromium") is None and not pathlib.Path("/usr/bin/chromium").exists(),
                    reason="needs Debian's chromium (.ci/run installs it)")
def test_the_browser_check_catches_what_is_cut_off_and_passes_what_is_not(tmp_path):
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    problems = check_site.check(_site(tmp_path, broken=True), chromium, None, line=_LONG)
    text = "\n".join(problems)
    assert "a table cell is cut off" in text or "a table is cut off" in text, text
    assert "a code line is cut off" in text, text
    assert "requests https://cdn.example.invalid/font.css from another host" in text, text
    assert check_site.check(_site(tmp_path, broken=False), chromium, None, line=_LONG) == []
