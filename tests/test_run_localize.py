"""`gpudoctor run --localize`: the synchronous re-run of an asynchronous CUDA failure.

tests/fixtures/run/async_fail.py simulates CUDA on the CPU: its fake kernel reads
CUDA_LAUNCH_BLOCKING itself, failing at the launch when it is 1 and at the next synchronisation
otherwise, with torch's message and (under TORCH_SHOW_CPP_STACKTRACES=1) a C++ stack."""
from __future__ import annotations

import json
import sys

import pytest

from gpudoctor.ticket import bundle as ticket
from run_helpers import gpudoctor, needs_torch, script

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")


def _record(tmp_path, *args, env=None):
    out = tmp_path / "run.json"
    done = gpudoctor("run", "-o", str(out), *args, env=env)
    return done, json.loads(out.read_text())


def test_localize_reports_the_real_line_beside_the_blamed_one(tmp_path):
    done, record = _record(tmp_path, "--localize", "--", sys.executable, script("async_fail.py"))
    assert done.returncode == 1
    loc = record["localization"]
    assert loc["verdict"] == "moved"
    assert (loc["blamed"]["function"], loc["blamed"]["line"]) == ("loss_value", 21)
    assert (loc["real"]["function"], loc["real"]["line"]) == ("fused_scale", 17)
    assert loc["real"]["code"].startswith("return fakecuda.scaled_mm(x, 2)")
    assert loc["operator"] == "aten::_scaled_mm"
    assert loc["call"]["function"] == "scaled_mm"
    assert loc["env"] == {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}
    assert record["diagnosis"]["matches"][0]["id"] == "misaligned-address"
    err = done.stderr.decode()
    assert "re-running once with CUDA_LAUNCH_BLOCKING=1" in err
    assert "async_fail.py:17 in fused_scale (operator aten::_scaled_mm)" in err
    assert "the first run blamed" in err and "async_fail.py:21 in loss_value" in err


def test_without_localize_nothing_is_re_run(tmp_path):
    done, record = _record(tmp_path, "--", sys.executable, script("async_fail.py"))
    assert record["localization"] is None
    assert done.stdout.count(b"step done") == 1


@needs_torch
def test_localize_skips_a_failure_that_is_not_asynchronous(tmp_path):
    done, record = _record(tmp_path, "--localize", "--", sys.executable, script("dtype_mismatch.py"))
    assert record["localization"] is None
    assert b"not an asynchronous CUDA failure; nothing re-run" in done.stderr
    assert done.stdout.count(b"forward") == 1


def test_already_synchronous_is_not_re_run(tmp_path):
    done, record = _record(tmp_path, "--localize", "--", sys.executable, script("async_fail.py"),
                           env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert record["localization"]["verdict"] == "already-synchronous"
    assert done.stdout.count(b"step done") == 0  # failed at the launch, once


def test_a_failure_that_vanishes_when_synchronous(tmp_path):
    racy = tmp_path / "racy.py"
    racy.write_text(
        "import os, sys\n"
        "if os.environ.get('CUDA_LAUNCH_BLOCKING') != '1':\n"
        "    sys.exit('RuntimeError: CUDA error: an illegal memory access was encountered\\n'\n"
        "             'CUDA kernel errors might be asynchronously reported at some other API call, so the '\n"
        "             'stacktrace below might be incorrect.')\n"
    )
    done, record = _record(tmp_path, "--localize", "--", sys.executable, str(racy))
    assert done.returncode == 1  # the first run's status
    assert record["localization"]["verdict"] == "passed"
    assert "depends on asynchronous execution" in record["localization"]["summary"]


def test_synchronous_run_names_the_error_the_first_run_only_hinted_at(tmp_path):
    hint = tmp_path / "hint.py"
    hint.write_text(
        "import os\n"
        "def kernel():\n"
        "    if os.environ.get('CUDA_LAUNCH_BLOCKING') == '1':\n"
        "        raise RuntimeError('CUDA error: misaligned address')\n"
        "def sync():\n"
        "    raise RuntimeError('CUDA error: unspecified launch failure\\nCUDA kernel errors might be '\n"
        "                       'asynchronously reported at some other API call, so the stacktrace below might be incorrect.')\n"
        "kernel()\n"
        "sync()\n"
    )
    done, record = _record(tmp_path, "--localize", "--", sys.executable, str(hint))
    loc = record["localization"]
    assert loc["verdict"] == "moved" and loc["real"]["function"] == "kernel"
    assert record["diagnosis"]["source"] == "synchronous re-run"
    assert record["diagnosis"]["matches"][0]["id"] == "misaligned-address"


def test_is_asynchronous_uses_the_documented_ids():
    first = ticket.diagnose("RuntimeError: CUDA error: misaligned address\n")
    assert ticket.is_asynchronous(first)
    assert not ticket.is_asynchronous(ticket.diagnose("RuntimeError: mat1 and mat2 must have the same dtype\n"))
