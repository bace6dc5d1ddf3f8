"""Renderers for the fleet report: terminal (rich), JSON and Markdown, from its JSON-ready dict.

They take the final dict (after redaction), so what a person sees is exactly what the JSON says.
Every string in it came from other machines' reports and is untrusted: the terminal renderer
prints it as `rich.text.Text` through `gpudoctor.safetext`, the Markdown renderer through
`gpudoctor.reports.markdown`, as every Markdown gpudoctor writes. The verdict is the first line and the last.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from gpudoctor.fleet.model import plural
from gpudoctor.reports import markdown as md
from gpudoctor.safetext import as_text, json_text

if TYPE_CHECKING:
    from rich.console import Console

FORMATS: tuple[str, ...] = ("text", "json", "md")
CULPRIT_ROWS = 8  # culprits shown per finding on the terminal and in Markdown (JSON has them all)
_CELL_LIMIT = 200
NODE_ROWS = 32  # nodes listed one per row on the terminal; a larger fleet's alike nodes share a row (-v: all)
_BRIEF = 20  # a version column's cell on the terminal; JSON and Markdown keep the whole text


def _brief(value: object) -> str:
    """A version cell on one line: "unavailable: NVML: libnvidia-ml.so.1 not found: ..." would
    wrap over ten lines of the node table; the full text stays in JSON and Markdown."""
    text = " ".join(str(value).split())
    return text if len(text) <= _BRIEF else text[: _BRIEF - 1].rstrip() + "…"

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}


def has_problems(data: dict[str, Any]) -> bool:
    """Exit code 1: an error-level finding (warnings alone exit 0)."""
    return any(f.get("severity") == "error" for f in data.get("findings") or [])


def render_json(data: dict[str, Any]) -> str:
    return json_text(json.dumps(data, indent=2, ensure_ascii=False, default=str)) + "\n"


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the fleet report (reports/fleet_schema.json)."""
    from importlib import resources

    return json.loads(resources.files("gpudoctor.reports").joinpath("fleet_schema.json").read_text(encoding="utf-8"))


def _where(c: dict[str, Any]) -> str:
    parts = [str(c.get("node") or "-")]
    if c.get("rank") is not None:
        parts.append(f"rank {c['rank']}")
    if c.get("gpu"):
        parts.append(str(c["gpu"]))
    return " ".join(parts)


def _job_line(data: dict[str, Any]) -> str:
    job = data.get("job") or {}
    parts = []
    if job.get("launcher"):
        parts.append(str(job["launcher"]) + (f" job {job['job_id']}" if job.get("job_id") else ""))
    if job.get("expected_nodes"):
        parts.append(f"{plural(job['expected_nodes'], 'node')} expected")
    if job.get("expected_ranks"):
        parts.append(f"{plural(job['expected_ranks'], 'rank')} expected")
    if job.get("node_list"):
        parts.append(f"node list {job['node_list']}")
    inputs = data.get("inputs") or {}
    parts.append(f"{plural(inputs.get('reports', 0), 'report')} read" + (f", {inputs['unreadable']} unreadable" if inputs.get("unreadable") else ""))
    return "; ".join(parts)


def _collective_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    coll = data.get("collectives") or {}
    return [r for r in coll.get("results") or [] if isinstance(r, dict)]


def _bw(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


# --- terminal ------------------------------------------------------------------------------------


def render_terminal(data: dict[str, Any], console: "Console", verbose: bool = False) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    def say(renderable: Any = "") -> None:
        console.print(renderable, highlight=False)

    verdict_style = "bold red" if has_problems(data) else "bold yellow" if data.get("findings") else "bold green"
    head = Text(f"gpudoctor fleet report {data.get('tool', {}).get('version', '')}", style="bold")
    head.append(f"  {data.get('created', '')}" + ("  (redacted)" if data.get("redacted") else ""), style="dim")
    say(head)
    say(as_text(data.get("verdict", ""), style=verdict_style, limit=400))
    say(as_text(_job_line(data), style="dim", limit=600))

    findings = data.get("findings") or []
    if findings:
        say()
        say(Text(f"Findings ({len(findings)})", style="bold underline"))
    for n, f in enumerate(findings, 1):
        line = Text(f"{n}. ")
        line.append(f"[{f.get('severity')}] ", style=_SEVERITY_STYLE.get(f.get("severity"), ""))
        line.append(f"{f.get('kind')}: ", style="bold")
        line.append_text(as_text(f.get("summary", ""), limit=600))
        say(line)
        culprits = f.get("culprits") or []
        shown = culprits if verbose else culprits[:CULPRIT_ROWS]
        if len(culprits) > 1:
            table = Table(box=None, show_header=True, header_style="dim", pad_edge=False, padding=(0, 1))
            for column in ("where", "value", "detail"):
                table.add_column(column, overflow="fold")
            for c in shown:
                table.add_row(as_text(_where(c), limit=_CELL_LIMIT), as_text(str(c.get("value") or "-"), limit=_CELL_LIMIT),
                              as_text(str(c.get("detail") or ""), limit=_CELL_LIMIT))
            from rich.padding import Padding

            say(Padding(table, (0, 0, 0, 4)))
        if len(culprits) > len(shown):
            say(Text(f"    +{len(culprits) - len(shown)} more (-v, or --format json, lists them all)", style="dim"))

    nodes = data.get("nodes") or []
    if nodes:
        rows = [_node_row(node) for node in nodes]
        grouped = not verbose and len(nodes) > NODE_ROWS
        if grouped:
            rows = _group_rows(rows)
        say()
        say(Text(f"Nodes ({len(nodes)})" + (f": {plural(len(rows), 'row')}, nodes alike in GPUs, versions and "
                                            "probes on one (-v lists every node)" if grouped else ""),
                 style="bold underline"))
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
        for column in ("node", "ranks", "GPUs", "torch", "driver", "probes", "scan"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(as_text(cell, limit=_CELL_LIMIT) for cell in row))
        say(table)

    stragglers = data.get("stragglers") or {}
    groups = stragglers.get("groups") or []
    if groups or stragglers.get("not_judged"):
        say(Text("GEMM throughput (matmul-sanity), TFLOP/s", style="bold underline"))
        if groups:
            table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
            for column in ("model", "mode", "GPUs", "median", "min", "max", "expected", "stragglers"):
                table.add_column(column, overflow="fold")
            for g in groups:
                table.add_row(as_text(str(g.get("model")), limit=80), as_text(str(g.get("mode")), limit=20),
                              *(Text(str(g.get(k))) for k in ("gpus", "median_tflops", "min_tflops", "max_tflops",
                                                              "expected_tflops", "stragglers")))
            say(table)
        for item in stragglers.get("not_judged") or []:
            say(as_text(f"  not judged ({item.get('count')} measurements): {item.get('reason')}", style="dim", limit=300))

    rows = _collective_rows(data)
    if rows:
        coll = data.get("collectives") or {}
        say()
        say(Text(f"Collectives ({coll.get('backend', '?')}, nccl-tests bus bandwidth, GB/s)", style="bold underline"))
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
        for column in ("collective", "scope", "group", "bytes", "status", "time", "algbw", "busbw", "expected"):
            table.add_column(column, overflow="fold")
        for r in rows:
            table.add_row(*(as_text(str(x), limit=_CELL_LIMIT) for x in (
                r.get("op"), r.get("scope"), r.get("group"), r.get("bytes"), r.get("status"),
                f"{r['time_s'] * 1e3:.2f} ms" if isinstance(r.get("time_s"), (int, float)) else "-",
                _bw(r.get("algbw_gbps")), _bw(r.get("busbw_gbps")), _bw(r.get("expected_busbw_gbps")))))
        say(table)

    say()
    say(as_text(data.get("verdict", ""), style=verdict_style, limit=400))


def _node_row(node: dict[str, Any]) -> tuple[str, ...]:
    """A node's cells on the terminal: name, ranks, GPUs, torch, driver, probes, scan time."""
    counts = node.get("counts") or {}
    probes = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items() if v) or "-"
    versions = node.get("versions") or {}
    duration = node.get("duration_s")
    return (str(node.get("name")), _short_ranks(node.get("ranks") or []), _gpu_brief(node.get("gpus") or []),
            _brief(versions.get("torch", "-")), _brief(versions.get("driver", "-")), probes,
            f"{duration:.1f} s" if isinstance(duration, (int, float)) and not isinstance(duration, bool) else "-")


def _group_rows(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """One row per set of nodes alike in GPUs, versions and probes (a 1,000-node fleet is a few
    rows, its odd nodes first: the smallest groups lead), naming the group's first and last
    node, its ranks and the range of its scan times; a node alone keeps its own row."""
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for row in rows:
        groups.setdefault(row[2:6], []).append(row)
    out = []
    for same, members in sorted(groups.items(), key=lambda item: len(item[1])):
        if len(members) == 1:
            out.append(members[0])
            continue
        names = f"{len(members)} nodes: {members[0][0]} … {members[-1][0]}"
        ranks = ", ".join(m[1] for m in members[:3]) + (", …" if len(members) > 3 else "")
        times = sorted(float(m[6][:-2]) for m in members if m[6] != "-")
        scan = "-" if not times else f"{times[0]:.1f} s" if times[0] == times[-1] else f"{times[0]:.1f}-{times[-1]:.1f} s"
        out.append((names, ranks, *same, scan))
    return out


def _short_ranks(ranks: list[Any]) -> str:
    if not ranks:
        return "-"
    if len(ranks) > 4 and all(isinstance(r, int) for r in ranks) and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _gpu_brief(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    models: dict[str, int] = {}
    for g in gpus:
        models[str(g.get("model"))] = models.get(str(g.get("model")), 0) + 1
    return ", ".join(f"{n}x {m}" for m, n in models.items())


# --- Markdown ------------------------------------------------------------------------------------


def _cell(value: Any, limit: int = _CELL_LIMIT) -> str:
    return md.cell(value, limit)


def render_markdown(data: dict[str, Any], verbose: bool = False) -> str:
    out = [
        "## gpudoctor fleet report",
        "",
        f"**{md.text(data.get('verdict', ''), 400)}**",
        "",
        f"gpudoctor {md.text(data.get('tool', {}).get('version', ''), _CELL_LIMIT)} · "
        f"{md.text(data.get('created', ''), _CELL_LIMIT)}" + (" · redacted" if data.get("redacted") else "") + f" · {md.text(_job_line(data), 600)}",
    ]
    findings = data.get("findings") or []
    if findings:
        out += ["", f"### Findings ({len(findings)})", ""]
    for n, f in enumerate(findings, 1):
        out.append(f"{n}. **{md.text(f.get('severity'), _CELL_LIMIT)}** {md.code_span(f.get('kind'), _CELL_LIMIT)}: "
                   f"{md.text(f.get('summary', ''), 600)}")
    culprit_findings = [f for f in findings if len(f.get("culprits") or []) > 1]
    if culprit_findings:
        out += ["", "<details><summary>Where each finding applies</summary>", ""]
        for n, f in enumerate(findings, 1):
            culprits = f.get("culprits") or []
            if len(culprits) < 2:
                continue
            shown = culprits if verbose else culprits[:CULPRIT_ROWS]
            out += ["", f"Finding {n} ({md.code_span(f.get('kind'), _CELL_LIMIT)}, "
                        f"{md.text(f.get('key') or '', _CELL_LIMIT)}):", "", "| where | value | detail |", "|---|---|---|"]
            out += [f"| {_cell(_where(c))} | {_cell(c.get('value') or '-')} | {_cell(c.get('detail') or '')} |" for c in shown]
            if len(culprits) > len(shown):
                out.append(f"\n+{len(culprits) - len(shown)} more in the JSON report")
        out += ["", "</details>"]
    nodes = data.get("nodes") or []
    if nodes:
        out += ["", f"### Nodes ({len(nodes)})", "", "| node | ranks | GPUs | torch | driver | probes |", "|---|---|---|---|---|---|"]
        for node in nodes:
            counts = node.get("counts") or {}
            probes = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "-"
            versions = node.get("versions") or {}
            out.append(f"| {_cell(node.get('name'))} | {_cell(_short_ranks(node.get('ranks') or []))} | "
                       f"{_cell(_gpu_brief(node.get('gpus') or []))} | {_cell(versions.get('torch', '-'))} | "
                       f"{_cell(versions.get('driver', '-'))} | {_cell(probes)} |")
    groups = (data.get("stragglers") or {}).get("groups") or []
    if groups:
        out += ["", "### GEMM throughput (TFLOP/s)", "", "| model | mode | GPUs | median | min | max | expected | stragglers |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        for g in groups:
            out.append("| " + " | ".join(_cell(g.get(k)) for k in ("model", "mode", "gpus", "median_tflops", "min_tflops",
                                                                   "max_tflops", "expected_tflops", "stragglers")) + " |")
    rows = _collective_rows(data)
    if rows:
        out += ["", f"### Collectives ({md.text((data.get('collectives') or {}).get('backend', '?'), _CELL_LIMIT)}, GB/s)", "",
                "| collective | scope | group | bytes | status | algbw | busbw | expected |", "|---|---|---|---:|---|---:|---:|---:|"]
        for r in rows:
            out.append("| " + " | ".join(_cell(x) for x in (r.get("op"), r.get("scope"), r.get("group"), r.get("bytes"),
                                                          r.get("status"), _bw(r.get("algbw_gbps")), _bw(r.get("busbw_gbps")),
                                                          _bw(r.get("expected_busbw_gbps")))) + " |")
    out.append("")
    return "\n".join(out)


RENDERERS: dict[str, Callable[..., Any]] = {"text": render_terminal, "json": render_json, "md": render_markdown}
