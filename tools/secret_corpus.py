"""Generate the redaction recall corpus and measure gpudoctor's redaction on it.

    python tools/secret_corpus.py                 # recall by syntax and by family, precision
    python tools/secret_corpus.py --misses        # every case whose secret survived
    python tools/secret_corpus.py --json          # the figures as JSON
    python tools/secret_corpus.py --gitleaks PATH/config/gitleaks.toml   # what the table lacks
    python tools/secret_corpus.py --held-out      # syntaxes written after the detectors, unfitted
    python tools/secret_corpus.py --held-out 2    # round 2 of them (see HELD_OUT_2)

The corpus is made, not collected: every secret is drawn from its documented format (prefix,
length, alphabet, and the checksum where the format has one: GitHub's and npm's CRC32 in base62,
age's bech32, a PyPI macaroon's binary framing, a JWT's HMAC) with a seeded `random.Random`, and
written into every syntax a program, a config file or a log puts a secret in (JSON, YAML, TOML,
.env, shell, INI, Java properties, Go, Java, Kotlin, PHP, XML, Terraform, make, logstash, CLI
flags, URLs, log lines, curl, mysql). So the same corpus comes out on every machine, and no
real credential is in it. `cases()` returns `Case`s; a case is redacted when none of its
`secrets` survives in the redacted text, not even a 12-character piece of one.

Where the formats come from. The token table below (`FAMILIES`) states facts: the prefix, the
length and alphabet of the random part, and a checksum. Most are the vendors' own documentation
(GitHub's "Behind GitHub's new authentication token formats", GitLab's "Token prefixes", Slack's
"Token types", Hugging Face's "User access tokens", AWS's "IAM identifiers", HashiCorp Vault's
"Tokens", age's specification, RFC 7519 for JWTs); where a vendor does not publish its format,
the facts are those of gitleaks's rule set (github.com/gitleaks/gitleaks, MIT licence,
cmd/generate/config/rules/*.go at commit b58d3f1, July 2026), named per family in `source`.
Nothing of gitleaks's files is copied: the generators and the syntax templates are this file's.

Kept current: `--gitleaks PATH` reads a gitleaks checkout's config/gitleaks.toml and lists its
rules whose literal prefix no family here covers; a new token format gets a family here (and a
form in gpudoctor.reports.redact_forms), and the corpus, the test (tests/test_redact_recall.py)
and the figures in docs/reports.md follow from it.

`LOOKALIKES` is the other side: text that looks like a secret or an identity to a careless rule
(the kinds of false positive scanners document: a URL scheme read as a host, an image digest and
a yarn spec read as `user@host`, JavaScript's `new` read as a value, a Maven coordinate read as a
token), all written here; redaction must leave every one unchanged.

Run it against another checkout's code with PYTHONPATH, or with that checkout's interpreter.

It stays above 800 lines because most of it is data: the token families and the syntax templates
(`FAMILIES` to `URL_FORMS`, about 330 lines) are one table each, read together with the
generators they name; the code around them is under 500 lines.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import collections
import dataclasses
import hashlib
import hmac
import json
import random
import re
import string
import sys
from typing import Callable, Iterable

ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
WORD = ALNUM + "_"
WORD_DASH = ALNUM + "_-"
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
# What a person types as a password: letters, digits and the punctuation that needs no quoting in
# a .env file, a YAML scalar or a shell word inside quotes.
PASSWORD = ALNUM + "!#%+-.@^_~*="
URL_PASSWORD = ALNUM + "-._~!*"  # unreserved in a URL's userinfo: no percent-encoding needed
SEED = 20260801
WINDOW = 12  # a surviving piece of a secret this long is a leak


class _Random(random.Random):
    def word(self, alphabet: str, n: int) -> str:
        return "".join(self.choice(alphabet) for _ in range(n))

    def mixed(self, alphabet: str, n: int) -> str:
        """A random word that has upper case, lower case and a digit where the alphabet has them
        (a real token's 36 characters nearly always do)."""
        while True:
            w = self.word(alphabet, n)
            if n < 8 or ((any(c.isupper() for c in w) or not any(c.isupper() for c in alphabet))
                         and (any(c.islower() for c in w) or not any(c.islower() for c in alphabet))
                         and (any(c.isdigit() for c in w) or not any(c.isdigit() for c in alphabet))):
                return w


# --- checksummed formats ------------------------------------------------------------------------------


def base62(n: int, width: int) -> str:
    digits = string.digits + string.ascii_uppercase + string.ascii_lowercase
    out = ""
    while n:
        n, r = divmod(n, 62)
        out = digits[r] + out
    return out.rjust(width, "0")


def crc32_token(rng: _Random, prefix: str, body: int = 30) -> str:
    """GitHub's (and npm's) format: a prefix, 30 random base62 characters, and the CRC32 of those
    30 in base62, 6 characters, zero-padded."""
    random_part = rng.mixed(ALNUM, body)
    return prefix + random_part + base62(binascii.crc32(random_part.encode()), 6)


def bech32(hrp: str, data: bytes) -> str:
    """BIP 173 bech32 (age's secret keys are `AGE-SECRET-KEY-1` + bech32 of 32 bytes, upper case)."""
    def polymod(values: list[int]) -> int:
        gen = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
        chk = 1
        for v in values:
            top = chk >> 25
            chk = (chk & 0x1FFFFFF) << 5 ^ v
            for i in range(5):
                chk ^= gen[i] if (top >> i) & 1 else 0
        return chk

    acc, bits, five = 0, 0, []
    for byte in data:
        acc = (acc << 8) | byte
        bits += 8
        while bits >= 5:
            bits -= 5
            five.append((acc >> bits) & 31)
    if bits:
        five.append((acc << (5 - bits)) & 31)
    expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    mod = polymod(expanded + five + [0] * 6) ^ 1
    checksum = [(mod >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(BECH32[d] for d in five + checksum)


def pypi_macaroon(rng: _Random) -> str:
    """A PyPI API token: `pypi-` + the URL-safe base64 of a version-2 binary macaroon whose
    location is pypi.org (so every token starts `pypi-AgEIcHlwaS5vcmc`), with an identifier, a
    caveat and a 32-byte signature."""
    def field(kind: int, value: bytes) -> bytes:
        return bytes([kind, len(value)]) + value

    identifier = rng.word(HEX, 32).encode()
    caveat = json.dumps({"version": 1, "permissions": {"projects": [rng.word(string.ascii_lowercase, 8)]}}).encode()
    signature = bytes(rng.getrandbits(8) for _ in range(32))
    raw = (b"\x02" + field(1, b"pypi.org") + field(2, identifier) + b"\x00"
           + field(2, caveat) + b"\x00\x00" + field(6, signature))
    return "pypi-" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt(rng: _Random) -> str:
    """An HS256 JSON Web Token (RFC 7519): header.payload.HMAC, each base64url without padding."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64url(json.dumps({"sub": rng.word(HEX, 12), "iat": rng.randint(1_600_000_000, 1_800_000_000),
                                  "scope": rng.choice(["read", "write", "admin"])}).encode())
    sig = _b64url(hmac.new(rng.word(ALNUM, 32).encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest())
    return f"{header}.{payload}.{sig}"


def sentry_org_token(rng: _Random) -> str:
    """`sntrys_` + base64 of the token's JSON claims (iat, url, region_url, org) + `_` + 43."""
    claims = {"iat": round(rng.uniform(1.7e9, 1.8e9), 3), "url": "https://sentry.io",
              "region_url": "https://us.sentry.io", "org": rng.word(string.ascii_lowercase, 8)}
    encoded = base64.b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode()
    return f"sntrys_{encoded}_{rng.word(ALNUM + '+/', 43)}"


def grafana_cloud(rng: _Random) -> str:
    claims = {"o": str(rng.randint(100000, 999999)), "n": f"stack-{rng.randint(1000, 9999)}-write",
              "k": rng.word(ALNUM, 24), "m": {"r": "us"}}
    return "glc_" + base64.b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode()


def openai_key(rng: _Random, kind: str) -> str:
    if kind == "legacy":
        return "sk-" + rng.mixed(ALNUM, 20) + "T3BlbkFJ" + rng.mixed(ALNUM, 20)
    return f"sk-{kind}-" + rng.mixed(WORD_DASH, 74) + "T3BlbkFJ" + rng.mixed(WORD_DASH, 74)


def slack_token(rng: _Random, kind: str) -> str:
    def digits(a: int, b: int) -> str:
        return str(rng.randint(10 ** (a - 1), 10 ** b - 1))

    if kind == "xoxb":
        return f"xoxb-{digits(10, 13)}-{digits(10, 13)}-{rng.mixed(ALNUM, 24)}"
    if kind == "xoxp":
        return f"xoxp-{digits(10, 13)}-{digits(10, 13)}-{digits(10, 13)}-{rng.word(HEX, 32)}"
    if kind == "xapp":
        return f"xapp-1-A{rng.word(UPPER_ALNUM, 10)}-{digits(13, 13)}-{rng.word(HEX, 64)}"
    if kind == "xoxe":
        return f"xoxe-1-{rng.mixed(ALNUM, 146)}"
    return f"xoxe.xoxp-1-{rng.mixed(ALNUM, 163)}"


def slack_webhook(rng: _Random, kind: str) -> str:
    team = "T" + rng.word(UPPER_ALNUM, rng.randint(8, 10))
    if kind == "services":
        return f"https://hooks.slack.com/services/{team}/B{rng.word(UPPER_ALNUM, 10)}/{rng.mixed(ALNUM, 24)}"
    if kind == "workflows":
        return (f"https://hooks.slack.com/workflows/{team}/A{rng.word(UPPER_ALNUM, 10)}/"
                f"{rng.randint(10 ** 17, 10 ** 18 - 1)}/{rng.mixed(ALNUM, 24)}")
    return f"https://hooks.slack.com/triggers/{team}/{rng.randint(10 ** 12, 10 ** 13 - 1)}/{rng.word(HEX, 32)}"


def pem_key(rng: _Random, kind: str) -> str:
    """A private key block: its armour and 64-column base64 lines (random bytes, not a key)."""
    body = base64.b64encode(bytes(rng.getrandbits(8) for _ in range(rng.randint(180, 420)))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    label = {"rsa": "RSA PRIVATE KEY", "ec": "EC PRIVATE KEY", "pkcs8": "PRIVATE KEY",
             "openssh": "OPENSSH PRIVATE KEY", "encrypted": "ENCRYPTED PRIVATE KEY", "dsa": "DSA PRIVATE KEY"}[kind]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


def pgp_key(rng: _Random) -> str:
    """An ASCII-armoured OpenPGP private key block (RFC 4880): armour headers, a blank line,
    base64 lines, the `=` CRC24 line."""
    body = base64.b64encode(bytes(rng.getrandbits(8) for _ in range(rng.randint(300, 600)))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    crc = base64.b64encode(rng.getrandbits(24).to_bytes(3, "big")).decode()
    return ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: exported for the build bot\n\n" + "\n".join(lines)
            + f"\n={crc}\n-----END PGP PRIVATE KEY BLOCK-----")


def aws_secret(rng: _Random) -> str:
    return rng.mixed(B64, 40)


# --- the families ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Family:
    """One secret format. `make(rng)` draws a value; `name` is the stem of a variable that holds
    it (`github` -> github_token, githubToken, GITHUB_TOKEN); `kind` is what it is: a "token"
    (formatted: found by its form, so every syntax applies, bare ones included), a "password" or
    a "key" (formless: found by its name only), or a family with its own syntaxes ("url", "curl",
    "mysql", "block", "short")."""

    name: str
    make: Callable[[_Random], str]
    stem: str
    kind: str = "token"
    source: str = ""
    word: str = "token"  # the secret word of the variable name: token, key, secret, password
    secret: Callable[[str], str] = lambda value: value  # the part of a value that must not survive


def _webhook_path(url: str) -> str:
    """What is secret in a webhook URL: its path after the kind (the service's host is public)."""
    return url.split("/", 4)[4]


def _fixed(prefix: str, alphabet: str, n: int) -> Callable[[_Random], str]:
    return lambda rng: prefix + rng.mixed(alphabet, n)


def _parts(*parts: str | tuple[str, int]) -> Callable[[_Random], str]:
    """Literal strings and (alphabet, length) random pieces, in order."""
    def make(rng: _Random) -> str:
        return "".join(p if isinstance(p, str) else rng.mixed(p[0], p[1]) for p in parts)

    return make


GH = "GitHub, 'Behind GitHub's new authentication token formats' (2021): prefix, 30 base62, CRC32 in 6 base62"
GL = "GitLab docs, 'Token prefixes'; lengths from gitleaks rules/gitlab.go"
GLK = "gitleaks rules/{}.go"

FAMILIES: tuple[Family, ...] = (
    Family("github-pat", lambda r: crc32_token(r, "ghp_"), "github", source=GH),
    Family("github-oauth", lambda r: crc32_token(r, "gho_"), "github", source=GH),
    Family("github-user-to-server", lambda r: crc32_token(r, "ghu_"), "github", source=GH),
    Family("github-server-to-server", lambda r: crc32_token(r, "ghs_"), "github", source=GH),
    Family("github-refresh", lambda r: crc32_token(r, "ghr_"), "github", source=GH),
    Family("github-fine-grained", _parts("github_pat_", (ALNUM, 22), "_", (ALNUM, 59)), "github",
           source="GitHub docs, fine-grained personal access tokens: github_pat_ 22 _ 59"),
    Family("gitlab-pat", _fixed("glpat-", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-pat-routable", _parts("glpat-", (WORD_DASH, 27), ".", (LOWER_ALNUM, 2), (LOWER_ALNUM, 7)),
           "gitlab", source=GL),
    Family("gitlab-runner", _fixed("glrt-", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-runner-routable", _parts("glrt-t1_", (WORD_DASH, 27), ".", (LOWER_ALNUM, 9)), "gitlab", source=GL),
    Family("gitlab-runner-registration", _fixed("GR1348941", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-deploy", _fixed("gldt-", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-ci-job", _parts("glcbt-", (ALNUM, 5), "_", (WORD_DASH, 20)), "gitlab", source=GL),
    Family("gitlab-trigger", _fixed("glptt-", HEX, 40), "gitlab", source=GL),
    Family("gitlab-feed", _fixed("glft-", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-incoming-mail", _fixed("glimt-", WORD_DASH, 25), "gitlab", source=GL),
    Family("gitlab-agent", _fixed("glagent-", WORD_DASH, 50), "gitlab", source=GL),
    Family("gitlab-oauth-secret", _fixed("gloas-", WORD_DASH, 64), "gitlab", source=GL),
    Family("gitlab-scim", _fixed("glsoat-", WORD_DASH, 20), "gitlab", source=GL),
    Family("gitlab-feature-flags", _fixed("glffct-", WORD_DASH, 20), "gitlab", source=GL),
    Family("huggingface", _fixed("hf_", string.ascii_letters, 34), "hf",
           source="Hugging Face docs, 'User access tokens': hf_ + 34 letters"),
    Family("huggingface-org", _fixed("api_org_", string.ascii_letters, 34), "huggingface", source=GLK.format("huggingface")),
    Family("perplexity", _fixed("pplx-", ALNUM, 48), "perplexity", source=GLK.format("perplexity")),
    Family("openai-project", lambda r: openai_key(r, "proj"), "openai", word="key", source=GLK.format("openai")),
    Family("openai-service-account", lambda r: openai_key(r, "svcacct"), "openai", word="key", source=GLK.format("openai")),
    Family("openai-admin", lambda r: openai_key(r, "admin"), "openai", word="key", source=GLK.format("openai")),
    Family("openai-legacy", lambda r: openai_key(r, "legacy"), "openai", word="key", source=GLK.format("openai")),
    Family("anthropic", _parts("sk-ant-api03-", (WORD_DASH, 93), "AA"), "anthropic", word="key", source=GLK.format("anthropic")),
    Family("anthropic-admin", _parts("sk-ant-admin01-", (WORD_DASH, 93), "AA"), "anthropic", word="key",
           source=GLK.format("anthropic")),
    Family("stripe-live", _fixed("sk_live_", ALNUM, 99), "stripe", word="key", source=GLK.format("stripe")),
    Family("stripe-test", _fixed("sk_test_", ALNUM, 24), "stripe", word="key", source=GLK.format("stripe")),
    Family("stripe-prod", _fixed("sk_prod_", ALNUM, 32), "stripe", word="key", source=GLK.format("stripe")),
    Family("stripe-restricted", _fixed("rk_live_", ALNUM, 24), "stripe", word="key", source=GLK.format("stripe")),
    Family("slack-bot", lambda r: slack_token(r, "xoxb"), "slack", source="Slack docs, 'Token types'"),
    Family("slack-user", lambda r: slack_token(r, "xoxp"), "slack", source="Slack docs, 'Token types'"),
    Family("slack-app", lambda r: slack_token(r, "xapp"), "slack", source="Slack docs, 'Token types'"),
    Family("slack-config-refresh", lambda r: slack_token(r, "xoxe"), "slack", source="Slack docs, 'Configuration tokens'"),
    Family("slack-config-access", lambda r: slack_token(r, "xoxe.xoxp"), "slack", source="Slack docs, 'Configuration tokens'"),
    Family("slack-webhook", lambda r: slack_webhook(r, "services"), "slack_webhook", word="url",
           source="Slack docs, 'Sending messages using incoming webhooks'", secret=_webhook_path),
    Family("slack-workflow-webhook", lambda r: slack_webhook(r, "workflows"), "slack_webhook", word="url",
           source=GLK.format("slack"), secret=_webhook_path),
    Family("slack-trigger-webhook", lambda r: slack_webhook(r, "triggers"), "slack_webhook", word="url",
           source=GLK.format("slack"), secret=_webhook_path),
    Family("aws-access-key-id", _fixed("AKIA", string.ascii_uppercase + "234567", 16), "aws_access",
           word="key", source="AWS IAM docs, 'Unique identifiers': AKIA + 16 base32"),
    Family("aws-temporary-key-id", _fixed("ASIA", string.ascii_uppercase + "234567", 16), "aws_access", word="key",
           source="AWS IAM docs, 'Unique identifiers'"),
    Family("aws-abia", _fixed("ABIA", string.ascii_uppercase + "234567", 16), "aws_access", word="key", source=GLK.format("aws")),
    Family("aws-acca", _fixed("ACCA", string.ascii_uppercase + "234567", 16), "aws_access", word="key", source=GLK.format("aws")),
    Family("aws-bedrock", _fixed("ABSK", B64, 132), "bedrock", word="key", source=GLK.format("aws")),
    Family("google-api-key", _fixed("AIza", WORD_DASH, 35), "google", word="key", source="Google Cloud docs, API keys"),
    Family("npm", lambda r: crc32_token(r, "npm_"), "npm", source=GLK.format("npm") + "; checksum as GitHub's"),
    Family("pypi", pypi_macaroon, "pypi", source="PyPI docs, API tokens (macaroons); warehouse's macaroon framing"),
    Family("shopify-access", _fixed("shpat_", "0123456789abcdef", 32), "shopify", source=GLK.format("shopify")),
    Family("shopify-custom-app", _fixed("shpca_", HEX, 32), "shopify", source=GLK.format("shopify")),
    Family("shopify-private-app", _fixed("shppa_", HEX, 32), "shopify", source=GLK.format("shopify")),
    Family("shopify-shared-secret", _fixed("shpss_", HEX, 32), "shopify", word="secret", source=GLK.format("shopify")),
    Family("digitalocean-pat", _fixed("dop_v1_", HEX, 64), "digitalocean", source=GLK.format("digitalocean")),
    Family("digitalocean-oauth", _fixed("doo_v1_", HEX, 64), "digitalocean", source=GLK.format("digitalocean")),
    Family("digitalocean-refresh", _fixed("dor_v1_", HEX, 64), "digitalocean", source=GLK.format("digitalocean")),
    Family("vault-service", _parts("hvs.CAESI", (WORD_DASH, 86)), "vault",
           source="HashiCorp Vault docs, 'Tokens' (hvs. service, hvb. batch)"),
    Family("vault-batch", _parts("hvb.AAAAAQ", (WORD_DASH, 140)), "vault", source="HashiCorp Vault docs, 'Tokens'"),
    Family("grafana-cloud", grafana_cloud, "grafana", source=GLK.format("grafana")),
    Family("grafana-service-account", _parts("glsa_", (ALNUM, 32), "_", (HEX, 8)), "grafana", source=GLK.format("grafana")),
    Family("grafana-api-key", _fixed("eyJrIjoi", ALNUM, 72), "grafana", word="key", source=GLK.format("grafana")),
    Family("sentry-org", sentry_org_token, "sentry", source="Sentry RFC 0091 (org auth tokens)"),
    Family("sentry-user", _fixed("sntryu_", HEX, 64), "sentry", source=GLK.format("sentry")),
    Family("sendgrid", _parts("SG.", (WORD_DASH, 22), ".", (WORD_DASH, 43)), "sendgrid", word="key", source=GLK.format("sendgrid")),
    Family("twilio-api-key", _fixed("SK", HEX, 32), "twilio", word="key", source=GLK.format("twilio")),
    Family("twilio-account-sid", _fixed("AC", HEX, 32), "twilio_account", word="sid",
           source="Twilio docs, account SID: AC + 32 hex"),
    Family("age", lambda r: bech32("age-secret-key-", bytes(r.getrandbits(8) for _ in range(32))).upper(), "age",
           word="key", source="age specification (C2SP), X25519 identities"),
    Family("telegram-bot", lambda r: f"{r.randint(10 ** 8, 10 ** 10 - 1)}:AA{r.mixed(WORD_DASH, 33)}", "telegram",
           source="Telegram Bot API docs"),
    Family("databricks", _fixed("dapi", HEX, 32), "databricks", source=GLK.format("databricks")),
    Family("doppler", _fixed("dp.pt.", ALNUM, 43), "doppler", source=GLK.format("doppler")),
    Family("linear", _fixed("lin_api_", ALNUM, 40), "linear", word="key", source=GLK.format("linear")),
    Family("postman", _parts("PMAK-", (HEX, 24), "-", (HEX, 34)), "postman", word="key", source=GLK.format("postman")),
    Family("pulumi", _fixed("pul-", HEX, 40), "pulumi", source=GLK.format("pulumi")),
    Family("prefect", _fixed("pnu_", ALNUM, 36), "prefect", word="key", source=GLK.format("prefect")),
    Family("rubygems", _fixed("rubygems_", HEX, 48), "rubygems", word="key", source=GLK.format("rubygems")),
    Family("planetscale", _fixed("pscale_tkn_", WORD_DASH, 43), "planetscale", source=GLK.format("planetscale")),
    Family("planetscale-password", _fixed("pscale_pw_", WORD_DASH, 43), "planetscale", word="password",
           source=GLK.format("planetscale")),
    Family("dynatrace", _parts("dt0c01.", (UPPER_ALNUM, 24), ".", (UPPER_ALNUM, 64)), "dynatrace", source=GLK.format("dynatrace")),
    Family("easypost", _fixed("EZAK", ALNUM, 54), "easypost", word="key", source=GLK.format("easypost")),
    Family("flyio", _fixed("fo1_", WORD_DASH, 43), "fly", source=GLK.format("flyio")),
    Family("heroku-v2", _fixed("HRKU-AA", WORD_DASH, 58), "heroku", word="key", source=GLK.format("heroku")),
    Family("notion", _parts("ntn_", ("0123456789", 11), (ALNUM, 35)), "notion", source=GLK.format("notion")),
    Family("readme", _fixed("rdme_", LOWER_ALNUM, 70), "readme", word="key", source=GLK.format("readme")),
    Family("scalingo", _fixed("tk-us-", WORD_DASH, 48), "scalingo", source=GLK.format("scalingo")),
    Family("sendinblue", _parts("xkeysib-", (HEX, 64), "-", (ALNUM, 16)), "brevo", word="key", source=GLK.format("sendinblue")),
    Family("shippo", _fixed("shippo_live_", HEX, 40), "shippo", source=GLK.format("shippo")),
    Family("square", _fixed("EAAA", WORD_DASH, 60), "square", source=GLK.format("square")),
    Family("artifactory", _fixed("AKCp", ALNUM, 69), "artifactory", word="key", source=GLK.format("artifactory")),
    Family("atlassian", _fixed("ATATT3", WORD_DASH, 186), "atlassian", source=GLK.format("atlassian")),
    Family("clojars", _fixed("CLOJARS_", LOWER_ALNUM, 60), "clojars", source=GLK.format("clojars")),
    Family("openshift", _fixed("sha256~", WORD_DASH, 43), "openshift", source=GLK.format("openshift")),
    Family("infracost", _fixed("ico-", ALNUM, 32), "infracost", source=GLK.format("infracost")),
    Family("frameio", _fixed("fio-u-", WORD_DASH, 64), "frameio", source=GLK.format("frameio")),
    Family("duffel", _fixed("duffel_test_", WORD_DASH, 43), "duffel", source=GLK.format("duffel")),
    Family("flutterwave", _parts("FLWSECK_TEST-", (HEX, 32), "-X"), "flutterwave", word="key", source=GLK.format("flutterwave")),
    Family("adobe", _fixed("p8e-", ALNUM, 32), "adobe", word="secret", source=GLK.format("adobe")),
    Family("alibaba", _fixed("LTAI", ALNUM, 20), "alibaba", word="key", source=GLK.format("alibaba")),
    Family("sourcegraph", _fixed("sgp_", HEX, 40), "sourcegraph", source=GLK.format("sourcegraph")),
    Family("onepassword-service", _fixed("ops_eyJ", B64, 260), "op_service_account", source=GLK.format("1password")),
    Family("jwt", jwt, "auth", source="RFC 7519"),
    Family("jwt-base64", lambda r: base64.b64encode(jwt(r).encode()).decode(), "auth",
           source="RFC 7519, base64-encoded (gitleaks rules/jwt.go)"),
    Family("aws-secret-access-key", aws_secret, "aws_secret_access", kind="key", word="key",
           source="AWS IAM docs: 40 characters of base64"),
    Family("password", lambda r: r.mixed(PASSWORD, r.randint(12, 20)), "db", kind="password", word="password"),
    Family("api-key", lambda r: r.mixed(ALNUM, 32), "service_api", kind="key", word="key"),
    Family("client-secret", lambda r: r.mixed(WORD_DASH, 40), "oauth_client", kind="key", word="secret"),
    Family("connection-string", lambda r: r.mixed(URL_PASSWORD, r.randint(12, 20)), "db", kind="url"),
    Family("curl-user", lambda r: r.mixed(PASSWORD.replace("=", ""), r.randint(12, 18)), "curl", kind="curl"),
    Family("mysql-password", lambda r: r.mixed(ALNUM + "!#%+-.@^_~", r.randint(10, 16)), "mysql", kind="mysql"),
    Family("private-key", lambda r: pem_key(r, r.choice(["rsa", "ec", "pkcs8", "openssh", "encrypted", "dsa"])),
           "private", kind="block", word="key", source="RFC 7468 (PEM), OpenSSH PROTOCOL.key"),
    Family("pgp-private-key", pgp_key, "pgp", kind="block", word="key", source="RFC 4880, ASCII armour"),
    Family("short-password", lambda r: r.choice(["hunter2", "tr1cky", "s3cr3t!", "pa55wd", "Zx9!q", "qwe123"]),
           "db", kind="short", word="password"),
)


# --- syntaxes -----------------------------------------------------------------------------------------


def _names(stem: str, word: str) -> dict[str, str]:
    snake = f"{stem}_{word}"
    parts = snake.split("_")
    camel = parts[0] + "".join(p.title() for p in parts[1:])
    return {"snake": snake, "camel": camel, "Camel": camel[0].upper() + camel[1:], "UPPER": snake.upper(),
            "kebab": snake.replace("_", "-"), "dotted": snake.replace("_", ".")}


# Syntaxes in which a secret sits under a name. {snake} {camel} {Camel} {UPPER} {kebab} {dotted}
# are the variable's name, {s} the secret.
NAMED: dict[str, str] = {
    "json": '{{"{snake}": "{s}", "retries": 3}}',
    "json-escaped-newline": '{{"config.ini": "{UPPER}={s}\\nBACKUP_ENABLED=true"}}',
    "yaml": "{snake}: {s}",
    "yaml-quoted": "  {snake}: \"{s}\"",
    "yaml-single-quoted": "{snake}: '{s}'",
    "toml": '{snake} = "{s}"',
    "ini": "{camel}={s}",
    "dotenv": "{UPPER}={s}",
    "shell-export": 'export {UPPER}="{s}"',
    "docker-env": "docker run --gpus all -e {UPPER}={s} -e NCCL_DEBUG=INFO trainer:latest",
    "python": "{snake} = '{s}'",
    "python-dict": "{{'{UPPER}': '{s}', 'WANDB_MODE': 'online'}}",
    "python-kwarg": 'client = Client(base_url=url, {snake}="{s}")',
    "go-var": 'var {camel} string = "{s}"',
    "go-short": '{camel} := "{s}"',
    "go-backticks": "{camel} := `{s}`",
    "java": 'private static final String {camel} = "{s}";',
    "csharp": 'string {camel} = "{s}";',
    "kotlin": 'val {camel}: String = "{s}"',
    "java-system-property": 'System.setProperty("{UPPER}", "{s}");',
    "java-properties-put": 'props.put("{dotted}", "{s}");',
    "java-properties-file": "{dotted}={s}",
    "php": '${camel} = \'{s}\';',
    "php-concat": '${camel} .= "{s}";',
    "xml-element": "<{camel}>{s}</{camel}>",
    "xml-element-multiline": "<{camel}>\n    {s}\n</{camel}>",
    "xml-attribute": '<add key="{Camel}" value="{s}" />',
    "terraform-aligned": '  region              = "us-east-1"\n  {snake}        = "{s}"',
    "logstash": '  "{camel}" => "{s}"',
    "make-recursive": "{UPPER} = {s}",
    "make-simple": "{UPPER} := {s}",
    "make-posix": "{UPPER} ::= {s}",
    "make-immediate": "{UPPER} :::= {s}",
    "make-conditional": "{UPPER} ?= {s}",
    "make-append": "{UPPER} += {s}",
    "k8s-env": "        - name: {UPPER}\n          value: \"{s}\"",
    "cli-flag": "python train.py --{kebab} {s} --epochs 3",
    "cli-flag-equals": "python train.py --{kebab}={s} --epochs 3",
    "suffixed-name": '{snake}_123 = "{s}"',
    "suffixed-env": "{UPPER}_PROD={s}",
    "url-query": "GET https://api.example.com/v1/items?{snake}={s}&page=2 HTTP/1.1",
    "log-line-named": "2026-03-14 09:26:53,123 WARNING auth: retrying with {snake}={s} (attempt 2)",
}
# Syntaxes that carry a secret without a name: only its form can find it.
BARE: dict[str, str] = {
    "bare-log-line": "2026-03-14T09:26:53Z INFO uploader: pushing with {s} to the registry",
    "prose": "I pasted {s} into the notebook by mistake, sorry",
    "traceback-repr": "ValueError: invalid credential '{s}'",
    "json-array": '["{s}"]',
    "code-call": 'client = Client("{s}")',
    "url-userinfo": "git clone https://x-access-token:{s}@github.com/acme/trainer.git",
    "http-header": "curl -sS -H 'X-Upstream: {s}' https://example.com/api",
}
# Written after redaction was changed to reach the syntaxes above, and measured once as they were:
# a check on syntaxes nobody fitted the detectors to (`--held-out`). Its misses are listed in
# docs/reports.md; a syntax fixed later moves up to NAMED, and a new held-out set is written.
HELD_OUT: dict[str, str] = {
    "ruby-attr": 'config.{snake} = "{s}"',
    "rust-let": 'let {snake}: &str = "{s}";',
    "swift-let": 'let {camel} = "{s}"',
    "powershell-env": '$env:{UPPER} = "{s}"',
    "cmd-set": "set {UPPER}={s}",
    "ini-colon-spaced": "{snake} : {s}",
    "dockerfile-env-eq": "ENV {UPPER}={s}",
    "dockerfile-env-space": "ENV {UPPER} {s}",
    "form-body": "{snake}={s}&user=bob",
    "headers-repr": "headers={{'X-Api-Key': '{s}', 'Accept': 'application/json'}}",
    "json-compact": '{{"{camel}":"{s}"}}',
    "yaml-list-item": "- {snake}: {s}",
    "toml-inline-table": 'creds = {{ {snake} = "{s}" }}',
    "csv-row": "{snake},{s}",
    "python-call-kwarg": 'connect(host="db", {snake}="{s}")',
    "env-command": "env {UPPER}={s} python train.py",
    "js-object": "const cfg = {{ {camel}: '{s}' }};",
    "systemd-environment": 'Environment="{UPPER}={s}"',
    "gitconfig-url": '[url "https://oauth2:{s}@gitlab.example.com/"]',
    "log-kv-quoted": 'level=warn msg="auth retry" {snake}="{s}"',
}
# Round 2 of the held-out check, written (before any change it led to) when round 1's misses were
# fixed: syntaxes of languages, tools and files that neither NAMED nor round 1 has, measured once
# on the detectors as they were (`--held-out 2`). Its before-figure is in docs/reports.md.
HELD_OUT_2: dict[str, str] = {
    "nginx-fastcgi-param": 'fastcgi_param {UPPER} "{s}";',
    "apache-setenv": "SetEnv {UPPER} {s}",
    "lua-local": 'local {snake} = "{s}"',
    "perl-my": "my ${snake} = '{s}';",
    "r-assign": '{snake} <- "{s}"',
    "elixir-config": 'config :app, {snake}: "{s}"',
    "c-define": '#define {UPPER} "{s}"',
    "c-char-array": 'static const char {snake}[] = "{s}";',
    "fish-set": "set -gx {UPPER} {s}",
    "compose-env-list": "    environment:\n      - {UPPER}={s}",
    "helm-set": "helm upgrade --install app ./chart --set {dotted}={s}",
    "kubectl-from-literal": "kubectl create secret generic app --from-literal={snake}={s}",
    "json-spaced-colon": '{{ "{snake}" : "{s}" }}',
    "python-environ-item": 'os.environ["{UPPER}"] = "{s}"',
    "js-process-env": 'process.env.{UPPER} = "{s}";',
    "yaml-flow-map": "auth: {{{snake}: {s}, user: bob}}",
    "ansible-extra-vars": 'ansible-playbook site.yml -e "{snake}={s}"',
    "spring-value-default": '@Value("${{{dotted}:{s}}}")',
    "http-header-named": 'curl -H "X-{Camel}: {s}" https://api.example.com/v1/jobs',
    "npmrc-auth": "//registry.npmjs.org/:_authToken={s}",
    "sql-password": "ALTER USER app WITH PASSWORD '{s}';",
    "pgpass-line": "db.internal:5432:app:alice:{s}",
}
# Round 2's connection strings: passwords with characters people leave unencoded ('/', '+', '='
# of base64, '#'), in syntaxes URL_SYNTAXES does not have.
URL_PASSWORD_2 = ALNUM + "/+="
URL_HELD_OUT_2: dict[str, str] = {
    "url2:cli-flag": "python manage.py migrate --database-url {url}",
    "url2:celery": "broker_url = '{url}'",
    "url2:compose": "      - DATABASE_URL={url}",
    "url2:log-quoted": 'connecting to "{url}" failed: timeout',
}
URL_SYNTAXES: dict[str, str] = {
    "bare-log-line": "2026-03-14 09:26:53 INFO db: connecting to {url}",
    "dotenv": "DATABASE_URL={url}",
    "json": '{{"sqlalchemy_url": "{url}"}}',
    "yaml-quoted": '  url: "{url}"',
    "python": "engine = create_engine('{url}')",
    "traceback-repr": "OperationalError: could not connect to '{url}'",
}
CURL_SYNTAXES: dict[str, str] = {
    "curl-u": "curl -u {user}:{s} https://api.example.com/v1/status",
    "curl-user-quoted": 'curl -s --user "{user}:{s}" https://api.example.com/v1/status',
    "curl-u-single-quoted": "curl -sf -X POST -u '{user}:{s}' https://registry.example.com/upload",
    "curl-user-equals": "curl --user={user}:{s} https://api.example.com/",
    "curl-continued": "curl -sS https://api.example.com/v1/jobs \\\n  -u {user}:{s} \\\n  -d @job.json",
}
MYSQL_SYNTAXES: dict[str, str] = {
    "mysql-p": "mysql -u root -p{s} -h db.internal app",
    "mysqldump-p": "mysqldump -u backup -p{s} --single-transaction app > app.sql",
    "mysql-password-flag": "mysql --user=root --password={s} app",
    "mysql-p-quoted": "mysql -h 10.0.0.5 -uroot -p'{s}' -e 'show databases'",
}
BLOCK_SYNTAXES: dict[str, str] = {
    "raw": "{block}",
    "log-around": "loading credentials\n{block}\ndone",
    "json-escaped": '{{"type": "service_account", "private_key": "{escaped}", "client_email": "bot@example.iam"}}',
    "yaml-block": "tls:\n  key: |\n{indented}\n  cert_file: /etc/tls/cert.pem",
    "python-repr": "key = '{escaped}'",
}
SHORT_SYNTAXES: dict[str, str] = {
    "short-env-then-bare": "DB_PASSWORD={s}\nconnecting as app with password {s} ... rejected",
    "short-bare-then-env": "psql: authentication failed for {s}\nDB_PASSWORD={s}",
    "short-yaml-then-bare": "db_password: {s}\nlogin failed: {s}",
}
# The user in a connection string: the current user (whose name redaction also hides), a generic
# one and another.
URL_FORMS = (
    ("postgresql", "alice", "db.internal:5432/app"),
    ("mysql", "root", "10.0.0.5:3306/app"),
    ("mongodb+srv", "deploy", "cluster0.ab1cd.mongodb.net/app?retryWrites=true"),
    ("redis", "", "cache:6379/0"),
    ("amqp", "alice", "rabbit.internal:5672/%2F"),
    ("postgres", "svc_app", "10.1.2.3/app"),
)


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    syntax: str
    text: str
    secrets: tuple[str, ...]
    identity: str = "alice"  # which redactor: "alice" (home /home/alice) or "root" (home /root)
    environ: tuple[tuple[str, str], ...] = ()


def _indent(block: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in block.splitlines())


def _body_lines(block: str) -> tuple[str, ...]:
    return tuple(line for line in block.splitlines() if len(line) >= 16 and not line.startswith("-----"))


def _named_cases(fam: "Family", templates: dict[str, str], rng: "_Random") -> list[Case]:
    """A family found by its name or form, written in each of `templates` (one secret each)."""
    names = _names(fam.stem, fam.word)
    out = []
    for syntax, template in templates.items():
        s = fam.make(rng)
        out.append(Case(fam.name, syntax, template.format(s=s, **names), (fam.secret(s),)))
    return out


def held_out_cases(seed: int = SEED + 1) -> list[Case]:
    """The HELD_OUT syntaxes for every family found by its name or form."""
    rng = _Random(seed)
    return [case for fam in FAMILIES if fam.kind in ("token", "password", "key")
            for case in _named_cases(fam, HELD_OUT, rng)]


def held_out_2_cases(seed: int = SEED + 2) -> list[Case]:
    """Round 2 of the held-out check: HELD_OUT_2 for every family found by its name or form, and
    connection strings whose password holds '/', '+' or '='."""
    rng = _Random(seed)
    out = []
    for fam in FAMILIES:
        if fam.kind in ("token", "password", "key"):
            out += _named_cases(fam, HELD_OUT_2, rng)
        elif fam.kind == "url":
            for syntax, template in URL_HELD_OUT_2.items():
                for scheme, user, rest in URL_FORMS:
                    s = rng.mixed(URL_PASSWORD_2, 20)
                    s = s[:6] + "/" + s[7:14] + "+" + s[15:]  # at least one of each
                    url = f"{scheme}://{user}:{s}@{rest}"
                    out.append(Case(fam.name, syntax, template.format(url=url), (s,)))
    return out


def cases(seed: int = SEED) -> list[Case]:
    """The whole recall corpus, the same on every machine."""
    rng = _Random(seed)
    out: list[Case] = []
    for fam in FAMILIES:
        names = _names(fam.stem, fam.word)
        if fam.kind in ("token", "password", "key"):
            out += _named_cases(fam, NAMED, rng)
            if fam.kind == "token":
                for syntax, template in BARE.items():
                    s = fam.make(rng)
                    out.append(Case(fam.name, syntax, template.format(s=s), (fam.secret(s),)))
        elif fam.kind == "url":
            for syntax, template in URL_SYNTAXES.items():
                for scheme, user, rest in URL_FORMS:
                    s = fam.make(rng)
                    url = f"{scheme}://{user}:{s}@{rest}"
                    out.append(Case(fam.name, f"url:{syntax}", template.format(url=url), (s,)))
                    if user == "root":  # the same as the root user, whose home is /root
                        out.append(Case(fam.name, f"url:{syntax}", template.format(url=url), (s,), identity="root"))
        elif fam.kind == "curl":
            for syntax, template in CURL_SYNTAXES.items():
                for user in ("alice", "deploy-bot", "roger23@example.com"):
                    s = fam.make(rng)
                    out.append(Case(fam.name, syntax, template.format(user=user, s=s), (s,)))
        elif fam.kind == "mysql":
            for syntax, template in MYSQL_SYNTAXES.items():
                for _ in range(3):
                    s = fam.make(rng)
                    out.append(Case(fam.name, syntax, template.format(s=s), (s,)))
        elif fam.kind == "block":
            for syntax, template in BLOCK_SYNTAXES.items():
                block = fam.make(rng)
                text = template.format(block=block, escaped=block.replace("\n", "\\n"), indented=_indent(block, "    "))
                out.append(Case(fam.name, f"block:{syntax}", text, _body_lines(block)))
        elif fam.kind == "short":
            for syntax, template in SHORT_SYNTAXES.items():
                s = fam.make(rng)
                out.append(Case(fam.name, syntax, template.format(s=s), (s,)))
            for value in ("hunter2", "tr1cky", "pa55wd"):
                out.append(Case(fam.name, "short-environment", f"connecting as app with password {value}: rejected",
                                (value,), environ=(("DB_PASSWORD", value),)))
    return out


# --- lookalikes: what must come through unchanged ---------------------------------------------------

LOOKALIKES: dict[str, tuple[str, ...]] = {
    "url-scheme": (
        "pip install git+https://github.com/huggingface/transformers.git",
        "export HF_ENDPOINT=https://hf-mirror.example.com",
        "endpoint: https://api.example.com/v1",
        "server: http://localhost:8080/metrics",
        "MLFLOW_TRACKING_URI=http://mlflow:5000",
        "host = 'jdbc:postgresql://localhost:5432/app'",
        "vllm serve model --host http://localhost --port 8000",
        "hostname: https://dashboard.example.com/grafana",
        "MASTER_ADDR=tcp://localhost:29500",
    ),
    "image-digest": (
        "FROM nvcr.io/nvidia/pytorch@sha256:6b1f0c2a9e4d8b3c7a5f1e2d3c4b5a6978877665544332211ffeeddccbbaa0099",
        "docker pull ghcr.io/acme/trainer@sha256:0f3a9c2e17b4d4e0a9c1b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d",
        "image: pytorch/pytorch@sha256:3c4b5a6978877665544332211ffeeddccbbaa00996b1f0c2a9e4d8b3c7a5f1e2d",
    ),
    "yarn-spec": (
        '"lodash@npm:4.17.21":',
        '  resolution: "typescript@npm:5.4.5"',
        '"@types/node@npm:^20.11.0, @types/node@npm:^20.12.7":',
        "  checksum: 10c0/8f2b4e1c3d5a",
        "pnpm add react@canary vite@latest",
    ),
    "javascript-new": (
        "const token = new URLSearchParams(window.location.search).get('t');",
        "this.secret = new Secret(bytes);",
        "let password = new Uint8Array(32);",
        "apiKey = new ApiKey(config);",
        "    credentials = new AWS.SharedIniFileCredentials({ profile: 'dev' });",
    ),
    "maven-coordinate": (
        'notes = "Maven - io.jsonwebtoken:jjwt-jackson-0.11.2"',
        "implementation 'io.jsonwebtoken:jjwt-api:0.12.6'",
        "[DEBUG]    org.apache.httpcomponents:httpclient:jar:4.5.14:compile",
        "<artifactId>aws-java-sdk-secretsmanager</artifactId><version>1.12.770</version>",
        "com.google.auth:google-auth-library-oauth2-http:1.23.0",
    ),
    "named-but-not-secret": (
        "tokenizer = AutoTokenizer.from_pretrained(name, token=token)",
        "max_tokens = 4096",
        "password_min_length = 12",
        "SECRET_NAME = 'HF_TOKEN'",
        "key_padding_mask: Optional[Tensor] = None",
        "api_version = 2024-06-01",
        "--password-file /run/secrets/db",
        "curl -u $USER:$TOKEN https://api.example.com",
        "curl -u <user>:<password> https://api.example.com",
        "docker run -u 1000:1000 trainer",
        "python -u train.py --model gpt2",
        "mysql -p -u root app",
    ),
    # Round 2's fixes (assignment without an operator, a URL password holding '/') must not take these.
    "no-operator": (
        "Set DB_PASSWORD first, then run",
        "password,required,string",
        "db_password,<your password>",
        "#define PASSWORD_MAX 128",
        "static char password[64];",
        "os.environ[\"HF_TOKEN\"] = token",
        "ENV DB_PASSWORD_FILE /run/secrets/db",
        "ENV HF_TOKEN $HF_TOKEN",
        "set -gx HF_TOKEN (cat ~/.hf_token)",
        'token <- Sys.getenv("HF_TOKEN")',
        'expected token "}" at line 3',
        'error: missing api_key "OPENAI_API_KEY"',
        "if tokens <-1: pass",
    ),
    "url-path-at": (
        "https://registry.example.com:8443/@acme/trainer/-/trainer-1.0.tgz",
        "https://unpkg.com/react@18/umd/react.js",
        "ssh://git@github.com:acme/repo.git@v1",
        "s3://bucket/path/to/key@2x.png",
    ),
    "identifiers": (
        "commit 70d99e9f4b3c2a1d0e9f8a7b6c5d4e3f2a1b0c9d",
        "sha256:6b1f0c2a9e4d8b3c7a5f1e2d3c4b5a6978877665544332211ffeeddccbbaa0099",
        "torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "skip_layers: [1, 2, 3]",
        "SKIPPED [1] tests/test_x.py:12: needs CUDA",
        "ACCEPT_LANGUAGE=en-US",
        "ghp_ is the prefix of a GitHub token",
    ),
}


# --- measuring -----------------------------------------------------------------------------------------


def redactor_for(case: Case):
    from gpudoctor.reports.redact import Redactor

    home, user = ("/root", "root") if case.identity == "root" else ("/home/alice", "alice")
    return Redactor(home=home, user=user, host="gpu-box-17.corp.example.com",
                    machine_id="4f1c2b3a5d6e7f8091a2b3c4d5e6f708", environ=dict(case.environ))


def leaked(secret: str, out: str) -> bool:
    """Whether `secret`, or any piece of it WINDOW characters long, is in `out`."""
    if secret in out:
        return True
    if len(secret) <= WINDOW:
        return False
    return any(secret[i:i + WINDOW] in out for i in range(len(secret) - WINDOW + 1))


def measure(corpus: Iterable[Case]) -> tuple[list[tuple[Case, str]], collections.Counter, collections.Counter]:
    """(misses as (case, redacted text), totals by (axis, name), misses by (axis, name))."""
    misses: list[tuple[Case, str]] = []
    total: collections.Counter = collections.Counter()
    missed: collections.Counter = collections.Counter()
    for case in corpus:
        out = redactor_for(case).text(case.text)
        total["family", case.family] += 1
        total["syntax", case.syntax] += 1
        if any(leaked(s, out) for s in case.secrets):
            misses.append((case, out))
            missed["family", case.family] += 1
            missed["syntax", case.syntax] += 1
    return misses, total, missed


def lookalike_changes() -> list[tuple[str, str, str]]:
    from gpudoctor.reports.redact import Redactor

    out = []
    for kind, texts in LOOKALIKES.items():
        for text in texts:
            redactor = Redactor(home="/home/alice", user="alice", host="gpu-box-17.corp.example.com",
                                machine_id="4f1c2b3a5d6e7f8091a2b3c4d5e6f708", environ={})
            got = redactor.text(text)
            if got != text:
                out.append((kind, text, got))
    return out


def gitleaks_gaps(path: str) -> list[str]:
    """gitleaks rules (config/gitleaks.toml) with a literal prefix that no family here starts with."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as fh:
        rules = tomllib.load(fh)["rules"]
    rng = _Random(SEED)
    samples = [fam.make(rng).lower() for fam in FAMILIES for _ in range(2)]
    gaps = []
    for rule in rules:
        keywords = [k.lower() for k in rule.get("keywords") or []]
        regex = rule.get("regex", "")
        if not keywords or regex.startswith(("(?i)[\\w.-]{0,50}?", "[\\w.-]{0,50}?")):
            continue  # a name-anchored rule (its keyword is a service's name, not a prefix)
        if not any(s.startswith(k) or k in s for k in keywords for s in samples):
            gaps.append(f"{rule['id']}: keywords {keywords}")
    return gaps


def _table(total: collections.Counter, missed: collections.Counter, axis: str) -> list[str]:
    names = sorted(n for a, n in total if a == axis)
    rows = []
    for name in names:
        t, m = total[axis, name], missed[axis, name]
        rows.append(f"| {name} | {t - m}/{t} | {100 * (t - m) / t:.1f}% |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", action="store_true", help="show every case whose secret survived")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--gitleaks", metavar="GITLEAKS_TOML", help="list gitleaks rules no family covers")
    parser.add_argument("--held-out", nargs="?", const="1", choices=("1", "2"),
                        help="measure a held-out round's syntaxes instead (1: HELD_OUT, 2: HELD_OUT_2)")
    args = parser.parse_args(argv)
    if args.gitleaks:
        gaps = gitleaks_gaps(args.gitleaks)
        print("\n".join(gaps) if gaps else "every prefixed gitleaks rule has a family here")
        return 0
    corpus = {None: cases, "1": held_out_cases, "2": held_out_2_cases}[args.held_out]()
    misses, total, missed = measure(corpus)
    changed = lookalike_changes()
    n, m = len(corpus), len(misses)
    if args.json:
        print(json.dumps({
            "cases": n, "redacted": n - m,
            "by_family": {name: [total[a, name] - missed[a, name], total[a, name]] for a, name in total if a == "family"},
            "by_syntax": {name: [total[a, name] - missed[a, name], total[a, name]] for a, name in total if a == "syntax"},
            "lookalikes_changed": [list(c) for c in changed],
            "lookalikes": sum(len(v) for v in LOOKALIKES.values()),
        }, indent=1, sort_keys=True))
        return 0
    print(f"recall: {n - m}/{n} cases redacted ({100 * (n - m) / n:.1f}%), "
          f"{len({c.family for c in corpus})} families, {len({c.syntax for c in corpus})} syntaxes")
    print("\n| syntax | redacted | recall |\n| --- | --- | --- |")
    print("\n".join(_table(total, missed, "syntax")))
    print("\n| family | redacted | recall |\n| --- | --- | --- |")
    print("\n".join(_table(total, missed, "family")))
    looks = sum(len(v) for v in LOOKALIKES.values())
    print(f"\nlookalikes changed: {len(changed)} of {looks}")
    for kind, text, got in changed:
        print(f"  [{kind}] {text!r}\n      -> {got!r}")
    if args.misses:
        print()
        for case, out in misses:
            print(f"[{case.family} / {case.syntax}] {case.text!r}\n    -> {out!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
