"""Credential masking, with no services."""

from __future__ import annotations

from collections import Counter

import pytest

from projections.conversation.redaction import redact_text, redact_value

PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7c3Qd0x\nqWQ8Zt1xT4N\n"
    "-----END RSA PRIVATE KEY-----"
)


@pytest.mark.parametrize(
    ("text", "kind", "secret"),
    [
        ("my key is sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv please", "api_key", "sk-ant-api03"),
        ("use sk-proj-1234567890abcdefghij", "api_key", "sk-proj-1234567890"),
        ("aws AKIAIOSFODNN7EXAMPLE ok", "api_key", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "api_key", "ghp_abcdef"),
        ("api_key=zq83hf92hd82hdk2", "api_key", "zq83hf92hd82hdk2"),
        ('"client_secret": "A1b2C3d4E5f6G7h8"', "api_key", "A1b2C3d4E5f6G7h8"),
        (
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc",
            "bearer_token",
            "eyJhbGci",
        ),
        ("my password is hunter2!", "password", "hunter2"),
        ("login with pwd: S3cr3t#", "password", "S3cr3t#"),
        ("PASSWORD=correcthorse", "password", "correcthorse"),
        ("card 4111 1111 1111 1111 exp 12/29", "card_number", "4111 1111 1111 1111"),
        ("card 4111-1111-1111-1111", "card_number", "4111-1111-1111-1111"),
        ("amex 378282246310005", "card_number", "378282246310005"),
        (f"here:\n{PRIVATE_KEY}\nthanks", "private_key", "MIIEowIBAAKCAQEA7c3Qd0x"),
    ],
)
def test_each_credential_kind_is_masked_and_counted(text: str, kind: str, secret: str) -> None:
    found: Counter[str] = Counter()
    masked = redact_text(text, found)
    assert secret not in masked
    assert f"[REDACTED:{kind}]" in masked
    assert found == Counter({kind: 1})


@pytest.mark.parametrize(
    "text",
    [
        "order 1234567890123 shipped",  # 13 digits, fails the Luhn check
        "call me at +1 415 555 0100",
        "the password policy needs 12 characters",
        "a task-force of sk-ill",
        "I have 3 keys and 2 tokens",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    found: Counter[str] = Counter()
    assert redact_text(text, found) == text
    assert not found


def test_structured_tool_input_is_redacted_recursively() -> None:
    found: Counter[str] = Counter()
    value = {
        "query": "connect with password: swordfish",
        "auth": {"password": "x", "api_key": "k-123"},
        "rows": [{"note": "card 4242424242424242"}],
    }
    redacted = redact_value(value, found)
    assert redacted == {
        "query": "connect with password: [REDACTED:password]",
        "auth": {"password": "[REDACTED:password]", "api_key": "[REDACTED:api_key]"},
        "rows": [{"note": "card [REDACTED:card_number]"}],
    }
    assert found == Counter({"password": 2, "api_key": 1, "card_number": 1})
