"""Redaction's secret detectors: private key blocks, credentials by their form, and values under a
secret's name in every syntax that names one.

Each function reads the original text and returns `Span`s (gpudoctor.reports.redact_spans) for the
`Redactor` that calls it; the Redactor resolves overlaps and renders. What is found:

- `key_blocks`: PEM and OpenPGP private key blocks, one placeholder from BEGIN to END (or to the
  end of the text, or from the start of a text that begins inside one);
- `forms`: credentials in URLs (`scheme://user:password@`, an empty user included), the token
  formats of gpudoctor.reports.redact_forms, webhook paths;
- `named`: a value after a secret's name, whatever the syntax: `name = value`, `name: value`,
  `:=`, `::=`, `:::=`, `?=`, `+=`, `.=`, `=>`, any alignment (`terraform fmt`), a type between
  (`var xToken string = "..."`, `val key: String = "..."`), a name with a suffix (`api_token_2`),
  a call (`System.setProperty("DB_PASSWORD", "...")`, `props.put("db.password", "...")`), an XML
  element or `key="..." value="..."` attribute pair, a Kubernetes `name:`/`value:` pair; flags
  (`--token X`, `--api-key=X`), `Authorization: Bearer`, `curl -u user:password`, `mysql
  -pPASSWORD`, query parameters, netrc and `wandb login`;
- `aws_secrets`: a 40-character AWS secret access key, only with evidence on its line;
- `pgpass_lines`: the password of a PostgreSQL password-file line (`host:port:db:user:password`),
  which names nothing: the line's shape is the evidence.

Evidence before masking (the precision corpus, tests/precision_corpus.py, is what must come
through): a name that may mean something else (`token`, `CACHE_KEY`) takes only a credential-shaped
value, and a program's expression (`token = kwargs.pop(...)`) is no value at all.

Every pattern is linear; values are consumed by plain string code, not by backtracking.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

from gpudoctor.reports.redact_forms import GATE, PREFIXES, SHORTEST, TOKEN_FORMATS, WEBHOOK, pattern
from gpudoctor.reports.redact_rules import (
    _any, _AWS_SECRET, _BARE_VALUE, _BEARER, _BEARER_VALUE, _code_value, _credential_like,
    _credential_shaped, _FLAG, _GENERIC_URL_USERS, _has_letter_and_digit, _identifier_start, _KV_WORDS, _LIMIT,
    _LINE_VALUE, _LOG_LEVEL, _LOOSE, _LOOSE_VALUE, _LOOSE_WORDS, _mixed_case_and_digit,
    _name_before, _names_a_secret, _NETRC, _pem_body_start, _PEM_MARKER, _PEM_SPLIT,
    _plausible_secret, _QUERY_VALUE, _SECRET_CONTEXT, _secret_level, _secret_shaped,
    _skip_string_prefix, _URL_SLASHED_PASSWORD, _URL_USERINFO, _WANDB_LOGIN, _WORD_VALUE, is_secret_name,
)
from gpudoctor.reports.redact_spans import RANK_KEY, RANK_SECRET, Hit, Span, scan

if TYPE_CHECKING:
    from gpudoctor.reports.redact import Redactor

# --- private key blocks -------------------------------------------------------------------------------


def key_blocks(r: "Redactor", s: str) -> list[Span]:
    if "PRIVATE KEY" not in s:
        return []
    out: list[Span] = []
    pos = 0
    begin_at: int | None = None
    for m in _PEM_MARKER.finditer(s):
        if m.group(1) == "BEGIN":
            if begin_at is None:
                begin_at = m.start()
        elif begin_at is not None:
            out.append(_block(r, s, begin_at, m.end()))
            pos, begin_at = m.end(), None
        else:
            # The text starts inside a key (a cut log): hide the body lines before END.
            start = _pem_body_start(s, pos, m.start())
            out.append(_block(r, s, start, m.end()))
            pos = m.end()
    if begin_at is not None:  # no END: hide everything after BEGIN
        out.append(_block(r, s, begin_at, len(s)))
    return out


def _block(r: "Redactor", s: str, start: int, end: int) -> Span:
    block = s[start:end]
    return Span(start, end, RANK_KEY, lambda: r.key_block(block))


def key_block_lines(block: str) -> list[str]:
    """The body lines of a key block (learned, so that one shown alone is hidden too)."""
    lines = (line.strip() for line in _PEM_SPLIT.split(_PEM_MARKER.sub("\n", block)))
    return [line for line in lines if len(line) >= 16 and ":" not in line]


# --- forms: URL credentials, token formats, webhooks ----------------------------------------------------


def forms(r: "Redactor", s: str) -> list[Span]:
    out: list[Span] = []
    if "://" in s:
        for m in _URL_USERINFO.finditer(s):
            info = m.group(2)
            if info.startswith("<") or (":" not in info and info.lower() in _GENERIC_URL_USERS):
                continue  # a placeholder already, or `git@`
            out.append(_secret(r, m.start(2), m.end(2) + 1, info, suffix="@"))
        out += (_secret(r, m.start(2), m.end(2) + 1, m.group(2), suffix="@") for m in _URL_SLASHED_PASSWORD.finditer(s))
    if len(s) >= SHORTEST and GATE.search(s):
        present = [p for p in PREFIXES if p in s]
        if present:
            for prefixes, source in TOKEN_FORMATS:
                if any(p in present for p in prefixes):
                    out += (_secret(r, m.start(), m.end(), m.group()) for m in pattern(source).finditer(s))
    if "hook" in s:
        out += (_secret(r, m.start(2), m.end(2), m.group(2)) for m in WEBHOOK.finditer(s))
    return out


def _secret(r: "Redactor", start: int, end: int, value: str, suffix: str = "", order: int = 0) -> Span:
    return Span(start, end, RANK_SECRET, lambda: r.pseudonym("secret", value) + suffix, order)


def aws_secrets(r: "Redactor", s: str, found: list[Span]) -> list[Span]:
    """A 40-character run that looks like an AWS secret access key, where the line before it says
    secret (or holds another secret already found): the form alone is a file name, a digest."""
    out = []
    for m in _AWS_SECRET.finditer(s):
        start = m.start()
        line = s.rfind("\n", max(0, start - 256), start) + 1
        floor = max(line, start - 256)
        if _SECRET_CONTEXT.search(s[floor:start].lower()) or any(floor <= sp.start < start for sp in found):
            out.append(_secret(r, start, m.end(), m.group()))
    return out


# A .pgpass line (PostgreSQL's password file, also PGPASSFILE): exactly five colon-separated
# fields, `\:` and `\\` escaped; a host (or *), a port (or *), a database and a user name (or *),
# then the password. A diagnostic `file.py:42:10:E501:...` has a column where the database goes, and
# a code file where the host goes: neither is taken.
_PGPASS = re.compile(
    r"^[ \t]*(?P<host>\*|[A-Za-z0-9_.\-\[\]%]{1,253}):(?:\*|\d{1,5}):(?P<db>\*|(?:[\w.$\-]|\\[:\\]){1,63}):"
    r"(?:\*|(?:[\w.$@\-]|\\[:\\]){1,63}):(?P<password>(?:[^:\s\\]|\\[:\\])(?:[^:\r\n\\]|\\[:\\]){0,1023}?)[ \t]*\r?$",
    re.M)
_LOG_LEVELS = frozenset({"DEBUG", "INFO", "NOTICE", "WARN", "WARNING", "ERROR", "CRITICAL", "FATAL", "TRACE"})
_CODE_FILE = re.compile(r"\.(?:py|pyi|pyx|c|cc|cpp|cxx|cu|cuh|h|hh|hpp|hxx|js|ts|go|rs|java|rb|sh|txt|log|md)$", re.I)


def pgpass_lines(r: "Redactor", s: str) -> list[Span]:
    out = []
    for m in _PGPASS.finditer(s):
        if m.group("db").isdigit() or _CODE_FILE.search(m.group("host")) or m.group("host") in _LOG_LEVELS:
            continue
        out.append(_secret(r, m.start("password"), m.end("password"), m.group("password")))
    return out


# --- values under a secret's name ------------------------------------------------------------------------

# A secret word, perhaps with a suffix (`api_token_2`, `DB_PASSWORD_PROD`), where a name can end: the
# key's full name is read backwards from it, the assignment and the value forwards, in Python.
_SUFFIX = r"(?:[_.-](?:\d{1,6}|v\d{1,3}|prod|production|dev|develop|staging|stage|test|qa|old|new|backup|bak|local|live|primary|secondary|main|default|ci|read|write|rw|ro))*"
_NAMED = re.compile(
    r"(?i)(?:password|passwd|passphrase|pwd|pass|secret|token|key|credentials?|cookie|sessionid|id"
    r"|authorization|auth)" + _SUFFIX
    + r"(?=(?:\[\d{0,6}\])?['\"`\]]{0,2}(?:[ \t]{0,40}[:=?+.>,<]|[ \t]{1,4}[^\s])|['\"]?[ \t]*\r?\n)"
)
# A type between a name and its `=`: `key: str = "..."`, `val apiKey: String = "..."`, and after a
# space, `var apiToken string = "..."` (Go).
_TYPE = r"(?:&(?:'[A-Za-z_]\w{0,20}[ \t]{1,4})?(?:mut[ \t]{1,4})?|\*{1,2})?[A-Za-z_][\w.]{0,40}(?:\[[\w.\[\], |]{0,60}\]|<[\w.<>, ]{0,60}>)?\??[ \t]{1,4}=(?![=>~])[ \t]{0,40}"
_TYPED = re.compile(_TYPE)
_SPACE_TYPED = re.compile(r"[ \t]{1,4}" + _TYPE)
# `==` compares and `=~ /re/` matches; `:/` starts a path or a URL's `://`.
_OPERATOR = re.compile(r"[ \t]{0,40}(?::{1,3}=|\?\?=|[?+.]=|=>|=(?!=)(?!~[ \t/])|:(?![:=/])|<<?-(?![-\d]))[ \t]{0,40}")
# The families of assignment without an operator: a name then a quoted literal (`#define NAME "v"`,
# `fastcgi_param NAME "v";`, SQL's `PASSWORD 'v'`); a directive line, one word (and its flags),
# the name and one value (Dockerfile `ENV NAME v`, Apache `SetEnv NAME v`, fish `set -gx NAME v`,
# csh `setenv NAME v`); a two-column row that starts with the name (CSV `name,v`).
_SPACE_QUOTED = re.compile(r"[ \t]{1,4}(?=['\"])")
_DIRECTIVE = re.compile(r"[ \t]*#?[ \t]*[A-Za-z_][\w-]{0,30}(?:[ \t]{1,4}--?[A-Za-z][\w-]{0,20}){0,4}[ \t]{1,4}\Z")
_DIRECTIVE_VALUE = re.compile(r"[ \t]{1,4}(?=([^\s'\"]{1,%d})[ \t]*;?[ \t]*(?:\r?\n|\Z))" % _LIMIT)
_CSV_COMMA = re.compile(r"[ \t]{0,4},[ \t]{0,4}(?=[^\s,])")
_CALL_COMMA = re.compile(r"[ \t]{0,4},[ \t]{0,4}(?=['\"])")
_XML_ATTR = re.compile(r"[ \t]{1,8}value[ \t]{0,4}=[ \t]{0,4}(?=['\"])")
_K8S_VALUE = re.compile(r"['\"]?[ \t]*\r?\n[ \t]{0,40}(?:-[ \t]{1,8})?value[ \t]{0,4}:[ \t]{0,8}")
_XML_TEXT = re.compile(r"[ \t\r\n]{0,200}([^<>\s][^<>\r\n]{0,4095}?)[ \t\r\n]{0,200}</")
_QUERY = re.compile(r"(?i)[?&;]([a-z0-9_.-]{1,64})=(?=[^&#\s'\"<>])")
# Query parameters that hold a credential whatever their name's level (a signed URL's signature, an
# OAuth code, `?token=`); any other parameter with a secret's name (`?api_key=`) does too.
_QUERY_NAMES = frozenset({"sig", "signature", "key", "code", "auth", "token", "x-amz-signature", "x-goog-signature",
                          "x-goog-credential", "x-amz-credential", "x-amz-security-token"})
_CURL_USER = re.compile(r"(?<![\w-])(?:-u|--user)(?:=|[ \t]{1,4})(?=[^\s-])")
_MYSQL_P = re.compile(r"(?<![\w-])-p(?=[^\s-]|-[^\s-])")
_MYSQL_COMMANDS = re.compile(r"(?<![\w-])(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mariadb|mariadb-dump)\b")
_SCHEME = re.compile(r"(?i)(?:bearer|basic|token|digest|negotiate|apikey|aws4-hmac-sha256)[ \t]{1,4}")
_ESCAPED_END = re.compile(r"\\[nrt]")
_MAVEN_GROUP = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+")
_MAVEN_ARTIFACT = re.compile(r"[a-z][a-z0-9]*(?:[-.][a-z0-9]+)+(?::[A-Za-z0-9_.-]+){0,3}(?![^\s'\",;)\]])")


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


def value_span(text: str, i: int, *, line: bool = False) -> tuple[int, int] | None:
    """The value that starts at text[i]: the inside of a quoted string (', " or `), else a bare
    word (or the rest of the line when `line`), which ends before a written `\\n` (a value inside
    a JSON string is followed by the next line of the file it quotes)."""
    if i >= len(text):
        return None
    if text[i] in "'\"`":
        span = _quoted_value(text, i)
        if span is not None:
            return span if span[1] > span[0] else None
        i += 1
    m = (_LINE_VALUE if line else _BARE_VALUE).match(text, i)
    if not m:
        return None
    end = m.end()
    if "\\" in m.group():
        cut = _ESCAPED_END.search(text, i, end)
        if cut is not None:
            end = cut.start()
    return (i, end) if end > i else None


def _mask_from(
    r: "Redactor", text: str, i: int, *, line: bool = False, pattern: re.Pattern[str] | None = None,
    check: Callable[[str], bool] | None = None,
) -> Hit | None:
    if pattern is not None:
        m = pattern.match(text, i)
        span = (m.start(), m.end()) if m else None
    else:
        span = value_span(text, i, line=line)
        if span is not None and span[0] == i and _code_value(text, span[0], span[1]):
            return None  # unquoted and a program's expression: `token = kwargs.pop(...)`
    if span is None:
        return None
    value = text[span[0]:span[1]]
    if not _plausible_secret(value) or (check is not None and not check(value)):
        return None
    return (span[0], span[1], r.secret_render(value))


def _weak_secret(r: "Redactor", text: str, i: int) -> Hit | None:
    """The value at text[i] after a name that may mean a secret (token, CACHE_KEY): hidden, and
    hunted elsewhere, when it looks like a credential (`token="charturnerv2"` is a
    textual-inversion token, and ./charturnerv2.pt its file)."""
    span = value_span(text, i)
    if span is None or span[0] == i and _code_value(text, span[0], span[1]):
        return None
    value = text[span[0]:span[1]]
    if not _plausible_secret(value) or not _secret_shaped(value):
        return None
    return (span[0], span[1], r.secret_render(value))


def _assignment(text: str, end: int, name: str) -> tuple[int, str] | None:
    """Where the value after the name that ends at `end` starts, and how it is assigned ("=" for
    an operator, "," for a call's next argument, "xml" for an element, "attr" for a value
    attribute, "k8s" for a name/value pair); None when no assignment follows."""
    i = end
    closer = ""
    while i < len(text) and i - end < 2 and text[i] in "'\"`]":
        closer += text[i]
        i += 1
    if closer.startswith("]"):
        return None  # `d[storage_key] = x`: a variable used as an index, not a key's value
    if not closer and text.startswith("[", end):
        array = re.match(r"\[\d{0,6}\]", text[end:end + 8])
        if array is None:
            return None
        i = end + array.end()  # `char db_password[] = "..."`: a declaration's array
    # (`os.environ["DB_PASSWORD"] = "..."`: a string index names the key, and is read on.)
    start = _identifier_start(text, end)
    before = text[max(0, start - 16):start]
    if not closer and i < len(text) and text[i] == ">" and before.endswith("<"):
        return (i + 1, "xml")
    if closer in ('"', "'"):
        m = _CALL_COMMA.match(text, i)
        if m and before.rstrip("'\" \t").endswith(("(", "[", "{", ",")):
            return (m.end(), ",")  # setProperty("DB_PASSWORD", "...") / put("db.password", "...")
        m = _XML_ATTR.match(text, i)
        if m and re.search(r"(?:key|name)[ \t]{0,4}=[ \t]{0,4}['\"]\Z", before):
            return (m.end(), "attr")  # <add key="Password" value="..." />
    if re.search(r"name[ \t]{0,4}:[ \t]{0,4}['\"]?\Z", before):
        m = _K8S_VALUE.match(text, end)
        if m:
            return (m.end(), "k8s")  # - name: DB_PASSWORD \n value: "..."
    m = _OPERATOR.match(text, i)
    if m is not None and m.group().strip() == ":":
        typed = _TYPED.match(text, m.end())
        if typed is not None:
            return (typed.end(), "=")  # `key: str = "..."`: the value is after the type
    if m is not None:
        return (m.end(), "=")
    if not closer:
        typed = _SPACE_TYPED.match(text, i)
        if typed is not None:
            return (typed.end(), "=")  # `var apiToken string = "..."`
    line = text.rfind("\n", 0, start) + 1
    if closer in ("", '"', "'"):
        m = _CSV_COMMA.match(text, i)
        if m is not None and text[line:start].strip(" \t\"'") == "":
            return (m.end(), "row")  # a CSV row `db_password,VALUE`
    if closer:
        return None
    m = _SPACE_QUOTED.match(text, i)
    if m is not None:
        return (m.end(), "quoted")
    m = _DIRECTIVE_VALUE.match(text, i)
    if m is not None and _DIRECTIVE.fullmatch(text, line, start):
        return (m.end(), "directive")
    return None


def _named_value(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    end = m.end()
    name = _name_before(text, end)
    found = _assignment(text, end, name)
    if found is None:
        return None
    i, how = found
    start = _identifier_start(text, end)
    if how == "=" and text[max(0, end - 8):end].lower() == "--secret" and _SECRET_SPEC.match(text, i):
        return None  # `--secret=id=npm,env=NPM_TOKEN`: a build secret's spec (see _flag)
    if "." in name and _LOG_LEVEL.search(text, max(0, start - 9), start):
        return None  # a logger's name: "WARNING:huggingface_hub.utils._auth:..."
    level = _secret_level(name)
    if how == "=" and text.startswith(":", end) and _MAVEN_GROUP.fullmatch(name) and _MAVEN_ARTIFACT.match(text, i):
        return None  # a Maven coordinate: io.jsonwebtoken:jjwt-api:0.12.6, com.google.auth:google-auth-library
    if how == "xml":
        return _xml_value(r, text, i, name, level)
    if level == 0:
        # A bare `key=` (wandb.login(key=...)) or "key": "..." holds a secret when its value
        # looks like one; "for key: <cache key>" or `cache_key=` does not say so.
        if name.lower() == "key" and how == "=" and ("=" in text[end:i] or text[i:i + 1] in ("'", '"')):
            return _mask_from(r, text, i, check=_credential_shaped)
        return None
    j = _skip_string_prefix(text, i)
    if j > i and "f" in text[i:j].lower():
        span = value_span(text, j)
        if span and "{" in text[span[0]:span[1]]:
            return None  # an f-string: a template, filled in by the program
    i = j
    if how in (",", "attr", "quoted") and text[i:i + 1] not in ("'", '"'):
        return None
    if how in ("quoted", "directive", "row"):
        # Written without an operator: only a name that says secret (level 2), and a value shaped
        # like a credential, not a word ("Set DB_PASSWORD first", "password,required").
        if level < 2:
            return None
        return _mask_from(r, text, i, check=lambda v: _credential_like(v) and not _names_a_secret(v)
                          and v.lower() != name.lower())
    if level == 1:
        return _weak_secret(r, text, i)
    word = m.group().lower()
    if word.startswith("authorization"):
        scheme = _SCHEME.match(text, i)
        if scheme:
            i = scheme.end()
    return _mask_from(r, text, i, line=word.startswith("cookie"),
                      check=lambda v: v.lower() != name.lower() and not _names_a_secret(v))


def _xml_value(r: "Redactor", text: str, i: int, name: str, level: int) -> Hit | None:
    """<apiToken>VALUE</apiToken>, on one line or three."""
    if level == 0:
        return None
    m = _XML_TEXT.match(text, i)
    if m is None:
        return None
    value = m.group(1).rstrip()
    close = name.rsplit(":", 1)[-1]
    if not text.startswith(close, m.end()) or not _plausible_secret(value):
        return None
    if level == 1 and not _secret_shaped(value):
        return None
    return (m.start(1), m.start(1) + len(value), r.secret_render(value))


# `docker build --secret id=hf,src=$HOME/.hf_token` (BuildKit, podman, buildah): the value of
# `--secret` is a spec that says where a secret comes from, not the secret itself.
_SECRET_SPEC = re.compile(r"(?:id|type|src|source|env|required|target|mode|uid|gid)=", re.I)


def _flag(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    level = _secret_level(m.group(1))
    if level == 0:
        return None
    if m.group(1).lower() in ("secret", "mount") and _SECRET_SPEC.match(text, m.end()):
        return None
    if level == 1:  # "Pass --token for a non-interactive login."
        return _weak_secret(r, text, m.end())
    return _mask_from(r, text, m.end(),
                      check=lambda v: v.lower().replace("-", "_") != m.group(1).lower().replace("-", "_"))


def _loose(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    check = _has_letter_and_digit
    if m.group(1) == "key" and not is_secret_name(_name_before(text, m.end(1))):
        # "cache hit for key fatexag6p..." (lower case, a digest): a key, not a secret
        # one; "the key is Rk9PQkFS..." (upper, lower and digits) is one.
        check = _mixed_case_and_digit
    return _mask_from(r, text, m.end(), pattern=_LOOSE_VALUE, check=check)


def _query(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    name = m.group(1)
    if name not in _QUERY_NAMES and _secret_level(name) < 2:
        return None
    return _mask_from(r, text, m.end(), pattern=_QUERY_VALUE)


def _line_start(text: str, i: int) -> int:
    """The start of the logical line around text[i]: lines continued with a backslash count."""
    start = text.rfind("\n", 0, i) + 1
    for _ in range(6):
        if start < 2 or text[start - 2] != "\\":
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return start


def _curl_user(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    """`curl -u user:password` (`--user`, quoted or not): the credentials, when the password is a
    literal (not `$TOKEN`, `<password>` or empty)."""
    line = _line_start(text, m.start())
    if not re.search(r"(?<![\w-])curl(?![\w-])", text[line:m.start()]):
        return None
    span = value_span(text, m.end())
    if span is None:
        return None
    value = text[span[0]:span[1]]
    user, colon, password = value.partition(":")
    if not colon or len(password) < 3 or password.startswith(("$", "<", "[", "{")) or not _plausible_secret(password):
        return None
    return (span[0], span[1], r.secret_render(value))


def _mysql_password(r: "Redactor", m: re.Match[str], text: str) -> Hit | None:
    """`mysql -pPASSWORD` (mysqldump, mariadb...): the password glued to -p."""
    line = _line_start(text, m.start())
    if not _MYSQL_COMMANDS.search(text, line, m.start()):
        return None
    return _mask_from(r, text, m.end(), check=lambda v: not v.startswith(("$", "<")))


def named(r: "Redactor", s: str, low: str) -> list[Span]:
    out: list[Span] = []

    def after(pattern: re.Pattern[str] | None = None, check: Callable[[str], bool] | None = None):
        return lambda m, text: _mask_from(r, text, m.end(), pattern=pattern, check=check)

    if _any(low, _KV_WORDS):
        out += scan(s, _NAMED, lambda m, text: _named_value(r, m, text), RANK_SECRET, low=low)
    if "-" in s:
        if "--" in s or " -" in s or s.startswith("-"):
            out += scan(s, _FLAG, lambda m, text: _flag(r, m, text), RANK_SECRET)
        if "curl" in low:
            out += scan(s, _CURL_USER, lambda m, text: _curl_user(r, m, text), RANK_SECRET)
        if "-p" in s and ("mysql" in low or "maria" in low):
            out += scan(s, _MYSQL_P, lambda m, text: _mysql_password(r, m, text), RANK_SECRET)
    if "bearer" in low or "basic" in low:
        out += scan(s, _BEARER, after(_BEARER_VALUE, _credential_like), RANK_SECRET, low=low)
    if _any(low, _LOOSE_WORDS):
        out += scan(s, _LOOSE, lambda m, text: _loose(r, m, text), RANK_SECRET, low=low)
    if "=" in s and ("?" in s or "&" in s):
        out += scan(s, _QUERY, lambda m, text: _query(r, m, text), RANK_SECRET, low=low)
    if "login" in low:
        out += scan(s, _NETRC, after(), RANK_SECRET)
        out += scan(s, _WANDB_LOGIN, after(_WORD_VALUE), RANK_SECRET)
    return out
