"""Rewrite the documentation's generated tables from the code: the knowledge-base index, the
platform notices and the entries that patch the user's code in docs/explain.md (`gpudoctor list
--markdown`, `platforms_table()`, `gpudoctor.patch.search.markdown_table()`), the probe table in
docs/scan.md (`probes_table()`, from the probes' specs) and the lint rule table in docs/lint.md
(`gpudoctor.lint.rules.markdown_table()`), each between its markers.

    python tools/docs_tables.py     # tests/test_project.py, tests/test_explain_notices.py and
                                    # tests/test_lint_rules.py fail when a table is stale
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def index_table() -> str:
    out = subprocess.run([sys.executable, "-m", "gpudoctor", "list", "--markdown"],
                         capture_output=True, text=True, check=True)
    return out.stdout


def platforms_table() -> str:
    """The platforms `explain` recognises (gpudoctor.knowledge.notices): what replaces the CUDA
    advice there, and the entries that still apply on each."""
    from gpudoctor.knowledge import kb, notices

    entries = kb.load_all()
    rows = ["| id | platform | entries that apply there too | first step |", "| --- | --- | --- | --- |"]
    for notice in sorted(notices.platforms(), key=lambda n: n.id):
        applies = [e.id for e in entries if e.platforms and notice.id in e.platforms]
        everywhere = sum(1 for e in entries if not e.platforms)
        listed = ", ".join(f"`{i}`" for i in applies)
        cell = f"{listed} and the {everywhere} PyTorch-level entries" if applies else f"the {everywhere} PyTorch-level entries"
        step = notice.steps[0].replace("|", "\\|")
        rows.append(f"| `{notice.id}` | {notice.name} | {cell} | {step} |")
    return "\n".join(rows) + "\n"


def probes_table() -> str:
    """The built-in probes in scan order (gpudoctor.probes.BUILTIN): what each runs, whether its
    workload runs on the CPU too, and the knowledge-base ids it may report."""
    from gpudoctor import probes

    rows = ["| probe | what it runs | on the CPU | knowledge-base ids it can report |", "| --- | --- | --- | --- |"]
    for module in probes.load_builtin():
        spec = module.SPEC
        cpu = "yes" if spec.runs_on_cpu else "no: CUDA only"
        extra = sorted(set(spec.needs) - {"torch"})
        if extra:
            cpu += "; needs " + ", ".join(f"`{need}`" for need in extra)
        emits = ", ".join(f"`{kb_id}`" for kb_id in spec.emits) or "none: its verdict rests on what it measures"
        title = spec.title.replace("|", "\\|")
        rows.append(f"| `{spec.id}` | {title} | {cpu} | {emits} |")
    return "\n".join(rows) + "\n"


def rules_table() -> str:
    from gpudoctor.lint.rules import markdown_table

    return markdown_table()


def code_patch_table() -> str:
    from gpudoctor.patch.search import markdown_table

    return markdown_table()


# page, marker name, the table's text
TABLES = (("explain.md", "kb-index", index_table), ("explain.md", "platforms", platforms_table),
          ("explain.md", "code-patch", code_patch_table), ("scan.md", "probes", probes_table),
          ("lint.md", "lint-rules", rules_table))


def rewrite(text: str, marker: str, table: str) -> str:
    pattern = re.compile(rf"<!-- {marker}:start -->\n.*<!-- {marker}:end -->", re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs_tables: the {marker} markers are missing")
    return pattern.sub(lambda _: f"<!-- {marker}:start -->\n{table}<!-- {marker}:end -->", text)


def main() -> None:
    for page, marker, make in TABLES:
        path = DOCS / page
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, marker, make())
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"docs_tables: rewrote the {marker} table in docs/{page}")


if __name__ == "__main__":
    main()
