"""Subject pause, what needs no database: the reason as the log keeps it, and the refusal
every read path raises and the API answers as 423."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from projections.access.pauses import REASON_MAX_LENGTH, SubjectPaused, stored_reason
from streams.api import errors


def test_the_reason_is_kept_with_its_credentials_masked_and_bounded() -> None:
    kept = stored_reason("  leaked api_key=sk-abcdefghijklmnopqrstuvwxyz0123456789 in memory m1 ")
    assert "sk-abcdefghijklmnopqrstuvwxyz0123456789" not in kept
    assert kept.startswith("leaked ") and kept.endswith(" in memory m1")
    assert "[REDACTED:" in kept
    assert len(stored_reason("x" * (REASON_MAX_LENGTH * 2))) == REASON_MAX_LENGTH


def test_a_paused_subject_is_a_423_with_its_code_on_any_route() -> None:
    app = FastAPI()
    errors.install(app)

    @app.get("/read")
    async def read() -> None:
        raise SubjectPaused("acme", "user", "alice")

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.get("/read")

    answer = asyncio.run(ask())
    assert answer.status_code == 423
    body = answer.json()["error"]
    assert body["code"] == "subject_paused"
    assert "user:alice" in body["message"] and "acme" not in body["message"]
