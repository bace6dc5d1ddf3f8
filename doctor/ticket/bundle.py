"""From a failed command to a bug ticket: what `gpudoctor run` does once the command has ended.

    diagnose(result)        the known failures in the output (`gpudoctor.explain.matcher`, ranked as
                            `explain` ranks them) and the Python traceback of the failure
    localize(...)           for an asynchronous CUDA failure: one more run with
                            CUDA_LAUNCH_BLOCKING=1 and TORCH_SHOW_CPP_STACKTRACES=1, and the line
                            and operator that really failed beside the line the first run blamed
    scan_probes(...)        the probes the explanation points at (`Entry.probes`)
    code_patch(...)         the patch for the user's own files the traceback names (gpudoctor.patch)
    build_ticket(...)       all of it as one JSON-ready dict (`RUN_SCHEMA_VERSION`), redacted
    (gpudoctor.ticket.render: the ticket as `ticket.md` (under `MAX_TICKET_CHARS`), as terminal text)
    write_bundle(...)       the bundle folder, never overwriting anything the user had

Redaction: the passthrough of the command's output to the user's own terminal is byte-for-byte
unchanged (it is their program talking to them, and rewriting it would break progress bars and
binary output); everything gpudoctor writes itself (the diagnosis on stderr, `-o`, every bundle
file) goes through `gpudoctor.reports.redact.Redactor` unless the user asks for `--no-redact`.

Nothing here prints. Standard library only, except the renderer for the terminal (rich).
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from gpudoctor.ticket import pytrace
from gpudoctor.safetext import json_text, visible

if TYPE_CHECKING:
    from gpudoctor.knowledge.kb import Entry
    from gpudoctor.explain.matcher import Match
    from gpudoctor.reports.model import Report
    from gpudoctor.ticket.runcmd import RunResult

# 1.1: diagnosis.lines_in; matches carry explain's 1.1 fields (line, ...). 1.2: diagnosis.steps, the
# fix for this machine from the bundle's scan (a finding's `steps`), when the scan has them. 1.3:
# diagnosis.code_patch, the patch for the user's code (gpudoctor.reports.codepatch), or null; and
# explain's verdict: diagnosis.verdict (kind "entry", "platform" or "unrecognised"),
# diagnosis.platform and diagnosis.unrecognised as in explain's JSON 1.2, and diagnosis.entry is
# the verdict's entry (null under a platform or unrecognised verdict; it was the best match's).
RUN_SCHEMA_VERSION = "1.3"
PATCH_TIME_S = 10.0  # the check of the user's code behind a failure
MAX_TICKET_CHARS = 65_000  # GitHub and GitLab refuse an issue body of 65,536 characters or more
LOCALIZE_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}
# Knowledge-base ids of the CUDA errors that surface at a later API call than the one that caused
# them (the kernel-error class whose message carries the "might be asynchronously reported" trailer,
# which `async-error-reporting` recognises on its own).
ASYNC_IDS = ("misaligned-address", "illegal-memory-access", "device-side-assert", "async-error-reporting")
# When nothing known matched, the bundle still scans cuda-runtime: the environment and whether CUDA
# works at all are what a maintainer asks for first.
FALLBACK_PROBES = ("cuda-runtime",)
BUNDLE_FILES = ("ticket.md", "run.json", "scan.json", "output.log")
_TICKET_TAIL_LINES = 200
_ERROR_LINES = 80
_LINE_CHARS = 1000
_CHUNK_CHARS = 64 << 10


# --- reading the output --------------------------------------------------------------------------


def output_text(result: "RunResult") -> str:
    """What was kept of the command's output: the combined head and tail, and the stderr tail too
    when the combined record lost bytes (a traceback on stderr under a flood on stdout)."""
    text = result.output.text()
    if result.output.omitted and result.stderr.total:
        text += "\n[... the end of stderr ...]\n" + result.stderr.tail.decode("utf-8", "replace")
    return text


def clean_log(text: str) -> str:
    """Output as a person saw it, as plain text: a line redrawn with carriage returns (progress bars)
    keeps its last state, terminal sequences are removed, other control characters shown."""
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            line = line.rstrip("\r").rsplit("\r", 1)[-1]
        lines.append(line)
    return visible("\n".join(lines))


@dataclass(frozen=True)
class Diagnosis:
    """The matches in the output, the failure's traceback, and `explain`'s reading of the same
    text (`explained`: gpudoctor.explain.explanation.Explanation, from the matcher's Analysis):
    the verdict is an entry (with the versions the output names filled into its fix), the
    platform the output comes from, or a CUDA error no entry explains, as `explain` says."""

    matches: tuple["Match", ...]
    traceback: pytrace.Traceback | None
    explanation: Any = None  # built from `matches` alone when not given (tests, an interrupted run)

    @property
    def explained(self) -> Any:
        if self.explanation is not None:
            return self.explanation
        from gpudoctor.explain.explanation import Explanation

        best = self.best
        return Explanation(self.matches, best.entry if best is not None and not best.context_only else None)

    @property
    def best(self) -> "Match | None":
        return self.matches[0] if self.matches else None

    @property
    def kind(self) -> str | None:
        """"entry", "platform", "unrecognised", or None: `explain`'s kinds of verdict."""
        return self.explained.kind

    @property
    def entry(self) -> "Entry | None":
        """The verdict's entry (None when the verdict is a platform, an unrecognised CUDA error, or
        nothing)."""
        return self.explained.entry

    @property
    def frame(self) -> pytrace.Frame | None:
        return pytrace.user_frame(self.traceback) if self.traceback else None

    @property
    def specific(self) -> bool:
        """Whether something more than generic context (the async trailer alone) was recognised:
        a specific entry, the platform, or a CUDA error no entry explains."""
        return any(not m.context_only and not m.entry.generic for m in self.matches) or \
            self.kind in ("platform", "unrecognised")


def _line_chunks(text: str, size: int = _CHUNK_CHARS) -> Iterable[str]:
    """`text` in pieces of about `size` that end at line boundaries. The matcher tries a bounded
    number of lines per keyword and chunk; small chunks keep a keyword that a log repeats early
    from hiding the error at its end."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def diagnose(text: str, match: Callable[[Iterable[str]], list] | None = None) -> Diagnosis:
    """The known failures in `text`, best first, the traceback of the failure, and the verdict
    `explain` reaches on the same text (its analysis: an entry, a platform, an unrecognised CUDA
    error). `match`: another matcher returning ranked matches (tests), read as entries only."""
    explanation = None
    if match is None:
        from gpudoctor.explain.explanation import from_analysis
        from gpudoctor.explain.matcher import analyse_chunks

        explanation = from_analysis(analyse_chunks(_line_chunks(text)))
        matches = tuple(explanation.matches)
    else:
        matches = tuple(match(_line_chunks(text)))
    hints = tuple(matches[0].evidence) if matches else ()
    tb = pytrace.failing_traceback(pytrace.parse_tracebacks(text), hints)
    return Diagnosis(matches, tb, explanation)


def is_asynchronous(diagnosis: Diagnosis) -> bool:
    return any(m.id in ASYNC_IDS for m in diagnosis.matches)


def code_patch(diagnosis: Diagnosis, cwd: str | None = None, time_limit: float = PATCH_TIME_S) -> dict[str, Any] | None:
    """The patch for the user's own files that the failure's traceback names, checked with the
    diagnosed entry's lint rules (gpudoctor.patch: bounded in files and time, never writes); None
    when nothing was recognised or no frame is the user's code on this machine. Lint is imported
    only when one is."""
    # only under an entry verdict: a platform or an unrecognised CUDA error has no entry whose
    # rules could check the code
    if diagnosis.kind != "entry" or diagnosis.explained.best is None or diagnosis.traceback is None:
        return None
    from gpudoctor.patch.locate import user_sites

    sites = user_sites(diagnosis.traceback.frames, cwd)
    if not sites:
        return None
    from gpudoctor.patch.search import find_patches

    return find_patches(diagnosis.entry, sites, cwd=cwd, asynchronous=is_asynchronous(diagnosis),
                        time_limit=time_limit)


# --- localizing an asynchronous failure ----------------------------------------------------------


@dataclass(frozen=True)
class Localization:
    """The synchronous re-run and what it says. verdict: "moved" (the real line differs from the
    blamed one), "same", "passed" (the command succeeded when synchronous), "no-traceback",
    "interrupted" (by the user), or "already-synchronous" (CUDA_LAUNCH_BLOCKING=1 was set for the
    first run: nothing re-run)."""

    verdict: str
    env: dict[str, str]
    blamed: pytrace.Frame | None
    real: pytrace.Frame | None = None
    operator: str | None = None
    call: pytrace.Frame | None = None  # the library function the real line called into
    exception: str | None = None
    result: "RunResult | None" = None
    diagnosis: Diagnosis | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "env": dict(self.env),
            "blamed": self.blamed.to_dict() if self.blamed else None,
            "real": self.real.to_dict() if self.real else None,
            "operator": self.operator,
            "call": self.call.to_dict() if self.call else None,
            "exception": self.exception,
            "summary": self.summary(),
        }
        if self.result is not None:
            out["exit_status"] = self.result.exit_status
            out["how"] = self.result.how
            out["duration_s"] = round(self.result.duration_s, 3)
        if self.diagnosis is not None:
            out["matches"] = [m.to_dict() for m in self.diagnosis.matches]
        return out

    def summary(self) -> str:
        """One sentence for people."""
        if self.verdict == "already-synchronous":
            return "CUDA_LAUNCH_BLOCKING=1 was already set: the line shown is the line that failed."
        if self.verdict == "interrupted":
            return "The synchronous re-run was interrupted: nothing to compare."
        if self.verdict == "passed":
            return ("With CUDA_LAUNCH_BLOCKING=1 the command succeeded: the failure depends on "
                    "asynchronous execution (a race between streams, or memory read before a kernel wrote it).")
        if self.verdict == "no-traceback":
            how = self.result.how if self.result else "ended"
            return f"The synchronous re-run {how} without a Python traceback to locate."
        real = _where(self.real) if self.real else "?"
        op = f" (operator {self.operator})" if self.operator else ""
        if self.verdict == "same":
            return f"With CUDA_LAUNCH_BLOCKING=1 it fails at the same line, {real}{op}: the line shown is right."
        blamed = _where(self.blamed) if self.blamed else "no line"
        return f"With CUDA_LAUNCH_BLOCKING=1 it fails at {real}{op}; the first run blamed {blamed}."


def _where(frame: pytrace.Frame) -> str:
    return f"{frame.file}:{frame.line} in {frame.function}" if frame.function else frame.location()


def localize(
    argv: Sequence[str],
    first: Diagnosis,
    *,
    environ: Mapping[str, str] | None = None,
    run: Callable[..., "RunResult"] | None = None,
    **run_options: Any,
) -> Localization:
    """Re-run `argv` once with LOCALIZE_ENV and compare where it fails with where `first` blamed.
    `run` is `gpudoctor.ticket.runcmd.run_command` (tests pass another)."""
    environ = dict(os.environ if environ is None else environ)
    blamed = first.frame
    if environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        return Localization("already-synchronous", {}, blamed, real=blamed)
    if run is None:
        from gpudoctor.ticket.runcmd import run_command as run
    environ.update(LOCALIZE_ENV)
    result = run(argv, env=environ, **run_options)
    if result.interrupts:
        return Localization("interrupted", dict(LOCALIZE_ENV), blamed, result=result)
    if result.ok:
        return Localization("passed", dict(LOCALIZE_ENV), blamed, result=result)
    text = output_text(result)
    second = diagnose(text)
    tb = second.traceback
    if tb is None:
        return Localization("no-traceback", dict(LOCALIZE_ENV), blamed, result=result, diagnosis=second)
    real = pytrace.user_frame(tb)
    operator = pytrace.cpp_operator("\n".join(tb.message)) or pytrace.cpp_operator(text)
    same = blamed is not None and real is not None and (blamed.file, blamed.line) == (real.file, real.line)
    return Localization("same" if same else "moved", dict(LOCALIZE_ENV), blamed, real=real, operator=operator,
                        call=pytrace.library_call(tb), exception=tb.exception, result=result, diagnosis=second)


# --- the scan ------------------------------------------------------------------------------------


def known_probe_ids() -> tuple[str, ...]:
    from gpudoctor.probes import load_builtin

    return tuple(m.SPEC.id for m in load_builtin())


def scan_probes(diagnosis: Diagnosis, known: Sequence[str] | None = None) -> tuple[str, ...]:
    """The probes the explanation points at (each recognised entry's `probes`, best match first),
    or FALLBACK_PROBES when nothing known was recognised."""
    known = tuple(known if known is not None else known_probe_ids())
    out: list[str] = []
    for m in sorted(diagnosis.matches, key=lambda m: m.context_only):
        for probe in m.entry.probes:
            if probe in known and probe not in out:
                out.append(probe)
    return tuple(out) or tuple(p for p in FALLBACK_PROBES if p in known)


# The second line of pip's (distlib's) launcher for an interpreter whose path a `#!` line cannot hold.
_SH_EXEC = b"'''exec' "


def guess_python(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> str | None:
    """The interpreter the command runs: its first word when that is a Python, or the `#!` line of
    the script it names (`torchrun`, `accelerate`), also in the form pip writes when the
    interpreter's path has a space or is longer than a `#!` line holds (`#!/bin/sh`, then
    `'''exec' "/path with space/bin/python" "$0" "$@"`); None when neither says."""
    if not argv:
        return None
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    found = shutil.which(argv[0], path=path)
    if found is None:
        return None
    if _is_python_name(os.path.basename(found)):
        return found
    try:
        with open(found, "rb") as fh:
            first = fh.readline(256)
            second = fh.readline(4096) if first.rstrip() == b"#!/bin/sh" else b""
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    if second.startswith(_SH_EXEC):
        try:
            words = shlex.split(second[len(_SH_EXEC):].decode("utf-8", "replace"))
        except ValueError:  # unbalanced quotes: not pip's launcher
            return None
        return words[0] if words and _is_python_name(os.path.basename(words[0])) else None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        if words and _is_python_name(words[0]):
            return shutil.which(words[0], path=path)
        return None
    return words[0] if words and _is_python_name(os.path.basename(words[0])) else None


def _is_python_name(name: str) -> bool:
    import re

    return re.fullmatch(r"python(?:\d+(?:\.\d+)?)?", name) is not None


# --- the ticket record ---------------------------------------------------------------------------


def entry_brief(entry: "Entry") -> dict[str, Any]:
    """What a ticket shows of a knowledge-base entry: `explain`'s JSON form of it, less the
    corrections (they are about the field notes, which users never see) and with only the public
    references (those with a URL)."""
    from gpudoctor.explain.explanation import entry_to_dict

    data = entry_to_dict(entry)
    data.pop("corrections", None)
    data["references"] = [{"title": r["title"], "url": r["url"]} for r in data.get("references") or [] if r.get("url")]
    return data


def _diagnosis_dict(d: Diagnosis) -> dict[str, Any]:
    from gpudoctor.explain.explanation import verdict_parts

    entry = d.entry
    return {
        # explain's verdict (kind entry, platform or unrecognised), the platform and the CUDA
        # error no entry explains, in explain's JSON shape
        **verdict_parts(d.explained),
        # Each match's `line` and `evidence_lines` count lines of the output the matcher read:
        # output.log for the run itself (see `lines_in`).
        "matches": [m.to_dict() for m in d.matches],
        "entry": entry_brief(entry) if entry is not None else None,
        "traceback": d.traceback.to_dict() if d.traceback else None,
    }


def build_ticket(
    result: "RunResult",
    diagnosis: Diagnosis,
    *,
    localization: Localization | None = None,
    scan: "Report | None" = None,
    probes: Sequence[str] = (),
    scan_error: str | None = None,
    redactor: Any = None,
    created: str | None = None,
    tool_version: str | None = None,
    cwd: str | None = None,
    code_patch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything about the run as one JSON-ready dict, redacted with `redactor` (a
    `gpudoctor.reports.redact.Redactor`; None keeps everything as it was). `code_patch`: the
    patch for the user's code (`code_patch(diagnosis)`), redacted with the rest."""
    import gpudoctor

    if tool_version is None:
        tool_version = gpudoctor.__version__
    if created is None:
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    shown = diagnosis
    source = "run"
    if localization is not None and localization.diagnosis is not None:
        # The synchronous run names the error itself where the first run showed only the trailer.
        if localization.diagnosis.specific and not diagnosis.specific:
            shown, source = localization.diagnosis, "synchronous re-run"
    ticket: dict[str, Any] = {
        "schema_version": RUN_SCHEMA_VERSION,
        "kind": "gpudoctor-run",
        "tool": {"name": "gpudoctor", "version": tool_version},
        "created": created,
        "redacted": redactor is not None,
        "command": {
            "argv": list(result.argv),
            "line": shlex.join(result.argv),
            "cwd": cwd if cwd is not None else _cwd(),
        },
        "exit": {
            "status": result.exit_status,
            "code": result.returncode,
            "signal": result.signal_name,
            "how": result.how,
            "duration_s": round(result.duration_s, 3),
            "interrupted": result.interrupts > 0,
            "forwarded_signals": list(result.forwarded),
        },
        "output": {
            "bytes": {"stdout": result.stdout.total, "stderr": result.stderr.total},
            "tty": dict(result.tty),
            "omitted_bytes": result.output.omitted,
            "log": clean_log(output_text(result)),
        },
        # lines_in: what the matches' line numbers count: the run's output (output.log in the
        # bundle, `output.log` here), or the synchronous re-run's, which is not kept.
        "diagnosis": dict(_diagnosis_dict(shown), source=source,
                          lines_in="output.log" if source == "run" else "synchronous re-run", code_patch=code_patch),
        "localization": localization.to_dict() if localization is not None else None,
        "scan": {"probes": [], "error": None, "report": None},
    }
    if redactor is not None:
        ticket = redactor.value(ticket)
        ticket["redacted"] = True
    if scan is not None or scan_error is not None or probes:
        attach_scan(ticket, scan, probes, scan_error, redactor)
    return ticket


def attach_scan(ticket: dict[str, Any], report: "Report | None", probes: Sequence[str],
                error: str | None, redactor: Any = None) -> None:
    """Put the bundle's scan into a ticket built before it ran (the report redacted like the rest)."""
    data = report.to_dict() if report is not None else None
    if redactor is not None:
        from gpudoctor.reports.redact import redact_report

        data = redact_report(data, redactor) if data is not None else None
        error = redactor.text(error) if error else error
    ticket["scan"] = {"probes": list(probes), "error": error, "report": data}
    steps = machine_steps(ticket.get("diagnosis") or {}, data)
    if steps:
        ticket["diagnosis"]["steps"] = steps


def machine_steps(diagnosis: Mapping[str, Any], report: Mapping[str, Any] | None) -> list[str]:
    """The fix for this machine: the `steps` of the scan's finding for the diagnosed id (the probe
    that found it knows which cause it is: a CPU-only build of this torch, no driver, ...). One
    source for a finding's steps, the probe's; [] when the scan has none for that id, and the
    entry's generic list is shown."""
    entry = diagnosis.get("entry") or {}
    for result in (report or {}).get("results") or []:
        for finding in result.get("findings") or []:
            if finding.get("kb_id") == entry.get("id") and finding.get("steps"):
                return [str(step) for step in finding["steps"]]
    return []


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return "?"


# --- the bundle ----------------------------------------------------------------------------------


class BundleError(Exception):
    """The bundle cannot be written; str(exc) is one line for the user."""


def check_bundle_dir(path: str) -> None:
    """Refuse, before the command runs, a bundle path that can never be used."""
    if not path:
        raise BundleError("--bundle: empty path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise BundleError(f"--bundle {path}: exists and is not a directory")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise BundleError(f"--bundle {path}: {probe} is not a writable directory")


def _bundle_dir(path: str, now: _dt.datetime) -> tuple[str, bool]:
    """The folder to write in, and whether it is a new subfolder: `path` itself when it is missing
    or empty, else a new `gpudoctor-run-<time>` inside it (never one that exists)."""
    check_bundle_dir(path)
    try:
        try:
            os.makedirs(path)
            return path, False
        except FileExistsError:
            pass
        if not os.listdir(path):
            return path, False
        stem = "gpudoctor-run-" + now.strftime("%Y%m%d-%H%M%S")
        for n in range(1, 1000):
            sub = os.path.join(path, stem if n == 1 else f"{stem}-{n}")
            try:
                os.mkdir(sub)  # exclusive: a folder someone else just made is never shared
                return sub, True
            except FileExistsError:
                continue
    except OSError as exc:
        raise BundleError(f"--bundle {path}: {exc.strerror or exc}") from None
    raise BundleError(f"--bundle {path}: too many bundles from the same second")


def write_new_file(folder: str, name: str, text: str) -> str:
    """Write `folder/name` atomically and never over an existing file: a temporary file is filled,
    then hard-linked into place (which fails if the name exists) or, where the filesystem has no
    hard links, renamed after a check."""
    final = os.path.join(folder, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise BundleError(f"{final}: already exists; not overwritten") from None
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            if os.path.lexists(final):
                raise BundleError(f"{final}: already exists; not overwritten") from None
            os.rename(tmp, final)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return final


def bundle_files(ticket: dict[str, Any]) -> dict[str, str]:
    """The bundle's files and their text: ticket.md, run.json (the ticket without the log and the
    scan, which have files of their own), scan.json (when a scan ran), output.log."""
    from gpudoctor.ticket.render import render_json, render_markdown

    record = json.loads(json.dumps(ticket))
    log = record["output"].pop("log", "")
    record["output"]["log_file"] = "output.log"
    report = record["scan"].pop("report", None)
    files = {"ticket.md": render_markdown(ticket)}
    if report is not None:
        record["scan"]["report_file"] = "scan.json"
        files["scan.json"] = json_text(json.dumps(report, indent=2, ensure_ascii=False)) + "\n"
    files["run.json"] = render_json(record)
    files["output.log"] = log if log.endswith("\n") or not log else log + "\n"
    return files


def write_bundle(path: str, ticket: dict[str, Any], now: _dt.datetime | None = None) -> tuple[str, bool, list[str]]:
    """Write the bundle under `path` (see `_bundle_dir`); returns (folder, new subfolder?, files)."""
    folder, sub = _bundle_dir(path, now or _dt.datetime.now())
    written = []
    try:
        for name, text in bundle_files(ticket).items():
            write_new_file(folder, name, text)
            written.append(name)
    except OSError as exc:
        raise BundleError(f"cannot write the bundle in {folder}: {exc.strerror or exc}") from None
    return folder, sub, written
