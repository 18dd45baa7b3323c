"""Reviews: the key's tenant's writes held for review, each as the reviewer's diff, and a
person's decision on one, published to ``memory.events`` as ``memory.reviewed`` with the
builder ``memproj review approve|reject`` uses.

Every route needs the key's ``review`` purpose and a key whose actor is a person
(``user:ID`` or ``operator:ID``): an agent's key is refused ``review_not_allowed`` (403), as
the memory worker would refuse its review. The purpose's policy bounds what the key reviews
(its kinds and scopes, as for reads); the reads are audited like every read (ids only). A 202
means the review is in Kafka: the memory worker applies it, or refuses it on
``memory.rejections`` (``stale_review`` when the version is no longer the one held)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from projections.access.policy import PolicyRefusal, PurposePolicy, ReadDecision, allowed
from projections.access.policy import memory_filters as purpose_filters
from projections.access.proposals import REVIEW, judge_reviewer
from projections.sql import Conn
from streams.api.auth import CurrentPrincipal, Principal, Services
from streams.api.errors import ApiError, error_responses
from streams.api.paths import MemoryIdPath
from streams.api.reading import audited_read
from streams.kafka import PublishFailed
from streams.reviews import InvalidReview, build_review, pending_diffs
from topics.api.models import ReviewAccepted, ReviewDecisionBody, ReviewDiff, ReviewList
from topics.envelope import ActorType
from topics.registry import MEMORY_EVENTS

router = APIRouter(prefix="/v1", tags=["reviews"])

_READ_ERRORS = error_responses(401, 403, 404, 413, 422, 429, 500)


def reviewer_of(principal: Principal) -> tuple[ActorType, str]:
    """The key's person, with the ``review`` purpose; 403 otherwise."""
    principal.check_purpose(REVIEW)
    try:
        return judge_reviewer(principal.actor)
    except PolicyRefusal as refusal:
        raise ApiError(403, refusal.code, refusal.message) from None


def reviewable(policy: PurposePolicy | None, diffs: list[ReviewDiff]) -> list[ReviewDiff]:
    """The diffs of kinds and scopes the purpose's policy covers (none without a policy)."""
    purpose_filters(policy)  # refuses a purpose without a policy
    assert policy is not None
    return [diff for diff in diffs if policy.may_read(diff.kind, diff.scope)]


@router.get(
    "/reviews",
    response_model=ReviewList,
    responses=_READ_ERRORS,
    summary="The writes held for review, oldest first, each as the reviewer's diff",
    operation_id="list_reviews",
)
async def list_reviews(
    services: Services,
    principal: CurrentPrincipal,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ReviewList:
    """Versions held for review (``pending_review``) of the key's tenant, within the
    ``review`` purpose's kinds and scopes: the proposed value, the version served meanwhile,
    the cited messages as stored (redacted), scope, expiry, policy version and rule."""
    reviewer_of(principal)

    async def read(conn: Conn, policy: PurposePolicy | None) -> tuple[ReviewList, ReadDecision]:
        diffs = reviewable(policy, await pending_diffs(conn, principal.tenant_id, limit))
        return ReviewList(reviews=diffs), allowed(d.memory_id for d in diffs)

    return await audited_read(services, principal, request, REVIEW, None, read)


@router.get(
    "/reviews/{memory_id:segment}",
    response_model=ReviewDiff,
    responses=_READ_ERRORS,
    summary="The reviewer's diff of one memory's held version",
    operation_id="get_review",
)
async def get_review(
    services: Services, principal: CurrentPrincipal, request: Request, memory_id: MemoryIdPath
) -> ReviewDiff:
    """404 when nothing of the memory awaits review (or its kind or scope is outside the
    purpose's policy: a key learns nothing of what it may not review)."""
    reviewer_of(principal)

    async def read(conn: Conn, policy: PurposePolicy | None) -> tuple[ReviewDiff, ReadDecision]:
        found = await pending_diffs(conn, principal.tenant_id, 1, memory_id)
        diffs = reviewable(policy, found)
        if not diffs:
            raise ApiError(404, "not_found", "nothing of this memory awaits review")
        return diffs[0], allowed([memory_id])

    return await audited_read(services, principal, request, REVIEW, None, read)


@router.post(
    "/reviews/{memory_id:segment}",
    status_code=202,
    response_model=ReviewAccepted,
    responses=error_responses(400, 401, 403, 404, 413, 422, 429, 500, 503),
    summary="Approve or reject a held version (published as memory.reviewed)",
    operation_id="review_memory",
)
async def review_memory(
    services: Services,
    principal: CurrentPrincipal,
    request: Request,
    memory_id: MemoryIdPath,
    body: ReviewDecisionBody,
) -> ReviewAccepted:
    """The key's person decides on ``version`` of the memory. 404 when nothing of the memory
    awaits review within the purpose's policy; a version that is no longer the held one is
    published all the same and refused by the memory worker as ``stale_review``."""
    reviewer = reviewer_of(principal)
    await get_review(services, principal, request, memory_id)
    try:
        message = build_review(
            principal.tenant_id,
            memory_id,
            body.version,
            body.decision,
            body.note,
            reviewer,
            services.clock(),
        )
    except InvalidReview as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    try:
        await services.producer.deliver(
            services.settings.topics.name(MEMORY_EVENTS), message.key, message.value
        )
    except PublishFailed:
        raise ApiError(503, "not_delivered", "Kafka did not take the review: retry") from None
    return ReviewAccepted(
        event_id=message.event_id,
        memory_id=memory_id,
        version=body.version,
        decision=body.decision,
        produced_at=message.produced_at,
    )
