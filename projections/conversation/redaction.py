"""Masking credentials out of conversation content before anything is persisted. Pure.

The raw topic is the only place the original text lives: the reducer redacts every message
and summary before it reaches PostgreSQL or any derived store, and counts what it masked.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

Redactions = Counter[str]


def _luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def mask(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# (kind, pattern, the group to mask: 0 for the whole match). Order matters: a private key
# block is masked before anything inside it could be mistaken for another kind.
_PATTERNS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    (
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
            r".*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
            re.DOTALL,
        ),
        0,
    ),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{16,}=*)"), 1),
    (
        "api_key",
        re.compile(
            r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
            r"|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35})"
        ),
        0,
    ),
    (
        "api_key",
        re.compile(
            r"(?i)\b(?:api[_-]?key|secret[_-]?key|access[_-]?token|client[_-]?secret|auth[_-]?token)"
            r"\b[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9_\-./+]{12,})"
        ),
        1,
    ),
    (
        "password",
        re.compile(
            r"(?i)\b(?:password|passwd|pwd|passphrase)\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?([^\s\"',;]{3,})"
        ),
        1,
    ),
)
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_PASSWORD_FIELD = re.compile(r"(?i)^(?:password|passwd|pwd|passphrase)$")
_SECRET_FIELD = re.compile(
    r"(?i)^(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?token|token)$"
)


def redact_text(text: str, found: Redactions) -> str:
    for kind, pattern, group in _PATTERNS:
        text = pattern.sub(_replacer(kind, group, found), text)

    def card(match: re.Match[str]) -> str:
        digits = re.sub(r"[ -]", "", match.group(0))
        if 13 <= len(digits) <= 19 and _luhn_valid(digits):
            found["card_number"] += 1
            return mask("card_number")
        return match.group(0)

    return _CARD.sub(card, text)


def _replacer(kind: str, group: int, found: Redactions) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        found[kind] += 1
        if group == 0:
            return mask(kind)
        start, end = match.span(group)
        offset = match.start(0)
        whole = match.group(0)
        return whole[: start - offset] + mask(kind) + whole[end - offset :]

    return replace


def redact_value(value: Any, found: Redactions, field_name: str | None = None) -> Any:
    """Redact every string inside a JSON value; a field named like a secret is masked whole."""
    if isinstance(value, str):
        if field_name is not None and value and _SECRET_FIELD.match(field_name):
            kind = "password" if _PASSWORD_FIELD.match(field_name) else "api_key"
            found[kind] += 1
            return mask(kind)
        return redact_text(value, found)
    if isinstance(value, dict):
        return {key: redact_value(item, found, key) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_value(item, found) for item in value]
    return value
