"""Writes through the HTTP API: who may propose an event or request a deletion, and the
proposals accepted once (``api_proposals``).

The rule (pure): a key writes only under a write purpose it holds (``PROPOSE`` for memory and
conversation events, ``DELETE`` for deletion requests; reserved names, granted like any other
purpose with ``memproj keys api create --purposes``); a proposed event must be of the key's
tenant and name the key's actor as its actor (``key_actor``: a key's ``agent:support-bot``
is the event actor ``{"type": "agent", "id": "support-bot"}``), so that an agent can neither
write into another tenant nor pass its event off as another actor's. Reads are governed by
``policy``: a write purpose reads nothing unless the tenant gives it a policy row too.

Write bounds (``WriteBounds``, per key): a key's ``propose`` purpose writes memories of the
kinds and scopes its bounds name, and no others (``judge_memory_write``): a ``memory.proposed``
outside them is refused, and so is a verification, correction or revocation of a memory the
projection holds with a kind or scope outside them, or does not hold at all (a bounded key
learns nothing of a memory it may not write, not even that it exists). Conversation events
and deletion requests are not bounded by them. A key without bounds writes any kind and scope.

Accepted once: the API records ``(tenant_id, event_id)`` in the same transaction that waits
for the broker's delivery of the event (``streams.api.routes.proposals``), so that an
accepted (202) proposal is always in Kafka and recorded, a second request with the same
event id is answered "duplicate" and produces nothing, and a failed delivery records nothing
(the client retries). The one window left, a crash after the delivery and before the commit,
leaves the event in Kafka unrecorded: the client, which never got its 202, retries and the
event is produced again, which the workers' own event-id idempotency absorbs.

A deletion request with an ``Idempotency-Key`` is accepted once per key the same way
(``claim_deletion_request``, table ``api_deletion_requests``): the first request's deletion
id is recorded with a digest of its body in the transaction that waits for its delivery; a
retry with the same key and body is answered with that deletion id and publishes nothing,
one with another body is refused (``IdempotencyKeyReused``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, cast, get_args

import orjson

from projections.access.policy import PolicyRefusal, WriteBounds, check_purpose
from projections.memory.evolve import REVIEWER_TYPES
from projections.sql import Conn
from topics.envelope import ActorType

PROPOSE: Final = "propose"
DELETE: Final = "delete"
# Reads the held writes and publishes reviews of them (a person's key only: ``judge_reviewer``).
REVIEW: Final = "review"
WRITE_PURPOSES: Final = frozenset({PROPOSE, DELETE, REVIEW})
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


def judge_reviewer(actor: str) -> tuple[ActorType, str]:
    """The reviewer a key of ``actor`` is (its ``key_actor``), or a refusal: only a person,
    a ``user`` or an ``operator``, reviews (the memory reducer refuses anyone else too)."""
    reviewer = key_actor(actor)
    if reviewer[0] not in REVIEWER_TYPES:
        raise PolicyRefusal(
            "review_not_allowed",
            f"a {reviewer[0]} may not review: a key whose actor is user:ID or operator:ID may",
        )
    return reviewer


def judge_memory_write(
    bounds: WriteBounds | None,
    memory_id: str,
    proposed: tuple[str, str] | None,
    stored: tuple[str, str] | None,
) -> None:
    """Refuse (``PolicyRefusal``, a 403) a memory event outside a key's write ``bounds``.
    ``proposed``: the (kind, scope) a ``memory.proposed`` names, else None; ``stored``: the
    (kind, scope) of the memory the projection holds under ``memory_id``, None if none. A
    proposal needs its own kind and scope within the bounds (and the stored one's, if it
    names a memory that exists); any other event needs a stored memory within them."""
    if bounds is None:
        return
    if proposed is not None:
        kind, scope = proposed
        if not bounds.writes_kind(kind):
            raise PolicyRefusal("kind_not_writable", f"this key may not write kind {kind!r}")
        if not bounds.writes_scope(scope):
            raise PolicyRefusal("scope_not_writable", f"this key may not write scope {scope!r}")
    if (proposed is None or stored is not None) and (
        stored is None or not bounds.may_write(*stored)
    ):
        raise PolicyRefusal(
            "memory_not_writable",
            f"this key may not change memory {memory_id!r}: it is unknown, or of a kind or"
            " scope outside the key's write bounds",
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


@dataclass(frozen=True, slots=True)
class AcceptedDeletion:
    deletion_id: str
    requested_at: datetime


class IdempotencyKeyReused(ValueError):
    """The idempotency key was used before for a deletion request with another body."""


def request_digest(body: Mapping[str, Any]) -> bytes:
    """A digest of a request body that does not depend on its keys' order or spacing."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).digest()


async def claim_deletion_request(
    conn: Conn,
    tenant_id: str,
    key_id: str,
    idempotency_key: str,
    digest: bytes,
    fresh: AcceptedDeletion,
) -> AcceptedDeletion | None:
    """Record ``fresh`` as the deletion of this idempotency key, inside the caller's
    transaction: None if it is the first (the caller publishes it and commits), else the
    deletion recorded before (publish nothing). A concurrent request with the same key waits
    on the row until the first commits or rolls back. ``IdempotencyKeyReused`` if the key
    was used for another body."""
    cursor = await conn.execute(
        "INSERT INTO api_deletion_requests"
        " (tenant_id, key_id, idempotency_key, body_digest, deletion_id, requested_at)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (tenant_id, key_id, idempotency_key, digest, fresh.deletion_id, fresh.requested_at),
    )
    if cursor.rowcount == 1:
        return None
    cursor = await conn.execute(
        "SELECT body_digest, deletion_id, requested_at FROM api_deletion_requests"
        " WHERE tenant_id = %s AND key_id = %s AND idempotency_key = %s",
        (tenant_id, key_id, idempotency_key),
    )
    row = await cursor.fetchone()
    assert row is not None  # the conflict was with this committed row
    if bytes(row[0]) != digest:
        raise IdempotencyKeyReused(idempotency_key)
    return AcceptedDeletion(row[1], row[2])
