"""One redaction for everything we record: a manifest's config, a checkpoint's config, log lines.

Conservative by default: a value is replaced by `***` when its key names a credential (in any
of the spellings fsspec backends use: `secret`, `sas_token`, `AccountKey`, `X-Api-Key`,
`passphrase`, `client_kwargs.auth`, ...), and, whatever its key, the credential-shaped parts of
every string are masked: the password of a URL's userinfo (the URL itself stays readable),
secret fields of connection strings and query strings (`AccountKey=`, `sig=`,
`X-Amz-Signature=`), `Bearer`/`Basic` values, PEM private keys, and tokens of known shapes
(AWS access key ids, GitHub/Hugging Face/Slack/Google tokens, JWTs, base64 secrets).
Whole dicts and lists under a secret key go. Booleans, nulls and empty values stay: they hide
nothing and say "no key set" or "anonymous". Harmless settings stay readable: endpoints
without userinfo, regions, bucket names, user and account names, `anon`, `signature_version`.

A leaf module: it imports nothing from this project, so every package may use it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Whole words of a key (split at `_`, `-`, `.`, spaces and camelCase) that name a credential.
_SECRET_WORDS = frozenset(
    "key keys secret secrets token auth sas sig pwd pw pass passwd password passphrase psk "
    "otp acct session cred creds credential credentials cookie cookies jwt bearer ticket "
    "signature private pkey authorization apikey".split()
)
# Substrings of a key with its separators removed: the run-together spellings
# (`accesstoken`, `AccountKey` written `accountkey`, `connectionstring`, `passwd`).
_SECRET_PARTS = (
    "secret",
    "passw",
    "passphrase",
    "credential",
    "cookie",
    "connectionstring",
    "connstr",
    "apikey",
    "accesskey",
    "accountkey",
    "privatekey",
    "sastoken",
    "accesstoken",
    "authtoken",
    "refreshtoken",
    "idtoken",
    "apitoken",
    "sessiontoken",
    "securitytoken",
    "authorization",
    "oauth",
    "pkey",
)
# Keys that match the words above but never hold a secret (botocore's "s3v4").
_HARMLESS_KEYS = frozenset({"signatureversion"})
# A number under these is a setting (`auth_timeout: 30`, `max_tokens: 77`), not a PIN.
_NUMERIC_FIRST = frozenset({"max", "min", "num"})
_NUMERIC_LAST = frozenset({"timeout", "retries", "version", "count", "size", "limit", "tokens"})
# HTTP headers whose values are safe to show; every other header value is redacted, since
# any custom header may carry a credential (`X-Custom-Gateway: ...`).
_SAFE_HEADERS = frozenset(
    "accept acceptencoding acceptlanguage cachecontrol contenttype contentencoding "
    "contentlanguage range referer useragent connection".split()
)

_CAMEL = (re.compile(r"([A-Z]+)([A-Z][a-z])"), re.compile(r"([a-z0-9])([A-Z])"))
_PEM = re.compile(
    r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----)(.*?)(-----END [A-Z0-9 ]*-----|\Z)", re.S
)
_AUTH_SCHEME = re.compile(
    r"(?i)\b(bearer|basic|token|negotiate|ntlm)([ \t]+)([A-Za-z0-9._~+/:=\-]{8,})"
)
_AUTH_PARAMS = re.compile(
    r"\b(Digest|OAuth|AWS4-HMAC-SHA256|SharedKey|SharedKeyLite|SharedAccessSignature)"
    r"([ \t]+)(\S.*)"
)
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s\"'<>]*)")
_NAME_VALUE = re.compile(r"(?<![\w.\-])([A-Za-z_][\w.\-]*)=([^;&\s]*)")
_TOKENS = re.compile(
    r"\b(?:(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|hf_[A-Za-z0-9]{30,}|glpat-[\w\-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|(?:sk|rk)[-_][\w\-]{20,}|AIza[\w\-]{35}"
    r"|ya29\.[\w\-]{20,}|eyJ[\w\-]{8,}\.[\w\-]{8,}\.[\w\-]*|sl\.[\w\-]{40,}"
    r"|LTAI[A-Za-z0-9]{12,30}|npm_[A-Za-z0-9]{36})"
)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9+/=_\-]+")
_AWS_SECRET = re.compile(r"[A-Za-z0-9+/]{40}")


def key_words(name: str) -> list[str]:
    """`SSEKMSKeyId` -> ['ssekms', 'key', 'id']; `x-amz-security-token` -> [..., 'token']."""
    for pattern in _CAMEL:
        name = pattern.sub(r"\1_\2", name)
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def is_secret_key(name: object) -> bool:
    """Whether a key (an fsspec option, a header, a query or connection-string field) names
    a credential."""
    words = key_words(str(name))
    joined = "".join(words)
    if not words or joined in _HARMLESS_KEYS:
        return False
    return any(w in _SECRET_WORDS for w in words) or any(p in joined for p in _SECRET_PARTS)


def _numeric_setting(name: object) -> bool:
    words = key_words(str(name))
    return bool(words) and (words[0] in _NUMERIC_FIRST or words[-1] in _NUMERIC_LAST)


def redact(value: Any) -> Any:
    """A copy of a config tree (dicts, lists, strings, numbers) with every credential
    replaced by '***'; see the module's docstring for what counts as one."""
    return _redact(value, in_headers=False)


def _redact(value: Any, in_headers: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _redact_item(k, v, in_headers) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_redact(v, False) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return f"<{type(value).__name__}>"  # an object we cannot look inside: show its type only


def _redact_item(key: object, value: Any, in_headers: bool) -> Any:
    if value is None or isinstance(value, bool) or value in ("", [], {}):
        return value  # nothing hidden in these; they show that no credential is set
    if in_headers and "".join(key_words(str(key))) not in _SAFE_HEADERS:
        return REDACTED
    if is_secret_key(key):
        if isinstance(value, (int, float)) and _numeric_setting(key):
            return value
        return REDACTED
    return _redact(value, in_headers="headers" in key_words(str(key))[-1:])


def redact_text(text: str) -> str:
    """`text` with its credential-shaped parts masked: URL passwords, secret fields of
    connection and query strings, auth header values, private keys and known token shapes.
    Use it on anything printed or logged that may hold a URL or an option value."""
    nested = _redact_json_text(text)
    if nested is not None:
        return nested
    if "PuTTY-User-Key-File" in text:
        return REDACTED
    if _looks_like_secret(text.strip()):
        return REDACTED
    text = _PEM.sub(lambda m: f"{m[1]}{REDACTED}{m[3]}", text)
    text = _AUTH_PARAMS.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", text)
    text = _AUTH_SCHEME.sub(_mask_auth_value, text)
    text = _URL.sub(lambda m: m[1] + _mask_userinfo(m[2]), text)
    text = _NAME_VALUE.sub(_mask_field, text)
    return _TOKENS.sub(REDACTED, text)


def _redact_json_text(text: str) -> str | None:
    """A string that holds a JSON object or list (a service-account file pasted inline),
    redacted as a tree; None when `text` is not one."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        tree = json.loads(stripped)
    except ValueError:
        return None
    if not isinstance(tree, (dict, list)):
        return None
    cleaned = redact(tree)
    return text if cleaned == tree else json.dumps(cleaned)


def _mask_auth_value(match: re.Match[str]) -> str:
    word, space, value = match[1], match[2], match[3]
    if value.isalpha() and value.islower():
        return match[0]  # prose ("basic authentication"), not a credential
    return f"{word}{space}{REDACTED}"


def _mask_field(match: re.Match[str]) -> str:
    name, value = match[1], match[2]
    if value and is_secret_key(name):
        return f"{name}={REDACTED}"
    return match[0]


def _mask_userinfo(rest: str) -> str:
    """The part of a URL after `scheme://`, with the password of its userinfo masked.

    A raw password may hold `@`, `/`, `?` or `#`, so the password runs from the first `:` to
    the URL's last `@`: a path that holds both (rare) is over-masked, never leaked. Without a
    `:`, a user name before the authority's `@` stays unless it is itself a token."""
    last_at = rest.rfind("@")
    if last_at < 0:
        return rest
    user, colon, _password = rest[:last_at].partition(":")
    if colon:
        return f"{REDACTED if _looks_like_secret(user) else user}:{REDACTED}{rest[last_at:]}"
    authority_end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    at = rest.rfind("@", 0, authority_end)
    if at < 0 or not _looks_like_secret(rest[:at]):
        return rest
    return REDACTED + rest[at:]


def _looks_like_secret(text: str) -> bool:
    """A standalone value shaped like a generated secret: an AWS-style 40-character secret,
    a base64 blob, or a long random-looking token. Names and paths (words between
    separators, lower-case hashes) do not match."""
    if _TOKENS.fullmatch(text):
        return True
    if len(text) < 24 or not _TOKEN_CHARS.fullmatch(text):
        return False
    if not (any(c.isupper() for c in text) and any(c.islower() for c in text)):
        return False
    if not any(c.isdigit() for c in text):
        return False
    if _AWS_SECRET.fullmatch(text) or "+" in text or text.endswith("="):
        return True
    return len(text) >= 32 and _class_changes(text) >= 0.4 and _entropy(text) >= 4.0


def _class_changes(text: str) -> float:
    """Share of neighbouring letters/digits that switch between upper, lower and digit: about
    0.6 for random base62, under 0.36 for model names and paths."""
    kinds = [0 if c.isupper() else 1 if c.islower() else 2 if c.isdigit() else -1 for c in text]
    pairs = [(a, b) for a, b in zip(kinds, kinds[1:], strict=False) if a >= 0 and b >= 0]
    return sum(a != b for a, b in pairs) / max(1, len(pairs))


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())
