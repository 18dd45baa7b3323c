"""Proposals: an agent without a Kafka client writes a memory or conversation event through
the same path a producer takes, the input topic.

The body is one contract event, validated by the contract's codec exactly as the workers
will decode it (a body the codec refuses is a 422 naming its reason code, never a dead
letter); the event must be of the key's tenant and name the key's actor, and the key must
hold the ``propose`` purpose (``projections.access.proposals``); a memory event must be within
the key's write bounds, if it has any (its kind and scope, and those of the memory a
verification, correction or revocation names, read from the projection). It is produced with the
contract's key (``tenant_id:entity_id``), as ``memproj demo produce`` and every producer do.

Accepted once, never lost: the event id is recorded in ``api_proposals`` and the event
delivered to Kafka in one database transaction, committed only after the broker confirmed
the delivery. So a 202 means the event is in Kafka and recorded; a repeated event id is
answered "duplicate" (200) and produces nothing (a concurrent repeat waits on the first
one's row lock); a failed delivery is a 503 that records nothing, for the client to retry.
A crash between the delivery and the commit leaves the event in Kafka unrecorded: the
client never saw its 202 and retries, and the workers' event-id idempotency absorbs the
second copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from projections.access.policy import PolicyRefusal
from projections.access.proposals import (
    accepted_at,
    judge_memory_write,
    judge_proposal,
    record_proposal,
)
from projections.memory import store as memory_store
from projections.sql import Conn
from streams.api.auth import CurrentPrincipal, Principal, Services
from streams.api.errors import ApiError, error_responses
from streams.api.services import ApiServices
from streams.kafka import PublishFailed
from topics.api.writes import (
    CONVERSATION_EVENT_SCHEMA,
    MEMORY_EVENT_SCHEMA,
    ProposalAnswer,
    event_schemas,
)
from topics.codec import EventCodec, InvalidMessage
from topics.envelope import Envelope
from topics.memory import MemoryEvent, MemoryProposed
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS, TopicSpec, input_key
from topics.schemas import default_schemas

router = APIRouter(prefix="/v1", tags=["proposals"])


@dataclass(frozen=True, slots=True)
class InputTopic:
    """Where one kind of proposal goes, and what its events must be."""

    spec: TopicSpec
    event_prefix: str  # every event type on the topic starts with it
    entity_field: str  # the payload field the message key names
    schema: str  # the OpenAPI component of its body


MEMORY = InputTopic(MEMORY_EVENTS, "memory.", "memory_id", MEMORY_EVENT_SCHEMA)
CONVERSATION = InputTopic(
    CONVERSATION_EVENTS, "conversation.", "conversation_id", CONVERSATION_EVENT_SCHEMA
)


@functools.cache
def codec_for(event_prefix: str, max_value_bytes: int) -> EventCodec:
    """The codec the sealer decodes the raw topic with: the topic's event types, the memory
    value's size bound."""
    schemas = default_schemas()
    accepted = frozenset(t for t in schemas.event_types() if t.startswith(event_prefix))
    return EventCodec(schemas, accepted, {"value": max_value_bytes})


def claimed_key(body: bytes, entity_field: str) -> bytes:
    """The message key the event's own fields name (``tenant_id:entity``), or b"" where they
    name none: the codec then refuses the event for what is missing."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        return b""
    if not isinstance(raw, dict) or not isinstance(raw.get("payload"), dict):
        return b""
    tenant, entity = raw.get("tenant_id"), raw["payload"].get(entity_field)
    if not isinstance(tenant, str) or not isinstance(entity, str):
        return b""
    return input_key(tenant, entity).encode()


def decode_proposal(topic: InputTopic, body: bytes, max_value_bytes: int) -> tuple[Envelope, bytes]:
    """The validated event and its message key; 422 with the codec's reason code otherwise."""
    key = claimed_key(body, topic.entity_field)
    try:
        return codec_for(topic.event_prefix, max_value_bytes).decode(key, body), key
    except InvalidMessage as exc:
        raise ApiError(422, exc.code.value, exc.detail[:2000]) from None


async def judge_bounds(conn: Conn, principal: Principal, event: MemoryEvent) -> None:
    """403 for a memory event outside the key's write bounds (a key without any: none)."""
    bounds = principal.write_bounds
    if bounds is None:
        return
    proposed = None
    if isinstance(event, MemoryProposed):
        proposed = (event.payload.kind, event.payload.scope)
    record = await memory_store.load_memory(conn, event.tenant_id, event.memory_id)
    stored = (record.kind, record.scope) if record is not None else None
    try:
        judge_memory_write(bounds, event.memory_id, proposed, stored)
    except PolicyRefusal as refusal:
        raise ApiError(403, refusal.code, refusal.message) from None


async def propose(
    services: ApiServices, principal: Principal, topic: InputTopic, body: bytes
) -> ProposalAnswer | JSONResponse:
    event, key = decode_proposal(topic, body, services.settings.max_memory_value_bytes)
    try:
        judge_proposal(
            event.tenant_id,
            (event.actor.type, event.actor.id),
            principal.tenant_id,
            principal.actor,
            principal.purposes,
        )
    except PolicyRefusal as refusal:
        raise ApiError(403, refusal.code, refusal.message) from None
    name = services.settings.topics.name(topic.spec)
    now = services.clock()
    async with services.pool.connection() as conn, conn.transaction():
        if isinstance(event, MemoryEvent):
            await judge_bounds(conn, principal, event)
        if not await record_proposal(conn, event.tenant_id, event.event_id, name, now):
            first = await accepted_at(conn, event.tenant_id, event.event_id)
            duplicate = ProposalAnswer(
                event_id=event.event_id,
                event_type=event.event_type,
                status="duplicate",
                accepted_at=first or now,
            )
            return JSONResponse(duplicate.model_dump(mode="json"), status_code=200)
        try:
            await services.producer.deliver(name, key, body)
        except PublishFailed:
            # Leaving the block rolls the record back: the client's retry is a first try.
            raise ApiError(
                503, "not_delivered", "Kafka did not take the event; nothing was recorded: retry"
            ) from None
    return ProposalAnswer(
        event_id=event.event_id, event_type=event.event_type, status="accepted", accepted_at=now
    )


def install_schemas(app: FastAPI) -> None:
    """Add the proposal bodies' schemas (``topics.api.writes.event_schemas``) to the app's
    OpenAPI components: the routes read their bodies raw, for the codec, so FastAPI does not
    know them."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            wanted = event_schemas()
            clashes = {n for n, schema in wanted.items() if schemas.get(n, schema) != schema}
            if clashes:
                raise RuntimeError(f"OpenAPI components named twice: {sorted(clashes)}")
            schemas.update(wanted)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _body_of(topic: InputTopic) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{topic.schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ProposalAnswer, "description": "a duplicate: the event id was accepted before"},
    **error_responses(401, 403, 413, 422, 429, 500, 503),
}


@router.post(
    "/memory-events",
    status_code=202,
    response_model=ProposalAnswer,
    responses=_RESPONSES,
    summary="Propose a memory event (produced to memory.events)",
    operation_id="propose_memory_event",
    openapi_extra=_body_of(MEMORY),
)
async def propose_memory_event(
    request: Request, services: Services, principal: CurrentPrincipal
) -> ProposalAnswer | JSONResponse:
    """A ``memory.proposed``, ``verified``, ``corrected`` or ``revoked`` event of the key's
    tenant, by the key's actor. 202: produced; the memory worker applies it as any other.
    A key with write bounds is refused (403) a proposal of a kind (``kind_not_writable``) or
    scope (``scope_not_writable``) outside them, and a verification, correction or
    revocation of a memory it may not write or that does not exist (``memory_not_writable``)."""
    return await propose(services, principal, MEMORY, await request.body())


@router.post(
    "/conversation-events",
    status_code=202,
    response_model=ProposalAnswer,
    responses=_RESPONSES,
    summary="Propose a conversation event (produced to conversation.events)",
    operation_id="propose_conversation_event",
    openapi_extra=_body_of(CONVERSATION),
)
async def propose_conversation_event(
    request: Request, services: Services, principal: CurrentPrincipal
) -> ProposalAnswer | JSONResponse:
    """A ``conversation.started``, ``message_added`` or ``summary_updated`` event of the key's
    tenant, by the key's actor. 202: produced; the conversation worker applies it."""
    return await propose(services, principal, CONVERSATION, await request.body())
