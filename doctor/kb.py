"""The knowledge base: one TOML file per known failure in `gpudoctor/knowledge/`, read with tomllib.

An entry file `<id>.toml` holds:

    id            kebab-case, stable (a user-facing name); equals the file name
    title         one line
    aliases       other names a user may type (error codes, short names)
    applicability "safe" | "unsafe" | "display-only": how safe the patch is to apply blindly
    fix_safety    one sentence, required unless applicability is "safe"
    probes        ids of the probes that can detect this failure
    specificity   0..100, how specific the recognised text is; breaks ties between matches
    generic       true only for boilerplate that other errors carry too (the async trailer)
    supersedes    ids this entry outranks when both match (attention-oom supersedes cuda-oom)
    min_support   how many `support` patterns (or derived facts) must match besides an anchor
    what          what happened, for a person who just saw the error
    why           the root causes (list)
    fix           ordered steps (list)
    patch         a unified diff or before/after snippet of the typical fix
    patch_lang    "diff" or "python" (or any Pygments lexer name) for highlighting
    context       lines shown when values were captured from the pasted text, with `{name}`
                  placeholders naming a regex group (a line whose names were not all captured is
                  left out)
    [[corrections]]  claim / truth: where a field note is wrong or dated
    [[references]]   title plus url or seed (a file name in the field notes)
    [[patterns]]     name, regex, keyword, weight (0..1), role ("anchor" | "support"),
                     optional ignore_case; `keyword` is a literal substring every match contains,
                     used to find candidate lines fast in large logs (lower-case when ignore_case)
    [[examples]]     text, source (URL of the public report it was copied from)

Loading is lazy and cached; nothing is read on import.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib  # type: ignore[no-redef]

APPLICABILITY = ("safe", "unsafe", "display-only")
ROLES = ("anchor", "support")
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class KnowledgeBaseError(ValueError):
    """An entry file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Pattern:
    name: str
    source: str  # the regex text; compiled on first use so `explain ID` does not pay for all of them
    keyword: str
    weight: float
    role: str
    ignore_case: bool = False

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        try:
            return re.compile(self.source, re.IGNORECASE if self.ignore_case else 0)
        except re.error as exc:
            raise KnowledgeBaseError(f"pattern {self.name!r}: bad regex: {exc}") from None


@dataclass(frozen=True)
class Reference:
    title: str
    url: str | None = None
    seed: str | None = None


@dataclass(frozen=True)
class Correction:
    claim: str
    truth: str


@dataclass(frozen=True)
class Example:
    text: str
    source: str


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    aliases: tuple[str, ...]
    applicability: str
    fix_safety: str
    probes: tuple[str, ...]
    specificity: int
    generic: bool
    supersedes: tuple[str, ...]
    min_support: int
    what: str
    why: tuple[str, ...]
    fix: tuple[str, ...]
    patch: str
    patch_lang: str
    context: tuple[str, ...]
    corrections: tuple[Correction, ...]
    references: tuple[Reference, ...]
    patterns: tuple[Pattern, ...]
    examples: tuple[Example, ...]

    @property
    def anchors(self) -> tuple[Pattern, ...]:
        return tuple(p for p in self.patterns if p.role == "anchor")


def _req(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise KnowledgeBaseError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise KnowledgeBaseError(f"{where}: field {key!r} must be {kind.__name__}")
    return value


def _strings(data: dict[str, Any], key: str, where: str, *, default: list[str] | None = None) -> tuple[str, ...]:
    value = data.get(key, default) if default is not None else _req(data, key, list, where)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise KnowledgeBaseError(f"{where}: field {key!r} must be a list of strings")
    return tuple(value)


def parse_entry(data: dict[str, Any], where: str, *, compile_patterns: bool = True) -> Entry:
    """Validate one entry's TOML table and build an Entry; raises KnowledgeBaseError. Loading for
    the CLI skips compiling the regexes (they compile on first use); the tests compile them all."""
    entry_id = _req(data, "id", str, where)
    if not ID_RE.match(entry_id):
        raise KnowledgeBaseError(f"{where}: id {entry_id!r} is not kebab-case")
    applicability = _req(data, "applicability", str, where)
    if applicability not in APPLICABILITY:
        raise KnowledgeBaseError(f"{where}: applicability must be one of {APPLICABILITY}")
    fix_safety = data.get("fix_safety", "")
    if applicability != "safe" and not fix_safety:
        raise KnowledgeBaseError(f"{where}: fix_safety is required when applicability is {applicability!r}")

    patterns = []
    for i, p in enumerate(_req(data, "patterns", list, where)):
        pw = f"{where}: patterns[{i}]"
        role = p.get("role", "anchor")
        if role not in ROLES:
            raise KnowledgeBaseError(f"{pw}: role must be one of {ROLES}")
        ignore_case = bool(p.get("ignore_case", False))
        keyword = _req(p, "keyword", str, pw)
        if not keyword or (ignore_case and keyword != keyword.lower()):
            raise KnowledgeBaseError(f"{pw}: keyword must be a non-empty literal (lower-case with ignore_case)")
        weight = float(_req(p, "weight", (int, float), pw))  # type: ignore[arg-type]
        if not 0.0 < weight <= 1.0:
            raise KnowledgeBaseError(f"{pw}: weight must be in (0, 1]")
        pattern = Pattern(_req(p, "name", str, pw), _req(p, "regex", str, pw), keyword, weight, role, ignore_case)
        if compile_patterns:
            try:
                pattern.regex
            except KnowledgeBaseError as exc:
                raise KnowledgeBaseError(f"{pw}: {exc}") from None
        patterns.append(pattern)
    if not any(p.role == "anchor" for p in patterns):
        raise KnowledgeBaseError(f"{where}: needs at least one anchor pattern")

    references = []
    for i, r in enumerate(_req(data, "references", list, where)):
        if not (r.get("url") or r.get("seed")):
            raise KnowledgeBaseError(f"{where}: references[{i}] needs url or seed")
        references.append(Reference(r.get("title", r.get("url") or r.get("seed")), r.get("url"), r.get("seed")))

    examples = []
    for i, e in enumerate(_req(data, "examples", list, where)):
        ew = f"{where}: examples[{i}]"
        examples.append(Example(_req(e, "text", str, ew), _req(e, "source", str, ew)))

    corrections = tuple(
        Correction(_req(c, "claim", str, where), _req(c, "truth", str, where))
        for c in data.get("corrections", [])
    )
    specificity = int(data.get("specificity", 50))
    if not 0 <= specificity <= 100:
        raise KnowledgeBaseError(f"{where}: specificity must be in 0..100")

    return Entry(
        id=entry_id,
        title=_req(data, "title", str, where),
        aliases=_strings(data, "aliases", where, default=[]),
        applicability=applicability,
        fix_safety=fix_safety,
        probes=_strings(data, "probes", where, default=[]),
        specificity=specificity,
        generic=bool(data.get("generic", False)),
        supersedes=_strings(data, "supersedes", where, default=[]),
        min_support=int(data.get("min_support", 0)),
        what=_reflow(_req(data, "what", str, where)),
        why=_strings(data, "why", where),
        fix=_strings(data, "fix", where),
        patch=_req(data, "patch", str, where).strip("\n"),
        patch_lang=data.get("patch_lang", "diff"),
        context=_strings(data, "context", where, default=[]),
        corrections=corrections,
        references=tuple(references),
        patterns=tuple(patterns),
        examples=tuple(examples),
    )


def _reflow(text: str) -> str:
    """Join the hard-wrapped lines of a TOML paragraph; blank lines keep paragraphs apart."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


# The entries ship as package data beside this module (importlib.resources would cost more
# start-up time than the whole lookup).
_FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "knowledge")


def _entry_files() -> list[str]:
    try:
        names = os.listdir(_FOLDER)
    except OSError as exc:
        raise KnowledgeBaseError(f"cannot read the knowledge base at {_FOLDER}: {exc.strerror}") from None
    return sorted(os.path.join(_FOLDER, n) for n in names if n.endswith(".toml"))


def _load_file(path: str) -> Entry:
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KnowledgeBaseError(f"{name}: {exc}") from None
    entry = parse_entry(data, name, compile_patterns=False)
    if name != f"{entry.id}.toml":
        raise KnowledgeBaseError(f"{name}: file name must be {entry.id}.toml")
    return entry


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Entry, ...]:
    """Every entry, sorted by id. Raises KnowledgeBaseError on the first malformed file."""
    return tuple(_load_file(f) for f in _entry_files())


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, Entry]:
    """ids and aliases (case-folded) to entries."""
    index: dict[str, Entry] = {}
    for entry in load_all():
        for name in (entry.id, *entry.aliases):
            index.setdefault(name.casefold(), entry)
    return index


def load_entry(name: str) -> Entry | None:
    """The entry whose id or alias is `name` (case-insensitive), or None."""
    key = name.strip().casefold()
    if ID_RE.match(key):
        # Fast path for an exact id: read that one file instead of the whole knowledge base.
        path = os.path.join(_FOLDER, f"{key}.toml")
        if os.path.isfile(path):
            return _load_file(path)
    return _index().get(key)


def suggest(name: str, limit: int = 3) -> list[str]:
    """Ids close to a mistyped name, for "did you mean"."""
    import difflib

    key = name.strip().casefold()
    index = _index()
    hits = difflib.get_close_matches(key, list(index), n=limit * 3, cutoff=0.6)
    # Substring hits help for partial words such as "misaligned" or "oom".
    hits += [k for k in index if len(key) >= 3 and key in k]
    seen: list[str] = []
    for k in hits:
        entry_id = index[k].id
        if entry_id not in seen:
            seen.append(entry_id)
    return seen[:limit]
