"""Walks every knowledge-base entry: it loads, it is complete, its examples and every message
template in its catalogue are recognised as itself first, every pattern runs in linear time, and
everything that refers to it (probes, the documentation's index) agrees. A new entry that skips any of this fails
here."""
from __future__ import annotations

import dataclasses
import re
import time

import pytest

from gpudoctor.knowledge import kb
from gpudoctor.explain.matcher import Matcher, match_text

ENTRIES = kb.load_all()
IDS = [e.id for e in ENTRIES]

# What the issue requires to exist, with these meanings.
REQUIRED_IDS = {
    "misaligned-address", "xformers-flash-invalid-argument", "attention-oom", "cuda-oom",
    "sdp-kernel-deprecated", "sdpa-no-kernel", "flash-attn-unsupported", "dtype-mismatch",
    "device-mismatch", "parameter-reassign", "view-stride", "noncontiguous-kernel-input",
    "no-kernel-image", "async-error-reporting", "device-side-assert", "illegal-memory-access",
    "fp8-layout", "fp8-unsupported-gpu", "custom-allocator", "driver-too-old", "cuda-unavailable",
    "xformers-build-mismatch",
    # issue 9
    "meta-tensor", "cudnn-status-error", "nccl-error", "nccl-watchdog-timeout", "nccl-version-mismatch",
    "cuda-init-failed", "torch-compile-failed", "torch-import-failed",
}


def _probe_ids() -> set[str]:
    from gpudoctor import probes

    ids = set()
    for name in probes.BUILTIN:
        try:
            module = __import__(f"gpudoctor.probes.{name}", fromlist=["SPEC"])
        except ModuleNotFoundError:
            continue
        ids.add(module.SPEC.id)
    return ids


def test_required_ids_exist():
    assert REQUIRED_IDS <= set(IDS), sorted(REQUIRED_IDS - set(IDS))


def test_ids_unique_and_aliases_unambiguous():
    assert len(IDS) == len(set(IDS))
    seen: dict[str, str] = {}
    for entry in ENTRIES:
        for name in (entry.id, *entry.aliases):
            key = name.casefold()
            assert seen.get(key, entry.id) == entry.id, f"{name!r} names both {seen[key]} and {entry.id}"
            seen[key] = entry.id


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_entry_is_complete(entry):
    assert kb.ID_RE.match(entry.id)
    assert entry.title.strip() and entry.what.strip() and entry.patch.strip()
    # The verdict lines are one line each: they head `explain`'s output.
    for line in (entry.cause, entry.quick_fix):
        assert line.strip() and "\n" not in line and len(line) <= 400, line
    assert entry.why and all(w.strip() for w in entry.why)
    assert entry.fix and all(f.strip() for f in entry.fix)
    assert entry.references
    web_examples = [e for e in entry.examples if e.source.startswith("https://")]
    assert len(web_examples) >= 2, "at least two real examples with their source URL"
    for example in entry.examples:
        assert example.text.strip()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_examples_classify_to_their_own_entry_first(entry):
    for example in entry.examples:
        matches = match_text(example.text)
        assert matches, f"{entry.id}: example from {example.source} matched nothing"
        assert matches[0].id == entry.id, (
            f"{entry.id}: example from {example.source} ranked {[m.id for m in matches[:3]]}"
        )


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_hand_written_pattern_is_exercised_by_some_example(entry):
    # A hand-written pattern no example exercises is untested: add the real text or drop it.
    # (Templates are exercised by the catalogue test below; `against` patterns by the
    # near-miss tests in test_matcher.py.)
    solo = Matcher([entry])
    for example in entry.examples:
        solo.feed(example.text)
    hit = set(solo._hits.get(entry.id).weights) if entry.id in solo._hits else set()
    own = {p.name for p in entry.patterns if p.template is None and p.role != "against"}
    unused = own - hit
    assert not unused, f"{entry.id}: patterns never matched by an example: {sorted(unused)}"


# --- the message catalogue ------------------------------------------------------------------------

# Anchor templates that decide alone; a weak one (weight < 0.5) or one that needs support (a bare
# cuBLAS status that only means an FP8 layout rule beside FP8 evidence) is included when its
# sample values carry that evidence.
TEMPLATES = [(e, t) for e in ENTRIES for t in e.templates
             if t.role == "anchor" and ((t.weight >= 0.5 and not t.needs_support) or t.values)]


@pytest.mark.parametrize("entry, template", TEMPLATES,
                         ids=[f"{e.id}:{t.text[:40]}" for e, t in TEMPLATES])
def test_every_catalogue_template_is_recognised_as_its_entry(entry, template):
    # The message exactly as the source builds it, with sample values in its placeholders, must
    # rank its own entry first among all entries: this is what makes recognition come from the
    # code that raises the error rather than from the tracker examples.
    text = "Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n" + template.sample() + "\n"
    matches = match_text(text)
    assert matches and matches[0].id == entry.id, (template.sample(), [(m.id, round(m.confidence, 2)) for m in matches[:3]])


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_template_names_its_source(entry):
    for t in entry.templates:
        assert t.project.strip() and t.file.strip() and t.versions.strip(), t.text
    if entry.templates_from:
        assert set(entry.templates_from) <= set(IDS)


def test_catalogue_covers_the_libraries_the_issue_names():
    projects = {t.project for e in ENTRIES for t in e.templates}
    for needed in ("pytorch", "CUDA runtime", "cuBLAS", "cuDNN", "xformers", "flash-attention", "triton",
                   "TransformerEngine", "torchao", "bitsandbytes", "compute-sanitizer", "NCCL"):
        assert needed in projects, needed


# --- every pattern is linear on any line ---------------------------------------------------------

_LINE = 2 * 1024 * 1024  # a multi-megabyte line, as a hostile or broken log can hold


def _adversarial_lines(keyword: str, sources: list[str]) -> list[str]:
    """Lines that contain the keyword many times, or once among long runs of the characters
    patterns consume (words, digits, spaces, punctuation), and pieces of the patterns' own text:
    the shapes that make a backtracking regex go quadratic."""
    pieces = " ".join(p for src in sources for p in re.findall(r"[A-Za-z0-9_ ]{3,}", src)) or keyword
    half = _LINE // 2
    return [
        (keyword * (_LINE // len(keyword) + 1))[:_LINE],
        ((keyword + " " + pieces + " ") * (_LINE // (len(keyword) + len(pieces) + 2) + 1))[:_LINE],
        "a" * half + keyword + "1" * half,
        " " * half + keyword + ":" * half,
        keyword + ("(x, " * (half // 4)) + "`" * half,
    ]


def _keyword_groups():
    groups: dict[tuple[str, bool], list[tuple[object, object]]] = {}
    for entry in ENTRIES:
        for p in entry.patterns:
            groups.setdefault((p.keyword, p.ignore_case), []).append((entry, p))
    return sorted(groups.items(), key=lambda kv: kv[0])


KEYWORD_GROUPS = _keyword_groups()


@pytest.mark.slow  # minutes in all on 2 cores: left out by -m "not slow"
@pytest.mark.parametrize("key, users", KEYWORD_GROUPS, ids=[k for (k, _), _ in KEYWORD_GROUPS])
def test_every_pattern_is_linear_on_a_multi_megabyte_line(key, users):
    keyword, _ = key
    # One matcher with just the patterns that share this keyword (the others never see the line).
    by_entry: dict[str, object] = {}
    for entry, pattern in users:
        current = by_entry.get(entry.id, dataclasses.replace(entry, patterns=()))
        by_entry[entry.id] = dataclasses.replace(current, patterns=current.patterns + (pattern,))
    for line in _adversarial_lines(keyword, [p.source for _, p in users]):
        matcher = Matcher(by_entry.values())
        start = time.process_time()
        matcher.feed(line + "\n")
        matcher.results()
        spent = time.process_time() - start
        # A hang guard, not a benchmark: linear work on 2 MB takes milliseconds; the quadratic
        # pattern this replaced took 9.7 s on a 280 KB line.
        assert spent < 10.0, f"{[p.name for _, p in users]} took {spent:.1f} s CPU on a {len(line)}-character line"


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_cross_references_exist(entry):
    probe_ids = _probe_ids()
    for probe in entry.probes:
        known = probe_ids | {"arch-compat", "cuda-runtime", "sdpa-backends", "xformers", "flash-attn",
                             "attention-memory", "fp8-matmul", "async-errors", "shape-sync",
                             "contiguity", "matmul-sanity", "device-conformance"}
        assert probe in known, f"{entry.id} names unknown probe {probe}"
    for other in entry.supersedes:
        assert other in IDS
    for ref in entry.references:
        assert ref.url.startswith("https://"), ref.url


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.templates_from], ids=lambda e: e.id)
def test_an_entry_reading_anothers_messages_applies_only_where_that_one_does(entry):
    # attention-oom reads cuda-oom's out-of-memory messages: on a platform where cuda-oom does not
    # apply (Apple MPS), the attention line in the traceback must not make it the verdict.
    from gpudoctor.knowledge import notices

    everywhere = set(notices.platform_ids()) | {notices.CUDA}
    mine = set(entry.platforms) or everywhere
    for other in entry.templates_from:
        source = next(e for e in ENTRIES if e.id == other)
        assert mine <= (set(source.platforms) or everywhere), (entry.id, other)


# What users see names public cases and references: never the internal notes the knowledge base
# grew from (the project's before-stop hook greps for the same words).
_INTERNAL = re.compile(r"seed ?0[0-9][0-9]|field note", re.IGNORECASE)


def test_no_entry_speaks_of_internal_notes():
    from pathlib import Path

    for path in sorted(Path(kb._FOLDER).glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        assert not _INTERNAL.search(text), f"{path.name}: {_INTERNAL.search(text).group()!r}"


def test_every_id_a_probe_emits_exists():
    from gpudoctor import probes

    for name in probes.BUILTIN:
        try:
            module = __import__(f"gpudoctor.probes.{name}", fromlist=["SPEC"])
        except ModuleNotFoundError:
            continue
        for kb_id in module.SPEC.emits:
            assert kb_id in IDS, f"probe {module.SPEC.id} emits unknown id {kb_id}"


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_entry_is_in_the_docs_index(entry, repo_root):
    page = (repo_root / "docs" / "explain.md").read_text(encoding="utf-8")
    assert re.search(rf"^\|\s*`{re.escape(entry.id)}`\s*\|", page, re.M), \
        f"{entry.id} missing from the index in docs/explain.md (python tools/docs_tables.py)"


def test_malformed_entry_is_rejected_with_its_name():
    good = {"id": "x-y", "title": "t", "cause": "c", "quick_fix": "q", "applicability": "safe", "what": "w",
            "why": ["a"], "fix": ["b"],
            "patch": "p", "references": [{"url": "https://e"}], "examples": [],
            "patterns": [{"name": "n", "keyword": "k", "regex": "k", "weight": 0.5}]}
    kb.parse_entry(good, "x-y.toml")
    # Regexes compile lazily when loading for the CLI; every real one must compile.
    for entry in ENTRIES:
        for p in entry.patterns:
            assert p.regex.pattern == p.source
    for key, value, message in [
        ("id", "Not_Kebab", "kebab"),
        ("applicability", "maybe", "applicability"),
        ("patterns", [{"name": "n", "keyword": "k", "regex": "(", "weight": 0.5}], "bad regex"),
        ("patterns", [{"name": "n", "keyword": "k", "regex": "k", "weight": 0.5, "role": "support"}], "anchor"),
        ("patterns", [{"name": "n", "keyword": "k", "regex": "k", "weight": 2}], "weight"),
        ("patterns", [{"name": "n", "keyword": "k", "regex": "k", "weight": 0.5, "when": "nonsense"}], "predicate"),
        ("templates", [{"text": "a {x:nokind} b", "project": "p", "file": "f", "versions": "v"}], "placeholder kind"),
        ("templates", [{"text": "{x} ab {y}", "project": "p", "file": "f", "versions": "v"}], "4 characters"),
        ("templates", [{"text": "a long enough text"}], "project"),
        ("references", [{"title": "no url"}], "url"),
        ("cause", ["not", "a string"], "cause"),
    ]:
        with pytest.raises(kb.KnowledgeBaseError, match=message):
            kb.parse_entry({**good, key: value}, "x-y.toml")
    with pytest.raises(kb.KnowledgeBaseError, match="fix_safety"):
        kb.parse_entry({**good, "applicability": "unsafe"}, "x-y.toml")


def test_a_hyphenated_word_wrapped_in_the_toml_reads_as_one_word():
    """A prose line that ends inside a hyphenated word joins without a space: `explain` printed
    "high- resolution" and "memory- efficient"."""
    assert kb._reflow("video or high-\nresolution images") == "video or high-resolution images"
    assert kb._reflow("8- and\n16-byte, a -\nb") == "8- and 16-byte, a - b"  # not a wrapped word
    entries = {e.id: e for e in kb.load_all()}
    assert "high-resolution image diffusion" in entries["attention-oom"].what
    assert "(flash, memory-efficient, cuDNN, math)" in entries["sdpa-no-kernel"].what
    assert "a library like MS-AMP or TensorFlow" in entries["nccl-version-mismatch"].what
