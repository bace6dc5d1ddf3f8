"""Renderers: a `Report` as a terminal page (rich), as JSON, and as Markdown for a bug ticket.

The three are siblings behind `RENDERERS` (one per name in `FORMATS`); a test proves every format
is handled. Renderers never print on their own and never decide on colour: the terminal renderer
writes to the `rich.console.Console` it is given (colour only if that console has a colour system,
which rich turns off on a non-TTY and under NO_COLOR), the others return text.

A finding's fix and patch come from the knowledge base (`gpudoctor.kb.load_entry`), looked up when
rendering; when an entry is missing or the knowledge base cannot load, the finding still shows its id
and the command `gpudoctor explain ID`. `kb=` replaces the lookup (tests pin output with it).

`report_from_dict` (from the model) rebuilds a `Report` from its JSON form, so saved and redacted reports render too.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from gpudoctor.probes.base import Status
from gpudoctor.reports.model import Report, report_from_dict  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from rich.console import Console

FORMATS: tuple[str, ...] = ("terminal", "json", "markdown")

KbLookup = Callable[[str], Any]

_STATUS_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIPPED: "dim",
    Status.CRASHED: "bold red",
    Status.TIMED_OUT: "bold magenta",
}
_KEY_PACKAGES = (
    "torch", "torchvision", "xformers", "flash-attn", "flash-attn-3", "sageattention", "triton",
    "pytorch-triton", "diffusers", "transformers", "accelerate", "torchao", "bitsandbytes",
)
_STDERR_LINES = 12


# --- shared pieces -------------------------------------------------------------------------------


def load_kb_entry(kb_id: str) -> Any:
    """The knowledge-base entry for `kb_id`, or None when it is missing or the base cannot load."""
    try:
        from gpudoctor.kb import load_entry

        return load_entry(kb_id)
    except Exception:  # a broken entry file must not stop a report from rendering
        return None


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


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


def environment_brief(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The environment in a dozen labelled lines, tolerant of any section being missing."""
    lines: list[tuple[str, str]] = []
    system = env.get("system")
    if _reason(system) or not isinstance(system, dict):
        lines.append(("system", _reason(system) or "not collected"))
    else:
        text = f"{system.get('distribution')}, kernel {system.get('kernel')}, {system.get('machine')}"
        if _get(system, "container", "detected"):
            text += f", in a {_get(system, 'container', 'kind')} container"
        if _get(system, "wsl", "detected"):
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

    installed = _get(env, "packages", "installed")
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
            f"{name} {_get(entry, 'loaded')[0].get('version') or '?'}"
            for name, entry in libs["libraries"].items()
            if isinstance(_get(entry, "loaded"), list) and _get(entry, "loaded")
        ]
        lines.append(("CUDA libs loaded", ", ".join(loaded) or "none"))
        for flag in libs.get("flags") or []:
            lines.append((f"{flag.get('kind')}!", str(flag.get("detail"))))

    env_vars = env.get("env_vars")
    if isinstance(env_vars, dict) and env_vars:
        lines.append(("env", ", ".join(f"{k}={v}" for k, v in env_vars.items())))
    return lines


def _counts_line(report: Report) -> str:
    counts = {k: v for k, v in report.counts().items() if v}
    parts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()) or "no probes ran"
    return f"{len(report.results)} probe runs: {parts}; {_duration(report.duration_s)}"


# --- terminal ------------------------------------------------------------------------------------


def render_terminal(report: Report, console: "Console", *, kb: KbLookup | None = None) -> None:
    """Summary table, then each finding with its fix and patch, crashes, and the environment."""
    from rich import box
    from rich.padding import Padding
    from rich.syntax import Syntax
    from rich.table import Table
    from rich.text import Text

    kb = kb or load_kb_entry

    # Text objects throughout: probe output may contain "[...]", which rich would read as markup.
    def say(renderable: Any = "", indent: int = 0) -> None:
        if isinstance(renderable, str):
            renderable = Text(renderable)
        console.print(Padding(renderable, (0, 0, 0, indent)) if indent else renderable, highlight=False)

    title = Text(f"gpudoctor {report.tool_version}", style="bold")
    title.append(f"  {report.created}" + ("  (redacted)" if report.redacted else ""), style="dim")
    say(title)

    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    table.add_column("Probe", no_wrap=True)
    table.add_column("Device", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Time", justify="right", no_wrap=True)
    table.add_column("Summary", overflow="fold")
    for r in report.results:
        table.add_row(
            Text(r.probe),
            Text(r.device or "-"),
            Text(r.status.value.upper(), style=_STATUS_STYLE[r.status]),
            Text(_duration(r.duration_s)),
            Text(r.summary),
        )
    say(table)
    say(Text(_counts_line(report), style="bold red" if report.has_problems else "bold green"))

    findings = report.findings
    if findings:
        say()
        say(Text(f"Findings ({len(findings)})", style="bold underline"))
    for n, (result, finding) in enumerate(findings, 1):
        say()
        head = Text(f"{n}. ")
        head.append(f"[{finding.kb_id}]", style="bold red" if finding.severity == "error" else "bold yellow")
        head.append(f" {finding.summary}")
        say(head)
        say(Text(f"{finding.severity} from {result.probe}" + (f" on {result.device}" if result.device else ""), style="dim"), 3)
        for line in finding.evidence:
            say(Text(f"| {line}"), 3)
        entry = kb(finding.kb_id)
        if entry is None:
            say(Text(f"No knowledge-base entry loaded; run `gpudoctor explain {finding.kb_id}`.", style="dim"), 3)
            continue
        say(Text(entry.title, style="bold"), 3)
        if entry.fix:
            say(Text("Fix:", style="bold"), 3)
        for i, step in enumerate(entry.fix, 1):
            say(Text(f"{i}) {step}"), 3)
        if entry.patch:
            say(Text("Patch:", style="bold"), 3)
            lexer = entry.patch_lang or "text"
            say(Syntax(entry.patch, lexer, theme="ansi_dark", background_color="default", word_wrap=True), 5)
        say(Text(f"More: gpudoctor explain {finding.kb_id}", style="dim"), 3)

    for r in report.results:
        if r.status not in (Status.CRASHED, Status.TIMED_OUT):
            continue
        say()
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}" if r.exit_code is not None else "no exit status"
        where = f" on {r.device}" if r.device else ""
        say(Text(f"{r.probe} {r.status.value.replace('_', ' ')} ({how}){where}", style=_STATUS_STYLE[r.status]))
        for line in (r.stderr_tail or "").splitlines()[-_STDERR_LINES:]:
            say(Text(f"| {line}"), 3)

    brief = environment_brief(report.environment)
    if brief:
        say()
        say(Text("Environment", style="bold underline"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for key, value in brief:
            grid.add_row(Text(key, style="bold red" if key.endswith("!") else "bold"), Text(value))
        say(grid, 2)


# --- JSON ----------------------------------------------------------------------------------------


def render_json(report: Report) -> str:
    """The report as pretty JSON (with `schema_version`), ending in a newline."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that `render_json` output follows (reports/schema.json)."""
    from importlib import resources

    return json.loads(resources.files("gpudoctor.reports").joinpath("schema.json").read_text(encoding="utf-8"))


# --- Markdown ------------------------------------------------------------------------------------


def _cell(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip() or " "


def _fence(text: str, lang: str = "") -> str:
    # A fence longer than any backtick run inside, so pasted error text cannot close it early.
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def render_markdown(report: Report, *, kb: KbLookup | None = None) -> str:
    """A bug-ticket body: results table, findings with fixes, crashes, and a collapsible
    environment (brief list plus the full environment JSON)."""
    kb = kb or load_kb_entry
    out: list[str] = [
        "## gpudoctor report",
        "",
        f"gpudoctor {report.tool_version} · {report.created}" + (" · redacted" if report.redacted else "")
        + f" · {_counts_line(report)}",
        "",
        "| Probe | Device | Status | Time | Summary |",
        "|---|---|---|---:|---|",
    ]
    for r in report.results:
        status = f"**{r.status.value}**" if r.status in (Status.FAIL, Status.CRASHED, Status.TIMED_OUT) else r.status.value
        out.append(f"| {_cell(r.probe)} | {_cell(r.device or '-')} | {status} | {_duration(r.duration_s)} | {_cell(r.summary)} |")

    findings = report.findings
    if findings:
        out += ["", f"### Findings ({len(findings)})"]
    for result, finding in findings:
        out += ["", f"#### `{finding.kb_id}`: {finding.summary}", ""]
        out.append(f"{finding.severity} from `{result.probe}`" + (f" on `{result.device}`" if result.device else ""))
        if finding.evidence:
            out += ["", _fence("\n".join(finding.evidence))]
        entry = kb(finding.kb_id)
        if entry is None:
            out += ["", f"Details: `gpudoctor explain {finding.kb_id}`"]
            continue
        out += ["", f"**{entry.title}**", ""]
        out += [f"{i}. {step}" for i, step in enumerate(entry.fix, 1)]
        if entry.patch:
            out += ["", _fence(entry.patch, entry.patch_lang or "")]

    broken = [r for r in report.results if r.status in (Status.CRASHED, Status.TIMED_OUT)]
    for r in broken:
        how = f"signal {r.signal}" if r.signal else f"exit code {r.exit_code}"
        out += ["", f"#### `{r.probe}` {r.status.value.replace('_', ' ')} ({how})"]
        tail = "\n".join((r.stderr_tail or "").splitlines()[-_STDERR_LINES:])
        if tail:
            out += ["", _fence(tail)]

    out += ["", "<details><summary>Environment</summary>", ""]
    out += [f"- **{key}**: {value}" for key, value in environment_brief(report.environment)]
    out += ["", _fence(json.dumps(report.environment, indent=2, ensure_ascii=False, default=str), "json"), "", "</details>", ""]
    return "\n".join(out)


RENDERERS: dict[str, Callable[..., Any]] = {
    "terminal": render_terminal,
    "json": render_json,
    "markdown": render_markdown,
}


# --- loading -------------------------------------------------------------------------------------


