"""The committed OpenAPI document is the server's: regenerate it with
``memproj serve --write-openapi`` after changing a route or a model."""

from __future__ import annotations

import json

from streams.cli.serve import OPENAPI_DOCUMENT, openapi_text
from streams.settings import Settings


def test_the_committed_document_is_the_apps() -> None:
    committed = json.loads(OPENAPI_DOCUMENT.read_text())
    assert committed["openapi"].startswith("3.1")
    assert json.loads(openapi_text(Settings())) == committed, (
        "topics/api/openapi-v1.json is stale: run memproj serve --write-openapi"
    )
