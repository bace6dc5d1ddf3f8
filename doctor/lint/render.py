"""Lint output: text (`path:line:col: CODE message [kb-id]`, the form editors and CI annotators
parse), JSON and Markdown. Paths and messages quote the linted files (source snippets, file
names), so the text and Markdown forms pass them through safetext; JSON escapes by itself.

JSON (schema_version 1.0):

    {"schema_version": "1.0",
     "findings": [{"path", "line", "col", "end_line", "end_col", "code", "kb_id", "message",
                   "fix": {"applicability": "safe" | "unsafe" | "display-only",
                           "description", "diff": unified diff of this finding's edits | null}}],
     "errors": [{"path", "message"}],
     "files_checked": N, "fixed": N}
"""
from __future__ import annotations

import json

from gpudoctor.lint.model import LintResult
from gpudoctor.safetext import visible

SCHEMA_VERSION = "1.0"
FORMATS = ("text", "json", "md")


def text(result: LintResult) -> str:
    lines = [f"{visible(f.path)}:{f.line}:{f.col}: {f.code} {visible(f.message)} [{f.kb_id}]" for f in result.findings]
    return "\n".join(lines) + ("\n" if lines else "")


def json_(result: LintResult, diffs: dict[int, str | None] | None = None) -> str:
    diffs = diffs or {}
    data = {
        "schema_version": SCHEMA_VERSION,
        "findings": [f.to_dict(diffs.get(i)) for i, f in enumerate(result.findings)],
        "errors": [e.to_dict() for e in result.errors],
        "files_checked": result.files_checked,
        "fixed": result.fixed,
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def markdown(result: LintResult) -> str:
    from gpudoctor.reports.markdown import cell, code_span, text

    out = ["## gpudoctor lint", ""]
    if not result.findings:
        out.append(f"No findings ({result.files_checked} files checked).")
    else:
        out += ["| where | code | finding | knowledge base | fix |", "| --- | --- | --- | --- | --- |"]
        for f in result.findings:
            out.append(f"| {code_span(f'{f.path}:{f.line}:{f.col}', table=True)} | `{f.code}` | {cell(f.message)} | `{f.kb_id}` | "
                       f"{f.fix.applicability} |")
    if result.errors:
        out += ["", "Files not linted:", ""]
        out += [f"- {code_span(e.path)}: {text(e.message)}" for e in result.errors]
    return "\n".join(out) + "\n"


def summary(result: LintResult, unsafe: bool) -> str:
    from gpudoctor.lint.fixes import applicable

    n = len(result.findings)
    files = len({f.path for f in result.findings})
    parts = []
    if result.fixed:
        parts.append(f"fixed {result.fixed} finding{'s' * (result.fixed != 1)}")
    if n:
        safe = sum(1 for f in result.findings if applicable(f, False))
        more = sum(1 for f in result.findings if applicable(f, True)) - safe
        line = f"found {n} finding{'s' * (n != 1)} in {files} file{'s' * (files != 1)}"
        hints = []
        if safe:
            hints.append(f"{safe} fixable with --fix")
        if more and not unsafe:
            hints.append(f"{more} more with --unsafe-fixes")
        parts.append(line + (f" ({', '.join(hints)})" if hints else ""))
    elif not result.fixed:
        parts.append("no findings")
    parts.append(f"{result.files_checked} file{'s' * (result.files_checked != 1)} checked")
    if result.errors:
        parts.append(f"{len(result.errors)} could not be linted")
    return "gpudoctor lint: " + "; ".join(parts)
