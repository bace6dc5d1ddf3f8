"""The knowledge base's keyword index and its cache (gpudoctor.knowledge.kbcache): a pasted error reads only
the entries it can match and is ranked exactly as against every entry; a cache that is corrupt,
hostile, stale, unwritable or written by several processes at once never changes an answer and
never ends in a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.knowledge import kb
from gpudoctor.knowledge import kbcache
from gpudoctor.explain.matcher import Matcher, match_text

FIXTURES = Path(__file__).parent / "fixtures"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.50 GiB. GPU 0 has a total "
       "capacity of 31.36 GiB of which 20.11 GiB is free.")


def _fresh() -> None:
    """Forget what this process read, as a new process would."""
    kbcache.catalogue_index.cache_clear()
    kb.load_all.cache_clear()
    kb._entry_by_id.cache_clear()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _fresh()
    yield tmp_path / "cache"
    _fresh()


def _full(text: str):
    matcher = Matcher(kb.load_all())
    matcher.feed(text)
    return [m.to_dict() for m in matcher.results()]


def _texts() -> list[str]:
    texts = [p.read_text(encoding="utf-8").partition("\n")[2] for p in sorted(FIXTURES.glob("*/*/*.txt"))]
    return texts + [ex.text for e in kb.load_all() for ex in e.examples]


@pytest.mark.slow  # tens of seconds on 2 cores: left out by -m "not slow"
def test_reading_only_the_entries_a_text_can_match_changes_no_answer(cache_home):
    texts = _texts()
    assert len(texts) > 300
    differ = [t[:80] for t in texts if [m.to_dict() for m in match_text(t)] != _full(t)]
    assert differ == []


def test_a_pasted_error_reads_a_few_entries_once_the_index_is_cached(cache_home):
    kbcache.catalogue_index()  # the first run: reads every entry, writes the index
    assert kbcache.cache_path() is not None and os.path.isfile(kbcache.cache_path())
    _fresh()
    matches = match_text(OOM)
    assert matches[0].id == "attention-oom"
    read = kb._entry_by_id.cache_info().currsize
    assert 0 < read <= 4 < len(kb.entry_ids()), read
    assert kb.load_all.cache_info().currsize == 0  # never read the whole knowledge base


def test_an_alias_with_spaces_is_found_through_the_index(cache_home):
    assert kb.load_entry("Mismatched NCCL version").id == "nccl-version-mismatch"
    assert kb.load_entry("forked subprocess").id == "cuda-fork-reinit"
    assert kb.load_entry("no such words anywhere") is None
    assert "cuda-oom" in kb.suggest("cuda oom")


def _expected_index() -> kbcache.CatalogueIndex:
    return kbcache.build_index(kb.load_all())


def _valid_cache_text() -> str:
    kbcache.catalogue_index()
    text = Path(kbcache.cache_path()).read_text(encoding="utf-8")
    _fresh()
    return text


def _hostile(valid: str) -> dict[str, bytes]:
    data = json.loads(valid)
    unknown = dict(data, keywords=[["CUDA out of memory", False, ["../../etc/passwd"]]])
    emptied = dict(data, keywords=[], names={})  # would hide every entry
    stale = dict(data, fingerprint=[["cuda-oom.toml", 1, 1]])
    typed = dict(data, keywords=[[1, "x", None]])
    return {
        "truncated": valid[: len(valid) // 2].encode(),
        "not json": b"\x00\xff not json at all",
        "deep nesting": b"[" * 200_000 + b"]" * 200_000,
        "too large": b" " * (kbcache._MAX_BYTES + 10),
        "unknown id": json.dumps(unknown).encode(),
        "stale fingerprint": json.dumps(emptied | {"fingerprint": stale["fingerprint"]}).encode(),
        "wrong types": json.dumps(typed).encode(),
        "other format": json.dumps(dict(data, format=kbcache.FORMAT + 1)).encode(),
        "not an object": b"[1, 2, 3]",
    }


@pytest.mark.parametrize("kind", ["truncated", "not json", "deep nesting", "too large", "unknown id",
                                  "stale fingerprint", "wrong types", "other format", "not an object"])
def test_a_bad_cache_file_is_ignored_and_rewritten(cache_home, kind):
    valid = _valid_cache_text()
    path = Path(kbcache.cache_path())
    path.write_bytes(_hostile(valid)[kind])
    assert kbcache.catalogue_index() == _expected_index()
    assert match_text(OOM)[0].id == "attention-oom"
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(valid)  # rebuilt for the next run


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership and modes")
def test_a_cache_others_may_write_is_not_trusted(cache_home):
    valid = _valid_cache_text()
    path = Path(kbcache.cache_path())
    data = json.loads(valid)
    path.write_text(json.dumps(dict(data, keywords=[], names={})), encoding="utf-8")  # hides every entry
    path.chmod(0o666)
    assert kbcache.catalogue_index() == _expected_index()
    assert path.stat().st_mode & 0o777 == 0o600  # replaced by a private file


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_symbolic_link_in_place_of_the_cache_is_not_followed(cache_home, tmp_path):
    valid = json.loads(_valid_cache_text())
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(dict(valid, keywords=[], names={})), encoding="utf-8")
    path = Path(kbcache.cache_path())
    path.unlink()
    path.symlink_to(elsewhere)
    assert kbcache.catalogue_index() == _expected_index()
    assert not path.is_symlink()
    assert json.loads(elsewhere.read_text(encoding="utf-8"))["names"] == {}  # the link's target untouched


def test_no_usable_cache_folder_costs_time_only(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the folder cannot be made: a read-only home
    _fresh()
    try:
        assert kbcache.catalogue_index() == _expected_index()
        assert match_text(OOM)[0].id == "attention-oom"
        assert blocker.read_text() == ""
    finally:
        _fresh()


def test_a_relative_or_missing_cache_home_falls_back_to_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")
    monkeypatch.setenv("HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert kbcache.cache_dir() == str(tmp_path / ".cache" / "gpudoctor")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kbcache.cache_dir() == str(tmp_path / "xdg" / "gpudoctor")


def test_concurrent_first_runs_agree_and_leave_one_whole_cache(tmp_path):
    """Eight processes start with no cache at once: each answers alike, the cache they leave is
    whole and valid, and no temporary file is left behind."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-m", "gpudoctor", "explain", "--format", "json", OOM],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
             for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in outs]
    verdicts = {json.loads(out)["verdict"]["id"] for out, _ in outs}
    assert verdicts == {"attention-oom"}
    folder = tmp_path / "cache" / "gpudoctor"
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 1 and files[0].startswith("catalogue-") and files[0].endswith(".json"), files
    data = json.loads((folder / files[0]).read_text(encoding="utf-8"))
    assert data["fingerprint"] == kb.fingerprint()
