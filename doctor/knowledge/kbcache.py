"""The knowledge base's keyword index, cached per version in the user cache directory, so that
`gpudoctor explain "<pasted error>"` reads only the entries the text can match.

Reading and validating every entry (TOML, templates turned into patterns) costs more than the
rest of `explain` together. The matcher needs little of it up front: each pattern's literal
keyword (a line without it cannot match) and the entries that use it. `CatalogueIndex` holds
that, with every id and alias for name look-ups; the matcher reads the entries whose keywords
occur in the text (gpudoctor.explain.matcher, rule 1) and nothing else.

The index is derived from the entry files and written to
`<cache>/gpudoctor/catalogue-<version>-<folder hash>.json` (`<cache>`: $XDG_CACHE_HOME,
~/.cache, ~/Library/Caches or %LOCALAPPDATA%), one file per gpudoctor version and knowledge-base
folder, valid while the entry files and gpudoctor.knowledge.kb keep their names, sizes and modification
times (`kb.fingerprint`). What the cache may and may not do:

- It only says which entries to read. Patterns, regexes and every word printed come from the
  entry files in the package, never from the cache; the file is JSON (no code is ever loaded
  from it), read only up to `_MAX_BYTES`, checked field by field, and every id it names must be
  an entry file. A cache that is missing, stale, truncated, corrupt, too large, not a regular
  file, or not owned by this user (or writable by others) is ignored and rebuilt.
- A cache directory that cannot be created or written (a read-only home, a full disk) costs
  the full read on every run, nothing else; nothing is ever printed about it.
- Writers never collide: each writes a private temporary file beside the cache and renames it
  into place, so a reader sees a whole old file or a whole new one.

Standard library only.
"""
from __future__ import annotations

import functools
import json
import os
import stat
import sys
from dataclasses import dataclass

from gpudoctor.knowledge import kb

FORMAT = 2  # 2: the platform notices' marker keywords (gpudoctor.knowledge.notices)
_MAX_BYTES = 4 * 1024 * 1024  # the index of today's ~40 entries is ~40 KB
_MAX_KEYWORD = 1000


@dataclass(frozen=True)
class CatalogueIndex:
    """keywords: (keyword, ignore_case, ids of the entries with a pattern using it), in the
    order the matcher meets them (entries by id, each entry's patterns in order); a keyword
    with ignore_case is lower-case. names: every id and alias, case-folded, to its id.
    markers: (keyword, ignore_case, platform id) of every platform notice's marker."""

    keywords: tuple[tuple[str, bool, tuple[str, ...]], ...]
    names: dict[str, str]
    markers: tuple[tuple[str, bool, str], ...] = ()


def build_index(entries: tuple[kb.Entry, ...], markers: list[tuple[str, bool, str]] | None = None) -> CatalogueIndex:
    users: dict[tuple[str, bool], list[str]] = {}
    for entry in entries:
        for pattern in entry.patterns:
            ids = users.setdefault((pattern.keyword, pattern.ignore_case), [])
            if entry.id not in ids:
                ids.append(entry.id)
    if markers is None:
        from gpudoctor.knowledge import notices

        markers = notices.marker_keywords()
    return CatalogueIndex(tuple((k, folded, tuple(ids)) for (k, folded), ids in users.items()),
                          kb.names_of(entries), tuple((k, f, i) for k, f, i in markers))


@functools.lru_cache(maxsize=1)
def catalogue_index() -> CatalogueIndex:
    """The index for the installed knowledge base: from the cache when it is valid, else built
    from every entry (and the cache written for the next run)."""
    from gpudoctor.knowledge import notices

    path = cache_path()
    stamp = kb.fingerprint()
    if path is not None:
        cached = _read(path, stamp, set(kb.entry_ids()), set(notices.platform_ids()))
        if cached is not None:
            return cached
    index = build_index(kb.load_all())
    if path is not None:
        _write(path, stamp, index)
    return index


def cache_dir() -> str | None:
    """gpudoctor's folder in the user cache directory, or None when there is no home to put it."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: ignored, as the XDG rules say
        if sys.platform == "win32":
            base = os.environ.get("LOCALAPPDATA", "")
        else:
            home = os.path.expanduser("~")
            if home == "~" or not os.path.isabs(home):
                return None
            base = os.path.join(home, "Library", "Caches") if sys.platform == "darwin" else os.path.join(home, ".cache")
        if not base:
            return None
    return os.path.join(base, "gpudoctor")


def cache_path() -> str | None:
    folder = cache_dir()
    if folder is None:
        return None
    import zlib

    from gpudoctor import __version__

    where = zlib.crc32(os.path.dirname(kb._FOLDER).encode("utf-8", "surrogatepass"))
    return os.path.join(folder, f"catalogue-{__version__}-{where:08x}.json")


def _trusted(st: os.stat_result) -> bool:
    """A regular file or folder of this user's that nobody else may write (on POSIX)."""
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        return False
    return True


def _read(path: str, stamp: list[list[object]], known_ids: set[str],
          known_platforms: set[str] | None = None) -> CatalogueIndex | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_BYTES or not _trusted(st) \
                or not _trusted(os.stat(os.path.dirname(path))):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(_MAX_BYTES + 1)
        if len(raw) > _MAX_BYTES:
            return None
        data = json.loads(raw.decode("utf-8"))
        return _parse(data, stamp, known_ids, known_platforms)
    except (OSError, ValueError, RecursionError, MemoryError):  # unreadable, not JSON, hostile nesting
        return None
    finally:
        os.close(fd)


def _parse(data: object, stamp: list[list[object]], known_ids: set[str],
           known_platforms: set[str] | None = None) -> CatalogueIndex | None:
    """The index a cache file holds, or None unless every field is what `_write` writes, for
    this fingerprint, naming only entries that exist."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("fingerprint") != stamp:
        return None
    rows, names = data.get("keywords"), data.get("names")
    if not isinstance(rows, list) or not isinstance(names, dict):
        return None
    keywords = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            return None
        keyword, folded, ids = row
        if not (isinstance(keyword, str) and 0 < len(keyword) <= _MAX_KEYWORD and isinstance(folded, bool)
                and isinstance(ids, list) and ids and all(isinstance(i, str) and i in known_ids for i in ids)):
            return None
        keywords.append((keyword, folded, tuple(ids)))
    if not all(isinstance(k, str) and isinstance(v, str) and v in known_ids for k, v in names.items()):
        return None
    rows = data.get("markers")
    if not isinstance(rows, list):
        return None
    markers = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and 0 < len(row[0]) <= _MAX_KEYWORD
                and isinstance(row[1], bool) and isinstance(row[2], str)
                and (known_platforms is None or row[2] in known_platforms)):
            return None
        markers.append((row[0], row[1], row[2]))
    return CatalogueIndex(tuple(keywords), dict(names), tuple(markers))


def _write(path: str, stamp: list[list[object]], index: CatalogueIndex) -> None:
    """Write the cache atomically (a private temporary file renamed over it); any failure
    leaves things as they were and says nothing."""
    import tempfile

    folder = os.path.dirname(path)
    text = json.dumps({"format": FORMAT, "fingerprint": stamp,
                       "keywords": [[k, folded, list(ids)] for k, folded, ids in index.keywords],
                       "names": index.names, "markers": [list(m) for m in index.markers]},
                      ensure_ascii=False, separators=(",", ":"))
    tmp = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not _trusted(os.stat(folder)):
            return
        fd, tmp = tempfile.mkstemp(prefix=".catalogue-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
