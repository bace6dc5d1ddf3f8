"""Redaction's rule tables: which names hold secrets or hosts, the patterns of every secret,
identity and machine form, and the evidence tests that decide whether a value found by a pattern
really is one (a program's expression, a version, a revision or a public host is not).

gpudoctor.reports.redact is the engine that applies them (one pass per text, stable pseudonyms,
values learned and hunted through the report); its docstring says what is hidden and what is kept,
and why. The names here keep their leading underscore: they are the engine's, imported by
gpudoctor.reports.redact alone; `is_secret_name` and `IDENTITY_KEYS` are public through it.

Every pattern is linear in the length of its input: quantifiers are bounded, unbounded runs start
only at run boundaries. Standard library only.
"""
from __future__ import annotations

import functools
import ipaddress
import re
from typing import Iterable

_LIMIT = 4096  # longest value consumed after a secret-like name
# --- names: which keys, variables and flags hold secrets or hosts -----------------------------------

_SECRET_LAST = frozenset({
    "password", "passwd", "passphrase", "secret", "token", "credential", "credentials", "cookie",
    "apikey", "sessionid", "authorization", "auth", "privatekey", "accesskey", "secretkey",
    "authtoken", "accesstoken", "refreshtoken", "apitoken",
})
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey")
# "key", "pwd" and "pass" alone are not secrets (the attention key tensor, $PWD), only qualified.
_KEY_QUALIFIERS = frozenset({
    "api", "access", "secret", "private", "account", "master", "encryption", "signing", "license",
    "ssh", "client", "app", "consumer", "subscription", "storage", "service", "auth", "deploy",
    "session", "shared", "wandb", "openai", "anthropic", "hf", "github", "gitlab", "aws", "gcp",
    "azure", "comet", "neptune", "pinecone", "cohere", "groq", "mistral", "replicate", "together",
})
_CAMEL = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


# Suffixes that qualify a secret's name without changing what it holds: api_token_2,
# DB_PASSWORD_PROD, github_token_v2, SECRET_KEY_OLD.
_NAME_SUFFIXES = frozenset({
    "prod", "production", "dev", "develop", "staging", "stage", "test", "qa", "old", "new", "backup", "bak",
    "local", "live", "primary", "secondary", "main", "default", "ci", "read", "write", "rw", "ro",
})


def _name_parts(name: str) -> list[str]:
    parts = [p.lower() for p in _CAMEL.split(name) if p]
    while len(parts) > 1 and (parts[-1].isdigit() or parts[-1] in _NAME_SUFFIXES
                              or (parts[-1][0] == "v" and parts[-1][1:].isdigit())):
        parts.pop()
    return parts


# Words before "token" that name a piece of text, not a credential: a tokenizer's pad_token,
# eos_token, image_token, decoder_start_token.
_TEXT_TOKEN_QUALIFIERS = frozenset({
    "pad", "eos", "bos", "unk", "sep", "cls", "mask", "image", "img", "video", "audio", "boi", "eoi", "boa",
    "eoa", "start", "end", "begin", "stop", "placeholder", "special", "think", "fim", "class", "vision",
    "newline", "delimiter", "prefix", "suffix", "middle", "eot", "eod", "sot",
})
# Words before "token" that make it a credential whatever its value looks like.
_AUTH_TOKEN_QUALIFIERS = _KEY_QUALIFIERS | {
    "access", "refresh", "bearer", "oauth", "csrf", "xsrf", "id", "personal", "bot", "slack", "discord",
    "telegram", "npm", "pypi", "registry", "docker", "jwt", "hub", "huggingface", "gh", "login", "security",
    "sas", "upload", "push", "write", "read",
}
# Words before "pass" or "pwd" that make it a password (db_pass, MYSQL_PWD), not a compiler's pass.
_PASS_OWNERS = frozenset({
    "db", "mysql", "pg", "postgres", "redis", "ldap", "smtp", "mail", "user", "admin", "root", "login", "ftp",
    "ssh", "sudo", "vnc", "wifi", "proxy", "http", "https", "basic", "app", "api", "account", "sql", "mongo",
})


@functools.lru_cache(maxsize=4096)  # a report asks about the same few hundred keys again and again
def _secret_level(name: str) -> int:
    """2: the name says its value is a secret (HF_TOKEN, WANDB_API_KEY, api-key, clientSecret,
    DB_PASSWORD, MYSQL_PWD, access_token); 1: it may be one, and its value decides (token, CACHE_KEY,
    file_token, which in a program are as often a tokenizer's or a dict's); 0: not a secret's name
    (TOKENIZERS_PARALLELISM, max_tokens, key, token_count, PWD, pad_token, eos_token)."""
    parts = _name_parts(name)
    if not parts:
        return 0
    last = parts[-1]
    prev = parts[-2] if len(parts) >= 2 else ""
    if last == "token" or (last.endswith("token") and last not in _SECRET_LAST):
        if last != "token":  # one word: csrftoken, hftoken; tiktoken
            prev = last[:-5]
        if prev in _TEXT_TOKEN_QUALIFIERS:
            return 0
        # "a refresh token: when such a token..." is prose: its value decides
        return 2 if prev in _AUTH_TOKEN_QUALIFIERS and " " not in name else 1
    if last in _SECRET_LAST or last.endswith(_SECRET_SUFFIXES):  # PGPASSWORD, clientSecret
        return 2
    if last == "id" and prev == "session":
        return 2
    if prev and last == "key":
        if prev in _KEY_QUALIFIERS:
            return 2
        return 1 if name.isupper() else 0
    if prev and last in ("pwd", "pass"):
        # MYSQL_PWD, db_pass; not "Second pass:", "pre-pass:" (a compiler's passes)
        return 2 if name.isupper() or prev in _PASS_OWNERS else 1
    return 0


def is_secret_name(name: str) -> bool:
    """Whether a key, variable or flag name says its value is or may be a secret: HF_TOKEN,
    WANDB_API_KEY, api-key, clientSecret, DB_PASSWORD, MYSQL_PWD, token, CACHE_KEY; not
    TOKENIZERS_PARALLELISM, max_tokens, key, token_count, PWD, pad_token."""
    return _secret_level(name) > 0


_HOST_KEYS = frozenset({
    "hostname", "host", "hostnames", "hosts", "nodename", "nodelist", "masteraddr", "masterhost",
    "masteraddress", "rdzvendpoint", "submithost", "server", "servername", "peer", "remotehost",
    "launchnodeipaddr", "nodeipaddr", "node",
    "commid",  # NCCL_COMM_ID: NCCL's bootstrap address, <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port>
})


# Of those, the names that say "host" and nothing else; "host", "node", "server", "peer" and
# "address" are also a program's words (a graph node, a server object): text under them is a host
# only when it looks like one (`_host_value(weak=True)`).
_STRONG_HOST_KEYS = _HOST_KEYS - {"host", "hosts", "node", "server", "peer"}
# Top-level labels that make a dotted name under a generic key a host name (db.example.com).
_HOST_TLDS = frozenset({
    "com", "net", "org", "io", "ai", "edu", "gov", "co", "us", "uk", "de", "fr", "cn", "jp", "kr", "in",
    "internal", "local", "lan", "corp", "intranet", "localdomain", "arpa", "cluster",
})


@functools.lru_cache(maxsize=4096)
def _is_host_name(name: str, strong: bool = False) -> bool:
    """Whether a key, variable or flag name says its value is a host (or a host list, an address):
    hostname, node_name, MASTER_ADDR, NCCL_COMM_ID, SLURM_JOB_NODELIST, --rdzv-endpoint. The one
    test for host context, in report keys and in text alike. `strong`: a name that can mean
    nothing else (hostname, master_addr; not host, node, address)."""
    parts = _name_parts(name)
    if not parts:
        return False
    if len(parts) >= 2 and parts[-2] in ("max", "min", "num", "n"):
        return False  # --max-hosts N: a count
    keys = _STRONG_HOST_KEYS if strong else _HOST_KEYS
    joined = "".join(parts[-2:])
    return parts[-1] in keys or joined in keys or "".join(parts[-3:]) in keys


# Keys whose string values identify a person or a machine, wherever they appear in a report dict
# (host keys are `_is_host_name`'s).
IDENTITY_KEYS: dict[str, str] = {
    "user": "user", "username": "user", "login": "user", "owner": "user",
    "uuid": "uuid", "gpu_uuid": "uuid", "serial": "serial", "serial_number": "serial",
    "machine_id": "machine-id", "mac": "mac", "mac_address": "mac", "ip": "ip", "ip_address": "ip",
    "email": "email",
}

# Values after a secret-like name that are not secrets: references, types, placeholders, flags.
_NOT_SECRET_VALUE = re.compile(
    r"(?:none|null|nil|true|false|yes|no|on|off|undefined|str|int|bytes|bool|float|optional|any"
    r"|string|dict|list|required|redacted|\*+|x+|\.\.\.|-|-?\d{1,7}|\d{1,3}(?:_\d{3})+)",
    re.IGNORECASE,
)
_NOT_SECRET_START = ("<", "$", "%(", "{", "[", "os.environ", "os.getenv", "getenv(", "env.", "process.env", "--")

# --- patterns -------------------------------------------------------------------------------------

_PEM_MARKER = re.compile(r"-----(BEGIN|END) (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----")
_PEM_SPLIT = re.compile(r"\\n|\\r|\s+")
_PEM_LAST_LINE = re.compile(r"[A-Za-z0-9+/=]{1,128}")
_PEM_BODY_LINE = re.compile(r"[A-Za-z0-9+/=]{40,128}")

_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,30}://)([^\s/?#@'\"<>\\]{1,256})@")
# A password that holds '/', '?' or '#' unencoded (a base64 password pasted into DATABASE_URL; no
# URL parser reads it, every person does): after `user:`, up to an '@' that a host follows. Not a
# `host:port/path@x` (the port is digits), nor an '@' in a path (no ':' before the first '/').
_URL_SLASHED_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,30}://)"
    r"([^\s/?#@:'\"<>\\]{0,128}:(?!\d{1,5}(?:[/?#]|\Z))(?=[^\s@'\"<>\\]{0,256}?[/?#])[^\s@'\"<>\\]{1,256}?)@(?=[A-Za-z0-9\[])"
)
_GENERIC_URL_USERS = frozenset({"git", "anonymous", "ftp", "hg", "svn"})

# An AWS secret access key has no prefix: 40 characters of base64 with upper, lower and digits (a
# 40-hex git commit has no upper case). Forty such characters are also a piece of many paths
# (`tmp.6xjVbbjJMQ/main/tests/fixtures/run/dtype` in /tmp/tmp.6xjVbbjJMQ/main/tests/...), so the
# form alone is no evidence: the run must be a whole word (space, quote, `=`, `:`, `,` or a bracket
# on both sides: never a piece of a path or of a longer name), and the line before it must say
# secret (`_SECRET_CONTEXT`) or hold another secret (an access key id, already `<secret-N>`).
_AWS_SECRET = re.compile(
    r"(?<![^\s'\"=:,(\[{])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])(?=[A-Za-z0-9/+]{0,39}[0-9])"
    r"[A-Za-z0-9+][A-Za-z0-9/+]{39}(?![^\s'\",;)\]}])"
)
_SECRET_CONTEXT = re.compile(
    r"(?<![a-z])(?:secret|credentials?|creds|passw(?:or)?d|token|keys?|aws|accesskey|apikey)(?![a-z])|<secret-"
)
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])(?:bearer|basic)[ \t]{1,4}(?=[A-Za-z0-9._~+/=-]{8})")
_BEARER_VALUE = re.compile(r"[A-Za-z0-9._~+/=-]{8,4096}")

_HOST_ANCHOR = re.compile(
    r"(?i)(?:hostnames?|host|hosts|nodename|node_?list|node|addr|address|endpoint|server|peer|server_?name|comm_?id)"
    r"(?=['\"]?\]?[ \t]{0,4}(?::=|:|=(?!=)))"
)
_KV_WORDS = ("pass", "pwd", "secret", "token", "key", "credential", "cookie", "session", "auth")
_FLAG = re.compile(r"(?<![\w-])--?([A-Za-z][A-Za-z0-9_-]{0,63})(=|[ \t]{1,4})")
_KEY_ALPHABET = re.compile(r"[A-Za-z0-9+/=_.-]{16,4096}")
_LOOSE_WORDS = ("token", "key", "secret", "passw", "credential")
_HOST_WORDS = ("host", "node", "addr", "endpoint", "server", "peer", "comm_id", "commid")
_INTERNAL_SUFFIXES = (".internal", ".local", ".lan", ".corp", ".intranet", ".localdomain", ".cluster", ".home.arpa")
_SEP = re.compile(r"['\"]?\]?[ \t]{0,4}(?::=|=>|:|=(?!=))[ \t]{0,4}")
# "token 0123abcd..." without a separator: a long run with letters and digits right after the word.
# "key" alone is no evidence ("fx graph cache hit for key fatexag6p..."): only a qualified one is
# ("API key", "secret key"), as in `is_secret_name`.
_LOOSE = re.compile(
    r"(?i)(?<![A-Za-z0-9])(token|key|secret|password|passwd|apikey|credential)s?['\"]?[ \t]{1,4}(?:is[ \t]{1,4})?['\"]?"
    r"(?=[A-Za-z0-9+/_=-]{20})"
)
_LOOSE_VALUE = re.compile(r"[A-Za-z0-9+/_.=-]{20,4096}")
_NETRC = re.compile(r"(?<![\w-])login[ \t]{1,8}\S{1,256}[ \t]{1,8}password[ \t]{1,8}(?=\S)")
_WANDB_LOGIN = re.compile(r"(?<![\w-])wandb[ \t]{1,4}login(?:[ \t]{1,4}--?[A-Za-z-]{1,20}){0,4}[ \t]{1,4}(?=[A-Za-z0-9_]{20})")
_WORD_VALUE = re.compile(r"[A-Za-z0-9_]{20,256}")
_BARE_VALUE = re.compile(r"[^\s'\"<>,;&(){}\[\]|`]{1,%d}" % _LIMIT)
_LINE_VALUE = re.compile(r"[^\r\n]{1,%d}" % _LIMIT)
_QUERY_VALUE = re.compile(r"[^&#\s'\"<>]{1,%d}" % _LIMIT)

# Identity.
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])([A-Za-z0-9._%+-]{1,64})@([A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8})(?![A-Za-z0-9-])"
)
# File suffixes that are no top-level domain: `name@part.pkl` is a file, not an address.
_FILE_SUFFIXES = frozenset({
    "pkl", "pth", "bin", "txt", "json", "yaml", "yml", "npy", "npz", "ckpt", "safetensors", "log", "csv",
    "h5", "onnx", "whl", "tar", "gz", "cfg", "ini", "toml", "pyc", "cu", "cuh", "hpp", "cpp", "jpg", "png",
    "wav", "mp4", "ipynb", "parquet", "arrow", "engine", "cubin", "ptx",
})
# Not after "/": `github.com/org/repo.git@<commit>` is a revision in a URL, not a login.
_USER_AT_HOST = re.compile(
    r"(?<![\w.@%+/-])([a-z_][a-z0-9_.-]{0,31}|<user(?:-\d{1,5})?>)@([A-Za-z0-9][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63}){0,8}"
    r"|<[a-z][a-z0-9-]{0,24}>)(?=[:\s$#\"']|\Z)"
)
_HOMES = re.compile(
    r"(?:(?<![\w.~-])(/home/|/Users/|/var/home/|/export/home/|/mnt/[A-Za-z]/Users/)"
    r"|(?<![A-Za-z])([A-Za-z]:(?:\\{1,2}|/)Users(?:\\{1,2}|/)))"
    r"([^/\\\s'\":*?|<>]{1,64})"
)
# What follows "@" in `name@<commit>` or `pkg@v1.2.3`: a revision, not a host.
_REVISION = re.compile(r"(?=[a-f]{0,63}\d)[0-9a-f]{7,64}|v?\d{1,6}(?:\.\d{1,9}){1,4}(?:[.+-][A-Za-z0-9.]{1,32})?")
_GENERIC_HOME_NAMES = frozenset({"public", "shared", "default", "default user", "all users", "linuxbrew", "guest"})
# Host names in a host context.
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63}){0,8}")
_NODELIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.,\[\]-]{0,1023}")
_BRACKET_HOST = re.compile(r"\[([A-Za-z0-9][A-Za-z0-9.-]{0,252})\]:(?=\d{1,5}(?!\d))")
_CONNECT_HOST = re.compile(
    r"(?i)(?:connect(?:ed|ing)?|listen(?:ing)?|bind|bound|reach)[ \t]{1,4}(?:to|on)[ \t]{1,4}"
    r"(?:any network address of[ \t]{1,4})?[(\[]?(?=[A-Za-z0-9])"
)
_NCCL_PREFIX = re.compile(r"(?m)^([A-Za-z0-9][A-Za-z0-9.-]{0,252}):(\d{1,10}):(\d{1,10}) \[")
_RDZV_URL = re.compile(r"(?i)(?<![A-Za-z0-9+.-])(?:tcp|env|c10d|etcd|etcd-v2|static)://(?=[A-Za-z0-9\[])")
# "_" never occurs in a host name and always beside Python names (torch._C._distributed_c10d.local).
_INTERNAL_FQDN = re.compile(
    r"(?<![A-Za-z0-9._-])([A-Za-z0-9][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63}){0,6})"
    r"\.(?:" + "|".join(re.escape(suffix[1:]) for suffix in _INTERNAL_SUFFIXES) + r")(?![A-Za-z0-9_-])"
)
# Suffixes that are also Python names (threading.local, sklearn.cluster, google.protobuf.internal):
# a host under them shows a digit or a hyphen in a label (gpu-node-3.local, ip-10-0-1-2.ec2.internal).
_AMBIGUOUS_SUFFIXES = (".local", ".cluster", ".internal")
_AWS_HOSTNAME = re.compile(r"(?<![A-Za-z0-9-])ip-\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}(?![0-9])")
_PUBLIC_HOSTS = (
    "github.com", "githubusercontent.com", "gitlab.com", "bitbucket.org", "huggingface.co", "hf.co",
    "pypi.org", "pythonhosted.org", "pytorch.org", "nvidia.com", "anaconda.org", "anaconda.com",
    "conda-forge.org", "python.org", "googleapis.com", "wandb.ai", "docker.io", "nvcr.io", "ngc.nvidia.com",
)
# Machine identifiers.
_MACHINE_ID = re.compile(r"(?i)machine[-_ ]?id['\"]?[ \t]{0,4}[:=]?[ \t]{0,4}['\"]?(?=[0-9a-f]{32}(?![0-9a-f]))")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_SERIAL = re.compile(
    r"(?i)(?<![A-Za-z])serial(?:[ _-]?(?:number|no\.?|num))?['\"]?[ \t]{0,40}[:=][ \t]{0,4}['\"]?(?=[A-Za-z0-9-]{4})"
)
_SERIAL_VALUE = re.compile(r"[A-Za-z0-9-]{4,64}")
_UUID = re.compile(
    r"(?<![0-9A-Za-z])(?:(GPU|MIG)-)?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})(?![0-9A-Za-z-])"
)
_MAC = re.compile(r"(?<![0-9A-Fa-f:.-])[0-9A-Fa-f]{2}([:-])(?:[0-9A-Fa-f]{2}\1){4,18}[0-9A-Fa-f]{2}(?![0-9A-Fa-f:.-])")
_IPV6 = re.compile(r"(?<![\w:.])(?=[0-9A-Fa-f:.]{0,45}:[0-9A-Fa-f.]{0,45}:)[0-9A-Fa-f:.]{2,45}(?![\w:])")
_IPV6_RUN = re.compile(r"[0-9A-Fa-f:.]{2,45}(?![0-9A-Za-z:])")
_IPV4 = re.compile(r"(?<![\w.-])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\d|[\w-])")
_VERSION_WORDS = frozenset({"version", "ver", "v"})
_VERSION_LIBS = re.compile(
    r"(?:cuda|cudnn|cublas\w{0,4}|cufft|curand|cusolver|cusparse\w{0,4}|nccl|tensorrt|trt|nvjitlink|nvrtc"
    r"|cupti|driver|nvidia[\w-]{0,40}|[\w-]{1,40}-cu\d{2,3})"
)
_COLUMN_BEFORE = re.compile(r"[ \t]*[A-Za-z0-9][\w.-]{0,80}[ \t]{2,40}\Z")

# Names too common to be identifying, and which would mangle ordinary text if replaced.
_GENERIC_NAMES = frozenset({
    "root", "user", "users", "admin", "nobody", "ubuntu", "runner", "jovyan", "localhost", "vm",
    "debian", "centos", "fedora", "ec2-user", "vagrant", "docker", "guest", "default", "host",
    "node", "server", "worker", "master", "secret", "token", "home", "data", "work", "test",
    "train", "model", "cuda", "torch", "python", "gpu", "cpu", "dev", "build", "app", "code",
    "none", "(none)", "linux", "desktop", "laptop", "machine", "instance", "container", "ip",
    "mac", "uuid", "serial", "email", "redacted", "public", "shared", "git",
})
_NOT_HOST_WORDS = frozenset({
    "true", "false", "none", "null", "already", "any", "all", "the", "a", "an", "it", "this", "that",
    "port", "address", "server", "host", "peer", "device", "remote", "local", "network", "socket",
    "store", "rendezvous", "endpoint", "interface", "cuda", "gpu", "unknown", "n/a", "localhost",
    "and", "or", "to", "for", "of", "is", "in", "on", "with", "can", "must", "should", "be", "not", "from",
    "e.g", "i.e", "addr", "hostname", "ip", "master_addr",
})
_KEEP_IPS = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255", "::1", "::"})


def _plausible_secret(value: str) -> bool:
    if not value.strip() or _NOT_SECRET_VALUE.fullmatch(value.strip()):
        return False
    return not value.startswith(_NOT_SECRET_START)


def _any(text: str, words: Iterable[str]) -> bool:
    return any(w in text for w in words)


def _credential_like(value: str) -> bool:
    """A bearer or basic credential, not an English word ("Bearer authentication")."""
    upper = sum(c.isupper() for c in value)
    return any(c.isdigit() or c in "._~+/=-" for c in value) or (upper >= 2 and upper < len(value))


def _credential_shaped(value: str) -> bool:
    """16+ characters of an API key's alphabet with letters and digits: not `shape=(1, 2)`, nor a
    dotted name (`down_blocks.1.attentions.0`)."""
    return (len(value) >= 16 and bool(_KEY_ALPHABET.fullmatch(value)) and _has_letter_and_digit(value)
            and not _NAME_LIKE.fullmatch(value))


_STRING_PREFIX = re.compile(r"[fFrRbBuU]{1,2}(?=['\"])")


def _skip_string_prefix(text: str, i: int) -> int:
    """The position of the quote of a Python string literal with a prefix (f"...", rb'...')."""
    m = _STRING_PREFIX.match(text, i)
    return m.end() if m else i


def _has_letter_and_digit(value: str) -> bool:
    return any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _mixed_case_and_digit(value: str) -> bool:
    return any(c.isdigit() for c in value) and any(c.islower() for c in value) and any(c.isupper() for c in value)


_IDENT_CHAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_LOWER_CHAIN = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+")
_CODE_RECEIVERS = frozenset({
    "self", "cls", "args", "kwargs", "config", "cfg", "opt", "opts", "options", "params", "settings", "os",
    "sys", "env", "environ", "ctx", "context", "state", "request",
})
_CODE_WORDS = frozenset({"self", "cls", "args", "kwargs", "str", "int", "bool", "float", "bytes", "dict", "list", "object", "Any"})
_SECRET_WORDS = frozenset({
    "token", "key", "secret", "password", "passwd", "pwd", "auth", "credential", "credentials", "apikey",
    "api_key", "cookie", "passphrase",
})
_TYPE_NAME = re.compile(r"_{0,2}(?:[A-Z][a-z0-9]{2,}){2,}")  # StorageKey, TextGenerationStreamOutputToken
_LOG_LEVEL = re.compile(r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL):\Z")


def _code_value(text: str, start: int, end: int) -> bool:
    """Whether the unquoted value text[start:end] after a secret-like or host-like name is a
    program's expression, not a literal one: `token = kwargs.pop("token")`, `key = tokens[0]`,
    `tokenizer.pad_token = tokenizer.eos_token`, `host = self.host`, `hostname: str`. A traceback
    shows such source lines; hiding them hides the line that failed."""
    value = text[start:end]
    if not _IDENT_CHAIN.fullmatch(value):
        return False
    if end < len(text) and text[end] in "([":
        return True  # a call or a subscript
    if value in _CODE_WORDS:
        return True
    if value == "new" and re.match(r"[ \t]{1,4}[A-Za-z_$]", text[end:end + 6]):
        return True  # JavaScript, Java, C#: `password = new Uint8Array(32)`
    low = value.lower()
    if low in _SECRET_WORDS or ("_" in value or "." in value) and _any(low.rsplit(".", 1)[-1], _KV_WORDS):
        return True  # a variable named for what it holds: token, hf_token, raw_api_key, constants.OAUTH_CLIENT_SECRET
    if value.split(".", 1)[0] in _CODE_RECEIVERS and "." in value:
        return True  # self.LFE_num_id_token
    if _TYPE_NAME.fullmatch(value) and re.match(r"[ \t]*(?:[,)|\]]|=(?!=)|\Z)", text[end:end + 8]):
        return True  # a type annotation: `storage_key: StorageKey)`, `token: AddedToken | None = None`
    if _LOWER_CHAIN.fullmatch(value):
        # an attribute: of a program's object (self.token, args.hf_token), or snake_case names
        # (tokenizer.eos_token), or one named like the secret it refers to (model.token)
        parts = value.split(".")
        return parts[0] in _CODE_RECEIVERS or "_" in value or _any(parts[-1], _KV_WORDS)
    return False


_NAME_LIKE = re.compile(r"[a-z_][a-z0-9]*(?:[._]+[a-z0-9]+)+_*|[A-Z_][A-Z0-9]*(?:[._]+[A-Z0-9]+)+_*")


def _secret_shaped(value: str) -> bool:
    """Whether a value under a name that only may hold a secret (`token`, `CACHE_KEY`) looks like
    a credential: 16 or more of an API key's characters with letters and digits, or 20 letters;
    not a name (`DCP_SHARDING_INFO`, `down_blocks.1.attentions.0`, `charturnerv2`, a class name)."""
    if _TYPE_NAME.fullmatch(value):
        return False
    return _credential_shaped(value) or len(value) >= 20 and value.isalnum()


def _names_a_secret(value: str) -> bool:
    """Whether a value is the name of a secret, not one: `ENV_GITHUB_TOKEN = "GITHUB_TOKEN"`."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", value)) and _secret_level(value) > 0


def _huntable(value: str) -> bool:
    """Whether a value that its context showed to be a secret is distinctive enough to be hidden
    wherever else it appears: a credential, not a word or a name in a program (`UserWarning`,
    `requires`, `new_token`), which would then be hidden all over the report."""
    if not _IDENT_CHAIN.fullmatch(value):
        return True  # hunter2!, pg-s3cret-99, a base64 key
    return any(c.isdigit() for c in value) and "_" not in value and "." not in value  # hunter2hunter2


def _identifier_start(text: str, end: int) -> int:
    """Where the run of name characters (letters, digits, `_`, `.`, `-`) that ends at `end` starts."""
    start = end
    floor = max(0, end - 96)
    while start > floor and (text[start - 1].isalnum() or text[start - 1] in "_.-"):
        start -= 1
    return start


def _name_before(text: str, end: int) -> str:
    """The key name that ends at `end`: identifier characters, plus one word before a space
    ("secret key", "API key"; kept with its space: `_secret_level` reads it as prose)."""
    start = end
    floor = max(0, end - 96)
    while start > floor and (text[start - 1].isalnum() or text[start - 1] in "_.-"):
        start -= 1
    name = text[start:end].lstrip(".-")
    if start - 1 > floor and text[start - 1] == " ":
        before = start - 1
        while before > floor and text[before - 1].isalnum():
            before -= 1
        if before < start - 1:
            name = text[before:start - 1] + " " + name
    return name


def _version_before(before: str) -> bool:
    """Whether the text before a dotted quad makes it a version: `==`, `>=`, `version: `, `cuDNN `,
    `nvidia-cublas-cu12 `."""
    if before.endswith(("==", ">=", "<=", "~=", "!=")):
        return True
    word_end = len(before.rstrip(" \t:="))
    if not 1 <= len(before) - word_end <= 4:
        return False
    k = word_end
    while k > 0 and (before[k - 1].isalnum() or before[k - 1] in "_-"):
        k -= 1
    word = before[k:word_end].lower()
    return word in _VERSION_WORDS or bool(_VERSION_LIBS.fullmatch(word))


def _pem_body_start(s: str, floor: int, end: int) -> int:
    """Where the base64 lines that end at a private key's END marker begin (at most 200 lines):
    the start of the earliest line, walking back from END, that still looks like key body."""
    accepted = end
    start = end
    for n in range(200):
        nl = s.rfind("\n", floor, start)
        seg_start = nl + 1 if nl >= 0 else floor
        seg = s[seg_start:start].strip()
        if n > 0 or seg:  # the text before END on its own line may be empty
            if not (_PEM_LAST_LINE if n <= 1 else _PEM_BODY_LINE).fullmatch(seg):
                return accepted
        accepted = seg_start
        if nl < 0:
            return accepted
        start = nl
    return accepted


def _is_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _is_netmask(ip: ipaddress.IPv4Address) -> bool:
    n = int(ip)
    return n != 0 and ((~n) & 0xFFFFFFFF) & (((~n) & 0xFFFFFFFF) + 1) == 0


def _public_host(name: str) -> bool:
    name = name.lower().rstrip(".")
    return any(name == h or name.endswith("." + h) for h in _PUBLIC_HOSTS)
