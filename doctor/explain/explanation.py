"""`gpudoctor explain` and `gpudoctor list`: the result object and its renderers (text for people,
JSON, Markdown). Renderers write what they are given; they decide nothing about exit codes.

A verdict is one of three kinds: a knowledge-base entry (`entry`), the platform the text comes
from when no entry applies there (`platform`: ROCm/HIP, ZLUDA, Apple MPS, Intel XPU, Ascend NPU...,
gpudoctor.knowledge.notices), or a primary CUDA error that no entry explains (`unrecognised`).
A platform can also accompany an entry verdict, when the entry applies there too (an NPU
out-of-memory is the caching allocator's, as on CUDA).

The public JSON shape (schema version EXPLAIN_SCHEMA_VERSION, documented in docs/explain.md) is

    {"schema_version": "1.3",
     "verdict": {"kind", "id", "title", "cause", "quick_fix", "confidence", "confident", "line",
                 "platform", "error"} | null,
     "platform": {"id", "name", "line", "evidence", "cuda_entries_apply", "summary", "steps",
                  "references"} | null,
     "unrecognised": {"error", "line", "evidence", "summary", "steps", "references"} | null,
     "matches": [{"id", "title", "confidence", "evidence", "captures", "context_only",
                  "line", "evidence_lines", "decided_by", "against", "consequence_of",
                  "not_on_platform"}, ...],
     "entry": {...the verdict's full entry, or the entry asked for by id...} | null,
     "code_patch": {...gpudoctor.reports.codepatch's shape...} | null}

with `matches` best first and empty when nothing known matched. 1.3 added `code_patch`: the patch
for the user's own files that the traceback names (gpudoctor.reports.codepatch documents its
shape), null when the verdict is no entry or no frame is the user's code on this machine. 1.2 added `verdict.kind`
("entry", "platform", "unrecognised"; `id` is null for the last two), `verdict.confident`,
`verdict.platform`, `verdict.error`, the `platform` and `unrecognised` objects and each match's
`not_on_platform`; `verdict` is no longer the best match when a rule demoted it (then `entry` is
null too). 1.1 added `verdict`, the per-match `line`, `evidence_lines`, `decided_by`, `against`
and `consequence_of`, and the entry's `cause`, `quick_fix` and `misconceptions`; every 1.0 field
is still there.

Text output puts the verdict first (the best match, its cause and fix, and where in the input it
was found), then the other matches, then the entry in full. Everything taken from the user's text
goes through gpudoctor.safetext: it is shown as text, never as markup or escape sequences. Patches,
commands and URLs are printed unwrapped (soft wrap), so a copy from a narrow terminal keeps every
line whole; prose wraps at word boundaries with hanging indents.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudoctor.knowledge.kb import Entry

if TYPE_CHECKING:
    from rich.console import Console

    from gpudoctor.explain.matcher import Analysis, Match
    from gpudoctor.explain.notice import PlatformFinding, PrimaryError

EXPLAIN_SCHEMA_VERSION = "1.3"
CONFIDENT = 0.5  # stated confidence from which a verdict is "confident" (docs/explain.md, reliability)
_EVIDENCE_CHARS = 400  # one evidence line as printed (the matcher already cut it at words)
_VERDICT_EVIDENCE = 3


class Explanation:
    """What explain found: ranked matches for text, or the one entry asked for by id; the platform
    the text comes from and a primary CUDA error no entry explains (module docstring). A plain
    class rather than a dataclass: `explain ID` creates it on every run, and start-up counts."""

    __slots__ = ("matches", "entry", "platform", "unrecognised", "code_patch")

    def __init__(self, matches: tuple[Match, ...], entry: Entry | None, platform: PlatformFinding | None = None,
                 unrecognised: PrimaryError | None = None, code_patch: dict[str, Any] | None = None) -> None:
        self.matches = matches
        self.entry = entry  # the verdict's entry, or the entry named by id
        self.platform = platform
        self.unrecognised = unrecognised
        # the patch for the user's code from the traceback's local files (gpudoctor.patch), JSON-ready
        self.code_patch = code_patch

    def __repr__(self) -> str:
        return f"Explanation(matches={self.matches!r}, entry={self.entry and self.entry.id!r})"

    @property
    def best(self) -> Match | None:
        """The match the verdict rests on: the best one, when the verdict is an entry."""
        if self.entry is None or not self.matches or self.matches[0].entry.id != self.entry.id:
            return None
        return self.matches[0]

    @property
    def kind(self) -> str | None:
        """"entry", "platform", "unrecognised", or None when nothing was recognised."""
        if self.entry is not None:
            return "entry"
        if self.platform is not None:
            return "platform"
        if self.unrecognised is not None:
            return "unrecognised"
        return None


def from_analysis(analysis: Analysis, code_patch: dict[str, Any] | None = None) -> Explanation:
    """The explanation of a matched text: the verdict's entry when an entry is the answer, and
    the patch for the user's code (`code_patch`, gpudoctor.patch) kept only under an entry
    verdict: a platform or an unrecognised error has no entry whose rules could check code."""
    verdict = analysis.verdict
    entry = verdict.entry.advised(verdict.captures) if verdict else None  # the fix with the text's versions
    return Explanation(analysis.matches, entry, analysis.platform, analysis.unrecognised,
                       code_patch if entry is not None else None)


def redact_explanation(explanation: Explanation, redactor: Any) -> Explanation:
    """The explanation with everything quoted from the user's text (evidence lines, captured
    values, the facts that decided a match and the lines against it) passed through `redactor`
    (a gpudoctor.reports.redact.Redactor): tokens, user and host names, addresses and home paths
    become placeholders, as in every report. The knowledge base's own text is left alone."""
    import dataclasses

    def scrub(values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(redactor.text(v) for v in values)

    matches = tuple(
        dataclasses.replace(m, evidence=scrub(m.evidence), decided_by=scrub(m.decided_by), against=scrub(m.against),
                            captures={k: redactor.text(v) if isinstance(v, str) else v for k, v in m.captures.items()})
        for m in explanation.matches)
    platform, unrecognised = explanation.platform, explanation.unrecognised
    if platform is not None:
        platform = platform.with_evidence(redactor.text(platform.evidence))
    if unrecognised is not None:
        unrecognised = type(unrecognised)(redactor.text(unrecognised.message), unrecognised.line,
                                          redactor.text(unrecognised.evidence))
    code_patch = redactor.value(explanation.code_patch) if explanation.code_patch else explanation.code_patch
    return Explanation(matches, explanation.entry, platform, unrecognised, code_patch)


# --- JSON ------------------------------------------------------------------------------------------


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "title": entry.title,
        "cause": entry.cause,
        "quick_fix": entry.quick_fix,
        "aliases": list(entry.aliases),
        "what": entry.what,
        "why": list(entry.why),
        "fix": list(entry.fix),
        "patch": entry.patch,
        "patch_lang": entry.patch_lang,
        "applicability": entry.applicability,
        "fix_safety": entry.fix_safety,
        "probes": list(entry.probes),
        "misconceptions": [{"claim": m.claim, "truth": m.truth, "evidence": m.evidence} for m in entry.misconceptions],
        # 1.0 called them corrections; kept so that 1.0 readers still find them.
        "corrections": [{"claim": m.claim, "truth": m.truth} for m in entry.misconceptions],
        "references": [{"title": r.title, "url": r.url, "seed": None} for r in entry.references],
    }


def _verdict(explanation: Explanation) -> dict[str, Any] | None:
    best, entry, kind = explanation.best, explanation.entry, explanation.kind
    if kind is None:
        return None
    platform = explanation.platform.id if explanation.platform is not None else None
    if kind == "entry":
        assert entry is not None
        confidence = round(best.confidence, 3) if best else None
        return {"kind": "entry", "id": entry.id, "title": entry.title, "cause": entry.cause,
                "quick_fix": entry.quick_fix, "confidence": confidence,
                "confident": (confidence >= CONFIDENT) if confidence is not None else None,
                "line": (best.first_line or None) if best else None, "platform": platform, "error": None}
    notice, line, error = _notice(explanation)
    return {"kind": kind, "id": None, "title": _notice_title(explanation), "cause": notice.summary,
            "quick_fix": notice.steps[0], "confidence": None, "confident": None, "line": line or None,
            "platform": platform, "error": error}


def _notice(explanation: Explanation) -> tuple[Any, int, str | None]:
    """(the notice, its line, the unrecognised error's message) of a platform or unrecognised verdict."""
    from gpudoctor.knowledge.notices import UNRECOGNISED, load

    if explanation.kind == "platform":
        assert explanation.platform is not None
        return explanation.platform.notice, explanation.platform.line, None
    assert explanation.unrecognised is not None
    return load(UNRECOGNISED), explanation.unrecognised.line, explanation.unrecognised.message


def verdict_title(explanation: Explanation) -> str:
    """One line naming the verdict: an entry's title, or what the notice says."""
    if explanation.kind == "entry":
        assert explanation.entry is not None
        return explanation.entry.title
    return _notice_title(explanation) if explanation.kind else NOTHING_RECOGNISED


def _notice_title(explanation: Explanation) -> str:
    if explanation.kind == "platform":
        assert explanation.platform is not None
        return f"Not NVIDIA CUDA: {explanation.platform.notice.name}"
    assert explanation.unrecognised is not None
    return f"Unrecognised CUDA error: {explanation.unrecognised.message}"


def _unrecognised_dict(explanation: Explanation) -> dict[str, Any] | None:
    from gpudoctor.knowledge.notices import UNRECOGNISED, load

    error = explanation.unrecognised
    if error is None:
        return None
    notice = load(UNRECOGNISED)
    return {"error": error.message, "line": error.line or None, "evidence": error.evidence,
            "summary": notice.summary, "steps": list(notice.steps),
            "references": [{"title": r.title, "url": r.url} for r in notice.references]}


def verdict_parts(explanation: Explanation) -> dict[str, Any]:
    """`verdict`, `platform` and `unrecognised` of the JSON shape: what was concluded, which `run`
    records in its diagnosis too (gpudoctor.ticket)."""
    platform = explanation.platform
    return {
        "verdict": _verdict(explanation),
        "platform": platform.to_dict(cuda_entries_apply=explanation.entry is not None) if platform else None,
        "unrecognised": _unrecognised_dict(explanation),
    }


def to_dict(explanation: Explanation) -> dict[str, Any]:
    """The public JSON shape of the module docstring."""
    return {
        "schema_version": EXPLAIN_SCHEMA_VERSION,
        **verdict_parts(explanation),
        "matches": [m.to_dict() for m in explanation.matches],
        "entry": entry_to_dict(explanation.entry) if explanation.entry else None,
        "code_patch": explanation.code_patch,
    }


def to_json(explanation: Explanation) -> str:
    import json

    return json.dumps(to_dict(explanation), indent=2, ensure_ascii=False)


def list_json(entries: tuple[Entry, ...]) -> str:
    import json

    return json.dumps(
        {"schema_version": EXPLAIN_SCHEMA_VERSION,
         "entries": [{"id": e.id, "title": e.title, "aliases": list(e.aliases)} for e in entries]},
        indent=2,
    )


def list_markdown(entries: tuple[Entry, ...]) -> str:
    """`gpudoctor list --format md`: the ids and titles as a Markdown table (docs/explain.md's index)."""
    rows = ["| `%s` | %s |" % (e.id, e.title.replace("|", "\\|")) for e in entries]
    return "\n".join(["| id | title |", "| --- | --- |", *rows]) + "\n"


# --- text for people -------------------------------------------------------------------------------


def _where(m: Match) -> str:
    return f"line {m.first_line}" if m.first_line else "the text"


def _hanging(console: Console, label: str, body: str, indent: int = 2, *, label_style: str = "",
             style: str = "", untrusted: bool = False) -> None:
    """`label` then `body` wrapped at word boundaries to the console width, continuation lines
    indented under the body: a bullet or a "Fix:" line that wraps at 80 columns still reads as
    one item. Words longer than a line are not cut (the terminal wraps them), and nothing is
    padded with trailing spaces. Untrusted text goes through safetext first."""
    import textwrap

    from rich.text import Text

    if untrusted:
        from gpudoctor.safetext import visible

        body = visible(body, _EVIDENCE_CHARS)
    pad = max(indent, len(label) + 1) if label else indent
    width = max(20, (console.width or 80) - pad)
    lines: list[str] = []
    for paragraph in body.split("\n"):
        lines += textwrap.wrap(paragraph, width, break_long_words=False, break_on_hyphens=False) or [""]
    for i, line in enumerate(lines):
        out = Text()
        out.append((label if i == 0 else "").ljust(pad), style=label_style if i == 0 else "")
        out.append(line, style=style)
        console.print(out, soft_wrap=True)


def _t(text: str, style: str = "") -> Any:
    """Our own (knowledge-base) prose as a Text: never parsed as markup, so `[sm80, sm121]`
    and the like print as written."""
    from rich.text import Text

    return Text(text, style=style)


def _print_unwrapped(console: Console, text: Any) -> None:
    """Code, patches, commands and URLs: never folded or wrapped by us. The terminal may wrap a
    long line visually, but it stays one line when copied."""
    console.print(text, soft_wrap=True)


def render_verdict(matches: tuple[Match, ...], console: Console, platform: PlatformFinding | None = None,
                   entry: Entry | None = None, code_patch: dict[str, Any] | None = None) -> None:
    """The best match first (id, confidence and line; its cause, fix and the lines that decided
    it, the platform when the text names one; under it the patch for the user's code,
    gpudoctor.reports.codepatch), then one line for every other match. `entry`: the best match's
    entry with its advice filled in from the text (`Entry.advised`)."""
    if not matches:
        return
    from rich.text import Text

    best = matches[0]
    entry = entry or best.entry
    head = Text()
    head.append(best.id, style="bold")  # ids are never truncated: a line of their own
    console.print(head, soft_wrap=True)
    console.print(_t(entry.title))
    console.print(Text(_confidence_line(best), style="dim"))
    _hanging(console, "Cause:", entry.cause, 7, label_style="bold")
    _hanging(console, "Fix:", entry.quick_fix, 7, label_style="bold")
    shown: set[str] = set()
    for text, line in list(zip(best.evidence, best.lines))[:_VERDICT_EVIDENCE]:
        _hanging(console, f"line {line}:" if line else "Fact:", text, 7, label_style="dim", untrusted=True)
        shown.add(text)
    for fact in best.decided_by:
        if fact not in shown:
            _hanging(console, "Decided:", fact, 7, label_style="dim", untrusted=True)
            shown.add(fact)
    for text in best.against:
        _hanging(console, "Against:", text, 7, label_style="dim", untrusted=True)
    for line in best.context_lines():
        _hanging(console, "•", line, 7, untrusted=True)
    if platform is not None:
        _hanging(console, "Platform:", f"{platform.notice.name} ({_at(platform.line)}); this entry applies "
                 "there too, with the platform's own tools (below).", 10, label_style="bold")
    if code_patch:
        from gpudoctor.reports import codepatch

        if codepatch.shows(code_patch):
            console.print()
            codepatch.render_text(code_patch, console)
    _render_others(matches[1:], console, shown)


def _confidence_line(m: Match) -> str:
    said = f"{m.confidence:.0%} confident" if m.confidence >= CONFIDENT else \
        f"only {m.confidence:.0%} confident (a guess, not a diagnosis)"
    return f"{said}, from {_where(m)} of the input"


def _at(line: int) -> str:
    return f"line {line}" if line else "the text"


def _render_others(others: tuple[Match, ...], console: Console, shown: set[str], start: int = 2,
                   title: str = "Also in this text") -> None:
    """One line for each other match (why it is not the verdict), with its first line not shown yet."""
    if not others:
        return
    from rich.text import Text

    console.print()
    console.print(_t(title, style="bold"))
    for rank, m in enumerate(others, start):
        if m.consequence_of:
            root_id, root_line = m.consequence_of
            note = f"after {root_id}" + (f" (line {root_line})" if root_line else "") + ": a consequence"
        elif m.not_on:
            note = f"does not apply on {m.not_on}"
        elif m.context_only:
            note = "context"
        else:
            note = f"{m.confidence:.0%}"
        head = Text(f"{rank}. ")
        head.append(m.id, style="bold")
        head.append(f"  {note}, {_where(m)}", style="dim")
        console.print(head, soft_wrap=True)
        first = next((t for t in m.evidence if t not in shown), None)
        if first is not None:
            _hanging(console, "", first, 4, untrusted=True)
            shown.add(first)


def render_notice(explanation: Explanation, console: Console) -> None:
    """A verdict that is no entry: the platform the text comes from (the CUDA entries do not apply
    there) or a primary CUDA error no entry explains: what says so, what it means, the steps that
    apply, the matches that are only context, and the references."""
    from rich.text import Text

    notice, line, _ = _notice(explanation)
    evidence = explanation.platform.evidence if explanation.kind == "platform" else explanation.unrecognised.evidence
    head = Text()
    head.append(_notice_title(explanation), style="bold")
    console.print(head, soft_wrap=True)
    console.print(Text(f"from {_at(line)} of the input", style="dim"))
    _hanging(console, f"line {line}:" if line else "Text:", evidence, 7, label_style="dim", untrusted=True)
    _hanging(console, "Cause:", notice.summary, 7, label_style="bold")
    console.print()
    console.print(_t("What applies" if explanation.kind == "platform" else "First steps", style="bold"))
    for n, step in enumerate(notice.steps, 1):
        _hanging(console, f"{n}.", step, 3)
    _render_others(explanation.matches, console, {evidence}, 1,
                   "Read as NVIDIA CUDA (does not apply here)" if explanation.kind == "platform" else "Also in this text")
    _render_references(console, notice.references)


def _render_references(console: Console, references: Any) -> None:
    from rich.text import Text

    console.print()
    console.print(_t("References", style="bold"))
    for ref in references:
        _hanging(console, "•", ref.title, 2)
        _print_unwrapped(console, Text("  " + ref.url))


def render_platform_steps(platform: PlatformFinding, console: Console) -> None:
    """What the platform's own tools are, after an entry that applies there too."""
    console.print()
    console.print(_t(f"On {platform.notice.name}", style="bold"))
    _hanging(console, "", platform.notice.summary, 0)
    for n, step in enumerate(platform.notice.steps, 1):
        _hanging(console, f"{n}.", step, 3)


def render_entry(entry: Entry, console: Console, match: Match | None = None) -> None:
    """An entry in full: what, why, fix, patch (highlighted, unwrapped), safety, misconceptions,
    references. Without a match (explain by id) it starts with the id, title, cause and fix."""
    from rich.rule import Rule
    from rich.text import Text

    if match is None:
        console.print(Text(entry.id, style="bold"), soft_wrap=True)
        console.print(_t(entry.title))
        _hanging(console, "Cause:", entry.cause, 7, label_style="bold")
        _hanging(console, "Fix:", entry.quick_fix, 7, label_style="bold")
        console.print()
    console.print(Rule(Text(f"{entry.id}: the full story"), align="left", style="dim"))
    console.print(_t("What happened", style="bold"))
    _hanging(console, "", entry.what, 0)
    console.print()
    console.print(_t("Why", style="bold"))
    for cause in entry.why:
        _hanging(console, "•", cause, 2)
    console.print()
    console.print(_t("Fix", style="bold"))
    for n, step in enumerate(entry.fix, 1):
        _hanging(console, f"{n}.", step, 3)
    console.print()
    console.print(_t("Patch", style="bold"))
    _hanging(console, f"{entry.applicability}:" if entry.fix_safety else entry.applicability,
             entry.fix_safety, 2, label_style="dim")
    if console.color_system is None:
        # No colour (a pipe, a file, NO_COLOR): highlighting would be thrown away; skip the lexer.
        patch = Text(entry.patch)
    else:
        from rich.syntax import Syntax

        patch = Syntax(entry.patch, _lexer(entry.patch_lang), theme="ansi_dark",
                       background_color="default").highlight(entry.patch)
        patch.rstrip()
    _print_unwrapped(console, patch)
    if entry.misconceptions:
        console.print()
        console.print(_t("Common misconceptions", style="bold"))
        for item in entry.misconceptions:
            _hanging(console, "• Claim:", item.claim, 16)
            _hanging(console, "  What is true:", item.truth, 16)
            _hanging(console, "  Evidence:", item.evidence, 16, label_style="dim")
    _render_references(console, entry.references)
    if entry.probes:
        console.print()
        console.print(_t("Check this machine:", style="dim"))
        _print_unwrapped(console, Text("  gpudoctor scan " + " ".join(f"--probe {p}" for p in entry.probes)))


def render_text(explanation: Explanation, console: Console) -> None:
    """The whole text report: the verdict first, then the entry in full (or the notice that is
    the verdict: the platform, an unrecognised CUDA error)."""
    if explanation.kind in ("platform", "unrecognised"):
        render_notice(explanation, console)
        return
    if explanation.entry is not None and explanation.best is not None:
        render_verdict(explanation.matches, console, explanation.platform, explanation.entry, explanation.code_patch)
        console.print()  # the verdict and the full story are two blocks
    if explanation.entry is not None:
        render_entry(explanation.entry, console, explanation.best)
        if explanation.platform is not None:
            render_platform_steps(explanation.platform, console)


def _lexer(name: str):
    """The two lexers patches use, imported directly: looking a lexer up by name loads
    Pygments' whole lexer registry, which costs more start-up than the rest of `explain ID`."""
    if name == "diff":
        from pygments.lexers.diff import DiffLexer

        return DiffLexer()
    if name == "python":
        from pygments.lexers.python import PythonLexer

        return PythonLexer()
    return name


# --- Markdown ------------------------------------------------------------------------------------


def render_markdown(explanation: Explanation) -> str:
    """The same report as Markdown, for a bug ticket: the verdict (with the lines of the input that
    decided it and what was captured from them), the other matches, then the entry in full.
    Text from the input is escaped, the knowledge base's prose stays Markdown (both through
    gpudoctor.reports.markdown, as in every Markdown gpudoctor writes)."""
    from gpudoctor.reports import markdown as md

    out: list[str] = []
    best, entry = explanation.best, explanation.entry
    if explanation.kind in ("platform", "unrecognised"):
        return _notice_markdown(explanation)
    if entry is None:
        return NOTHING_RECOGNISED + ".\n"
    out.append(f"## `{entry.id}`: {md.prose(entry.title)}")
    out.append("")
    if best is not None:
        out.append(f"**{_confidence_line(best)}.**")
        out.append("")
    out.append(f"**Cause:** {md.prose(entry.cause)}")
    out.append("")
    out.append(f"**Fix:** {md.prose(entry.quick_fix)}")
    if best is not None:
        out.append("")
        for text, line in zip(best.evidence, best.lines):
            out.append(f"- {'line ' + str(line) if line else 'fact'}: {md.text(text, _EVIDENCE_CHARS)}")
        for fact in best.decided_by:
            if fact not in best.evidence:
                out.append(f"- decided by: {md.text(fact, _EVIDENCE_CHARS)}")
        for line in best.context_lines():
            out.append(f"- in your text: {md.text(line, _EVIDENCE_CHARS)}")
        if explanation.platform is not None:
            p = explanation.platform
            out.append(f"- platform: {md.prose(p.notice.name)} ({_at(p.line)}: {md.text(p.evidence, _EVIDENCE_CHARS)});"
                       " this entry applies there too")
    if explanation.code_patch:
        from gpudoctor.reports import codepatch

        patch_lines = codepatch.render_markdown(explanation.code_patch)
        out += ["", *patch_lines] if patch_lines else []
    out += _others_markdown(explanation.matches[1:], 2)
    out += ["", "### What happened", "", md.prose(entry.what), "", "### Why", ""]
    out += [f"- {md.prose(w)}" for w in entry.why]
    out += ["", "### Fix", ""]
    out += [f"{n}. {md.prose(step)}" for n, step in enumerate(entry.fix, 1)]
    out += ["", f"### Patch ({entry.applicability})", ""]
    if entry.fix_safety:
        out += [md.prose(entry.fix_safety), ""]
    out.append(md.fence(entry.patch, entry.patch_lang))
    if entry.misconceptions:
        out += ["", "### Common misconceptions", ""]
        for m in entry.misconceptions:
            out.append(f"- **Claim:** {md.prose(m.claim)}  \n  **What is true:** {md.prose(m.truth)}  \n"
                       f"  **Evidence:** {md.prose(m.evidence)}")
    out += ["", "### References", ""]
    # <url>: a link destination that may hold parentheses and spaces.
    out += [f"- [{md.prose(r.title).replace(']', ')')}](<{r.url}>)" for r in entry.references]
    if entry.probes:
        out += ["", "Check this machine: `gpudoctor scan " + " ".join(f"--probe {p}" for p in entry.probes) + "`"]
    if explanation.platform is not None:
        notice = explanation.platform.notice
        out += ["", f"### On {md.prose(notice.name)}", "", md.prose(notice.summary), ""]
        out += [f"{n}. {md.prose(step)}" for n, step in enumerate(notice.steps, 1)]
    return "\n".join(out) + "\n"


NOTHING_RECOGNISED = "No GPU failure recognised in this text"


def _others_markdown(others: tuple[Match, ...], start: int, title: str = "Also in this text") -> list[str]:
    if not others:
        return []
    out = ["", f"### {title}", "", "| # | id | confidence | line |", "| --- | --- | --- | --- |"]
    for rank, m in enumerate(others, start):
        label = "context" if m.context_only else f"{m.confidence:.0%}"
        if m.not_on:
            label = f"does not apply on {m.not_on}"
        if m.consequence_of:
            label = f"consequence of `{m.consequence_of[0]}`"
        out.append(f"| {rank} | `{m.id}` | {label} | {m.first_line or ''} |")
    return out


def _notice_markdown(explanation: Explanation) -> str:
    from gpudoctor.reports import markdown as md

    notice, line, _ = _notice(explanation)
    platform = explanation.kind == "platform"
    evidence = explanation.platform.evidence if platform else explanation.unrecognised.evidence
    out = [f"## {md.text(_notice_title(explanation), _EVIDENCE_CHARS)}", "",
           f"From {_at(line)} of the input: {md.text(evidence, _EVIDENCE_CHARS)}", "",
           f"**Cause:** {md.prose(notice.summary)}", "", f"### {'What applies' if platform else 'First steps'}", ""]
    out += [f"{n}. {md.prose(step)}" for n, step in enumerate(notice.steps, 1)]
    out += _others_markdown(explanation.matches, 1, "Read as NVIDIA CUDA (does not apply here)" if platform
                            else "Also in this text")
    out += ["", "### References", ""]
    out += [f"- [{md.prose(r.title).replace(']', ')')}](<{r.url}>)" for r in notice.references]
    return "\n".join(out) + "\n"


def render_page(explanation: Explanation, console: Console, *, quiet: bool = False, verbose: bool = False) -> None:
    """`gpudoctor explain`'s terminal page (`render_text`: the verdict, then the entry in full);
    quiet: one line per match; verbose: the other matched entries in full too."""
    from rich.text import Text

    if quiet:
        rows = [(m.id, f"{m.confidence:.0%}", m.entry.title) for m in explanation.matches]
        if not rows and explanation.entry is not None:  # by id
            rows = [(explanation.entry.id, "", explanation.entry.title)]
        if explanation.kind in ("platform", "unrecognised"):  # the verdict is no entry: it comes first
            rows.insert(0, (explanation.platform.id if explanation.kind == "platform" else "unrecognised", "",
                            verdict_title(explanation)))
        for kb_id, confidence, title in rows:
            console.print(Text(f"{kb_id}  {confidence + '  ' if confidence else ''}{title}"), soft_wrap=True)
        return
    render_text(explanation, console)
    if verbose:
        for m in explanation.matches[1:]:
            if not m.context_only:
                console.print()
                render_entry(m.entry, console, m)


def render_list(entries: tuple[Entry, ...], console: Console, *, quiet: bool = False, verbose: bool = False) -> None:
    """`gpudoctor list` on the terminal: a table of ids and titles (verbose: and aliases); quiet:
    the ids alone, one per line."""
    from rich.table import Table
    from rich.text import Text

    if quiet:
        for e in entries:
            console.print(Text(e.id), soft_wrap=True)
        return
    table = Table(show_header=True, box=None)
    table.add_column("id", style="bold", no_wrap=True)
    table.add_column("title")
    if verbose:
        table.add_column("aliases")
    for e in entries:
        table.add_row(Text(e.id), Text(e.title), *([Text(", ".join(e.aliases))] if verbose else []))
    console.print(table)
