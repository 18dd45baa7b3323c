"""Masking credentials out of text before anything is persisted. Pure.

The raw topic is the only place the original text lives: the reducers redact the personal
fields of every event (``projections.redaction_values.redact_personal``: those its contract
model marks ``Personal``, such as a message's content, a summary's text, a memory's value and a
revocation's reason) before they reach PostgreSQL or any derived store, and count what they
masked, by kind. Each free text in them is scanned here (``redact_text``); a JSON field named
like a secret is masked whole there instead.

The scan is linear in the length of the text, whatever the text. It uses RE2 (``google-re2``),
which never backtracks, and every pattern below is written so that no search can read far past
the match it finds: a part of unbounded length either ends the match (``[class]+`` with nothing
required after it) or stops at a character that every other start of that pattern contains (a
private key body at ``--``, a password in a URL at ``/``, a quoted value at its quote, a key
body line at the end of the line), and the one part that can do neither (a JWT header, up to
the ``.eyJ`` of its payload) is bounded. The rules are alternatives of one pattern, so the text
is scanned once (faster than one pass per rule: see ops/bench/redaction.py); the alternative
that matched picks the handler, which may still leave the match alone after looking at it and
at the characters around it (a digit run that fails the Luhn check, ``Basic`` followed by
something that is not base64 of ``user:password``). The patterns adapt those of Yelp's
detect-secrets plugins (aws, github_token, gitlab_token, npm, stripe, slack, openai, jwt,
basic_auth, private_key, keyword, sendgrid, mailchimp, square_oauth, pypi_token,
telegram_token), rewritten without lookaround and backreferences.

Kinds (the ``X`` of ``[REDACTED:X]``, and the keys of the counts):

- ``private_key``: a PEM, OpenSSH, SSH2 or PGP private key block, or the private lines of a
  PuTTY key. With its END line, everything from BEGIN to END. Without one (truncated text),
  the header, the rest of the header's line, and every following line that is only base64 or
  an armor header (``Version:``, ``Proc-Type:`` ...), blank lines between them included: the
  first other line, and what follows it, are kept.
- ``api_key``: a credential recognised by its format (AWS access key id, GitHub, GitLab, npm,
  Stripe, Slack, OpenAI/Anthropic ``sk-``, Google, Hugging Face, SendGrid, PyPI, Mailchimp,
  Square, Telegram bot), or the value of a key/secret named as such (``api_key``,
  ``x-api-key``, ``client_secret``, ``*_SECRET``, ``aws_secret_access_key`` ...).
- ``token``: the value of a token named as such (``access_token``, ``refresh_token``,
  ``*_TOKEN``, ``TOKEN=``, ``"token"``, ``accessToken``), or an ``Authorization`` value of
  another scheme.
- ``jwt``: a bare JSON Web Token (``eyJ...`` header ``.`` ``eyJ...`` payload ``.`` signature).
- ``bearer_token``: the credential after ``Bearer``.
- ``basic_auth``: the credential after ``Basic`` (outside an ``Authorization`` header only if
  it decodes to ``user:password``).
- ``password``: the value of a password named as such (``password``, ``*_PASSWORD``,
  ``PGPASSWORD``, ``pwd``, ``passphrase``, ``DB_PASS``, "my password is ...").
- ``url_password``: the password of ``scheme://user:password@host`` (user and host are kept).
- ``webhook``: the secret path of a Slack or Discord webhook URL.
- ``card_number``: 13 to 19 digits that pass the Luhn check, written as one number or in
  groups of 3 digits or more separated by single spaces or dashes, not glued to a word or to
  a longer dash-separated number.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import re2

Redactions = Counter[str]


class RedactionObserver(Protocol):
    """Told what a committed batch masked, by kind (the metrics' ``memproj_redactions``)."""

    def redacted(self, kind: str, count: int) -> None: ...


KINDS = frozenset(
    {
        "private_key",
        "api_key",
        "token",
        "jwt",
        "bearer_token",
        "basic_auth",
        "password",
        "url_password",
        "webhook",
        "card_number",
    }
)


_MASK_PREFIX = "[REDACTED:"
_MASK_BYTES = _MASK_PREFIX.encode()


def mask(kind: str) -> str:
    return f"{_MASK_PREFIX}{kind}]"


def is_mask(value: str) -> bool:
    """Whether the whole of ``value`` is one mask (what was redacted already)."""
    return value.startswith(_MASK_PREFIX) and value.endswith("]") and value.count("]") == 1


# ---- the patterns ---------------------------------------------------------------------------
# Each rule is one alternative of the combined pattern. Group names are unique across all rules
# (RE2 refuses duplicates), so a rule's pattern also compiles alone.

_B64 = r"[A-Za-z0-9+/=\\]"  # base64, and the backslash of a literal "\n" in escaped JSON
_ARMOR = r"(?:Proc-Type|DEK-Info|Version|Comment|Hash|Charset|Subject|MessageID):[^\r\n]*"
# Lines of a key body: each a whole line of base64 or an armor header, after blank lines if
# any (blank lines after the body are not part of it).
_KEY_LINES = rf"(?:(?:\r?\n[ \t\r]*)*\r?\n[ \t]*(?:{_B64}+|{_ARMOR})[ \t\r]*(?m:$))*"
_KEY_HEADER = r"-{4,5} ?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}"
_PRIVATE_KEY = (
    rf"{_KEY_HEADER}"
    # with its END line: the body holds anything but "--", which every header and END has
    r"(?:(?:[^-]|-[^-])*-{4,5} ?END [A-Z0-9 ]*-{4,5}"
    # without: the rest of the header's line (a key on one line), then the body's lines
    rf"|(?:[ \t]+[^\s-][^\s]*)*[ \t]*{_KEY_LINES})"
    # PuTTY: the private lines only
    rf"|Private-Lines:[ \t]*[0-9]+{_KEY_LINES}"
)

_WEBHOOK = (
    r"(?:https://hooks\.slack\.com/(?:services|workflows|triggers)/"
    r"|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/)"
    r"(?P<wh>[A-Za-z0-9_/-]+)"
)

# A value: up to a space, a quote, a comma or a semicolon, 2 characters at least, not starting
# with 4 dashes (a private key header: that rule must see it); a quoted value: up to the
# closing quote on the same line. (Masks and placeholders are left alone by the handler.)
_BARE = r"(?:-{1,3}[^\s\"'`,;\\-]|[^\s\"'`,;\\-][^\s\"'`,;\\])[^\s\"'`,;\\]*"

_AUTHORIZATION = (
    r"(?i:authorization)\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?"
    r"(?:(?P<au_scheme>(?i:bearer|basic|token|bot|digest|negotiate|ntlm|apikey|key|sso-key"
    r"|splunk|aws4-hmac-sha256))[ \t]+)?"
    rf"(?P<au_cred>{_BARE})"
)

_STRONG_KEYWORDS = (
    r"pwd|api[_-]?key|secret[_-]?key|(?:client|app|consumer)[_-]?secret"
    r"|(?:aws[_-]?)?secret[_-]?access[_-]?key|access[_-]?key[_-]?secret|account[_-]?key"
    r"|(?:access|refresh|auth|id|session|bearer|private|personal[_-]?access|api)[_-]?token"
)
_KEYWORD = (
    r"(?:(?P<kw_p>(?i:pass(?:word|wd|phrase)))"  # any prefix: PGPASSWORD, db_password, ...
    rf"|(?:\A|[^A-Za-z0-9])(?P<kw_s>(?i:{_STRONG_KEYWORDS}))"  # a whole word or segment
    r"|(?:[_.-]|\\?[\"'])(?P<kw_w>(?i:secret|token|pass))"  # a segment: *_SECRET, "token"
    r"|[a-z0-9](?P<kw_c>Secret|Token|ApiKey|Apikey|SecretKey|AccessKey|Pwd))"  # camelCase
    r"\\?[\"']?(?:[ \t]*(?::=|=>|[=:])[ \t]*|(?P<kw_is>[ \t]+is[ \t]+))"
    r"(?:\"(?P<kv_d>[^\"\\\r\n]+)\""
    r"|'(?P<kv_s>[^'\\\r\n]+)'"
    r"|\\\"(?P<kv_e>[^\"\\\r\n]+)\\\""
    rf"|(?:\\?[\"'])?(?P<kv_b>{_BARE}))"
)

# A bare SECRET, TOKEN or PASS is a word: only "=" right after it makes it an assignment
# (TOKEN=..., ?token=...).
_ASSIGNMENT = (
    r"(?:\A|[\s;&?])(?P<as_kw>(?i:secret|token|pass))="
    r"(?:\"(?P<as_d>[^\"\\\r\n]+)\"|'(?P<as_s>[^'\\\r\n]+)'"
    rf"|(?P<as_b>{_BARE}))"
)

# The password of scheme://user:password@host: the user has no ":", the password runs to the
# last "@" before the path (as browsers parse it).
_URL_PASSWORD = r"://[^\s:/?#\[\]@\"'<>`\\]*:(?P<up>[^\s/?#\[\]\"'<>`\\]+)@"

_VENDOR = "|".join(
    (
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",  # AWS access key id
        r"\bgh[pousr]_[A-Za-z0-9_]{30,}",  # GitHub
        r"\bgithub_pat_[A-Za-z0-9_]{22,}",
        r"\b(?:glpat|gldt|glft|glsoat|glrt|glcbt|glimt|glptt|glagent|gloas)-[A-Za-z0-9_-]{20,}",
        r"\bGR1348941[A-Za-z0-9_-]{20,}",  # GitLab runner registration
        r"\bnpm_[A-Za-z0-9]{36,}",
        r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe secret and restricted keys
        r"\bwhsec_[A-Za-z0-9]{24,}",  # Stripe webhook signing secret
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
        r"\bxapp-[0-9]-[A-Za-z0-9-]{10,}",
        r"\bsk-[A-Za-z0-9_-]{16,}",  # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-)
        r"\bAIza[A-Za-z0-9_-]{35,}",  # Google API key
        r"\bGOCSPX-[A-Za-z0-9_-]{28,}",  # Google OAuth client secret
        r"\bya29\.[A-Za-z0-9_-]{20,}",  # Google OAuth access token
        r"\bhf_[A-Za-z0-9]{34,}",  # Hugging Face
        r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",  # SendGrid
        r"\bpypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{50,}",
        r"\b[0-9a-f]{32}-us[0-9]{1,2}\b",  # Mailchimp
        r"\bsq0csp-[A-Za-z0-9_-]{43}",  # Square OAuth secret
        r"\b[0-9]{8,10}:AA[A-Za-z0-9_-]{33}",  # Telegram bot
    )
)

# The header is bounded: it is the one unbounded part that can fail late (at the ".eyJ").
_JWT = r"\beyJ[A-Za-z0-9_-]{1,500}\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"
# (12 characters at least, and no "--": a private key header may follow "Bearer")
_BEARER = r"\b(?i:bearer)[ \t]+(?P<be>(?:[A-Za-z0-9_.~+/]|-[A-Za-z0-9_.~+/]){12,}=*)"
# (the word after "Basic" is read whole, so that it can be scanned again if it is not base64)
_BASIC = r"\b(?i:basic)[ \t]+(?P<ba>(?:[A-Za-z0-9+/_]|-[A-Za-z0-9+/_])+={0,2})"
_CARD = r"\b[0-9](?:[ -]?[0-9]){12,}"  # 13 digits or more: shorter runs never match


# ---- the handlers ---------------------------------------------------------------------------
# The scan runs on the UTF-8 bytes of the text (encoded once): through google-re2's ``str``
# interface every match would also convert its byte offsets back to characters, which costs
# more than the match itself. Handlers get a match on those bytes.
#
# A handler returns the match's replacement; or None to leave it as it was, the scan going on
# after it; or an offset inside the match where the scan goes on, when the part it leaves
# alone may hold what another rule masks ("Bearer" followed by a word that is not a token but
# the start of something else). Such a part never holds a match that resumes inside it again,
# so each character is scanned twice at most. The user of a URL is scanned again on its own
# (``https://ghp_...:x@host``): it cannot hold a URL.

Groups = dict[str, int]
_ENCODING = "utf-8"
_ERRORS = "surrogatepass"  # a str may hold lone surrogates (from JSON \ud800 escapes)


def _mask_bytes(kind: str) -> bytes:
    return mask(kind).encode()


def _str(data: bytes) -> str:
    return data.decode(_ENCODING, _ERRORS)


class Scan:
    """One redaction: the group indexes of the pattern, the counts, and the scanner."""

    __slots__ = ("found", "groups", "scanner")

    def __init__(self, scanner: Scanner, found: Redactions) -> None:
        self.scanner = scanner
        self.groups = scanner.groups
        self.found = found

    def masked(self, match: Any, name: str, kind: str, rescan_before: bool = False) -> bytes:
        """The match with group ``name`` masked (what precedes it scanned again if asked)."""
        self.found[kind] += 1
        whole: bytes = match.group(0)
        offset: int = match.start(0)
        start, end = match.span(self.groups[name])
        before = whole[: start - offset]
        if rescan_before:
            before = self.scanner.redact_bytes(before, self.found)
        return before + _mask_bytes(kind) + whole[end - offset :]

    def resume_at(self, match: Any, name: str) -> int:
        """Leave the match as it was, scanning on from the start of group ``name``."""
        start: int = match.start(self.groups[name])
        return start


# (match, scan) -> the replacement; None: leave it, scan on after it; an offset: leave it, scan
# on from there
Handler = Callable[[Any, Scan], "bytes | int | None"]


def _whole(kind: str) -> Handler:
    replacement = _mask_bytes(kind)

    def handle(match: Any, scan: Scan) -> bytes:
        scan.found[kind] += 1
        return replacement

    return handle


def _group(name: str, kind: str, rescan_before: bool = False) -> Handler:
    def handle(match: Any, scan: Scan) -> bytes:
        return scan.masked(match, name, kind, rescan_before)

    return handle


SCHEME_KINDS = {"bearer": "bearer_token", "basic": "basic_auth"}
AUTHORIZATION_SCHEMES = (
    "bearer",
    "basic",
    "token",
    "bot",
    "digest",
    "negotiate",
    "ntlm",
    "apikey",
    "key",
    "sso-key",
    "splunk",
    "aws4-hmac-sha256",
)


def _placeholder(value: bytes) -> bool:
    """A value that is not a secret: a mask (also as read a second time, "password=" then
    "=[REDACTED:password]"), a variable reference ($X, ${X}, {{x}}) or a placeholder (<x>)."""
    value = value.strip()
    return (
        _MASK_BYTES in value
        or (value.startswith(b"<") and value.endswith(b">"))
        or (value.startswith(b"${") and value.endswith(b"}"))
        or (value.startswith(b"{{") and value.endswith(b"}}"))
        or (value.startswith(b"$") and value[1:].replace(b"_", b"").isalnum())
    )


def _authorization(match: Any, scan: Scan) -> bytes | None:
    scheme: bytes | None = match.group(scan.groups["au_scheme"])
    credential: bytes = match.group(scan.groups["au_cred"])
    if _placeholder(credential):
        return None
    if scheme is None and (
        _str(credential).lower() in AUTHORIZATION_SCHEMES or len(credential) < 8
    ):
        return None  # "Authorization: Bearer [REDACTED:...]", or prose
    kind = SCHEME_KINDS.get(_str(scheme or b"").lower(), "token")
    return scan.masked(match, "au_cred", kind)


_KEYWORDS = ("kw_p", "kw_s", "kw_w", "kw_c")
_KEYWORD_VALUES = ("kv_d", "kv_s", "kv_e", "kv_b")


def _keyword_kind(keyword: str) -> str:
    keyword = keyword.lower()
    if "pass" in keyword or "pwd" in keyword:
        return "password"
    return "token" if keyword.endswith("token") else "api_key"


def _plain_word(value: str) -> bool:
    word = value.rstrip(".!?:)")
    return word.isascii() and word.isalpha() and word[1:].islower()


def _keyword(match: Any, scan: Scan) -> bytes | None:
    groups = scan.groups
    keyword = next(
        _str(match.group(groups[name])) for name in _KEYWORDS if match.start(groups[name]) >= 0
    )
    value = next(name for name in _KEYWORD_VALUES if match.start(groups[name]) >= 0)
    prose = match.start(groups["kw_is"]) >= 0
    return _assigned(match, scan, keyword, value, bare=value == "kv_b", prose=prose)


def _assignment(match: Any, scan: Scan) -> bytes | None:
    groups = scan.groups
    keyword = _str(match.group(groups["as_kw"]))
    value = next(name for name in ("as_d", "as_s", "as_b") if match.start(groups[name]) >= 0)
    return _assigned(match, scan, keyword, value, bare=value == "as_b", prose=False)


def _assigned(
    match: Any, scan: Scan, keyword: str, value_group: str, bare: bool, prose: bool
) -> bytes | None:
    """Mask the value assigned to a keyword, unless it is no secret."""
    value_bytes: bytes = match.group(scan.groups[value_group])
    if _placeholder(value_bytes):
        return None
    kind = _keyword_kind(keyword)
    if bare:
        value = _str(value_bytes)
        # What is left alone here is too short, or a word, to hide another credential.
        if len(value) < (2 if kind == "password" else 8):
            return None
        if prose and _plain_word(value):
            return None  # "the password is incorrect"
        if keyword.lower() == "pwd" and value[0] in "/~":
            return None  # PWD=/home/user, the shell's working directory
    return scan.masked(match, value_group, kind)


def _basic(match: Any, scan: Scan) -> bytes | int:
    credential: bytes = match.group(scan.groups["ba"])
    try:
        decoded = base64.b64decode(credential + b"=" * (-len(credential) % 4), validate=True)
        user_password = decoded.decode("utf-8")
    except (binascii.Error, ValueError):
        user_password = ""
    if ":" not in user_password or not user_password.isprintable():
        return scan.resume_at(match, "ba")  # "basic" followed by a word, or something else
    return scan.masked(match, "ba", "basic_auth")


_TOKEN_SYMBOLS = frozenset(b"._~+/=-0123456789")


def _bearer(match: Any, scan: Scan) -> bytes | int:
    token: bytes = match.group(scan.groups["be"])
    if len(token) < 32 and not any(c in _TOKEN_SYMBOLS for c in token):
        return scan.resume_at(match, "be")  # "bearer of bad news"
    return scan.masked(match, "be", "bearer_token")


_ASCII_DIGITS = bytes(range(256)).maketrans(b"0123456789", bytes(range(10)))
_DOUBLED = tuple((2 * d - 9 if d > 4 else 2 * d) for d in range(10))


def _luhn_valid(digits: bytes) -> bool:
    values = digits.translate(_ASCII_DIGITS)
    return (sum(values[-1::-2]) + sum(_DOUBLED[d] for d in values[-2::-2])) % 10 == 0


# What a card number may follow or be followed by (b"": the start or end of the text).
_CARD_BEFORE = frozenset([b"", *(bytes([c]) for c in b" \t\r\n:=,;(#*>\"'")])
_CARD_AFTER = frozenset([b"", *(bytes([c]) for c in b" \t\r\n.,;:)/!?<\"'")])
_CARD_MAX_GROUPS = 5  # 4-4-4-4-3 is the most a card number is written in


def _card(match: Any, scan: Scan) -> bytes | None:
    """Cards in a run of digit groups (each of 3 digits at least) separated by single spaces
    or dashes: the longest window of whole groups at each position holding 13 to 19 digits
    that pass the Luhn check ("4111 1111 1111 1111 12 29" masks the card, not the expiry)."""
    data: bytes = match.string
    start, end = match.span(0)
    if data[start - 1 : start] not in _CARD_BEFORE or data[end : end + 1] not in _CARD_AFTER:
        # glued to a word, to a longer dash-separated number, or to a mask (then redacting it
        # again would not give the same text)
        return None
    run: bytes = match.group(0)
    groups: list[tuple[int, int]] = []
    offset = 0
    for group in run.replace(b"-", b" ").split(b" "):
        groups.append((offset, offset + len(group)))
        offset += len(group) + 1
    pieces: list[bytes] = []
    copied = 0
    index = 0
    while index < len(groups):
        best = -1
        digits = b""
        for last in range(index, min(index + _CARD_MAX_GROUPS, len(groups))):
            group_start, group_end = groups[last]
            if group_end - group_start < 3:
                break
            digits += run[group_start:group_end]
            if len(digits) > 19:
                break
            if len(digits) >= 13 and _luhn_valid(digits):
                best = last
        if best < 0:
            index += 1
            continue
        pieces.append(run[copied : groups[index][0]])
        pieces.append(_mask_bytes("card_number"))
        scan.found["card_number"] += 1
        copied = groups[best][1]
        index = best + 1
    if not pieces:
        return None
    pieces.append(run[copied:])
    return b"".join(pieces)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    pattern: str
    handle: Handler


# In priority order: where two rules match at the same position, the first one wins (a match
# that starts earlier always wins). Card numbers are last: a Telegram token begins with digits.
RULES: tuple[Rule, ...] = (
    Rule("private_key", _PRIVATE_KEY, _whole("private_key")),
    Rule("webhook", _WEBHOOK, _group("wh", "webhook")),
    Rule("authorization", _AUTHORIZATION, _authorization),
    Rule("keyword", _KEYWORD, _keyword),
    Rule("assignment", _ASSIGNMENT, _assignment),
    Rule("url_password", _URL_PASSWORD, _group("up", "url_password", rescan_before=True)),
    Rule("vendor", _VENDOR, _whole("api_key")),
    Rule("jwt", _JWT, _whole("jwt")),
    Rule("bearer", _BEARER, _bearer),
    Rule("basic", _BASIC, _basic),
    Rule("card", _CARD, _card),
)


def _options() -> Any:
    options = re2.Options()
    # Room for the DFA's state cache: with less, adversarial text makes RE2 drop to its NFA,
    # which is still linear but slower.
    options.max_mem = 64 << 20
    return options


class Scanner:
    """One compiled pattern holding the given rules, scanned once over a text. (The benchmark
    also builds one scanner per rule, to compare one pass with one pass per rule.)"""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        pattern = "|".join(f"(?P<rule_{rule.name}>{rule.pattern})" for rule in rules)
        self._regex = re2.compile(pattern.encode(), _options())
        # computed once: the property rebuilds the mapping at each use
        groups: Groups = {name.decode(): index for name, index in self._regex.groupindex.items()}
        self.groups = groups
        self._rules = tuple((groups[f"rule_{rule.name}"], rule.handle) for rule in rules)
        self._handlers = dict(self._rules)

    def _handler(self, match: Any) -> Handler:
        """The handler of the rule that matched. A rule's group spans its whole match and comes
        before the groups inside it, so it is the one google-re2's ``lastindex`` names (one
        pass over the spans, where asking each rule's group costs a call each); the loop is
        there in case a version of it answers otherwise."""
        handler = self._handlers.get(match.lastindex)
        if handler is not None:
            return handler
        for index, handle in self._rules:  # pragma: no cover
            if match.start(index) >= 0:
                return handle
        raise AssertionError("a match of no rule")  # pragma: no cover

    def redact_bytes(self, data: bytes, found: Redactions) -> bytes:
        search = self._regex.search
        match = search(data, 0)
        if match is None:
            return data  # most text: one search, nothing set up for handlers
        scan = Scan(self, found)
        pieces: list[bytes] = []
        copied = position = 0
        while match is not None:
            result = self._handler(match)(match, scan)
            if isinstance(result, bytes):
                pieces.append(data[copied : match.start(0)])
                pieces.append(result)
                copied = position = match.end(0)
            elif result is None:
                position = match.end(0)
            else:
                position = result
            match = search(data, position)
        if not pieces:
            return data
        pieces.append(data[copied:])
        return b"".join(pieces)

    def redact(self, text: str, found: Redactions) -> str:
        data = text.encode(_ENCODING, _ERRORS)
        redacted = self.redact_bytes(data, found)
        return text if redacted is data else _str(redacted)


_SCANNER = Scanner(RULES)


def redact_text(text: str, found: Redactions) -> str:
    """Mask every credential in the text, counting each by kind into ``found``."""
    if not text:
        return text
    return _SCANNER.redact(text, found)
