"""The committed OpenAPI document is the server's: regenerate it with
``memproj serve --write-openapi`` after changing a route or a model."""

from __future__ import annotations

import json
from typing import Any

from streams.cli.serve import OPENAPI_DOCUMENT, openapi_text
from streams.settings import Settings


def test_the_committed_document_is_the_apps() -> None:
    committed = json.loads(OPENAPI_DOCUMENT.read_text())
    assert committed["openapi"].startswith("3.1")
    assert json.loads(openapi_text(Settings())) == committed, (
        "topics/api/openapi-v1.json is stale: run memproj serve --write-openapi"
    )


def _strings(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The string schemas a parameter's schema admits (through anyOf and array items)."""
    found = [schema] if schema.get("type") == "string" else []
    for each in schema.get("anyOf", []):
        found += _strings(each)
    if "items" in schema:
        found += _strings(schema["items"])
    return found


def test_every_string_parameter_is_bounded() -> None:
    """Each one is refused past its bound with a 422 that names it, before any read."""
    document = json.loads(OPENAPI_DOCUMENT.read_text())
    unbounded = [
        f"{method.upper()} {path} {parameter['name']}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for parameter in operation.get("parameters", [])
        for schema in _strings(parameter["schema"])
        if "maxLength" not in schema and "enum" not in schema
    ]
    assert not unbounded
