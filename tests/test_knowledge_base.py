"""Walks every knowledge-base entry: it loads, it is complete, its examples are recognised as
itself first, and everything that refers to it (probes, README) agrees. A new entry that skips any
of this fails here."""
from __future__ import annotations

import re

import pytest

from gpudoctor import kb
from gpudoctor.matcher import Matcher, match_text

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
def test_every_pattern_is_exercised_by_some_example(entry):
    # A pattern no example exercises is untested: either add the real text or drop the pattern.
    solo = Matcher([entry])
    for example in entry.examples:
        solo.feed(example.text)
    hit = set(solo._hits.get(entry.id).patterns) if entry.id in solo._hits else set()
    unused = {p.name for p in entry.patterns} - hit
    assert not unused, f"{entry.id}: patterns never matched by an example: {sorted(unused)}"


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
        if ref.seed:
            assert re.match(r"^\d{3}_[0-9a-f]{16}\.txt$", ref.seed), ref.seed


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
def test_entry_is_in_the_readme_index(entry, repo_root):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    assert re.search(rf"^\|\s*`{re.escape(entry.id)}`\s*\|", readme, re.M), f"{entry.id} missing from README index"


def test_malformed_entry_is_rejected_with_its_name():
    good = {"id": "x-y", "title": "t", "applicability": "safe", "what": "w", "why": ["a"], "fix": ["b"],
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
    ]:
        with pytest.raises(kb.KnowledgeBaseError, match=message):
            kb.parse_entry({**good, key: value}, "x-y.toml")
    with pytest.raises(kb.KnowledgeBaseError, match="fix_safety"):
        kb.parse_entry({**good, "applicability": "unsafe"}, "x-y.toml")
