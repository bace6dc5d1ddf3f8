"""Copy-paste under a real pseudo-terminal at 80 and 200 columns: `gpudoctor scan` runs the real
console script with its standard output on a pty of that size (colour on, as a user sees it), and
the logical lines it wrote (what a terminal's copy, or `tmux capture-pane -J`, gives back) must hold
every patch line whole with its +/- prefix, every id and command unbroken, URLs unfolded, and
evidence once, uncut. The verdict is the first and the last line; probe lines fit the width, their
summaries wrapped, never cut."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from gpudoctor.knowledge.kb import load_entry
from pty_helpers import on_a_pty

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "cli_probes" / "findings.py"
# The scan's worker imports torch first; without it the verdict is torch-import-failed, not the page
# these tests read (the torch-free run of .ci/run skips them).
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the scan's worker needs torch")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def scan_on_a_pty(columns: int, *args: str) -> tuple[list[str], int]:
    """Run `gpudoctor scan` with stdin and stdout on a `columns`-wide pty; the lines it wrote,
    escape sequences removed, and its exit code. Progress (stderr) goes to a pipe."""
    raw, code = on_a_pty(["scan", "--probe-file", str(FIXTURE), "--probe", "cli-findings", *args], columns)
    text = _ANSI.sub("", raw)
    return [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")], code


@needs_torch
@pytest.mark.parametrize("columns", [80, 200])
def test_patches_ids_urls_and_evidence_survive_a_terminal(columns):
    lines, code = scan_on_a_pty(columns, "-v")
    assert code == 1
    text = "\n".join(lines)
    nonblank = [line for line in lines if line.strip()]
    verdict = "gpudoctor: NOT HEALTHY (1 problem); fix first: device-side-assert"
    assert nonblank[0] == verdict and nonblank[-1] == verdict
    # Every line of the patch is a line of the output, whole, at column 0.
    entry = load_entry("device-side-assert")
    assert max(len(line) for line in entry.patch.splitlines()) > 80  # the fixture must be able to wrap
    for patch_line in entry.patch.splitlines():
        assert patch_line.rstrip() in lines, patch_line
    for patch_line in load_entry("sdp-kernel-deprecated").patch.splitlines():
        assert patch_line.rstrip() in lines, patch_line
    # Ids and the commands that carry them are never cut.
    assert any(line.startswith("  error     device-side-assert  ") for line in lines)
    assert "            gpudoctor explain device-side-assert" in lines
    assert "            gpudoctor explain sdp-kernel-deprecated" in lines
    # The evidence line is whole (URL unfolded, no word cut) and printed once.
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_findings_fixture", FIXTURE)
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    assert f"            | {fixture.EVIDENCE}" in lines
    assert text.count(fixture.URL) == 1


@needs_torch
@pytest.mark.parametrize("columns", [80, 200])
def test_the_default_page_fits_the_terminal(columns):
    lines, code = scan_on_a_pty(columns)
    assert code == 1
    nonblank = [line for line in lines if line.strip()]
    assert nonblank[0] == nonblank[-1] == "gpudoctor: NOT HEALTHY (1 problem); fix first: device-side-assert"
    at = next(n for n, line in enumerate(lines) if line.startswith("  cli-findings "))
    assert len(lines[at]) <= columns
    # The summary is never cut: where the terminal is too narrow for it, it wraps at word
    # boundaries under its own column, every line within the width.
    summary = "an index out of range in an embedding lookup triggered a device-side assert"
    start = lines[at].index(summary.split()[0])
    rows = [lines[at]] + [line for line in lines[at + 1:at + 4] if line[:start].isspace() and line[start:start + 1].strip()]
    assert " ".join(row[start:].strip() for row in rows) == summary
    assert len(rows) == (1 if columns == 200 else 2) and all(len(row) <= columns for row in rows)
    assert "…" not in "\n".join(lines)
    finding = next(line for line in lines if line.startswith("  error     device-side-assert  "))
    assert len(finding) <= columns
    assert "            gpudoctor explain device-side-assert" in lines
    # No patch on the default page: it is behind -v and `gpudoctor explain`.
    assert load_entry("device-side-assert").patch.splitlines()[0] not in lines
