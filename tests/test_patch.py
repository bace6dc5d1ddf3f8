"""The patch for the user's own code (gpudoctor.patch): from a traceback whose files are on this
machine to a diff of those files, with the one lint command that applies it.

The fixtures under tests/fixtures/patch/ are our own small projects written with the structure
of five real systems (a talking-video model whose shape arrives as a tensor row, a video
ControlNet with hand-written and xformers attention, a video DiT whose late modules stay float32,
a hand-written FlashAttention extension lab, a custom NPU backend's allocator), each with the
traceback the failure prints (`{root}` stands for where the copy lives). These tests read the
tracebacks through `explain` (no torch needed); tests/test_patch_reproductions.py runs the
scripts that fail on a CPU through `run`."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.knowledge import kb
from gpudoctor.patch import locate
from gpudoctor.patch.search import find_patches
from gpudoctor.ticket import pytrace

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "patch"
runner = CliRunner()


def copy(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    for tb in root.glob("*traceback.txt"):
        tb.write_text(tb.read_text().replace("{root}", str(root)))
    return root


def explain_json(root: Path, traceback: str, monkeypatch, *extra: str) -> dict:
    monkeypatch.chdir(root)
    r = runner.invoke(app, ["explain", "--file", traceback, "--format", "json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def lint_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a printed `gpudoctor lint ...` command as the user would (the console script's module)."""
    words = shlex.split(command)
    assert words[:3] == ["gpudoctor", "lint", "--fix"], command
    return subprocess.run([sys.executable, "-m", "gpudoctor", *words[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def apply_diff(root: Path, diff: str) -> dict[str, str]:
    """The files a unified diff produces, applied by hand (so the test trusts no patch tool)."""
    out: dict[str, str] = {}
    for block in re.split(r"(?m)^--- ", diff)[1:]:
        header, _, body = block.partition("\n")
        path = header[2:] if header.startswith("a/") else header
        old = (root / path).read_text().split("\n")
        new: list[str] = []
        pos = 0
        for hunk in re.split(r"(?m)^@@ ", body.split("\n", 1)[1])[1:]:
            start = int(re.match(r"-(\d+)", hunk).group(1)) - 1
            new += old[pos:start]
            pos = start
            for line in hunk.split("\n")[1:]:
                if line.startswith(" "):
                    new.append(old[pos])
                    pos += 1
                elif line.startswith("-"):
                    pos += 1
                elif line.startswith("+"):
                    new.append(line[1:])
        new += old[pos:]
        out[path] = "\n".join(new)
    return out


# --- the fixtures are what their tracebacks say ----------------------------------------------------


@pytest.mark.parametrize("traceback", sorted(FIXTURES.glob("*/*traceback.txt")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_frame_quotes_its_own_line(traceback):
    frames = [f for tb in pytrace.parse_tracebacks(traceback.read_text()) for f in tb.frames
              if f.file.startswith("{root}") or not os.path.isabs(f.file)]
    assert frames
    for f in frames:
        lines = (traceback.parent / f.file.replace("{root}/", "")).read_text().split("\n")
        assert lines[f.line - 1].strip() == f.code, f"{f.file}:{f.line}"


# --- the five systems, from their tracebacks ---------------------------------------------------------


def test_misaligned_address_patches_the_unpacking_not_the_line_that_surfaced(tmp_path, monkeypatch):
    root = copy(tmp_path, "multitalk")
    sources = {p: p.read_text() for p in root.rglob("*.py")}
    data = explain_json(root, "traceback.txt", monkeypatch)
    assert {p: p.read_text() for p in root.rglob("*.py")} == sources  # explain never modifies a file
    assert data["verdict"]["id"] == "misaligned-address"
    code = data["code_patch"]
    assert code["status"] == "found" and code["rules"] == ["GPU004", "GPU009"] and code["scope"] == "project"
    assert code["stops_at"] == {"file": "wan/modules/attention.py", "line": 19,
                                "code": "expected_tokens = int(N_t * N_h * N_w)"}
    [patch] = code["patches"]
    assert patch["rule"] == "GPU004" and patch["applicability"] == "unsafe"
    assert patch["file"] == "wan/modules/attention.py" and patch["lines"] == [17, 17]
    assert patch["where"] == ("The traceback stops at line 19 (`expected_tokens = int(N_t * N_h * N_w)`), where the "
                              "earlier asynchronous failure surfaced; the patch changes line 17, where the shape tensor "
                              "is unpacked.")
    assert "-        N_t, N_h, N_w = shape\n+        N_t, N_h, N_w = (int(v) for v in shape)\n" in patch["diff"]
    # the caller that passes the tensor is needed to find it, and the command names it
    assert patch["command"].startswith("gpudoctor lint --fix --unsafe-fixes --select GPU004 wan/modules/attention.py ")
    assert "wan/modules/multitalk_model.py" in patch["command"]
    before = {p: (root / p).read_text() for p in ("wan/modules/attention.py", "wan/modules/multitalk_model.py")}
    expected = apply_diff(root, patch["diff"])
    assert lint_command(patch["command"], root).returncode == 0
    assert (root / "wan/modules/attention.py").read_text() == expected["wan/modules/attention.py"]
    assert (root / "wan/modules/multitalk_model.py").read_text() == before["wan/modules/multitalk_model.py"]


def test_a_project_whose_lint_configuration_excludes_the_traceback_files_checks_those_files(tmp_path, monkeypatch):
    """A project that keeps its own code out of `gpudoctor lint .` (as this checkout keeps its
    fixtures) still gets the patch: lint reads a file it is named, so the traceback's files are
    checked on their own, and the command names them."""
    root = copy(tmp_path, "multitalk")
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.gpudoctor.lint]\nexclude = ["wan/**"]\n')
    code = explain_json(root, "traceback.txt", monkeypatch)["code_patch"]
    assert code["status"] == "found" and code["scope"] == "traceback"
    [patch] = code["patches"]
    assert "+        N_t, N_h, N_w = (int(v) for v in shape)\n" in patch["diff"]
    expected = apply_diff(root, patch["diff"])
    assert lint_command(patch["command"], root).returncode == 0
    assert (root / "wan/modules/attention.py").read_text() == expected["wan/modules/attention.py"]


def test_a_strided_view_into_a_checking_kernel_patches_the_call_not_the_check(tmp_path, monkeypatch):
    """The traceback stops at the launcher's `assert x.is_contiguous()`; the patch makes the
    argument dense at the call in the model, the frame before it (GPU012)."""
    root = copy(tmp_path, "mamba_norm")
    data = explain_json(root, "traceback.txt", monkeypatch)
    assert data["verdict"]["id"] == "noncontiguous-kernel-input"
    code = data["code_patch"]
    assert code["status"] == "found" and code["rules"] == ["GPU012", "GPU009"]
    [patch] = code["patches"]
    assert (patch["rule"], patch["applicability"], patch["file"], patch["lines"]) == \
        ("GPU012", "unsafe", "model/mixer.py", [21, 21])
    assert patch["where"] == ("The patch changes line 21, where the traceback passes on its way to the error (it "
                              "stops at kernels/rms_norm.py:8).")
    assert "+        y = rms_norm_fwd(h.transpose(1, 2).contiguous(), self.norm_weight)" in patch["diff"]
    assert patch["command"] == \
        "gpudoctor lint --fix --unsafe-fixes --select GPU012 model/mixer.py kernels/rms_norm.py"
    expected = apply_diff(root, patch["diff"])
    assert lint_command(patch["command"], root).returncode == 0
    assert (root / "model/mixer.py").read_text() == expected["model/mixer.py"]


def test_no_kernel_image_patches_the_build_flags_of_another_file(tmp_path, monkeypatch):
    root = copy(tmp_path, "fa_lab")
    code = explain_json(root, "no_kernel_traceback.txt", monkeypatch)["code_patch"]
    [patch] = code["patches"]
    assert (patch["rule"], patch["applicability"], patch["file"]) == ("GPU006", "safe", "ext.py")
    assert '+        extra_cuda_cflags=["-gencode", "arch=compute_86,code=[sm_86,compute_86]"' in patch["diff"]
    assert patch["where"].startswith("The traceback stops at bench.py:23 (`out = mr.myFA1(Q, K, V)`), where the "
                                     "error was raised; the patch changes ext.py:13, where the build flags")
    assert patch["command"] == "gpudoctor lint --fix --select GPU006 ext.py"
    expected = apply_diff(root, patch["diff"])
    assert lint_command(patch["command"], root).returncode == 0
    assert (root / "ext.py").read_text() == expected["ext.py"]


@pytest.mark.parametrize("name, traceback, expected", [
    ("fa_lab", "flash_traceback.txt", [("GPU008", "fa/flash.py", 7)]),
    ("controlvideo", "oom_traceback.txt", [("GPU001", "models/attention.py", 45)]),
    ("controlvideo", "xformers_traceback.txt", [("GPU007", "models/attention.py", 64), ("GPU007", "inference.py", 17)]),
    ("echo_npu", "traceback.txt", [("GPU010", "runtime/cmodel/simulator.cpp", 16)]),
])
def test_display_only_rules_show_the_place_and_say_why_no_edit(tmp_path, monkeypatch, name, traceback, expected):
    root = copy(tmp_path, name)
    data = explain_json(root, traceback, monkeypatch)
    code = data["code_patch"]
    assert [(p["rule"], p["file"], p["lines"][0]) for p in code["patches"]] == expected
    assert all(p["applicability"] == "display-only" and p["diff"] is None and p["command"] is None
               for p in code["patches"])
    entry = kb.load_entry(data["verdict"]["id"])
    assert code["no_patch"] == entry.no_patch and entry.no_patch
    monkeypatch.chdir(root)
    text = runner.invoke(app, ["explain", "--file", traceback]).output
    assert "Fix by hand: " in text and "No edit is made:" in text and "Patch for" not in text


def test_the_patch_is_printed_under_the_verdict_and_in_markdown(tmp_path, monkeypatch):
    root = copy(tmp_path, "multitalk")
    monkeypatch.chdir(root)
    text = runner.invoke(app, ["explain", "--file", "traceback.txt"]).output
    verdict, patch, story = text.index("misaligned-address\n"), text.index("Patch for wan/modules/attention.py"), \
        text.index("the full story")
    assert verdict < patch < text.index("Also in this text") < story
    assert "Apply it: gpudoctor lint --fix --unsafe-fixes --select GPU004 " in text
    md = runner.invoke(app, ["explain", "--file", "traceback.txt", "--format", "md"]).output
    assert "### Patch for `wan/modules/attention.py`" in md and "```diff\n--- a/wan/modules/attention.py" in md
    assert md.index("### Patch for") < md.index("### What happened")


# --- when there is nothing to patch -------------------------------------------------------------------


def test_a_traceback_whose_files_are_absent_behaves_as_before(tmp_path, monkeypatch):
    root = copy(tmp_path, "multitalk")
    text = (root / "traceback.txt").read_text().replace(str(root), "/nowhere/project")
    (tmp_path / "elsewhere.txt").write_text(text)
    monkeypatch.chdir(tmp_path)
    data = json.loads(runner.invoke(app, ["explain", "--file", "elsewhere.txt", "--format", "json"]).stdout)
    assert data["verdict"]["id"] == "misaligned-address" and data["code_patch"] is None
    out = runner.invoke(app, ["explain", "--file", "elsewhere.txt"]).output
    assert "Patch for" not in out and "Your code" not in out and "Fix by hand" not in out


def test_code_that_does_not_match_says_so_and_keeps_the_generic_patch(tmp_path, monkeypatch):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "merge.py").write_text("def merge(x, n):\n    return x.view(n, -1)\n")
    (tmp_path / "tb.txt").write_text(
        'Traceback (most recent call last):\n  File "proj/merge.py", line 2, in merge\n    return x.view(n, -1)\n'
        "RuntimeError: view size is not compatible with input tensor's size and stride (at least one dimension "
        "spans across two contiguous subspaces). Use .reshape(...) instead.\n")
    monkeypatch.chdir(tmp_path)
    data = json.loads(runner.invoke(app, ["explain", "--file", "tb.txt", "--format", "json"]).stdout)
    code = data["code_patch"]
    assert code["status"] == "no-match" and code["patches"] == [] and code["files_checked"] == 1
    assert "None of the checks for view-stride (GPU003) found its pattern in your code (1 file under proj)" in code["note"]
    out = runner.invoke(app, ["explain", "--file", "tb.txt"]).output
    assert "Your code: None of the checks for view-stride" in out
    assert "reshape" in out[out.index("the full story"):]  # the entry's own patch is still printed


def test_an_entry_without_rules_prints_nothing_more(tmp_path):
    (tmp_path / "train.py").write_text("import torch\ntorch.zeros(1).cuda()\n")
    tb = pytrace.Frame(str(tmp_path / "train.py"), 2, "<module>", "torch.zeros(1).cuda()")
    code = find_patches(kb.load_entry("cuda-unavailable"), locate.user_sites([tb]))
    assert code["status"] == "no-rules" and code["patches"] == [] and "lint" not in code["note"].split()[0]
    from gpudoctor.reports import codepatch

    assert not codepatch.shows(code) and codepatch.render_markdown(code) == []


def test_library_and_missing_frames_are_not_the_users_code(tmp_path):
    lib = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "pkg"
    lib.mkdir(parents=True)
    (lib / "mod.py").write_text("x = 1\n")
    checkout = tmp_path / "pytorch" / "torch" / "nn"
    checkout.mkdir(parents=True)
    (tmp_path / "pytorch" / "torch" / "__init__.py").write_text("")
    (checkout / "functional.py").write_text("y = 2\n")
    mine = tmp_path / "proj" / "model.py"
    mine.parent.mkdir()
    mine.write_text("z = 3\n")
    frames = [pytrace.Frame(str(p), 1, "f", "") for p in (lib / "mod.py", checkout / "functional.py", mine,
                                                            tmp_path / "gone.py", Path("<frozen runpy>"))]
    assert [s.path for s in locate.user_sites(frames)] == [str(mine.resolve())]


def test_frames_pasted_without_the_traceback_line_are_read(tmp_path, monkeypatch):
    root = copy(tmp_path, "multitalk")
    monkeypatch.chdir(root)
    pasted = ("torch.AcceleratorError: CUDA error: misaligned address\n"
              'File "wan/modules/attention.py", line 19, in forward\n'
              "    expected_tokens = int(N_t * N_h * N_w)\n")
    r = runner.invoke(app, ["explain", "--format", "json", pasted])
    code = json.loads(r.stdout)["code_patch"]
    # the caller is not in the pasted frames, but in the project the check reads
    assert code["status"] == "found" and code["patches"][0]["lines"] == [17, 17]


# --- bounds -------------------------------------------------------------------------------------------


def test_the_check_stops_at_its_time_limit(tmp_path, monkeypatch):
    import gpudoctor.lint

    release = threading.Event()

    def stuck(*args, **kwargs):
        release.wait(60)
        raise ValueError("released")

    monkeypatch.setattr(gpudoctor.lint, "preview", stuck)
    (tmp_path / "m.py").write_text("def f(x):\n    return x.transpose(0, 1).view(-1)\n")
    site = locate.user_sites([pytrace.Frame(str(tmp_path / "m.py"), 2, "f", "")])
    try:
        code = find_patches(kb.load_entry("view-stride"), site, time_limit=0.05)
    finally:
        release.set()
    assert code["status"] == "timed-out" and code["patches"] == []
    assert "stopped after 0.05 s" in code["note"] and "gpudoctor lint --select GPU003 " in code["note"]


def test_a_project_over_the_file_limit_is_checked_through_the_traceback_files(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    view = "    B, H, N, d = x.shape\n    return x.transpose(1, 2).view(B, N, H * d)\n"
    for n in range(4):
        (tmp_path / f"other{n}.py").write_text("def g(x):\n" + view)
    (tmp_path / "m.py").write_text("def f(x):\n" + view)
    site = locate.user_sites([pytrace.Frame(str(tmp_path / "m.py"), 3, "f", "")])
    code = find_patches(kb.load_entry("view-stride"), site, cwd=str(tmp_path), max_files=3)
    assert code["scope"] == "traceback" and code["files_checked"] == 1
    assert [p["file"] for p in code["patches"]] == ["m.py"]
    full = find_patches(kb.load_entry("view-stride"), site, cwd=str(tmp_path))
    # the other files' views are other bugs: a view is only this failure where the traceback runs
    assert full["scope"] == "project" and full["files_checked"] == 5 and [p["file"] for p in full["patches"]] == ["m.py"]
    assert full["patches"][0]["command"] == "gpudoctor lint --fix --select GPU003 m.py"


def test_explain_without_local_files_never_imports_lint(tmp_path):
    """Start-up: an id, or a pasted traceback whose files are not here, loads none of lint."""
    code = ("import sys; from gpudoctor.cli import main; sys.argv=['gpudoctor','explain',*sys.argv[1:]]\n"
            "try:\n main()\nexcept SystemExit:\n pass\n"
            "print(' '.join(sorted(sys.modules)), file=sys.stderr)")

    def modules(*args: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        return set(proc.stderr.split())

    pasted = ('Traceback (most recent call last):\n  File "/nowhere/attention.py", line 19, in forward\n'
              "    expected_tokens = int(N_t * N_h * N_w)\nRuntimeError: CUDA error: misaligned address\n")
    for args in (["misaligned-address"], [pasted], [pasted, "--format", "json"]):
        mods = modules(*args)
        assert "gpudoctor.explain.explanation" in mods
        assert not {m for m in mods if m == "gpudoctor.lint" or m.startswith("gpudoctor.lint.")}, args
        assert "gpudoctor.patch.search" not in mods
    (tmp_path / "attention.py").write_text("\n" * 18 + "expected_tokens = 1\n")
    assert "gpudoctor.lint" in modules(pasted.replace("/nowhere/", ""))


# --- redaction ----------------------------------------------------------------------------------------


def test_paths_and_quoted_code_are_redacted_as_the_rest_of_a_report(tmp_path):
    home = tmp_path / "home" / "alice"
    proj = home / "proj"
    proj.mkdir(parents=True)
    secret = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"
    (proj / "heads.py").write_text(
        "def merge(o):\n"
        "    B, H, N, d = o.shape\n"
        f'    HF_TOKEN = "{secret}"\n'
        "    return o.transpose(1, 2).view(B, N, H * d)\n")
    tb = (f'Traceback (most recent call last):\n  File "{proj}/heads.py", line 4, in merge\n'
          "    return o.transpose(1, 2).view(B, N, H * d)\n"
          "RuntimeError: view size is not compatible with input tensor's size and stride (at least one dimension "
          "spans across two contiguous subspaces). Use .reshape(...) instead.\n")
    work = tmp_path / "work"  # not above the project: its paths are shown whole
    work.mkdir()
    (work / "tb.txt").write_text(tb)
    env = {**os.environ, "HOME": str(home), "USER": "alice"}

    def explain(*extra: str) -> str:
        return subprocess.run([sys.executable, "-m", "gpudoctor", "explain", "--file", "tb.txt", *extra], cwd=work,
                              env=env, capture_output=True, text=True, timeout=60).stdout

    data = json.loads(explain("--format", "json"))
    patch = data["code_patch"]["patches"][0]
    assert patch["file"] == "~/proj/heads.py" and "~/proj/heads.py" in patch["command"]
    assert secret not in json.dumps(data) and "HF_TOKEN" in patch["diff"]
    assert str(home) not in json.dumps(data)
    assert secret not in explain() and "~/proj/heads.py" in explain()
    raw = json.loads(explain("--format", "json", "--no-redact"))["code_patch"]["patches"][0]
    assert raw["file"] == f"{proj}/heads.py" and secret in raw["diff"]


# --- lint: the fixes behind the patches ----------------------------------------------------------------


def test_lint_fix_applies_cross_file_findings(tmp_path):
    (tmp_path / "callee.py").write_text(
        "def tokens(shape=None):\n    t, h, w = shape\n    return int(t * h * w)\n")
    (tmp_path / "caller.py").write_text(
        "import torch\nfrom callee import tokens\n\n\ndef run(latents):\n"
        "    grid_sizes = torch.stack([torch.tensor(u.shape[1:], dtype=torch.long) for u in latents])\n"
        "    return tokens(shape=grid_sizes[0])\n")
    r = runner.invoke(app, ["lint", str(tmp_path), "--select", "GPU004", "--fix", "--unsafe-fixes"])
    assert r.exit_code == 0, r.output
    assert "    t, h, w = (int(v) for v in shape)\n" in (tmp_path / "callee.py").read_text()
    r = runner.invoke(app, ["lint", str(tmp_path), "--select", "GPU004", "--fix"])  # unsafe: not without the flag
    assert "int(v)" not in (tmp_path / "caller.py").read_text()


def test_late_module_fix_takes_the_reference_first_and_keeps_parameters_registered(tmp_path):
    from lint_helpers import lint_tree

    result = lint_tree(tmp_path, {
        "model.py": """
            import torch
            import torch.nn as nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Linear(4, 4)

                def enable_extra(self):
                    \"\"\"Adds the extra head.\"\"\"
                    ref_param = 1
                    self.head = nn.Linear(4, 4)
                    self.scale = nn.Parameter(torch.ones(4) * 0.5)
            """,
        "train.py": """
            import torch
            from model import Net

            net = Net()
            net.to(dtype=torch.bfloat16)
            net.enable_extra()
            """}, select=["GPU011"])
    head, scale = sorted(result.findings, key=lambda f: f.line)
    assert head.fix.applicability == scale.fix.applicability == "unsafe"
    from gpudoctor.lint.fixes import apply_edits

    text = (tmp_path / "model.py").read_text()
    new, accepted = apply_edits(text, [head, scale])
    assert len(accepted) == 2
    assert ('        """Adds the extra head."""\n'
            "        ref_weight = next(self.parameters())  # the dtype and device of the weights the model already has\n"
            "        ref_param = 1\n") in new  # after the docstring, under a name the method does not use
    assert "self.head = nn.Linear(4, 4).to(device=ref_weight.device, dtype=ref_weight.dtype)" in new
    assert "nn.Parameter((torch.ones(4) * 0.5).to(device=ref_weight.device, dtype=ref_weight.dtype))" in new
    assert new.count("next(self.parameters())") == 1


# --- the mapping from entries to rules is data, and documented ------------------------------------------


def test_every_entry_names_real_rules_and_every_rule_is_named_by_its_own_entry():
    from gpudoctor.lint import rules

    entries = kb.load_all()
    for entry in entries:
        assert all(code in rules.BY_CODE for code in entry.lint), entry.id
        assert len(set(entry.lint)) == len(entry.lint), entry.id
        edits = [c for c in entry.lint if not rules.BY_CODE[c].fix_safety.startswith("display-only")]
        # an entry whose rules only show the place says why no edit is made
        assert bool(entry.no_patch) == (bool(entry.lint) and not edits), entry.id
    for rule in rules.RULES:
        assert rule.code in kb.load_entry(rule.kb_id).lint, rule.code
    # the cases the issue names, each with its rules
    wanted = {"misaligned-address": "GPU004", "view-stride": "GPU003", "dtype-mismatch": "GPU011",
              "parameter-reassign": "GPU005", "attention-oom": "GPU001", "xformers-flash-invalid-argument": "GPU007",
              "flash-attn-unsupported": "GPU008", "sdp-kernel-deprecated": "GPU002", "no-kernel-image": "GPU006",
              "noncontiguous-kernel-input": "GPU012", "custom-allocator": "GPU010"}
    assert all(code in kb.load_entry(kb_id).lint for kb_id, code in wanted.items())


def test_the_documented_table_is_the_data():
    from gpudoctor.patch.search import markdown_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "explain.md").read_text()
    block = re.search(r"<!-- code-patch:start -->\n(.*)<!-- code-patch:end -->", page, re.S)
    assert block and block.group(1) == markdown_table(), "stale table: run python tools/docs_tables.py"


def test_a_bad_lint_field_is_refused():
    data = {"id": "x-entry", "title": "t", "cause": "c", "quick_fix": "q", "applicability": "safe",
            "what": "w", "why": ["y"], "fix": ["f"], "patch": "p", "references": [], "examples": [],
            "templates": [{"text": "some error text", "project": "p", "file": "f", "versions": "v"}]}
    assert kb.parse_entry(dict(data), "x.toml").lint == ()
    assert kb.parse_entry({**data, "lint": ["GPU003"]}, "x.toml").lint == ("GPU003",)
    with pytest.raises(kb.KnowledgeBaseError, match="lint"):
        kb.parse_entry({**data, "lint": ["view-stride"]}, "x.toml")


def test_run_puts_the_patch_in_the_ticket_bundle(tmp_path):
    """Without torch: a command that prints a traceback naming a file of the project and fails."""
    (tmp_path / "heads.py").write_text(
        "def merge(o):\n    B, H, N, d = o.shape\n    return o.transpose(1, 2).view(B, N, H * d)\n")
    (tmp_path / "fail.py").write_text(
        "import sys\n"
        "sys.stderr.write('Traceback (most recent call last):\\n'\n"
        "                 '  File \"heads.py\", line 3, in merge\\n'\n"
        "                 '    return o.transpose(1, 2).view(B, N, H * d)\\n'\n"
        "                 \"RuntimeError: view size is not compatible with input tensor's size and stride (at least \"\n"
        "                 'one dimension spans across two contiguous subspaces). Use .reshape(...) instead.\\n')\n"
        "sys.exit(1)\n")
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "run", "--bundle", "bundle", "--no-scan", "--",
                           sys.executable, "fail.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Patch for heads.py  (GPU003 view-after-transpose, safe)" in proc.stderr
    assert "Apply it: gpudoctor lint --fix --select GPU003 heads.py" in proc.stderr
    ticket = (tmp_path / "bundle" / "ticket.md").read_text()
    assert "#### Patch for `heads.py` (`GPU003` view-after-transpose, safe)" in ticket
    assert "```diff\n--- a/heads.py\n+++ b/heads.py\n" in ticket and "Apply it: `gpudoctor lint --fix --select GPU003 heads.py`" in ticket
    record = json.loads((tmp_path / "bundle" / "run.json").read_text())
    [patch] = record["diagnosis"]["code_patch"]["patches"]
    assert patch["lines"] == [3, 3] and "+    return o.transpose(1, 2).reshape(B, N, H * d)" in patch["diff"]
    assert (tmp_path / "heads.py").read_text().count(".view(") == 1  # run never modifies a file


# --- a verdict that is no entry: the same analysis in explain and run, and no code patch -------------


_FAILING = ("import sys\n"
            "sys.stderr.write('Traceback (most recent call last):\\n'\n"
            "                 '  File \"heads.py\", line 3, in merge\\n'\n"
            "                 '    return o.transpose(1, 2).view(B, N, H * d)\\n'\n"
            "                 {message!r})\n"
            "sys.exit(1)\n")
_HEADS = "def merge(o):\n    B, H, N, d = o.shape\n    return o.transpose(1, 2).view(B, N, H * d)\n"


@pytest.mark.parametrize("kind, message, title", [
    ("unrecognised", "RuntimeError: CUDA error: operation not supported on global/shared address space\n"
                     "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                     "below might be incorrect.\n",
     "Unrecognised CUDA error: operation not supported on global/shared address space"),
    ("platform", "RuntimeError: MPS backend out of memory (MPS allocated: 17.50 GB, other allocations: 1.02 GB, max "
                 "allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool. Use "
                 "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause system "
                 "failure).\n",
     "Not NVIDIA CUDA: Apple MPS (Metal)"),
])
def test_a_verdict_that_is_no_entry_is_run_s_too_and_patches_nothing(tmp_path, monkeypatch, kind, message, title):
    """A traceback naming a file here whose view lint would rewrite (GPU003), under a verdict that
    is a platform or a CUDA error no entry explains: `run` says what `explain` says (the kind, the
    title, the steps), in its terminal output, ticket and run.json, and neither prints a patch."""
    (tmp_path / "heads.py").write_text(_HEADS)
    (tmp_path / "fail.py").write_text(_FAILING.format(message=message))
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "run", "--bundle", "bundle", "--no-scan", "--",
                           sys.executable, "fail.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"gpudoctor: {title}" in proc.stderr and "Patch for" not in proc.stderr
    assert ("What applies:" if kind == "platform" else "First steps:") in proc.stderr
    record = json.loads((tmp_path / "bundle" / "run.json").read_text())
    diag = record["diagnosis"]
    assert record["schema_version"] == "1.3" and diag["verdict"]["kind"] == kind and diag["verdict"]["title"] == title
    assert diag["entry"] is None and diag["code_patch"] is None and diag[kind]["steps"]
    ticket = (tmp_path / "bundle" / "ticket.md").read_text()
    assert ticket.startswith(f"### `{shlex.join([sys.executable, 'fail.py'])}` fails: ") and \
        ("#### What applies" if kind == "platform" else "#### First steps") in ticket
    # explain reads the same output the same way, and patches nothing either
    data = explain_json_any(tmp_path, "bundle/output.log", monkeypatch)
    assert data["verdict"]["kind"] == kind and data["verdict"]["title"] == title and data["code_patch"] is None
    assert {k: diag["verdict"][k] for k in ("kind", "title", "line", "error", "platform")} == \
        {k: data["verdict"][k] for k in ("kind", "title", "line", "error", "platform")}
    assert (tmp_path / "heads.py").read_text() == _HEADS


def explain_json_any(root: Path, file: str, monkeypatch) -> dict:
    """explain --format json on a file, whatever its exit code (1 when the verdict is no entry)."""
    monkeypatch.chdir(root)
    r = runner.invoke(app, ["explain", "--file", file, "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_run_s_entry_is_the_verdict_s_with_the_versions_the_output_names(tmp_path):
    """run reads the entry as explain does (Entry.advised): the xformers fix names the torch the
    output names, not a placeholder."""
    from gpudoctor.ticket import bundle

    text = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
            "    PyTorch 2.5.1+cu121 with CUDA 1201 (you have 2.7.0+cu128)\n"
            "    Python  3.11.10 (you have 3.11.10)\n")
    diagnosis = bundle.diagnose(text)
    from gpudoctor.explain.explanation import from_analysis
    from gpudoctor.explain.matcher import analyse_text

    explained = from_analysis(analyse_text(text))
    assert diagnosis.kind == explained.kind == "entry" and diagnosis.entry.id == explained.entry.id
    assert diagnosis.entry.fix == explained.entry.fix and diagnosis.entry.patch == explained.entry.patch
    assert diagnosis.entry.patch != kb.load_entry(diagnosis.entry.id).patch and "2.7.0+cu128" in diagnosis.entry.patch
