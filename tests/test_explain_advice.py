"""What `explain` advises and quotes, tried as a new user would (issue 28): the fix uses the versions
the text names, no patch installs a torch the user did not ask for, each evidence line is quoted
once and the line the verdict rests on is among them, and an entry that needs a fact the text
lacks is not listed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudoctor.cli import app
from gpudoctor.explain import explanation as ex
from gpudoctor.explain.matcher import analyse_text
from gpudoctor.knowledge import kb

FIXTURES = Path(__file__).parent / "fixtures"
LABELLED = sorted((FIXTURES / "dev").glob("*/*.txt")) + sorted((FIXTURES / "heldout").glob("*/*.txt"))

# The common xformers warning, as people paste it (torch upgraded under an xformers built for another).
XFORMERS_WARNING = """\
WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:
    PyTorch 2.5.1+cu121 with CUDA 1201 (you have 2.6.0+cu124)
    Python  3.10.11 (you have 3.10.11)
  Please reinstall xformers (see https://github.com/facebookresearch/xformers#installing-xformers)
  Memory-efficient attention, SwiGLU, sparse and more won't be available.
  Set XFORMERS_MORE_DETAILS=1 for more details
"""


def invoke(*args: str):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})


def test_the_xformers_fix_uses_the_versions_the_warning_names():
    r = invoke("explain", XFORMERS_WARNING)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == "xformers-build-mismatch"
    fix_line = next(line for line in r.stdout.splitlines() if line.startswith("Fix:"))
    assert "cu124" in fix_line and 'torch==2.6.0' in fix_line
    assert "cuXXX" not in r.stdout and "cuNNN" not in r.stdout
    assert 'pip install xformers "torch==2.6.0" --index-url https://download.pytorch.org/whl/cu124' in r.stdout
    data = json.loads(invoke("explain", "--format", "json", XFORMERS_WARNING).stdout)
    assert "whl/cu124" in data["verdict"]["quick_fix"] and "whl/cu124" in data["entry"]["patch"]
    assert "2.8.0" not in data["entry"]["patch"]
    md = invoke("explain", "--format", "md", XFORMERS_WARNING).stdout
    assert "whl/cu124" in md and "cuXXX" not in md


def test_a_cpu_only_torch_under_xformers_gets_the_cuda_build_of_the_same_version():
    text = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
            "    PyTorch 2.2.0+cu121 with CUDA 1201 (you have 2.2.0+cpu)\n")
    [line] = [m for m in [analyse_text(text).verdict] if m]
    entry = line.entry.advised(line.captures)
    assert '"torch==2.2.0" --index-url https://download.pytorch.org/whl/cu121' in entry.patch
    assert "CPU-only" in entry.quick_fix


def test_by_id_the_xformers_advice_keeps_the_users_torch_without_a_made_up_version():
    entry = kb.load_entry("xformers-build-mismatch")
    assert 'torch==$TORCH' in entry.patch and "cuXXX" not in entry.quick_fix + " ".join(entry.fix)


# `pip install ... torch==2.8.0` (or <, >=, ~=) with a literal version: a torch the user did not ask
# for. `torch==$(...)`, `torch=={have_version}` (the user's own, read from the text) and
# `torch==<your version>` keep the user's torch.
_PIN = re.compile(r"(?:pip3?|conda)\s+install\b[^\n`]*?(?<![\w-])(?:py)?torch(?:vision|audio)?\s*(?:==|>=|<=|~=|=|<|>)\s*[\"']?\d")


def _advice_texts(entry: kb.Entry) -> list[tuple[str, str]]:
    out = [("quick_fix", entry.quick_fix)] + [(f"fix[{i}]", s) for i, s in enumerate(entry.fix)]
    # A diff's removed lines are what the user had; only the lines it keeps or adds are advice.
    patch = entry.patch if entry.patch_lang != "diff" else "\n".join(
        line for line in entry.patch.splitlines() if not line.startswith("-"))
    out.append(("patch", patch))
    for n, variant in enumerate(entry.variants):
        out += [(f"variants[{n}].{k}", v) for k, v in (("quick_fix", variant.quick_fix), ("patch", variant.patch)) if v]
        out += [(f"variants[{n}].fix", s) for s in variant.fix or ()]
    return out


@pytest.mark.parametrize("entry", kb.load_all(), ids=lambda e: e.id)
def test_no_advice_pins_a_torch_the_user_did_not_ask_for(entry):
    for where, text in _advice_texts(entry):
        assert not _PIN.search(text), f"{entry.id} {where}: {_PIN.search(text).group(0)!r}"


def test_the_pin_audit_catches_a_pin():
    assert _PIN.search("+pip install torch==2.8.0 xformers --index-url https://download.pytorch.org/whl/cu128")
    assert _PIN.search('pip install "torch<2.8" --index-url x')
    assert not _PIN.search('pip install xformers "torch==$TORCH" --index-url x')
    assert not _PIN.search('pip install "torch=={have_version}" --index-url x')


# --- evidence ---------------------------------------------------------------------------------------


def _texts():
    return [(p.parent.name + "/" + p.stem, p.read_text(encoding="utf-8").partition("\n")[2]) for p in LABELLED]


def test_each_evidence_line_is_quoted_once_and_the_verdicts_own_line_first():
    """Over every labelled text: no input line is quoted twice for one match, and the line a
    verdict says it comes from ("from line 6") is the first line it quotes."""
    for name, text in _texts():
        analysis = analyse_text(text)
        for m in analysis.matches:
            numbered = [n for n in m.lines if n]
            assert len(numbered) == len(set(numbered)), (name, m.id, m.lines)
        verdict = analysis.verdict
        if verdict is not None:
            assert verdict.lines and verdict.lines[0] == verdict.first_line, (name, verdict.id, verdict.lines)


def test_an_out_of_memory_message_on_one_long_line_is_quoted_once():
    text = ('Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n    out = model(x)\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 23.65 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 22.43 GiB "
            "memory in use. Of the allocated memory 21.80 GiB is allocated by PyTorch, and 200.00 MiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")
    r = invoke("explain", text)
    assert r.exit_code == 0
    assert r.stdout.count("line 4:") == 1 and "cuda-oom" in r.stdout.splitlines()[0]


def test_a_verdict_that_rests_on_a_late_line_quotes_that_line():
    """Support lines before the anchor (frames, a log prefix) must not push the line the verdict
    rests on out of the quoted lines."""
    text = ("  File \"/usr/lib/python3/site-packages/flash_attn/flash_attn_interface.py\", line 10, in <module>\n"
            "    import flash_attn_2_cuda as flash_attn_cuda\n"
            "  File \"/usr/lib/python3/site-packages/flash_attn/__init__.py\", line 3, in <module>\n"
            "    from flash_attn.flash_attn_interface import flash_attn_func\n"
            "  File \"model.py\", line 5, in <module>\n"
            "ImportError: flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: "
            "_ZN3c104cuda9SetDeviceEi\n")
    verdict = analyse_text(text).verdict
    assert verdict is not None and verdict.first_line == 6
    r = invoke("explain", text)
    said = next(line for line in r.stdout.splitlines() if "of the input" in line)
    assert "from line 6" in said and "\nline 6: ImportError" in r.stdout


def test_an_entry_that_needs_a_fact_the_text_lacks_is_not_listed():
    """A `no kernel image` text with no word of xformers: xformers-build-mismatch is not a match
    (its template's opening word "PyTorch", in "...the current PyTorch installation.", is no
    cut-short xformers message)."""
    text = ("NVIDIA A100-PCIE-40GB with CUDA capability sm_80 is not compatible with the current PyTorch installation.\n"
            "The current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70 sm_75.\n"
            "RuntimeError: CUDA error: no kernel image is available for execution on the device\n")
    ids = [m.id for m in analyse_text(text).matches]
    assert ids[0] == "no-kernel-image" and not [i for i in ids if i.startswith("xformers")]
    for name, body in _texts():
        # (xformers' own operator listing, labelled with an xformers entry, need not say "xformers")
        if "xformers" not in body.lower() and not name.startswith("xformers"):
            listed = [m.id for m in analyse_text(body).matches if m.id.startswith("xformers")]
            assert not listed, (name, listed)
