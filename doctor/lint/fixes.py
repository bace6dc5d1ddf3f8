"""Applying fixes: edits merged per file (a finding's edits go in together or not at all; the same
edit from two findings, such as one added import, counts once), the result re-parsed to prove it
is valid before anything is written, re-linted until no applicable fix is left, and written
atomically (a temporary file in the same folder, the original's mode, then a rename). A file that
changed since it was linted, or whose fixed text does not parse, is left untouched.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import stat
import tempfile

from gpudoctor.lint import engine
from gpudoctor.lint.model import SAFE, UNSAFE, Edit, Finding

MAX_ROUNDS = 5


class FixError(Exception):
    pass


def applicable(f: Finding, unsafe: bool) -> bool:
    return bool(f.fix.edits) and (f.fix.applicability == SAFE or (unsafe and f.fix.applicability == UNSAFE))


def apply_edits(text: str, findings: list[Finding]) -> tuple[str, list[Finding]]:
    """Apply every finding whose edits do not overlap those already taken."""
    taken: set[Edit] = set()
    accepted: list[Finding] = []
    for f in sorted(findings, key=lambda f: min(e.start for e in f.fix.edits)):
        new = [e for e in f.fix.edits if e not in taken]
        if any(_overlaps(e, t) for e in new for t in taken):
            continue
        if any(_overlaps(a, b) for i, a in enumerate(new) for b in new[i + 1:]):
            continue
        taken.update(new)
        accepted.append(f)
    out = text
    for e in sorted(taken, key=lambda e: (e.start, e.end), reverse=True):
        out = out[: e.start] + e.text + out[e.end:]
    return out, accepted


def _overlaps(a: Edit, b: Edit) -> bool:
    if a == b:
        return False
    if a.start == a.end or b.start == b.end:  # insertions conflict only strictly inside a replacement
        point, other = (a, b) if a.start == a.end else (b, a)
        if point.start == point.end and other.start == other.end:
            return point.start == other.start and point.text != other.text
        return other.start < point.start < other.end
    return a.start < b.end and b.start < a.end


def unified_diff(path: str, old: str, new: str) -> str:
    a, b = (path, path) if os.path.isabs(path) else (f"a/{path}", f"b/{path}")
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=a, tofile=b)
    out = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return out


def _verify(task: engine.Task, text: str) -> None:
    if task.kind == "python":
        import ast

        try:
            ast.parse(text, filename=task.path)
        except (SyntaxError, ValueError) as exc:
            raise FixError(f"the fixed text would not parse ({exc}); file left unchanged") from None


def cross_file(findings: list[Finding], result: engine.FileResult) -> list[Finding]:
    """The findings of one file that the cross-file step added (a tensor of sizes handed over by
    another module, a late method another module calls after a cast): `fix_file` applies them with
    the file's own; a re-lint of the file alone could not find them again."""
    own = set(result.findings)
    return [f for f in findings if f.path == result.path and f not in own]


def fix_file(task: engine.Task, result: engine.FileResult, unsafe: bool,
             extra: list[Finding] | tuple[Finding, ...] = ()) -> tuple[str, str, int]:
    """(original text, fixed text, findings fixed) for one file, with `extra` findings of it from
    the cross-file step (`cross_file`); raises FixError."""
    with open(task.path, "rb") as f:
        data = f.read(engine.MAX_BYTES + 1)
    extra = [f for f in extra if applicable(f, unsafe)]
    # A file with only cross-file fixes was read by the project pass, which keeps no digest.
    if (result.digest is None and not extra) or \
            (result.digest is not None and hashlib.sha256(data).hexdigest() != result.digest):
        raise FixError("changed since it was linted; not fixed")
    original = engine._decode(data, task.kind)
    text = original
    findings = [f for f in result.findings if applicable(f, unsafe)] + extra
    fixed = 0
    for _ in range(MAX_ROUNDS):
        if not findings:
            break
        new, accepted = apply_edits(text, findings)
        if not accepted or new == text:
            break
        _verify(task, new)
        fixed += len(accepted)
        text = new
        again = engine.FileResult(task.path)
        codes = {f.code for f in findings} | set(task.codes)
        try:
            relinted = engine.lint_text(task.path, task.kind, task.subkind, text, text.encode("utf-8", "surrogateescape"),
                                        codes, again)
        except (SyntaxError, ValueError) as exc:
            raise FixError(f"the fixed text would not parse ({exc}); file left unchanged") from None
        suppress = engine._suppressions(text, task.kind) if "gpudoctor:" in text else {}
        findings = [f for f in relinted if applicable(f, unsafe) and not engine.suppressed(f, suppress)]
    return original, text, fixed


def encode(task: engine.Task, text: str, original_bytes: bytes) -> bytes:
    if task.kind == "python":
        import io
        import tokenize

        encoding, _ = tokenize.detect_encoding(io.BytesIO(original_bytes).readline)
        return text.encode(encoding)
    return text.encode("utf-8", "surrogateescape")


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` by a renamed temporary file in the same folder, keeping its mode; the
    target of a symlink is what gets replaced."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real) or "."
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def finding_diff(task: engine.Task, text: str, f: Finding) -> str | None:
    """The unified diff of one finding's own edits against the linted text."""
    if not f.fix.edits:
        return None
    new, accepted = apply_edits(text, [f])
    return unified_diff(task.path, text, new) if accepted else None
