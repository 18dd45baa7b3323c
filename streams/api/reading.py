"""One audited read: the purpose checked against the key, its policy loaded, the read run
under it, and the decision recorded (``projections.access.audit``), refused or not.

A refusal (403, or 423 for a paused subject) is recorded as ``denied`` before it is answered;
an answered read as ``allowed`` with the ids it returned and those it filtered (the guard's
drops, and hydrated candidates outside the request's filters). Ids only, never content.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from projections.access import audit
from projections.access.pauses import SubjectPaused
from projections.access.policy import DENIED, PolicyRefusal, PurposePolicy, ReadDecision
from projections.sql import Conn
from streams.api.auth import Principal, policy_of
from streams.api.errors import ApiError
from streams.api.metrics import template_of
from streams.api.services import ApiServices

T = TypeVar("T")

Read = Callable[[Conn, PurposePolicy | None], Awaitable[tuple[T, ReadDecision]]]


def route_of(request: Request) -> str:
    return template_of(request.scope.get("route"))


async def audited_read(
    services: ApiServices,
    principal: Principal,
    request: Request,
    purpose: str,
    subject: str | None,
    read: Read[T],
) -> T:
    route = route_of(request)

    async def record(conn: Conn, decision: ReadDecision) -> None:
        entry = audit.AuditEntry(
            services.clock(),
            principal.key_id,
            principal.tenant_id,
            principal.actor,
            purpose,
            route,
            subject,
            decision,
        )
        async with conn.transaction():
            await audit.record(conn, entry)

    async def record_refusal(conn: Conn) -> None:
        # A refusal after the read's first query leaves its implicit transaction open, which
        # the pool rolls back as the error leaves the block: the record commits on its own.
        await conn.rollback()
        await record(conn, DENIED)

    try:
        policy = await policy_of(services, principal, purpose)
    except ApiError:
        async with services.pool.connection() as conn:
            await record(conn, DENIED)
        raise
    async with services.pool.connection() as conn:
        try:
            answer, decision = await read(conn, policy)
        except PolicyRefusal as refusal:
            await record_refusal(conn)
            raise ApiError(403, refusal.code, refusal.message) from None
        except SubjectPaused as paused:
            await record_refusal(conn)
            raise ApiError(423, paused.code, paused.message) from None
        except ApiError as error:
            if error.status == 404:
                await record(conn, ReadDecision("allowed"))
            raise
        await record(conn, decision)
    return answer
