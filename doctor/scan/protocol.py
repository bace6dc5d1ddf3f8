"""The worker protocol's limits and the parent's intake of what a worker says.

Everything a worker writes is untrusted input: a probe file, a plugin or a C extension can write
anything on the protocol channel, and a correct probe can still put a 20 MB exception message in its
summary. `bound` cuts any JSON value to a size the renderers handle quickly; `catalog_entry` and
`result_fields` check every field's type and value and turn what is wrong into a stated problem
(never an exception in the parent). The worker bounds its own output with the same limits, so a
well-behaved worker never sends a line the parent must cut.

Standard library only: the worker imports this module too.
"""
from __future__ import annotations

import math
import re
from typing import Any

LINE_MAX = 16 << 20  # bytes: a longer protocol line is garbage and ends the worker
SUMMARY_MAX = 2000  # characters of a result's or a finding's summary
TEXT_MAX = 4096  # characters of one evidence item, a traceback, a stderr tail
TITLE_MAX = 200
EVIDENCE_MAX = 40  # items per finding
FINDINGS_MAX = 50  # findings per result
DETAILS_MAX = 256 << 10  # bytes of a result's details, as JSON
DETAIL_STRING_MAX = 8192  # characters of one string inside details
CONTAINER_MAX = 2000  # items of one list or dict inside details
DEPTH_MAX = 20
MAX_TIMEOUT_S = 3600.0  # a probe limit (SPEC or --timeout) above an hour is a mistake

ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")  # the report schema's probe and finding ids
ID_MAX = 64
STATUSES = ("pass", "warn", "fail", "skipped", "crashed", "timed_out")
SEVERITIES = ("error", "warning")


def cut(text: str, limit: int) -> str:
    """`text` at most `limit` characters; a cut says how much was dropped."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 40)  # the note is shorter than 40 characters
    return f"{text[:keep]} ... [{len(text) - keep} more characters cut]"


def cut_tail(text: str, limit: int) -> str:
    """The last `limit` characters of `text` (for tracebacks and stderr, whose end matters)."""
    return text if len(text) <= limit else text[-limit:]


def _bound(value: Any, depth: int, budget: list[int]) -> Any:
    if budget[0] <= 0:
        return "[cut: details over the size limit]"
    if value is None or isinstance(value, bool):
        budget[0] -= 5
        return value
    if isinstance(value, int):
        budget[0] -= 20
        return value if abs(value) < 1 << 63 else str(value)[:40]
    if isinstance(value, float):
        budget[0] -= 24
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        text = cut(value, min(DETAIL_STRING_MAX, max(64, budget[0])))
        budget[0] -= len(text) + 2
        return text
    if depth >= DEPTH_MAX:
        budget[0] -= 40
        return "[cut: nested too deep]"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if i >= CONTAINER_MAX or budget[0] <= 0:
                out["..."] = f"[{len(value) - i} more entries cut]"
                break
            name = cut(str(key), 200)
            budget[0] -= len(name) + 4
            out[name] = _bound(item, depth + 1, budget)
        return out
    if isinstance(value, (list, tuple)):
        items = []
        for i, item in enumerate(value):
            if i >= CONTAINER_MAX or budget[0] <= 0:
                items.append(f"[{len(value) - i} more items cut]")
                break
            items.append(_bound(item, depth + 1, budget))
        return items
    return _bound(cut(repr(value), DETAIL_STRING_MAX), depth, budget)


def bound(value: Any, limit: int = DETAILS_MAX) -> Any:
    """A JSON value cut to about `limit` bytes of JSON: long strings, long lists, deep nesting and
    non-finite numbers are replaced by short notes. Never raises on JSON-shaped input."""
    return _bound(value, 0, [limit])


def valid_timeout(value: Any) -> float | None:
    """A probe time limit as a float, or None when it is not a number in (0, MAX_TIMEOUT_S]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        return None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        return None
    return seconds


class Malformed(ValueError):
    """A catalog entry the parent refuses (a load error for that probe)."""


def _str_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Malformed(f"{name} must be a list of strings")
    return [cut(v, 100) for v in value[:100]]


def catalog_entry(entry: Any) -> dict[str, Any]:
    """A worker's description of one probe, checked field by field. Raises Malformed."""
    if not isinstance(entry, dict):
        raise Malformed("not an object")
    key, probe_id = entry.get("key"), entry.get("id")
    if not isinstance(key, str) or not key or len(key) > 300:
        raise Malformed("no key")
    if not isinstance(probe_id, str) or len(probe_id) > ID_MAX or not ID_RE.match(probe_id):
        shown = cut(repr(probe_id), 80)
        raise Malformed(f"probe id {shown} is not a kebab-case id (lowercase letters, digits, single "
                        f"hyphens; at most {ID_MAX} characters)")
    timeout = valid_timeout(entry.get("timeout_s"))
    if timeout is None:
        raise Malformed(f"timeout_s {cut(repr(entry.get('timeout_s')), 40)} is not a number of "
                        f"seconds in (0, {MAX_TIMEOUT_S:g}]")
    memory = entry.get("gpu_memory_mib", 512)
    if isinstance(memory, bool) or not isinstance(memory, int) or not 0 <= memory <= 1 << 24:
        raise Malformed(f"gpu_memory_mib {cut(repr(memory), 40)} is not a number of MiB")
    for flag in ("per_device", "isolated"):
        if not isinstance(entry.get(flag, False), bool):
            raise Malformed(f"{flag} must be true or false")
    source, title = entry.get("source", ""), entry.get("title", probe_id)
    if not isinstance(source, str) or not isinstance(title, str):
        raise Malformed("source and title must be strings")
    description = entry.get("description", "")
    return {
        "key": key,
        "source": cut(source, 500),
        "id": probe_id,
        "title": cut(" ".join(title.split()), TITLE_MAX) or probe_id,
        "timeout_s": timeout,
        "emits": _str_list(entry.get("emits", []), "emits"),
        "needs": _str_list(entry.get("needs", []), "needs"),
        "per_device": bool(entry.get("per_device", True)),
        "isolated": bool(entry.get("isolated", False)),
        "gpu_memory_mib": memory,
        "description": cut(description, SUMMARY_MAX) if isinstance(description, str) else "",
    }


def _text(value: Any, limit: int, problems: list[str], name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{name} was {type(value).__name__}, not a string")
        value = repr(value)[: limit + 100]
    return cut(value, limit)


def _finding(raw: Any, problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        problems.append(f"a finding was {type(raw).__name__}, not an object")
        return None
    kb_id = raw.get("kb_id")
    if not isinstance(kb_id, str) or len(kb_id) > ID_MAX or not ID_RE.match(kb_id):
        problems.append(f"a finding's kb_id {cut(repr(kb_id), 80)} is not a kebab-case id")
        return None
    summary = _text(raw.get("summary"), SUMMARY_MAX, problems, "a finding's summary") or kb_id
    evidence_raw = raw.get("evidence") or []
    if not isinstance(evidence_raw, list):
        problems.append("a finding's evidence was not a list")
        evidence_raw = [evidence_raw]
    evidence = tuple(_text(e, TEXT_MAX, problems, "evidence") for e in evidence_raw[:EVIDENCE_MAX])
    if len(evidence_raw) > EVIDENCE_MAX:
        evidence += (f"[{len(evidence_raw) - EVIDENCE_MAX} more evidence items cut]",)
    severity = raw.get("severity", "error")
    if severity not in SEVERITIES:
        problems.append(f"a finding's severity {cut(repr(severity), 40)} is not error or warning")
        severity = "error"
    steps_raw = raw.get("steps") or []
    if not isinstance(steps_raw, list):
        problems.append("a finding's steps were not a list")
        steps_raw = []
    steps = tuple(_text(s, TEXT_MAX, problems, "a step") for s in steps_raw[:EVIDENCE_MAX])
    return {"kb_id": kb_id, "summary": summary, "evidence": evidence, "severity": severity, "steps": steps}


def result_fields(event: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ProbeResult from a worker's result event, every one checked and bounded.
    Status and findings stay plain values (the runner builds the model objects). A result whose
    status is not one of the six becomes `crashed`; any other wrong field is replaced and named in
    details["protocol_errors"]."""
    problems: list[str] = []
    status = event.get("status")
    summary = _text(event.get("summary"), SUMMARY_MAX, problems, "summary")
    if status not in STATUSES:
        summary = f"the probe returned an unknown status {cut(repr(status), 60)}" + (
            f": {summary}" if summary else "")
        status = "crashed"
    details = event.get("details")
    if details is None:
        details = {}
    elif not isinstance(details, dict):
        problems.append(f"details was {type(details).__name__}, not an object")
        details = {"value": details}
    details = bound(details)
    findings_raw = event.get("findings") or []
    if not isinstance(findings_raw, list):
        problems.append("findings was not a list")
        findings_raw = []
    findings = [f for f in (_finding(raw, problems) for raw in findings_raw[:FINDINGS_MAX]) if f]
    if len(findings_raw) > FINDINGS_MAX:
        problems.append(f"{len(findings_raw) - FINDINGS_MAX} findings over the limit of {FINDINGS_MAX} cut")
    duration = event.get("duration_s", 0.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (
            math.isfinite(duration) and duration >= 0):
        problems.append(f"duration_s {cut(repr(duration), 40)} is not a duration")
        duration = 0.0
    device = event.get("device")
    if device is not None and not isinstance(device, str):
        problems.append("device was not a string")
        device = None
    traceback = event.get("traceback")
    tail = cut_tail(traceback, TEXT_MAX) if isinstance(traceback, str) else None
    if status == "skipped" and not summary:
        summary = "skipped (the probe gave no reason)"
    if problems:
        details["protocol_errors"] = problems[:20]
    return {"status": status, "summary": summary, "details": details, "findings": findings,
            "duration_s": float(duration), "device": cut(device, 100) if device else None,
            "stderr_tail": tail}
