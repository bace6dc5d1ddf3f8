"""`[tool.gpudoctor.lint]` in pyproject.toml, found by walking up from each linted path (the
nearest pyproject.toml that has the table wins, as ruff does with [tool.ruff]):

    [tool.gpudoctor.lint]
    select = ["ALL"]                 # code prefixes: "GPU0", "GPU003"; default ALL
    ignore = ["GPU007"]
    exclude = ["third_party/**", "*_pb2.py"]   # globs, relative to the pyproject's folder
    per-file-ignores = { "tests/**" = ["GPU003"] }

Command-line --select replaces `select`; --ignore adds to `ignore`.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from gpudoctor.lint import rules

KEYS = ("select", "ignore", "exclude", "per-file-ignores")


class ConfigError(ValueError):
    """A pyproject.toml that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: str | None = None  # folder of the pyproject.toml
    source: str | None = None

    def excluded(self, path: str) -> bool:
        if not self.exclude or self.root is None:
            return False
        rel = os.path.relpath(os.path.abspath(path), self.root).replace(os.sep, "/")
        base = os.path.basename(path)
        return any(_glob(rel, pat) or fnmatch.fnmatchcase(base, pat) for pat in self.exclude)

    def ignored_codes(self, path: str) -> set[str]:
        if not self.per_file_ignores or self.root is None:
            return set()
        rel = os.path.relpath(os.path.abspath(path), self.root).replace(os.sep, "/")
        out: set[str] = set()
        for pattern, codes in self.per_file_ignores:
            if _glob(rel, pattern) or fnmatch.fnmatchcase(os.path.basename(path), pattern):
                out.update(r.code for r in rules.select(list(codes), None))
        return out


def _glob(rel: str, pattern: str) -> bool:
    pattern = pattern.replace(os.sep, "/").removeprefix("./")  # not lstrip("./"): it eats the dot of "./.cache/**"
    if fnmatch.fnmatchcase(rel, pattern):
        return True
    # "dir/**" and "dir/" cover everything below dir; a bare "dir" too
    stem = pattern.rstrip("*").rstrip("/")
    return bool(stem) and "*" not in stem and (rel == stem or rel.startswith(stem + "/"))


def find(path: str) -> Config:
    """The configuration for a path: the nearest pyproject.toml with [tool.gpudoctor.lint]."""
    here = os.path.abspath(path)
    if not os.path.isdir(here):
        here = os.path.dirname(here)
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            config = load(candidate)
            if config is not None:
                return config
        parent = os.path.dirname(here)
        if parent == here:
            return Config()
        here = parent


def load(pyproject: str) -> Config | None:
    """The [tool.gpudoctor.lint] table of one file, or None when it has none."""
    try:
        with open(pyproject, "rb") as f:
            data = tomllib.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("gpudoctor", {}).get("lint")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.gpudoctor.lint] must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{pyproject}: [tool.gpudoctor.lint]: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")

    def strings(key: str) -> tuple[str, ...] | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{pyproject}: [tool.gpudoctor.lint] {key} must be a list of strings")
        return tuple(value)

    select, ignore, exclude = strings("select"), strings("ignore") or (), strings("exclude") or ()
    pfi_raw = table.get("per-file-ignores", {})
    if not isinstance(pfi_raw, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in pfi_raw.values()):
        raise ConfigError(f"{pyproject}: [tool.gpudoctor.lint] per-file-ignores must map globs to lists of codes")
    try:
        rules.select(list(select) if select else None, list(ignore))
        for codes in pfi_raw.values():
            rules.select(list(codes), None)
    except ValueError as exc:
        raise ConfigError(f"{pyproject}: [tool.gpudoctor.lint]: {exc}") from None
    return Config(select=select, ignore=ignore, exclude=exclude,
                  per_file_ignores=tuple((k, tuple(v)) for k, v in pfi_raw.items()),
                  root=os.path.dirname(os.path.abspath(pyproject)), source=pyproject)
