"""The lint rules: one module per rule in this package, named after it (`gpu003_view_after_transpose`),
holding the rule's documentation as data (code, knowledge-base id, the file kinds it reads, the
cheap substring prefilter that decides whether a file is parsed for it, what it finds, why that
breaks, an example, the fix and how safe the fix is) and its check, or the entry point to it
where a family module does the work (GPU006: pyarch, buildflags and archflags; GPU009, GPU010: cpprules;
GPU012: pycontig). gpudoctor.lint.pyrules runs the Python checks by its code -> module table.

Here: the `Rule` type, the registry (`MODULES` in code order, `RULES`, `BY_CODE`), selection by
code prefix, and the documentation `gpudoctor explain GPU003` prints (`describe`) and the rule
table in docs/lint.md (`markdown_table`). Importing it loads the rule modules with what their
checks need at the top (pysource, model, castflow): tens of milliseconds; the dataflow (pyflow),
the C++ parser and the build-file readers load when a file needs them.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

# File kinds (engine.classify tells them from file names).
PYTHON, CPP, BUILD = "python", "cpp", "build"

CODE_RE = re.compile(r"^GPU\d{3}$", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str  # kebab-case, for people
    kb_id: str
    title: str
    kinds: tuple[str, ...]
    # Prefilter: every group must have at least one of its byte strings in the file. Only files
    # that pass are parsed for this rule (TorchFix's "torch" prefilter, made per rule).
    prefilter: tuple[tuple[bytes, ...], ...]
    what: str
    why: str
    example: str
    fix: str
    fix_safety: str  # "safe" / "unsafe" / "display-only", then why
    near_misses: str
    # Optional regexes over the raw bytes, checked after the substring groups pass: every element
    # must match; an element that is a tuple matches when any of its regexes does (separate
    # regexes, each with its literal prefix, are several times faster than one alternation).
    pattern: bytes | tuple[bytes | tuple[bytes, ...], ...] | None = None
    # How bad a finding is, in SARIF's words (GitHub code scanning and annotations use them):
    # "error" fails or computes wrong results when it runs, "warning" costs memory or time or
    # is deprecated, "note" is informational.
    level: str = "error"

    def wants(self, data: bytes, seen: dict | None = None) -> bool:
        """Whether the file's bytes pass this rule's prefilter. `seen`: what the other rules'
        checks of the same file found (a substring or pattern is searched once per file)."""
        seen = {} if seen is None else seen
        for group in self.prefilter:
            for s in group:
                hit = seen.get(s)
                if hit is None:
                    hit = seen[s] = s in data
                if hit:
                    break
            else:
                return False
        if self.pattern is None:
            return True
        patterns = self.pattern if isinstance(self.pattern, tuple) else (self.pattern,)
        for p in patterns:
            alternatives = p if isinstance(p, tuple) else (p,)
            for a in alternatives:
                key = (a,)  # a regex, kept apart from a substring spelt the same
                hit = seen.get(key)
                if hit is None:
                    hit = seen[key] = _search(a, data)
                if hit:
                    break
            else:
                return False
        return True


_PATTERNS: dict[bytes, tuple[re.Pattern[bytes], re.Pattern[bytes] | None]] = {}


def _search(pattern: bytes, data: bytes) -> bool:
    """Whether `pattern` (re.M) matches somewhere in `data`. A pattern that starts at a line
    (`^...`) is searched as `\n...` (a literal first byte: the regex engine skips from newline to
    newline instead of trying every position, 2-3x faster on source files), and matched at
    position 0 for the first line: the same matches."""
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        if pattern.startswith(b"^"):
            compiled = re.compile(b"\n" + pattern[1:], re.M), re.compile(pattern, re.M)
        else:
            compiled = re.compile(pattern, re.M), None
        _PATTERNS[pattern] = compiled
    anywhere, first_line = compiled
    return anywhere.search(data) is not None or (first_line is not None and first_line.match(data) is not None)


# The rules in code order, one module each, named after the rule: its documentation and its check
# (tests/test_lint_rules.py holds this list to the modules in this folder).
MODULES: tuple[str, ...] = (
    "gpu001_naive_attention",
    "gpu002_sdp_kernel_deprecated",
    "gpu003_view_after_transpose",
    "gpu004_shape_tensor_arithmetic",
    "gpu005_parameter_reassign",
    "gpu006_no_kernel_for_newer_gpus",
    "gpu007_xformers_attention",
    "gpu008_flash_attn_layout",
    "gpu009_data_ptr_unchecked",
    "gpu010_allocator_mismatch",
    "gpu011_module_after_cast",
    "gpu012_strided_into_checking_kernel",
)
RULES: tuple[Rule, ...] = tuple(importlib.import_module(f"{__name__}.{m}").RULE for m in MODULES)

BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}


def select(select: list[str] | None, ignore: list[str] | None) -> tuple[Rule, ...]:
    """The rules chosen by code prefixes (`GPU0`, `GPU003`) and `ALL`; ignore wins over select.
    Raises ValueError naming a selector that matches no rule."""

    def matches(selector: str) -> list[Rule]:
        s = selector.strip().upper()
        if s == "ALL":
            return list(RULES)
        found = [r for r in RULES if r.code.startswith(s)]
        if not s or not found:
            raise ValueError(f"unknown rule code {selector!r} (codes are {RULES[0].code}..{RULES[-1].code}, or ALL)")
        return found

    chosen = {r.code for sel in (select or ["ALL"]) for r in matches(sel)}
    dropped = {r.code for sel in (ignore or []) for r in matches(sel)}
    return tuple(r for r in RULES if r.code in chosen and r.code not in dropped)


@dataclass(frozen=True)
class RuleDoc:
    rule: Rule

    def to_dict(self) -> dict[str, str]:
        r = self.rule
        return {"code": r.code, "name": r.name, "kb_id": r.kb_id, "title": r.title,
                "applies_to": ", ".join(r.kinds), "what": r.what, "why": r.why, "example": r.example,
                "fix": r.fix, "fix_safety": r.fix_safety, "near_misses": r.near_misses}


def describe(code: str) -> RuleDoc | None:
    """The documentation of a lint rule by code (case-insensitive), or None."""
    rule = BY_CODE.get(code.strip().upper())
    return RuleDoc(rule) if rule else None


def markdown_table() -> str:
    """The rule table in docs/lint.md (python tools/docs_tables.py writes it there)."""
    rows = ["| code | finds | knowledge-base id | fix |", "| --- | --- | --- | --- |"]
    for r in RULES:
        safety = r.fix_safety.split(":", 1)[0]
        rows.append(f"| `{r.code}` | {r.title.replace('|', chr(92) + '|')} | `{r.kb_id}` | {safety} |")
    return "\n".join(rows) + "\n"
