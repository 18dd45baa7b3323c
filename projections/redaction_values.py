"""Redacting structured values before anything is persisted: a JSON value (a memory value, a
tool's input or result), where a field named like a secret is masked whole and every other
string is redacted as text (``projections.redaction``), and an event's personal fields, as
their contract model marks them (``topics.personal``). Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from projections.redaction import (
    AUTHORIZATION_SCHEMES,
    SCHEME_KINDS,
    Redactions,
    is_mask,
    mask,
    redact_text,
)
from topics.envelope import Envelope
from topics.personal import Shape, field_shapes, personal_fields

# ---- JSON values: a field named like a secret is masked whole --------------------------------

_PASSWORD_FIELDS = frozenset({"password", "passwd", "pwd", "passphrase", "pass"})
_API_KEY_FIELDS = frozenset(
    {
        "secret",
        "api_key",
        "apikey",
        "x_api_key",
        "client_secret",
        "secret_key",
        "access_key",
        "secret_access_key",
        "aws_secret_access_key",
        "account_key",
    }
)
_AUTHORIZATION_FIELDS = frozenset({"authorization", "proxy_authorization"})


def _snake(name: str) -> str:
    """``accessToken`` / ``X-Api-Key`` / ``AWS_SECRET_ACCESS_KEY`` -> ``access_token`` ..."""
    chars: list[str] = []
    previous = ""
    for char in name.strip():
        if char.isupper() and (previous.islower() or previous.isdigit()):
            chars.append("_")
        chars.append("_" if char in "-. " else char.lower())
        previous = char
    return "".join(chars)


# Cached: every string of every memory value asks it of its field's name, and names repeat
# ("text", "note"); bounded, since the names come from input.
@functools.lru_cache(maxsize=4096)
def field_kind(field_name: str) -> str | None:
    """The kind of secret a JSON field of this name holds, if its name says it holds one
    (``"authorization"`` for an Authorization header value: its scheme decides)."""
    name = _snake(field_name)
    if name in _AUTHORIZATION_FIELDS:
        return "authorization"
    if name in _PASSWORD_FIELDS or name.endswith(
        ("password", "_passwd", "_pwd", "_passphrase", "_pass")
    ):
        return "password"
    if name == "private_key" or name.endswith("_private_key"):
        return "private_key"
    if name == "token" or name.endswith("_token"):
        return "token"
    if name in _API_KEY_FIELDS or name.endswith(
        ("_secret", "_api_key", "_apikey", "_secret_key", "_access_key")
    ):
        return "api_key"
    return None


def _redact_field(value: str, kind: str, found: Redactions) -> str:
    if kind == "authorization":
        scheme, _, credential = value.strip().partition(" ")
        credential = credential.strip()
        if credential and scheme.lower() in AUTHORIZATION_SCHEMES:
            if is_mask(credential):
                return value
            kind = SCHEME_KINDS.get(scheme.lower(), "token")
            found[kind] += 1
            return f"{scheme} {mask(kind)}"
        kind = "token"
    found[kind] += 1
    return mask(kind)


def _secret_field(field_name: str | None, value: str) -> str | None:
    """The kind to mask this string as, whole, because of the name of its field."""
    if field_name is None or not value or is_mask(value):
        return None
    kind = field_kind(field_name)
    if kind == "password" and _snake(field_name) == "pwd" and value[0] in "/~":
        return None  # PWD, the working directory
    return kind


def redact_value(value: Any, found: Redactions, field_name: str | None = None) -> Any:
    """Redact every string inside a JSON value (a memory value, a tool's input or result).

    A string in a field named like a secret (``password``, ``api_key``, ``client_secret``,
    ``access_token``, ``Authorization``, ``x-api-key``, ``aws_secret_access_key`` ...) is
    masked whole; every other string is redacted as text. Keys are kept."""
    if isinstance(value, str):
        kind = _secret_field(field_name, value)
        if kind is not None:
            return _redact_field(value, kind, found)
        return redact_text(value, found)
    if isinstance(value, dict):
        return {key: redact_value(item, found, key) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_value(item, found) for item in value]
    return value


# ---- an event's personal fields, as their marks say -----------------------------------------


def redact_personal(event: Envelope, found: Redactions) -> dict[str, Any]:
    """Each personal field of ``event`` (``topics.personal``), as JSON, with every free text in
    it redacted (``redact_value``) and what its model declares not personal (ids, enumerations,
    numbers, times) kept as it is: a content block's type and ids stay, its text, tool input
    and tool output are redacted. Empty when the event has no personal fields."""
    spec = personal_fields(type(event))
    if spec is None:
        return {}
    payload: BaseModel = event.payload
    steps = _steps(type(payload))
    return {name: steps[name](getattr(payload, name), found) for name in spec.names}


# How one field is redacted: its value and the counts in, its JSON out.
_Step = Callable[[Any, Redactions], Any]


@functools.cache
def _steps(model: type[BaseModel]) -> dict[str, _Step]:
    """Per field of ``model``, how it is redacted: built once per model from its shapes."""
    return {name: _step(shape, name) for name, shape in field_shapes(model).items()}


def _step(shape: Shape, field_name: str) -> _Step:
    if shape is Shape.KEPT:
        return _kept
    if shape is Shape.MODELS:
        return _models

    def free(value: Any, found: Redactions) -> Any:
        if isinstance(value, tuple):
            value = list(value)
        return redact_value(value, found, field_name)

    return free


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _kept(value: Any, found: Redactions) -> Any:
    return value if type(value) in _JSON_SCALARS else to_jsonable_python(value)


def _models(value: Any, found: Redactions) -> Any:
    if isinstance(value, BaseModel):
        steps = _steps(type(value))
        return {name: step(getattr(value, name), found) for name, step in steps.items()}
    if isinstance(value, list | tuple):
        return [_models(item, found) for item in value]
    return _kept(value, found)
