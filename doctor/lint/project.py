"""The project pass: what one Python file says about another, combined in the parent process
after every file was parsed once (by a worker, which returns its `pyrules.Facts`).

- GPU001: a helper that returns the softmax of a score matrix (`get_attention_scores`) or the raw
  scores, defined in one module and multiplied with the values in another: each file lists the
  helpers it defines and the findings that hold if a helper it calls is one.
- GPU011: methods that create float32 modules (`enable_fantasy_world_mode`) and calls of them on
  an object that was cast earlier, in another module.

Helpers are matched by name (the receiver of `attn.get_attention_scores(...)` is a parameter whose
class no file names), so a finding needs both halves: the helper's own code and the caller's use.
Nothing here reads a file.
"""
from __future__ import annotations

from typing import Any, Callable

from gpudoctor.lint import rules
from gpudoctor.lint.model import DISPLAY_ONLY, Finding, Fix


def resolve(facts: dict[str, Any], codes: dict[str, tuple[str, ...]],
            suppressed: Callable[[Finding], bool]) -> list[Finding]:
    """The cross-file findings of the Python rules. `facts`: path -> pyrules.Facts of each parsed
    file; `codes`: path -> the rule codes selected for it; `suppressed`: an inline suppression."""
    out: list[Finding] = []
    out += _attention(facts, codes)
    out += _module_after_cast(facts, codes)
    return [f for f in out if not suppressed(f)]


def _attention(facts: dict[str, Any], codes: dict[str, tuple[str, ...]]) -> list[Finding]:
    from gpudoctor.lint.pyflow import PROBS_HELPERS

    probs = set(PROBS_HELPERS).union(*(f.returns_probs for f in facts.values()))
    scores = set().union(*(f.returns_scores for f in facts.values()))
    out = []
    for path, f in facts.items():
        if "GPU001" not in codes.get(path, ()):
            continue
        for helper, kind, finding in f.cond_attention:
            if helper in (probs if kind == "probs" else scores):
                out.append(finding)
    return out


def _module_after_cast(facts: dict[str, Any], codes: dict[str, tuple[str, ...]]) -> list[Finding]:
    creators: dict[str, tuple[str, int, tuple[str, ...]]] = {}
    for f in facts.values():
        creators.update(f.creators)
    out: list[Finding] = []
    if not creators:
        return out
    for path, f in facts.items():
        if "GPU011" not in codes.get(path, ()):
            continue
        for method, line, col, root, cast_line, recv in f.after_cast:
            if method not in creators:
                continue
            where, def_line, attrs = creators[method]
            shown = ", ".join(a.split(".", 1)[-1] for a in attrs[:4]) + (", ..." if len(attrs) > 4 else "")
            out.append(Finding(
                path=path, line=line, col=col, code="GPU011", kb_id=rules.BY_CODE["GPU011"].kb_id,
                message=(f"{recv}.{method}() creates float32 submodules ({shown}; {where}:{def_line}) and "
                         f"never converts them, but {root} was cast at line {cast_line}: their matmuls "
                         f"fail with 'mat1 and mat2 must have the same dtype'; convert them at the end of "
                         f"{method}() (self.to(dtype=..., device=...) of the existing weights) or call "
                         f"{root}.to(...) after it"),
                fix=Fix(DISPLAY_ONLY, f"convert the new modules at the end of {method}()"),
                end_line=line, end_col=col + len(method)))
    return out
