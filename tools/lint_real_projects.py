"""Lint the public projects the field notes come from, on their own files, read from a local mirror
of their repositories at a pinned commit (issue 33): DiffSynth-Studio's Fantasy World fork (the
bf16/fp32 note: modules built by `enable_fantasy_world_mode()` after the pipeline was loaded in
bf16), MultiTalk and InfiniteTalk (the misaligned-address note: `shape=grid_sizes[0]`), and
upstream DiffSynth-Studio as a precision check.

    python tools/lint_real_projects.py [--mirrors DIR] [--project NAME] [--keep DIR] [--json]

Each project's Python files are materialised from the mirror (`git show <commit>:<path>`, never
into this repository: a temporary folder, or --keep) and linted as a project, with the rules the
project is about; the findings are compared with the expected ones listed here (what a person
judged on the real files). Exit 0 when every project present matches, 1 when one does not, 2 when
no mirror is found. Mirrors are bare git directories, `<mirrors>/<owner>+<name>/repo` (what the
research tools' `fetch` writes); the default is $GPUDOCTOR_MIRRORS or /work/.mirror.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Project:
    name: str
    repo: str  # owner/name on GitHub
    commit: str  # 40 hex digits
    rules: tuple[str, ...]
    # (rule, path, line) a person judged a real occurrence on these files; nothing else may fire
    expected: tuple[tuple[str, str, int], ...]
    note: str


_FANTASY = "diffsynth/models/wan_video_dit.py"
_MT = (("GPU004", "wan/modules/attention.py", 229),                    # SingleStreamAttention.forward
       ("GPU004", "wan/modules/attention.py", 327),                    # SingleStreamMutiAttention.forward
       ("GPU004", "wan/distributed/xdit_context_parallel.py", 481),    # usp_crossattn_multi_forward_multitalk
       ("GPU004", "wan/utils/multitalk_utils.py", 128))                # get_attn_map_with_target

PROJECTS = (
    Project("fantasy-world-bf16", "jmy-idea/Diffsynth-fantasy-world", "b624dd2eb2255a54bb3204408390669f64d8a6ab",
            ("GPU011",),
            tuple(("GPU011", _FANTASY, n) for n in (903, 909, 910, 914, 918, 924, 933, 942, 945, 951)),
            "enable_fantasy_world_mode() builds an encoder, two Parameters, three heads, adapters, a projector, "
            "GeoDiTBlocks and cross-attentions in float32; examples/wanvideo/model_training/train.py calls it on "
            "the pipeline from_pretrained(torch_dtype=torch.bfloat16) built"),
    Project("fantasy-world-fixed", "jmy-idea/Diffsynth-fantasy-world", "d8980cad300f661f997d58534398caad496acea5",
            ("GPU011",), (),
            "the next commit converts every new module at the end of the mode (ModuleLists item by item, "
            "Parameters through .data): nothing to report"),
    Project("multitalk", "MeiGen-AI/MultiTalk", "c1ad84009b99ed36c97ab18e4517ca5f98692438", ("GPU004",), _MT,
            "grid_sizes[0], a row of a long tensor, reaches four `N_t, N_h, N_w = shape` bindings: two attention "
            "forwards, the sequence-parallel forward bound with types.MethodType, and the attention-map helper"),
    Project("infinitetalk", "MeiGen-AI/InfiniteTalk", "0107cd96421b3b1bef7728bde14447dbff7b2db2", ("GPU004",), _MT,
            "MultiTalk's successor: the same four sites"),
    Project("diffsynth-studio", "modelscope/DiffSynth-Studio", "fed7b18fac2ed4cb802796eec91970e7659bccde",
            ("GPU004", "GPU011"), (),
            "upstream, without the Fantasy World mode: a precision check on 958 Python files"),
)


def mirror_dir(mirrors: pathlib.Path, repo: str) -> pathlib.Path:
    return mirrors / repo.replace("/", "+") / "repo"


def _git(git_dir: pathlib.Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, timeout=300).stdout


def available(project: Project, mirrors: pathlib.Path) -> bool:
    git_dir = mirror_dir(mirrors, project.repo)
    if not git_dir.is_dir():
        return False
    try:
        _git(git_dir, "cat-file", "-e", f"{project.commit}^{{commit}}")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return False
    return True


def materialise(project: Project, mirrors: pathlib.Path, dest: pathlib.Path) -> int:
    """Write the project's Python files at its commit under dest; returns how many."""
    git_dir = mirror_dir(mirrors, project.repo)
    names = _git(git_dir, "ls-tree", "-r", "-z", "--name-only", project.commit).split(b"\0")
    count = 0
    for raw in names:
        name = raw.decode("utf-8", "surrogateescape")
        if not name.endswith(".py") or name.startswith("/") or ".." in name.split("/"):
            continue
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_git(git_dir, "show", f"{project.commit}:{name}"))
        count += 1
    return count


def lint_project(project: Project, folder: pathlib.Path) -> list[tuple[str, str, int, str]]:
    """(rule, path relative to the folder, line, message) of the project's rules, linted as a project."""
    sys.path.insert(0, str(ROOT))
    from gpudoctor.lint import engine

    old = os.getcwd()
    os.chdir(folder)
    try:
        result, _, _ = engine.lint(["."], select=list(project.rules), isolated=True, jobs=1)
    finally:
        os.chdir(old)
    return sorted((f.code, os.path.normpath(f.path).replace(os.sep, "/"), f.line, f.message) for f in result.findings)


def measure(project: Project, mirrors: pathlib.Path, keep: pathlib.Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"gpudoctor-{project.name}-") as tmp:
        folder = keep / project.name if keep else pathlib.Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = materialise(project, mirrors, folder)
        found = lint_project(project, folder)
    got = {(code, path, line) for code, path, line, _ in found}
    want = set(project.expected)
    return {"project": project.name, "repo": project.repo, "commit": project.commit, "files": files,
            "rules": list(project.rules), "found": [list(f) for f in found],
            "missed": sorted(want - got), "unexpected": sorted(got - want), "ok": got == want}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirrors", default=os.environ.get("GPUDOCTOR_MIRRORS", "/work/.mirror"))
    ap.add_argument("--project", action="append", help="only these projects (by name)")
    ap.add_argument("--keep", help="materialise into this folder and keep it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    mirrors = pathlib.Path(args.mirrors)
    chosen = [p for p in PROJECTS if not args.project or p.name in args.project]
    present = [p for p in chosen if available(p, mirrors)]
    if not present:
        print(f"no mirror of {', '.join(p.repo for p in chosen)} under {mirrors}", file=sys.stderr)
        return 2
    reports = [measure(p, mirrors, pathlib.Path(args.keep) if args.keep else None) for p in present]
    if args.json:
        print(json.dumps(reports, indent=2))
    else:
        for r in reports:
            status = "as expected" if r["ok"] else "DIFFERS"
            print(f"{r['project']}: {r['repo']} at {r['commit'][:10]}, {r['files']} Python files, "
                  f"{'/'.join(r['rules'])}: {len(r['found'])} findings, {status}")
            for code, path, line, message in r["found"]:
                print(f"  {path}:{line}: {code} {message[:150]}")
            for code, path, line in r["missed"]:
                print(f"  missed: {path}:{line}: {code}")
            for code, path, line in r["unexpected"]:
                print(f"  unexpected: {path}:{line}: {code}")
        for p in chosen:
            if p not in present:
                print(f"{p.name}: no mirror of {p.repo} at {p.commit[:10]} (skipped)")
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
