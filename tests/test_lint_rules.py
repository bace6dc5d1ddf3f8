"""Every lint rule documents itself, names a knowledge-base entry that exists, and appears in the
rule table in docs/lint.md; selection by code prefix behaves."""
from __future__ import annotations

import re

import pytest

from gpudoctor.knowledge import kb
from gpudoctor.lint import rules


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: r.code)
def test_rule_is_documented_and_linked(rule):
    assert rules.CODE_RE.match(rule.code)
    assert re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", rule.name)
    assert kb.load_entry(rule.kb_id) is not None, f"{rule.code} names a missing entry {rule.kb_id}"
    for field in ("title", "what", "why", "example", "fix", "fix_safety", "near_misses"):
        assert getattr(rule, field).strip(), f"{rule.code}: empty {field}"
    assert rule.fix_safety.split(":", 1)[0] in ("safe", "unsafe", "display-only")
    assert rule.kinds and rule.prefilter
    assert rules.describe(rule.code.lower()).rule is rule
    text = " ".join((rule.what, rule.why, rule.fix, rule.near_misses)).lower()
    assert "seed" not in text and "field note" not in text


def test_codes_are_unique_and_ordered():
    codes = [r.code for r in rules.RULES]
    assert codes == sorted(set(codes))


def test_selection():
    assert [r.code for r in rules.select(["GPU00"], ["GPU003"])] == [
        "GPU001", "GPU002", "GPU004", "GPU005", "GPU006", "GPU007", "GPU008", "GPU009"]
    assert len(rules.select(None, None)) == len(rules.RULES)
    assert rules.select(["all"], None) == rules.RULES
    with pytest.raises(ValueError):
        rules.select(["TOR101"], None)


def test_docs_rule_table_is_the_registry(repo_root):
    page = (repo_root / "docs" / "lint.md").read_text()
    block = re.search(r"<!-- lint-rules:start -->\n(.*)<!-- lint-rules:end -->", page, re.S)
    assert block, "docs/lint.md lost its lint-rules markers"
    assert block.group(1) == rules.markdown_table(), "stale table: run python tools/docs_tables.py"


def test_prefilters_let_every_documented_example_through():
    """A rule's own example must reach the parser: the prefilter never hides what it documents."""
    for rule in rules.RULES:
        if rule.code == "GPU010":
            continue  # reads PyTorch backend code only; its example omits the #include
        assert rule.wants(rule.example.encode()), rule.code


def test_every_rule_lives_in_a_module_named_after_it(repo_root):
    """"Where does GPU005 live" has a one-file answer: doctor/lint/rules/gpu005_parameter_reassign.py,
    listed in code order in `rules.MODULES`."""
    modules = sorted(p.stem for p in (repo_root / "doctor" / "lint" / "rules").glob("gpu*.py"))
    assert list(rules.MODULES) == modules
    assert [r.code for r in rules.RULES] == [m[:6].upper() for m in rules.MODULES]
    for module, rule in zip(rules.MODULES, rules.RULES):
        assert module == f"{rule.code.lower()}_{rule.name.replace('-', '_')}"


def test_every_python_rule_is_in_the_table_of_checks():
    from gpudoctor.lint import pyrules

    checked = set(pyrules.TREE_RULES) | pyrules.FLOW_RULES
    python = {r.code for r in rules.RULES if rules.PYTHON in r.kinds}
    # GPU009's Python side is the callers of a C++ binding, read in the cross-file step
    assert python - checked == {"GPU009"} and checked <= python
    for code, module in pyrules.TREE_RULES.items():
        assert module.RULE.code == code and callable(module.check)

