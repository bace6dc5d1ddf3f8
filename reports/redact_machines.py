"""Redaction's identity and machine detectors: homes, user names, e-mail addresses, `user@host`,
host names in a host context, addresses, and the ids of a machine and its GPUs.

Each function reads the original text and returns `Span`s (gpudoctor.reports.redact_spans) for
the `Redactor` that calls it; what is kept on purpose (loopback and netmasks, versions, revisions
after `@`, public index hosts, Python module names that end like a host's domain) is decided
here, before any placeholder is numbered. Every pattern is linear.
"""
from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Callable

from gpudoctor.reports.redact_rules import (
    _AMBIGUOUS_SUFFIXES, _any, _AWS_HOSTNAME, _BRACKET_HOST, _CODE_RECEIVERS, _code_value,
    _COLUMN_BEFORE, _CONNECT_HOST, _EMAIL, _FILE_SUFFIXES, _FLAG, _GENERIC_HOME_NAMES, _GENERIC_NAMES,
    _GENERIC_URL_USERS, _HEX32, _HOMES, _HOST_ANCHOR, _HOST_TLDS, _HOST_WORDS, _HOSTNAME,
    _identifier_start, _INTERNAL_FQDN, _INTERNAL_SUFFIXES, _IPV4, _IPV6, _IPV6_RUN, _is_host_name,
    _is_ip, _LOG_LEVEL, _MAC, _MACHINE_ID, _name_before, _NCCL_PREFIX, _NODELIST, _NOT_HOST_WORDS,
    _public_host, _RDZV_URL, _REVISION, _SEP, _SERIAL, _SERIAL_VALUE, _USER_AT_HOST, _UUID,
    _version_before,
)
from gpudoctor.reports.redact_spans import RANK_IDENTITY, RANK_MACHINE, Hit, Span, scan, sub_spans

if TYPE_CHECKING:
    from gpudoctor.reports.redact import Redactor

# A package spec, not a login: `lodash@npm:4.17.21`, `react@canary`, `vite@latest`, an image's
# `name@sha256:...`.
_PACKAGE_HOSTS = frozenset({"npm", "patch", "workspace", "file", "link", "portal", "git", "github", "latest",
                            "next", "canary", "beta", "alpha", "rc", "stable", "nightly", "sha256", "sha512",
                            "sha384", "sha1", "md5", "main", "master", "head"})

# --- identity -----------------------------------------------------------------------------------------


def home(r: "Redactor", s: str) -> list[Span]:
    """This user's home folder as `~`."""
    if not r.home_pattern or r.home not in s:
        return []
    return [Span(m.start(), m.end(), RANK_IDENTITY, lambda: "~") for m in r.home_pattern.finditer(s)]


def identity(r: "Redactor", s: str, low: str) -> list[Span]:
    out: list[Span] = []
    if _any(low, ("/home/", "/users/", "\\users\\", ":/users/")):
        out += sub_spans(_HOMES, s, lambda m: _home_of(r, m), RANK_IDENTITY, order=1)
    if "@" in s:
        out += sub_spans(_EMAIL, s, lambda m: _email(r, m), RANK_IDENTITY, order=1)
        out += sub_spans(_USER_AT_HOST, s, lambda m: _user_at_host(r, m), RANK_IDENTITY, order=2)
    return out


def _home_of(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    prefix = m.group(1) or m.group(2)
    name = m.group(3)
    if name.startswith("<") or name.lower() in _GENERIC_HOME_NAMES or name in r.users:
        return None  # a placeholder, Public, or this user (whose name is hidden as such)
    return lambda: prefix + r.pseudonym("user", name)


def _user_at_host(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    user, host = m.group(1), m.group(2)
    if (_public_host(host) or not re.search(r"[A-Za-z]", host) and not _is_ip(host) or _REVISION.fullmatch(host)
            or host.split(".", 1)[0] in _CODE_RECEIVERS or host.lower() in _PACKAGE_HOSTS):
        return None  # a revision (repo@<commit>), a matmul (h@self.proj.weight), a package spec

    def render() -> str:
        if user in r.users:
            user_label = "<user>"
        elif user.lower() in _GENERIC_NAMES or user.startswith("<"):
            user_label = user
        else:
            user_label = r.pseudonym("user", user)
        return f"{user_label}@{host if host.startswith('<') else r.host_label(host)}"

    return render


def _email(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    local, domain = m.group(1), m.group(2)
    tld = domain.rsplit(".", 1)[-1]
    if (not tld.isalpha() or len(tld) < 2 or local.lower() in _GENERIC_URL_USERS or tld.lower() in _FILE_SUFFIXES
            or domain.split(".", 1)[0] in _CODE_RECEIVERS):
        return None  # file.zip@member.pkl, model@2.safetensors, h@self.proj.weight (a matmul)
    value = m.group()
    return lambda: r.pseudonym("email", value)


# --- hosts ---------------------------------------------------------------------------------------------


def host_value(
    r: "Redactor", text: str, i: int, *, nodelist: bool = False, prose: bool = False, weak: bool = False,
) -> Hit | None:
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
        address = v6.group()
        return (v6.start(), v6.end(), lambda: r.ip_label(_is_ip(address), address))  # type: ignore[arg-type]
    m = (_NODELIST if nodelist else _HOSTNAME).match(text, i)
    if not m:
        return None
    name = m.group().rstrip(".")
    end = m.start() + len(name)
    if end < len(text) and text[end] in "_(" or not nodelist and text[end:end + 1] == "[":
        return None  # a name in a program: socket.gethostname(), args.master_addr, Optional[str]
    if text.startswith("://", end):
        return None  # a URL's scheme (`--host http://localhost`), not a host
    if not quoted and len(name) <= 2 and text[end:end + 1] in ("'", '"'):
        return None  # a string prefix: f"{master_addr}:{port}"
    if nodelist:
        # gpu[001-004,007], node01,node02; not `Sequence[BaseSchedulerNode]`
        if re.search(r"[A-Za-z]", name) and re.search(r"\d", name):
            return (m.start(), end, lambda: r.host_label(name))
        return None
    if _is_ip(name):
        return (m.start(), end, lambda: r.ip_label(_is_ip(name), name))  # type: ignore[arg-type]
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
    learn = not weak or "-" in name or name.count(".") >= 2
    return (m.start(), end, lambda: r.host_label(name, learn=learn))


def _host_or_keep(r: "Redactor", name: str, at: int) -> Span | None:
    hit = host_value(r, name, 0)
    if hit is None or hit[0] != 0:
        return None
    return Span(at, at + hit[1], RANK_MACHINE, hit[2])


def _internal_fqdn(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    # "threading.local", "sklearn.cluster" and "google.protobuf.internal" are Python;
    # "gpu-node-3.local", "ip-10-0-1-2.ec2.internal" and "a.b.svc.cluster.local" are hosts.
    name = m.group()
    if (name.lower().endswith(_AMBIGUOUS_SUFFIXES) and not re.search(r"[\d-]", name)
            and not name.lower().endswith(".svc.cluster.local")):
        return None
    return lambda: r.host_label(name)


def _mask_kind(r: "Redactor", text: str, i: int, pattern: re.Pattern[str], kind: str) -> Hit | None:
    m = pattern.match(text, i)
    if not m or m.group().upper() in ("N/A", "NONE", "UNKNOWN"):
        return None
    value = m.group()
    return (m.start(), m.end(), lambda: r.pseudonym(kind, value))


def _uuid(r: "Redactor", m: re.Match[str]) -> Callable[[], str]:
    prefix, value = m.group(1), m.group(2)

    def render() -> str:
        label = r.pseudonym("uuid", value)
        return f"{prefix}-{label}" if prefix else label

    return render


def _mac(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    if not m.group().strip("0:-"):
        return None  # all zeros: "no address", which is diagnostic
    value = m.group()
    return lambda: r.pseudonym("mac", value)


def _ipv6(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    text = m.group()
    stripped = text.rstrip(".")
    if "::" not in stripped and stripped.count(":") < 6:
        return None  # 10:20:30, a time; an address has eight groups or a "::"
    ip = _is_ip(stripped)
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    # "::2" in a slice or "10::100" is not an address anyone would redact; "c10::" is C++.
    if stripped.count(":") < 3 and (not re.search(r"[A-Fa-f]", stripped) or stripped.endswith("::")):
        return None
    if r.keeps_ip(ip, stripped):
        return None
    return lambda: r.ip_label(ip, stripped) + text[len(stripped):]


def _ipv4(r: "Redactor", m: re.Match[str]) -> Callable[[], str] | None:
    ip = _is_ip(m.group())
    if ip is None or r.keeps_ip(ip, m.group()):
        return None
    s, start = m.string, m.start()
    if _version_before(s[max(0, start - 48):start]):
        return None
    nl = s.rfind("\n", max(0, start - 128), start)
    if (nl >= 0 or start <= 128) and _COLUMN_BEFORE.match(s, nl + 1, start):
        return None  # a "name   1.2.3.4" column of pip list or conda list
    value = m.group()
    return lambda: r.ip_label(ip, value)


def machines(r: "Redactor", s: str, low: str, *, versions: bool) -> list[Span]:
    out: list[Span] = []

    def host_kv(m: re.Match[str], text: str) -> Hit | None:
        name = _name_before(text, m.end())
        if not _is_host_name(name):
            return None
        start = _identifier_start(text, m.end())
        if "." in name and _LOG_LEVEL.search(text, max(0, start - 9), start):
            return None  # a logger's name: "WARNING:urllib3.util.ssl_match_hostname:..."
        sep = _SEP.match(text, m.end())
        weak = not name.isupper() and not _is_host_name(name, strong=True)
        return host_value(r, text, sep.end() if sep else m.end(), nodelist="list" in name.lower(), weak=weak)

    def host_flag(m: re.Match[str], text: str) -> Hit | None:
        if not _is_host_name(m.group(1)):
            return None
        return host_value(r, text, m.end())

    if _any(low, _HOST_WORDS):
        out += scan(s, _HOST_ANCHOR, host_kv, RANK_MACHINE, low=low)
    if "--" in s or " -" in s:
        out += scan(s, _FLAG, host_flag, RANK_MACHINE)
    if "]:" in s:
        out += filter(None, (_host_or_keep(r, m.group(1), m.start(1)) for m in _BRACKET_HOST.finditer(s)))
    if _any(low, ("connect", "listen", "bind", "bound", "reach")):
        out += scan(s, _CONNECT_HOST, lambda m, text: host_value(r, text, m.end(), prose=True), RANK_MACHINE, low=low)
    if "://" in s:
        out += scan(s, _RDZV_URL, lambda m, text: host_value(r, text, m.end()), RANK_MACHINE, low=low)
    if "NCCL" in s:
        out += filter(None, (_host_or_keep(r, m.group(1), m.start(1)) for m in _NCCL_PREFIX.finditer(s)))
    if _any(low, _INTERNAL_SUFFIXES):
        out += sub_spans(_INTERNAL_FQDN, s, lambda m: _internal_fqdn(r, m), RANK_MACHINE)
    if "ip-" in s:
        out += sub_spans(_AWS_HOSTNAME, s, lambda m: (lambda name=m.group(): r.host_label(name)), RANK_MACHINE)
    if "machine" in low:
        out += scan(s, _MACHINE_ID, lambda m, text: _mask_kind(r, text, m.end(), _HEX32, "machine-id"), RANK_MACHINE, low=low)
    if "serial" in low:
        out += scan(s, _SERIAL, lambda m, text: _mask_kind(r, text, m.end(), _SERIAL_VALUE, "serial"), RANK_MACHINE, low=low)
    if "-" in s:
        out += sub_spans(_UUID, s, lambda m: _uuid(r, m), RANK_MACHINE)
    if ":" in s or "-" in s:
        out += sub_spans(_MAC, s, lambda m: _mac(r, m), RANK_MACHINE)
    if ":" in s:
        out += sub_spans(_IPV6, s, lambda m: _ipv6(r, m), RANK_MACHINE)
    if not versions and "." in s:
        out += sub_spans(_IPV4, s, lambda m: _ipv4(r, m), RANK_MACHINE)
    return out
