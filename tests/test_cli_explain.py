"""`gpudoctor explain` and `gpudoctor list` through typer's CliRunner: every exit code, the JSON
contract, and bad input (one line, exit 2, no traceback)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import app
from gpudoctor.explain.explanation import EXPLAIN_SCHEMA_VERSION
from kb_helpers import outside_the_knowledge_base

runner = CliRunner()
MISALIGNED = "RuntimeError: CUDA error: misaligned address\n"


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def test_explain_by_id_shows_the_entry():
    r = invoke("explain", "misaligned-address")
    assert r.exit_code == 0, r.output
    for part in ("misaligned address", "Why", "Fix", "Patch", "References", ".contiguous()"):
        assert part in r.output


def test_explain_by_alias_is_case_insensitive():
    r = invoke("explain", "--json", "CUDAERRORMISALIGNEDADDRESS")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["entry"]["id"] == "misaligned-address" and data["matches"] == []


def test_explain_text_json_contract():
    r = invoke("explain", "--json", MISALIGNED)
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["schema_version"] == EXPLAIN_SCHEMA_VERSION
    best = data["matches"][0]
    assert best["id"] == "misaligned-address"
    assert 0 < best["confidence"] <= 1
    assert any("misaligned address" in e for e in best["evidence"])
    assert data["entry"]["id"] == "misaligned-address"


def test_explain_text_human_output_starts_with_the_verdict():
    r = invoke("explain", MISALIGNED)
    assert r.exit_code == 0
    lines = r.output.splitlines()
    # The verdict first: the id, its title, where it was found, the cause and the fix.
    assert lines[0] == "misaligned-address"
    assert "from line 1 of the input" in lines[2]
    assert lines[3].startswith("Cause:") and any(l.startswith("Fix:") for l in lines[3:8])
    assert "line 1: RuntimeError: CUDA error: misaligned address" in r.output
    # Then the full story.
    assert "What happened" in r.output and "Patch" in r.output and "References" in r.output


def test_a_plain_keyerror_says_no_gpu_failure_is_recognised_and_nothing_more():
    """A Python error in GPU code is no GPU failure: one line, exit 1, no `gpudoctor scan` hint
    (a scan would not find what is not there)."""
    text = outside_the_knowledge_base('Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n'
                                      '    state = ckpt["model_state_dict"]\nKeyError: \'model_state_dict\'\n')
    for args in ([], ["--format", "md"]):
        r = invoke("explain", *args, text)
        assert r.exit_code == 1
        assert r.stderr == "gpudoctor: no GPU failure recognised in this text\n"
        assert "scan" not in r.stdout
    assert invoke("explain", "-q", text).stdout == ""


def test_nothing_matched_json_has_empty_matches():
    r = invoke("explain", "--json", "the quick brown fox")
    assert r.exit_code == 1
    assert json.loads(r.stdout) == {"schema_version": EXPLAIN_SCHEMA_VERSION, "verdict": None, "platform": None,
                                    "unrecognised": None, "matches": [], "entry": None, "code_patch": None}


def test_unknown_id_like_word_gets_did_you_mean_and_exit_2():
    r = invoke("explain", "misalignd-adress")
    assert r.exit_code == 2
    assert "did you mean" in r.stderr and "misaligned-address" in r.stderr
    assert "Traceback" not in r.output


def test_stdin_dash():
    r = invoke("explain", "--json", "-", input=MISALIGNED)
    assert r.exit_code == 0
    assert json.loads(r.stdout)["matches"][0]["id"] == "misaligned-address"


def test_file_option(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("INFO starting\nWARNING: something benign\n" * 1000 + MISALIGNED)
    r = invoke("explain", "--json", "--file", str(log))
    assert r.exit_code == 0
    assert json.loads(r.stdout)["matches"][0]["id"] == "misaligned-address"


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "cannot read"),  # missing file
    (lambda p: p.mkdir(), "directory"),
    (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 40), "binary"),
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_text("   \n\n  \n"), "empty"),
])
def test_bad_files_give_one_line_and_exit_2(tmp_path, setup, message):
    path = tmp_path / "input"
    setup(path)
    r = invoke("explain", "--file", str(path))
    assert r.exit_code == 2
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text(MISALIGNED)
    path.chmod(0)
    r = invoke("explain", "--file", str(path))
    assert r.exit_code == 2 and "cannot read" in r.stderr


def test_binary_stdin_and_empty_stdin():
    assert invoke("explain", "-", input=b"\x00\x01\x02garbage\xff" * 100).exit_code == 2
    r = invoke("explain", "-", input="")
    assert r.exit_code == 2 and "empty" in r.stderr


def test_usage_errors_exit_2():
    assert invoke("explain").exit_code == 2
    assert invoke("explain", "x", "--file", "y").exit_code == 2
    assert invoke("explain", "--no-such-option").exit_code == 2


def test_input_file_is_not_modified(tmp_path):
    log = tmp_path / "keep.log"
    log.write_text(MISALIGNED)
    before = (log.read_bytes(), log.stat().st_mtime_ns)
    invoke("explain", "--file", str(log))
    assert (log.read_bytes(), log.stat().st_mtime_ns) == before


@pytest.mark.slow  # tens of seconds on 2 cores: left out by -m "not slow"
def test_log_over_100_mb_reads_the_tail_in_bounded_memory(tmp_path):
    log = tmp_path / "huge.log"
    line = b"INFO " + b"x" * 1019 + b"\n"
    with open(log, "wb") as f:
        f.write(MISALIGNED.replace("misaligned", "illegal memory access / misaligned").encode())  # in the skipped head
        f.write(line * (105 * 1024))  # 105 MiB of noise
        f.write(b"RuntimeError: CUDA error: misaligned address\n")
    # VmHWM (peak RSS of this image): ru_maxrss would carry over pytest's own peak across exec.
    code = ("import sys; from gpudoctor.cli import main; sys.argv=['gpudoctor','explain','--json','--file',sys.argv[1]];\n"
            "try:\n main()\nexcept SystemExit as e:\n"
            " hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
            " print('RSS', hwm, 'EXIT', e.code, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    assert data["matches"][0]["id"] == "misaligned-address"
    rss_kib = int(proc.stderr.split("RSS")[1].split()[0])
    assert rss_kib < 200 * 1024, f"explain used {rss_kib} KiB for a 105 MiB log"


def test_list_text_and_json():
    r = invoke("list")
    assert r.exit_code == 0 and "misaligned-address" in r.output
    data = json.loads(invoke("list", "--json").stdout)
    ids = [e["id"] for e in data["entries"]]
    assert "misaligned-address" in ids and ids == sorted(ids)


def test_explain_never_imports_torch():
    code = ("import sys; from gpudoctor.cli import main; sys.argv=['gpudoctor','explain','--json','misaligned-address'];\n"
            "try:\n main()\nexcept SystemExit:\n pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip().endswith("NO-TORCH"), proc.stderr


def _modules_after_explain(*args: str) -> set[str]:
    code = ("import sys; from gpudoctor.cli import main; sys.argv=['gpudoctor','explain',*sys.argv[1:]]\n"
            "try:\n main()\nexcept SystemExit:\n pass\n"
            "print(' '.join(sorted(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    return set(proc.stderr.split())


@pytest.mark.parametrize("fmt", ["text", "json", "md"])
def test_explain_by_id_reads_one_entry_without_the_matcher(fmt):
    """Start-up (benchmarks/bench_explain.py): by id, neither the matcher nor the text reader nor
    the report renderers load; pasted text does load the matcher."""
    mods = _modules_after_explain("misaligned-address", "--format", fmt)
    assert "gpudoctor.knowledge.kb" in mods and "gpudoctor.explain.explanation" in mods
    assert not mods & {"gpudoctor.explain.matcher", "gpudoctor.explain.textinput", "gpudoctor.knowledge.predicates", "gpudoctor.reports.render",
                       "gpudoctor.scan.runner", "torch"}
    assert "gpudoctor.explain.matcher" in _modules_after_explain("RuntimeError: CUDA error: misaligned address")


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "explain", "--json", "misaligned"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["entry"]["id"] == "misaligned-address"


# A pasted failure that quotes a token and a home directory: what explain writes goes into tickets.
LEAKY = ("OSError: /home/alice/.venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: "
         "undefined symbol: _ZN3c104cuda9SetDeviceEi token=hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa98765432\n")


@pytest.mark.parametrize("fmt", ["text", "json", "md"])
def test_explain_redacts_the_lines_it_quotes(fmt):
    r = invoke("explain", "--format", fmt, LEAKY)
    assert r.exit_code == 0, r.output
    assert "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa98765432" not in r.stdout
    assert "/home/alice" not in r.stdout
    if fmt == "json":
        evidence = json.loads(r.stdout)["matches"][0]["evidence"][0]
        assert "token=<secret-1>" in evidence and "/home/<user-1>/.venv" in evidence
        assert "_ZN3c104cuda9SetDeviceEi" in evidence  # what the diagnosis rests on stays


def test_explain_no_redact_keeps_the_text():
    r = invoke("explain", "--format", "json", "--no-redact", LEAKY)
    assert r.exit_code == 0, r.output
    evidence = json.loads(r.stdout)["matches"][0]["evidence"][0]
    assert "token=hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa98765432" in evidence and "/home/alice/.venv" in evidence


def test_a_few_words_that_match_nothing_suggest_the_id():
    """`explain "cuda oom"` is an id typed with a space: still exit 1 (nothing matched), but the
    line names the id."""
    r = invoke("explain", "cuda oom")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == "gpudoctor: no GPU failure recognised in this text; did you mean cuda-oom? (`gpudoctor explain ID`)\n"
    long = invoke("explain", "the weather was fine and nothing else happened today")
    assert long.exit_code == 1
    assert long.stderr == "gpudoctor: no GPU failure recognised in this text\n"


def test_an_unknown_lint_code_names_the_rules():
    from gpudoctor.lint.rules import RULES

    r = invoke("explain", "gpu999")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (f"gpudoctor: no lint rule GPU999: the rules are GPU001..{RULES[-1].code} "
                        "(`gpudoctor explain GPU001`)\n")


# --- every output mode against every outcome -------------------------------------------------------

MODES = {"quiet": ["-q"], "default": [], "verbose": ["-v"], "json": ["--format", "json"], "md": ["--format", "md"]}
NO_MATCH = "KeyError: 'model_state_dict'\n"
# (outcome, how the text arrives): an id only as an argument; text also piped in without `-`.
OUTCOMES = [("id", "argument"), ("match", "argument"), ("no-match", "argument"), ("empty", "argument"),
            ("match", "stdin"), ("no-match", "stdin"), ("empty", "stdin")]
TEXT = {"id": "misaligned-address", "match": MISALIGNED, "no-match": NO_MATCH, "empty": "  \n"}
EXIT = {"id": 0, "match": 0, "no-match": 1, "empty": 2}


def _check_content(mode: str, outcome: str, r) -> None:
    out, err = r.stdout, r.stderr
    from gpudoctor.knowledge import kb

    title = kb.load_entry("misaligned-address").title
    if outcome == "empty":
        assert out == "" and err.count("\n") == 1 and "empty" in err
        return
    if outcome == "no-match":
        assert "no GPU failure recognised in this text" in err and err.count("\n") == 1
        if mode == "json":
            data = json.loads(out)
            assert data["verdict"] is None and data["matches"] == [] and data["entry"] is None
        elif mode == "md":
            assert out == "No GPU failure recognised in this text.\n"
        else:
            assert out == ""
        return
    assert err == ""
    found = outcome == "match"
    if mode == "quiet":
        [line] = out.splitlines()
        assert line.startswith("misaligned-address  ") and line.endswith(title)
        assert ("%" in line) == found  # a match says how confident; an id has no confidence
    elif mode in ("default", "verbose"):
        lines = out.splitlines()
        assert lines[0] == "misaligned-address"
        assert ("line 1: RuntimeError: CUDA error: misaligned address" in out) == found
        assert "What happened" in out and "Patch" in out and ".contiguous()" in out
    elif mode == "json":
        data = json.loads(out)
        assert data["entry"]["id"] == "misaligned-address"
        assert data["verdict"]["id"] == "misaligned-address"
        if found:
            assert data["matches"][0]["id"] == "misaligned-address" and data["verdict"]["line"] == 1
        else:
            assert data["matches"] == [] and data["verdict"]["confidence"] is None
    else:
        assert out.startswith("## `misaligned-address`")
        assert ("- line 1: RuntimeError: CUDA error: misaligned address" in out) == found
        assert "### Patch" in out


@pytest.mark.parametrize("outcome, via", OUTCOMES, ids=[f"{o}-{v}" for o, v in OUTCOMES])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_and_outcome(mode, outcome, via):
    """No traceback anywhere: an id, a match, no match (a normal outcome, exit 1) and empty input
    (exit 2, one line), given as an argument or piped into standard input without `-`."""
    if outcome == "no-match":
        outside_the_knowledge_base(TEXT[outcome])
    if via == "argument":
        r = invoke("explain", *MODES[mode], TEXT[outcome])
    else:
        r = invoke("explain", *MODES[mode], input=TEXT[outcome])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    assert r.exit_code == EXIT[outcome], (r.stdout, r.stderr)
    _check_content(mode, outcome, r)


def _run_with_stdin(stdin, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "explain", *args], stdin=stdin,
                          capture_output=True, text=True, timeout=60)


def test_a_pipe_is_read_without_dash():
    """`python train.py 2>&1 | gpudoctor explain`: standard input that is not a terminal is read
    when no text is given, as grep and jq read it."""
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "explain", "--format", "json"],
                          input="INFO step 1\n" + MISALIGNED, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"]["id"] == "misaligned-address" and data["verdict"]["line"] == 2


def test_dev_null_on_stdin_is_empty_input():
    with open(os.devnull, "rb") as null:
        proc = _run_with_stdin(null)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "gpudoctor: standard input is empty: paste an error message or pass a log file\n"


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_terminal_on_stdin_with_no_text_is_a_usage_error():
    """Nothing given and a person at the terminal: one line saying what to give, exit 2, and no
    wait for input that is not coming."""
    leader, follower = os.openpty()
    try:
        proc = _run_with_stdin(follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("gpudoctor: nothing to explain: give an id or an error text, pipe a log in")
    assert proc.stderr.count("\n") == 1
