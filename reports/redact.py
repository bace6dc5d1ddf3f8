"""Redaction: what a report or a program's output must not carry into a public bug ticket.

One `Redactor` is built per report (or per bundle): it knows this machine's identity (home, user
names, host name, machine id, secrets held in secret-named environment variables) and hands out
stable pseudonyms, so that the same secret, host, address or user gets the same placeholder
everywhere in that report (`<host-2>` on two lines is one machine). docs/reports.md's "What is
redacted" table lists every form; in short:

- secrets, by name: a value whose key, variable or flag is secret-like (`HF_TOKEN=...`,
  `'WANDB_API_KEY': '...'`, `"password": "..."`, `--token X`, `--api-key=X`, `Authorization:
  Bearer ...`, `secret key: ...`), and the same value wherever else it appears;
- secrets, by form: credentials in URLs (including an empty user, `redis://:pw@host`), GitHub,
  GitLab, Hugging Face, OpenAI/Anthropic, Stripe, Slack, Google, npm, PyPI and AWS tokens, JWTs,
  private key blocks, signed-URL signatures;
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
hashes, CUDA pointers (`0x7f...`), tensor shapes, PCI bus ids, public index hosts in URLs, and
paths, whatever folders they run through (mktemp's `/tmp/tmp.6xjVbbjJMQ`, pytest's `tmp_path`, Ray
sessions, Hugging Face snapshots `models--org--name/snapshots/<40-hex>/`, container overlays).

Evidence before masking: a form that ordinary text also has is hidden only with context that
makes it a secret or a host. A 40-character AWS-secret-shaped run must be a whole word on a line
that says secret (never a piece of a path); "key" alone (a cache key, a state-dict key) needs a
qualifier or a credential-shaped value; a name that may mean something else (`token`, `CACHE_KEY`,
`node`, `host`, `server`) takes only a credential- or host-shaped value; a value that is a
program's expression (`token = kwargs.pop(...)`, `node: torch.fx.Node`, `hostname =
socket.gethostname()`) is no value at all. The same holds for hunting a found value through the
rest of the report: only what cannot be a word or a program's name is hunted (the precision corpus
in tests/precision_corpus.py is what this must leave unchanged).

Every pattern is linear in the length of its input: quantifiers are bounded, unbounded runs start
only at run boundaries, and values after a secret-like name are consumed by plain string code, not
by backtracking.

Interfaces for the other commands:
- `Redactor.text(s)`, `Redactor.value(obj)`, `Redactor.report(dict)` (= `redact_report`);
- `Redactor.alias(kind, value, label)`: name a known identity, e.g. the fleet merge names each
  node's host `node-0`, `node-1` before redacting the merged report;
- `Redactor.stream()`: a `StreamRedactor` whose `feed(text)` returns the redacted complete lines
  and keeps a bounded partial line (a child program's output, line by line), `flush()` the rest.

The rule tables (names, patterns, evidence tests) live in gpudoctor.reports.redact_rules; this
module is the engine. It stays above 800 lines because `Redactor` is one pass over a text whose
steps share one pseudonym table and one set of learned values: the order of the steps is the
design, and it reads best in one place.

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
from gpudoctor.reports.redact_rules import (  # noqa: F401 (is_secret_name, IDENTITY_KEYS: public here)
    _AMBIGUOUS_SUFFIXES, _any, _AWS_HOSTNAME, _AWS_SECRET, _BARE_VALUE, _BEARER, _BEARER_VALUE,
    _BRACKET_HOST, _CODE_RECEIVERS, _code_value, _COLUMN_BEFORE, _CONNECT_HOST,
    _credential_like, _credential_shaped, _EMAIL, _FILE_SUFFIXES, _FLAG, _GENERIC_HOME_NAMES,
    _GENERIC_NAMES, _GENERIC_URL_USERS, _has_letter_and_digit, _HEX32, _HOMES, _HOST_ANCHOR,
    _HOST_TLDS, _HOST_WORDS, _HOSTNAME, _huntable, _identifier_start, IDENTITY_KEYS,
    _INTERNAL_FQDN, _INTERNAL_SUFFIXES, _IPV4, _IPV6, _IPV6_RUN, _is_host_name, _is_ip,
    _is_netmask, is_secret_name, _KEEP_IPS, _KV_ANCHOR, _KV_WORDS, _LIMIT, _LINE_VALUE,
    _LOG_LEVEL, _LOOSE, _LOOSE_VALUE, _LOOSE_WORDS, _MAC, _MACHINE_ID, _mixed_case_and_digit,
    _name_before, _names_a_secret, _NCCL_PREFIX, _NETRC, _NODELIST, _NOT_HOST_WORDS,
    _pem_body_start, _PEM_END, _PEM_LAST_LINE, _PEM_MARKER, _PEM_SPLIT, _plausible_secret,
    _public_host, _QUERY, _QUERY_VALUE, _RDZV_URL, _REVISION, _SECRET_CONTEXT, _secret_level,
    _secret_shaped, _SEP, _SERIAL, _SERIAL_VALUE, _skip_string_prefix, _TOKEN_FORMATS,
    _URL_USERINFO, _USER_AT_HOST, _UUID, _version_before, _WANDB_LOGIN, _WEBHOOK, _WORD_VALUE,
)

MASK = "<redacted>"  # a whole value hidden without a pseudonym (for callers that need one)

_MAX_PSEUDONYMS = 10_000  # per kind; beyond it, the unnumbered <kind> (bounded memory)
_MIN_LEARNED = 8  # a secret shorter than this is hidden where it is found, not hunted elsewhere
_MEMO_ENTRIES = 1 << 16  # `Redactor.text` results remembered (a fleet report repeats "GPU 3" 1,000 times)
_MEMO_LENGTH = 1024  # longer strings (log text) are rarely repeated: not remembered
# Kinds whose values, once found by their context, are hidden wherever else they appear verbatim.
_LEARNED_KINDS = frozenset({"secret", "machine-id", "serial"})

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


_FOLDED: dict[re.Pattern[str], re.Pattern[str]] = {}


def _folded(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """The case-sensitive twin of a `(?i)` pattern written in lower case: run on `text.lower()` it
    finds the same matches about ten times faster (sre's case folding is slow on alternations)."""
    twin = _FOLDED.get(pattern)
    if twin is None:
        twin = _FOLDED[pattern] = re.compile(pattern.pattern.replace("(?i)", "", 1))
    return twin


def _rewrite(text: str, anchor: re.Pattern[str], handler: Callable[[re.Match[str], str], tuple[int, int, str] | None]) -> str:
    """Replace spans chosen by `handler(match, text) -> (start, end, replacement) | None` for each
    anchor match, left to right, never overlapping: anchors inside a replaced span are skipped.
    A case-insensitive anchor runs on the lowered text where lowering keeps every offset (ASCII);
    the handler then sees the match's positions and lower-case groups."""
    out: list[str] = []
    pos = 0
    matches = (
        _folded(anchor).finditer(text.lower())
        if anchor.flags & re.IGNORECASE and anchor.pattern.startswith("(?i)") and text.isascii()
        else anchor.finditer(text)
    )
    for m in matches:
        if m.start() < pos:
            continue
        hit = handler(m, text)
        if hit is None:
            continue
        start, end, repl = hit
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(repl)
        pos = end
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _quoted_value(text: str, i: int) -> tuple[int, int] | None:
    """(start, end) of the content of the quoted string opening at text[i], on one line, bounded."""
    quote = text[i]
    j = i + 1
    stop = min(len(text), j + _LIMIT)
    while j < stop:
        k = text.find(quote, j, stop)
        nl = text.find("\n", j, k if k >= 0 else stop)
        if k < 0 or nl >= 0:
            return None
        backslashes = 0
        while k - 1 - backslashes >= i + 1 and text[k - 1 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return (i + 1, k)
        j = k + 1
    return None


def _value_span(text: str, i: int, *, line: bool = False) -> tuple[int, int] | None:
    """The value that starts at text[i]: the inside of a quoted string, else a bare word (or the
    rest of the line when `line`)."""
    if i >= len(text):
        return None
    if text[i] in "'\"":
        span = _quoted_value(text, i)
        if span is not None:
            return span if span[1] > span[0] else None
        i += 1
    m = (_LINE_VALUE if line else _BARE_VALUE).match(text, i)
    return (m.start(), m.end()) if m else None


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
        self._names = _Pseudonyms()
        self._secrets: set[str] = set()
        self._literals: dict[str, tuple[str, str]] = {}  # exact text -> (kind, label)
        self._literal_re: re.Pattern[str] | None = None
        self._secret_re: re.Pattern[str] | None = None
        self._users: list[str] = []
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
            self._host_label(master)

        mid = machine_id if machine_id is not None else _machine_id()
        if mid:
            self.alias("machine-id", mid, "<machine-id>")
        for name, value in environ.items():
            if is_secret_name(name):
                self.learn_secret(value)

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

    def learn_secret(self, value: str) -> None:
        """Redact `value` wherever it appears verbatim (a password from the environment)."""
        value = value.strip() if isinstance(value, str) else ""
        if len(value) < _MIN_LEARNED or len(value) > 1024 or len(set(value)) < 4 or not _plausible_secret(value):
            return
        if value not in self._secrets and len(self._secrets) < 1000:
            self._secrets.add(value)
            self._secret_re = None
            self._memo.clear()

    def pseudonym(self, kind: str, value: str) -> str:
        """The placeholder of `value` of `kind` (secret, host, ip, mac, user, email, uuid, serial,
        machine-id), the same one for the same value throughout this redactor's life."""
        if kind == "host":
            return self._host_label(value)
        if kind == "ip" and _is_ip(value.strip()):
            return self._ip_label(_is_ip(value.strip()), value.strip())  # type: ignore[arg-type]
        label = self._names.get(kind, self._norm(kind, value))
        if kind in _LEARNED_KINDS and len(value) >= _MIN_LEARNED and value not in self._secrets and value not in self._literals:
            self._found.append((kind, value))
        return label

    @staticmethod
    def _norm(kind: str, value: str) -> str:
        if kind in ("host", "mac", "uuid", "machine-id", "email"):
            return value.lower().rstrip(".").replace("-", ":") if kind == "mac" else value.lower().rstrip(".")
        if kind == "ip":
            ip = _is_ip(value)
            return ip.compressed if ip else value
        return value

    def _host_label(self, name: str, *, learn: bool = True) -> str:
        if name in self._labels:
            return name
        ip = _is_ip(name)
        if ip is not None:
            return self._ip_label(ip, name)
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

    def _ip_label(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, original: str) -> str:
        if ip.is_loopback or ip.is_unspecified or original in _KEEP_IPS:
            return original
        if isinstance(ip, ipaddress.IPv4Address) and _is_netmask(ip):
            return original
        return self._names.get("ip", ip.compressed)

    def _add_user(self, name: str) -> None:
        name = (name or "").strip()
        if len(name) < 3 or name.lower() in _GENERIC_NAMES or name in self._users or not re.fullmatch(r"[\w.@-]{3,64}", name):
            return
        self._users.append(name)
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
        s = self._home(value)
        # Each pass runs only when its keywords occur: a plain log line costs a few substring
        # searches, not thirty regex scans. `low` may hold words the passes have since removed
        # (an extra pass, never a missed one).
        low = s.lower()
        s = self._pem(s)
        s = self._known(s)
        s = self._secrets_by_form(s)
        s = self._secrets_by_name(s, low)
        s = self._identity(s, low)
        s = self._machines(s, low, versions=versions)
        if self._learn_found():
            s = self._known(s)  # the same values where they appeared without their context
        if len(value) <= _MEMO_LENGTH:
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[memo_key] = s
        return s

    def _learn_found(self) -> bool:
        """Make the values redacted by context literal secrets; True when there were any."""
        if not self._found:
            return False
        found, self._found = self._found, []
        self._learned += len(found)
        for kind, value in found:
            if kind == "secret":
                if _huntable(value):
                    self.learn_secret(value)
            elif kind == "host":
                if value not in self._literals:
                    self.alias("host", value, self._host_label(value))
            else:
                self.alias(kind, value, self._names.get(kind, self._norm(kind, value)))
        return True

    def _pem(self, s: str) -> str:
        if "PRIVATE KEY-----" not in s:
            return s
        out: list[str] = []
        pos = 0
        begin_at: int | None = None
        for m in _PEM_MARKER.finditer(s):
            if m.group(1) == "BEGIN":
                if begin_at is None:
                    begin_at = m.start()
            elif begin_at is not None:
                out += [s[pos:begin_at], self._key_block(s[begin_at:m.end()])]
                pos, begin_at = m.end(), None
            else:
                # The text starts inside a key (a cut log): hide the body lines before END.
                start = _pem_body_start(s, pos, m.start())
                out += [s[pos:start], self._key_block(s[start:m.end()])]
                pos = m.end()
        if begin_at is not None:  # no END: hide everything after BEGIN
            out += [s[pos:begin_at], self._key_block(s[begin_at:])]
            pos = len(s)
        out.append(s[pos:])
        return "".join(out)

    def _key_block(self, block: str) -> str:
        """The placeholder of a private key block; its body lines are learned as secrets with the
        same placeholder, so that a line of it shown on its own (a log split into evidence lines)
        is hidden too."""
        label = self.pseudonym("private-key", block)
        for line in _PEM_SPLIT.split(_PEM_MARKER.sub("\n", block)):
            line = line.strip()
            if len(line) >= 16 and line not in self._secrets:
                self._names.set("secret", line, label)
                self._found.append(("secret", line))
        return label

    def _known(self, s: str) -> str:
        if self._secrets and (len(self._secrets) > 64 or any(v in s for v in self._secrets)):
            if self._secret_re is None:
                self._secret_re = re.compile("|".join(re.escape(v) for v in sorted(self._secrets, key=len, reverse=True)))
            s = self._secret_re.sub(lambda m: self.pseudonym("secret", m.group()), s)
        if self._literals and (len(self._literals) > 64 or any(v in s for v in self._literals)):
            if self._literal_re is None:
                alts = "|".join(re.escape(v) for v in sorted(self._literals, key=len, reverse=True))
                # Whole names between non-alphanumerics: "-" and "_" join a host name to other
                # words in file names (srun's scan-%N.json, run_gpu07_log), so they end one here.
                self._literal_re = re.compile(rf"(?<![A-Za-z0-9])(?:{alts})(?![A-Za-z0-9])")
            s = self._literal_re.sub(lambda m: self._literals[m.group()][1], s)
        for name, pattern in self._user_res:
            if name in s:
                s = pattern.sub("<user>", s)
        return s

    def _secrets_by_form(self, s: str) -> str:
        if "://" in s:
            def userinfo(m: re.Match[str]) -> str:
                info = m.group(2)
                if info.startswith("<") or (":" not in info and info.lower() in _GENERIC_URL_USERS):
                    return m.group()
                return m.group(1) + self.pseudonym("secret", info) + "@"
            s = _URL_USERINFO.sub(userinfo, s)
        for prefixes, pattern in _TOKEN_FORMATS:
            if any(p in s for p in prefixes):
                s = pattern.sub(lambda m: self.pseudonym("secret", m.group()), s)
        if "hooks" in s:
            s = _WEBHOOK.sub(lambda m: m.group(1) + self.pseudonym("secret", m.group(2)), s)
        s = _AWS_SECRET.sub(self._aws_secret, s)
        return s

    def _aws_secret(self, m: re.Match[str]) -> str:
        s, start = m.string, m.start()
        line = s.rfind("\n", max(0, start - 256), start) + 1
        if not _SECRET_CONTEXT.search(s[max(line, start - 256):start].lower()):
            return m.group()  # the form alone: a file name, a digest, a run id
        return self.pseudonym("secret", m.group())

    def _mask_from(
        self, text: str, i: int, *, line: bool = False, pattern: re.Pattern[str] | None = None,
        check: Callable[[str], bool] | None = None,
    ) -> tuple[int, int, str] | None:
        if pattern is not None:
            m = pattern.match(text, i)
            span = (m.start(), m.end()) if m else None
        else:
            span = _value_span(text, i, line=line)
            if span is not None and span[0] == i and _code_value(text, span[0], span[1]):
                return None  # unquoted and a program's expression: `token = kwargs.pop(...)`
        if span is None:
            return None
        value = text[span[0]:span[1]]
        if not _plausible_secret(value) or (check is not None and not check(value)):
            return None
        return (span[0], span[1], self.pseudonym("secret", value))

    def _weak_secret(self, text: str, i: int) -> tuple[int, int, str] | None:
        """The value at text[i] after a name that may mean a secret (token, CACHE_KEY): hidden, and
        hunted elsewhere, when it looks like a credential (`token="charturnerv2"` is a
        textual-inversion token, and ./charturnerv2.pt its file)."""
        span = _value_span(text, i)
        if span is None or span[0] == i and _code_value(text, span[0], span[1]):
            return None
        value = text[span[0]:span[1]]
        if not _plausible_secret(value) or not _secret_shaped(value):
            return None
        return (span[0], span[1], self.pseudonym("secret", value))

    def _secrets_by_name(self, s: str, low: str) -> str:
        def key_value(m: re.Match[str], text: str) -> tuple[int, int, str] | None:
            name = _name_before(text, m.end())
            sep = _SEP.match(text, m.end())
            i = sep.end() if sep else m.end()
            start = _identifier_start(text, m.end())
            if "." in name and _LOG_LEVEL.search(text, max(0, start - 9), start):
                return None  # a logger's name: "WARNING:huggingface_hub.utils._auth:..."
            if sep and sep.group().startswith("]"):
                return None  # `d[storage_key] = x`: a variable used as an index, not a key's value
            level = _secret_level(name)
            if level == 0:
                # A bare `key=` (wandb.login(key=...)) or "key": "..." holds a secret when its
                # value looks like one; "for key: <cache key>" or `cache_key=` does not say so.
                if name.lower() == "key" and sep and ("=" in sep.group() or text[i:i + 1] in ("'", '"')):
                    return self._mask_from(text, i, check=_credential_shaped)
                return None
            j = _skip_string_prefix(text, i)
            if j > i and "f" in text[i:j].lower():
                span = _value_span(text, j)
                if span and "{" in text[span[0]:span[1]]:
                    return None  # an f-string: a template, filled in by the program
            i = j
            if level == 1:
                return self._weak_secret(text, i)
            word = m.group().lower()
            if word == "authorization":
                scheme = re.compile(r"(?i)(?:bearer|basic|token|digest|negotiate|apikey|aws4-hmac-sha256)[ \t]{1,4}").match(text, i)
                if scheme:
                    i = scheme.end()
            return self._mask_from(text, i, line=word == "cookie", check=lambda v: v.lower() != name.lower() and not _names_a_secret(v))

        def flag(m: re.Match[str], text: str) -> tuple[int, int, str] | None:
            level = _secret_level(m.group(1))
            if level == 0:
                return None
            if level == 1:  # "Pass --token for a non-interactive login."
                return self._weak_secret(text, m.end())
            return self._mask_from(text, m.end(), check=lambda v: v.lower().replace("-", "_") != m.group(1).lower().replace("-", "_"))

        def after(
            pattern: re.Pattern[str] | None = None, check: Callable[[str], bool] | None = None
        ) -> Callable[[re.Match[str], str], tuple[int, int, str] | None]:
            return lambda m, text: self._mask_from(text, m.end(), pattern=pattern, check=check)

        if _any(low, _KV_WORDS):
            s = _rewrite(s, _KV_ANCHOR, key_value)
        if "--" in s or " -" in s:
            s = _rewrite(s, _FLAG, flag)
        if "bearer" in low or "basic" in low:
            s = _rewrite(s, _BEARER, after(_BEARER_VALUE, _credential_like))
        def loose(m: re.Match[str], text: str) -> tuple[int, int, str] | None:
            check = _has_letter_and_digit
            if m.group(1) == "key" and not is_secret_name(_name_before(text, m.end(1))):
                # "cache hit for key fatexag6p..." (lower case, a digest): a key, not a secret
                # one; "the key is Rk9PQkFS..." (upper, lower and digits) is one.
                check = _mixed_case_and_digit
            return self._mask_from(text, m.end(), pattern=_LOOSE_VALUE, check=check)

        if _any(low, _LOOSE_WORDS):
            s = _rewrite(s, _LOOSE, loose)
        if "=" in s and ("?" in s or "&" in s):
            s = _rewrite(s, _QUERY, after(_QUERY_VALUE))
        if "login" in low:
            s = _rewrite(s, _NETRC, after())
            s = _rewrite(s, _WANDB_LOGIN, after(_WORD_VALUE))
        return s

    def _home(self, s: str) -> str:
        if self.home and len(self.home) > 1 and self.home in s:
            s = re.sub(rf"{re.escape(self.home)}(?=[/\\]|(?![\w.-]))", "~", s)
        return s

    def _identity(self, s: str, low: str) -> str:
        if _any(low, ("/home/", "/users/", "\\users\\", ":/users/")):
            s = _HOMES.sub(self._home_sub, s)
        if "@" in s:
            s = _EMAIL.sub(self._email, s)
            s = _USER_AT_HOST.sub(self._user_at_host, s)
        return s

    def _home_sub(self, m: re.Match[str]) -> str:
        prefix = m.group(1) or m.group(2)
        name = m.group(3)
        if name.startswith("<") or name.lower() in _GENERIC_HOME_NAMES:
            return m.group()
        return prefix + self.pseudonym("user", name)

    def _user_at_host(self, m: re.Match[str]) -> str:
        user, host = m.group(1), m.group(2)
        if (_public_host(host) or not re.search(r"[A-Za-z]", host) and not _is_ip(host) or _REVISION.fullmatch(host)
                or host.split(".", 1)[0] in _CODE_RECEIVERS):
            return m.group()  # a revision (repo@<commit>), a matmul (h@self.proj.weight)
        user_label = user if user.lower() in _GENERIC_NAMES or user.startswith("<") else self.pseudonym("user", user)
        return f"{user_label}@{host if host.startswith('<') else self._host_label(host)}"

    def _email(self, m: re.Match[str]) -> str:
        local, domain = m.group(1), m.group(2)
        tld = domain.rsplit(".", 1)[-1]
        if (not tld.isalpha() or len(tld) < 2 or local.lower() in _GENERIC_URL_USERS or tld.lower() in _FILE_SUFFIXES
                or domain.split(".", 1)[0] in _CODE_RECEIVERS):
            return m.group()  # file.zip@member.pkl, model@2.safetensors, h@self.proj.weight (a matmul)
        return self.pseudonym("email", m.group())

    def _host_value(
        self, text: str, i: int, *, nodelist: bool = False, prose: bool = False, weak: bool = False,
    ) -> tuple[int, int, str] | None:
        """The host (or address, or node list) that starts at text[i], after a host context.
        `prose` ("connect to X") and `weak` (a generic name: host, node, server, peer, address)
        take a name only with a digit or a hyphen, or a dotted name under a known top-level
        domain: `node: torch.fx.Node` and `host = self.host` are a program's words."""
        quoted = i < len(text) and text[i] in "'\""
        if i < len(text) and text[i] in "'\"[(":
            i += 1
        v6 = _IPV6_RUN.match(text, i)
        if v6 and ":" in v6.group() and isinstance(_is_ip(v6.group()), ipaddress.IPv6Address):
            # [fe80::1%eth0]:29500 (NCCL_COMM_ID, MASTER_ADDR): an address, not a host "fe80"
            return (v6.start(), v6.end(), self._ip_label(_is_ip(v6.group()), v6.group()))  # type: ignore[arg-type]
        m = (_NODELIST if nodelist else _HOSTNAME).match(text, i)
        if not m:
            return None
        name = m.group().rstrip(".")
        end = m.start() + len(name)
        if end < len(text) and text[end] in "_(" or not nodelist and text[end:end + 1] == "[":
            return None  # a name in a program: socket.gethostname(), args.master_addr, Optional[str]
        if not quoted and len(name) <= 2 and text[end:end + 1] in ("'", '"'):
            return None  # a string prefix: f"{master_addr}:{port}"
        if nodelist:
            # gpu[001-004,007], node01,node02; not `Sequence[BaseSchedulerNode]`
            return (m.start(), end, self._host_label(name)) if re.search(r"[A-Za-z]", name) and re.search(r"\d", name) else None
        if _is_ip(name):
            return (m.start(), end, self._ip_label(_is_ip(name), name))  # type: ignore[arg-type]
        if (
            not re.search(r"[A-Za-z]", name)
            or name.lower().startswith("0x")
            or name.lower() in _GENERIC_NAMES
            or name.lower() in _NOT_HOST_WORDS
            or (not quoted and _code_value(text, m.start(), end))
            or (prose and not re.search(r"[\d.-]", name))  # "connect to gpunode" reads as English
            or (weak and not re.search(r"[\d-]", name) and name.rsplit(".", 1)[-1].lower() not in _HOST_TLDS)
            # `node = obs0`, `outer_node=node1)`: a program's variable
            or (weak and not quoted and re.fullmatch(r"[\w.]+", name) is not None
                and (text.endswith((" = ", " := "), 0, i) or re.match(r"[ \t]*[,)]", text[end:end + 8]) is not None))
            or _public_host(name)
        ):
            return None
        # Under a generic name (node: Conv2) a name is hidden there, not hunted all over the report.
        return (m.start(), end, self._host_label(name, learn=not weak or "-" in name or name.count(".") >= 2))

    def _machines(self, s: str, low: str, *, versions: bool) -> str:
        def host_kv(m: re.Match[str], text: str) -> tuple[int, int, str] | None:
            name = _name_before(text, m.end())
            if not _is_host_name(name):
                return None
            start = _identifier_start(text, m.end())
            if "." in name and _LOG_LEVEL.search(text, max(0, start - 9), start):
                return None  # a logger's name: "WARNING:urllib3.util.ssl_match_hostname:..."
            sep = _SEP.match(text, m.end())
            weak = not name.isupper() and not _is_host_name(name, strong=True)
            return self._host_value(text, sep.end() if sep else m.end(), nodelist="list" in name.lower(), weak=weak)

        def host_flag(m: re.Match[str], text: str) -> tuple[int, int, str] | None:
            if not _is_host_name(m.group(1)):
                return None
            return self._host_value(text, m.end())

        if _any(low, _HOST_WORDS):
            s = _rewrite(s, _HOST_ANCHOR, host_kv)
        if "--" in s or " -" in s:
            s = _rewrite(s, _FLAG, host_flag)
        if "]:" in s:
            s = _BRACKET_HOST.sub(lambda m: f"[{self._host_or_keep(m.group(1))}]:", s)
        if _any(low, ("connect", "listen", "bind", "bound", "reach")):
            s = _rewrite(s, _CONNECT_HOST, lambda m, text: self._host_value(text, m.end(), prose=True))
        if "://" in s:
            s = _rewrite(s, _RDZV_URL, lambda m, text: self._host_value(text, m.end()))
        if "NCCL" in s:
            s = _NCCL_PREFIX.sub(lambda m: self._host_or_keep(m.group(1)) + m.group()[len(m.group(1)):], s)
        if _any(low, _INTERNAL_SUFFIXES):
            s = _INTERNAL_FQDN.sub(self._internal_fqdn, s)
        if "ip-" in s:
            s = _AWS_HOSTNAME.sub(lambda m: self._host_label(m.group()), s)
        if "machine" in low:
            s = _rewrite(s, _MACHINE_ID, lambda m, text: self._mask_kind(text, m.end(), _HEX32, "machine-id"))
        if "serial" in low:
            s = _rewrite(s, _SERIAL, lambda m, text: self._mask_kind(text, m.end(), _SERIAL_VALUE, "serial"))
        s = _UUID.sub(self._uuid, s)
        if ":" in s or "-" in s:
            s = _MAC.sub(self._mac, s)
        if ":" in s:
            s = _IPV6.sub(self._ipv6, s)
        if not versions and "." in s:
            s = _IPV4.sub(self._ipv4, s)
        return s

    def _host_or_keep(self, name: str) -> str:
        hit = self._host_value(name, 0)
        return hit[2] + name[hit[1]:] if hit and hit[0] == 0 else name

    def _mask_kind(self, text: str, i: int, pattern: re.Pattern[str], kind: str) -> tuple[int, int, str] | None:
        m = pattern.match(text, i)
        if not m or m.group().upper() in ("N/A", "NONE", "UNKNOWN"):
            return None
        return (m.start(), m.end(), self.pseudonym(kind, m.group()))

    def _internal_fqdn(self, m: re.Match[str]) -> str:
        # "threading.local", "sklearn.cluster" and "google.protobuf.internal" are Python;
        # "gpu-node-3.local", "ip-10-0-1-2.ec2.internal" and "a.b.svc.cluster.local" are hosts.
        name = m.group()
        if (name.lower().endswith(_AMBIGUOUS_SUFFIXES) and not re.search(r"[\d-]", name)
                and not name.lower().endswith(".svc.cluster.local")):
            return name
        return self._host_label(name)

    def _uuid(self, m: re.Match[str]) -> str:
        label = self.pseudonym("uuid", m.group(2))
        return f"{m.group(1)}-{label}" if m.group(1) else label

    def _mac(self, m: re.Match[str]) -> str:
        if not m.group().strip("0:-"):
            return m.group()  # all zeros: "no address", which is diagnostic
        return self.pseudonym("mac", m.group())

    def _ipv6(self, m: re.Match[str]) -> str:
        text = m.group()
        stripped = text.rstrip(".")
        colons = stripped.count(":")
        if "::" not in stripped and colons < 6:
            return text  # 10:20:30, a time; an address has eight groups or a "::"
        ip = _is_ip(stripped)
        if not isinstance(ip, ipaddress.IPv6Address):
            return text
        # "::2" in a slice or "10::100" is not an address anyone would redact; "c10::" is C++.
        if stripped.count(":") < 3 and (not re.search(r"[A-Fa-f]", stripped) or stripped.endswith("::")):
            return text
        return self._ip_label(ip, stripped) + text[len(stripped):]

    def _ipv4(self, m: re.Match[str]) -> str:
        ip = _is_ip(m.group())
        if ip is None:
            return m.group()
        s, start = m.string, m.start()
        if _version_before(s[max(0, start - 48):start]):
            return m.group()
        nl = s.rfind("\n", max(0, start - 128), start)
        if (nl >= 0 or start <= 128) and _COLUMN_BEFORE.match(s, nl + 1, start):
            return m.group()  # a "name   1.2.3.4" column of pip list or conda list
        return self._ip_label(ip, m.group())

    # -- structures --------------------------------------------------------------------------------

    def value(self, value: Any, key: str | None = None) -> Any:
        """A redacted copy of a JSON-like value; `key` is the dict key it was found under."""
        if key is not None and is_secret_name(key) and value not in (None, True, False, ""):
            if isinstance(value, (dict, list, tuple)):
                return self._mask_leaves(value)
            return self.pseudonym("secret", str(value))
        if key is not None and _is_host_name(key):
            # hostname, MASTER_ADDR, NCCL_COMM_ID, node_list; every value of a dict under one:
            # {"hostname": {"name": ..., "node_list": ...}}
            if isinstance(value, (dict, list, tuple)):
                return self._host_leaves(value, key)
            if isinstance(value, str) and value.strip():
                return self._host_string(value, key)
        kind = IDENTITY_KEYS.get(key.lower()) if key is not None else None
        if kind is not None and isinstance(value, str) and value.strip():
            if kind == "uuid" and _UUID.search(value):
                return self.text(value)  # GPU-<uuid-1>, the same as in the text around it
            return self.pseudonym(kind, value)
        if isinstance(value, str):
            return self.text(value, versions=key is not None and "version" in key.lower())
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value

    def _host_string(self, value: str, key: str) -> str:
        """A string that a key says is a host (or a host list, an address with a port): this
        machine is `<host>` even under a generic name, a known node its alias, other names and
        addresses their placeholders; a generic word (localhost) and loopback stay."""
        name = value.strip()
        found = self._names.labels.get(("host", name.lower().rstrip(".")))
        if found is not None or name in self._labels:
            return found or name
        hit = self._host_value(value, 0, nodelist="list" in key.lower())
        if hit is not None:
            value = value[:hit[0]] + hit[2] + value[hit[1]:]
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

    def stream(self, max_line: int = 1 << 20) -> "StreamRedactor":
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


_LINE_END = re.compile(r"\r\n|\n|\r")
_TRAILING_END = re.compile(r"(?:\r\n|\n|\r)\Z")
_NEXT_WORD = re.compile(r"\s{0,64}['\"]?([^\s'\",;]{1,%d})" % _LIMIT)
_CUT_AT = re.compile(r"[\s,;}\])>]")
_PENDING = re.compile(
    r"(?i)(?:(?:password|passwd|passphrase|pwd|pass|secret|token|key|credentials?|cookie|auth|authorization|signature)"
    r"['\"]?\]?[ \t]{0,4}(?::=|=>|[:=])?|bearer|basic|--?[A-Za-z0-9_-]{0,40}(?:token|key|password|passwd|secret))"
    r"[ \t]{0,4}['\"]?\s*\Z"
)


class StreamRedactor:
    """Redacts text that arrives in pieces (a child's stdout) line by line, in bounded memory.

    `feed(text)` returns the redacted complete lines it could finish (lines end in "\\n" or
    "\\r": a progress bar's redraws are lines too); the complete lines of one call are redacted
    together, so feeding 64 KB reads costs about what `Redactor.text` costs on them. `flush()`
    returns the rest. Memory is bounded by `max_line`: a longer line is cut at a separator (a
    space, a comma, a bracket), and a cut right after a secret-like name masks the word that
    follows the cut. A private key block is one placeholder from its BEGIN line to its END line,
    whichever calls they come in; trailing lines that could be the body of a key (at most
    `HELD_LINES`) are held back until the next call shows whether an END follows, so a stream
    that starts inside a key does not leak the key either."""

    HELD_LINES = 200

    def __init__(self, redactor: Redactor, max_line: int = 1 << 20) -> None:
        self.redactor = redactor
        self.max_line = max(max_line, 256)
        self._parts: list[str] = []
        self._size = 0
        self._in_key = False
        self._mask_next = False
        self._held: list[str] = []

    def feed(self, text: str) -> str:
        out: list[str] = []
        batch: list[str] = []
        pos = 0
        for m in _LINE_END.finditer(text):
            self._parts.append(text[pos:m.start()])
            line = "".join(self._parts)
            self._parts, self._size = [], 0
            if len(line) > self.max_line:
                self._batch(batch, out)
                batch = []
                line = self._emit_long(line, out)
            batch.append(line + m.group())
            pos = m.end()
        self._batch(batch, out)
        rest = text[pos:]
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if self._size > self.max_line:
                line = self._emit_long("".join(self._parts), out)
                self._parts, self._size = [line], len(line)
        return "".join(out)

    def flush(self) -> str:
        out: list[str] = []
        rest = "".join(self._parts)
        self._parts, self._size = [], 0
        self._batch([self._emit_long(rest, out)] if rest else [], out, final=True)
        return "".join(out)

    def _emit_long(self, line: str, out: list[str]) -> str:
        """Emit the leading pieces of a line longer than max_line; return what is left."""
        while len(line) > self.max_line:
            window = line[: self.max_line]
            cut = self.max_line
            for m in _CUT_AT.finditer(window, self.max_line // 2):
                cut = m.end()
            head, line = line[:cut], line[cut:]
            pending = bool(_PENDING.search(head[-160:]))
            self._batch([head], out, hold=False)
            self._mask_next = pending
        return line

    def _batch(self, lines: list[str], out: list[str], *, final: bool = False, hold: bool = True) -> None:
        if self._in_key:
            for i, line in enumerate(lines):
                m = _PEM_END.search(line)
                if m is not None:
                    self._in_key = False
                    rest = line[m.end():]
                    lines = ([rest] if rest.strip() else []) + lines[i + 1:]
                    break
            else:
                return  # all of it is the body of a private key
        lines = self._held + lines
        self._held = []
        if hold and not final:
            k = len(lines)
            while k > 0 and len(lines) - k < self.HELD_LINES and _PEM_LAST_LINE.fullmatch(lines[k - 1].strip() or "-"):
                k -= 1
            lines, self._held = lines[:k], lines[k:]
        chunk = "".join(lines)
        if not chunk:
            return
        last = None
        for m in _PEM_MARKER.finditer(chunk):
            last = m.group(1)
        redacted = self._redact(chunk)
        if last == "BEGIN":
            # The key goes on in the next lines: they are dropped through its END.
            self._in_key = True
            ending = _TRAILING_END.search(chunk)
            redacted += ending.group() if ending else ""
        out.append(redacted)

    def _redact(self, text: str) -> str:
        if self._mask_next:
            self._mask_next = False
            m = _NEXT_WORD.match(text)
            if m and m.group(1) and not m.group(1).startswith("<"):
                text = text[:m.start(1)] + self.redactor.pseudonym("secret", m.group(1)) + text[m.end(1):]
        return self.redactor.text(text)


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
