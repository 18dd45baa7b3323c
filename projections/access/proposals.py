"""Writes through the HTTP API: who may propose an event or request a deletion, and the
proposals accepted once (``api_proposals``).

The rule (pure): a key writes only under a write purpose it holds (``PROPOSE`` for memory and
conversation events, ``DELETE`` for deletion requests; reserved names, granted like any other
purpose with ``memproj keys api create --purposes``); a proposed event must be of the key's
tenant and name the key's actor as its actor (``key_actor``: a key's ``agent:support-bot``
is the event actor ``{"type": "agent", "id": "support-bot"}``), so that an agent can neither
write into another tenant nor pass its event off as another actor's. Reads are governed by
``policy``: a write purpose reads nothing unless the tenant gives it a policy row too.

Accepted once: the API records ``(tenant_id, event_id)`` in the same transaction that waits
for the broker's delivery of the event (``streams.api.routes.proposals``), so that an
accepted (202) proposal is always in Kafka and recorded, a second request with the same
event id is answered "duplicate" and produces nothing, and a failed delivery records nothing
(the client retries). The one window left, a crash after the delivery and before the commit,
leaves the event in Kafka unrecorded: the client, which never got its 202, retries and the
event is produced again, which the workers' own event-id idempotency absorbs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, cast, get_args

from projections.access.policy import PolicyRefusal, check_purpose
from projections.bookkeeping import Conn
from topics.envelope import ActorType

PROPOSE: Final = "propose"
DELETE: Final = "delete"
WRITE_PURPOSES: Final = frozenset({PROPOSE, DELETE})
ACTOR_TYPES: Final = frozenset(get_args(ActorType))


def key_actor(actor: str) -> tuple[ActorType, str]:
    """The contract actor a key's actor names: ``type:id`` (``agent:support-bot``) with a
    contract actor type, else a service of that name."""
    actor_type, sep, actor_id = actor.partition(":")
    if sep and actor_id and actor_type in ACTOR_TYPES:
        return cast(ActorType, actor_type), actor_id
    return "service", actor


def judge_proposal(
    event_tenant: str,
    event_actor: tuple[str, str],
    tenant: str,
    actor: str,
    granted: Sequence[str],
) -> None:
    """Refuse (``PolicyRefusal``, a 403) an event that a key of ``tenant``, ``actor`` and
    ``granted`` purposes may not propose: one of another tenant, without the ``PROPOSE``
    purpose, or whose actor (type, id) is not the key's (``key_actor``). The tenant is
    checked first: a key learns nothing of another tenant's writes beyond "not yours"."""
    if event_tenant != tenant:
        raise PolicyRefusal("tenant_mismatch", "the event's tenant_id is not this key's tenant")
    check_purpose(PROPOSE, granted)
    expected = key_actor(actor)
    if tuple(event_actor) != expected:
        raise PolicyRefusal(
            "actor_mismatch",
            f"the event's actor must be this key's: type {expected[0]!r}, id {expected[1]!r}",
        )


async def record_proposal(
    conn: Conn, tenant_id: str, event_id: str, topic: str, now: datetime
) -> bool:
    """Record a proposal inside the caller's transaction; False if this event id was accepted
    before. A concurrent request with the same id waits on this row's lock until the caller
    commits (then it is a duplicate) or rolls back (then it records its own)."""
    cursor = await conn.execute(
        "INSERT INTO api_proposals (tenant_id, event_id, accepted_at, topic)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, event_id) DO NOTHING",
        (tenant_id, event_id, now, topic),
    )
    return cursor.rowcount == 1


async def accepted_at(conn: Conn, tenant_id: str, event_id: str) -> datetime | None:
    """When a proposal with this event id was accepted, if it was."""
    cursor = await conn.execute(
        "SELECT accepted_at FROM api_proposals WHERE tenant_id = %s AND event_id = %s",
        (tenant_id, event_id),
    )
    row = await cursor.fetchone()
    return row[0] if row is not None else None
