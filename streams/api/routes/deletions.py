"""Deletions: request one for the key's tenant (published to ``deletion.requests`` as
``memproj delete`` publishes it, with the same builder) and follow its per-store status in the
deletion ledger. Both need the key's ``delete`` purpose; a deletion id of another tenant is
a 404, as one that does not exist."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path

from projections.access.proposals import DELETE, key_actor
from projections.deletion import queries
from streams.api.auth import CurrentPrincipal, Services
from streams.api.errors import ApiError, error_responses
from streams.deletion_requests import InvalidDeletionRequest, build_deletion_request
from streams.kafka import PublishFailed
from topics.api.writes import DeletionAccepted, DeletionProgress, DeletionRequestBody
from topics.registry import DELETION_REQUESTS

router = APIRouter(prefix="/v1", tags=["deletions"])

DeletionId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]


@router.post(
    "/deletions",
    status_code=202,
    response_model=DeletionAccepted,
    responses=error_responses(400, 401, 403, 413, 422, 429, 500, 503),
    summary="Request a deletion (published to deletion.requests)",
    operation_id="request_deletion",
)
async def request_deletion(
    services: Services, principal: CurrentPrincipal, body: DeletionRequestBody
) -> DeletionAccepted:
    """Erase a subject, delete a conversation or erase a memory of the key's tenant, with
    everything derived from it. 202: the request is in Kafka; the deletion worker records it
    in its ledger and fans it out to every store (follow it at ``status_url``)."""
    principal.check_purpose(DELETE)
    deadline = timedelta(seconds=body.deadline_seconds) if body.deadline_seconds else None
    try:
        request = build_deletion_request(
            principal.tenant_id,
            body.target.model_dump(exclude_none=True),
            body.reason,
            key_actor(principal.actor),
            services.clock(),
            deadline,
        )
    except InvalidDeletionRequest as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    topic = services.settings.topics.name(DELETION_REQUESTS)
    try:
        await services.producer.deliver(topic, request.key, request.value)
    except PublishFailed:
        raise ApiError(503, "not_delivered", "Kafka did not take the request: retry") from None
    return DeletionAccepted(
        deletion_id=request.deletion_id,
        tenant_id=request.tenant_id,
        requested_at=request.requested_at,
        status_url=f"/v1/deletions/{request.deletion_id}",
    )


@router.get(
    "/deletions/{deletion_id}",
    response_model=DeletionProgress,
    responses=error_responses(401, 403, 404, 413, 422, 429, 500),
    summary="A deletion's per-store status, timings and verification",
    operation_id="get_deletion",
)
async def get_deletion(
    services: Services, principal: CurrentPrincipal, deletion_id: DeletionId
) -> DeletionProgress:
    """404 until the deletion worker has recorded the request, and for another tenant's."""
    principal.check_purpose(DELETE)
    async with services.pool.connection() as conn:
        detail = await queries.request_detail(conn, principal.tenant_id, deletion_id)
    if detail is None:
        raise ApiError(404, "not_found", f"no deletion {deletion_id!r} (yet)")
    return DeletionProgress.model_validate(detail)
