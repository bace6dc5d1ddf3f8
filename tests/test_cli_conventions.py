"""The CLI's conventions, for every command (docs/conventions.md: "Conventions" and "Exit codes"): --format and
-o with the old spellings as aliases, --version, completion, -q/-v, one-line usage errors with exit
2 and no traceback, outputs checked before any work, files written whole or not at all and never
through a link, and standard output that is closed, full, a closed pipe or ASCII-only.

In-process tests use typer's CliRunner; the stream cases run the real console script in a
subprocess, because they are about file descriptor 1 itself. Scans use the fake probes."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpudoctor import cli, output
from gpudoctor.cli import app
from gpudoctor.scan import options as scan_options
from gpudoctor.scan.command import ScanProgress
from gpudoctor.reports.model import SCHEMA_VERSION

FAKES = pathlib.Path(__file__).parent / "fixtures" / "fake_probes"
OK = ["--probe-file", str(FAKES / "ok.py"), "--probe", "fake-ok"]


def run(*args: str, **kw):
    return CliRunner().invoke(app, list(args), **kw)


def one_line_error(result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def gpudoctor(*args: str, **kw) -> subprocess.CompletedProcess:
    """The real entry point, as a user runs it."""
    if "stdout" in kw:
        kw.setdefault("stderr", subprocess.PIPE)
    else:
        kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 300)
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], text=True, **kw)


# --- version, help, completion -------------------------------------------------------------------


def test_version():
    from gpudoctor import __version__

    for flag in ("--version", "-V"):  # -V as ruff, uv and pip spell it
        result = run(flag)
        assert result.exit_code == 0 and result.stdout == f"gpudoctor {__version__}\n", flag


# --- colour: --color auto|always|never on every command, NO_COLOR -----------------------------------

_ESCAPE = re.compile(r"\x1b\[")


def _on_a_pty(*args: str, no_color: str | None = None) -> str:
    """`gpudoctor ARGS` with standard output on an 80-column pseudo-terminal: what it wrote, raw."""
    from pty_helpers import on_a_pty

    return on_a_pty(list(args), 80, {"NO_COLOR": no_color} if no_color is not None else None)[0]


def test_no_color_and_color_never_leave_no_escape_sequence_on_a_terminal():
    """NO_COLOR (no-color.org) turns colour off; rich alone would still write bold and dim. Under
    NO_COLOR, and with --color never, the page has no escape sequence at all."""
    args = ("explain", "misaligned-address")
    assert _ESCAPE.search(_on_a_pty(*args)), "a terminal gets colour by default"
    for text in (_on_a_pty(*args, no_color="1"), _on_a_pty(*args, "--color", "never"),
                 _on_a_pty("--color", "never", *args)):
        assert "misaligned-address" in text and not _ESCAPE.search(text), text[:200]
    # always wins over NO_COLOR, and colours a pipe too (less -R).
    assert _ESCAPE.search(_on_a_pty(*args, "--color", "always", no_color="1"))
    piped = run(*args, "--color", "always")
    assert piped.exit_code == 0 and _ESCAPE.search(piped.stdout)
    assert not _ESCAPE.search(run(*args).stdout)  # auto: a pipe gets none


def test_every_command_takes_color(tmp_path):
    report = pathlib.Path(__file__).parent / "fixtures" / "reports" / "sample.json"
    code = tmp_path / "ok.py"
    code.write_text("x = 1\n")
    invocations = {
        "scan": ["scan", "--list-probes"], "explain": ["explain", "misaligned-address"],
        "run": ["run", "--no-scan", "--", sys.executable, "-c", "pass"], "report": ["report", str(report)],
        "diff": ["diff", str(report), str(report)], "lint": ["lint", str(code)],
        "merge": ["merge", str(report)], "list": ["list"],
    }
    listed = {c.name for c in cli.typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    assert set(invocations) == listed, "a new command: add it here"
    for name, args in invocations.items():
        for mode in ("never", "always", "auto"):
            result = run(args[0], "--color", mode, *args[1:])
            assert result.exit_code in (0, 1), (name, mode, result.output)
        bad = run(args[0], "--color", "sometimes", *args[1:])
        assert bad.exit_code == 2 and "--color sometimes: expected one of auto, always, never" in bad.stderr, name


def test_no_arguments_prints_help_and_exits_2():
    result = run()
    assert result.exit_code == 2 and "scan" in result.output and "explain" in result.output


def test_shell_completion_is_typers():
    assert "--install-completion" in run("--help").stdout
    # The installed script calls back through the same entry point with _GPUDOCTOR_COMPLETE set.
    proc = subprocess.run([sys.executable, "-m", "gpudoctor"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, _GPUDOCTOR_COMPLETE="complete_bash", COMP_WORDS="gpudoctor sc",
                                   COMP_CWORD="1"))
    assert "scan" in proc.stdout.split(), (proc.stdout, proc.stderr)


# --- usage errors: one line, exit 2, nothing run ------------------------------------------------


@pytest.mark.parametrize("args, text", [
    (["scan", "--timeout", "nan"], "gpudoctor: --timeout nan: must be a positive, finite number of seconds"),
    (["scan", "--timeout", "inf"], "gpudoctor: --timeout inf: must be a positive, finite number of seconds"),
    (["scan", "--timeout", "-3"], "gpudoctor: --timeout -3: must be a positive, finite number of seconds"),
    (["scan", "--timeout", "0"], "gpudoctor: --timeout 0: must be a positive, finite number of seconds"),
    (["scan", "--timeout", "1e300"], "gpudoctor: --timeout 1e300: more than an hour"),
    (["scan", "--timeout", "7200"], "gpudoctor: --timeout 7200: more than an hour"),
    (["scan", "--timeout", "soon"], "gpudoctor: --timeout soon: not a number of seconds"),
    (["scan", "--device", "cuda:x"], "gpudoctor: --device cuda:x: expected auto, all, cpu, cuda, cuda:N"),
    (["scan", "--device", "cdua:0"], "gpudoctor: --device cdua:0: unknown device type 'cdua' (did you mean cuda?)"),
    (["scan", "--device", ""], "gpudoctor: --device : expected auto"),
    (["scan", "--attn-shape", ""], "gpudoctor: --attn-shape '': expected four positive integers B,H,N,D"),
    (["scan", "--attn-shape", "1,2,3"], "expected four positive integers"),
    (["scan", "--attn-shape", "1,2,0,4"], "each of B,H,N,D must be between 1 and"),
    (["scan", "--attn-shape", "1,2,99999999999,4"], "each of B,H,N,D must be between 1 and"),
    (["scan", "--probe-option", "novalue"], "gpudoctor: --probe-option novalue: expected KEY=VALUE"),
    (["scan", "--probe-file", "/no/such/probe.py"], "gpudoctor: --probe-file /no/such/probe.py: no such file"),
    (["scan", "--format", "xml"], "gpudoctor: --format xml: expected one of text, json, md"),
    (["scan", "--bogus"], "No such option: --bogus"),
    (["scna"], "No such command 'scna'"),
    (["explain", "--format", "html", "cuda-oom"], "gpudoctor: --format html: expected one of text, json, md"),
    (["report", "--format", "yaml", "r.json"], "gpudoctor: --format yaml: expected one of text, json, md"),
    (["diff", "--format", "yaml", "a.json", "b.json"], "gpudoctor: --format yaml: expected one of text, json, md"),
    (["lint", "--format", "xml", "."], "gpudoctor: --format xml: expected one of text, json, md"),
    (["run", "--format", "json", "--", "true"], "gpudoctor: --format json: run's standard output is the command's"),
    (["list", "--json", "--format", "md"], "gpudoctor: --json/--markdown and --format disagree"),
])
def test_usage_errors_are_one_line_and_exit_2(args, text):
    line = one_line_error(run(*args))
    assert text in line


def test_good_device_values_pass_validation():
    for value in ("auto", "all", "cpu", "cuda", "cuda:3", "xpu:0", "npu", "privateuseone:1"):
        assert scan_options.parse_device(value) == value
    assert scan_options.parse_attn_shape(" 2, 8,4096 ,64") == (2, 8, 4096, 64)
    assert scan_options.parse_seconds("0.5") == 0.5


# --- formats, aliases, quiet and verbose ---------------------------------------------------------


def test_scan_format_json_to_stdout_is_only_json():
    result = run("scan", *OK, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["probe"] for r in data["results"]] == ["fake-ok"]
    inv = data["invocation"]
    assert inv["argv"][:2] == ["gpudoctor", "scan"] and "--format" in inv["argv"]
    assert inv["command"].startswith("gpudoctor scan --probe-file ") and inv["options"]["probes"] == ["fake-ok"]
    assert inv["options"]["outputs"] == [{"format": "json", "path": "-"}]


def test_invocation_is_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "r.json"
    result = run("scan", *OK, "-o", str(out), "--probe-option", "token=hunter2hunter2")
    assert result.exit_code == 0, result.output
    inv = json.loads(out.read_text())["invocation"]
    text = json.dumps(inv)
    assert "hunter2" not in text and str(tmp_path) not in text and "~/r.json" in text


def test_invocation_and_results_share_one_set_of_placeholders(tmp_path, monkeypatch):
    # Two machines, one named on the command line and one in a result: redacted by one Redactor,
    # they get two placeholders (redacted apart, both would be <host-1>).
    import re

    from gpudoctor.scan import runner
    from gpudoctor.probes.base import Status
    from gpudoctor.reports.model import ProbeResult, Report

    from gpudoctor.reports.redact import redact

    def scan(options, progress=None):  # runner.run_scan's contract, with a result that names a host
        report = Report(results=[ProbeResult("fake-ok", "Fake", Status.PASS, "rendezvous at gpu-b3.internal:29500",
                                             0.1, "cpu")], environment={}, redacted=False)
        return redact(report) if options.redact else report

    monkeypatch.setattr(runner, "run_scan", scan)
    out = tmp_path / "r.json"
    result = run("scan", "--probe-option", "host=gpu-a7.internal", "-o", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert "gpu-a7" not in out.read_text() and "gpu-b3" not in out.read_text() and data["redacted"]
    [in_command] = re.findall(r"<host-\d+>", data["invocation"]["options"]["probe_options"][0])
    [in_result] = re.findall(r"<host-\d+>", data["results"][0]["summary"])
    assert in_command != in_result


def test_output_suffix_picks_the_format_and_aliases_still_work(tmp_path):
    json_path, md_path, old_json, old_md = (tmp_path / n for n in ("a.json", "a.md", "old.json", "old.md"))
    result = run("scan", *OK, "-o", str(json_path))
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(json_path.read_text())["results"][0]["status"] == "pass"
    assert run("scan", *OK, "-o", str(md_path)).exit_code == 0
    assert md_path.read_text().startswith("**Environment:**")
    # The old spellings add a report beside the terminal page on stdout.
    result = run("scan", *OK, "--json", str(old_json), "--markdown", str(old_md))
    assert result.exit_code == 0
    assert result.stdout.startswith("gpudoctor: healthy") and old_md.read_text().startswith("**Environment:**")
    assert json.loads(old_json.read_text())["schema_version"] == SCHEMA_VERSION
    # --json - takes stdout: nothing else is printed there.
    result = run("scan", *OK, "--json", "-")
    assert json.loads(result.stdout)["results"][0]["probe"] == "fake-ok"


def test_two_outputs_on_stdout_or_one_file_twice_are_refused(tmp_path):
    assert "both write to standard output" in one_line_error(run("scan", *OK, "--json", "-", "--markdown", "-"))
    assert "both write to standard output" in one_line_error(run("scan", *OK, "--format", "md", "--json", "-"))
    same = str(tmp_path / "r.json")
    assert f"both write to {same}" in one_line_error(run("scan", *OK, "-o", same, "--json", same))


def test_quiet_prints_only_the_verdict_and_verbose_the_details():
    quiet = run("scan", *OK, "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "gpudoctor: healthy\n"
    assert quiet.stderr == ""  # no progress either
    verbose = run("scan", *OK, "-v")
    assert verbose.stdout.splitlines()[0] == verbose.stdout.splitlines()[-1] == "gpudoctor: healthy"
    assert "  python" in verbose.stdout and "  toolchain" in verbose.stdout


def test_findings_exit_1_and_name_the_thing_to_fix():
    result = run("scan", "--probe-file", str(FAKES / "raises.py"), "--probe", "fake-raise")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == lines[-1] == "gpudoctor: NOT HEALTHY (1 problem); fix first: fake-raise crashed"
    assert "gpudoctor scan --probe fake-raise -v" in result.stdout


def test_explain_formats_and_aliases(tmp_path):
    as_json = run("explain", "cuda-oom", "--format", "json")
    old = run("explain", "cuda-oom", "--json")
    assert as_json.exit_code == old.exit_code == 0 and as_json.stdout == old.stdout
    assert json.loads(as_json.stdout)["entry"]["id"] == "cuda-oom"
    from gpudoctor.explain import explanation as ex
    from gpudoctor.knowledge import kb

    md = run("explain", "cuda-oom", "--format", "md")
    # One Markdown renderer for explain: the explanation's own.
    assert md.exit_code == 0 and md.stdout == ex.render_markdown(ex.Explanation((), kb.load_entry("cuda-oom")))
    assert md.stdout.splitlines()[0].startswith("## `cuda-oom`: ")
    out = tmp_path / "explain.md"
    assert run("explain", "cuda-oom", "-o", str(out)).exit_code == 0 and "**Fix:**" in out.read_text()
    text = run("explain", "cuda-oom")
    assert text.exit_code == 0 and "cuda-oom: the full story" in text.stdout  # gpudoctor.explain.explanation.render_text
    quiet = run("explain", "RuntimeError: CUDA error: misaligned address", "-q")
    assert quiet.exit_code == 0 and quiet.stdout.splitlines()[0].startswith("misaligned-address  ")
    unknown = run("explain", "no-such-id", "--format", "json")
    assert unknown.exit_code == 2 and json.loads(unknown.stdout)["entry"] is None


def test_list_formats_and_aliases():
    ids = run("list", "-q").stdout.split()
    assert "misaligned-address" in ids and len(ids) == len(set(ids)) > 10
    assert run("list", "--json").stdout == run("list", "--format", "json").stdout
    assert run("list", "--markdown").stdout == run("list", "--format", "md").stdout
    assert "aliases" in run("list", "-v").stdout


# --- outputs: checked before the scan, written whole, never through a link -----------------------


@pytest.mark.parametrize("make, text", [
    (lambda d: "", "-o: the path is empty"),
    (lambda d: str(d), "is a directory"),
    (lambda d: str(d / "missing" / "r.json"), "no such directory"),
    (lambda d: "/dev/full", "is /dev/full, where every write fails"),
    (lambda d: "/proc/self/comm", "is in /proc, a kernel interface"),
    (lambda d: "/sys/kernel/r.json", "is in /sys, a kernel interface"),
])
def test_bad_outputs_are_refused_before_the_scan(tmp_path, make, text):
    result = run("scan", "--probe-file", str(FAKES / "once.py"), "-o", make(tmp_path))
    assert text in one_line_error(result)
    assert "fake" not in result.stderr  # no probe ran


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    line = one_line_error(run("scan", *OK, "-o", str(link)))
    assert "is a symbolic link" in line and "does not write through links" in line
    assert victim.read_text() == "precious" and link.is_symlink()
    # A dangling link too (it could be pointed at a file later).
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    assert "is a symbolic link" in one_line_error(run("list", "-o", str(dangling)))
    assert not (tmp_path / "nowhere").exists()


def test_a_link_planted_in_a_sticky_directory_after_the_check_replaces_nothing(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = shared / "report.json"
    output.check_output("-o", str(path))  # fine: nothing there yet
    path.symlink_to(victim)  # planted between the check and the write
    output.write_file(str(path), "{}\n")
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and path.read_text() == "{}\n"


def test_a_link_to_a_device_is_written_through(tmp_path):
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    result = run("list", "-o", str(link))
    assert result.exit_code == 0 and link.is_symlink()


def test_a_failed_write_after_the_scan_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text("old report")
    out.chmod(0o640)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    line = one_line_error(run("scan", *OK, "-q", "-o", str(out)))
    assert line == f"gpudoctor: cannot write {out}: No space left on device; the old file, if any, is unchanged"
    assert out.read_text() == "old report" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    monkeypatch.undo()
    assert run("scan", *OK, "-o", str(out)).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # the old file's mode is kept


# --- standard output: closed, full, a closed pipe, ASCII-only -------------------------------------


def test_stdout_on_dev_full_is_refused_before_the_scan():
    with open("/dev/full", "w") as full:
        proc = gpudoctor("scan", *OK, stdout=full)
    assert proc.returncode == 2
    assert proc.stderr == "gpudoctor: standard output is /dev/full, where every write fails; give a file with -o PATH\n"


def test_closed_stdout_is_a_usage_error():
    # Quoted: the interpreter may live under a path with a space (.ci/run puts it there).
    proc = subprocess.run(f"{shlex.quote(sys.executable)} -m gpudoctor list >&-", shell=True, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "gpudoctor: standard output is closed; give a file with -o PATH\n"


@pytest.mark.parametrize("args", [["list"], ["list", "--format", "json"], ["explain", "misaligned-address"],
                                  ["scan", *OK, "-v"]])
def test_a_closed_pipe_exits_141_without_a_word(args):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: EPIPE for certain
    try:
        proc = gpudoctor(*args, stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    # Only progress lines ([0/1] is the torch-import check where the interpreter has no torch).
    assert all(re.match(r"\[\d+/\d+\] ", line) or "importing torch" in line for line in proc.stderr.splitlines())


def test_ascii_only_stdout_prints_with_replacement():
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    import importlib.util

    torch_missing = importlib.util.find_spec("torch") is None  # then the scan's verdict is torch-import-failed
    for args in (["explain", "misaligned-address"], ["scan", *OK], ["list", "-v"]):
        proc = gpudoctor(*args, env=env)
        assert proc.returncode == (1 if torch_missing and args[0] == "scan" else 0), proc.stderr
        assert "Traceback" not in proc.stderr and "UnicodeEncodeError" not in proc.stderr


# --- progress --------------------------------------------------------------------------------------


def test_progress_is_richs_and_shows_the_device_the_probe_runs_on():
    import io

    from rich.console import Console
    from rich.progress import Progress

    from gpudoctor.probes.base import Status
    from gpudoctor.reports.model import ProbeResult
    from gpudoctor.scan.runner import ScanEvent

    result = ProbeResult("sdpa-backends", "SDPA", Status.PASS, "ok", 0.25, "cpu")
    events = [ScanEvent("status", message="importing torch"),
              ScanEvent("start", probe="sdpa-backends", device="cpu", index=1, total=2),
              ScanEvent("result", probe="sdpa-backends", device="cpu", index=1, total=2, result=result)]

    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    with ScanProgress(terminal) as progress:
        assert isinstance(progress.progress, Progress)  # a live display with its own refresh thread
        assert progress.progress.live.auto_refresh
        for event in events[:2]:
            progress(event)
        task = progress.progress.tasks[0]
        assert (task.description, task.total, task.completed) == ("sdpa-backends on cpu", 2, 0)
        progress(events[2])
        assert progress.progress.tasks[0].completed == 1

    log = Console(file=io.StringIO(), width=100)  # not a terminal: one plain line per result
    with ScanProgress(log) as progress:
        for event in events:
            progress(event)
    assert log.file.getvalue() == "gpudoctor: importing torch\n[1/2] sdpa-backends on cpu: pass (0.25s)\n"

    quiet = Console(file=io.StringIO(), force_terminal=True, width=100)
    with ScanProgress(quiet, quiet=True) as progress:
        for event in events:
            progress(event)
    assert quiet.file.getvalue() == ""


def test_dev_stdout_is_standard_output_and_list_probes_has_formats():
    result = run("scan", *OK, "-o", "/dev/stdout", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["results"][0]["probe"] == "fake-ok"
    listed = run("scan", "--list-probes", "--probe-file", str(FAKES / "ok.py"), "--format", "json")
    assert listed.exit_code == 0 and "fake-ok" in [p["id"] for p in json.loads(listed.stdout)["probes"]]


# --- one product: the commands in order, each with a one-line help --------------------------------

ORDER = ["scan", "explain", "run", "report", "diff", "lint", "merge", "list"]


def test_help_lists_the_commands_in_order():
    result = run("--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0
    names = [line.split()[1] for line in result.stdout.splitlines()
             if line.startswith("│ ") and len(line.split()) > 2 and line.split()[1] in ORDER]
    assert names == ORDER


@pytest.mark.parametrize("name", ORDER)
def test_each_command_has_a_one_line_help_at_80_columns(name):
    result = run("--help", env={"COLUMNS": "80"})
    lines = result.stdout.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith(f"│ {name} ")]
    following = lines[at + 1]
    assert not following.startswith("│" + " " * 8), (lines[at], following)  # no continuation line


@pytest.mark.parametrize("name", ORDER)
def test_shared_options_have_the_same_names_and_metavars(name):
    """--format [text|json|md], -o PATH, -q, -v (and --no-redact wherever something is redacted).
    lint adds formats of its own after the shared three (SARIF and GitHub annotations)."""
    result = run(name, "--help", env={"COLUMNS": "200"})
    text = result.stdout
    shared = "[text|json|md|sarif|github]" if name == "lint" else "[text|json|md]"
    assert "--format" in text and shared in text
    assert "--output" in text and " -o " in text and " PATH " in text
    assert "--quiet" in text and " -q " in text and "--verbose" in text and " -v " in text
    if name in ("scan", "run", "report", "diff"):
        assert "--no-redact" in text
