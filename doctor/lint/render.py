"""Lint output, one renderer per format behind one interface (`render(fmt, result, context)`;
`RENDERERS` names them all, and a test holds it to gpudoctor.lint.FORMATS):

- `text`: `path:line:col: CODE message [kb-id]`, the form editors and CI annotators parse;
- `json`: the findings with their fixes (below);
- `md`: a Markdown table for a ticket or a pull request;
- `sarif`: SARIF 2.1.0 for GitHub code scanning (and any SARIF viewer);
- `github`: GitHub Actions workflow commands (`::error file=...,line=...::message`), which the
  runner turns into annotations on the pull request.

Paths and messages quote the linted files (source snippets, file names), so the text, Markdown
and GitHub forms pass them through safetext; JSON and SARIF escape by themselves.

JSON (schema_version 1.1; 1.1 added `internal_errors`):

    {"schema_version": "1.1",
     "findings": [{"path", "line", "col", "end_line", "end_col", "code", "kb_id", "message",
                   "fix": {"applicability": "safe" | "unsafe" | "display-only",
                           "description", "diff": unified diff of this finding's edits | null}}],
     "errors": [{"path", "message"}],
     "internal_errors": [{"path": a file | null (a cross-file step), "rule": a code | null (every
                          rule of the file), "message"}],
     "files_checked": N, "fixed": N}

SARIF: one run whose tool.driver lists every rule (id, name, short and full description, help in
text and Markdown, default level, tags and precision) in code order, so a result's ruleIndex is
stable. Locations are relative to `%SRCROOT%` (the context's root, the current folder) where the
file lies under it, absolute file URIs otherwise; columns count Unicode code points, as the
findings do. `partialFingerprints.primaryLocationLineHash` (the one key GitHub reads) hashes the
rule, the path and the reported line's text without whitespace, plus the occurrence of that key in
the file: an alert keeps its identity when lines above it move. Safe and unsafe fixes travel as
SARIF fixes (character offsets); files that could not be linted are tool notifications and make
the invocation unsuccessful; so do internal errors (a rule that failed on a file), which carry
the rule as the notification's `associatedRule`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Callable

from gpudoctor.lint import rules
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, LintResult
from gpudoctor.safetext import visible

SCHEMA_VERSION = "1.1"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"


@dataclass(frozen=True)
class Context:
    """What a renderer may need beyond the result: each finding's diff (JSON, by index), the
    folder paths are shown relative to (SARIF, GitHub), and a reader of a linted file's lines
    (SARIF fingerprints; None where the file cannot be read)."""

    diffs: dict[int, str | None] = field(default_factory=dict)
    root: str = "."
    lines: Callable[[str], list[str] | None] = lambda path: None


def render(fmt: str, result: LintResult, context: Context | None = None) -> str:
    """The whole output of one format. Raises KeyError for a format that does not exist."""
    return RENDERERS[fmt](result, context or Context())


# --- text, JSON, Markdown ---------------------------------------------------------------------


def text(result: LintResult, context: Context | None = None) -> str:
    lines = [f"{visible(f.path)}:{f.line}:{f.col}: {f.code} {visible(f.message)} [{f.kb_id}]" for f in result.findings]
    return "\n".join(lines) + ("\n" if lines else "")


def json_(result: LintResult, context: Context | None = None) -> str:
    diffs = context.diffs if context else {}
    data = {
        "schema_version": SCHEMA_VERSION,
        "findings": [f.to_dict(diffs.get(i)) for i, f in enumerate(result.findings)],
        "errors": [e.to_dict() for e in result.errors],
        "internal_errors": [e.to_dict() for e in result.internal_errors],
        "files_checked": result.files_checked,
        "fixed": result.fixed,
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def markdown(result: LintResult, context: Context | None = None) -> str:
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
    if result.internal_errors:
        out += ["", "Internal errors (gpudoctor bugs; these rules' findings are missing there):", ""]
        out += [f"- {code_span(e.path) if e.path is not None else 'the project'}: {code_span(e.code or 'every rule')}: "
                f"{text(e.message)}" for e in result.internal_errors]
    return "\n".join(out) + "\n"


# --- paths relative to the root -----------------------------------------------------------------


def _relative(path: str, root: str) -> str | None:
    """`path` relative to `root` with forward slashes, or None when it lies outside."""
    absolute, base = os.path.abspath(path), os.path.abspath(root)
    try:
        if os.path.commonpath([absolute, base]) != base:
            return None
    except ValueError:  # another drive
        return None
    rel = os.path.relpath(absolute, base)
    return rel.replace(os.sep, "/")


def _file_uri(path: str, folder: bool = False) -> str:
    from pathlib import Path

    uri = Path(os.path.abspath(path)).as_uri()
    return uri + "/" if folder and not uri.endswith("/") else uri


def _artifact(path: str, root: str) -> dict[str, str]:
    from urllib.parse import quote

    rel = _relative(path, root)
    if rel is None:
        return {"uri": _file_uri(path)}
    return {"uri": quote(rel), "uriBaseId": SRCROOT}


# --- SARIF 2.1.0 ----------------------------------------------------------------------------------

_PROBLEM_SEVERITY = {"error": "error", "warning": "warning", "note": "recommendation"}


def _sarif_rule(r: rules.Rule) -> dict:
    help_text = (f"{r.what}\n\nWhy: {r.why}\n\nExample:\n{r.example}\n\nFix: {r.fix}\n\nFix safety: {r.fix_safety}\n\n"
                 f"Left alone: {r.near_misses}\n\nKnowledge base: {r.kb_id} (gpudoctor explain {r.code})")
    example = "\n".join("    " + line for line in r.example.splitlines())
    help_md = (f"{r.what}\n\n**Why.** {r.why}\n\n**Example**\n\n{example}\n\n**Fix.** {r.fix}\n\n"
               f"**Fix safety.** {r.fix_safety}\n\n**Left alone.** {r.near_misses}\n\n"
               f"Knowledge base: `{r.kb_id}` (`gpudoctor explain {r.code}`)")
    return {
        "id": r.code,
        "name": r.name,
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": r.what},
        "help": {"text": help_text, "markdown": help_md},
        "defaultConfiguration": {"level": r.level},
        "properties": {"tags": ["gpu", "pytorch", r.kb_id], "precision": "high",
                       "problem.severity": _PROBLEM_SEVERITY[r.level], "kb_id": r.kb_id},
    }


def _region(f: Finding) -> dict[str, int]:
    end_line = max(f.end_line or f.line, f.line)
    end_col = f.end_col or f.col
    if end_line == f.line and end_col <= f.col:
        end_col = f.col + 1  # GitHub wants a region that holds at least the first character
    return {"startLine": f.line, "startColumn": f.col, "endLine": end_line, "endColumn": end_col}


def _fingerprint(f: Finding, uri: str, context: Context, seen: dict[str, int]) -> str:
    lines = context.lines(f.path)
    line = lines[f.line - 1] if lines is not None and 0 < f.line <= len(lines) else f"line {f.line}"
    key = hashlib.sha256("\0".join((f.code, uri, "".join(line.split()))).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    seen[key] = seen.get(key, 0) + 1
    return f"{key}:{seen[key]}"


def sarif(result: LintResult, context: Context | None = None) -> str:
    from gpudoctor import __version__

    context = context or Context()
    index = {r.code: i for i, r in enumerate(rules.RULES)}
    results = []
    seen: dict[str, int] = {}
    for f in result.findings:
        artifact = _artifact(f.path, context.root)
        entry: dict = {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": rules.BY_CODE[f.code].level,
            "kind": "fail",
            "message": {"text": f.message},
            "locations": [{"physicalLocation": {"artifactLocation": artifact, "region": _region(f)}}],
            "partialFingerprints": {"primaryLocationLineHash": _fingerprint(f, artifact["uri"], context, seen)},
            "properties": {"kb_id": f.kb_id, "fix_applicability": f.fix.applicability,
                           "fix_description": f.fix.description},
        }
        if f.fix.applicability != DISPLAY_ONLY and f.fix.edits:
            entry["fixes"] = [{
                "description": {"text": f"{f.fix.description} ({f.fix.applicability})"},
                "artifactChanges": [{"artifactLocation": artifact, "replacements": [
                    {"deletedRegion": {"charOffset": e.start, "charLength": e.end - e.start},
                     "insertedContent": {"text": e.text}} for e in f.fix.edits]}],
            }]
        results.append(entry)
    notifications = [{"level": "error", "message": {"text": e.message},
                      "locations": [{"physicalLocation": {"artifactLocation": _artifact(e.path, context.root)}}]}
                     for e in result.errors]
    for ie in result.internal_errors:
        note: dict = {"level": "error", "message": {"text": ie.describe()},
                      "properties": {"internal_error": True}}
        if ie.path is not None:
            note["locations"] = [{"physicalLocation": {"artifactLocation": _artifact(ie.path, context.root)}}]
        if ie.code is not None:
            note["associatedRule"] = {"id": ie.code, "index": index[ie.code]}
        notifications.append(note)
    run = {
        "tool": {"driver": {
            "name": "gpudoctor",
            "fullName": "gpudoctor lint",
            "version": __version__,
            "semanticVersion": __version__,
            "rules": [_sarif_rule(r) for r in rules.RULES],
        }},
        "automationDetails": {"id": "gpudoctor-lint/"},
        "originalUriBaseIds": {SRCROOT: {"uri": _file_uri(context.root, folder=True),
                                         "description": {"text": "The folder gpudoctor lint ran in."}}},
        "invocations": [{"executionSuccessful": not result.errors and not result.internal_errors,
                         "workingDirectory": {"uri": _file_uri(context.root, folder=True)},
                         "toolExecutionNotifications": notifications}],
        "columnKind": "unicodeCodePoints",
        "results": results,
        "properties": {"files_checked": result.files_checked, "fixed": result.fixed},
    }
    data = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- GitHub Actions workflow commands -------------------------------------------------------------

_COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(result: LintResult, context: Context | None = None) -> str:
    """One workflow command a finding (`::error`, `::warning`, `::notice` by the rule's level) and
    an `::error` for each file that could not be linted. Properties and messages are escaped as
    GitHub's toolkit does (`%`, CR and LF everywhere; `:` and `,` in properties too)."""
    context = context or Context()

    def where(path: str) -> str:
        return _escape_property(visible(_relative(path, context.root) or os.path.abspath(path)))

    out = []
    for f in result.findings:
        r = _region(f)
        title = _escape_property(f"gpudoctor {f.code} ({f.kb_id})")
        out.append(f"::{_COMMAND[rules.BY_CODE[f.code].level]} file={where(f.path)},line={r['startLine']},"
                   f"col={r['startColumn']},endLine={r['endLine']},endColumn={r['endColumn']},title={title}::"
                   f"{_escape_data(visible(f'{f.code} {f.message}'))}")
    for e in result.errors:
        out.append(f"::error file={where(e.path)},title={_escape_property('gpudoctor lint: not linted')}::"
                   f"{_escape_data(visible(e.message))}")
    for ie in result.internal_errors:
        place = f"file={where(ie.path)}," if ie.path is not None else ""
        out.append(f"::error {place}title={_escape_property('gpudoctor lint: internal error')}::"
                   f"{_escape_data(visible(ie.describe()))}")
    return "\n".join(out) + ("\n" if out else "")


RENDERERS: dict[str, Callable[[LintResult, Context], str]] = {
    "text": text, "json": json_, "md": markdown, "sarif": sarif, "github": github,
}
FORMATS = tuple(RENDERERS)


# --- the summary on stderr -----------------------------------------------------------------------


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
    if result.internal_errors:
        n = len(result.internal_errors)
        parts.append(f"{n} internal error{'s' * (n != 1)} (findings missing, see above)")
    return "gpudoctor lint: " + "; ".join(parts)
