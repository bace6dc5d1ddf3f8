"""The ticket of `gpudoctor run` (gpudoctor.ticket.bundle builds it, a JSON-ready dict) as what
people read: `ticket.md` for the issue tracker (`render_markdown`, under `MAX_TICKET_CHARS`, every
quoted text escaped), the terminal page (`render_text`) and `run.json` (`render_json`).

Nothing here prints on its own: the terminal renderer writes to the rich Console it is given.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from gpudoctor.reports import markdown as md
from gpudoctor.safetext import json_text, visible
from gpudoctor.ticket.bundle import _ERROR_LINES, _LINE_CHARS, _TICKET_TAIL_LINES, MAX_TICKET_CHARS

if TYPE_CHECKING:
    from rich.console import Console

# Fixed sentences (the locations, which come from the command's output, are in the table above).
_LOCALIZATION_MD = {
    "moved": "The first run blamed the wrong line: CUDA reports a kernel's error at a later API call.",
    "same": "Both runs fail at the same line: the traceback points at the real failure.",
    "passed": ("With CUDA_LAUNCH_BLOCKING=1 the command **succeeded**: the failure depends on asynchronous "
               "execution (a race between streams, or memory read before a kernel wrote it)."),
    "no-traceback": "The synchronous re-run failed without a Python traceback to locate.",
    "interrupted": "The synchronous re-run was interrupted: nothing to compare.",
    "already-synchronous": "CUDA_LAUNCH_BLOCKING=1 was already set: the traceback points at the real failure.",
}


def _lines_label(diag: dict[str, Any]) -> str:
    return "re-run line" if diag.get("lines_in") == "synchronous re-run" else "output line"


def _line_of(match: dict[str, Any], diag: dict[str, Any]) -> str | None:
    """Where in the output the match was found, for people: `line 9 of output.log`."""
    line = match.get("line") if match else None
    if not isinstance(line, int) or line <= 0:
        return None
    if diag.get("lines_in") == "synchronous re-run":
        return f"line {line} of the synchronous re-run's output"
    return f"line {line} of output.log"


def _where_md(best: dict[str, Any], tb: dict[str, Any] | None, diag: dict[str, Any]) -> str:
    """Where the error was found in the output, beside the Python line its traceback blamed."""
    parts = []
    found = _line_of(best, diag)
    if found:
        parts.append(f"`{best['id']}` found on {found}")
    if tb:
        parts.append(f"the traceback blames {_frame_md(tb.get('user_frame'))}")
    return "; ".join(parts)


def _frame_md(frame: dict[str, Any] | None, *, table: bool = False) -> str:
    if not frame:
        return "no Python traceback"
    where = md.code_span(f"{frame.get('file')}:{frame.get('line')}", table=table)
    func = f" in {md.code_span(frame['function'], table=table)}" if frame.get("function") else ""
    code = f": {md.code_span(frame['code'], table=table)}" if frame.get("code") else ""
    return f"{where}{func}{code}"


def render_markdown(ticket: dict[str, Any], *, limit: int = MAX_TICKET_CHARS) -> str:
    """`ticket.md`: a GitHub/GitLab issue body, pasted as it is, under `limit` characters. The
    output tail gets what room the rest leaves."""
    diag = ticket.get("diagnosis") or {}
    entry = diag.get("entry")
    matches = diag.get("matches") or []
    cmd = ticket["command"]["line"]
    exit_ = ticket["exit"]
    verdict = diag.get("verdict") or {}
    notice, notice_kind = _notice_of(diag)
    title = md.prose(entry["title"]) if entry else md.text(verdict.get("title") or "") if notice is not None else ""
    head = [f"### {md.code_span(cmd)} fails" + (f": {title}" if title else "")]
    head += ["", f"{md.code_span(cmd)} {exit_['how']} after {exit_['duration_s']:.1f} s"
             + (" (interrupted)" if exit_.get("interrupted") else "") + "."]
    body: list[str] = []
    best = matches[0] if matches else {}
    via = " (from the synchronous re-run)" if diag.get("source") == "synchronous re-run" else ""
    if entry:
        confidence = verdict.get("confidence") if verdict.get("confidence") is not None else best.get("confidence", 0)
        conf = f"{confidence:.0%}" if best else ""
        body += ["", f"**Diagnosis**{via}: `{entry['id']}` ({conf}): {md.prose(entry['title'])}", "",
                 md.prose(entry["what"])]
        if diag.get("platform"):
            p = diag["platform"]
            body += ["", f"**Platform**: {md.prose(p.get('name') or '')}{_at_line(p)}: {md.code_span(p.get('evidence') or '')}; "
                         "this entry applies there too."]
    elif notice is not None:
        body += ["", f"**Diagnosis**{via}: {title}", "", md.prose(str(notice.get("summary") or "")), "",
                 f"- {'line ' + str(notice['line']) if notice.get('line') else 'in the output'}: "
                 f"{md.code_span(notice.get('evidence') or '')}"]
    else:
        body += ["", "**Diagnosis**: no known failure was recognised in the output."]
    tb = diag.get("traceback")
    where = _where_md(best if entry else {}, tb, diag)
    if where:
        body += ["", f"**Where**: {where}"]

    loc = ticket.get("localization")
    if loc:
        body += ["", "#### Where it really failed (CUDA_LAUNCH_BLOCKING=1)", ""]
        if loc["verdict"] in ("moved", "same"):
            body += ["| | Location |", "|---|---|",
                     f"| First run blamed | {_frame_md(loc.get('blamed'), table=True)} |",
                     f"| Synchronous re-run | {_frame_md(loc.get('real'), table=True)} |"]
            extra = []
            if loc.get("operator"):
                extra.append(f"operator {md.code_span(loc['operator'])}")
            if loc.get("call"):
                call = loc["call"]
                where = md.code_span(f"{call.get('file')}:{call.get('line')}")
                extra.append(f"called into {md.code_span(call.get('function') or '?')} ({where})")
            if extra:
                body += ["", "Failing: " + ", ".join(extra) + "."]
        body += ["", _LOCALIZATION_MD.get(loc["verdict"], "")]
        if loc.get("exception"):
            body += ["", md.fence(loc["exception"], "text", _LINE_CHARS)]

    if tb:
        lines = [visible(line, _LINE_CHARS) for line in _traceback_lines(tb)]
        body += ["", "#### Error", "", md.fence("\n".join(lines[-_ERROR_LINES:]), "text")]
    elif matches:
        body += ["", "#### Error", "", md.fence("\n".join(visible(e, _LINE_CHARS) for e in matches[0].get("evidence", [])), "text")]
    from gpudoctor.reports import codepatch

    patch_lines = codepatch.render_markdown(diag.get("code_patch"), "####")
    body += ["", *patch_lines] if patch_lines else []

    if entry:
        # The steps for this machine (from the bundle's scan) replace the entry's list and patch,
        # which cover every cause, as the scan's own report does.
        steps = diag.get("steps")
        body += ["", "#### Fix for this machine (from the scan)" if steps else "#### Fix", ""]
        body += [f"{i}. {md.prose(step)}" for i, step in enumerate(steps or entry["fix"], 1)]
        if entry.get("patch") and not steps:
            body += ["", md.fence(entry["patch"], entry.get("patch_lang") or "")]
        if entry.get("applicability") != "safe" and entry.get("fix_safety") and not steps:
            body += ["", f"Patch safety: {entry['applicability']}: {md.prose(entry['fix_safety'])}"]
        refs = entry.get("references") or []
        if refs:
            body += ["", "References: " + "; ".join(f"[{md.prose(r['title']).replace(']', ')')}](<{r['url']}>)" for r in refs)]
        body += ["", f"{'Every cause and fix' if steps else 'More'}: `gpudoctor explain {entry['id']}`"]
        if diag.get("platform"):
            p = diag["platform"]
            body += ["", f"#### On {md.prose(p.get('name') or '')}", "", md.prose(str(p.get("summary") or "")), ""]
            body += [f"{i}. {md.prose(step)}" for i, step in enumerate(p.get("steps") or [], 1)]
    elif notice is not None:
        body += ["", "#### What applies" if notice_kind == "platform" else "#### First steps", ""]
        body += [f"{i}. {md.prose(step)}" for i, step in enumerate(notice.get("steps") or [], 1)]
        refs = notice.get("references") or []
        if refs:
            body += ["", "References: " + "; ".join(f"[{md.prose(r['title']).replace(']', ')')}](<{r['url']}>)" for r in refs)]
    others = matches[1:8] if entry else matches[:7]
    if others:
        body += ["", "#### Also recognised in the output", "", f"| id | confidence | {_lines_label(diag)} | evidence |",
                 "|---|---:|---:|---|"]
        for m in others:
            ev = (m.get("evidence") or [""])[0]
            note = " (context)" if m.get("context_only") else ""
            if m.get("not_on_platform"):
                note = f" (does not apply on {m['not_on_platform']})"
            if m.get("consequence_of"):
                note = f" (after `{m['consequence_of'].get('id')}`)"
            body.append(f"| `{m['id']}` | {m.get('confidence', 0):.0%}{note} | {m.get('line') or ''} | {md.code_span(ev, table=True)} |")

    body += _scan_markdown(ticket.get("scan") or {})

    foot = ["", "---", "<sub>" + " · ".join([
        f"gpudoctor {visible(ticket['tool']['version'], 40)}",
        visible(ticket.get("created", ""), 40),
        "redacted: user names, host names, tokens, keys and hardware ids" if ticket.get("redacted") else "NOT redacted",
        f"command run in {md.code_span(ticket['command'].get('cwd', '?'))}",
    ]) + "</sub>", ""]

    fixed = "\n".join(head + body)
    log_lines = (ticket.get("output") or {}).get("log", "").rstrip("\n").split("\n")
    tail = _tail_section(log_lines, limit - len(fixed) - len("\n".join(foot)) - 2, bool(ticket.get("redacted")))
    out = "\n".join(head + body + tail + foot)
    if len(out) >= limit:  # the fixed parts alone are too long: cut the body, keep the footer
        room = limit - len("\n".join(foot)) - 200
        out = "\n".join([fixed[:max(room, 0)], "", f"*[ticket cut at {limit} characters]*", *foot])
    return out


def _traceback_lines(tb: dict[str, Any]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for f in tb.get("frames") or []:
        lines.append(f'  File "{f["file"]}", line {f["line"]}' + (f", in {f['function']}" if f.get("function") else ""))
        if f.get("code"):
            lines.append(f"    {f['code']}")
    lines.extend(tb.get("message") or [tb.get("exception", "")])
    return lines


def _scan_markdown(scan: dict[str, Any]) -> list[str]:
    probes = scan.get("probes") or []
    report = scan.get("report")
    if scan.get("error"):
        return ["", "#### This machine", "", f"The scan could not run: {md.code_span(scan['error'])}"]
    if not report:
        return []
    args = " ".join(f"--probe {p}" for p in probes)
    from gpudoctor.reports.render import environment_summary

    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    out = ["", f"#### This machine (`gpudoctor scan {args}`)", "", md.text(environment_summary(env)), "",
           "| Probe | Device | Status | Summary |", "|---|---|---|---|"]
    for r in report.get("results") or []:
        status = str(r.get("status"))
        status = f"**{status}**" if status in ("fail", "crashed", "timed_out") else status
        out.append(f"| {md.code_span(r.get('probe'), 60, table=True)} | {md.code_span(r.get('device') or '-', table=True)} | "
                   f"{status} | {md.code_span(r.get('summary') or '', table=True)} |")
    findings = [(r, f) for r in report.get("results") or [] for f in r.get("findings") or []]
    if findings:
        out.append("")
        for r, f in findings[:20]:
            out.append(f"- {md.code_span(f.get('kb_id'), 60)} from {md.code_span(r.get('probe'), 60)}: "
                       f"{md.code_span(f.get('summary') or '')}")
    return out


def _tail_section(lines: list[str], room: int, redacted: bool) -> list[str]:
    """The last lines of the output that fit in `room` characters, in a collapsed block."""
    lines_all = lines
    lines = [line[:_LINE_CHARS] for line in lines[-_TICKET_TAIL_LINES:] if line is not None]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines or room < 400:
        return []
    chosen: list[str] = []
    used = 300  # the wrapper
    for line in reversed(lines):
        if used + len(line) + 1 > room:
            break
        chosen.append(line)
        used += len(line) + 1
    chosen.reverse()
    if not chosen:
        return []
    # Numbered as the diagnosis numbers them: lines first..total of output.log.
    first, total = len(lines_all) - len(chosen) + 1, len(lines_all)
    return ["", f"<details><summary>Output (lines {first}-{total} of output.log{', redacted' if redacted else ''})"
                "</summary>", "", md.fence("\n".join(chosen), "text"), "", "</details>"]


def render_text(ticket: dict[str, Any], console: "Console", *, verbose: bool = False) -> None:
    """The diagnosis for a person at a terminal (gpudoctor writes it on stderr after the run)."""
    from rich.text import Text

    def say(text: str = "", style: str = "", indent: int = 0) -> None:
        console.print(Text(" " * indent + visible(text), style=style), highlight=False, soft_wrap=True)

    diag = ticket.get("diagnosis") or {}
    entry = diag.get("entry")
    matches = diag.get("matches") or []
    exit_ = ticket["exit"]
    verdict = diag.get("verdict") or {}
    notice, notice_kind = _notice_of(diag)
    via = " (from the synchronous re-run)" if diag.get("source") == "synchronous re-run" else ""
    say(f"gpudoctor: `{ticket['command']['line']}` {exit_['how']} after {exit_['duration_s']:.1f} s", "bold")
    if entry:
        best = matches[0] if matches else {}
        confidence = verdict.get("confidence") if verdict.get("confidence") is not None else best.get("confidence", 0)
        say(f"gpudoctor: {entry['id']} ({confidence:.0%}){via}: {entry['title']}", "bold red")
        lines = best.get("evidence_lines") or []
        for n, line in enumerate((best.get("evidence") or [])[:3]):
            at = lines[n] if n < len(lines) else None
            say(f"| {line}" + (f"  (line {at} of the output)" if at else ""), indent=2)
        platform = diag.get("platform")
        if platform:
            say(f"on {platform.get('name')}{_at_line(platform)}: this entry applies there too, with the platform's "
                "own tools (below)", indent=2)
    elif notice is not None:
        say(f"gpudoctor: {verdict.get('title') or notice_kind}{via}", "bold red")
        say(f"| {notice.get('evidence', '')}" + (f"  (line {notice['line']} of the output)" if notice.get("line") else ""),
            indent=2)
        say(str(notice.get("summary") or ""), indent=2)
    elif exit_.get("interrupted"):
        say("gpudoctor: interrupted; no known failure recognised in the output", "bold")
    else:
        say("gpudoctor: no known failure recognised in the output; `gpudoctor scan` probes this machine", "bold")
    tb = diag.get("traceback")
    if tb and tb.get("user_frame"):
        f = tb["user_frame"]
        say(f"the traceback blames {f['file']}:{f['line']}" + (f" in {f['function']}" if f.get("function") else "")
            + (f": {f['code']}" if f.get("code") else ""), indent=2)
    loc = ticket.get("localization")
    if loc:
        say(loc.get("summary", ""), "bold", indent=2)
        if loc.get("real") and loc["verdict"] == "moved":
            f = loc["real"]
            say(f"really failed at {f['file']}:{f['line']}" + (f": {f['code']}" if f.get("code") else ""), indent=4)
    from gpudoctor.reports import codepatch

    if codepatch.shows(diag.get("code_patch")):
        codepatch.render_text(diag["code_patch"], console)
    if entry:
        if verbose:
            say(entry["what"], indent=2)
        steps = diag.get("steps")
        say("Fix for this machine (from the scan):" if steps else "Fix:", "bold", indent=2)
        for i, step in enumerate(steps or entry["fix"], 1):
            say(f"{i}. {step}", indent=4)
        if verbose and entry.get("patch") and not steps:
            say("Patch:", "bold", indent=2)
            for line in entry["patch"].split("\n"):
                say(line, indent=4)
        say(f"{'Every cause and fix' if steps else 'More'}: gpudoctor explain {entry['id']}", "dim", indent=2)
        platform = diag.get("platform")
        if platform:
            say(f"On {platform.get('name')}:", "bold", indent=2)
            for i, step in enumerate(platform.get("steps") or [], 1):
                say(f"{i}. {step}", indent=4)
    elif notice is not None:
        say("What applies:" if notice_kind == "platform" else "First steps:", "bold", indent=2)
        for i, step in enumerate(notice.get("steps") or [], 1):
            say(f"{i}. {step}", indent=4)
        for ref in notice.get("references") or []:
            say(f"{ref.get('title')}: {ref.get('url')}", "dim", indent=2)
    others = [m for m in (matches[1:6] if entry else matches[:5])]
    if others:
        say("Also in the output: " + ", ".join(f"{m['id']} ({_match_note(m)}" + (f", line {m['line']})" if m.get("line") else ")")
                                                for m in others), "dim", indent=2)


def _notice_of(diag: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(the platform or the unrecognised CUDA error that is the verdict, its kind), or (None, "")."""
    kind = (diag.get("verdict") or {}).get("kind")
    if kind == "platform" and diag.get("platform"):
        return diag["platform"], "platform"
    if kind == "unrecognised" and diag.get("unrecognised"):
        return diag["unrecognised"], "unrecognised"
    return None, ""


def _at_line(notice: Mapping[str, Any]) -> str:
    return f" (line {notice['line']} of the output)" if notice.get("line") else ""


def _match_note(m: Mapping[str, Any]) -> str:
    if m.get("consequence_of"):
        return f"after {m['consequence_of'].get('id')}"
    if m.get("not_on_platform"):
        return f"does not apply on {m['not_on_platform']}"
    return "context" if m.get("context_only") else f"{m.get('confidence', 0):.0%}"


def render_json(ticket: dict[str, Any]) -> str:
    return json_text(json.dumps(ticket, indent=2, ensure_ascii=False)) + "\n"


