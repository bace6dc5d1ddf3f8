"""Redaction: what a report or a program's output must not carry into a public bug ticket.

One `Redactor` is built per report (or per bundle): it knows this machine's identity (home, user
names, host name, machine id, secrets held in secret-named environment variables) and hands out
stable pseudonyms, so that the same secret, host, address or user gets the same placeholder
everywhere in that report (`<host-2>` on two lines is one machine). docs/reports.md's "What is
redacted" table lists every form; in short:

- secrets, by name: a value whose key, variable or flag is secret-like, in any syntax that names
  one (`HF_TOKEN=...`, `'WANDB_API_KEY': '...'`, `"password": "..."`, `var xToken string =
  "..."`, `XTOKEN ?= ...`, `<password>...</password>`, `setProperty("DB_PASSWORD", "...")`,
  `--token X`, `Authorization: Bearer ...`, `curl -u user:pass`, `mysql -pPASS`), and the same
  value wherever else it appears (a short one too, as a word);
- secrets, by form: credentials in URLs (whoever the user is, an empty one included), the token
  formats of gpudoctor.reports.redact_forms (GitHub, GitLab, Hugging Face, OpenAI, Anthropic,
  Stripe, Slack, AWS, npm, PyPI, JWTs and sixty more), webhook paths, PEM and PGP private key
  blocks, signed-URL signatures;
- identity: this user's home (`~`), other users' homes (`/home/<user-1>`, `/Users/...`,
  `C:\\Users\\...`, `/mnt/c/Users/...`), this user's name as a path component or word, e-mail
  addresses, `user@host`;
- machines: this host's name, host names in a host context (MASTER_ADDR, --rdzv-endpoint,
  `hostname=`, `[host]:port`, NCCL's `host:pid:tid` prefix, tcp:// rendezvous URLs, SLURM node
  lists, `*.internal`/`*.local` names), IPv4 and IPv6 addresses (loopback, 0.0.0.0 and netmasks
  stay), MAC addresses, /etc/machine-id, UUIDs (GPU and MIG UUIDs keep their prefix), serial
  numbers.

Kept on purpose, because a diagnosis needs them: versions (a dotted quad after `==`, `-`, `v` or
the word version, or under a `version` key, is a version, not an address), git commit ids, wheel
hashes, CUDA pointers (`0x7f...`), tensor shapes, PCI bus ids, public index hosts in URLs, package
specs (`lodash@npm:4.17.21`, an image's `@sha256:`), and paths, whatever folders they run through
(mktemp's `/tmp/tmp.6xjVbbjJMQ`, pytest's `tmp_path`, Ray sessions, Hugging Face snapshots
`models--org--name/snapshots/<40-hex>/`, container overlays).

How a text is redacted (`Redactor.text`): every detector reads the text as given and proposes
spans (gpudoctor.reports.redact_spans): the private key blocks and secrets of
gpudoctor.reports.redact_secrets, the identities and machines of
gpudoctor.reports.redact_machines, and the values this redactor already knows (learned secrets,
named hosts, the user's names). Where spans overlap the strongest claim wins (a key block, then a
secret, then an identity, then a machine, then a known name), so no detector's result depends on
another having run first. The kept spans are replaced left to right; the values a context showed
to be secrets are then learned and hunted through the rest of the text, and of the report.

Evidence before masking: a form that ordinary text also has is hidden only with context that
makes it a secret or a host (the rule tables and tests are in gpudoctor.reports.redact_rules); the
precision corpus in tests/precision_corpus.py is what this must leave unchanged, and the recall
corpus of tools/secret_corpus.py what it must find.

Interfaces for the other commands:
- `Redactor.text(s)`, `Redactor.value(obj)`, `Redactor.report(dict)` (= `redact_report`);
- `Redactor.learn(obj)`, `Redactor.learn_text(s)`: learn the secrets a value or a text holds
  before redacting other ones (a bundle's files are learned together, then written);
- `Redactor.alias(kind, value, label)`: name a known identity, e.g. the fleet merge names each
  node's host `node-0`, `node-1` before redacting the merged report;
- `Redactor.stream()`: a `StreamRedactor` (gpudoctor.reports.redact_stream) whose `feed(text)`
  returns the redacted complete lines and keeps a bounded partial line, `flush()` the rest.

Standard library only.
"""
from __future__ import annotations

import getpass
import ipaddress
import os
import re
import socket
from typing import Any, Callable, Iterable, Iterator, Mapping

from gpudoctor.scan.torchenv import allowed_env_name
from gpudoctor.reports import redact_machines, redact_secrets
from gpudoctor.reports.redact_forms import trie
from gpudoctor.reports.redact_rules import (  # noqa: F401 (is_secret_name, IDENTITY_KEYS: public here)
    _GENERIC_NAMES, _huntable, IDENTITY_KEYS, _is_host_name, _is_ip, _is_netmask, is_secret_name, _KEEP_IPS,
    _plausible_secret, _secret_level, _UUID,
)
from gpudoctor.reports.redact_spans import RANK_IDENTITY, RANK_MACHINE, RANK_NAME, RANK_SECRET, Span, apply, resolve
from gpudoctor.reports.redact_stream import StreamRedactor

MASK = "<redacted>"  # a whole value hidden without a pseudonym (for callers that need one)

_MAX_PSEUDONYMS = 10_000  # per kind; beyond it, the unnumbered <kind> (bounded memory)
_MIN_LEARNED = 8  # a secret shorter than this is hunted elsewhere only as a whole word...
_MIN_SHORT = 4  # ...and only from this length, with a digit or a sign in it (hunter2, not "test")
_MEMO_ENTRIES = 1 << 16  # `Redactor.text` results remembered (a fleet report repeats "GPU 3" 1,000 times)
_MEMO_LENGTH = 1024  # longer strings (log text) are rarely repeated: not remembered
# Kinds whose values, once found by their context, are hidden wherever else they appear verbatim.
_LEARNED_KINDS = frozenset({"secret", "machine-id", "serial"})
_LITERAL_RANKS = {"host": RANK_MACHINE, "machine-id": RANK_MACHINE, "serial": RANK_MACHINE, "ip": RANK_MACHINE,
                  "mac": RANK_MACHINE, "uuid": RANK_MACHINE}

# --- the pseudonym table ----------------------------------------------------------------------------


class _Pseudonyms:
    def __init__(self) -> None:
        self.labels: dict[tuple[str, str], str] = {}
        self.counts: dict[str, int] = {}

    def get(self, kind: str, value: str) -> str:
        key = (kind, value)
        label = self.labels.get(key)
        if label is None:
            n = self.counts.get(kind, 0) + 1
            if n > _MAX_PSEUDONYMS:
                return f"<{kind}>"
            self.counts[kind] = n
            label = self.labels[key] = f"<{kind}-{n}>"
        return label

    def set(self, kind: str, value: str, label: str) -> None:
        self.labels[(kind, value)] = label


# --- the redactor ------------------------------------------------------------------------------------


class Redactor:
    """Scrubs strings, report dicts and output streams, with stable pseudonyms per instance.

    `home`, `user`, `host` and `machine_id` default to this machine's; `environ` (default
    os.environ) supplies more user and host names (USER, LOGNAME, SUDO_USER, HOSTNAME,
    SLURMD_NODENAME, MASTER_ADDR) and the values of secret-named variables, which are then
    redacted wherever they appear verbatim."""

    def __init__(
        self,
        home: str | None = None,
        user: str | None = None,
        host: str | None = None,
        *,
        machine_id: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.home = (home if home is not None else _home()).rstrip("/\\")
        self.home_pattern = (re.compile(rf"{re.escape(self.home)}(?=[/\\]|(?![\w.-]))")
                             if self.home and len(self.home) > 1 else None)
        self._names = _Pseudonyms()
        self._secrets: set[str] = set()  # hunted as substrings
        self._short: set[str] = set()  # hunted as whole words
        self._literals: dict[str, tuple[str, str]] = {}  # exact text -> (kind, label)
        self._literal_re: re.Pattern[str] | None = None
        self._secret_re: re.Pattern[str] | None = None
        self.users: list[str] = []
        self._found: list[tuple[str, str]] = []  # (kind, value) redacted by context, not yet literal
        self._learned = 0
        self._labels: set[str] = set()  # alias labels ("node-0"): never taken for a host again
        self._user_res: list[tuple[str, re.Pattern[str]]] = []
        # text() results, forgotten whenever what the redactor knows changes (alias, a learned
        # secret, a user name): the same string then gets the same answer, at dictionary speed.
        self._memo: dict[tuple[str, bool], str] = {}

        users = [user if user is not None else _user()]
        if environ is not os.environ or user is None:
            users += [environ.get(v, "") for v in ("USER", "LOGNAME", "SUDO_USER", "USERNAME")]
        if self.home not in ("", "/", "/root"):
            users.append(re.split(r"[/\\]", self.home)[-1])
        for name in users:
            self._add_user(name)

        host = host if host is not None else _host()
        for name in (host, environ.get("HOSTNAME", ""), environ.get("SLURMD_NODENAME", "")):
            if name and name.lower() not in _GENERIC_NAMES:
                self.alias("host", name, "<host>")
            elif name:
                # A generic name ("vm") is not hunted in text, where it would mangle words, but
                # where a report says it is a host name (a `hostname` key) it is this machine.
                self._names.set("host", name.lower(), "<host>")
        master = environ.get("MASTER_ADDR", "")
        if master and not _is_ip(master) and master.lower() not in _GENERIC_NAMES:
            self.host_label(master)

        mid = machine_id if machine_id is not None else _machine_id()
        if mid:
            self.alias("machine-id", mid, "<machine-id>")
        for name, value in environ.items():
            level = _secret_level(name)
            if level:
                # A short value is hunted only under a name that says secret (DB_PASSWORD=hunter2).
                self.learn_secret(value, short=level == 2)

    # -- the identities this redactor knows ------------------------------------------------------

    def alias(self, kind: str, value: str, label: str) -> str:
        """Name a known identity: every occurrence of `value` (as a whole word) becomes `label`.
        For a host, its first label is named too (gpu-node-7.corp.example.com and gpu-node-7).
        The fleet merge calls `alias("host", hostname, "node-0")` for each node in rank order."""
        value = value.strip()
        if not value:
            return label
        self._labels.add(label)
        self._names.set(kind, self._norm(kind, value), label)
        variants = {value, value.lower()}
        if kind == "host" and not _is_ip(value):
            short = value.split(".")[0]
            if len(short) >= 3 and short.lower() not in _GENERIC_NAMES:
                variants |= {short, short.lower()}
                self._names.set(kind, short.lower(), label)
        for v in variants:
            if len(v) >= 3:
                self._literals[v] = (kind, label)
        self._literal_re = None
        self._memo.clear()
        return label

    def learn_secret(self, value: str, *, short: bool = False) -> None:
        """Redact `value` wherever it appears verbatim (a password from the environment). With
        `short`, a value of 4 to 7 characters is hunted too, as a whole word, when it cannot be
        an ordinary word (hunter2, s3cr3t!; not `test`)."""
        value = value.strip() if isinstance(value, str) else ""
        if len(value) > 1024 or not _plausible_secret(value):
            return
        if len(value) >= _MIN_LEARNED and len(set(value)) >= 4:
            target = self._secrets
        elif short and len(value) >= _MIN_SHORT and len(set(value)) >= 3 and _huntable(value) \
                and not value.isalpha() and not value.isdigit():
            target = self._short
        else:
            return
        if value not in target and len(self._secrets) + len(self._short) < 1000:
            target.add(value)
            self._secret_re = None
            self._memo.clear()

    def pseudonym(self, kind: str, value: str) -> str:
        """The placeholder of `value` of `kind` (secret, host, ip, mac, user, email, uuid, serial,
        machine-id), the same one for the same value throughout this redactor's life."""
        if kind == "host":
            return self.host_label(value)
        if kind == "ip" and _is_ip(value.strip()):
            return self.ip_label(_is_ip(value.strip()), value.strip())  # type: ignore[arg-type]
        label = self._names.get(kind, self._norm(kind, value))
        if (kind in _LEARNED_KINDS and len(value) >= (_MIN_SHORT if kind == "secret" else _MIN_LEARNED)
                and value not in self._secrets and value not in self._short and value not in self._literals):
            self._found.append((kind, value))
        return label

    def secret_render(self, value: str) -> Callable[[], str]:
        """The rendering of a secret's span: its placeholder, numbered when the span is kept."""
        return lambda: self.pseudonym("secret", value)

    def key_block(self, block: str) -> str:
        """The placeholder of a private key block; its body lines are learned as secrets with the
        same placeholder, so that a line of it shown on its own (a log split into evidence lines)
        is hidden too."""
        label = self.pseudonym("private-key", block)
        for line in redact_secrets.key_block_lines(block):
            if line not in self._secrets:
                self._names.set("secret", line, label)
                self._found.append(("secret", line))
        return label

    def learn_key_lines(self, lines: list[str], label: str | None) -> None:
        """Body lines of a key block a stream dropped: hidden as that key wherever they appear."""
        if label is None:
            return
        for line in redact_secrets.key_block_lines("\n".join(lines)):
            if line not in self._secrets:
                self._names.set("secret", line, label)
                self._found.append(("secret", line))
        self._learn_found()

    @staticmethod
    def _norm(kind: str, value: str) -> str:
        if kind in ("host", "mac", "uuid", "machine-id", "email"):
            return value.lower().rstrip(".").replace("-", ":") if kind == "mac" else value.lower().rstrip(".")
        if kind == "ip":
            ip = _is_ip(value)
            return ip.compressed if ip else value
        return value

    def host_label(self, name: str, *, learn: bool = True) -> str:
        """The placeholder of a host name (an address's, for an IP); with `learn`, a name that
        cannot be a word (gpu-node-7, node017, box.corp.example.com) is hunted elsewhere too."""
        if name in self._labels:
            return name
        ip = _is_ip(name)
        if ip is not None:
            return self.ip_label(ip, name)
        norm = name.lower().rstrip(".")
        short = norm.split(".")[0]
        found = self._names.labels.get(("host", norm)) or self._names.labels.get(("host", short))
        if found:
            return found
        label = self._names.get("host", norm)
        if short != norm and len(short) >= 3:
            self._names.set("host", short, label)
        # Hunted elsewhere only when it cannot be a word: gpu-node-7, node017, box.corp.example.com
        # (not "cache", nor "self.host", whose first label would be hunted too).
        if learn and len(name) >= 4 and (re.search(r"[\d-]", name.split(".")[0]) or name.count(".") >= 2):
            self._found.append(("host", name))
        return label

    @staticmethod
    def keeps_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, original: str) -> bool:
        """Addresses that are diagnostic, not identifying: loopback, any-address, netmasks."""
        if ip.is_loopback or ip.is_unspecified or original in _KEEP_IPS:
            return True
        return isinstance(ip, ipaddress.IPv4Address) and _is_netmask(ip)

    def ip_label(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, original: str) -> str:
        if self.keeps_ip(ip, original):
            return original
        return self._names.get("ip", ip.compressed)

    def _add_user(self, name: str) -> None:
        name = (name or "").strip()
        if len(name) < 3 or name.lower() in _GENERIC_NAMES or name in self.users or not re.fullmatch(r"[\w.@-]{3,64}", name):
            return
        self.users.append(name)
        self._memo.clear()
        self._names.set("user", name, "<user>")
        e = re.escape(name)
        # As a path component always; as a word anywhere when it cannot be an ordinary word.
        self._user_res.append((name, re.compile(rf"(?<=[/\\]){e}(?=[/\\]|(?![\w.-])|\Z)")))
        if len(name) >= 4:
            self._user_res.append((name, re.compile(rf"(?<![A-Za-z0-9]){e}(?![A-Za-z0-9])")))

    # -- strings -----------------------------------------------------------------------------------

    def text(self, value: str, *, versions: bool = False) -> str:
        """`value` with every form in the module docstring replaced. `versions=True` (a value
        under a version key) keeps dotted quads, which are versions there, not addresses."""
        if not value:
            return value
        memo_key = (value, versions)
        known = self._memo.get(memo_key)
        if known is not None:
            return known
        low = value.lower()
        spans = self._find(value, low, versions)
        s = apply(value, resolve(spans))
        if self._learn_found():
            # The values just found by their context, where this text shows them without it.
            more = self._known_spans(value)
            if more:
                s = apply(value, resolve(spans + more))
        if len(value) <= _MEMO_LENGTH:
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[memo_key] = s
        return s

    def learn_text(self, value: str) -> None:
        """Learn the secrets `value` shows by their context (`DB_PASSWORD=hunter2`), so that a text
        redacted later hides them where it shows them bare."""
        if value:
            for span in self._find(value, value.lower(), False):
                if span.rank <= RANK_SECRET:
                    span.render()
            self._learn_found()

    def _find(self, s: str, low: str, versions: bool) -> list[Span]:
        """Every span every detector proposes on `s` (overlapping; `resolve` decides)."""
        spans = redact_secrets.key_blocks(self, s)
        spans += self._known_spans(s)
        secrets = redact_secrets.forms(self, s) + redact_secrets.named(self, s, low)
        spans += secrets
        if len(s) >= 40:
            spans += redact_secrets.aws_secrets(self, s, secrets)
        if s.count(":") >= 4:
            spans += redact_secrets.pgpass_lines(self, s)
        spans += redact_machines.home(self, s)
        spans += redact_machines.identity(self, s, low)
        spans += redact_machines.machines(self, s, low, versions=versions)
        return spans

    def _known_spans(self, s: str) -> list[Span]:
        """The values this redactor knows: learned secrets, named identities, the user's names."""
        out: list[Span] = []
        secrets = len(self._secrets) + len(self._short)
        if secrets and (secrets > 64 or any(v in s for v in self._secrets) or any(v in s for v in self._short)):
            if self._secret_re is None:
                alts = [re.escape(v) for v in sorted(self._secrets, key=len, reverse=True)]
                if self._short:
                    words = "|".join(re.escape(v) for v in sorted(self._short, key=len, reverse=True))
                    alts.append(rf"(?<![A-Za-z0-9])(?:{words})(?![A-Za-z0-9])")
                self._secret_re = re.compile("|".join(alts))
            out += (Span(m.start(), m.end(), RANK_SECRET, self.secret_render(m.group()), 1)
                    for m in self._secret_re.finditer(s))
        if self._literals and (len(self._literals) > 64 or any(v in s for v in self._literals)):
            if self._literal_re is None:
                alts = trie(tuple(self._literals))  # 1,000 node names: one branch per character
                # Whole names between non-alphanumerics: "-" and "_" join a host name to other
                # words in file names (srun's scan-%N.json, run_gpu07_log), so they end one here.
                self._literal_re = re.compile(rf"(?<![A-Za-z0-9])(?:{alts})(?![A-Za-z0-9])")
            for m in self._literal_re.finditer(s):
                kind, label = self._literals[m.group()]
                out.append(Span(m.start(), m.end(), _LITERAL_RANKS.get(kind, RANK_IDENTITY), lambda label=label: label, 1))
        for name, pattern in self._user_res:
            if name in s:
                out += (Span(m.start(), m.end(), RANK_NAME, lambda: "<user>") for m in pattern.finditer(s))
        return out

    def _learn_found(self) -> bool:
        """Make the values redacted by context literal secrets; True when there were any."""
        if not self._found:
            return False
        found, self._found = self._found, []
        self._learned += len(found)
        for kind, value in found:
            if kind == "secret":
                if _huntable(value):
                    self.learn_secret(value, short=True)
            elif kind == "host":
                if value not in self._literals:
                    self.alias("host", value, self.host_label(value))
            else:
                self.alias(kind, value, self._names.get(kind, self._norm(kind, value)))
        return True

    # -- structures --------------------------------------------------------------------------------

    def value(self, value: Any, key: str | None = None) -> Any:
        """A redacted copy of a JSON-like value; `key` is the dict key it was found under."""
        if key is not None:
            kind = _KEY_KINDS.get(key)
            if kind is None:
                kind = _key_kind(key)
            if kind is not _PLAIN and kind is not _VERSION:
                special = self._keyed(value, key, kind)
                if special is not _NOT_SPECIAL:
                    return special
        else:
            kind = _PLAIN
        # By exact type first (the common case of a fleet's 60,000 values), then as before.
        t = type(value)
        if t is str:
            return self.text(value, versions=kind is _VERSION)
        if t is dict:
            keys = self._key_text
            return {keys(k): self.value(v, k if type(k) is str else str(k)) for k, v in value.items()}
        if t is list:
            return [self.value(v) for v in value]
        if t is int or t is float or t is bool or value is None:
            return value
        if isinstance(value, str):
            return self.text(value, versions=kind is _VERSION)
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value

    def _key_text(self, key: Any) -> str:
        """A dict key, redacted (keys repeat: the memo of `text` answers most)."""
        key = key if type(key) is str else str(key)
        known = self._memo.get((key, False))
        return known if known is not None else self.text(key)

    def _keyed(self, value: Any, key: str, kind: int) -> Any:
        """What a key that says what its value is (a secret, a host, an identity) makes of it, or
        _NOT_SPECIAL when the value is redacted as any other."""
        if kind == _SECRET:
            if value not in (None, True, False, ""):
                if isinstance(value, (dict, list, tuple)):
                    return self._mask_leaves(value)
                return self.pseudonym("secret", str(value))
            return _NOT_SPECIAL
        if kind == _HOST:
            # hostname, MASTER_ADDR, NCCL_COMM_ID, node_list; every value of a dict under one:
            # {"hostname": {"name": ..., "node_list": ...}}
            if isinstance(value, (dict, list, tuple)):
                return self._host_leaves(value, key)
            if isinstance(value, str) and value.strip():
                return self._host_string(value, key)
            return _NOT_SPECIAL
        identity = IDENTITY_KEYS[key.lower()]
        if isinstance(value, str) and value.strip():
            if identity == "uuid" and _UUID.search(value):
                return self.text(value)  # GPU-<uuid-1>, the same as in the text around it
            return self.pseudonym(identity, value)
        return _NOT_SPECIAL

    def _host_string(self, value: str, key: str) -> str:
        """A string that a key says is a host (or a host list, an address with a port): this
        machine is `<host>` even under a generic name, a known node its alias, other names and
        addresses their placeholders; a generic word (localhost) and loopback stay."""
        name = value.strip()
        found = self._names.labels.get(("host", name.lower().rstrip(".")))
        if found is not None or name in self._labels:
            return found or name
        hit = redact_machines.host_value(self, value, 0, nodelist="list" in key.lower())
        if hit is not None:
            value = value[:hit[0]] + hit[2]() + value[hit[1]:]
        return self.text(value)

    def _host_leaves(self, value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {self.text(str(k)): self._host_leaves(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._host_leaves(v, key) for v in value]
        if isinstance(value, str) and value.strip():
            return self._host_string(value, key)
        return value

    def _mask_leaves(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {self.text(str(k)): self._mask_leaves(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._mask_leaves(v) for v in value]
        return value if value in (None, True, False, "") else self.pseudonym("secret", str(value))

    def learn(self, value: Any, key: str | None = None) -> None:
        """Walk a JSON-like value and learn the secrets held under secret-named keys, so that the
        same values are redacted wherever else they appear."""
        if key is not None and is_secret_name(key) and isinstance(value, str):
            self.learn_secret(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                self.learn(v, str(k))
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.learn(v)

    def report(self, data: dict[str, Any]) -> dict[str, Any]:
        """A redacted deep copy of a report dict; see `redact_report`."""
        # `value` builds new containers and never changes its input: only the environment,
        # whose variables are filtered, needs copies (no deep copy of a 1,000-node fleet report).
        out = dict(data)
        env = out.get("environment")
        if isinstance(env, dict) and isinstance(env.get("env_vars"), dict):
            # Filter by the allow-list first: a report built elsewhere may carry more variables.
            out["environment"] = {**env, "env_vars": {k: v for k, v in env["env_vars"].items() if allowed_env_name(k)}}
        self.learn(data)
        self._learn_found()
        learned = self._learned
        first = self.value(out)
        self._learn_found()
        # A value redacted by its context in one string may appear bare in a string walked before
        # (or in a piece of it: an evidence line, an argv word): walk again with what was learned.
        # The pseudonyms are the same the second time.
        out = self.value(out) if self._learned != learned else first
        if "redacted" in out:
            out["redacted"] = True
        return out


    # -- streams -----------------------------------------------------------------------------------

    def stream(self, max_line: int = 1 << 20) -> StreamRedactor:
        """A line-by-line redactor for a program's output that shares this redactor's names."""
        return StreamRedactor(self, max_line)

    def lines(self, lines: Iterable[str]) -> Iterator[str]:
        """Redacted text for an iterable of text pieces (lines or arbitrary chunks)."""
        stream = self.stream()
        for piece in lines:
            out = stream.feed(piece)
            if out:
                yield out
        rest = stream.flush()
        if rest:
            yield rest


# What a dict key says of its value, in the order `Redactor.value` asks: a secret, a host, an
# identity, a version (dotted quads kept), anything else. A pure function of the key, remembered.
_PLAIN, _SECRET, _HOST, _IDENTITY, _VERSION = 0, 1, 2, 3, 4
_KEY_KINDS: dict[str, int] = {}
_NOT_SPECIAL = object()


def _key_kind(key: str) -> int:
    if is_secret_name(key):
        kind = _SECRET
    elif _is_host_name(key):
        kind = _HOST
    elif IDENTITY_KEYS.get(key.lower()) is not None:
        kind = _IDENTITY
    elif "version" in key.lower():
        kind = _VERSION
    else:
        kind = _PLAIN
    if len(_KEY_KINDS) < 4096:
        _KEY_KINDS[key] = kind
    return kind


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


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                value = f.read(64).strip()
        except OSError:
            continue
        if re.fullmatch(r"[0-9a-fA-F]{32}", value):
            return value
    return ""


def redact_report(data: dict[str, Any], redactor: Redactor | None = None) -> dict[str, Any]:
    """A scrubbed deep copy of a report dict (see the module docstring); marks it `redacted`.
    Environment variables outside the allow-list are dropped; values under secret-named keys
    become `<secret-N>`; identity keys (hostname, user, uuid, serial, mac, ip) become their kind's
    pseudonym; every string is scrubbed with `Redactor.text`."""
    return (redactor or Redactor()).report(data)


def redact(report: Any, redactor: Redactor | None = None) -> Any:
    """`redact_report` for a `Report` object: returns a new, redacted `Report`."""
    from gpudoctor.reports.model import report_from_dict

    return report_from_dict(redact_report(report.to_dict(), redactor))
