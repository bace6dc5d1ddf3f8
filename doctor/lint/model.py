"""What `gpudoctor lint` produces: findings with positions and graded fixes, per-file errors, and
internal errors (a rule that failed on a file).

Positions are 1-based lines and 1-based columns counted in characters (what editors show).
A fix is a set of text edits on the file's decoded text, graded like the knowledge base's
patches: `safe` (keeps behaviour; `--fix` applies it), `unsafe` (probably what you want, but
it can change behaviour; needs `--unsafe-fixes`) or `display-only` (no edit: the finding says
what to change by hand).

Standard library only; nothing here reads files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SAFE, UNSAFE, DISPLAY_ONLY = "safe", "unsafe", "display-only"
APPLICABILITY = (SAFE, UNSAFE, DISPLAY_ONLY)


@dataclass(frozen=True, order=True)
class Edit:
    """Replace text[start:end] (character offsets in the decoded file) with `text`."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Fix:
    applicability: str
    description: str
    edits: tuple[Edit, ...] = ()

    def __post_init__(self) -> None:
        if self.applicability not in APPLICABILITY:
            raise ValueError(f"applicability must be one of {APPLICABILITY}")
        if self.applicability == DISPLAY_ONLY and self.edits:
            raise ValueError("a display-only fix carries no edits")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    kb_id: str
    message: str
    fix: Fix
    end_line: int = 0
    end_col: int = 0

    @property
    def sort_key(self) -> tuple[Any, ...]:
        return (self.path, self.line, self.col, self.code, self.message)

    def to_dict(self, diff: str | None = None) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "end_line": self.end_line or self.line,
            "end_col": self.end_col or self.col,
            "code": self.code,
            "kb_id": self.kb_id,
            "message": self.message,
            "fix": {
                "applicability": self.fix.applicability,
                "description": self.fix.description,
                "diff": diff,
            },
        }


@dataclass(frozen=True)
class FileError:
    """A file that could not be linted: unreadable, undecodable, or not parseable."""

    path: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "message": self.message}


@dataclass(frozen=True)
class InternalError:
    """A rule that failed on a file (a bug in gpudoctor, not in the file): that rule's findings
    for that file are missing, everything else was linted. `path` is None for a rule's
    cross-file step (it failed on the project as a whole); `code` is None when the failure was
    not inside one rule (every rule's findings for the file are missing)."""

    path: str | None
    code: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rule": self.code, "message": self.message}

    def describe(self) -> str:
        """One line for people: where, which rule, what failed."""
        where = self.path if self.path is not None else "(the project)"
        rule = f"{self.code}" if self.code else "every rule"
        return f"{where}: internal error in {rule}, its findings here are missing: {self.message}"


class NotLinted(Exception):
    """A file that cannot be linted for a reason outside gpudoctor's code (a parser that cannot
    be loaded, a limit): reported as a file error, never as an internal error."""


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    # rules that failed on a file: reported, and the exit code says so (see gpudoctor.lint.cli)
    internal_errors: list[InternalError] = field(default_factory=list)
    files_checked: int = 0
    # Filled by --fix / --diff: path -> unified diff (of the fixes applied or available), and
    # how many findings the applied fixes removed.
    diffs: dict[str, str] = field(default_factory=dict)
    fixed: int = 0
