"""Reading saved reports: other people's files, so untrusted input. The one reader of scan reports:
`report`, `diff`, `merge` and the fleet's readers (torchrun's and Ray's) all refuse the same files
with the same line.

`load_report(path)` returns one report's dict, or raises `ReportError` whose text is the one line
the user sees; `load_documents(path)` returns every report a file holds (`merge`: several written
one after another, lines before a report skipped), each a `Document` with its dict or its error. In
order:

1. Bytes, bounded: at most `MAX_REPORT_BYTES` are read; a directory is refused. A FIFO, a pipe or
   a device named by its path is read with an idle deadline (`READ_TIMEOUT_S` without a byte ends
   the read), never blocking forever on a writer that never comes. Standard input (`-`) is read to
   its end without one, as `explain -` reads it: it is the user's own pipeline, and
   `gpudoctor scan --format json | gpudoctor report -` waits for a scan that prints nothing until
   it ends. A closed standard input is one line.
2. Text: NUL bytes or invalid UTF-8 is "binary data"; a UTF-8 byte-order mark is accepted.
3. JSON: strict (`NaN`/`Infinity` and duplicate keys are refused: two `status` keys in one result
   would be misread whichever one won); nesting deeper than `MAX_DEPTH` (a report needs about 8)
   is refused, before any code walks it; an error at the very end is reported as "truncated".
4. Version: `schema_version` is `MAJOR.MINOR`. Major 1 is read; another major is refused, with the
   version that wrote it. A newer minor (1.3 when this gpudoctor writes 1.0) only adds fields, so it
   is read by the structural check below, the fields this version does not know being ignored.
5. Structure, by `check_structure`: every field the renderers, `diff` and `merge` rely on, with its
   type (the environment's sections included, as far as reports/schema.json describes them), and
   the `summary` (required: a count per status, non-negative) against the results: a truncated or
   edited list of results is refused, not rendered as a healthier machine. This check is the
   definition of a readable report, on every machine (reports/schema.json, which describes it
   more finely, is checked against what gpudoctor writes in the tests).

`merge` reads ~330 KB per node and needs a few KB of it: `skim_bytes` cuts each result's
`details` (except matmul-sanity's throughput), `findings`, exit code, signal and stderr tail from
the bytes of a report written by gpudoctor before they are parsed; everything the merge reads is
validated as above, what it skips is not parsed, so not validated (`report` validates it).

`sanitize(data)` makes every string of a loaded report safe to print (`gpudoctor.safetext.visible`,
bounded per string). Standard library only.
"""
from __future__ import annotations

import json
import math
import os
import re
import select
import stat
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.reports.model import SCHEMA_VERSION

MAX_REPORT_BYTES = 64 << 20
READ_TIMEOUT_S = 30.0
MAX_STRING = 64 << 10  # characters of any one string kept for display
_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,4})$")
_KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
STATUSES = ("pass", "warn", "fail", "skipped", "crashed", "timed_out")
SEVERITIES = ("error", "warning")


class ReportError(Exception):
    """A report gpudoctor cannot use; str(exc) is the one line shown to the user."""


# --- bytes ---------------------------------------------------------------------------------------


def read_bytes(path: str, *, limit: int = MAX_REPORT_BYTES, timeout: float | None = None) -> bytes:
    """At most `limit` bytes of `path` ("-" is standard input); ReportError when it is larger,
    unreadable, a directory, or a pipe named by `path` that gives nothing for `timeout` seconds."""
    name = "standard input" if path == "-" else path
    timeout = READ_TIMEOUT_S if timeout is None else timeout
    if path == "-":
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):  # an in-memory stdin (tests, embedding)
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:
                raise ReportError("standard input is closed") from None
            data = stream.read(limit + 1)
            if len(data) > limit:
                raise ReportError(f"{name}: more than {limit} bytes is too large for a gpudoctor report")
            return data
        return _read_fd(fd, name, limit, None)
    try:
        # O_NONBLOCK: opening a FIFO that has no writer must not block.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, not a report") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ReportError(f"{path}: is a directory, not a report")
        if stat.S_ISREG(mode):
            size = os.fstat(fd).st_size
            if size > limit:
                raise ReportError(f"{path}: {size} bytes is too large for a gpudoctor report (limit {limit})")
        return _read_fd(fd, name, limit, timeout)
    finally:
        os.close(fd)


def _read_fd(fd: int, name: str, limit: int, timeout: float | None) -> bytes:
    """Read `fd` to its end; with a `timeout`, give up when that long passes without a byte."""
    chunks: list[bytes] = []
    total = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ReportError(f"{name}: nothing more arrived in {timeout:g} s; is something writing to it?")
        try:
            ready, _, _ = select.select([fd], [], [], left)
        except (OSError, ValueError):
            ready = [fd]  # not selectable (some special files): read and see
        if not ready:
            continue
        try:
            data = os.read(fd, min(1 << 20, limit + 1 - total))
        except BlockingIOError:
            continue
        except OSError as exc:
            raise ReportError(f"cannot read {name}: {exc.strerror or exc}") from None
        if not data:
            return b"".join(chunks)
        chunks.append(data)
        total += len(data)
        if timeout is not None:
            deadline = time.monotonic() + timeout
        if total > limit:
            raise ReportError(f"{name}: more than {limit} bytes is too large for a gpudoctor report")


# --- text and JSON -------------------------------------------------------------------------------

MAX_DEPTH = 64  # nesting of arrays and objects: a report needs about 8


@dataclass
class Document:
    """One report from a file: its dict, or why it cannot be read (`error`: the reason, without the
    file's name, which is `label`)."""

    label: str
    data: dict[str, Any] | None = None
    error: str | None = None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ReportError(f"duplicate key {key[:80]!r}")
            seen.add(key)
    return out


def _no_constants(name: str) -> Any:
    raise ReportError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def decode(raw: bytes, name: str) -> str:
    """The text of a report's bytes; ReportError when it is empty or not UTF-8 text."""
    if not raw.strip():
        raise ReportError(f"{name}: is empty, not a report")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if b"\x00" in raw[:1 << 20]:
        raise ReportError(f"{name}: looks like binary data, not a JSON report")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{name}: looks like binary data, not a JSON report (invalid UTF-8 at byte {exc.start})") from None


def _decode_at(text: str, pos: int, name: str) -> tuple[Any, int]:
    """The JSON document that starts at text[pos] and where it ends; ReportError, one line."""
    try:
        return _DECODER.raw_decode(text, pos)
    except ReportError as exc:
        raise ReportError(f"{name}: not a valid report: {exc}") from None
    except json.JSONDecodeError as exc:
        # Cut at the end, or inside a string that runs to the end (a string holds no raw newline).
        if exc.pos >= len(text.rstrip()) or (exc.msg.startswith("Unterminated string")
                                             and "\n" not in text[exc.pos:].rstrip()):
            raise ReportError(f"{name}: the JSON ends early (line {exc.lineno}): the file is truncated") from None
        raise ReportError(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ReportError(f"{name}: JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will parse
        raise ReportError(f"{name}: not a valid report: {exc}") from None


def parse_json(raw: bytes, name: str) -> Any:
    """Strict JSON from bytes, one document; ReportError with one line on anything else."""
    text = decode(raw, name)
    start = len(text) - len(text.lstrip())
    data, end = _decode_at(text, start, name)
    if text[end:].strip():
        line = text.count("\n", 0, end) + 1
        raise ReportError(f"{name}: not valid JSON: extra data after the report at line {line}")
    _check_depth(data, name)
    return data


_FLAT_RESULT = frozenset({"probe", "title", "device", "status", "summary", "duration_s", "details", "findings",
                          "exit_code", "signal", "stderr_tail"})


def _check_depth(data: Any, name: str) -> None:
    """ReportError when arrays and objects nest deeper than MAX_DEPTH (iteratively: a walk of a
    deep document must not be the RecursionError it is checking for). A result with only the
    fields a scan writes holds containers only in `details` and `findings` (the others are
    checked to be scalars by `check_structure`): only those two are walked there."""
    if type(data) is not dict and type(data) is not list:
        return
    stack = [(data, 1)]
    pop, push = stack.pop, stack.append
    results = data.get("results") if type(data) is dict else None
    while stack:
        value, depth = pop()
        if value is results and type(value) is list:
            for r in value:
                if type(r) is dict and r.keys() <= _FLAT_RESULT:
                    for inner in (r.get("details"), r.get("findings")):
                        if type(inner) is dict or type(inner) is list:
                            push((inner, depth + 2))
                elif type(r) is dict or type(r) is list:
                    push((r, depth + 1))
            continue
        if depth > MAX_DEPTH:
            raise ReportError(f"{name}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
        for item in (value.values() if type(value) is dict else value):
            kind = type(item)
            if kind is dict or kind is list:
                if depth >= MAX_DEPTH:
                    raise ReportError(f"{name}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
                push((item, depth + 1))


def schema_version(data: Any, name: str) -> tuple[int, int]:
    """(major, minor) of a report; ReportError when it is not a gpudoctor report of a major this
    version reads."""
    if not isinstance(data, dict):
        raise ReportError(f"{name}: not a gpudoctor report (the JSON is a {type(data).__name__}, not an object)")
    tool = data.get("tool")
    version = data.get("schema_version")
    kind = data.get("kind")
    if kind == "gpudoctor-run":
        raise ReportError(f"{name}: is the record of a `gpudoctor run`, not a scan report; the bundle's "
                          "scan.json is its report and ticket.md its rendering")
    if kind == "gpudoctor-fleet-report":
        raise ReportError(f"{name}: is a fleet report, not a node's scan report: merge the node reports it came from")
    if kind is not None:
        raise ReportError(f"{name}: not a gpudoctor scan report (kind {str(kind)[:40]!r})")
    if version is None or not (isinstance(tool, dict) and tool.get("name") == "gpudoctor"):
        raise ReportError(f"{name}: not a gpudoctor scan report (no schema_version and tool.name gpudoctor)")
    m = _VERSION.match(version) if isinstance(version, str) else None
    if not m:
        raise ReportError(f"{name}: schema_version {str(version)[:40]!r} is not MAJOR.MINOR")
    major, minor = int(m.group(1)), int(m.group(2))
    ours = tuple(int(x) for x in SCHEMA_VERSION.split("."))
    if major != ours[0]:
        writer = tool.get("version") if isinstance(tool.get("version"), str) else "?"
        raise ReportError(
            f"{name}: report schema {major}.{minor} (written by gpudoctor {writer[:40]}) is not readable by this "
            f"gpudoctor, which reads schema {ours[0]}.x; use a gpudoctor of the same major version"
        )
    return major, minor


# --- validation ----------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _expect(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ReportError(f"{where}: {what}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


_RESULT_STR = ("title", "summary")
_KEBAB_SEEN: set[str] = set()  # probe ids already seen to be kebab-case (a node report repeats 12 of them)


def _result_ok(r: dict[str, Any]) -> bool:
    """The fast path of `_check_result`: every field right, no message built."""
    duration = r.get("duration_s")
    details = r.get("details", {})
    exit_code = r.get("exit_code")
    return (type(r.get("title", "")) is str and type(r.get("summary", "")) is str
            and (duration is None or (type(duration) in (int, float) and duration >= 0 and math.isfinite(duration)))
            and (r.get("device") is None or type(r.get("device")) is str)
            and (details is None or type(details) is dict)
            and (exit_code is None or type(exit_code) is int)
            and (r.get("signal") is None or type(r.get("signal")) is str)
            and (r.get("stderr_tail") is None or type(r.get("stderr_tail")) is str))


def _check_result(r: dict[str, Any], at: str) -> None:
    for key in _RESULT_STR:
        _expect(isinstance(r.get(key, ""), str), f"{at}.{key}", "not a string")
    _expect(r.get("duration_s") is None or (_number(r["duration_s"]) and r["duration_s"] >= 0),
            f"{at}.duration_s", "not a non-negative number")
    _expect(_optional(r.get("device"), str), f"{at}.device", "not a string or null")
    _expect(isinstance(r.get("details", {}), dict) or r.get("details") is None, f"{at}.details", "not an object")
    _expect(_optional(r.get("exit_code"), int), f"{at}.exit_code", "not an integer or null")
    _expect(_optional(r.get("signal"), str), f"{at}.signal", "not a string or null")
    _expect(_optional(r.get("stderr_tail"), str), f"{at}.stderr_tail", "not a string or null")


def _check_findings(findings: Any, at: str) -> None:
    _expect(isinstance(findings, list), f"{at}.findings", "not a list")
    for j, f in enumerate(findings):
        fat = f"{at}.findings[{j}]"
        _expect(isinstance(f, dict), fat, f"is {_type_name(f)}, not an object")
        _expect(isinstance(f.get("kb_id"), str) and bool(_KEBAB.match(f["kb_id"])), f"{fat}.kb_id", "missing or not a kebab-case id")
        _expect(isinstance(f.get("summary", ""), str), f"{fat}.summary", "not a string")
        evidence = f.get("evidence", [])
        _expect(isinstance(evidence, list) and all(isinstance(e, str) for e in evidence), f"{fat}.evidence", "not a list of strings")
        _expect(f.get("severity", "error") in SEVERITIES, f"{fat}.severity", "must be error or warning")
        steps = f.get("steps", [])
        _expect(isinstance(steps, list) and all(isinstance(s, str) for s in steps), f"{fat}.steps", "not a list of strings")


def check_structure(data: dict[str, Any]) -> None:
    """Every field the renderers, `diff` and `merge` rely on, with its type; ReportError naming the
    first field that is wrong (as a JSON path). Messages are made only for a field that is wrong:
    a node report has ~100 results, and a merge reads 1,000 reports."""
    _expect(isinstance(data.get("tool"), dict) and isinstance(data["tool"].get("version"), str), "tool.version", "missing or not a string")
    _expect(isinstance(data.get("created"), str), "created", "missing or not a string")
    _expect(isinstance(data.get("redacted"), bool), "redacted", "missing or not true/false")
    _expect(_number(data.get("duration_s")) and data["duration_s"] >= 0, "duration_s", "missing or not a non-negative number")
    _expect(isinstance(data.get("environment"), dict), "environment", "missing or not an object")
    _expect(data.get("level") in (None, "quick", "deep"), "level", "must be quick or deep")
    results = data.get("results")
    _expect(isinstance(results, list), "results", "missing or not a list")
    counts = {s: 0 for s in STATUSES}
    for i, r in enumerate(results):
        if type(r) is not dict:
            raise ReportError(f"results[{i}]: is {_type_name(r)}, not an object")
        probe = r.get("probe")
        if probe not in _KEBAB_SEEN:
            if type(probe) is not str or not _KEBAB.match(probe):
                raise ReportError(f"results[{i}].probe: missing or not a kebab-case id")
            if len(_KEBAB_SEEN) < 4096:
                _KEBAB_SEEN.add(probe)
        status = r.get("status")
        if status not in counts or type(status) is not str:
            raise ReportError(f"results[{i}].status: must be one of {', '.join(STATUSES)}")
        counts[status] += 1
        if not _result_ok(r):
            _check_result(r, f"results[{i}]")
        findings = r.get("findings")
        if findings is not None and (type(findings) is not list or findings):
            _check_findings(findings, f"results[{i}]")
    check_environment(data["environment"])
    summary = data.get("summary")
    _expect(isinstance(summary, dict), "summary", "missing or not an object (a count per status)")
    for key, claimed in summary.items():
        _expect(key in counts, f"summary.{str(key)[:40]}", f"is not a status ({', '.join(STATUSES)})")
        _expect(_count(claimed), f"summary.{key}", "not a non-negative integer")
    for status in STATUSES:
        _expect(status in summary, f"summary.{status}", "missing")
        claimed = summary[status]
        if claimed != counts[status]:
            raise ReportError(
                f"summary.{status}: says {claimed} but the results hold {counts[status]}: "
                "the report was truncated or edited"
            )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _dicts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _section(env: dict[str, Any], name: str) -> dict[str, Any] | None:
    """An environment section to check, or None when it is absent or says why it is missing."""
    value = env.get(name)
    if value is None or (isinstance(value, str) and value.startswith("not available")):
        return None
    _expect(isinstance(value, dict), f"environment.{name}", "not an object")
    if value.get("available") is False:
        _expect(isinstance(value.get("reason"), str), f"environment.{name}.reason", "missing or not a string")
        return None
    return value


def check_environment(env: dict[str, Any]) -> None:
    """The shapes of the environment sections that the schema describes and the renderers read."""
    at = "environment"
    system = _section(env, "system")
    if system is not None:
        for key in ("container", "wsl"):
            _expect(system.get(key) is None or isinstance(system[key], dict), f"{at}.system.{key}", "not an object")
    _section(env, "python")
    packages = _section(env, "packages")
    if packages is not None:
        installed = packages.get("installed", {})
        _expect(isinstance(installed, dict), f"{at}.packages.installed", "not an object")
        for name, info in installed.items():
            where = f"{at}.packages.installed.{name}"
            _expect(isinstance(info, dict) and isinstance(info.get("version"), str), where, "not an object with a version string")
            _expect(info.get("duplicates") is None or _strings(info["duplicates"]), f"{where}.duplicates", "not a list of strings")
        _expect(_strings(packages.get("not_installed", [])), f"{at}.packages.not_installed", "not a list of strings")
    nvml = _section(env, "nvml")
    if nvml is not None:
        gpus = nvml.get("gpus", [])
        _expect(isinstance(gpus, list) and all(isinstance(g, (dict, str)) for g in gpus), f"{at}.nvml.gpus",
                "not a list of objects")
        for i, gpu in enumerate(g for g in gpus if isinstance(g, dict)):
            for key in ("memory", "ecc", "pcie"):
                _expect(gpu.get(key) is None or isinstance(gpu[key], (dict, str)), f"{at}.nvml.gpus[{i}].{key}", "not an object")
            reasons = gpu.get("throttle_reasons")
            _expect(reasons is None or _strings(reasons), f"{at}.nvml.gpus[{i}].throttle_reasons", "not a list of strings")
    torch = _section(env, "torch")
    if torch is not None:
        _expect(_optional(torch.get("version"), str), f"{at}.torch.version", "not a string")
        _expect(_optional(torch.get("built_with_cuda"), str), f"{at}.torch.built_with_cuda", "not a string or null")
        _expect(torch.get("cuda_available") is None or isinstance(torch["cuda_available"], bool),
                f"{at}.torch.cuda_available", "not true/false")
        arch = torch.get("arch_list")
        _expect(arch is None or isinstance(arch, str) or _strings(arch), f"{at}.torch.arch_list", "not a list of strings")
        _expect(torch.get("cudnn") is None or isinstance(torch["cudnn"], (dict, str)), f"{at}.torch.cudnn", "not an object")
        _expect(_dicts(torch.get("devices", [])), f"{at}.torch.devices", "not a list of objects")
    libs = _section(env, "cuda_libraries")
    if libs is not None:
        libraries = libs.get("libraries", {})
        _expect(isinstance(libraries, dict), f"{at}.cuda_libraries.libraries", "not an object")
        for name, entry in libraries.items():
            where = f"{at}.cuda_libraries.libraries.{name}"
            _expect(isinstance(entry, dict), where, "not an object")
            for key in ("loaded", "installed"):
                copies = entry.get(key, [])
                _expect(_dicts(copies) and all(isinstance(c.get("path", ""), str) and _optional(c.get("version"), str)
                                               for c in copies), f"{where}.{key}", "not a list of {path, version} objects")
        flags = libs.get("flags", [])
        _expect(_dicts(flags) and all(all(isinstance(f.get(k, ""), str) for k in ("kind", "library", "detail")) for f in flags),
                f"{at}.cuda_libraries.flags", "not a list of {kind, library, detail} objects")
    env_vars = _section(env, "env_vars")
    if env_vars is not None:
        _expect(all(isinstance(v, str) for v in env_vars.values()), f"{at}.env_vars", "values must be strings")


def validate(data: Any, name: str) -> tuple[int, int]:
    """Version and structure of a report's dict (see the module docstring); returns (major, minor)."""
    version = schema_version(data, name)
    try:
        check_structure(data)
    except ReportError as exc:
        raise ReportError(f"{name}: not a valid report: {exc}") from None
    return version


def load_report(path: str) -> dict[str, Any]:
    """Read, parse and validate a report's dict; ReportError (one line) for anything unusable.
    `report` builds its `Report` from the dict once it is made safe to print (`sanitize`); `diff`
    reads the dict itself."""
    name = "standard input" if path == "-" else path
    data = parse_json(read_bytes(path), name)
    validate(data, name)
    return data


# --- many reports: merge -------------------------------------------------------------------------


def load_documents(path: str, *, limit: int = MAX_REPORT_BYTES, skim: bool = True) -> list[Document]:
    """Every report in the file `path` ("-": standard input), each validated as `load_report`
    validates one; a file that cannot be read at all is one Document with its error."""
    label = "standard input" if path == "-" else path
    try:
        raw = read_bytes(path, limit=limit)
    except ReportError as exc:
        return [Document(label, error=_reason(str(exc), label))]
    return parse_documents(raw, label, skim=skim)


def parse_documents(raw: bytes | str, label: str, *, skim: bool = True) -> list[Document]:
    """Every JSON document in `raw` (one report, or several written one after another; lines
    before a report, such as a scan's progress, are skipped), each validated. With `skim`, a
    report as gpudoctor writes it loses its results' details and findings before it is parsed
    (`skim_bytes`); when the cut text does not read as reports, or one of them is refused, the
    whole is read, so that every refusal is the whole reading's."""
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    if skim:
        cut = skim_bytes(data)
        if cut is not None:
            # Only what is kept is decoded: bytes the merge skips are neither decoded nor parsed.
            # Anything wrong in the kept part (invalid UTF-8, a NUL, a JSON error, a refusal) is
            # said by the whole reading below, in the words `gpudoctor report` uses.
            try:
                return _documents(cut.decode("utf-8-sig"), label, skimmed=True)
            except (UnicodeDecodeError, _NotSkimmed):
                pass
    try:
        text = decode(data, label)
    except ReportError as exc:
        return [Document(label, error=_reason(str(exc), label))]
    return _documents(text, label, skimmed=False)


class _NotSkimmed(Exception):
    """The cut text of a skimmed report is not reports the skim made: read the whole instead."""


def _documents(text: str, label: str, *, skimmed: bool) -> list[Document]:
    """The reports in `text`, each read and validated. `skimmed`: `text` is what `skim_bytes`
    kept; anything but reports it made raises _NotSkimmed (the caller reads the whole)."""
    out: list[Document] = []
    pos, n = 0, 0
    length = len(text)
    while True:
        while pos < length and text[pos] in " \t\r\n":
            pos += 1
        if pos >= length:
            break
        if text[pos] != "{":
            # Lines before a report (srun -o without -e puts the scan's progress lines there).
            brace = text.find("\n{", pos)
            if brace >= 0:
                pos = brace + 1
        n += 1
        name = label if n == 1 else f"{label}#{n}"
        try:
            doc, pos = _decode_at(text, pos, name)
            _check_depth(doc, name)
        except ReportError as exc:  # where this document ends is not known: the rest is not read
            if skimmed:
                raise _NotSkimmed() from None
            out.append(Document(name, error=_reason(str(exc), name)))
            break
        try:
            validate(doc, name)
        except ReportError as exc:
            if skimmed:
                raise _NotSkimmed() from None
            out.append(Document(name, error=_reason(str(exc), name)))
            continue
        if skimmed and not _skimmed_results(doc["results"]):
            raise _NotSkimmed()
        out.append(Document(name, data=doc))
    if not out:
        if skimmed:
            raise _NotSkimmed()
        out.append(Document(label, error="is empty, not a report"))
    return out


def _skimmed_results(results: list[dict[str, Any]]) -> bool:
    """Whether every result of a skimmed report held the six fields gpudoctor writes before its
    details (and matmul-sanity's the throughput): a result that did not, or wrote them in another
    order, may have lost what the merge reads to the cut."""
    sizes = set(map(len, results))
    if sizes <= {_SKIMMED_RESULT}:
        return True
    return all(len(r) == _SKIMMED_RESULT + ("details" in r) for r in results)


def _reason(message: str, name: str) -> str:
    """A ReportError's line without the name it starts with (a Document has the name apart)."""
    prefix = f"{name}: "
    return message[len(prefix):] if message.startswith(prefix) else message


# The skim. A node report is ~330 KB of pretty JSON, most of it probe `details`, `findings` and
# stderr tails that the merge never reads: of each result it reads the probe, device, status and
# summary, and matmul-sanity's throughput. `render_json` writes indent=2, `results` last, and each
# result's keys in a fixed order (probe, title, device, status, summary, duration_s, details,
# findings, exit_code, signal, stderr_tail), so a result's `details` opens with a line
# `      "details": ` after its duration's comma, and the result closes at the first later line that
# is exactly four spaces and `}`: a JSON string cannot hold a raw newline, and everything inside is
# indented deeper. That line is followed by the next result (`,` and a line of four spaces and `{`)
# or by the end of the results and of the report (a line `  ]`, a line `}`); anything else is not
# gpudoctor's layout. `skim_bytes` cuts each result from the comma before its `details` to its end
# (of matmul-sanity's details it keeps the `throughput` member), on the raw bytes, before decoding;
# text not laid out like that (other indentation, compact JSON, a hand edit) is parsed whole, and
# so is a skimmed report that is refused (`parse_documents`): a refusal is always the whole
# reading's, in `gpudoctor report`'s words. The searches use needles long enough for the byte
# search to skip (a short one such as `\n    }` crawls through indentation), and the results' end
# is one regular expression: one pass over the bytes.
_RESULTS_MARK = b'\n  "results": [\n'
_DETAILS = b',\n      "details": '
_RESULT_END = re.compile(rb"\n    \}(?:(,\n    \{\n)|\n  \]\n\})?")  # group 1: another result follows
_PROBE_LINE = b'\n      "probe": '
_KEEP_DETAILS = b'\n      "probe": "matmul-sanity"'
_THROUGHPUT = b'\n        "throughput": '
_KEPT_DETAILS = b',\n      "details": {\n        "throughput": '
_KEPT_CLOSE = b"\n      }"
_SKIMMED_RESULT = 6  # the keys a skimmed result holds (probe .. duration_s); matmul-sanity's 7


def skim_bytes(raw: bytes) -> bytes | None:
    """`raw` with each result cut after its duration (details, but matmul-sanity's throughput,
    findings, exit code, signal and stderr tail), or None when it is not laid out as gpudoctor
    writes a report."""
    mark = raw.find(_RESULTS_MARK)
    if mark < 0:
        return None
    parts = []
    append = parts.append
    find, rfind, startswith = raw.find, raw.rfind, raw.startswith
    search = _RESULT_END.search
    pos = 0  # raw[:pos] is dealt with
    start = find(_DETAILS, mark)
    while start >= 0:
        end = search(raw, start)
        if end is None:
            return None
        close = end.start()
        head = rfind(_PROBE_LINE, pos, start)
        append(raw[pos:start])
        if head >= 0 and startswith(_KEEP_DETAILS, head):
            value = find(_THROUGHPUT, start, close)  # a member of the details (indented 8), if any
            if value >= 0:
                value += len(_THROUGHPUT)
                first = raw[value:value + 2]
                stop = find(b"\n        }" if first == b"{\n" else b"\n        ]" if first == b"[\n" else b"\n",
                            value, close)
                if stop < 0:
                    return None
                if first in (b"{\n", b"[\n"):
                    stop += 10
                elif raw[stop - 1:stop] == b",":
                    stop -= 1
                append(_KEPT_DETAILS)
                append(raw[value:stop])
                append(_KEPT_CLOSE)
        pos = close
        if end.group(1) is not None:
            start = find(_DETAILS, end.end())
        elif end.end() > close + 6:  # the report ends: the next one's results, if another follows
            following = find(_RESULTS_MARK, end.end())
            start = find(_DETAILS, following) if following >= 0 else -1
        else:
            return None  # a line of four spaces and `}` that is not a result's end
    append(raw[pos:])
    return b"".join(parts)


def sanitize(value: Any, limit: int = MAX_STRING) -> Any:
    """A deep copy with every string (and key) made safe to print: terminal sequences removed,
    control characters shown, at most `limit` characters each."""
    from gpudoctor.safetext import visible

    if isinstance(value, str):
        return visible(value, limit)
    if isinstance(value, dict):
        return {visible(str(k), 200): sanitize(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v, limit) for v in value]
    return value
