"""`gpudoctor lint` end to end through typer's CliRunner: output formats, exit codes, fixes written
atomically, suppressions, configuration, bad input (one line, exit 2, no traceback), and
`gpudoctor explain GPU0xx`."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from lint_helpers import TWO_FINDINGS

runner = CliRunner()

BUGGY = TWO_FINDINGS + textwrap.dedent("""

    def shapes(x):
        sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
        a, b, c = sizes[0]
        return a * b * c
    """).lstrip(" ")
CLEAN = "import torch\n\n\ndef f(x):\n    return x.transpose(1, 2).reshape(2, -1)\n"
LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>GPU\d{3}) .+ \[(?P<kb>[a-z0-9-]+)\]$")


def invoke(*args):
    return runner.invoke(app, ["lint", *map(str, args)])


@pytest.fixture
def buggy(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(BUGGY)
    return p


def test_text_output_and_exit_code(buggy):
    r = invoke(buggy)
    assert r.exit_code == 1, r.output
    found = [LINE.match(line) for line in r.stdout.splitlines()]
    assert all(found), r.stdout
    assert [(m["code"], int(m["line"])) for m in found] == [("GPU003", 7), ("GPU005", 16), ("GPU004", 21)]
    assert {m["kb"] for m in found} == {"view-stride", "parameter-reassign", "misaligned-address"}
    assert "found 3 findings" in r.stderr and "2 fixable with --fix" in r.stderr


def test_clean_file_exits_0(tmp_path):
    (tmp_path / "ok.py").write_text(CLEAN)
    r = invoke(tmp_path)
    assert r.exit_code == 0 and r.stdout == "" and "no findings" in r.stderr


def test_json_contract(buggy):
    r = invoke(buggy, "--format", "json")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert set(data) == {"schema_version", "findings", "errors", "internal_errors", "files_checked", "fixed"}
    assert data["schema_version"] == "1.1"
    assert data["files_checked"] == 1 and data["errors"] == [] and data["internal_errors"] == []
    for f in data["findings"]:
        assert {"path", "line", "col", "code", "kb_id", "message", "fix"} <= set(f)
        assert set(f["fix"]) == {"applicability", "diff", "description"}
    view = next(f for f in data["findings"] if f["code"] == "GPU003")
    assert view["fix"]["applicability"] == "safe"
    assert "-    return y.view(B, H * N, D)" in view["fix"]["diff"]
    assert "+    return y.reshape(B, H * N, D)" in view["fix"]["diff"]


def test_markdown_output(buggy):
    r = invoke(buggy, "--format", "md")
    assert r.exit_code == 1 and "| `GPU003` |" in r.stdout


def test_markdown_keeps_a_file_name_with_backticks_and_pipes_inside_its_cell():
    from gpudoctor.lint.model import FileError, Finding, Fix, LintResult
    from gpudoctor.lint.render import markdown

    result = LintResult(findings=[Finding("a`b|c.py", 3, 4, "GPU003", "view-stride", "m", Fix("display-only", "d"))],
                        errors=[FileError("x`y.py", "cannot read")], files_checked=2)
    out = markdown(result)
    assert "| ``a`b\\|c.py:3:4`` | `GPU003` |" in out
    assert "- ``x`y.py``: cannot read" in out


def test_diff_shows_safe_fixes_and_changes_nothing(buggy):
    before = buggy.read_bytes()
    r = invoke(buggy, "--diff")
    assert r.exit_code == 1
    assert "+    return y.reshape(B, H * N, D)" in r.stdout
    assert "+        self.token.data = self.token.data.to(dtype)" in r.stdout
    assert ".tolist()" not in r.stdout  # unsafe: only with --unsafe-fixes
    assert buggy.read_bytes() == before
    r = invoke(buggy, "--diff", "--unsafe-fixes")
    assert "a, b, c = sizes[0].tolist()" in r.stdout


def test_fix_is_atomic_keeps_the_mode_and_leaves_unsafe_fixes(buggy):
    os.chmod(buggy, 0o640)
    inode = os.stat(buggy).st_ino
    r = invoke(buggy, "--fix")
    assert r.exit_code == 1, r.output  # the unsafe GPU004 finding remains
    text = buggy.read_text()
    assert "return y.reshape(B, H * N, D)" in text and "self.token.data = self.token.data.to(dtype)" in text
    assert "sizes[0].tolist()" not in text
    assert stat.S_IMODE(os.stat(buggy).st_mode) == 0o640
    assert os.stat(buggy).st_ino != inode  # written to a temporary file and renamed
    assert [m["code"] for m in map(LINE.match, r.stdout.splitlines())] == ["GPU004"]
    assert "fixed 2 findings" in r.stderr
    assert not [p for p in os.listdir(buggy.parent) if p.startswith(".gpudoctor-")]
    r = invoke(buggy, "--fix", "--unsafe-fixes")
    assert r.exit_code == 0 and "sizes[0].tolist()" in buggy.read_text()
    compile(buggy.read_text(), str(buggy), "exec")


def test_fix_through_a_symlink_replaces_the_target(buggy, tmp_path):
    link = tmp_path / "link.py"
    link.symlink_to(buggy)
    r = invoke(link, "--fix")
    assert r.exit_code == 1
    assert link.is_symlink() and "y.reshape(" in buggy.read_text()


def test_unparseable_and_undecodable_files_are_reported_and_skipped(tmp_path):
    (tmp_path / "broken.py").write_text("def f(:\n    x.transpose(1, 2).view(-1)\n")
    (tmp_path / "latin.py").write_bytes(b"# caf\xe9\nx = y.transpose(0, 1).view(-1)\n")
    (tmp_path / "nul.py").write_bytes(b"x.view(1)\x00.transpose(0, 1)")
    (tmp_path / "good.py").write_text(BUGGY)
    before = (tmp_path / "broken.py").read_bytes()
    r = invoke(tmp_path, "--fix")
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpudoctor: ")]
    assert any("broken.py: cannot parse" in e for e in errors)
    assert any("latin.py: cannot decode" in e for e in errors)
    assert any("nul.py: binary file" in e for e in errors)
    assert (tmp_path / "broken.py").read_bytes() == before
    assert "y.reshape(" in (tmp_path / "good.py").read_text()  # the rest is still linted and fixed


@pytest.mark.parametrize("args, message", [
    (["/no/such/path"], "no such file or directory"),
    (["--select", "GPU999", "."], "unknown rule code"),
    (["--format", "xml", "."], "--format xml"),
    (["--fix", "--diff", "."], "cannot be used together"),
])
def test_usage_errors_are_one_line_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(*args)
    assert r.exit_code == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_unknown_file_type_given_explicitly(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("x")
    r = invoke(p)
    assert r.exit_code == 2 and "not a file type" in r.stderr


def test_select_and_ignore(buggy):
    r = invoke(buggy, "--select", "GPU003,GPU005", "--ignore", "GPU005")
    assert [m["code"] for m in map(LINE.match, r.stdout.splitlines())] == ["GPU003"]
    r = invoke(buggy, "--ignore", "GPU00")
    assert r.exit_code == 0


def test_inline_suppression(tmp_path):
    p = tmp_path / "s.py"
    p.write_text(textwrap.dedent("""
        def f(x, B, N, H, D):
            y = x.view(B, N, H, D).transpose(1, 2)
            a = y.view(B, H * N, D)  # gpudoctor: ignore[GPU003]
            b = y.view(B, H * N, D)  # gpudoctor: ignore[GPU001]
            c = y.view(B, H * N, D)  # gpudoctor: ignore
            d = y.view(B, H * N, D); s = "# gpudoctor: ignore[GPU003]"
            return a, b, c, d
        """).lstrip())
    r = invoke(p)
    assert [int(m["line"]) for m in map(LINE.match, r.stdout.splitlines())] == [4, 6]


def test_pyproject_configuration_is_found_walking_up(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "x"

        [tool.gpudoctor.lint]
        ignore = ["GPU005"]
        exclude = ["vendor/**"]
        per-file-ignores = { "tests/**" = ["GPU003"] }
        """))
    for rel in ("src/pkg/model.py", "vendor/lib.py", "tests/test_model.py"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(BUGGY)
    r = invoke(tmp_path / "src", "--format", "json")
    codes = sorted(f["code"] for f in json.loads(r.stdout)["findings"])
    assert codes == ["GPU003", "GPU004"]
    r = invoke(tmp_path, "--format", "json")
    found = {(os.path.relpath(f["path"], tmp_path), f["code"]) for f in json.loads(r.stdout)["findings"]}
    assert not any(p.startswith("vendor") for p, _ in found)
    assert ("tests/test_model.py", "GPU003") not in found and ("tests/test_model.py", "GPU004") in found
    r = invoke(tmp_path / "src", "--isolated", "--format", "json")
    assert "GPU005" in {f["code"] for f in json.loads(r.stdout)["findings"]}


def test_exclude_globs_may_start_with_dot_slash_and_name_hidden_folders(tmp_path):
    from gpudoctor.lint.config import Config

    config = Config(exclude=("./.cache/**", "./build2"), root=str(tmp_path))
    assert config.excluded(str(tmp_path / ".cache" / "a.py"))
    assert config.excluded(str(tmp_path / "build2" / "b.py"))
    assert not config.excluded(str(tmp_path / "cache" / "a.py"))


def test_bad_configuration_is_an_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.gpudoctor.lint]\nselekt = ['GPU001']\n")
    (tmp_path / "a.py").write_text(CLEAN)
    r = invoke(tmp_path)
    assert r.exit_code == 2 and "unknown key 'selekt'" in r.stderr


def test_output_file_and_clean_stdout(buggy, tmp_path):
    out = tmp_path / "out" / "lint.json"
    out.parent.mkdir()
    r = invoke(buggy, "--format", "json", "-o", out, "-q")
    assert r.exit_code == 1 and r.stdout == "" and r.stderr == ""
    assert len(json.loads(out.read_text())["findings"]) == 3


def test_worker_pool_gives_the_same_findings(tmp_path):
    """Enough files to go through the process pool: the result equals the serial run (the
    forked workers answer a file with nothing to report by its index alone)."""
    from gpudoctor.lint import engine

    padding = "# " + "x" * 78 + "\n"
    for i in range(24):
        (tmp_path / f"m{i}.py").write_text(BUGGY + padding * 200)
        (tmp_path / f"plain{i}.py").write_text("import torch\nx = torch.zeros(3).view(-1)\n" + padding * 200)
    serial, serial_files, _ = engine.lint([str(tmp_path)], isolated=True, jobs=1)
    pooled, pooled_files, _ = engine.lint([str(tmp_path)], isolated=True, jobs=2)
    assert serial.findings == pooled.findings and len(serial.findings) == 72
    assert serial.files_checked == pooled.files_checked == 48
    assert serial_files == pooled_files and pooled_files[str(tmp_path / "plain3.py")] == \
        engine.FileResult(str(tmp_path / "plain3.py"), checked=True)


# --- explain GPU0xx ------------------------------------------------------------------------------


def test_explain_shows_the_rule_and_its_entry():
    r = runner.invoke(app, ["explain", "gpu003"])
    assert r.exit_code == 0, r.output
    for part in ("GPU003", "What it finds", "Why it breaks", "Fix safety", "Does not fire on",
                 "view size is not compatible", "References"):
        assert part in r.stdout


def test_explain_rule_json():
    r = runner.invoke(app, ["explain", "--json", "GPU010"])
    data = json.loads(r.stdout)
    assert data["rule"]["code"] == "GPU010" and data["entry"]["id"] == "custom-allocator"
    # The same document as `explain custom-allocator --json`, plus the rule.
    by_id = json.loads(runner.invoke(app, ["explain", "--json", "custom-allocator"]).stdout)
    assert {k: v for k, v in data.items() if k != "rule"} == by_id


def _modules_after(args: list[str]) -> set[str]:
    code = textwrap.dedent(f"""
        import sys
        from gpudoctor.cli import app
        try:
            app({args!r}, standalone_mode=False)
        except SystemExit:
            pass
        except Exception:
            pass
        print("\\n".join(sorted(sys.modules)))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    return set(out.split())


def test_explain_of_a_kb_id_does_not_import_the_linter():
    mods = _modules_after(["explain", "misaligned-address"])
    assert "gpudoctor.knowledge.kb" in mods and not any(m.startswith("gpudoctor.lint") for m in mods)


def test_lint_never_imports_torch(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(BUGGY)
    mods = _modules_after(["lint", str(p), "-q"])
    assert "gpudoctor.lint.pyflow" in mods and "torch" not in mods


# --- -o never replaces a file lint reads ----------------------------------------------------------


@pytest.mark.parametrize("how", ["walked", "excluded", "cpp", "named", "hardlink"])
def test_output_that_is_a_linted_source_is_refused(tmp_path, monkeypatch, how):
    """`gpudoctor lint . -o model.py` would replace the user's code with the report: one line,
    exit 2, every file as it was (with --fix too: nothing is fixed before the refusal)."""
    (tmp_path / "model.py").write_text(BUGGY)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "site.py").write_text(CLEAN)
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    target = {"walked": "model.py", "excluded": os.path.join(".venv", "site.py"), "cpp": "k.cu",
              "named": "model.py", "hardlink": "notes.txt"}[how]
    if how == "hardlink":
        os.link(tmp_path / "model.py", tmp_path / "notes.txt")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    linted = "./model.py" if how == "named" else "."
    r = invoke(linted, "--fix", "-o", target)
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"-o {target}:" in r.stderr and "never overwrites what it reads" in r.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_output_beside_linted_sources_is_written(tmp_path, monkeypatch):
    """What is refused is a source file, not the folder: a report file (new or old, of a kind lint
    does not read) in the linted folder is written as asked."""
    (tmp_path / "model.py").write_text(BUGGY)
    (tmp_path / "old.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for target in ("lint.txt", "old.json"):
        r = invoke(".", "-o", target, "-q")
        assert r.exit_code == 1, r.output
        assert "GPU003" in (tmp_path / target).read_text()
    assert (tmp_path / "model.py").read_text() == BUGGY
