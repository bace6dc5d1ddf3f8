"""Slurm's compact host lists: `gpu[01-04,07]` <-> gpu01 gpu02 gpu03 gpu04 gpu07.

`expand(text)` follows `scontrol show hostnames`: entries are separated by commas outside
brackets; a bracket holds comma-separated numbers and `lo-hi` ranges, padded to the width of the
low bound (`[08-10]` -> 08 09 10); several brackets in one entry multiply (`r[1-2]n[1-2]` -> r1n1
r1n2 r2n1 r2n2); order and duplicates are kept as written. `compress(names)` writes the shortest
form that expands back to the same names in the same order. Malformed text raises `ValueError`
with what is wrong; a list longer than `MAX_HOSTS` is refused rather than expanded.

Standard library only.
"""
from __future__ import annotations

import re
from typing import Iterable

MAX_HOSTS = 1 << 20  # a typo such as gpu[1-99999999] must not eat the machine's memory

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _split_top(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _bracket_values(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        match = _RANGE.match(item)
        if not match:
            raise ValueError(f"bad range {item!r} in host list {whole!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            values.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"range {item!r} runs backwards in host list {whole!r}")
        if hi - lo + 1 > MAX_HOSTS:
            raise ValueError(f"range {item!r} in host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(lo_text) if lo_text.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_entry(entry: str, whole: str) -> list[str]:
    names = [""]
    rest = entry
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.find("]", open_at)
        prefix, body, rest = rest[:open_at], rest[open_at + 1:close_at], rest[close_at + 1:]
        values = _bracket_values(body, whole)
        if len(names) * len(values) > MAX_HOSTS:
            raise ValueError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
        names = [n + prefix + v for n in names for v in values]
    return names


def expand(text: str) -> list[str]:
    """The host names a Slurm host list stands for, in order (`ValueError` if malformed)."""
    if not isinstance(text, str):
        raise ValueError("a host list is text")
    hosts: list[str] = []
    for entry in _split_top(text.strip()):
        if any(ch.isspace() for ch in entry):
            raise ValueError(f"white space inside host list entry {entry!r}")
        hosts.extend(_expand_entry(entry, text))
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"host list names more than {MAX_HOSTS} hosts")
    return hosts


def compress(names: Iterable[str]) -> str:
    """The compact form of `names` (order kept): runs of rising numbers that share a prefix and a
    zero-padded width become one bracket. `expand(compress(x)) == list(x)`."""
    entries: list[tuple[str, int, list[int]] | str] = []  # (prefix, width, numbers) or a plain name
    for name in names:
        match = _TRAILING_NUMBER.match(name)
        if not match or any(ch in name for ch in "[],"):
            entries.append(name)
            continue
        prefix, digits = match.group(1), match.group(2)
        number = int(digits)
        last = entries[-1] if entries else None
        # Join the previous bracket only if the numbers keep rising and print the same way with
        # its padding: expand() must give back the same names in the same order.
        if (isinstance(last, tuple) and last[0] == prefix and number > last[2][-1]
                and str(number).zfill(last[1]) == digits):
            last[2].append(number)
            continue
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        entries.append((prefix, width, [number]))
    parts: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width, numbers = entry
        if len(numbers) == 1:
            parts.append(f"{prefix}{str(numbers[0]).zfill(width)}")
            continue
        ranges, start = [], numbers[0]
        for prev, cur in zip(numbers, numbers[1:] + [-1]):
            if cur == prev + 1:
                continue
            low, high = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(low if start == prev else f"{low}-{high}")
            start = cur
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)
