"""Redaction: what a report must not carry when it is pasted into a public bug ticket.

`redact_report(data)` takes a report's dict (`Report.to_dict()`) and returns a scrubbed deep copy:

- identity: home folders (`/home/<user>`, `/Users/<user>`, `C:\\Users\\<user>`, and this
  user's $HOME) become `~`; this user's name and this machine's hostname become `<user>` and
  `<host>` wherever they appear;
- hardware identifiers: GPU and MIG UUIDs, any UUID, PCI bus ids, and keys named uuid, serial,
  bus id or hostname are dropped or masked;
- environment variables: only the allow-list survives in `environment.env_vars`, and a variable
  whose NAME says secret (TOKEN, SECRET, KEY, PASSWORD, PASSWD, CREDENTIAL, AUTH) loses its value
  anywhere in the report, even if someone adds it to the allow-list;
- secrets by VALUE, in every string: credentials in URLs (`https://user:pass@host`), Hugging Face
  `hf_...`, AWS `AKIA...` ids and secret keys, GitHub `ghp_...`/`github_pat_...`, OpenAI-style
  `sk-...`, Slack `xox?-...`, bearer tokens, `password=...`/`token: ...` pairs, private key blocks.

Both layers run because either alone leaks: a name check misses a token pasted into an index URL,
a value check misses a short password in a variable called DB_PASSWORD. Standard library only.
"""
from __future__ import annotations

import copy
import getpass
import os
import re
import socket
from typing import Any

from gpudoctor.torchenv import allowed_env_name

MASK = "<redacted>"

SECRET_NAME_RE = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# Only names shaped like environment variables are judged by name: a probe's `details` may
# legitimately hold a lower-case "key" (the attention key tensor's shape).
_ENV_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Keys whose values identify a machine or a GPU; dropped wherever they appear.
IDENTITY_KEYS = frozenset({"uuid", "serial", "pci_bus_id", "bus_id", "board_id", "hostname", "node", "user", "username"})

_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S), MASK),
    # user[:password]@ in any scheme://, e.g. pip's --index-url https://user:pass@host/simple
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@:'\"]+(?::[^/\s@'\"]*)?@"), rf"\1{MASK}@"),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    (
        re.compile(
            r"(?i)\b((?:[a-z0-9]+[_-])*(?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key"
            r"|secret[_-]?key|private[_-]?key|auth[_-]?token|credentials?)\b\s*[=:]\s*)(['\"]?)[^\s'\"&;,]+"
        ),
        rf"\1\2{MASK}",
    ),
    # AWS secret access keys: 40 characters of base64 alphabet with upper, lower and digits (so that
    # a 40-hex git commit hash survives), not starting with "/" (so that a path survives).
    (re.compile(r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]*[A-Z])(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[0-9])[A-Za-z0-9+][A-Za-z0-9/+]{39}(?![A-Za-z0-9/+=])"), MASK),
    (re.compile(r"\b(GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), r"\1-<uuid>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b"), "<pci-bus-id>"),
    (re.compile(r"(?<![\w.~-])/(?:home|Users)/[^/\s'\":]+"), "~"),
    (re.compile(r"(?i)\b[A-Z]:\\Users\\[^\\\s'\"]+"), "~"),
)

# Names too common to be identifying, and which would mangle ordinary text if replaced.
_GENERIC_NAMES = frozenset({"root", "user", "admin", "nobody", "ubuntu", "runner", "jovyan", "localhost", "vm"})


class Redactor:
    """Scrubs strings and report dicts. Built once per report with this machine's identity."""

    def __init__(self, home: str | None = None, user: str | None = None, host: str | None = None) -> None:
        self.home = (home if home is not None else _home()).rstrip("/")
        user = user if user is not None else _user()
        host = host if host is not None else _host()
        self.names: list[tuple[re.Pattern[str], str]] = []
        for value, label in ((user, "<user>"), (host, "<host>"), (host.split(".")[0] if host else "", "<host>")):
            if value and len(value) >= 3 and value.lower() not in _GENERIC_NAMES:
                self.names.append((re.compile(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", re.I), label))

    def text(self, value: str) -> str:
        # $HOME first: /root or /data/alice are homes the generic /home/<user> rule cannot see.
        if self.home and self.home not in ("/", "") and len(self.home) > 1:
            value = re.sub(rf"{re.escape(self.home)}(?=/|\b|$)", "~", value)
        for pattern, repl in _VALUE_PATTERNS:
            value = pattern.sub(repl, value)
        for pattern, label in self.names:
            value = pattern.sub(label, value)
        return value

    def value(self, value: Any, key: str | None = None) -> Any:
        if key is not None and _ENV_NAME_RE.match(key) and SECRET_NAME_RE.search(key):
            return MASK
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                self.text(str(k)): self.value(v, str(k))
                for k, v in value.items()
                if str(k).lower() not in IDENTITY_KEYS
            }
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


def _home() -> str:
    try:
        return os.path.expanduser("~")
    except Exception:
        return ""


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return os.environ.get("USER", "")


def _host() -> str:
    try:
        return socket.gethostname()
    except Exception:
        return ""


def redact_report(data: dict[str, Any], redactor: Redactor | None = None) -> dict[str, Any]:
    """A scrubbed deep copy of a report dict (see the module docstring); marks it `redacted`."""
    redactor = redactor or Redactor()
    out = copy.deepcopy(data)
    env = out.get("environment")
    if isinstance(env, dict):
        # Filter by the allow-list first: a report built elsewhere may carry more variables.
        for section in ("env_vars",):
            if isinstance(env.get(section), dict):
                env[section] = {k: v for k, v in env[section].items() if allowed_env_name(k)}
    out = redactor.value(out)
    if "redacted" in out:
        out["redacted"] = True
    return out


def redact(report: Any) -> Any:
    """`redact_report` for a `Report` object: returns a new, redacted `Report`."""
    from gpudoctor.reports.model import report_from_dict

    return report_from_dict(redact_report(report.to_dict()))
