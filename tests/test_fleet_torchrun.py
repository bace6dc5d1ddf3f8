"""`gpudoctor scan --distributed` under real torchrun with the gloo backend on this CPU machine:
4 local processes, and two fake nodes on 127.0.0.1 (`--nnodes 2 --node-rank`), with faults
injected by environment variables. Whatever goes wrong, rank 0 writes the fleet report and it
names the culprit.

Bounded: each run has a hard timeout here, and the distributed layer's own deadlines are short
(collective 5 s, liveness 10 s). Nothing asserts on timings except "late by more than the
injected delay allows", which holds on a loaded machine because the delay dwarfs the jitter.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch.distributed.run")

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 300  # seconds; a healthy run takes ~15 s here, a hang case ~25 s
KNOBS = {
    "GPUDOCTOR_COLLECTIVE_TIMEOUT": "5",
    "GPUDOCTOR_LIVENESS": "10",
    "GPUDOCTOR_ARRIVAL_TIMEOUT": "120",
    "GPUDOCTOR_LATE_AFTER": "3",
    "GPUDOCTOR_COMM_ITERATIONS": "2",
    "OMP_NUM_THREADS": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAKE_PROBE = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "fake_probes" / "ok.py")
# A real probe (torch in the scan's worker) in the first test; the others scan with a torch-free
# fake probe, so that four ranks cost four torch imports (the agents') instead of eight.
REAL = ["--probe", "contiguity"]
LIGHT = ["--probe-file", FAKE_PROBE, "--probe", "fake-ok"]


def torchrun(tmp_path, *, faults=None, nnodes=1, nproc=4, name="fleet", probes=LIGHT, device=("--device", "cpu")):
    """Run the distributed scan (every node's torchrun at once); returns rank 0's fleet report,
    the torchruns' exit codes and their output."""
    port = free_port()
    env = {**os.environ, **KNOBS, **(faults or {})}
    out = tmp_path / f"{name}.json"
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node),
               "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "gpudoctor", "scan", "--distributed", *device, *probes, "--json", str(out)]
        log = open(tmp_path / f"{name}-node{node}.log", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    done = []
    try:
        for proc, log in procs:
            proc.wait(timeout=RUN_TIMEOUT)
            done.append(proc.returncode)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            log.close()
    logs = "\n".join((tmp_path / f"{name}-node{n}.log").read_text() for n in range(nnodes))
    assert out.exists(), f"rank 0 wrote no fleet report:\n{logs[-3000:]}"
    return json.loads(out.read_text()), done, logs


def kinds(data):
    out = {}
    for f in data["findings"]:
        out.setdefault(f["kind"], []).append(f)
    return out


def validate(data):
    jsonschema = pytest.importorskip("jsonschema")
    from gpudoctor.fleet.render import load_schema

    jsonschema.validate(data, load_schema())


def test_four_ranks_a_slow_rank_and_a_different_torch(tmp_path):
    data, codes, logs = torchrun(tmp_path, faults={"GPUDOCTOR_FAULT_SLOW": "2:8", "GPUDOCTOR_FAULT_TORCH": "1:2.12.0"},
                                 probes=REAL)
    validate(data)
    found = kinds(data)
    [drift] = [f for f in found["version-drift"] if f["key"] == "torch"]
    assert [(c["rank"], c["value"]) for c in drift["culprits"]] == [(1, "2.12.0")]
    late = found["late-rank"][0]
    assert late["culprits"][0]["rank"] == 2  # the latest rank is named first
    assert "collective-failed" not in found and "missing-rank" not in found
    coll = data["collectives"]
    assert coll["backend"] == "gloo" and coll["results"]
    assert all(r["status"] == "ok" and r["busbw_gbps"] > 0 for r in coll["results"])
    assert [n["ranks"] for n in data["nodes"]] == [[0, 1, 2, 3]]
    assert codes == [1]  # version drift is an error: rank 0 exits 1


def test_a_rank_that_hangs_in_a_collective(tmp_path):
    # --device left out: the default, auto, is the CPU on this machine (no GPU), and gloo.
    data, codes, logs = torchrun(tmp_path, faults={"GPUDOCTOR_FAULT_HANG": "3"}, device=())
    found = kinds(data)
    [failed] = found["collective-failed"]
    assert [(c["rank"], c["value"]) for c in failed["culprits"]] == [(3, "hung")]
    assert data["summary"]["ranks"] == 4  # every rank still reported
    assert data["collectives"]["backend"] == "gloo"
    assert [n["counts"] for n in data["nodes"]] == [{"pass": 4}]  # fake-ok ran on every rank


def test_two_nodes_and_a_rank_that_crashes(tmp_path):
    data, codes, logs = torchrun(tmp_path, faults={"GPUDOCTOR_FAULT_CRASH": "3"}, nnodes=2, nproc=2)
    validate(data)
    assert [(n["name"], n["ranks"]) for n in data["nodes"]] == [("node-0", [0, 1]), ("node-1", [2, 3])]
    [failed] = kinds(data)["collective-failed"]
    assert [(c["node"], c["rank"], c["value"]) for c in failed["culprits"]] == [("node-1", 3, "crashed")]
    assert "SIGSEGV" not in failed["summary"] or "crashed" in failed["summary"]


def test_a_rank_whose_set_up_fails(tmp_path):
    # The set-up barrier: the other ranks stop before measuring, and only rank 2 is named.
    data, codes, logs = torchrun(tmp_path, faults={"GPUDOCTOR_FAULT_SETUP": "2"})
    [failed] = kinds(data)["collective-failed"]
    assert failed["key"] == "init"
    assert [(c["rank"], c["value"]) for c in failed["culprits"]] == [(2, "failed")]
    assert "injected set-up failure" in failed["summary"]
    assert all(row["status"] == "not-run" for row in data["collectives"]["results"])


def test_a_rank_process_that_dies_outright(tmp_path):
    # torchrun then stops every other rank (SIGTERM); rank 0 still writes the report.
    data, codes, logs = torchrun(tmp_path, faults={"GPUDOCTOR_FAULT_EXIT": "2"})
    found = kinds(data)
    [missing] = found["missing-rank"]
    assert [c["rank"] for c in missing["culprits"]] == [2]
    assert data["findings"][0]["kind"] == "missing-rank"  # the cause first, its victims after
