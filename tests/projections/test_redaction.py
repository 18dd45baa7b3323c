"""Credential masking, with no services."""

from __future__ import annotations

import base64
import json
import string
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from projections.redaction import KINDS, mask, redact_text
from projections.redaction_values import field_kind, redact_personal, redact_value
from streams.sample import EventFactory, to_message
from support.examples import examples
from support.new_event_type import annotated, schemas_with_annotations
from topics.codec import EventCodec
from topics.schemas import default_schemas

PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7c3Qd0x\nqWQ8Zt1xT4N\n"
    "-----END RSA PRIVATE KEY-----"
)
# A fake key body: 64-character base64 lines, as PEM writes them.
BODY_LINES = [
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu",
    "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ",
    "qgtzJ6GR3eqoYSW9b9UMvkBpZODSctWSNGj3P7jRFDO5VoTwCQAWbFnOjDfH5Ulg",
    "p2PKSQnSJP3AJLQNFNe7br1XbrhV//eO+t51mIpGSDCUv3E0DDFcWDTH9cXDTTlR",
]
BODY = "\n".join(BODY_LINES)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwi"
    "aWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def only(text: str) -> tuple[str, Counter[str]]:
    found: Counter[str] = Counter()
    return redact_text(text, found), found


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
        # AWS
        ("temporary creds ASIAY34FZKBOKMUTVV7A expire soon", "api_key", "ASIAY34FZKBOKMUTVV7A"),
        (f"[default]\naws_secret_access_key = {AWS_SECRET}\n", "api_key", AWS_SECRET),
        (f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}", "api_key", AWS_SECRET),
        (f'{{"aws_secret_access_key": "{AWS_SECRET}"}}', "api_key", AWS_SECRET),
        # GitHub, GitLab, npm
        ("gho_16C7e42F292c6912E7710c838347Ae178B4a in the log", "api_key", "gho_16C7e42F292c"),
        ("ghu_Xx9Q2mB7nR4tV1wZ8kL3pS6dF0gH5jA2cE7y", "api_key", "ghu_Xx9Q2mB7nR4t"),
        ("ghs_Xx9Q2mB7nR4tV1wZ8kL3pS6dF0gH5jA2cE7y", "api_key", "ghs_Xx9Q2mB7nR4t"),
        ("ghr_Xx9Q2mB7nR4tV1wZ8kL3pS6dF0gH5jA2cE7y", "api_key", "ghr_Xx9Q2mB7nR4t"),
        (
            "git clone with github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789aBcDeFgHiJkL",
            "api_key",
            "github_pat_11ABCDEFG0",
        ),
        ("GitLab token glpat-9xQvB3kLmN7pRsTu2wYz ok", "api_key", "glpat-9xQvB3kLmN7pRsTu2wYz"),
        ("npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 published", "api_key", "npm_a1B2c3D4e5F6"),
        # Stripe
        ("charge with sk_live_51H8xYzAbCdEfGhIjKlMnOpQr", "api_key", "sk_live_51H8xYz"),
        ("restricted rk_live_51H8xYzAbCdEfGhIjKlMnOpQr", "api_key", "rk_live_51H8xYz"),
        ("test mode sk_test_4eC39HqLyjWDarjtT1zdp7dc", "api_key", "sk_test_4eC39HqLyjWD"),
        # Slack
        (
            "bot xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "api_key",
            "xoxb-123456789012",
        ),
        ("user xoxp-123456789012-123456789012-abcdef0123", "api_key", "xoxp-123456789012"),
        (
            "post to https://hooks.slack.com/services/T024BE7LD/B01ABCDEF12/Xy7zAbCdEfGhIjKlMnOpQrSt",
            "webhook",
            "T024BE7LD/B01ABCDEF12/Xy7zAbCdEfGhIjKlMnOpQrSt",
        ),
        # Google, bare JWT
        ("maps key AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI", "api_key", "AIzaSyDdI0hCZtE6"),
        (f"id token {JWT} from the IdP", "jwt", "SflKxwRJSMeKKF2QT4fw"),
        # HTTP credentials
        ("Authorization: Basic ZGVwbG95OlRyMHViNGRvciYz", "basic_auth", "ZGVwbG95OlRyMHViNGRvciYz"),
        ("header was basic YWxhZGRpbjpvcGVuc2VzYW1l", "basic_auth", "YWxhZGRpbjpvcGVuc2VzYW1l"),
        ("-H 'authorization: token ghp_abcdefghijklmnopqrstuvwxyz0123456789'", "token", "ghp_"),
        ("curl -H 'Bearer 8f2a9c1e4b5d6f7a8b9c0d1e2f3a4b5c'", "bearer_token", "8f2a9c1e4b5d"),
        # passwords in URLs
        ("DATABASE_URL=postgres://app:S3cretPass@db.internal:5432/app", "url_password", "S3cret"),
        ("redis://:hunter2pw@cache:6379/0", "url_password", "hunter2pw"),
        ("clone https://deploy:p@ss:w0rd@git.example.com/repo.git", "url_password", "p@ss:w0rd"),
        # environment-style assignments
        ("DB_PASSWORD=Xk9#mQ2vL", "password", "Xk9#mQ2vL"),
        ("PGPASSWORD='Xk9 mQ2vL' psql", "password", "Xk9 mQ2vL"),
        ("export STRIPE_API_KEY=a8F3kQ9zT2mW7xR1", "api_key", "a8F3kQ9zT2mW7xR1"),
        ("GITHUB_TOKEN=5f1c2b3a4d5e6f70819a2b3c4d5e6f7081920a1b", "token", "5f1c2b3a4d5e6f70"),
        ("DJANGO_SECRET=y7%kq!2x@m9w#r4t", "api_key", "y7%kq!2x@m9w#r4t"),
        ("DB_PASS=Xk9mQ2vL7", "password", "Xk9mQ2vL7"),
        ("TOKEN=5f1c2b3a4d5e6f70819a", "token", "5f1c2b3a4d5e6f70819a"),
        ("export SECRET='y7%kq!2x@m9w#r4t'", "api_key", "y7%kq!2x@m9w#r4t"),
        ("GET /oauth/callback?token=Zq8xW7vU6tS5rQ4p HTTP/1.1", "token", "Zq8xW7vU6tS5rQ4p"),
        # JSON / YAML fields inside text
        ('{"Authorization": "Bearer 3f9a8b7c6d5e4f3a2b1c"}', "bearer_token", "3f9a8b7c6d5e4f"),
        ("client_secret: 9bX2kQ7mZ4wR8tY1", "api_key", "9bX2kQ7mZ4wR8tY1"),
        ('"refresh_token": "1//0gLk2mN3oP4qR5sT6uV7wX8yZ"', "token", "1//0gLk2mN3oP4q"),
        ("access_token=ya28Zq8xW7vU6tS5rQ4pO3n&expires=3600", "token", "ya28Zq8xW7vU6tS"),
        ("x-api-key: 7Hq2Lm9Xz4Rt8Wv1Pk6N", "api_key", "7Hq2Lm9Xz4Rt8Wv1Pk6N"),
        ('{"password": "correct horse battery staple"}', "password", "horse battery"),
        ('log: {\\"password\\": \\"s3cr3t!\\"}', "password", "s3cr3t!"),
        ("config.clientSecret = 'Q8w7E6r5T4y3U2i1'", "api_key", "Q8w7E6r5T4y3U2i1"),
        ('{"accessToken":"A1b2C3d4E5f6G7h8I9j0"}', "token", "A1b2C3d4E5f6G7h8I9j0"),
    ],
)
def test_each_credential_kind_is_masked_and_counted(text: str, kind: str, secret: str) -> None:
    masked, found = only(text)
    assert secret not in masked
    assert f"[REDACTED:{kind}]" in masked
    assert found == Counter({kind: 1})


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("postgres://app:S3cretPass@db.internal:5432/app", ["postgres://app:", "@db.internal"]),
        ("DB_PASSWORD=Xk9#mQ2vL", ["DB_PASSWORD="]),
        ('"client_secret": "A1b2C3d4E5f6G7h8"', ['"client_secret": "', '"']),
        ("Authorization: Bearer 3f9a8b7c6d5e4f3a2b1c", ["Authorization: Bearer "]),
        ("https://hooks.slack.com/services/T0/B0/XYZabc123", ["https://hooks.slack.com/services/"]),
    ],
)
def test_only_the_secret_part_is_masked(text: str, kept: list[str]) -> None:
    masked, _ = only(text)
    for part in kept:
        assert part in masked


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the user of a URL may itself be a token
        (
            "https://ghp_abcdefghijklmnopqrstuvwxyz0123456789:x-oauth-basic@github.com/o/r",
            "https://[REDACTED:api_key]:[REDACTED:url_password]@github.com/o/r",
        ),
        # "basic" or "bearer" followed by what is not their credential still gets scanned
        ("basic AKIAIOSFODNN7EXAMPLE", "basic [REDACTED:api_key]"),
        (
            "bearer ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "bearer [REDACTED:bearer_token]",
        ),
        # a card number next to its expiry
        ("card 4111 1111 1111 1111 12 29", "card [REDACTED:card_number] 12 29"),
        (
            "4111 1111 1111 1111 5555 5555 5555 4444",
            "[REDACTED:card_number] [REDACTED:card_number]",
        ),
    ],
)
def test_what_overlaps_is_masked_too(text: str, expected: str) -> None:
    assert only(text)[0] == expected


# ---- private keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [
        f"-----BEGIN PRIVATE KEY-----\n{BODY}\n-----END PRIVATE KEY-----",
        f"-----BEGIN RSA PRIVATE KEY-----\r\n{BODY}\r\n-----END RSA PRIVATE KEY-----",
        f"-----BEGIN EC PRIVATE KEY-----\n{BODY}\n-----END EC PRIVATE KEY-----",
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{BODY}\n-----END OPENSSH PRIVATE KEY-----",
        f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{BODY}\n-----END ENCRYPTED PRIVATE KEY-----",
        (
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
            f"DEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\n{BODY}\n-----END RSA PRIVATE KEY-----"
        ),
        (
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\n"
            f"{BODY}\n=Xq7c\n-----END PGP PRIVATE KEY BLOCK-----"
        ),
        (
            '---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: "2048-bit rsa"\n'
            f"{BODY}\n---- END SSH2 ENCRYPTED PRIVATE KEY ----"
        ),
        # newlines collapsed to spaces, or escaped inside a JSON string
        f"-----BEGIN PRIVATE KEY----- {' '.join(BODY_LINES)} -----END PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----\\n" + "\\n".join(BODY_LINES) + "\\n-----END PRIVATE KEY-----",
    ],
)
def test_private_key_blocks_are_masked_whole(block: str) -> None:
    masked, found = only(f"here is my key:\n{block}\nthanks!")
    assert masked == "here is my key:\n[REDACTED:private_key]\nthanks!"
    assert found == Counter({"private_key": 1})


@pytest.mark.parametrize(
    "header",
    [
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n",
    ],
)
def test_a_private_key_without_its_end_masks_its_base64_body(header: str) -> None:
    # truncated text: the key's header and body up to the first line that is not base64
    masked, found = only(f"the log says:\n{header}\n{BODY}\nMIIEow\n\nCan you see why it fails?")
    assert masked == "the log says:\n[REDACTED:private_key]\n\nCan you see why it fails?"
    assert found == Counter({"private_key": 1})
    # cut off in the middle of the body, at the end of the text
    masked, _ = only(f"{header}\n{BODY[:100]}")
    assert masked == "[REDACTED:private_key]"
    # on one line
    masked, _ = only(f"{header.splitlines()[0]} {' '.join(BODY_LINES)}")
    assert masked == "[REDACTED:private_key]"


def test_only_the_private_lines_of_a_putty_key_are_masked() -> None:
    key = (
        "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nComment: rsa-key-20240101\n"
        f"Public-Lines: 1\nAAAAB3NzaC1yc2EAAAABJQAAAQEAhl\nPrivate-Lines: 5\n{BODY}\n"
        "Private-MAC: 9b4c3a2d1e0f"
    )
    masked, found = only(key)
    assert BODY_LINES[0] not in masked and BODY_LINES[-1] not in masked
    assert "Public-Lines: 1\nAAAAB3NzaC1yc2EAAAABJQAAAQEAhl\n[REDACTED:private_key]\n" in masked
    assert found == Counter({"private_key": 1})


def test_a_public_key_or_certificate_is_left_alone() -> None:
    text = f"-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----\n"
    text += f"-----BEGIN PUBLIC KEY-----\n{BODY}\n-----END PUBLIC KEY-----"
    assert only(text) == (text, Counter())


# ---- what is not a credential ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "order 1234567890123 shipped",  # 13 digits, fails the Luhn check
        "call me at +1 415 555 0100",
        "the password policy needs 12 characters",
        "a task-force of sk-ill",
        "I have 3 keys and 2 tokens",
        "Your password is incorrect. The password is required.",
        "request 123e4567-e89b-12d3-a456-426614174000 failed",
        "fixed in 3f2a9c1e4b5d6f708192a3b4c5d6e7f809a1b2c3 (a git SHA)",
        "see https://example.com:8443/path?query=1&page=2#top and http://localhost:8080/health",
        "mail john.doe@example.com or https://john@example.com/profile",
        "git@github.com:org/repo.git",
        "max_tokens: 4096, input_tokens=1234, token_count 17",
        "a basic understanding of bearer responsibilities",
        "The secret: always test. Token budget is tight.",
        "the API key rotation policy is documented",
        "password: [REDACTED:password] and api_key=${API_KEY} and token: <your token>",
        'an empty "password": "" and PWD=/home/agent',
        "timestamps 2024-01-01T12:00:00Z, build 1.2.3, port 5432",
        "eyJhbGciOiJIUzI1NiJ9 alone is only a header",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert only(text) == (text, Counter())


def test_unicode_and_lone_surrogates_survive() -> None:
    text = (
        "naïve café \ud800 password=pässwörd€ 日本語 \U0001f600 sk-ant-api03-AbCdEfGhIjKlMnOpQr 😀"
    )
    masked, found = only(text)
    assert masked == (
        "naïve café \ud800 password=[REDACTED:password] 日本語 \U0001f600 [REDACTED:api_key] 😀"
    )
    assert found == Counter({"password": 1, "api_key": 1})


# ---- JSON values ----------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        ("password", "password"),
        ("DB_PASSWORD", "password"),
        ("newPassword", "password"),
        ("passphrase", "password"),
        ("pwd", "password"),
        ("api_key", "api_key"),
        ("apiKey", "api_key"),
        ("x-api-key", "api_key"),
        ("X-API-Key", "api_key"),
        ("client_secret", "api_key"),
        ("clientSecret", "api_key"),
        ("secret", "api_key"),
        ("aws_secret_access_key", "api_key"),
        ("AWS_SECRET_ACCESS_KEY", "api_key"),
        ("STRIPE_API_KEY", "api_key"),
        ("token", "token"),
        ("access_token", "token"),
        ("refresh_token", "token"),
        ("accessToken", "token"),
        ("GITHUB_TOKEN", "token"),
        ("private_key", "private_key"),
        ("Authorization", "authorization"),
        ("proxy-authorization", "authorization"),
        ("name", None),
        ("max_tokens", None),
        ("public_key", None),
        ("token_type", None),
        ("aws_access_key_id", None),
        ("password_policy", None),
    ],
)
def test_field_names_that_hold_secrets(field: str, kind: str | None) -> None:
    assert field_kind(field) == kind


def test_an_authorization_field_keeps_its_scheme() -> None:
    found: Counter[str] = Counter()
    value = {
        "headers": {
            "Authorization": "Bearer abcdefghijklmnop12345",
            "Proxy-Authorization": "Basic ZGVwbG95OlRyMHViNGRvciYz",
            "authorization": "raw-opaque-credential",
        }
    }
    assert redact_value(value, found) == {
        "headers": {
            "Authorization": "Bearer [REDACTED:bearer_token]",
            "Proxy-Authorization": "Basic [REDACTED:basic_auth]",
            "authorization": "[REDACTED:token]",
        }
    }
    assert found == Counter({"bearer_token": 1, "basic_auth": 1, "token": 1})


def test_a_memory_value_is_redacted_as_a_json_object() -> None:
    found: Counter[str] = Counter()
    memory = {
        "text": "User's staging DB is postgres://app:S3cretPass@db:5432/app",
        "facts": [
            {"key": "github", "value": "uses ghp_abcdefghijklmnopqrstuvwxyz0123456789"},
            {"key": "deploy", "client_secret": "A1b2C3d4E5f6G7h8"},
        ],
        "confidence": 0.9,
        "pinned": True,
        "source": None,
    }
    redacted = redact_value(memory, found)
    assert redacted == {
        "text": "User's staging DB is postgres://app:[REDACTED:url_password]@db:5432/app",
        "facts": [
            {"key": "github", "value": "uses [REDACTED:api_key]"},
            {"key": "deploy", "client_secret": "[REDACTED:api_key]"},
        ],
        "confidence": 0.9,
        "pinned": True,
        "source": None,
    }
    assert found == Counter({"url_password": 1, "api_key": 2})
    again: Counter[str] = Counter()
    assert redact_value(redacted, again) == redacted
    assert not again


# ---- adversarial inputs: correct, and done (timing is ops/bench/redaction.py's) ----------------


def test_repeated_private_key_headers_without_end() -> None:
    header = "-----BEGIN RSA PRIVATE KEY-----"
    masked, found = only(f"{header}\n" * 10_000)
    assert masked == f"{mask('private_key')}\n" * 10_000
    assert found == Counter({"private_key": 10_000})
    masked, found = only(header * 10_000)
    assert "BEGIN" not in masked and found == Counter({"private_key": 10_000})


def test_repeated_near_misses() -> None:
    for text in (
        "password=" * 10_000,  # one assignment whose value is the rest
        "://user:" * 10_000,  # no "@"
        "eyJhbGciOiJIUzI1NiJ9.eyJ " * 10_000,  # no signature
        "Bearer " * 10_000,
        "4111 " * 10_000,
        "-" * 100_000,
        "a" * 100_000,
    ):
        masked, found = only(text)
        if text.startswith("password="):
            assert masked == "password=[REDACTED:password]" and found == {"password": 1}
        else:
            assert (masked, found) == (text, Counter()), text[:20]


def test_many_credentials_in_one_long_text() -> None:
    unit = "AKIAIOSFODNN7EXAMPLE password=hunter22 4111111111111111 "
    masked, found = only(unit * 10_000)
    assert masked == "[REDACTED:api_key] password=[REDACTED:password] [REDACTED:card_number] " * (
        10_000
    )
    assert found == Counter({"api_key": 10_000, "password": 10_000, "card_number": 10_000})


# ---- properties -----------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
PASSWORD_CHARS = ALNUM + "!#%&()*+-./:<=>?@^_{|}~"


def _luhn_complete(prefix: str) -> str:
    for last in "0123456789":
        digits = prefix + last
        total = 0
        for index, char in enumerate(reversed(digits)):
            value = int(char) * (2 if index % 2 else 1)
            total += value - 9 if value > 9 else value
        if total % 10 == 0:
            return digits
    raise AssertionError  # pragma: no cover


def _not_dashes(value: str) -> bool:
    return bool(value.strip("-"))


def _secrets() -> st.SearchStrategy[tuple[str, str]]:
    """(how the secret appears in text, with {} where the secret is; the secret itself)."""

    def text_of(alphabet: str, size: int) -> st.SearchStrategy[str]:
        return st.text(alphabet, min_size=size, max_size=size)

    def shown(template: str, secret: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
        return secret.map(lambda value: (template, value))

    header = _b64url(b'{"alg":"HS256","typ":"JWT"}')
    jwt = st.builds(
        lambda sub, sig: f"{header}.{_b64url(json.dumps({'sub': sub}).encode())}.{sig}",
        st.text(ALNUM, min_size=1, max_size=20),
        text_of(ALNUM + "-_", 43),
    )
    return st.one_of(
        shown("{}", text_of(UPPER_DIGITS, 16).map(lambda s: "AKIA" + s)),
        shown("{}", text_of(ALNUM, 36).map(lambda s: "ghp_" + s)),
        shown("{}", text_of(ALNUM + "-_", 40).map(lambda s: "sk-ant-api03-" + s)),
        shown("{}", text_of(ALNUM, 24).map(lambda s: "sk_live_" + s)),
        shown("{}", text_of(ALNUM, 20).map(lambda s: "glpat-" + s)),
        shown("{}", text_of(ALNUM + "-_", 35).map(lambda s: "AIza" + s)),
        shown("{}", jwt),
        # (a value of dashes only is not read as one: it could start a private key header)
        shown("password={}", st.text(PASSWORD_CHARS, min_size=3, max_size=30).filter(_not_dashes)),
        shown('"client_secret": "{}"', st.text(PASSWORD_CHARS + " ", min_size=1, max_size=30)),
        shown("DB_PASSWORD='{}'", st.text(PASSWORD_CHARS + " ", min_size=1, max_size=30)),
        shown("Authorization: Bearer {}", text_of(ALNUM + "-._~+/", 32)),
        shown("postgres://app:{}@db:5432/x", st.text(ALNUM + "!$&()*+,;=:@-._~", min_size=1)),
        shown(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----",
            st.text(ALNUM + "+/", min_size=1, max_size=200),
        ),
        shown("-----BEGIN PRIVATE KEY-----\n{}", st.text(ALNUM + "+/", min_size=1, max_size=200)),
        shown("{}", text_of(string.digits, 15).map(lambda s: _luhn_complete("4" + s))),
    )


FILLER = st.text(string.ascii_letters + string.digits + " .,!?'\n", max_size=40)
# Pieces of the patterns, to glue secrets and masks to what could extend or start a match.
TRICKY = st.sampled_from(
    [
        *"=:\"'@-_.$<>{}\\\n ",
        "://",
        "-----",
        "Bearer ",
        "basic ",
        "password",
        "token",
        "api_key",
        "Authorization",
        " is ",
        '\\"',
        "[REDACTED:password]",
        "eyJ",
        "4111",
        "1111 ",
        "AKIA",
        "ghp_",
        "sk-",
        "BEGIN RSA PRIVATE KEY",
        "END RSA PRIVATE KEY",
    ]
)
PIECES = st.lists(
    st.one_of(FILLER, TRICKY, _secrets().map(lambda secret: secret[0].format(secret[1]))),
    max_size=16,
)
ANYTHING = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc")), max_size=200
)


@settings(examples(300, 60), deadline=None)
@given(st.one_of(PIECES.map("".join), PIECES.map("\n".join), ANYTHING))
def test_redaction_is_idempotent(text: str) -> None:
    once, _ = only(text)
    twice, found = only(once)
    assert twice == once
    assert not found


@settings(examples(300, 60), deadline=None)
@given(FILLER, _secrets(), FILLER)
def test_a_masked_text_holds_none_of_the_secret(
    before: str, secret: tuple[str, str], after: str
) -> None:
    template, value = secret
    assume(not any(value in around for around in (before, after, template)))
    assume(not any(value in mask(kind) for kind in KINDS))
    masked, found = only(f"{before}\n{template.format(value)}\n{after}")
    assert value not in masked
    assert found and set(found) <= KINDS
    assert all(mask(kind) in masked for kind in found)


def test_a_new_event_types_personal_field_is_redacted_by_its_mark_alone() -> None:
    codec = EventCodec(schemas_with_annotations(), frozenset({"memory.annotated"}))
    event = codec.decode(*to_message(annotated("t1", "m1", f"pasted {JWT} by mistake")))
    found: Counter[str] = Counter()
    assert redact_personal(event, found) == {"note": "pasted [REDACTED:jwt] by mistake"}
    assert found == {"jwt": 1}


def test_ids_and_types_inside_personal_content_are_kept() -> None:
    codec = EventCodec(default_schemas(), frozenset({"conversation.message_added"}))
    block = {"type": "tool_use", "id": "ghp_" + "a1B2" * 9, "name": "x", "input": {"q": JWT}}
    raw = EventFactory().message("t1", "c1", "m1", "assistant", [block])
    found: Counter[str] = Counter()
    (redacted,) = redact_personal(codec.decode(*to_message(raw)), found)["content"]
    assert redacted == {**block, "input": {"q": "[REDACTED:jwt]"}}  # the id is an Identifier
