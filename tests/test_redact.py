"""Tests for redaction: secrets planted in the environment, a user's home and name, the hostname
and GPU identifiers must not reach a report built through the real collectors."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from gpudoctor import torchenv
from gpudoctor.environment import collect_environment, merge_environment
from gpudoctor.probes.base import Finding, Status
from gpudoctor.reports.model import ProbeResult, Report
from gpudoctor.reports.redact import MASK, Redactor, redact, redact_report
from gpudoctor.reports.render import render_json, render_markdown, report_from_dict
from gpudoctor.torchenv import torch_environment

USER = "zoe-quixote"
HOST = "gpu-node-4711.lab.example.org"
SECRETS = {
    "HF_TOKEN": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    "AWS_ACCESS_KEY_ID": "AKIAZ7QWERTYUIOP4XYZ",
    "AWS_SECRET_ACCESS_KEY": "k9Xw2Lr8Tq/ZmB4vN7pYc1Hd6Fs3Ga0Je5UiOy+E",
    "GITHUB_TOKEN": "ghp_R4nd0mT0k3nV4lu3ThatIsL0ngEnough12",
    "DB_PASSWORD": "tr1cky",
    "XFORMERS_API_TOKEN": "plainvalue",
}
PIP_PASSWORD = "s3cr3t-Pa55"


@pytest.fixture()
def planted(monkeypatch, tmp_path):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIP_INDEX_URL", f"https://deploy-bot:{PIP_PASSWORD}@pypi.example.com/simple")
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("HOME", f"/home/{USER}")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/home/{USER}/cuda/lib64:/usr/local/cuda/lib64")
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(var, USER)
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    # Someone "helpfully" allow-lists secrets: the name and value layers must still catch them.
    monkeypatch.setattr(torchenv, "ENV_ALLOWLIST", torchenv.ENV_ALLOWLIST + ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "DB_PASSWORD"))


def _real_report() -> Report:
    torch = pytest.importorskip("torch")
    env = merge_environment(collect_environment(sys.executable), torch_environment(torch))
    result = ProbeResult(
        probe="cuda-runtime",
        title="CUDA runtime",
        status=Status.CRASHED,
        summary=f"worker died on {HOST.split('.')[0]}",
        device="cuda:0",
        details={"uuid": "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901", "key": [1, 8, 64], "bus": "00000000:65:00.0"},
        findings=[Finding("cuda-oom", "out of memory", (f"File \"/home/{USER}/proj/train.py\", line 3", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc"))],
        exit_code=-11,
        signal="SIGSEGV",
        stderr_tail=f"{USER}@{HOST}:~$ python train.py\nGPU 0: NVIDIA H100 (UUID: GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901)",
    )
    return Report(results=[result], environment=env, tool_version="0.1.0", redacted=False)


def test_planted_secrets_do_not_reach_the_json(planted):
    report = _real_report()
    raw = json.dumps(report.to_dict())
    # The collectors really picked the planted values up: otherwise this test proves nothing.
    assert SECRETS["HF_TOKEN"] in raw and PIP_PASSWORD in raw and f"/home/{USER}" in raw

    data = redact_report(report.to_dict())
    text = render_json(report_from_dict(data)) + json.dumps(data)
    for name, value in SECRETS.items():
        assert value not in text, name
    assert PIP_PASSWORD not in text and "deploy-bot" not in text
    assert USER not in text and "/home/" not in text
    assert HOST not in text and "gpu-node-4711" not in text
    assert "1b2c3d4e-5f60" not in text and "00000000:65:00.0" not in text
    assert "eyJhbGciOiJIUzI1NiJ9" not in text

    env_vars = data["environment"]["env_vars"]
    assert env_vars["HF_TOKEN"] == MASK and env_vars["DB_PASSWORD"] == MASK
    assert env_vars["XFORMERS_API_TOKEN"] == MASK  # allowed by prefix, masked by name
    assert "AWS_ACCESS_KEY_ID" not in env_vars  # not on the allow-list at all
    # What is useful survives: the index host, ordinary switches, the probe's "key" shape.
    assert env_vars["PIP_INDEX_URL"] == f"https://{MASK}@pypi.example.com/simple"
    assert env_vars["CUDA_LAUNCH_BLOCKING"] == "1"
    assert env_vars["LD_LIBRARY_PATH"] == "~/cuda/lib64:/usr/local/cuda/lib64"
    assert data["results"][0]["details"]["key"] == [1, 8, 64]
    assert "uuid" not in data["results"][0]["details"]
    assert data["results"][0]["findings"][0]["evidence"][0] == 'File "~/proj/train.py", line 3'
    assert data["redacted"] is True
    assert data["environment"]["torch"]["version"] == report.environment["torch"]["version"]


def test_markdown_of_a_redacted_report_is_clean(planted):
    text = render_markdown(redact(_real_report()), kb=lambda _id: None)
    for value in (*SECRETS.values(), PIP_PASSWORD, USER, HOST):
        assert value not in text
    assert "· redacted ·" in text


def test_redact_report_does_not_mutate_its_input():
    data = {"redacted": False, "environment": {"env_vars": {"HF_TOKEN": "hf_" + "a" * 30, "OTHER": "x"}}}
    before = json.dumps(data)
    out = redact_report(data, Redactor(home="/home/u1", user="u1", host="h"))
    assert json.dumps(data) == before
    assert out == {"redacted": True, "environment": {"env_vars": {}}}


R = Redactor(home="/home/alice", user="alice", host="gpu-box-17.corp.example.com")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("https://bob:s3cr3t@pypi.example.com/simple", f"https://{MASK}@pypi.example.com/simple"),
        ("git+https://oauth2:glpat-abcdefghij1234567890@gitlab.com/x.git", f"git+https://{MASK}@gitlab.com/x.git"),
        ("token hf_abcdefghijklmnopqrstuvwxyz12 end", f"token {MASK} end"),
        ("AKIAIOSFODNN7EXAMPLE", MASK),
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", MASK),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", MASK),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", MASK),
        ("sk-proj-abcdefghijklmnopqrstuvwxyz", MASK),
        ("Authorization: Bearer abc.def.ghijkl", f"Authorization: Bearer {MASK}"),
        ("mysql --password=hunter2 -u x", f"mysql --password={MASK} -u x"),
        ("api_key: 'abcd1234'", f"api_key: '{MASK}'"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", MASK),
        ("/home/bob/.venv/lib and /home/alice/x and /Users/carol/y", "~/.venv/lib and ~/x and ~/y"),
        ("C:\\Users\\dave\\envs\\torch", "~\\envs\\torch"),
        ("ran by alice on gpu-box-17", "ran by <user> on <host>"),
        ("GPU-12345678-1234-1234-1234-123456789abc at 00000000:65:00.0", "GPU-<uuid> at <pci-bus-id>"),
    ],
)
def test_value_patterns_redact(text, expected):
    assert R.text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "cf30153c4c131c8164ee7798e5022d810682e2cb",  # torch.version.git_version
        "query: shape=(1, 2, 8, 64) key: shape=(1, 2, 8, 64) value: shape=(1, 2, 8, 64)",
        "expected_tokens = int(N_t * N_h * N_w); max_tokens: 5",
        "/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcublasLt.so.12.4.5.8",
        "2.8.0+cu128 built 2026-05-01T10:20:30+00:00",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float",
    ],
)
def test_ordinary_text_survives(text):
    assert R.text(text) == text


def test_generic_user_names_are_not_replaced_everywhere():
    root = Redactor(home="/root", user="root", host="vm")
    assert root.text("chroot /root/.cache on vm") == "chroot ~/.cache on vm"


def test_secret_names_only_judged_when_shaped_like_variables():
    out = R.value({"details": {"key": "kept", "token_count": 3}, "env": {"MY_AUTH_HEADER": "x", "CUDA_HOME": "/usr/local/cuda"}})
    assert out == {"details": {"key": "kept", "token_count": 3}, "env": {"MY_AUTH_HEADER": MASK, "CUDA_HOME": "/usr/local/cuda"}}


def test_redact_returns_a_report():
    report = Report(results=[ProbeResult("matmul-sanity", "Matmul", Status.PASS, "ok on /home/alice", device="cpu")], redacted=False)
    out = redact(report)
    assert isinstance(out, Report) and out.redacted is True
    assert out.results[0].summary == "ok on ~" and out.results[0].status is Status.PASS
