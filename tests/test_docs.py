"""The documentation says what the code does, and nothing was lost when the README became a front
door: every option of every command is documented on its page, the scan's option table names only
options that exist, the exit-code table is there with the codes the CLI uses, the probe table and
the schema versions are the code's, every page is in the site's navigation, and the README links to
every page and stays short. (`mkdocs build --strict` in .ci/run checks links and anchors.)"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

DOCS = ROOT / "docs"
# Where each command's options are documented; the options every command shares (--format, -o, -q,
# -v, --no-redact) may be documented once, in conventions.md.
PAGES = {
    "scan": ("scan.md", "fleets.md"),
    "explain": ("explain.md",),
    "list": ("explain.md",),
    "run": ("tickets.md",),
    "report": ("tickets.md",),
    "diff": ("tickets.md",),
    "lint": ("lint.md",),
    "merge": ("fleets.md",),
}
SHARED = ("--format", "--output", "--quiet", "--verbose", "--no-redact")


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _commands() -> dict:
    import typer.main

    from gpudoctor.cli import app

    return typer.main.get_command(app).commands


def _options(command) -> list[tuple[str, ...]]:
    """The visible options of a click command, each as its spellings (long first)."""
    return [tuple(p.opts) + tuple(p.secondary_opts) for p in command.params
            if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def test_every_command_has_a_page():
    assert set(_commands()) == set(PAGES), "a new command needs a page (and a row in PAGES here)"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_option_is_documented_on_its_page(name):
    command = _commands()[name]
    text = "\n".join(_page(p) for p in PAGES[name])
    conventions = _page("conventions.md")
    missing = []
    for spellings in _options(command):
        long = next((s for s in spellings if s.startswith("--")), spellings[0])
        documented = any(_mentions(text, s) for s in spellings)
        if not documented and long in SHARED:
            documented = any(_mentions(conventions, s) for s in spellings)
        if not documented:
            missing.append(long)
    assert not missing, f"gpudoctor {name}: options not documented in {', '.join(PAGES[name])}: {missing}"


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_scan_option_table_names_only_real_options():
    rows = _table(_page("scan.md"), "| option | meaning |")
    assert len(rows) >= 10
    options = _options(_commands()["scan"])
    known = {s for spellings in options for s in spellings}
    documented = {m for row in rows for m in re.findall(r"`(-[-\w]+)", row[0])}
    assert documented - known == set(), "the table in docs/scan.md names options scan does not have"
    # Every scan option is in the table, except the fleet ones (docs/fleets.md).
    absent = {spellings[0] for spellings in options if not set(spellings) & documented}
    assert absent == {"--distributed", "--ray"}, absent


def test_the_exit_code_table_is_documented():
    from gpudoctor import output

    rows = _table(_page("conventions.md"), "| code | meaning |")
    codes = {row[0]: row[1] for row in rows}
    assert codes[str(output.EXIT_OK)] == "ok"
    assert codes[str(output.EXIT_FINDINGS)] == "findings"
    assert codes[str(output.EXIT_USAGE)].startswith("usage or input error")
    assert "closed pipe" in codes[str(output.EXIT_CLOSED_PIPE)]
    assert "SIGINT" in codes["130, 143, 129"]
    # The README's front door points at it.
    assert "[Conventions and exit codes](docs/conventions.md)" in (ROOT / "README.md").read_text()


def test_the_probe_table_is_the_registry():
    """docs/scan.md's probe table is generated from the probes' specs (tools/docs_tables.py)."""
    import importlib.util

    from gpudoctor import probes

    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "tools" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    block = re.search(r"<!-- probes:start -->\n(.*)<!-- probes:end -->", _page("scan.md"), re.S)
    assert block, "docs/scan.md lost its probes markers"
    assert block.group(1) == tables.probes_table(), "stale table: run python tools/docs_tables.py"
    rows = _table(_page("scan.md"), "| probe | what it runs |")
    assert [r[0] for r in rows] == [f"`{m.SPEC.id}`" for m in probes.load_builtin()]


def test_the_schema_versions_are_the_code_s():
    from gpudoctor.explain import explanation as explain
    from gpudoctor.ticket import bundle as ticket
    from gpudoctor.fleet import model as fleet
    from gpudoctor.lint import render as lint
    from gpudoctor.reports import diff, model

    rows = {row[0]: row[2] for row in _table(_page("reports.md"), "| output | made by |")}
    assert rows == {
        "scan report": model.SCHEMA_VERSION, "fleet report": fleet.FLEET_SCHEMA_VERSION,
        "explanation": explain.EXPLAIN_SCHEMA_VERSION, "run record (`run.json`)": ticket.RUN_SCHEMA_VERSION,
        "report comparison": diff.DIFF_SCHEMA_VERSION, "lint findings": lint.SCHEMA_VERSION,
    }


def test_every_page_is_in_the_navigation_and_every_entry_exists():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("\nnav:\n", 1)[1]
    listed = set(re.findall(r"([\w./-]+\.md)\s*$", nav, re.M))
    # Pages built but kept out of the navigation on purpose (the team's notes), each named in
    # mkdocs.yml's not_in_nav.
    hidden = set(_not_in_nav(config))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert listed | hidden == pages, \
        f"not in mkdocs.yml: {sorted(pages - listed - hidden)}; missing files: {sorted((listed | hidden) - pages)}"
    assert not listed & hidden


def _not_in_nav(config: str) -> list[str]:
    block = re.search(r"^not_in_nav: \|\n((?:  .*\n)+)", config, re.M)
    return [line.strip().lstrip("/") for line in block.group(1).splitlines()] if block else []


def test_the_readme_is_a_front_door_that_links_every_page():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 160, "README.md is the front door: reference material goes to a page in docs/"
    targets = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    for target in targets:
        assert (ROOT / target).exists(), target
    hidden = {f"docs/{name}" for name in _not_in_nav((ROOT / "mkdocs.yml").read_text())}
    top = ({f"docs/{p.name}" for p in DOCS.glob("*.md")} - hidden) | {"docs/validation/README.md"}
    assert top <= targets, f"README does not link {sorted(top - targets)}"
    # Set-up first, then what a scan looks like, then the five uses: all before the reference links.
    order = [readme.index(h) for h in ("## Set up", "## What a scan looks like", "## Five things", "## Documentation")]
    assert order == sorted(order)
    shown = readme.split("## What a scan looks like", 1)[1].split("## Five things", 1)[0]
    assert "](docs/pictures/scan-h100.svg)" in shown and "](docs/pictures/scan-cpu.svg)" in shown
    five = readme.split("## Five things", 1)[1].split("## Documentation", 1)[0]
    assert "](docs/pictures/explain.svg)" in five
    for command in ("gpudoctor scan", "gpudoctor explain", "gpudoctor run --localize --bundle", "gpudoctor lint",
                    "gpudoctor merge"):
        assert command in five, command


def test_troubleshooting_leads_from_symptoms_to_commands():
    text = _page("troubleshooting.md")
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 10
    for section in sections:
        title = section.splitlines()[0]
        assert "gpudoctor " in section, f"{title!r} names no command"
    titles = " ".join(s.splitlines()[0] for s in sections)
    for symptom in ("xformers-build-mismatch", "slow on one node", "misaligned address"):
        assert symptom in titles, symptom
    # Every id it names is a knowledge-base entry.
    from gpudoctor.knowledge import kb

    ids = {e.id for e in kb.load_all()}
    for kb_id in re.findall(r"gpudoctor explain ([a-z0-9]+(?:-[a-z0-9]+)+)\b", text):
        assert kb_id in ids, kb_id
