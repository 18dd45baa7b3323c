"""Deletions: request one for the key's tenant (published to ``deletion.requests`` as
``memproj delete`` publishes it, with the same builder) and follow its per-store status in the
deletion ledger. Both need the key's ``delete`` purpose; a deletion id of another tenant is
a 404, as one that does not exist.

A client that may retry sends an ``Idempotency-Key`` header: the first request with a key is
published and its deletion id recorded in the transaction that waits for the delivery
(``projections.access.proposals.claim_deletion_request``); a retry with the same key and body
gets the same answer and publishes nothing; the same key with another body is a 422. Without
the header, every request is a new deletion."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Header

from projections import rejections
from projections.access.proposals import (
    DELETE,
    AcceptedDeletion,
    IdempotencyKeyReused,
    claim_deletion_request,
    key_actor,
    request_digest,
)
from projections.deletion import lifecycle
from projections.deletion.ledger import HeldBy
from projections.retention import holds as legal_holds
from streams.api.auth import CurrentPrincipal, Principal, Services
from streams.api.errors import ApiError, error_responses
from streams.api.paths import DeletionIdPath
from streams.api.services import ApiServices
from streams.deletion_requests import (
    DeletionRequest,
    InvalidDeletionRequest,
    build_deletion_request,
)
from streams.kafka import PublishFailed
from topics.api.paths import encode_segment
from topics.api.writes import DeletionAccepted, DeletionProgress, DeletionRequestBody
from topics.deletion import DeletionRequested
from topics.registry import DELETION_REQUESTS

router = APIRouter(prefix="/v1", tags=["deletions"])

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="makes retries safe: a retry with the same key and body answers the first "
        "request's deletion id and publishes nothing; the same key with another body is a 422",
    ),
]


@router.post(
    "/deletions",
    status_code=202,
    response_model=DeletionAccepted,
    responses=error_responses(400, 401, 403, 409, 413, 422, 429, 500, 503),
    summary="Request a deletion (published to deletion.requests)",
    operation_id="request_deletion",
)
async def request_deletion(
    services: Services,
    principal: CurrentPrincipal,
    body: DeletionRequestBody,
    idempotency_key: IdempotencyKey = None,
) -> DeletionAccepted:
    """Erase a subject, delete a conversation or erase a memory of the key's tenant, with
    everything derived from it. 202: the request is in Kafka; the deletion worker records it
    in its ledger and fans it out to every store (follow it at ``status_url``)."""
    principal.check_purpose(DELETE)
    request = deletion_request(services, principal, body)
    if idempotency_key is None:
        held = await holding(services, request)
        await deliver(services, request)
        refuse_if_held(held, request.deletion_id)
        return accepted(principal.tenant_id, request.deletion_id, request.requested_at)
    digest = request_digest(body.model_dump(mode="json"))
    fresh = AcceptedDeletion(request.deletion_id, request.requested_at)
    async with services.pool.connection() as conn, conn.transaction():
        try:
            first = await claim_deletion_request(
                conn, principal.tenant_id, principal.key_id, idempotency_key, digest, fresh
            )
        except IdempotencyKeyReused:
            raise ApiError(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used for a deletion request with another body",
            ) from None
        if first is not None:
            return accepted(principal.tenant_id, first.deletion_id, first.requested_at)
        # A failed delivery leaves the block and rolls the claim back: the retry is a first try.
        held = await holding(services, request)
        await deliver(services, request)
    refuse_if_held(held, request.deletion_id)
    return accepted(principal.tenant_id, request.deletion_id, request.requested_at)


async def holding(services: ApiServices, request: DeletionRequest) -> HeldBy | None:
    """The legal hold the ledger will refuse ``request`` under, if any. The request is
    published all the same: the ledger decides and records the refusal."""
    event = DeletionRequested.model_validate_json(request.value)
    async with services.pool.connection() as conn:
        return await legal_holds.holding_request(
            conn, request.tenant_id, event.payload.target, event.occurred_at
        )


def refuse_if_held(held: HeldBy | None, deletion_id: str) -> None:
    if held is not None:
        raise ApiError(
            409,
            "legal_hold",
            f"refused: {held.description} is in force; recorded as deletion {deletion_id}",
        )


def deletion_request(
    services: ApiServices, principal: Principal, body: DeletionRequestBody
) -> DeletionRequest:
    deadline = timedelta(seconds=body.deadline_seconds) if body.deadline_seconds else None
    try:
        return build_deletion_request(
            principal.tenant_id,
            body.target.model_dump(exclude_none=True),
            body.reason,
            key_actor(principal.actor),
            services.clock(),
            deadline,
        )
    except InvalidDeletionRequest as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


async def deliver(services: ApiServices, request: DeletionRequest) -> None:
    topic = services.settings.topics.name(DELETION_REQUESTS)
    try:
        await services.producer.deliver(topic, request.key, request.value)
    except PublishFailed:
        raise ApiError(503, "not_delivered", "Kafka did not take the request: retry") from None


def accepted(tenant_id: str, deletion_id: str, requested_at: datetime) -> DeletionAccepted:
    return DeletionAccepted(
        deletion_id=deletion_id,
        tenant_id=tenant_id,
        requested_at=requested_at,
        status_url=f"/v1/deletions/{encode_segment(deletion_id)}",
    )


@router.get(
    "/deletions/{deletion_id:segment}",
    response_model=DeletionProgress,
    responses=error_responses(401, 403, 404, 409, 413, 422, 429, 500),
    summary="A deletion's per-store status, timings and verification",
    operation_id="get_deletion",
)
async def get_deletion(
    services: Services, principal: CurrentPrincipal, deletion_id: DeletionIdPath
) -> DeletionProgress:
    """404 until the deletion worker has recorded the request, and for another tenant's."""
    principal.check_purpose(DELETE)
    async with services.pool.connection() as conn:
        detail = await lifecycle.request_detail(conn, principal.tenant_id, deletion_id)
        refused = (
            None
            if detail
            else await rejections.legal_hold_refusal(conn, principal.tenant_id, deletion_id)
        )
    if refused is not None:
        raise ApiError(409, "legal_hold", refused)
    if detail is None:
        raise ApiError(404, "not_found", f"no deletion {deletion_id!r} (yet)")
    return DeletionProgress.model_validate(detail)
