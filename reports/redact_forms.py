"""Redaction's table of credential formats: the secrets that can be recognised by their form alone.

One row per format: a family name, the literal prefixes that must occur in a text before its
pattern is run (cheap substring tests, so a log line pays for the patterns it could match, not for
sixty), and the pattern. Every pattern starts at a run boundary (nothing of a token's alphabet
before it) and is linear: bounded quantifiers, no nested repetition.

The facts (prefix, length, alphabet) are the vendors' documented formats where there is such a
document (GitHub, GitLab, Slack, Hugging Face, AWS, HashiCorp Vault, age, RFC 7519 for JWTs), and
otherwise those of gitleaks's rule set (MIT, github.com/gitleaks/gitleaks, config/gitleaks.toml),
used as a source of facts, not copied. tools/secret_corpus.py generates a recall corpus from the
same formats and lists gitleaks rules no row covers (`--gitleaks`); docs/reports.md says how the
two are kept current together.

Standard library only.
"""
from __future__ import annotations

import re

_B = r"(?<![A-Za-z0-9_-])"  # a token starts where no token character is before it

# (family, prefixes that gate the pattern, pattern). A family may hold several kinds of token.
FORMS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("GitHub", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _B + r"gh[opusr]_[A-Za-z0-9]{30,255}"),
    ("GitHub fine-grained", ("github_pat_",), _B + r"github_pat_[A-Za-z0-9_]{22,255}"),
    ("GitLab", ("glpat-", "glrt-", "gldt-", "glcbt-", "glptt-", "glft-", "glimt-", "glagent-", "gloas-",
                "glsoat-", "glffct-"),
     _B + r"gl(?:pat|rt|dt|cbt|ptt|ft|imt|agent|oas|soat|ffct)-[A-Za-z0-9_.-]{20,300}"),
    ("GitLab runner registration", ("GR1348941",), _B + r"GR1348941[A-Za-z0-9_-]{20,64}"),
    ("GitLab session", ("_gitlab_session=",), r"(?<=_gitlab_session=)[0-9a-z]{32}"),
    ("Hugging Face", ("hf_",),
     _B + r"hf_(?=[A-Za-z0-9]{0,63}[A-Z])(?=[A-Za-z0-9]{0,63}[a-z])[A-Za-z0-9]{30,64}"),
    ("Hugging Face organisation", ("api_org_",), _B + r"api_org_[A-Za-z0-9]{30,64}"),
    ("Perplexity", ("pplx-",), _B + r"pplx-[A-Za-z0-9]{40,64}"),
    ("OpenAI, Anthropic", ("sk-",),
     _B + r"sk-(?:proj-|ant-[a-z]{2,8}\d{2}-|svcacct-|admin-)?(?=[A-Za-z0-9_-]{0,199}[0-9])[A-Za-z0-9_-]{20,255}"),
    ("Stripe", ("sk_", "rk_"), _B + r"[sr]k_(?:live|test|prod)_[A-Za-z0-9]{10,255}"),
    ("Slack", ("xox",), _B + r"xox[abposre](?:\.xox[bp])?-[A-Za-z0-9-]{10,255}"),
    ("Slack app", ("xapp-",), _B + r"xapp-\d-[A-Za-z0-9-]{10,255}"),
    ("Google", ("AIza",), _B + r"AIza[0-9A-Za-z_-]{35}"),
    ("AWS access key id", ("AKIA", "ASIA", "ABIA", "ACCA", "A3T", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
     _B + r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}(?![A-Z0-9])"),
    ("Amazon Bedrock", ("ABSK", "bedrock-api-key-"),
     _B + r"(?:ABSK[A-Za-z0-9+/]{100,400}={0,2}|bedrock-api-key-YmVkcm9jay5hbWF6b25hd3MuY29t[A-Za-z0-9+/=%_-]{0,4096})"),
    ("npm", ("npm_",), _B + r"npm_[A-Za-z0-9]{36}"),
    ("PyPI", ("pypi-",), _B + r"pypi-AgE[A-Za-z0-9_-]{50,1024}"),
    ("JWT", ("eyJ",), _B + r"eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]{0,4096}"),
    ("JWT, base64-encoded", ("ZXlK",), _B + r"ZXlK[A-Za-z0-9+/]{36,8192}={0,2}"),
    ("Grafana", ("eyJrIjoi", "glc_", "glsa_"),
     _B + r"(?:eyJrIjoi[A-Za-z0-9]{60,400}={0,3}|glc_[A-Za-z0-9+/]{32,400}={0,3}|glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8})"),
    ("DigitalOcean", ("dop_v1_", "doo_v1_", "dor_v1_"), _B + r"do[por]_v1_[a-f0-9]{64}"),
    ("Telegram bot", (":AA",), r"(?<![\w.-])\d{8,10}:AA[A-Za-z0-9_-]{33}"),
    ("Shopify", ("shpat_", "shpca_", "shppa_", "shpss_"), _B + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32,64}"),
    ("HashiCorp Vault", ("hvs.", "hvb."), _B + r"hv[sb]\.[A-Za-z0-9_-]{90,400}"),
    ("HashiCorp Terraform", (".atlasv1.",), _B + r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,70}"),
    ("Sentry", ("sntrys_", "sntryu_"), _B + r"(?:sntrys_[A-Za-z0-9+/=]{20,600}_[A-Za-z0-9+/]{43}|sntryu_[a-f0-9]{64})"),
    ("SendGrid", ("SG.",), _B + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    ("Twilio", ("SK", "AC"), _B + r"(?:SK|AC)(?=[0-9a-fA-F]{0,31}[a-fA-F])(?=[0-9a-fA-F]{0,31}[0-9])[0-9a-fA-F]{32}(?![0-9A-Za-z])"),
    ("age", ("AGE-SECRET-KEY-1",), _B + r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    ("Databricks", ("dapi",), _B + r"dapi[a-f0-9]{32}(?:-\d)?"),
    ("Doppler", ("dp.pt.",), _B + r"dp\.pt\.[A-Za-z0-9]{40,48}"),
    ("Linear", ("lin_api_",), _B + r"lin_api_[A-Za-z0-9]{40}"),
    ("Postman", ("PMAK-",), _B + r"PMAK-[a-fA-F0-9]{24}-[a-fA-F0-9]{34}"),
    ("Pulumi", ("pul-",), _B + r"pul-[a-f0-9]{40}"),
    ("Prefect", ("pnu_",), _B + r"pnu_[A-Za-z0-9]{36}"),
    ("RubyGems", ("rubygems_",), _B + r"rubygems_[a-f0-9]{48}"),
    ("PlanetScale", ("pscale_",), _B + r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_.=-]{32,64}"),
    ("Dynatrace", ("dt0c01.",), _B + r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"),
    ("EasyPost", ("EZAK", "EZTK"), _B + r"EZ[AT]K[A-Za-z0-9]{54}"),
    ("Fly.io", ("fo1_", "fm1", "fm2_"), _B + r"(?:fo1_[A-Za-z0-9_-]{43}|fm1[ar]_[A-Za-z0-9+/]{100,4096}={0,3}|fm2_[A-Za-z0-9+/]{100,4096}={0,3})"),
    ("Heroku", ("HRKU-AA",), _B + r"HRKU-AA[A-Za-z0-9_-]{58}"),
    ("Notion", ("ntn_",), _B + r"ntn_[0-9]{11}[A-Za-z0-9]{35}"),
    ("ReadMe", ("rdme_",), _B + r"rdme_[a-z0-9]{70}"),
    ("Scalingo", ("tk-us-",), _B + r"tk-us-[A-Za-z0-9_-]{48}"),
    ("Brevo (Sendinblue)", ("xkeysib-",), _B + r"xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}"),
    ("Shippo", ("shippo_",), _B + r"shippo_(?:live|test)_[a-fA-F0-9]{40}"),
    ("Square", ("EAAA", "sq0atp-", "sq0csp-"), _B + r"(?:EAAA|sq0atp-|sq0csp-)[A-Za-z0-9_-]{22,60}"),
    ("Facebook page", ("EAAM", "EAAC"), _B + r"EAA[MC][A-Za-z0-9]{100,400}"),
    ("JFrog Artifactory", ("AKCp", "cmVmd"), _B + r"(?:AKCp[A-Za-z0-9]{69}|cmVmd[A-Za-z0-9]{59})(?![A-Za-z0-9])"),
    ("Atlassian", ("ATATT3",), _B + r"ATATT3[A-Za-z0-9_=-]{180,200}"),
    ("Clojars", ("CLOJARS_",), _B + r"CLOJARS_[a-z0-9]{60}"),
    ("OpenShift", ("sha256~",), _B + r"sha256~[A-Za-z0-9_-]{43}"),
    ("Infracost", ("ico-",), _B + r"ico-[A-Za-z0-9]{32}"),
    ("Frame.io", ("fio-u-",), _B + r"fio-u-[A-Za-z0-9_=-]{64}"),
    ("Duffel", ("duffel_",), _B + r"duffel_(?:test|live)_[A-Za-z0-9_=-]{43}"),
    ("Flutterwave", ("FLWSECK", "FLWPUBK"), _B + r"FLW(?:SECK|PUBK)_TEST-[a-hA-H0-9]{12,32}(?:-X)?"),
    ("Adobe", ("p8e-",), _B + r"p8e-[A-Za-z0-9]{32}"),
    ("Alibaba Cloud", ("LTAI",), _B + r"LTAI[A-Za-z0-9]{20}"),
    ("Sourcegraph", ("sgp_",), _B + r"sgp_(?:(?:[a-fA-F0-9]{16}|local)_)?[a-fA-F0-9]{40}"),
    ("1Password", ("ops_eyJ", "A3-"),
     _B + r"(?:ops_eyJ[A-Za-z0-9+/]{250,4096}={0,3}|A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5})"),
    ("SettleMint", ("sm_pat_", "sm_aat_", "sm_sat_"), _B + r"sm_[aps]at_[A-Za-z0-9]{16}"),
    ("Harness", ("pat.", "sat."), _B + r"[ps]at\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}"),
    ("Airtable", ("pat",), _B + r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}"),
    ("Azure AD client secret", ("Q~",), r"(?<![A-Za-z0-9_~.])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.-]{31,34}"),
    ("MaxMind", ("_mmk",), _B + r"[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk"),
    ("42 intra", ("s-s4t2",), _B + r"s-s4t2(?:ud|af)-[a-f0-9]{64}"),
    ("Cloudflare origin CA", ("v1.0-",), _B + r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}"),
    ("Octopus Deploy", ("API-",), _B + r"API-(?=[A-Z0-9]{0,25}[0-9])[A-Z0-9]{26}(?![A-Za-z0-9])"),
)

_COMPILED: dict[str, re.Pattern[str]] = {}


def pattern(source: str) -> re.Pattern[str]:
    """A form's pattern, compiled the first time a text holds its prefix (most never are: a
    command that redacts a few lines does not pay for seventy compilations)."""
    compiled = _COMPILED.get(source)
    if compiled is None:
        compiled = _COMPILED[source] = re.compile(source)
    return compiled


TOKEN_FORMATS: tuple[tuple[tuple[str, ...], str], ...] = tuple((prefixes, source) for _, prefixes, source in FORMS)
# Every prefix once, longest first: the one substring test per prefix that gates the patterns.
PREFIXES: tuple[str, ...] = tuple(sorted({p for _, ps, _ in FORMS for p in ps}, key=lambda p: (-len(p), p)))
SHORTEST = 20  # no format fits in fewer characters: shorter text is not searched


def trie(words: tuple[str, ...]) -> str:
    """One regex for a set of literals, shaped as their trie (`g(?:h[opusr]_|l...)`): sre then
    decides at each position of a text with one branch per character, not one per literal. Of
    two words where one begins the other, the longer is tried first (`gpu(?:-node)?`)."""
    root: dict = {}
    for word in words:
        node = root
        for c in word:
            node = node.setdefault(c, {})
        node[""] = {}

    def build(node: dict) -> str:
        alts = [re.escape(c) + build(child) for c, child in sorted(node.items()) if c]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(root)


# Whether a text holds any prefix at all: one search (most text holds none).
GATE = re.compile(trie(PREFIXES))

# Webhook URLs whose path is the secret: keep the service's host, hide the path.
WEBHOOK = re.compile(
    r"(hooks\.slack\.com/(?:services|workflows|triggers)/|discord(?:app)?\.com/api/webhooks/"
    r"|\.webhook\.office\.com/webhookb2/)([A-Za-z0-9/@_-]{10,512})"
)
