"""Write out a lint corpus whose cases name third-party files instead of holding them.

    python tools/lint_corpus_materialize.py CORPUS OUT [--mirrors DIR] [--case NAME]

A case of such a corpus (tests/fixtures/lint_corpus_fresh) is a folder with a `labels.toml`
(the format of tests/fixtures/lint_corpus/README.md) and a `source.toml` naming the public
repository, one pinned commit and the files that form the case (its "project slice"), each
with its git blob id:

    [source]
    repo = "owner/name"
    commit = "<40 hex digits>"

    [[file]]
    path = "pkg/module.py"
    blob = "<40 hex digits>"

The files are read from a local bare git mirror of the repository (by default
/work/.mirror/<owner>+<name>/, searched for the git directory, as the research `fetch` tool
leaves them), checked against their blob ids, and written to OUT/<case>/<path> with the case's
labels.toml beside them, so that

    python tools/lint_corpus_report.py OUT --check-labels
    python tools/lint_corpus_report.py OUT --misses

measure the corpus unchanged. A file whose content differs from its recorded blob, a commit
the mirror lacks or a missing mirror stops the run (exit 2) before anything of that case is
written; nothing is ever fetched from the network. Third-party files are never copied into
this repository: OUT must lie outside the corpus folder.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEFAULT_MIRRORS = pathlib.Path("/work/.mirror")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class MaterializeError(Exception):
    """A case that cannot be written exactly as recorded."""


def _git(git_dir: pathlib.Path, *args: str, binary: bool = False) -> bytes | str:
    proc = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise MaterializeError(f"git {' '.join(args)} in {git_dir}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout if binary else proc.stdout.decode().strip()


def find_git_dir(mirrors: pathlib.Path, repo: str, commit: str) -> pathlib.Path:
    """The bare git directory under mirrors/<owner>+<name>/ that holds `commit`."""
    base = mirrors / repo.replace("/", "+")
    if not base.is_dir():
        raise MaterializeError(f"no mirror of {repo} at {base} (fetch github:{repo} first)")
    candidates = [base] + sorted(p.parent for p in base.rglob("HEAD") if (p.parent / "objects").is_dir())
    for git_dir in candidates:
        if not (git_dir / "objects").is_dir():
            continue
        proc = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                              capture_output=True, timeout=60)
        if proc.returncode == 0:
            return git_dir
    raise MaterializeError(f"the mirror of {repo} under {base} has no commit {commit}")


def read_source(case_dir: pathlib.Path) -> tuple[str, str, list[tuple[str, str]]]:
    where = f"{case_dir.name}/source.toml"
    try:
        data = tomllib.loads((case_dir / "source.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MaterializeError(f"{where}: {exc}") from None
    src = data.get("source", {})
    repo, commit = src.get("repo", ""), src.get("commit", "")
    if not _REPO.fullmatch(repo):
        raise MaterializeError(f"{where}: repo must be owner/name, not {repo!r}")
    if not _HEX40.fullmatch(commit):
        raise MaterializeError(f"{where}: commit must be 40 lowercase hex digits, not {commit!r}")
    files = []
    for i, entry in enumerate(data.get("file", []), 1):
        path, blob = entry.get("path", ""), entry.get("blob", "")
        parts = pathlib.PurePosixPath(path).parts
        if not path or path.startswith("/") or ".." in parts:
            raise MaterializeError(f"{where}: file #{i}: path {path!r} must be relative, inside the repository")
        if not _HEX40.fullmatch(blob):
            raise MaterializeError(f"{where}: file #{i} ({path}): blob must be 40 lowercase hex digits")
        files.append((path, blob))
    if not files:
        raise MaterializeError(f"{where}: no [[file]] entries")
    return repo, commit, files


def materialize_case(case_dir: pathlib.Path, out: pathlib.Path, mirrors: pathlib.Path) -> int:
    """Write one case under out/<case>; returns the number of files written."""
    repo, commit, files = read_source(case_dir)
    git_dir = find_git_dir(mirrors, repo, commit)
    contents = []
    for path, blob in files:
        found = _git(git_dir, "rev-parse", f"{commit}:{path}")
        if found != blob:
            raise MaterializeError(f"{case_dir.name}: {repo}@{commit[:12]}:{path} is blob {found}, "
                                   f"source.toml records {blob}; refusing")
        data = _git(git_dir, "cat-file", "blob", blob, binary=True)
        contents.append((path, data))
    target = out / case_dir.name
    if target.exists():
        shutil.rmtree(target)
    for path, data in contents:
        dest = target / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    shutil.copyfile(case_dir / "labels.toml", target / "labels.toml")
    return len(contents)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=pathlib.Path, help="the corpus folder (cases with source.toml)")
    parser.add_argument("out", type=pathlib.Path, help="the folder to write the cases into")
    parser.add_argument("--mirrors", type=pathlib.Path, default=DEFAULT_MIRRORS,
                        help=f"where the bare git mirrors are (default {DEFAULT_MIRRORS})")
    parser.add_argument("--case", help="write one case only")
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        print(f"lint_corpus_materialize: {args.corpus} is not a folder", file=sys.stderr)
        return 2
    corpus, out = args.corpus.resolve(), args.out.resolve()
    if out == corpus or corpus in out.parents:
        print("lint_corpus_materialize: the output folder must lie outside the corpus", file=sys.stderr)
        return 2
    cases = sorted(p for p in corpus.iterdir() if (p / "source.toml").is_file() and (p / "labels.toml").is_file())
    if args.case:
        cases = [p for p in cases if p.name == args.case]
        if not cases:
            print(f"lint_corpus_materialize: no case named {args.case!r} in {corpus}", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    try:
        for case_dir in cases:
            written += materialize_case(case_dir, out, args.mirrors)
    except MaterializeError as exc:
        print(f"lint_corpus_materialize: {exc}", file=sys.stderr)
        return 2
    print(f"{len(cases)} cases, {written} files written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
