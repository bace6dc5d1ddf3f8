"""Renderers: a `Report` as a terminal page (rich), as JSON, and as Markdown for a bug ticket.
(`gpudoctor explain`'s renderers live with the explanation, in gpudoctor.explain.explanation.)

The three report renderers are siblings behind `RENDERERS` (one per name in `FORMATS`); a test
proves every format is handled. Renderers never print on their own and never decide on colour: the
terminal renderer writes to the `rich.console.Console` it is given (colour only if that console has
a colour system, which rich turns off on a non-TTY and under NO_COLOR), the others return text.

The terminal page puts the verdict first and last (`verdict`): healthy, or the one thing to fix
and the command that tells its full story. Between them: one line per probe, one line per finding
with its `gpudoctor explain ID` command, and a one-line environment summary. `verbose=True` adds
the evidence, fix steps, patches, crash tails and the full environment. Copy-paste is a contract:
ids, commands, patches and evidence are printed whole (`soft_wrap`: the terminal may wrap them for
display, nothing inserts a newline or cuts them). Probe and finding summaries are never cut either:
they wrap at word boundaries under their own column (a log file or CI gets 80 columns), or take
lines of their own where the column would be too narrow, with `-v` too. Probes skipped for one
same reason share one row (`_grouped`): a missing torch is said once, not once per probe.

Everything a report carries came from probes, workers or a file someone sent: it is untrusted. It is
shown through `gpudoctor.safetext.visible` (escape sequences removed, control characters made
visible) and bounded (`SUMMARY_LIMIT` and friends) in every renderer, so a 20 MB exception message
renders in bounded time; Markdown escapes it (gpudoctor.reports.markdown) so that it cannot open
HTML, links, mentions, tables or code fences of its own.

A finding's fix and patch come from the knowledge base (`gpudoctor.knowledge.kb.load_entry`), looked up when
rendering; when an entry is missing or the knowledge base cannot load, the finding still shows its id
and the command `gpudoctor explain ID`. `kb=` replaces the lookup (tests pin output with it).

`report_from_dict` (from the model) rebuilds a `Report` from its JSON form, so saved and redacted
reports render too.
"""
from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from gpudoctor.probes.base import Status
from gpudoctor.reports import markdown as md
from gpudoctor.reports.model import (  # noqa: F401 (re-exported)
    PROBLEM_STATUSES, Report, Verdict, lookup, report_from_dict,
)
from gpudoctor.safetext import json_text, visible

if TYPE_CHECKING:
    from rich.console import Console

FORMATS: tuple[str, ...] = ("terminal", "json", "markdown")

KbLookup = Callable[[str], Any]

# Bounds on untrusted text, in every renderer. JSON keeps what the report holds (the runner bounds
# it when it records it); these bound what a person is shown.
SUMMARY_LIMIT = 2000  # characters of a probe's or a finding's summary
EVIDENCE_LINE_LIMIT = 1000  # characters of one evidence line
EVIDENCE_LINES = 20  # evidence lines per finding
TAIL_LINES = 12  # lines of a crashed probe's stderr tail
TAIL_LIMIT = 4096  # characters of that tail
VALUE_LIMIT = 1000  # characters of one environment value
ENV_JSON_LIMIT = 30000  # characters of the environment JSON in a Markdown report

_STATUS_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIPPED: "dim",
    Status.CRASHED: "bold red",
    Status.TIMED_OUT: "bold magenta",
}
_STATUS_WORD = {
    Status.PASS: "pass",
    Status.WARN: "warn",
    Status.FAIL: "FAIL",
    Status.SKIPPED: "skipped",
    Status.CRASHED: "CRASHED",
    Status.TIMED_OUT: "TIMED OUT",
}
_TALLY_WORD = {
    Status.PASS: "passed",
    Status.WARN: "warned",
    Status.FAIL: "failed",
    Status.SKIPPED: "skipped",
    Status.CRASHED: "crashed",
    Status.TIMED_OUT: "timed out",
}
_CODE_SPAN = re.compile(r"`[^`\n]{1,400}`")
_KEY_PACKAGES = (
    "torch", "torchvision", "xformers", "flash-attn", "flash-attn-3", "sageattention", "triton",
    "pytorch-triton", "diffusers", "transformers", "accelerate", "torchao", "bitsandbytes",
)


# --- shared pieces -------------------------------------------------------------------------------


def load_kb_entry(kb_id: str) -> Any:
    """The knowledge-base entry for `kb_id`, or None when it is missing or the base cannot load."""
    try:
        from gpudoctor.knowledge.kb import load_entry

        return load_entry(kb_id)
    except Exception:  # a broken entry file must not stop a report from rendering
        return None


def one_line(text: Any, limit: int = SUMMARY_LIMIT) -> str:
    """Untrusted text as one visible line of at most about `limit` characters."""
    return " ".join(visible(str(text), limit).split())


COLUMN_MIN = 30  # the narrowest column a summary wraps in; narrower, it gets lines of its own


def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken between words only: a longer word (a
    URL, a path, a command) is kept whole, never folded, and inline code (`...`) is one word."""
    # A no-break space is not a place to wrap (textwrap breaks at ASCII whitespace only).
    text = _CODE_SPAN.sub(lambda m: m.group().replace(" ", "\xa0"), text)
    lines = textwrap.wrap(text, width=max(width, 1), break_long_words=False, break_on_hyphens=False) or [""]
    return [line.replace("\xa0", " ") for line in lines]


def _lines(text: Any, max_lines: int, limit: int) -> list[str]:
    """The last `max_lines` visible lines of untrusted multi-line text, each at most `limit`."""
    raw = str(text or "")
    raw = raw[-(max_lines * limit):]  # bound the work before splitting
    return [visible(line, limit) for line in raw.splitlines()[-max_lines:]]


def _evidence(summary: str, evidence: tuple[str, ...] | list[str]) -> list[str]:
    """Evidence lines to show: visible and bounded; an item that repeats an earlier one, or the
    summary shown above it, is dropped (lines inside an item are kept as they are)."""
    seen = {one_line(summary)}
    out: list[str] = []
    for item in list(evidence)[: EVIDENCE_LINES * 4]:
        text = visible(str(item), EVIDENCE_LINE_LIMIT)
        key = " ".join(text.split())
        if not key or key in seen:
            continue
        seen.add(key)
        out.extend(line.rstrip() for line in text.splitlines())
    return out[:EVIDENCE_LINES]


def _reason(section: Any) -> str | None:
    """The "why" of a section that could not be collected, or None if it was."""
    if isinstance(section, dict) and section.get("available") is False:
        return f"not available: {section.get('reason', 'unknown')}"
    if isinstance(section, str) and section.startswith("not available"):
        return section
    return None


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if isinstance(value, (int, float)) else "?"


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _where(result: Any) -> str:
    return f" on {result.device}" if result.device else ""


def environment_brief(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The environment in a dozen labelled lines, tolerant of any section being missing."""
    lines: list[tuple[str, str]] = []
    system = env.get("system")
    if _reason(system) or not isinstance(system, dict):
        lines.append(("system", _reason(system) or "not collected"))
    else:
        text = f"{system.get('distribution')}, kernel {system.get('kernel')}, {system.get('machine')}"
        if lookup(system, "container", "detected"):
            text += f", in a {lookup(system, 'container', 'kind')} container"
        if lookup(system, "wsl", "detected"):
            wsl = system["wsl"]
            text += f", WSL{wsl.get('version')} (GPU {'forwarded' if wsl.get('gpu_forwarded') else 'NOT forwarded: no /dev/dxg'})"
        lines.append(("system", text))

    python = env.get("python")
    if _reason(python) or not isinstance(python, dict):
        lines.append(("python", _reason(python) or "not collected"))
    else:
        kind = "venv" if python.get("venv") else "conda" if python.get("conda") else "system"
        lines.append(("python", f"{python.get('version')} ({kind}) {python.get('executable') or python.get('path')}"))

    torch = env.get("torch")
    if _reason(torch) or not isinstance(torch, dict):
        lines.append(("torch", _reason(torch) or "not collected"))
    else:
        built = torch.get("built_with_cuda")
        text = f"{torch.get('version')}, " + (f"built for CUDA {built}" if built else "no CUDA build")
        cudnn = torch.get("cudnn")
        if isinstance(cudnn, dict):
            text += f", cuDNN {cudnn.get('loaded')} (built {cudnn.get('compiled')})"
        lines.append(("torch", text))
        if torch.get("cuda_available"):
            for dev in torch.get("devices") or []:
                lines.append((
                    f"cuda:{dev.get('index')}",
                    f"{dev.get('name')}, sm {dev.get('capability')}, {dev.get('sm_count')} SMs, {_gib(dev.get('total_memory'))}",
                ))
        else:
            lines.append(("cuda", f"not available: {torch.get('cuda_unavailable_reason')}"))
        arch = torch.get("arch_list")
        if isinstance(arch, list) and arch:
            lines.append(("arch list", " ".join(arch)))

    nvml = env.get("nvml")
    if _reason(nvml) or not isinstance(nvml, dict):
        lines.append(("driver", _reason(nvml) or "not collected"))
    else:
        lines.append(("driver", f"{nvml.get('driver_version')} (supports CUDA {nvml.get('cuda_driver_version')})"))
        for gpu in nvml.get("gpus") or []:
            if not isinstance(gpu, dict):
                continue
            mem = gpu.get("memory") if isinstance(gpu.get("memory"), dict) else {}
            text = f"{gpu.get('name')}, sm {gpu.get('capability')}, {_gib(mem.get('used'))} of {_gib(mem.get('total'))} used"
            throttle = [t for t in gpu.get("throttle_reasons") or [] if t != "gpu_idle"] if isinstance(gpu.get("throttle_reasons"), list) else []
            if throttle:
                text += f", throttled: {', '.join(throttle)}"
            ecc = gpu.get("ecc")
            if isinstance(ecc, dict) and (ecc.get("volatile_uncorrected") or 0) not in (0, None) and isinstance(ecc.get("volatile_uncorrected"), int):
                text += f", {ecc['volatile_uncorrected']} uncorrected ECC errors"
            lines.append((f"gpu {gpu.get('index')}", text))

    installed = lookup(env, "packages", "installed")
    if isinstance(installed, dict):
        key = [f"{n} {installed[n]['version']}" for n in _KEY_PACKAGES if n in installed]
        nvidia = [n for n in installed if n.startswith("nvidia-") and n != "nvidia-ml-py"]
        if nvidia:
            key.append(f"{len(nvidia)} nvidia-* wheels")
        lines.append(("packages", ", ".join(key) or "none of interest"))
        dups = [f"{n} ({installed[n]['version']} and {', '.join(installed[n]['duplicates'])})" for n in installed if installed[n].get("duplicates")]
        if dups:
            lines.append(("installed twice", "; ".join(dups)))
    elif _reason(env.get("packages")):
        lines.append(("packages", _reason(env.get("packages")) or ""))

    libs = env.get("cuda_libraries")
    if isinstance(libs, dict) and isinstance(libs.get("libraries"), dict):
        loaded = [
            f"{name} {lookup(entry, 'loaded')[0].get('version') or '?'}"
            for name, entry in libs["libraries"].items()
            if isinstance(lookup(entry, "loaded"), list) and lookup(entry, "loaded")
        ]
        lines.append(("CUDA libs loaded", ", ".join(loaded) or "none"))
        for flag in libs.get("flags") or []:
            lines.append((f"{flag.get('kind')}!", str(flag.get("detail"))))

    toolchain = env.get("toolchain")
    if isinstance(toolchain, dict) and not _reason(toolchain):
        tools = [f"{name} {tool.get('version') or '?'}" for name, tool in toolchain.items()
                 if isinstance(tool, dict) and tool.get("path")]
        lines.append(("toolchain", ", ".join(tools) or "no compiler or build tool on PATH"))

    env_vars = env.get("env_vars")
    if isinstance(env_vars, dict) and env_vars:
        lines.append(("env", ", ".join(f"{k}={v}" for k, v in env_vars.items())))
    return lines


def environment_summary(env: dict[str, Any]) -> str:
    """torch, CUDA, cuDNN, driver, GPU and Python on one line: what people look for first."""
    parts: list[str] = []
    torch = env.get("torch")
    if isinstance(torch, dict) and not _reason(torch):
        built = torch.get("built_with_cuda")
        parts.append(f"torch {torch.get('version')}" + (f" (CUDA {built})" if built else " (CPU build)"))
        cudnn = torch.get("cudnn")
        loaded = cudnn.get("loaded") or cudnn.get("version") if isinstance(cudnn, dict) else None
        if loaded:
            parts.append(f"cuDNN {loaded}")
    else:
        parts.append("torch not available")
    nvml = env.get("nvml")
    if isinstance(nvml, dict) and not _reason(nvml):
        parts.append(f"driver {nvml.get('driver_version')} (CUDA {nvml.get('cuda_driver_version')})")
    else:
        parts.append("no NVIDIA driver")
    gpus: dict[str, int] = {}
    devices = lookup(env, "torch", "devices")
    if not isinstance(devices, list) or not devices:
        devices = lookup(env, "nvml", "gpus")
    for dev in devices if isinstance(devices, list) else []:
        if isinstance(dev, dict) and dev.get("name"):
            label = f"{dev.get('name')} (sm {dev.get('capability')})"
            gpus[label] = gpus.get(label, 0) + 1
    parts.append(", ".join(f"{n}x {label}" if n > 1 else label for label, n in gpus.items()) or "no GPU visible")
    version = lookup(env, "python", "version")
    if version:
        parts.append(f"Python {version}")
    return one_line(", ".join(str(p) for p in parts), VALUE_LIMIT)


def _tally(report: Report) -> str:
    counts = {s: 0 for s in Status}
    for r in report.results:
        counts[r.status] += 1
    return ", ".join(f"{n} {_TALLY_WORD[s]}" for s, n in counts.items() if n)


def verdict(report: Report) -> Verdict:
    """Healthy, or the one thing to fix first (`Report.verdict`, which the JSON report carries)."""
    return report.verdict()


def tally_line(report: Report) -> str:
    """"12 probe runs on cpu at the quick level in 1.27 s: 7 passed, 1 warned, 4 skipped" (the
    level only when the report has one: reports older than schema 1.3 do not)."""
    devices = sorted({one_line(r.device, 100) for r in report.results if r.device})
    on = f" on {', '.join(devices)}" if devices else ""
    runs = len(report.results)
    level = f" at the {one_line(report.level, 20)} level" if report.level else ""
    return (f"{runs} probe run{'s' if runs != 1 else ''}{on}{level} in {_duration(report.duration_s)}: "
            f"{_tally(report) or 'none'}")


# --- terminal ------------------------------------------------------------------------------------


def render_terminal(report: Report, console: "Console", *, kb: KbLookup | None = None,
                    verbose: bool = False) -> None:
    """Verdict, one line per probe, findings with their explain command, the environment in one
    line, and the verdict again. `verbose` adds evidence, fixes, patches, crash tails and the whole
    environment."""
    from rich.text import Text

    kb = kb or load_kb_entry
    width = max(console.width, 40)

    def say(*parts: Any, indent: int = 0) -> None:
        """One line: (text, style) parts, printed whole (the terminal wraps it for display)."""
        line = Text(" " * indent)
        for part in parts:
            text, style = part if isinstance(part, tuple) else (part, "")
            line.append(text, style=style)
        console.print(line, soft_wrap=True, highlight=False)

    def wrapped(text: str, indent: int, bullet: str = "") -> None:
        """Prose wrapped at word boundaries with a hanging indent; a word longer than the line (a
        URL, a path, a command) is kept whole, never folded."""
        for n, line in enumerate(wrap(text, max(width - indent - len(bullet), 20))):
            say(bullet if n == 0 else " " * len(bullet), line, indent=indent)

    def column(head: list[Any], start: int, text: str, own_indent: int) -> None:
        """`head` (parts for `say`), then `text` from column `start`, wrapped under itself; where
        fewer than COLUMN_MIN cells are left there, `text` takes lines of its own at `own_indent`.
        Never cut: the summary is what the reader came for."""
        if width - start >= COLUMN_MIN:
            first, *rest = wrap(text, width - start)
            say(*head, first)
            for line in rest:
                say(line, indent=start)
            return
        say(*head)
        for line in wrap(text, width - own_indent):
            say(line, indent=own_indent)

    v = verdict(report)
    style = "bold green" if v.line == "healthy" else "bold yellow" if v.healthy else "bold red"
    say(("gpudoctor: ", "bold"), (v.line, style))
    say()

    # One row per probe; the summary wraps in its column, at every verbosity (a log or CI gets 80
    # columns). Probes skipped for one same reason (torch cannot be imported, CUDA is not usable)
    # share one row: one cause, said once. The device column only when probes ran on different
    # devices (the verdict names the device).
    rows = [(one_line(r.probe, 100), one_line(r.device or "-", 100), r.status, _duration(r.duration_s),
             one_line(r.summary), ()) for r in _grouped(report.results)]
    if rows:
        w_id = max(len(r[0]) for r in rows)
        w_dev = max(len(r[1]) for r in rows) + 2 if len({r[1] for r in rows}) > 1 else 0
        w_status = max(len(_STATUS_WORD[r[2]]) for r in rows)
        w_time = max(len(r[3]) for r in rows)
        start = 2 + w_id + 2 + w_dev + w_status + 2 + w_time + 2
        for probe, device, status, duration, summary, _ in rows:
            head = [f"  {probe:<{w_id}}  " + (f"{device:<{w_dev}}" if w_dev else ""),
                    (f"{_STATUS_WORD[status]:<{w_status}}", _STATUS_STYLE[status]), f"  {duration:>{w_time}}  "]
            column(head, start, summary, 4)
    for line in wrap(tally_line(report), width - 4):
        say((line, "dim"), indent=2)

    # Errors, then probes that broke without a finding, then warnings: each an id (never cut), one
    # line (cut to fit), and the command that tells the full story.
    findings = report.findings
    errors = [(r, f) for r, f in findings if f.severity == "error"]
    warnings = [(r, f) for r, f in findings if f.severity != "error"]
    broken = [r for r in report.results if r.status in PROBLEM_STATUSES and not r.findings]
    if findings or broken:
        say()
        say(("Findings" if findings else "Problems", "bold underline"))
    label_w = 10
    for result, finding in errors:
        _finding_line(say, wrapped, column, result, finding, kb, label_w, verbose, width)
    for r in broken:
        probe = one_line(r.probe, 100)
        word = r.status.value.replace("_", " ")
        head = [("  ", ""), (f"{word:<{label_w}}", _STATUS_STYLE[r.status]), (f"{probe}{_where(r)}", "bold"), ": "]
        column(head, 2 + label_w + len(f"{probe}{_where(r)}: "), one_line(r.summary), 2 + label_w)
        if not verbose:
            say((f"gpudoctor scan --probe {probe} -v", "dim"), indent=2 + label_w)
            continue
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}" if r.exit_code is not None else ""
        if how:
            say((how, "dim"), indent=2 + label_w)
        for line in _lines(r.stderr_tail, TAIL_LINES, TAIL_LIMIT):
            say(("| ", "dim"), line, indent=2 + label_w)
    for result, finding in warnings:
        _finding_line(say, wrapped, column, result, finding, kb, label_w, verbose, width)

    say()
    say(("Environment: ", "bold"), environment_summary(report.environment))  # one line, to copy whole
    if verbose:
        brief = [(one_line(k, 100), one_line(v, VALUE_LIMIT)) for k, v in environment_brief(report.environment)]
        w_key = max((len(k) for k, _ in brief), default=0)
        for key, value in brief:
            column([("  ", ""), (f"{key:<{w_key}}", "bold red" if key.endswith("!") else "bold"), "  "],
                   2 + w_key + 2, value, 4)
        if report.invocation:
            say(("made by: ", "dim"), one_line(report.invocation.get("command", ""), VALUE_LIMIT), indent=2)
    else:
        say(("-v: evidence, fixes, patches, environment; --format md -o report.md: a ticket", "dim"))
    say()
    if v.command:
        say(("Next: ", "bold"), v.command)
    say(("gpudoctor: ", "bold"), (v.line, style))


@dataclass(frozen=True)
class _Row:
    """A row of the probe table: one result, or several skipped for the same reason."""

    probe: str
    device: str | None
    status: Status
    duration_s: float
    summary: str


def _grouped(results: list[Any]) -> list[Any]:
    """The results as table rows: probes skipped with the same summary (two or more) become one
    row, where the first of them stood, that names how many and which."""
    reasons: dict[str, list[Any]] = {}
    for r in results:
        if r.status is Status.SKIPPED:
            reasons.setdefault(one_line(r.summary), []).append(r)
    rows: list[Any] = []
    for r in results:
        same = reasons.get(one_line(r.summary), []) if r.status is Status.SKIPPED else []
        if len(same) < 2:
            rows.append(r)
        elif r is same[0]:
            devices = sorted({one_line(x.device, 100) for x in same if x.device})
            names = ", ".join(one_line(x.probe, 100) for x in same)
            rows.append(_Row(f"{len(same)} probes", ", ".join(devices) or None, Status.SKIPPED,
                             sum(x.duration_s for x in same), f"{names}: {one_line(r.summary)}"))
    return rows


def _finding_line(say: Callable[..., None], wrapped: Callable[..., None], column: Callable[..., None],
                  result: Any, finding: Any, kb: KbLookup, label_w: int, verbose: bool, width: int) -> None:
    kb_id = one_line(finding.kb_id, 100)
    severity = "error" if finding.severity == "error" else "warning"
    summary = one_line(finding.summary)
    head = [("  ", ""), (f"{severity:<{label_w}}", "bold red" if severity == "error" else "bold yellow"),
            (kb_id, "bold"), "  "]
    column(head, 2 + label_w + len(kb_id) + 2, summary, 2 + label_w)
    if finding.steps and not verbose:  # the step for this machine first; -v shows them all
        wrapped(one_line(finding.steps[0]), 2 + label_w)
    say((f"gpudoctor explain {kb_id}", "dim"), indent=2 + label_w)
    if verbose:
        _finding_details(say, wrapped, result, finding, kb(finding.kb_id), 2 + label_w, width)


def _finding_details(say: Callable[..., None], wrapped: Callable[..., None], result: Any, finding: Any,
                     entry: Any, indent: int, width: int) -> None:
    """Under -v: the evidence, the entry's fix steps and its patch (at column 0, to copy as is)."""
    for line in _evidence(finding.summary, finding.evidence):
        say(("| ", "dim"), line, indent=indent)
    if entry is None:
        say(("No knowledge-base entry loaded for this id.", "dim"), indent=indent)
        return
    for line in wrap(one_line(entry.title), max(width - indent, 20)):
        say((line, "bold"), indent=indent)
    # A probe that knows which cause this is gives the steps for this machine; the entry's list
    # and patch cover every cause (some impossible here, a torch downgrade among them) and stay
    # one command away.
    for n, step in enumerate(finding.steps or entry.fix, 1):
        wrapped(str(step), indent, f"{n}) ")
    if finding.steps:
        say((f"every cause and fix: gpudoctor explain {one_line(finding.kb_id, 100)}", "dim"), indent=indent)
    patch = "" if finding.steps else str(getattr(entry, "patch", "") or "")
    if patch:
        lang = getattr(entry, "patch_lang", None) or "text"
        safety = getattr(entry, "applicability", None)
        say((f"Patch ({lang}" + (f", {safety}" if safety else "") + "):", "bold"), indent=indent)
        for line in patch.splitlines():
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            say((line, style))
    say()


# --- JSON ----------------------------------------------------------------------------------------


def render_json(report: Report) -> str:
    """The report as pretty JSON (with `schema_version`), ending in a newline."""
    return json_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str)) + "\n"


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that `render_json` output follows (reports/schema.json)."""
    from importlib import resources

    return json.loads(resources.files("gpudoctor.reports").joinpath("schema.json").read_text(encoding="utf-8"))


# --- Markdown ------------------------------------------------------------------------------------


def render_markdown(report: Report, *, kb: KbLookup | None = None) -> str:
    """A bug-ticket body: the environment in one line, the verdict, the results table, findings with
    fixes, crashes, and a collapsible environment (brief list plus the full environment JSON)."""
    kb = kb or load_kb_entry
    v = verdict(report)
    made = f" · {md.code_span(report.invocation.get('command', ''), 500)}" if report.invocation else ""
    out: list[str] = [
        f"**Environment:** {md.text(environment_summary(report.environment), VALUE_LIMIT)}",
        "",
        "## gpudoctor report",
        "",
        f"**{md.text(v.line)}**" + (f" · next: {md.code_span(v.command, 300)}" if v.command else ""),
        "",
        f"gpudoctor {md.text(report.tool_version, 100)} · {md.text(report.created, 100)}"
        + (" · redacted" if report.redacted else "") + f" · {md.text(tally_line(report), 500)}" + made,
        "",
        "| Probe | Device | Status | Time | Summary |",
        "|---|---|---|---:|---|",
    ]
    for r in report.results:
        status = f"**{r.status.value}**" if r.status in PROBLEM_STATUSES else r.status.value
        out.append(f"| {md.cell(r.probe)} | {md.cell(r.device or '-')} | {status} | {_duration(r.duration_s)} | {md.cell(r.summary)} |")

    findings = report.findings
    if findings:
        out += ["", f"### Findings ({len(findings)})"]
    for result, finding in findings:
        out += ["", f"#### {md.code_span(finding.kb_id)}: {md.text(finding.summary)}", ""]
        out.append(f"{md.text(finding.severity, 20, start=True)} from {md.code_span(result.probe)}"
                   + (f" on {md.code_span(result.device)}" if result.device else ""))
        evidence = _evidence(finding.summary, finding.evidence)
        if evidence:
            out += ["", md.fence("\n".join(evidence))]
        entry = kb(finding.kb_id)
        if entry is None:
            out += ["", f"Details: {md.code_span('gpudoctor explain ' + one_line(finding.kb_id, 100))}"]
            continue
        out += ["", f"**{md.prose(entry.title)}**", ""]
        out += [f"{i}. {md.prose(step)}" for i, step in enumerate(finding.steps or entry.fix, 1)]
        if entry.patch and not finding.steps:  # the entry's patch is for every cause, as its list is
            out += ["", md.fence(entry.patch, entry.patch_lang or "")]
        out += ["", f"Details: {md.code_span('gpudoctor explain ' + one_line(finding.kb_id, 100))}"]

    for r in report.results:
        if r.status not in (Status.CRASHED, Status.TIMED_OUT):
            continue
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}"
        out += ["", f"#### {md.code_span(r.probe)} {r.status.value.replace('_', ' ')} ({md.text(how, 100)})"]
        tail = "\n".join(_lines(r.stderr_tail, TAIL_LINES, TAIL_LIMIT))
        if tail:
            out += ["", md.fence(tail)]

    out += ["", "<details><summary>Environment</summary>", ""]
    out += [f"- **{md.text(key, 100)}**: {md.text(value, VALUE_LIMIT)}" for key, value in environment_brief(report.environment)]
    env_json = json_text(json.dumps(report.environment, indent=2, ensure_ascii=False, default=str))
    if len(env_json) > ENV_JSON_LIMIT:
        env_json = env_json[:ENV_JSON_LIMIT] + f"\n... ({len(env_json) - ENV_JSON_LIMIT} more characters in the JSON report)"
    out += ["", md.fence(env_json, "json"), "", "</details>", ""]
    return "\n".join(out)


RENDERERS: dict[str, Callable[..., Any]] = {
    "terminal": render_terminal,
    "json": render_json,
    "markdown": render_markdown,
}
