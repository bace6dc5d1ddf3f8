"""Node pseudonyms and the redaction of a fleet report.

A fleet report names nodes `node-0`, `node-1`, ... (the number is the node's index in the job:
Slurm's node id, torchrun's group rank), consistently within the report; real host names appear
only with `--no-redact`. Host names also hide in text the report carries from the nodes (input
file names such as `scan-gpu07.json`, probe summaries, NCCL variables), so `HostPseudonyms`
replaces every known host name (full, and its short form before the first dot) wherever it
appears as a whole word, and `redact_fleet` runs the shared `Redactor` (secrets, home folders,
UUIDs, this machine's user and host) over every string as well.

With hundreds of host names, one alternation regex would try every name at every position; the
names are compiled into a trie-shaped regex instead, so a string is scanned in linear time.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

_WORD = "A-Za-z0-9"


def _trie_regex(words: Iterable[str]) -> str:
    """A regex matching exactly `words`, longest alternatives first, with shared prefixes factored:
    at most one branch is explored per character."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        ends = "" in node
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if ends else body

    return build(trie)


class HostPseudonyms:
    """Replaces host names by their pseudonyms in text. `names` maps a real host name (any case)
    to its pseudonym; short names (before the first dot) are added when unambiguous."""

    def __init__(self, names: Mapping[str, str]) -> None:
        table: dict[str, str] = {}
        shorts: dict[str, set[str]] = {}
        for real, alias in names.items():
            if not real or len(real) < 2:
                continue
            table[real.lower()] = alias
            short = real.split(".", 1)[0].lower()
            if short != real.lower() and len(short) >= 2:
                shorts.setdefault(short, set()).add(alias)
        for short, aliases in shorts.items():
            if short not in table and len(aliases) == 1:
                table[short] = next(iter(aliases))
        self.table = table
        self.pattern = None
        if table:
            # A name matches only between non-alphanumerics: gpu1 must not match inside gpu10 or
            # mygpu1, but must inside scan-gpu1.json. The FQDN, when known, is longer and wins.
            self.pattern = re.compile(
                rf"(?<![{_WORD}])(?:{_trie_regex(sorted(table, key=len, reverse=True))})(?![{_WORD}])",
                re.IGNORECASE,
            )

    def text(self, value: str) -> str:
        if self.pattern is None or not value:
            return value
        return self.pattern.sub(lambda m: self.table.get(m.group(0).lower(), m.group(0)), value)


def redact_fleet(data: Any, hosts: HostPseudonyms, redactor: Any | None) -> Any:
    """A copy of a fleet report's dict with every string (keys too) passed through the host
    pseudonyms and then the shared `Redactor` (when given)."""
    cache: dict[str, str] = {}

    def text(value: str) -> str:
        out = cache.get(value)
        if out is None:
            # Host names first: the Redactor would turn this machine's name into <host> and the
            # node would lose its pseudonym.
            out = hosts.text(value)
            if redactor is not None:
                out = redactor.text(out)
            cache[value] = out
        return out

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {text(k) if isinstance(k, str) else k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(data)
