"""tools/lint_corpus_materialize.py: cases that name files of a git mirror by blob id are written
out exactly, and refused whole when the mirror disagrees with the record."""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _tool():
    spec = importlib.util.spec_from_file_location("lint_corpus_materialize", ROOT / "tools" / "lint_corpus_materialize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _git(*args: str, cwd: pathlib.Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(cwd), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def mirror(tmp_path):
    """A bare mirror at mirrors/owner+proj/repo holding one commit with two files."""
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "mod.py").write_text("x = 1\ny = x.view(-1)\n")
    (work / "setup.py").write_text("flags = ['-gencode', 'arch=compute_80,code=sm_80']\n")
    _git("init", "-q", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "c", cwd=work)
    commit = _git("rev-parse", "HEAD", cwd=work)
    blobs = {p: _git("rev-parse", f"HEAD:{p}", cwd=work) for p in ("pkg/mod.py", "setup.py")}
    mirrors = tmp_path / "mirrors"
    _git("clone", "-q", "--bare", str(work), str(mirrors / "owner+proj" / "repo"), cwd=tmp_path)
    return mirrors, commit, blobs


def _case(corpus: pathlib.Path, name: str, commit: str, files: dict[str, str]) -> pathlib.Path:
    case = corpus / name
    case.mkdir(parents=True)
    entries = "".join(f'[[file]]\npath = "{p}"\nblob = "{b}"\n\n' for p, b in files.items())
    (case / "source.toml").write_text(f'[source]\nrepo = "owner/proj"\ncommit = "{commit}"\n\n{entries}')
    (case / "labels.toml").write_text('[[near_miss]]\nrule = "GPU003"\nfile = "pkg/mod.py"\nline = 2\n'
                                      'anchor = "x.view(-1)"\nwhy = "w"\nsource = "s"\n')
    return case


def test_writes_every_file_and_the_labels(mirror, tmp_path):
    mirrors, commit, blobs = mirror
    corpus = tmp_path / "corpus"
    _case(corpus, "one", commit, blobs)
    out = tmp_path / "out"
    assert _tool().main([str(corpus), str(out), "--mirrors", str(mirrors)]) == 0
    assert (out / "one" / "pkg" / "mod.py").read_text() == "x = 1\ny = x.view(-1)\n"
    assert (out / "one" / "setup.py").read_text().startswith("flags = ")
    assert (out / "one" / "labels.toml").read_text() == (corpus / "one" / "labels.toml").read_text()
    assert not (out / "one" / "source.toml").exists()


def test_refuses_a_blob_that_differs_and_writes_nothing_of_the_case(mirror, tmp_path, capsys):
    mirrors, commit, blobs = mirror
    corpus = tmp_path / "corpus"
    wrong = dict(blobs, **{"setup.py": "0" * 40})
    _case(corpus, "bad", commit, wrong)
    out = tmp_path / "out"
    assert _tool().main([str(corpus), str(out), "--mirrors", str(mirrors)]) == 2
    assert "refusing" in capsys.readouterr().err
    assert not (out / "bad").exists()


def test_refuses_a_commit_the_mirror_lacks(mirror, tmp_path, capsys):
    mirrors, _commit, blobs = mirror
    corpus = tmp_path / "corpus"
    _case(corpus, "gone", "f" * 40, blobs)
    assert _tool().main([str(corpus), str(tmp_path / "out"), "--mirrors", str(mirrors)]) == 2
    assert "has no commit" in capsys.readouterr().err


def test_refuses_a_path_outside_the_repository(mirror, tmp_path, capsys):
    mirrors, commit, _blobs = mirror
    corpus = tmp_path / "corpus"
    _case(corpus, "escape", commit, {"../evil.py": "1" * 40})
    assert _tool().main([str(corpus), str(tmp_path / "out"), "--mirrors", str(mirrors)]) == 2
    assert "inside the repository" in capsys.readouterr().err


def test_the_output_folder_must_lie_outside_the_corpus(mirror, tmp_path, capsys):
    mirrors, commit, blobs = mirror
    corpus = tmp_path / "corpus"
    _case(corpus, "one", commit, blobs)
    assert _tool().main([str(corpus), str(corpus / "out"), "--mirrors", str(mirrors)]) == 2
    assert "outside the corpus" in capsys.readouterr().err


def test_the_committed_fresh_corpus_records_are_well_formed():
    """Every case of tests/fixtures/lint_corpus_fresh names a repository, a pinned commit and
    blob ids, and has labels; the files themselves live in mirrors, not here."""
    tool = _tool()
    corpus = ROOT / "tests" / "fixtures" / "lint_corpus_fresh"
    cases = sorted(p for p in corpus.iterdir() if (p / "source.toml").is_file())
    assert len(cases) >= 20
    for case in cases:
        repo, commit, files = tool.read_source(case)
        assert (case / "labels.toml").is_file()
        assert files
        assert not any((case / path).exists() for path, _ in files), f"{case.name} holds third-party files"
