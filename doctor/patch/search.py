"""The bounded check of the user's code behind a diagnosis, and the patches it yields.

`find_patches(entry, sites)` runs the entry's lint rules (`Entry.lint`) over the project around
the traceback's frames (gpudoctor.patch.locate), at most `MAX_FILES` files (else over the
traceback's files alone, as also when the project's lint configuration excludes them) and at
most `TIME_LIMIT_S` seconds in all (the check runs in a daemon thread; when the time is up, the
answer says so and nothing waits for it). It returns the
JSON-ready dict that gpudoctor.reports.codepatch documents and renders, or None when no frame is
the user's code on this machine (then `explain` and `run` behave as they did without it).

Which findings bear on the failure, best first:

    0  on a line of the traceback (the failing line, or a call on its way there)
    1  in a function the traceback passes through
    2  elsewhere in a file the traceback passes through
    3  elsewhere in the project: only for rules whose pattern lives away from the failing line
       by nature (a module created after the cast, build flags, C++ kernels and allocators,
       xformers call sites, a parameter converted and thrown away); a view or a shape unpacked
       in a file the traceback never reached is another bug, not this one

Each rule's findings become one patch: the diff is exactly what the apply command writes
(`gpudoctor lint --fix --select CODE PATHS`, `--unsafe-fixes` when a fix is unsafe), checked by
running lint's own preview on those paths, the fewest that reproduce the findings (the findings'
files; then with the traceback's files added innermost first, for a finding that needs its
caller; then the project folder).
Findings whose fix is display-only are shown with what to change by hand.
"""
from __future__ import annotations

import ast
import os
import shlex
import threading
from typing import Any, Callable

from gpudoctor.patch.locate import Site, project_root, shown

MAX_FILES = 300
TIME_LIMIT_S = 5.0
MAX_RULES = 3  # rules with findings shown
MAX_BY_HAND = 3  # display-only findings shown per rule
_MAX_PARSE = 2 * 1024 * 1024  # a traceback file larger than this is not parsed for its functions

# Rules whose finding is only about this failure where the traceback reaches it (tiers 0-2).
NEAR = frozenset({"GPU001", "GPU002", "GPU003", "GPU004", "GPU008", "GPU012"})

# What the line a rule's patch changes is, for "the patch changes line 31, where ...".
CHANGES = {
    "GPU001": "where the full attention score matrix is built",
    "GPU002": "where the deprecated sdp_kernel() is entered",
    "GPU003": "where .view() merges dimensions that a transpose left apart in memory",
    "GPU004": "where the shape tensor is unpacked",
    "GPU005": "where the parameter is replaced by, or converted into, a plain tensor",
    "GPU006": "where the build flags leave newer GPUs without a kernel",
    "GPU007": "where xformers attention is called",
    "GPU008": "where flash_attn is given the SDPA layout",
    "GPU009": "where the extension reads a raw pointer of a tensor it never checked",
    "GPU010": "where the allocator's size or release does not match",
    "GPU011": "where the module is created after the model was cast",
    "GPU012": "where the call hands a transposed or permuted view to a kernel that checks its layout",
}


def find_patches(entry: Any, sites: list[Site], *, cwd: str | None = None, asynchronous: bool | None = None,
                 time_limit: float = TIME_LIMIT_S, max_files: int = MAX_FILES) -> dict[str, Any] | None:
    """The code patch for `entry` (a knowledge-base Entry) from the user's frames `sites`
    (innermost last); None when there are none."""
    if not sites:
        return None
    cwd = cwd or os.getcwd()
    if asynchronous is None:
        asynchronous = bool(entry.sticky) or entry.id == "async-error-reporting"
    inner = sites[-1]
    out: dict[str, Any] = {
        "status": "no-rules",
        "entry": entry.id,
        "rules": [],
        "root": None,
        "scope": None,
        "files_checked": 0,
        "traceback_files": _unique(shown(s.path, cwd) for s in sites),
        "stops_at": {"file": shown(inner.path, cwd), "line": inner.line, "code": _code(inner)},
        "note": "",
        "no_patch": entry.no_patch or None,
        "patches": [],
    }
    from gpudoctor.lint import rules  # only now: a frame's file exists here

    codes = [c for c in entry.lint if c in rules.BY_CODE]
    if not codes:
        out["note"] = f"gpudoctor has no lint rule for {entry.id}: the generic patch below applies."
        return out
    out["rules"] = codes
    root = project_root(sites)
    out["root"] = shown(root, cwd) if root else None
    value, failure = _bounded(lambda: _check(entry, codes, sites, root, cwd, max_files, asynchronous), time_limit)
    if failure == "timed-out":
        where = out["root"] or " ".join(out["traceback_files"])
        out.update(status="timed-out", note=(
            f"The check of your code stopped after {time_limit:g} s; `gpudoctor lint --select {','.join(codes)} "
            f"{where}` runs it without a limit."))
        return out
    if failure is not None:
        out.update(status="error", note=f"Your code could not be checked: {failure}")
        return out
    out.update(value)
    return out


def _unique(items: Any) -> list[str]:
    seen: list[str] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _code(site: Site) -> str:
    """The frame's source line: as the traceback printed it, else read from the file."""
    if site.code:
        return site.code
    try:
        with open(site.path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if n == site.line:
                    return line.strip()[:300]
                if n > site.line:
                    break
    except OSError:
        pass
    return ""


def _bounded(work: Callable[[], Any], time_limit: float) -> tuple[Any, str | None]:
    """Run `work` in a daemon thread for at most `time_limit` seconds: (its value, None), (None,
    "timed-out") or (None, one line saying what went wrong)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except RecursionError:
            box["error"] = "a file is nested too deeply to analyse"
        except (ValueError, OSError, MemoryError) as exc:  # a bad configuration, an unreadable file
            box["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=target, name="gpudoctor-patch", daemon=True)
    thread.start()
    thread.join(time_limit)
    if thread.is_alive():
        return None, "timed-out"
    if "error" in box:
        return None, str(box["error"]).splitlines()[0][:300] if box["error"] else "unknown error"
    return box.get("value"), None


# --- the check -------------------------------------------------------------------------------------


def _real(path: str, cwd: str) -> str:
    return os.path.realpath(path if os.path.isabs(path) else os.path.join(cwd, path))


def _function_spans(path: str) -> list[tuple[int, int]]:
    """(first, last) line of every function of a Python file; [] when it cannot be parsed."""
    try:
        if os.path.getsize(path) > _MAX_PARSE:
            return []
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


class _Ranker:
    """The tier of a finding (module docstring) and its order among the traceback's frames."""

    def __init__(self, sites: list[Site]) -> None:
        self.lines: dict[str, list[tuple[int, int]]] = {}  # real path -> [(line, frame index)]
        for i, s in enumerate(sites):
            self.lines.setdefault(s.path, []).append((s.line, i))
        self.functions: dict[str, list[tuple[int, int, int]]] = {}  # path -> [(first, last, frame index)]
        for path, lines in self.lines.items():
            spans = _function_spans(path)
            hits = []
            for line, i in lines:
                inside = [sp for sp in spans if sp[0] <= line <= sp[1]]
                if inside:
                    first, last = max(inside)  # the innermost function holding the frame's line
                    hits.append((first, last, i))
            self.functions[path] = hits

    def rank(self, finding: Any) -> tuple[int, int] | None:
        """(tier, -frame index: the innermost frame first) or None when it does not bear on this."""
        path = _real(finding.path, os.getcwd())
        end = finding.end_line or finding.line
        lines = self.lines.get(path)
        if lines is None:
            return None if finding.code in NEAR else (3, 0)
        on = [i for line, i in lines if finding.line <= line <= end]
        if on:
            return 0, -max(on)
        within = [i for first, last, i in self.functions.get(path, []) if first <= finding.line <= last]
        if within:
            return 1, -max(within)
        return 2, -max(i for _, i in lines)


def _here(path: str) -> str:
    """A path as lint is given it: relative to the folder gpudoctor runs in where it is below it
    (the diff's headers and the command then read `a/model/x.py`), else absolute."""
    return shown(path, os.getcwd())


def _command(code: str, unsafe: bool, paths: list[str]) -> str:
    return " ".join(["gpudoctor lint --fix", *(["--unsafe-fixes"] if unsafe else []), "--select", code,
                     *(shlex.quote(p) for p in paths)])


def _check(entry: Any, codes: list[str], sites: list[Site], root: str | None, cwd: str, max_files: int,
           asynchronous: bool) -> dict[str, Any]:
    from gpudoctor import lint

    site_files = _unique(s.path for s in sites)
    result, scope = None, "traceback"
    if root is not None:
        # the project, unless it is too large or its configuration leaves out the traceback's
        # own files (lint reads a file it is given by name: then those are what is checked)
        result = lint.preview([_here(root)], codes, unsafe_fixes=True, max_files=max_files,
                              required=tuple(p for p in site_files if p.endswith(".py")))
        scope = "project"
    if result is None:
        result, scope = lint.preview([_here(p) for p in site_files], codes, unsafe_fixes=True), "traceback"
    ranker = _Ranker(sites)
    ranked = sorted(((r, f) for f in result.findings for r in [ranker.rank(f)] if r is not None),
                    key=lambda rf: (rf[0], rf[1].path, rf[1].line, rf[1].code))
    by_code: dict[str, list[Any]] = {}
    for _, f in ranked:
        by_code.setdefault(f.code, []).append(f)
    patches: list[dict[str, Any]] = []
    context = _Context(entry, sites, cwd, root if scope == "project" else None, site_files, asynchronous)
    for code in list(by_code)[:MAX_RULES]:
        found = by_code[code]
        fixable = [f for f in found if f.fix.edits]
        made = context.fixable(code, fixable) if fixable else None
        if made is not None:
            patches.append(made)
        # display-only findings, and fixes that no preview reproduced: by hand
        by_hand = [f for f in found if made is None or not f.fix.edits]
        patches += [context.by_hand(f) for f in by_hand[:MAX_BY_HAND]]
    n, where = result.files_checked, shown(root, cwd) if scope == "project" and root else None
    checked = f"{n} file{'s' * (n != 1)}" + (f" under {where}" if where else " of the traceback")
    if patches:
        status, note = "found", ""
    else:
        status = "no-match"
        note = (f"None of the checks for {entry.id} ({', '.join(codes)}) found its pattern in your code ({checked}): "
                "the generic patch below applies.")
    return {"status": status, "scope": scope, "files_checked": n, "note": note, "patches": patches}


class _Context:
    """What the patches are made in: the frames, where the user is (`cwd`: paths are shown
    relative to it), the project folder (None when only the traceback's files were checked)."""

    def __init__(self, entry: Any, sites: list[Site], cwd: str, root: str | None, site_files: list[str],
                 asynchronous: bool) -> None:
        self.entry, self.sites, self.cwd, self.root = entry, sites, cwd, root
        self.site_files, self.asynchronous = site_files, asynchronous

    def fixable(self, code: str, found: list[Any]) -> dict[str, Any] | None:
        """One patch for a rule's findings with edits: the fewest paths whose preview reproduces
        them, and its diff."""
        from gpudoctor import lint
        from gpudoctor.lint.model import UNSAFE

        unsafe = any(f.fix.applicability == UNSAFE for f in found)
        keys = {(_real(f.path, os.getcwd()), f.line) for f in found}
        files = _unique(_real(f.path, os.getcwd()) for f in found)
        tried: list[list[str]] = []
        inner_first = _unique(reversed(self.site_files))
        widening = [_unique([*files, *inner_first[:k]]) for k in range(len(inner_first) + 1)]
        for paths in (*widening, [self.root] if self.root else None):
            if not paths or paths in tried:
                continue
            tried.append(paths)
            preview = lint.preview([_here(p) for p in paths], [code], unsafe_fixes=unsafe)
            got = {(_real(g.path, os.getcwd()), g.line) for g in preview.findings if g.code == code and g.fix.edits}
            changed = {_real(p, os.getcwd()) for p in preview.diffs}
            if keys <= got and {k[0] for k in keys} <= changed:
                lead = found[0]
                return {
                    **self._base(lead, code, UNSAFE if unsafe else "safe"),
                    "findings": [self._brief(f) for f in found],
                    "diff": "".join(preview.diffs[p] for p in sorted(preview.diffs)),
                    "files": [shown(_real(p, os.getcwd()), self.cwd) for p in sorted(preview.diffs)],
                    "command": _command(code, unsafe, [shown(p, self.cwd) for p in paths]),
                }
        return None

    def by_hand(self, f: Any) -> dict[str, Any]:
        from gpudoctor.lint.model import DISPLAY_ONLY

        return {**self._base(f, f.code, DISPLAY_ONLY), "findings": [self._brief(f)], "diff": None, "files": [],
                "command": None}

    def _brief(self, f: Any) -> dict[str, Any]:
        return {"file": shown(_real(f.path, os.getcwd()), self.cwd), "lines": [f.line, f.end_line or f.line],
                "message": f.message}

    def _base(self, f: Any, code: str, applicability: str) -> dict[str, Any]:
        from gpudoctor.lint import rules
        from gpudoctor.lint.model import DISPLAY_ONLY

        rule = rules.BY_CODE[code]
        return {
            "file": shown(_real(f.path, os.getcwd()), self.cwd),
            "lines": [f.line, f.end_line or f.line],
            "rule": code,
            "rule_name": rule.name,
            "applicability": applicability,
            "message": f.message,
            "fix": f.fix.description,
            "fix_safety": rule.fix_safety,
            "where": self.where(f, code, "the patch changes" if applicability != DISPLAY_ONLY else
                                "the change belongs at"),
        }

    def where(self, f: Any, code: str, verb: str = "the patch changes") -> str:
        """Which line the patch changes (`verb`) and why, beside the line the traceback stops at."""
        inner = self.sites[-1]
        path = _real(f.path, os.getcwd())
        end = f.end_line or f.line
        on = [s for s in self.sites if s.path == path and f.line <= s.line <= end]
        if on and on[-1] is inner:
            return f"{verb[:1].upper()}{verb[1:]} line {f.line}, the line the traceback stops at."
        if on:
            return (f"{verb[:1].upper()}{verb[1:]} line {f.line}, where the traceback passes on its way to the error "
                    f"(it stops at {shown(inner.path, self.cwd)}:{inner.line}).")
        surfaced = "where the earlier asynchronous failure surfaced" if self.asynchronous else "where the error was raised"
        code_text = _code(inner)
        stops = f"line {inner.line}" if inner.path == path else f"{shown(inner.path, self.cwd)}:{inner.line}"
        changes = f"line {f.line}" if inner.path == path else f"{shown(path, self.cwd)}:{f.line}"
        quoted = f" (`{code_text}`)" if code_text else ""
        return (f"The traceback stops at {stops}{quoted}, {surfaced}; {verb} {changes}, "
                f"{CHANGES.get(code, 'where the rule found the pattern')}.")


# --- the documentation ------------------------------------------------------------------------------


def markdown_table() -> str:
    """Which entries patch the user's code, with which rules, and why not where no edit is made
    (docs/explain.md, between its code-patch markers; python tools/docs_tables.py writes it)."""
    from gpudoctor.knowledge import kb
    from gpudoctor.lint import rules

    rows = ["| id | lint rules | what is printed |", "| --- | --- | --- |"]
    for entry in kb.load_all():
        if not entry.lint:
            continue
        grades = []
        for code in entry.lint:
            rule = rules.BY_CODE.get(code)
            if rule is None:
                continue
            grade = rule.fix_safety.split(":", 1)[0]
            grades.append(f"`{code}` " + ("by hand" if grade == "display-only" else f"a diff ({grade})"))
        edits = [g for g in grades if "a diff" in g]
        said = "a diff of your file and the command that applies it" if edits else "the place to change, by hand"
        why = f" {entry.no_patch}" if entry.no_patch and not edits else ""
        rows.append(f"| `{entry.id}` | {', '.join(grades)} | {said}.{why} |")
    return "\n".join(rows) + "\n"
