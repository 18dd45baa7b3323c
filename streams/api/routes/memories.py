"""Reading memories: recall by exact filters, semantic search, one memory with its history.

Every route reads the key's tenant only, under the request's purpose: the purpose's kinds and
scopes go into the query (before ranking and the limit), and a request naming a kind or scope
its purpose may not read is refused (403). Every candidate is hydrated through the projection
and the erasure index (``streams.reads``); what the guard dropped is counted in the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from projections.access import audit, pauses
from projections.access.policy import PurposePolicy, ReadDecision, allowed, memory_filters
from projections.memory import store as memory_store
from projections.memory.evolve import HELD_STATUSES
from projections.memory.store import RecallQuery
from projections.sql import Conn
from streams import reads
from streams.api.auth import CurrentPrincipal, Principal, Services
from streams.api.errors import ApiError, error_responses
from streams.api.paths import ID_PATTERN, MemoryIdPath, SubjectIdPath, SubjectTypePath
from streams.api.reading import audited_read, route_of
from streams.api.services import ApiServices
from topics.api.models import Blocked, MemoryDetail, MemoryList, MemoryVersion
from topics.envelope import IDENTIFIER_MAX_LENGTH

router = APIRouter(prefix="/v1", tags=["memories"])

_READ_ERRORS = error_responses(401, 403, 404, 413, 422, 423, 429, 500)
_SEARCH_ERRORS = error_responses(401, 403, 404, 413, 422, 423, 429, 500, 503)

# Purposes are the API's own names (memproj keys purpose set): printable.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"
PurposeParam = Annotated[
    str,
    Query(
        min_length=1,
        max_length=200,
        pattern=NAME_PATTERN,
        description="why the caller reads: one of the key's purposes",
    ),
]
# A memory's scope and kind are contract ids.
ScopeParam = Annotated[
    str | None, Query(min_length=1, max_length=IDENTIFIER_MAX_LENGTH, pattern=ID_PATTERN)
]
KindParam = Annotated[
    str | None, Query(min_length=1, max_length=IDENTIFIER_MAX_LENGTH, pattern=ID_PATTERN)
]
StatusParam = Annotated[
    list[Literal["verified", "proposed"]] | None,
    Query(description="statuses to return (repeatable); default verified and proposed"),
]
MaxAgeParam = Annotated[
    float | None,
    Query(
        gt=0, le=100 * 365 * 86400, description="only memories observed within this many seconds"
    ),
]
LimitParam = Annotated[int, Query(ge=1, le=1000)]


def blocked_of(blocked: Mapping[str, Counter[str]]) -> Blocked:
    stores = {store: dict(reasons) for store, reasons in blocked.items() if reasons}
    return Blocked(total=sum(sum(r.values()) for r in stores.values()), stores=stores)


@dataclass(frozen=True, slots=True)
class ExactFilters:
    """The exact filters recall and search share (each route has its own limit default)."""

    scope: str | None
    kind: str | None
    status: list[Literal["verified", "proposed"]] | None
    max_age_seconds: float | None


def exact_filters(
    scope: ScopeParam = None,
    kind: KindParam = None,
    status: StatusParam = None,
    max_age_seconds: MaxAgeParam = None,
) -> ExactFilters:
    return ExactFilters(scope, kind, status, max_age_seconds)


Filters = Annotated[ExactFilters, Depends(exact_filters)]


def _query(
    principal: Principal,
    policy: PurposePolicy | None,
    subject: tuple[str, str],
    exact: ExactFilters,
    limit: int,
) -> RecallQuery:
    filters = memory_filters(policy, kind=exact.kind, scope=exact.scope)
    max_age = exact.max_age_seconds
    return RecallQuery(
        tenant_id=principal.tenant_id,
        subject_type=subject[0],
        subject_id=subject[1],
        scope=exact.scope,
        kind=exact.kind,
        statuses=tuple(dict.fromkeys(exact.status)) if exact.status else ("verified", "proposed"),
        max_age=timedelta(seconds=max_age) if max_age is not None else None,
        limit=limit,
        kinds=filters.kinds,
        scopes=filters.scopes,
    )


def _answer(
    services: ApiServices, request: Request, hydrated: reads.Hydrated
) -> tuple[MemoryList, ReadDecision]:
    services.metrics.blocked_reads(route_of(request), hydrated.blocked)
    answer = MemoryList(memories=hydrated.records, blocked=blocked_of(hydrated.blocked))
    decision = allowed(
        (r.memory_id for r in hydrated.records), [*hydrated.blocked_ids, *hydrated.filtered_ids]
    )
    return answer, decision


# What a subject's read hydrates its query with: recall through the cache, or search.
Hydrate = Callable[[Conn, RecallQuery], Awaitable[reads.Hydrated]]


async def read_subject(
    request: Request,
    services: ApiServices,
    principal: Principal,
    subject: tuple[str, str],
    purpose: str,
    exact: ExactFilters,
    limit: int,
    hydrate: Hydrate,
) -> MemoryList:
    """A subject's memories under the request's purpose, audited: the query built from the
    purpose's policy and the exact filters, hydrated by ``hydrate``."""

    async def read(conn: Conn, policy: PurposePolicy | None) -> tuple[MemoryList, ReadDecision]:
        hydrated = await hydrate(conn, _query(principal, policy, subject, exact, limit))
        return _answer(services, request, hydrated)

    about = audit.subject_read(*subject)
    return await audited_read(services, principal, request, purpose, about, read)


@router.get(
    "/subjects/{subject_type:segment}/{subject_id:segment}/memories",
    response_model=MemoryList,
    responses=_READ_ERRORS,
    summary="Recall: a subject's eligible memories by exact filters",
    operation_id="recall",
)
async def recall(
    request: Request,
    services: Services,
    principal: CurrentPrincipal,
    subject_type: SubjectTypePath,
    subject_id: SubjectIdPath,
    purpose: PurposeParam,
    exact: Filters,
    limit: LimitParam = 50,
) -> MemoryList:
    """Never revoked, superseded, expired, erased or another tenant's; newest observation
    first. Through the cache; every cached candidate is re-read through the projection. 423
    while the subject is paused."""

    async def hydrate(conn: Conn, query: RecallQuery) -> reads.Hydrated:
        return await reads.recall(conn, services.cache, query, services.clock())

    subject = (subject_type, subject_id)
    return await read_subject(request, services, principal, subject, purpose, exact, limit, hydrate)


@router.get(
    "/subjects/{subject_type:segment}/{subject_id:segment}/search",
    response_model=MemoryList,
    responses=_SEARCH_ERRORS,
    summary="Search: a subject's memories nearest to a text, by meaning and exact words",
    operation_id="search",
)
async def search(
    request: Request,
    services: Services,
    principal: CurrentPrincipal,
    subject_type: SubjectTypePath,
    subject_id: SubjectIdPath,
    purpose: PurposeParam,
    text: Annotated[str, Query(min_length=1, max_length=4096)],
    exact: Filters,
    limit: LimitParam = 10,
) -> MemoryList:
    """The vector store ranks the tenant's and subject's memories of the kinds and scopes the
    purpose and the request allow, and only those (filtered before ranking), as the deployment
    chose (MEMPROJ_SEARCH_MODE: by meaning and by exact words such as ids and names, fused;
    or by one of them); each candidate is hydrated through the projection and the erasure
    index, and those outside the request's statuses or maximum age are dropped; ``blocked``
    counts the guard's drops."""

    async def hydrate(conn: Conn, query: RecallQuery) -> reads.Hydrated:
        return await reads.recall_by_text(
            conn,
            services.vectors,
            services.embedder,
            query,
            text,
            services.clock(),
            services.settings.search_mode,
        )

    subject = (subject_type, subject_id)
    return await read_subject(request, services, principal, subject, purpose, exact, limit, hydrate)


@router.get(
    "/memories/{memory_id:segment}",
    response_model=MemoryDetail,
    responses=_READ_ERRORS,
    summary="One memory with its provenance and full history",
    operation_id="get_memory",
)
async def get_memory(
    request: Request,
    services: Services,
    principal: CurrentPrincipal,
    memory_id: MemoryIdPath,
    purpose: PurposeParam,
) -> MemoryDetail:
    """404 if the key's tenant has no such memory, or it is erased; 403 if the purpose may
    not read its kind or scope; 423 if its subject is paused."""

    async def read(conn: Conn, policy: PurposePolicy | None) -> tuple[MemoryDetail, ReadDecision]:
        memory_filters(policy)  # a purpose without a policy reads nothing
        now = services.clock()
        record = await memory_store.load_memory(conn, principal.tenant_id, memory_id)
        if record is not None:
            # The guard: an erasure the projection has not caught up with hides it too.
            _, dropped, _ = await reads.hydrate(conn, principal.tenant_id, [(memory_id, None)], now)
            if dropped["erased"] or dropped["deleted"]:
                services.metrics.blocked_reads(route_of(request), {"projection": dropped})
                record = None
        if record is None or record.status in HELD_STATUSES:
            # A memory never served (held for review, or rejected) is not there for readers.
            raise ApiError(404, "not_found", f"no memory {memory_id!r}")
        memory_filters(policy, kind=record.kind, scope=record.scope)
        subject = record.subject
        await pauses.check_serving(conn, principal.tenant_id, subject.type, subject.id)
        history = [
            MemoryVersion(
                version=entry.record.version,
                status=entry.record.status,
                # A held or rejected version's value is for its reviewers, not for readers.
                value={} if entry.record.status in HELD_STATUSES else entry.record.value,
                source=entry.record.source.model_dump(mode="json"),
                observed_at=entry.record.observed_at.isoformat(),
                verification=entry.record.verification,
                expires_at=entry.record.expires_at.isoformat() if entry.record.expires_at else None,
                event_id=entry.event_id,
                event_type=entry.event_type,
                occurred_at=entry.occurred_at.isoformat(),
                actor={"type": entry.actor_type, "id": entry.actor_id},
                superseded_at=entry.superseded_at.isoformat() if entry.superseded_at else None,
                policy_version=entry.policy_version,
                review_rule=entry.review_rule,
            )
            for entry in await memory_store.load_history(conn, principal.tenant_id, memory_id)
        ]
        detail = MemoryDetail(memory=record, eligible=record.is_eligible(now), history=history)
        return detail, allowed([memory_id])

    about = audit.memory_read(memory_id)
    return await audited_read(services, principal, request, purpose, about, read)
