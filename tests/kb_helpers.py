"""For tests that need an error the knowledge base does not explain.

What `explain` does with an unexplained error (no verdict, the unrecognised CUDA error, exit 1) is
shown on real errors that no entry covers today. The day an entry comes to cover one, such a test
would fail as if the behaviour it shows had broken. `outside_the_knowledge_base` checks the
premise first and, when it no longer holds, says so and what to do (docs/development.md, "Adding
a knowledge-base entry").
"""
from __future__ import annotations

import pytest

from gpudoctor.explain.matcher import CONFIDENT, analyse_text


def outside_the_knowledge_base(text: str) -> str:
    """`text`, after checking that explain recognises no entry in it with confidence: the premise
    of a test about errors no entry covers."""
    named = [m for m in analyse_text(text).matches if not m.context_only and m.confidence >= CONFIDENT]
    if named:
        pytest.fail(f"the knowledge base now explains this text ({named[0].id}, {named[0].confidence:.2f}), and "
                    f"this test needs one it does not: take another error that `gpudoctor explain` does not "
                    f"recognise (docs/development.md, 'Adding a knowledge-base entry'): {text[:160]!r}",
                    pytrace=False)
    return text
