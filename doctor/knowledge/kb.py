"""The knowledge base: one TOML file per known failure in `gpudoctor/knowledge/`, read with tomllib.

An entry file `<id>.toml` holds:

    id            kebab-case, stable (a user-facing name); equals the file name
    title         one line
    cause         the verdict in one line: what went wrong, for a person reading a log
    quick_fix     the first thing to do, in one line
    aliases       other names a user may type (error codes, short names)
    applicability "safe" | "unsafe" | "display-only": how safe the patch is to apply blindly
    fix_safety    one sentence, required unless applicability is "safe"
    probes        ids of the probes that can detect this failure
    specificity   0..100, how specific the recognised text is; breaks ties between matches
    generic       true for wrappers and boilerplate that other errors carry too (the async trailer,
                  a torch.compile failure that wraps the real error): only context beside a
                  confident specific match
    sticky        true for errors that poison the CUDA context (every later CUDA call fails): in a
                  log, later CUDA errors are consequences of the first sticky one
    consequence   true for errors that are usually a symptom of a failure elsewhere (an NCCL
                  watchdog timeout, a cuBLAS execution failure): they rank below an earlier
                  specific error in the same log
    wrapper       true for messages that carry another error inside them (an NCCL watchdog that
                  "terminated with exception: CUDA error: ..."): an error found on the wrapper's
                  line, or on the line after it, decides, and the wrapper is its context
    supersedes    ids this entry outranks when both match (attention-oom supersedes cuda-oom)
    platforms     where the entry applies: "cuda" (NVIDIA CUDA) and the ids of other platforms
                  (gpudoctor.knowledge.platforms: rocm, zluda, mps, xpu, npu, hpu, musa, mlu, tt);
                  absent means every platform (a PyTorch-level failure such as a dtype mismatch).
                  On text from a platform it does not list, the entry is context, never the verdict
    templates_from ids whose message templates this entry also recognises (attention-oom reads
                  cuda-oom's out-of-memory messages, then needs its own evidence)
    min_support   how many `support` patterns (or derived facts) must match besides an anchor
    facts         derived facts the matcher computes from captured values (see gpudoctor.explain.matcher)
    what          what happened, for a person who just saw the error
    why           the root causes (list)
    fix           ordered steps (list)
    patch         a unified diff or before/after snippet of the typical fix
    patch_lang    "diff" or "python" (or any Pygments lexer name) for highlighting
    context       lines shown when values were captured from the pasted text, with `{name}`
                  placeholders naming a capture (a line whose names were not all captured is
                  left out)
    lint          the lint rule codes (GPU004, ...) that find this failure's pattern in code: where a
                  traceback names files on this machine, `explain` and `run` check them with these
                  rules and print the patch for the user's own file (gpudoctor.patch); default none
    no_patch      for an entry with rules that only say what to change (display-only fixes): why no
                  code patch is printed for it, in one or two sentences
    origin        where the knowledge came from (the public case, or the internal case file):
                  provenance for maintainers, never printed
    [[misconceptions]] claim / truth / evidence: a common belief about this error that is wrong
    [[references]]     title and url of a public reference
    [[templates]]      the message catalogue: `text` is a message exactly as the code that raises
                       it builds it, `{name}` (or `{name:kind}`) marks a value filled in at run
                       time and becomes a capture, `{{`/`}}` are literal braces; `project`,
                       `file` and `versions` say where it comes from; optional `weight`
                       (default 0.9), `role`, `when` (a line predicate, see the matcher),
                       `values` (sample values for the catalogue test), `ignore_case`,
                       `needs_support` (an anchor that reads another entry's message: it counts
                       only beside a support pattern or derived fact of this entry) and `trailer`
                       (a line printed after many errors, such as CUDA's "might be asynchronously
                       reported": it never explains the error line it shares, see the matcher)
    [[patterns]]       hand-written regexes for what is not a message template (stack frames,
                       tracker spellings): name, regex, keyword, weight (0..1),
                       role ("anchor" | "support" | "against"), optional ignore_case, when and
                       needs_support;
                       `keyword` is a literal substring every match contains, used to find
                       candidate lines fast in large logs (lower-case when ignore_case)
    [[examples]]       text, source (URL of the public report it was copied from)
    [[variants]]       the advice filled in with what the text says: `needs` (conditions on the
                       values captured from the text and those derived from them, see
                       gpudoctor.knowledge.predicates.derived_values: "name" is present,
                       "name=value" / "name!=value" compare it, "name=@other" equals another
                       value) and any of `quick_fix`, `fix`, `patch` with `{name}` placeholders.
                       The first variant whose needs hold replaces the entry's own advice

Templates become patterns when the entry loads (`template_regex`): literal text is escaped, a run
of spaces matches up to four spaces or tabs (or none after punctuation), any quote matches any
quote (sources print `x', 'x' and `x` for the same thing), and every placeholder is bounded, so
each pattern runs in time linear in the line it is given.

Loading is lazy and cached; nothing is read on import.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib  # type: ignore[no-redef]

APPLICABILITY = ("safe", "unsafe", "display-only")
ROLES = ("anchor", "support", "against")
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
DEFAULT_TEMPLATE_WEIGHT = 0.9


class KnowledgeBaseError(ValueError):
    """An entry file is malformed; the message names the file and the field."""


# --- message templates -----------------------------------------------------------------------------

# What a placeholder may stand for. Every class is bounded so that no pattern can backtrack
# without limit; the default is a short stretch of any text, matched lazily up to what follows.
PLACEHOLDER_KINDS: dict[str, str] = {
    "": r"[^\n]{1,160}?",
    "text": r"[^\n]{1,160}?",
    "rest": r"[^\n]{0,300}",  # greedy: everything to the end of the line (bounded)
    "int": r"-?\d{1,20}",
    "num": r"-?[\d.]{1,24}",
    "size": r"[\d.]{1,24} ?(?:[KMGTP]i?B|bytes|B)",
    "word": r"[\w.:<>\-]{1,100}",  # a type, dtype, device or identifier: c10::BFloat16, cuda:0
    "version": r"[\w.+\-]{1,60}",  # a package version with its local tag: 2.6.0+cu124
    "path": r"[^\s'\"`]{1,400}",
    "hex": r"(?:0x)?[0-9a-fA-F]{1,32}",
    "tuple": r"\(?[\d, ]{1,40}\)?",  # (8, 0) or 8.0-ish capability tuples and shapes
}
PLACEHOLDER_WIDTHS = {kind: int(re.findall(r"\{\d+,(\d+)\}", body)[0]) + (12 if kind == "size" else 4)
                      for kind, body in PLACEHOLDER_KINDS.items()}  # the most characters each can take
SAMPLE_VALUES = {
    "": "x", "text": "some text", "rest": "and the rest", "int": "16", "num": "8.6",
    "size": "2.00 GiB", "word": "Float", "version": "2.6.0+cu124", "path": "/usr/lib/libfoo.so", "hex": "0x7f00", "tuple": "(8, 0)",
}
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w*)(?::(\w+))?\}")
_QUOTES = "`'\"\u2018\u2019"
# Where a keyword must stop: at characters the template regex lets vary (quotes, path
# separators) and at sentence breaks, where pasted text is often wrapped or re-spaced.
_KEY_SPLIT = re.compile(r"[`'\"\u2018\u2019/\\]|,\s+|\.\s+|\s{2,}")
_LEADING_KEYWORD = 12  # a message's opening words survive wrapping and truncation best


class Template(NamedTuple):
    """One `[[templates]]` table. (Named tuples here and for the references, misconceptions and
    examples below: every `explain` run creates these classes, and a frozen dataclass costs
    several times more start-up.)"""

    text: str
    project: str
    file: str
    versions: str
    weight: float = DEFAULT_TEMPLATE_WEIGHT
    role: str = "anchor"
    when: str | None = None
    values: tuple[tuple[str, str], ...] = ()
    ignore_case: bool = False
    needs_support: bool = False
    trailer: bool = False

    def sample(self) -> str:
        """The template filled in with sample values (`values`, else one per placeholder kind)."""
        given = dict(self.values)

        def fill(m: re.Match[str]) -> str:
            if m.group(0) == "{{":
                return "{"
            if m.group(0) == "}}":
                return "}"
            name, kind = m.group(1), m.group(2) or ""
            return given.get(name, SAMPLE_VALUES.get(kind, "x"))

        return _PLACEHOLDER.sub(fill, self.text)


def _literal_tokens(text: str) -> list[str]:
    """The regex for `text`, one token per character (a run of spaces is one token)."""
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == " ":
            j = i
            while j < len(text) and text[j] == " ":
                j += 1
            # Tracker text loses or doubles spaces ("call,so", "kernel.  Aborting").
            out.append(r"[ \t]{0,4}" if i > 0 and not text[i - 1].isalnum() else r"[ \t]{1,4}")
            i = j
            continue
        if ch in _QUOTES:
            # Any quote, or none: Markdown eats backticks. A closing quote after a word still
            # ends that word ('torch' is not the start of 'torch_mlu').
            closing = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_") \
                and not (i + 1 < len(text) and (text[i + 1].isalnum() or text[i + 1] == "_"))
            out.append(("(?![A-Za-z0-9_])" if closing else "") + "[`'\"\u2018\u2019]?")
        elif ch in "/\\":
            out.append(r"[\\/]{1,2}")  # either separator; Windows paths are often pasted doubled
        else:
            out.append(re.escape(ch))
        i += 1
    return out


def _literal(text: str) -> str:
    return "".join(_literal_tokens(text))


def _literal_width(text: str) -> int:
    """The most characters `_literal(text)` can match (runs of spaces match up to four)."""
    return sum(4 if ch == " " else 2 if ch in "/\\" else 1 for ch in text)


def _template_elements(text: str) -> list[tuple[str, str, str]]:
    """The template as ("lit", text, "") and ("ph", kind, name) elements, in order; a name used
    twice captures only the first time (its later places get name "")."""
    elements: list[tuple[str, str, str]] = []
    names: set[str] = set()
    pos = 0
    pending = ""
    for m in _PLACEHOLDER.finditer(text):
        pending += text[pos:m.start()]
        pos = m.end()
        if m.group(0) in ("{{", "}}"):
            pending += m.group(0)[0]
            continue
        elements.append(("lit", pending, ""))
        pending = ""
        name, kind = m.group(1), m.group(2) or ""
        if kind not in PLACEHOLDER_KINDS:
            raise KnowledgeBaseError(f"template {text!r}: unknown placeholder kind {kind!r}")
        elements.append(("ph", kind, name if name and name not in names else ""))
        names.add(name)
    elements.append(("lit", pending + text[pos:], ""))
    return elements


def _placeholder(kind: str, name: str) -> str:
    body = PLACEHOLDER_KINDS[kind]
    return f"(?P<{name}>{body})" if name else f"(?:{body})"


def template_regex(text: str) -> tuple[str, str, list[str], int]:
    """(regex source, keyword, capture names, reach) for a message template.

    The keyword is a literal stretch without quotes, path separators or sentence breaks, so every
    line the template can match contains it and it finds candidate lines in large logs: the
    message's opening words when they are long enough (they survive wrapping), else the longest
    stretch. `reach` is the most characters a match can start before the keyword, so the matcher
    searches from there instead of trying every position of a long line. A final full stop is
    optional: issue titles and retyped messages drop it."""
    elements = _template_elements(text)
    parts: list[str] = []
    for i, (what, value, name) in enumerate(elements):
        if what == "ph":
            parts.append(_placeholder(value, name))
        elif i == len(elements) - 1 and value.endswith(".") and not value.endswith(".."):
            after_placeholder = value == "."
            parts.append(_literal(value[:-1]) + (r"(?:\.|$)" if after_placeholder else r"\.?"))
        else:
            parts.append(_literal(value))
    names = [name for what, _, name in elements if what == "ph" and name]
    literals = [value for what, value, _ in elements if what == "lit"]
    pieces = [p.strip().removesuffix(".").strip() for lit in literals for p in _KEY_SPLIT.split(lit)]
    leading = pieces[0] if pieces and text[:1] != "{" else ""
    keyword = leading if len(leading) >= _LEADING_KEYWORD else max(pieces, key=len, default="")
    if len(keyword) < 4:
        raise KnowledgeBaseError(f"template {text!r}: needs a literal stretch of at least 4 characters")
    reach = 0
    for what, value, _ in elements:
        if what == "lit" and keyword in value:
            reach += _literal_width(value[:value.index(keyword)])
            break
        reach += _literal_width(value) if what == "lit" else PLACEHOLDER_WIDTHS[value]
    return "".join(parts), keyword, names, reach


def template_cut_regex(text: str) -> str | None:
    """A regex for the template cut short by the end of the line: any prefix of it (cut anywhere,
    mid-word included) followed only by spaces up to the end. None when the template starts with
    a placeholder (a prefix of it could start anywhere). Each character is one optional step
    nested in the previous one, so matching stays linear."""
    if text[:1] == "{" and not text.startswith("{{"):
        return None
    tokens: list[str] = []
    for what, value, name in _template_elements(text):
        tokens.extend(_literal_tokens(value) if what == "lit" else [_placeholder(value, name)])
    regex = ""
    for token in reversed(tokens[1:]):
        regex = f"(?:{token}{regex})?"
    return tokens[0] + regex + r"[ \t]*$"


# --- entries ---------------------------------------------------------------------------------------

# Every pattern reads ASCII words: `\b`, `\w` and `\s` as the programs that print the messages mean
# them. A message quoted inside Chinese or Japanese prose ("会出现cuda out of memory", "显示GPU is
# lost") starts a word after the ideograph, which Unicode rules count as a word character too.
_FLAGS = re.ASCII


@dataclass(frozen=True)
class Pattern:
    name: str
    source: str  # the regex text; compiled on first use so `explain ID` does not pay for all of them
    keyword: str
    weight: float
    role: str
    ignore_case: bool = False
    when: str | None = None
    template: Template | None = None  # set when the pattern was derived from a message template
    reach: int | None = None  # a template's most characters before its keyword (None: unknown)
    needs_support: bool = False  # an anchor that counts only beside a support or fact of its entry
    trailer: bool = False  # printed after many errors: never explains the error on its line

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        try:
            return re.compile(self.source, _FLAGS | (re.IGNORECASE if self.ignore_case else 0))
        except re.error as exc:
            raise KnowledgeBaseError(f"pattern {self.name!r}: bad regex: {exc}") from None

    @functools.cached_property
    def cut(self) -> tuple[re.Pattern[str], int] | None:
        """For a message template: (regex of the template cut short by the end of the line, the
        fewest characters such a cut must keep: 60% of the template's literal text, at least 20)."""
        if self.template is None or self.role != "anchor":
            return None
        source = template_cut_regex(self.template.text)
        if source is None:
            return None
        literal = len(_PLACEHOLDER.sub("", self.template.text))
        return re.compile(source, _FLAGS | (re.IGNORECASE if self.ignore_case else 0)), max(20, int(0.6 * literal))


class Reference(NamedTuple):
    title: str
    url: str


class Misconception(NamedTuple):
    claim: str
    truth: str
    evidence: str


class Example(NamedTuple):
    text: str
    source: str


class Variant:
    """One `[[variants]]` table (a plain class: `explain ID` creates the module's classes on every
    run, and a dataclass costs start-up time)."""

    __slots__ = ("needs", "quick_fix", "fix", "patch")

    def __init__(self, needs: tuple[str, ...], quick_fix: str | None = None, fix: tuple[str, ...] | None = None,
                 patch: str | None = None) -> None:
        self.needs, self.quick_fix, self.fix, self.patch = needs, quick_fix, fix, patch

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variant) and (self.needs, self.quick_fix, self.fix, self.patch) == (
            other.needs, other.quick_fix, other.fix, other.patch)

    def __hash__(self) -> int:
        return hash((self.needs, self.quick_fix, self.fix, self.patch))

    def holds(self, values: dict[str, str]) -> bool:
        for need in self.needs:
            name, op, want = _NEED.match(need).groups()  # type: ignore[union-attr]
            have = values.get(name)
            if have is None:
                return False
            if op == "=" and (have != (values.get(want[1:]) if want.startswith("@") else want)):
                return False
            if op == "!=" and have == want:
                return False
        return True


_NEED = re.compile(r"^(\w+)(?:(!?=)(@?[\w.+\-]+))?$")
_FILL = re.compile(r"\{(\w+)\}")


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each `{name}` whose name is in `values` replaced (other braces stay: code)."""
    return _FILL.sub(lambda m: values.get(m.group(1), m.group(0)), text)


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    cause: str
    quick_fix: str
    aliases: tuple[str, ...]
    applicability: str
    fix_safety: str
    probes: tuple[str, ...]
    specificity: int
    generic: bool
    sticky: bool
    consequence: bool
    wrapper: bool
    supersedes: tuple[str, ...]
    platforms: tuple[str, ...]  # empty: every platform
    templates_from: tuple[str, ...]
    min_support: int
    facts: tuple[str, ...]
    what: str
    why: tuple[str, ...]
    fix: tuple[str, ...]
    patch: str
    patch_lang: str
    context: tuple[str, ...]
    origin: str
    misconceptions: tuple[Misconception, ...]
    references: tuple[Reference, ...]
    templates: tuple[Template, ...]
    patterns: tuple[Pattern, ...]  # hand-written patterns, then one per template
    examples: tuple[Example, ...] = field(default=())
    variants: tuple[Variant, ...] = field(default=())
    lint: tuple[str, ...] = field(default=())  # lint rule codes that find the pattern in code
    no_patch: str = ""  # why no code patch applies, for entries whose rules are display-only

    def advised(self, captures: dict[str, str]) -> "Entry":
        """The entry with its advice (quick fix, fix steps, patch) filled in from the values a
        text gave (`captures`), by the first variant whose needs hold; itself when none does."""
        if not self.variants:
            return self
        from gpudoctor.knowledge.predicates import derived_values

        values = {**captures, **derived_values(captures)}
        for variant in self.variants:
            if variant.holds(values):
                return dataclasses.replace(
                    self,
                    quick_fix=fill(variant.quick_fix, values) if variant.quick_fix else self.quick_fix,
                    fix=tuple(fill(s, values) for s in variant.fix) if variant.fix else self.fix,
                    patch=fill(variant.patch, values).strip("\n") if variant.patch else self.patch)
        return self

    def applies_on(self, platform: str) -> bool:
        """Whether the entry's cause and fix hold on `platform` ("cuda" or another platform id)."""
        return not self.platforms or platform in self.platforms


def _req(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise KnowledgeBaseError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else kind[0].__name__
        raise KnowledgeBaseError(f"{where}: field {key!r} must be {name}")
    return value


def _strings(data: dict[str, Any], key: str, where: str, *, default: list[str] | None = None) -> tuple[str, ...]:
    value = data.get(key, default) if default is not None else _req(data, key, list, where)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise KnowledgeBaseError(f"{where}: field {key!r} must be a list of strings")
    return tuple(value)


def _weight(p: dict[str, Any], where: str, default: float | None = None) -> float:
    raw = p.get("weight", default) if default is not None else _req(p, "weight", (int, float), where)
    if not isinstance(raw, (int, float)) or isinstance(raw, bool):
        raise KnowledgeBaseError(f"{where}: weight must be a number")
    weight = float(raw)
    if not 0.0 < weight <= 1.0:
        raise KnowledgeBaseError(f"{where}: weight must be in (0, 1]")
    return weight


def _role(p: dict[str, Any], where: str) -> str:
    role = p.get("role", "anchor")
    if role not in ROLES:
        raise KnowledgeBaseError(f"{where}: role must be one of {ROLES}")
    return role


def _when(p: dict[str, Any], where: str) -> str | None:
    when = p.get("when")
    if when is None:
        return None
    from gpudoctor.knowledge.predicates import LINE_PREDICATES  # the vocabulary lives beside the matcher

    if when not in LINE_PREDICATES:
        raise KnowledgeBaseError(f"{where}: unknown predicate when={when!r} (known: {sorted(LINE_PREDICATES)})")
    return when


def _parse_template(t: dict[str, Any], where: str) -> Template:
    values = t.get("values", {})
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise KnowledgeBaseError(f"{where}: values must be a table of strings")
    return Template(
        text=_req(t, "text", str, where),
        project=_req(t, "project", str, where),
        file=_req(t, "file", str, where),
        versions=_req(t, "versions", str, where),
        weight=_weight(t, where, DEFAULT_TEMPLATE_WEIGHT),
        role=_role(t, where),
        when=_when(t, where),
        values=tuple(sorted(values.items())),
        ignore_case=bool(t.get("ignore_case", False)),
        needs_support=bool(t.get("needs_support", False)),
        trailer=bool(t.get("trailer", False)),
    )


def template_pattern(template: Template, name: str) -> Pattern:
    source, keyword, _, reach = template_regex(template.text)
    if template.ignore_case:
        keyword = keyword.lower()
    return Pattern(name, source, keyword, template.weight, template.role, template.ignore_case,
                   template.when, template, reach, template.needs_support, template.trailer)


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

    patterns: list[Pattern] = []
    for i, p in enumerate(data.get("patterns", [])):
        pw = f"{where}: patterns[{i}]"
        ignore_case = bool(p.get("ignore_case", False))
        keyword = _req(p, "keyword", str, pw)
        if not keyword or (ignore_case and keyword != keyword.lower()):
            raise KnowledgeBaseError(f"{pw}: keyword must be a non-empty literal (lower-case with ignore_case)")
        patterns.append(Pattern(_req(p, "name", str, pw), _req(p, "regex", str, pw), keyword,
                                _weight(p, pw), _role(p, pw), ignore_case, _when(p, pw),
                                needs_support=bool(p.get("needs_support", False))))
    templates = []
    for i, t in enumerate(data.get("templates", [])):
        tw = f"{where}: templates[{i}]"
        template = _parse_template(t, tw)
        try:
            patterns.append(template_pattern(template, f"template-{i}"))
        except KnowledgeBaseError as exc:
            raise KnowledgeBaseError(f"{tw}: {exc}") from None
        templates.append(template)
    if compile_patterns:
        for i, pattern in enumerate(patterns):
            try:
                pattern.regex
            except KnowledgeBaseError as exc:
                raise KnowledgeBaseError(f"{where}: {pattern.name}: {exc}") from None
    templates_from = _strings(data, "templates_from", where, default=[])
    if not any(p.role == "anchor" for p in patterns) and not templates_from:
        raise KnowledgeBaseError(f"{where}: needs at least one anchor pattern or template")

    references = []
    for i, r in enumerate(_req(data, "references", list, where)):
        rw = f"{where}: references[{i}]"
        url = _req(r, "url", str, rw)
        references.append(Reference(r.get("title", url), url))

    examples = []
    for i, e in enumerate(_req(data, "examples", list, where)):
        ew = f"{where}: examples[{i}]"
        examples.append(Example(_req(e, "text", str, ew), _req(e, "source", str, ew)))

    misconceptions = []
    for i, c in enumerate(data.get("misconceptions", [])):
        cw = f"{where}: misconceptions[{i}]"
        misconceptions.append(Misconception(_reflow(_req(c, "claim", str, cw)), _reflow(_req(c, "truth", str, cw)),
                                            _reflow(_req(c, "evidence", str, cw))))
    specificity = int(data.get("specificity", 50))
    if not 0 <= specificity <= 100:
        raise KnowledgeBaseError(f"{where}: specificity must be in 0..100")
    facts = _strings(data, "facts", where, default=[])
    lint = _strings(data, "lint", where, default=[])
    if any(not re.match(r"^GPU\d{3}$", code) for code in lint):
        raise KnowledgeBaseError(f"{where}: field 'lint' must list rule codes such as GPU004")
    no_patch = data.get("no_patch", "")
    if not isinstance(no_patch, str):
        raise KnowledgeBaseError(f"{where}: field 'no_patch' must be a string")
    if facts:
        from gpudoctor.knowledge.predicates import ENTRY_FACTS

        unknown = set(facts) - set(ENTRY_FACTS)
        if unknown:
            raise KnowledgeBaseError(f"{where}: unknown facts {sorted(unknown)} (known: {sorted(ENTRY_FACTS)})")

    variants = []
    for i, v in enumerate(data.get("variants", [])):
        vw = f"{where}: variants[{i}]"
        needs = _strings(v, "needs", vw)
        if not needs or not all(_NEED.match(n) for n in needs):
            raise KnowledgeBaseError(f"{vw}: needs must be a list of conditions (name, name=value, name!=value, name=@other)")
        fix = v.get("fix")
        if fix is not None and (not isinstance(fix, list) or not all(isinstance(s, str) for s in fix)):
            raise KnowledgeBaseError(f"{vw}: fix must be a list of strings")
        variants.append(Variant(needs, _reflow(v["quick_fix"]) if isinstance(v.get("quick_fix"), str) else None,
                                tuple(fix) if fix else None, v.get("patch") if isinstance(v.get("patch"), str) else None))

    return Entry(
        id=entry_id,
        title=_req(data, "title", str, where),
        cause=_reflow(_req(data, "cause", str, where)),
        quick_fix=_reflow(_req(data, "quick_fix", str, where)),
        aliases=_strings(data, "aliases", where, default=[]),
        applicability=applicability,
        fix_safety=fix_safety,
        probes=_strings(data, "probes", where, default=[]),
        specificity=specificity,
        generic=bool(data.get("generic", False)),
        sticky=bool(data.get("sticky", False)),
        consequence=bool(data.get("consequence", False)),
        wrapper=bool(data.get("wrapper", False)),
        supersedes=_strings(data, "supersedes", where, default=[]),
        platforms=_strings(data, "platforms", where, default=[]),
        templates_from=templates_from,
        min_support=int(data.get("min_support", 0)),
        facts=facts,
        what=_reflow(_req(data, "what", str, where)),
        why=_strings(data, "why", where),
        fix=_strings(data, "fix", where),
        patch=_req(data, "patch", str, where).strip("\n"),
        patch_lang=data.get("patch_lang", "diff"),
        context=_strings(data, "context", where, default=[]),
        origin=data.get("origin", ""),
        misconceptions=tuple(misconceptions),
        references=tuple(references),
        templates=tuple(templates),
        patterns=tuple(patterns),
        examples=tuple(examples),
        variants=tuple(variants),
        lint=lint,
        no_patch=_reflow(no_patch),
    )


_WRAPPED_HYPHEN = re.compile(r"(?<=[A-Za-z0-9])-\n[ \t]*(?=[A-Za-z0-9])")


def _reflow(text: str) -> str:
    """Join the hard-wrapped lines of a TOML paragraph; blank lines keep paragraphs apart. A line
    that ends inside a hyphenated word ("memory-" / "efficient") joins without a space."""
    paragraphs = [" ".join(_WRAPPED_HYPHEN.sub("-", p).split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


# The entries ship as package data beside this module (importlib.resources would cost more
# start-up time than the whole lookup).
_FOLDER = os.path.dirname(os.path.abspath(__file__))


def _entry_files() -> list[str]:
    try:
        names = os.listdir(_FOLDER)
    except OSError as exc:
        raise KnowledgeBaseError(f"cannot read the knowledge base at {_FOLDER}: {exc.strerror}") from None
    return sorted(os.path.join(_FOLDER, n) for n in names if n.endswith(".toml"))


def entry_ids() -> list[str]:
    """The ids of every entry, from the file names alone (nothing is read)."""
    return [os.path.basename(f)[:-len(".toml")] for f in _entry_files()]


def fingerprint() -> list[list[object]]:
    """What the entries and their derived patterns depend on, cheaply: the name, size and
    modification time of every entry file and of this module (which derives the templates'
    keywords), then those of the platform notices (gpudoctor.knowledge.notices: their marker
    keywords are cached too). Anything cached from the knowledge base is valid only for the same
    fingerprint."""
    out: list[list[object]] = []
    for path in [*_entry_files(), os.path.abspath(__file__)]:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise KnowledgeBaseError(f"cannot read {path}: {exc.strerror}") from None
        out.append([os.path.basename(path), st.st_size, st.st_mtime_ns])
    from gpudoctor.knowledge import notices

    return out + notices.fingerprint()


@functools.lru_cache(maxsize=None)
def _entry_by_id(entry_id: str) -> Entry:
    return _load_file(os.path.join(_FOLDER, f"{entry_id}.toml"))


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


def _with_borrowed_templates(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    """Give each entry with `templates_from` the anchor patterns of the templates it borrows
    (weights as the owner has them)."""
    by_id = {e.id: e for e in entries}
    out = []
    for entry in entries:
        if not entry.templates_from:
            out.append(entry)
            continue
        borrowed = []
        for other in entry.templates_from:
            if other not in by_id:
                raise KnowledgeBaseError(f"{entry.id}.toml: templates_from names unknown id {other!r}")
            # Only the owner's anchors: its support patterns are evidence for it, not for this entry.
            borrowed += [p for p in by_id[other].patterns if p.template is not None and p.role == "anchor"]
        renamed = tuple(dataclasses.replace(p, name=f"{p.name}@{p.template.project}") for p in borrowed)
        out.append(dataclasses.replace(entry, patterns=entry.patterns + renamed))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Entry, ...]:
    """Every entry, sorted by id. Raises KnowledgeBaseError on the first malformed file."""
    return _with_borrowed_templates(tuple(_entry_by_id(i) for i in entry_ids()))


def load_entries(ids: Iterable[str]) -> tuple[Entry, ...]:
    """The entries named by `ids` and those whose templates they borrow (`templates_from`),
    sorted by id, borrowed templates in place: what `load_all` gives for them, reading only their
    files. Raises KnowledgeBaseError for an id with no file or a malformed file."""
    wanted = set(ids)
    todo = list(wanted)
    while todo:
        for owner in _entry_by_id(todo.pop()).templates_from:
            if owner not in wanted:
                wanted.add(owner)
                todo.append(owner)
    return _with_borrowed_templates(tuple(_entry_by_id(i) for i in sorted(wanted)))


def names_of(entries: Iterable[Entry]) -> dict[str, str]:
    """ids and aliases (case-folded) to ids, the first entry (by id) keeping a shared name."""
    names: dict[str, str] = {}
    for entry in entries:
        for name in (entry.id, *entry.aliases):
            names.setdefault(name.casefold(), entry.id)
    return names


def _names() -> dict[str, str]:
    """Every id and alias, case-folded, to its id: from the cached index (gpudoctor.knowledge.kbcache),
    so that a name or a pasted text that is no name costs no full read of the entries."""
    from gpudoctor.knowledge.kbcache import catalogue_index

    return catalogue_index().names


def load_entry(name: str) -> Entry | None:
    """The entry whose id or alias is `name` (case-insensitive), or None."""
    key = name.strip().casefold()
    if ID_RE.match(key):
        # Fast path for an exact id: read that one file instead of the whole knowledge base.
        path = os.path.join(_FOLDER, f"{key}.toml")
        if os.path.isfile(path):
            return _entry_by_id(key)
    entry_id = _names().get(key)
    return _entry_by_id(entry_id) if entry_id is not None else None


def suggest(name: str, limit: int = 3) -> list[str]:
    """Ids close to a mistyped name, for "did you mean"."""
    import difflib

    key = name.strip().casefold()
    names = _names()
    hits = difflib.get_close_matches(key, list(names), n=limit * 3, cutoff=0.6)
    # Substring hits help for partial words such as "misaligned" or "oom".
    hits += [k for k in names if len(key) >= 3 and key in k]
    seen: list[str] = []
    for k in hits:
        entry_id = names[k]
        if entry_id not in seen:
            seen.append(entry_id)
    return seen[:limit]
