"""Redaction recall, measured on the corpus tools/secret_corpus.py generates from documented token
formats in every syntax a secret is written in; the lookalikes beside it must come through; the
examples issue 32 found leaking must not reach a `gpudoctor run --bundle`; and which detector
runs first must never decide what is hidden.

The precision side (81,000 real paths and log lines that must come through unchanged) is
tests/test_redact.py's precision corpus."""
from __future__ import annotations

import binascii
import importlib.util
import json
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest

from gpudoctor.reports.redact import Redactor

from run_helpers import gpudoctor

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLOOR = 0.99  # recall in every syntax and every family


def _tool():
    spec = importlib.util.spec_from_file_location("secret_corpus", ROOT / "tools" / "secret_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


TOOL = _tool()
CASES = TOOL.cases()


@pytest.fixture(scope="module")
def measured():
    return TOOL.measure(CASES)


def test_the_corpus_covers_the_formats_and_syntaxes():
    families = {c.family for c in CASES}
    syntaxes = {c.syntax for c in CASES}
    assert len(families) >= 100 and len(syntaxes) >= 60 and len(CASES) >= 5000
    # The syntaxes issue 32 found leaking are all in it.
    assert {"go-var", "go-short", "make-conditional", "make-posix", "java-system-property", "java-properties-put",
            "php-concat", "xml-element", "xml-element-multiline", "terraform-aligned", "curl-u", "mysql-p",
            "suffixed-name", "short-env-then-bare", "short-environment", "block:raw"} <= syntaxes
    for family in ("gitlab-runner", "gitlab-deploy", "gitlab-ci-job", "huggingface-org", "perplexity", "aws-abia",
                   "aws-acca", "stripe-prod", "slack-workflow-webhook", "slack-trigger-webhook", "shopify-access",
                   "digitalocean-oauth", "vault-service", "grafana-cloud", "sentry-user", "sendgrid", "twilio-api-key",
                   "age", "jwt-base64", "pgp-private-key", "connection-string"):
        assert family in families, family


@pytest.mark.parametrize("axis", ["syntax", "family"])
def test_recall_in_every_syntax_and_family(measured, axis):
    misses, total, missed = measured
    low = {name: f"{total[a, name] - missed[a, name]}/{total[a, name]}" for a, name in total
           if a == axis and (total[a, name] - missed[a, name]) / total[a, name] < FLOOR}
    shown = "\n".join(f"  [{c.family} / {c.syntax}] {c.text[:120]!r}\n      -> {out[:120]!r}" for c, out in misses[:10])
    assert not low, f"recall under {FLOOR:.0%} by {axis}: {low}\n{shown}"


# Syntaxes measured once before the detectors were changed for them (tools/secret_corpus.py's
# HELD_OUT rounds; the before-figures are in docs/reports.md); what each round still misses, by design.
HELD_OUT_MISSES = {"1": set(), "2": set()}


@pytest.mark.parametrize("round_", sorted(HELD_OUT_MISSES))
def test_held_out_rounds_stay_redacted_after_their_fixes(round_):
    corpus = {"1": TOOL.held_out_cases, "2": TOOL.held_out_2_cases}[round_]()
    misses, total, missed = TOOL.measure(corpus)
    low = {name for a, name in total if a == "syntax" and (total[a, name] - missed[a, name]) / total[a, name] < FLOOR}
    shown = "\n".join(f"  [{c.family} / {c.syntax}] {c.text[:120]!r}\n      -> {out[:120]!r}" for c, out in misses[:10])
    assert low == HELD_OUT_MISSES[round_], shown
    if round_ == "2":  # a connection string's password with '/', '+' and '=' in four more syntaxes
        assert all(total["syntax", s] == 6 and not missed["syntax", s] for s in TOOL.URL_HELD_OUT_2)


def test_lookalikes_come_through_unchanged():
    changed = TOOL.lookalike_changes()
    assert not changed, "\n".join(f"[{kind}] {text!r} -> {got!r}" for kind, text, got in changed)


def test_the_corpus_is_the_same_in_every_process():
    digest = ("import hashlib, importlib.util, sys; spec = importlib.util.spec_from_file_location('c', 'tools/secret_corpus.py'); "
              "m = importlib.util.module_from_spec(spec); sys.modules['c'] = m; spec.loader.exec_module(m); "
              "print(hashlib.sha256(repr(m.cases()).encode()).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", digest], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(runs) == 1 and len(next(iter(runs)).strip()) == 64


def test_the_generated_checksums_are_the_formats_own():
    rng = TOOL._Random(5)
    token = TOOL.crc32_token(rng, "ghp_")
    body, check = token[4:34], token[34:]
    assert len(token) == 40 and check == TOOL.base62(binascii.crc32(body.encode()), 6)
    assert TOOL.bech32("a", b"") == "a12uel5l"  # BIP 173's test vector
    key = TOOL.bech32("age-secret-key-", bytes(32)).upper()
    assert key.startswith("AGE-SECRET-KEY-1") and len(key) == 74
    assert TOOL.pypi_macaroon(rng).startswith("pypi-AgEIcHlwaS5vcmc")


def test_the_gitleaks_gap_list_names_uncovered_prefixed_rules(tmp_path):
    toml = tmp_path / "gitleaks.toml"
    toml.write_text('[[rules]]\nid = "gh"\nregex = "ghp_[0-9a-zA-Z]{36}"\nkeywords = ["ghp_"]\n'
                    '[[rules]]\nid = "new-vendor"\nregex = "zzq_[a-z]{30}"\nkeywords = ["zzq_"]\n'
                    '[[rules]]\nid = "named"\nregex = "(?i)[\\\\w.-]{0,50}?(?:acme)"\nkeywords = ["acme"]\n')
    assert TOOL.gitleaks_gaps(str(toml)) == ["new-vendor: keywords ['zzq_']"]


# --- what issue 32 found leaking, through `gpudoctor run --bundle` -------------------------------------

ISSUE_LEAKS = {
    "current user's URL": ("postgresql://alice:Pw-4k9ZzQ2@db/x", "Pw-4k9ZzQ2"),
    "Go var": ('var hfToken string = "q8Rr2LmZx7Kp3Nw9Tt4Vb6"', "q8Rr2LmZx7Kp3Nw9Tt4Vb6"),
    "Go :=": ('apiToken := "M3kd9Pq2Lx8Rz4Wv7Nb1Yc"', "M3kd9Pq2Lx8Rz4Wv7Nb1Yc"),
    "make ?=": ("REGISTRY_PASSWORD ?= Zq7-wX3-pL9-mN2", "Zq7-wX3-pL9-mN2"),
    "make ::=": ("DEPLOY_TOKEN ::= Kt5Rw8Qz2Lm7Xp4Vn9Bc", "Kt5Rw8Qz2Lm7Xp4Vn9Bc"),
    "Java properties call": ('System.setProperty("DB_PASSWORD", "jp-8Hd3Kq9Xw")', "jp-8Hd3Kq9Xw"),
    "PHP .=": ('$apiKey .= "Wv4Nq8Zr2Lp6Xm9Tk3Bd";', "Wv4Nq8Zr2Lp6Xm9Tk3Bd"),
    "XML element": ("<password>xm1-Lq8Zp3Rw</password>", "xm1-Lq8Zp3Rw"),
    "terraform fmt": ('  admin_password           = "tf-9Kq2Lx7Zw4"', "tf-9Kq2Lx7Zw4"),
    "curl -u": ("curl -u deploy:cu-7Rq2Zx9Lw4 https://api.example.com", "cu-7Rq2Zx9Lw4"),
    "mysql -p": ("mysql -u root -pmy-3Kd8Qz5Wx app", "my-3Kd8Qz5Wx"),
    "suffixed name": ('api_token_123 = "Sf8Kq2Zx7Lw4Rp9Vn3Tb"', "Sf8Kq2Zx7Lw4Rp9Vn3Tb"),
    "PGP private key": ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGW2xKwBCADb3kq9Zr7Lx2Wp8Nv4Tq6Mf1Hs5Jd3Gc0Ye9Ua7Io2Pk4Rl\n"
                        "=Xy1Z\n-----END PGP PRIVATE KEY BLOCK-----", "lQOYBGW2xKwBCADb3kq9Zr7Lx2Wp8Nv4Tq6Mf1Hs5Jd3Gc0Ye9Ua7Io2Pk4Rl"),
    "GitLab runner token": ("registered with glrt-AbCdEfGhIjKlMnOpQrSt", "glrt-AbCdEfGhIjKlMnOpQrSt"),
    "Hugging Face organisation": ("api_org_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh", "api_org_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"),
    "Perplexity": ("pplx-" + "Ab1Cd2Ef3Gh4" * 4, "pplx-" + "Ab1Cd2Ef3Gh4" * 4),
    "AWS ABIA": ("ABIAZ7QWERTYUIOP4XYZ", "ABIAZ7QWERTYUIOP4XYZ"),
    "Stripe sk_prod_": ("sk_prod_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8", "sk_prod_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8"),
    "Slack workflow webhook": ("https://hooks.slack.com/workflows/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",
                               "F6Vm03reCkhPmwBtaqbN6OW9"),
    "Shopify": ("shpat_0123456789abcdef0123456789abcdef", "shpat_0123456789abcdef0123456789abcdef"),
    "Vault": ("hvs.CAESI" + "Ab1Cd2Ef3Gh4" * 8, "hvs.CAESI" + "Ab1Cd2Ef3Gh4" * 8),
    "age": ("AGE-SECRET-KEY-1" + "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" + "QPZRY9X8GF2TVDW0S3JN54KHCE6M",
            "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"),
    "base64 JWT": ("ZXlKaGJHY2lPaUpJVXpJMU5pSjkuZXlKemRXSWlPaUl4TWpNMElpd2libUZ0WlNJNklrcHZhRzRpZlEuc2ln",
                   "ZXlKaGJHY2lPaUpJVXpJMU5pSjkuZXlKemRXSWlPaUl4TWpNMElpd2libUZ0WlNJNklrcHZhRzRpZlEuc2ln"),
    "short password printed bare": ("DB_PASSWORD=hunter2\nretrying login with hunter2", "hunter2"),
}
ROOT_LEAK = ("mysql://root:Rt-8Kq2Zx7Lw@10.0.0.5:3306/app", "Rt-8Kq2Zx7Lw")


def _bundle(tmp_path: pathlib.Path, name: str, lines: list[str], env: dict) -> dict[str, str]:
    program = tmp_path / f"{name}.py"
    program.write_text("import sys\nfor line in %r:\n    print(line, flush=True)\nraise SystemExit(3)\n" % (lines,))
    bundle = tmp_path / name
    done = gpudoctor("run", "--bundle", str(bundle), "--no-scan", "--", sys.executable, str(program), env=env)
    assert done.returncode == 3, done.stderr.decode(errors="replace")
    files = {f: (bundle / f).read_text(encoding="utf-8") for f in os.listdir(bundle)}
    files["stderr"] = done.stderr.decode("utf-8", "replace")
    return files


def test_the_leaks_issue_32_found_stay_out_of_a_bundle(tmp_path):
    env = {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "DB_PASSWORD": "hunter2"}
    files = _bundle(tmp_path, "alice", [text for text, _ in ISSUE_LEAKS.values()], env)
    assert {"ticket.md", "run.json", "output.log"} <= set(files)
    leaks = [(name, f) for name, (_, secret) in ISSUE_LEAKS.items() for f, text in files.items() if secret in text]
    assert not leaks, leaks
    json.loads(files["run.json"])


def test_a_root_users_url_password_stays_out_of_a_bundle(tmp_path):
    env = {"HOME": "/root", "USER": "root", "LOGNAME": "root"}
    files = _bundle(tmp_path, "root", [ROOT_LEAK[0], "then /root/.cache/x was read"], env)
    for name, text in files.items():
        assert ROOT_LEAK[1] not in text, name
    assert "~/.cache/x" in files["output.log"]  # the home is still the home


# --- order never decides ----------------------------------------------------------------------------------


def test_which_detector_runs_first_does_not_change_the_result(monkeypatch):
    """The spans every detector proposes are resolved by rank and length, not by the order they
    arrive in: shuffling them leaves every text of the recall corpus (and the issue's examples)
    redacted the same way."""
    texts = [c.text for c in CASES[::7]] + [text for text, _ in ISSUE_LEAKS.values()] + [ROOT_LEAK[0]]
    make = lambda: Redactor(home="/home/alice", user="alice", host="gpu-box-17.corp.example.com", environ={})  # noqa: E731
    straight = [make().text(t) for t in texts]
    original = Redactor._find
    rng = random.Random(32)

    def shuffled(self, s, low, versions):
        spans = original(self, s, low, versions)
        rng.shuffle(spans)
        return spans

    monkeypatch.setattr(Redactor, "_find", shuffled)
    assert [make().text(t) for t in texts] == straight


def test_a_url_password_is_hidden_whoever_its_user_is():
    for user, home in (("alice", "/home/alice"), ("root", "/root"), ("deploy", "/home/deploy")):
        r = Redactor(home=home, user=user, host="h-1", environ={})
        for url_user in ("alice", "root", "deploy", "", "bob"):
            out = r.text(f"DATABASE_URL=postgresql://{url_user}:S3cr3t-pw-1@db.internal:5432/app")
            assert "S3cr3t-pw-1" not in out, (user, url_user, out)
            assert re.search(r"postgresql://<secret-\d+>@db\.internal:5432/app", out), out


def test_a_secret_named_once_is_hidden_everywhere_in_the_text_and_the_report():
    r = Redactor(home="/home/alice", user="alice", host="h-1", environ={})
    assert r.text("login: tr1cky failed\nDB_PASSWORD=tr1cky") == "login: <secret-1> failed\nDB_PASSWORD=<secret-1>"
    data = {"log": "psql: password s3cr3t! rejected", "env": {"DB_PASSWORD": "s3cr3t!"}}
    assert Redactor(home="/home/alice", user="alice", host="h-1", environ={}).report(data) == \
        {"log": "psql: password <secret-1> rejected", "env": {"DB_PASSWORD": "<secret-1>"}}
    # A short value hunted is a whole word, and never an ordinary one.
    r = Redactor(home="/h", user="u1", host="h-1", environ={"DB_PASSWORD": "pa55"})
    assert r.text("pa55 pa555 xpa55 pa55.") == "<secret-1> pa555 xpa55 <secret-1>."
    r = Redactor(home="/h", user="u1", host="h-1", environ={"DB_PASSWORD": "test"})
    assert r.text("pytest test") == "pytest test"


def test_pgp_and_pem_blocks_in_a_stream():
    r = Redactor(home="/home/alice", user="alice", host="h-1", environ={})
    lines = ["start\n", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n", "Comment: bot\n", "\n",
             "lQOYBGW2xKwBCADb3kq9Zr7Lx2Wp8Nv4Tq6Mf1Hs5Jd3Gc0Ye9Ua7Io2Pk4Rl\n", "=Xy1Z\n",
             "-----END PGP PRIVATE KEY BLOCK-----\n", "end\n"]
    stream = r.stream()
    out = "".join(stream.feed(line) for line in lines) + stream.flush()
    assert out == "start\n<private-key-1>\nend\n"
    # A line of the key shown alone later is the same key.
    assert r.text("lQOYBGW2xKwBCADb3kq9Zr7Lx2Wp8Nv4Tq6Mf1Hs5Jd3Gc0Ye9Ua7Io2Pk4Rl") == "<private-key-1>"


def test_recall_counts_are_reported_by_the_tool(capsys):
    assert TOOL.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recall: ") and "| syntax | redacted | recall |" in out and "lookalikes changed: 0" in out


def test_placeholders_are_numbered_in_reading_order():
    r = Redactor(home="/home/alice", user="alice", host="h-1", environ={})
    out = r.text("--token ghp_" + "a1B2" * 9 + " then https://bob:pw-1234567@db-1.internal/ then sk_live_" + "Zz9" * 8)
    assert out == "--token <secret-1> then https://<secret-2>@<host-1>/ then <secret-3>"
