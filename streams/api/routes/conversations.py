"""Reading conversations: the context view, and the messages and summaries with their
sources. A purpose reads conversations only if its policy says so; the key's tenant only (a
conversation of another tenant is not found); none of a paused owner (423)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from projections.access import audit, pauses
from projections.access.policy import PurposePolicy, ReadDecision, allowed, check_conversations
from projections.conversation import store as conversation_store
from projections.sql import Conn
from streams import reads
from streams.api.auth import CurrentPrincipal, Services
from streams.api.errors import ApiError, error_responses
from streams.api.paths import ConversationIdPath
from streams.api.reading import audited_read
from streams.api.routes.memories import PurposeParam
from topics.api.models import ContextView, ConversationDetail

router = APIRouter(prefix="/v1", tags=["conversations"])

_READ_ERRORS = error_responses(401, 403, 404, 413, 422, 423, 429, 500)


@router.get(
    "/conversations/{conversation_id:segment}",
    response_model=ConversationDetail,
    responses=_READ_ERRORS,
    summary="A conversation's messages and its summaries with their sources",
    operation_id="get_conversation",
)
async def get_conversation(
    request: Request,
    services: Services,
    principal: CurrentPrincipal,
    conversation_id: ConversationIdPath,
    purpose: PurposeParam,
) -> ConversationDetail:
    async def read(
        conn: Conn, policy: PurposePolicy | None
    ) -> tuple[ConversationDetail, ReadDecision]:
        check_conversations(policy)
        detail = await conversation_store.load_conversation(
            conn, principal.tenant_id, conversation_id
        )
        if detail is None:
            raise ApiError(404, "not_found", f"no conversation {conversation_id!r}")
        owner = detail.record
        await pauses.check_serving(conn, principal.tenant_id, owner.owner_type, owner.owner_id)
        shown = detail.to_json()
        returned = [m.message_id for m in detail.messages]
        returned += [f"summary:{s.summary_version}" for s in detail.summaries]
        return ConversationDetail(**shown), allowed(returned)

    subject = audit.conversation_read(conversation_id)
    return await audited_read(services, principal, request, purpose, subject, read)


@router.get(
    "/conversations/{conversation_id:segment}/context",
    response_model=ContextView,
    responses=_READ_ERRORS,
    summary="The model-ready context view of a conversation",
    operation_id="get_context",
)
async def get_context(
    request: Request,
    services: Services,
    principal: CurrentPrincipal,
    conversation_id: ConversationIdPath,
    purpose: PurposeParam,
) -> ContextView:
    """Through the cache; a view of a conversation that is deleted is never served (the
    guard counts it, and the answer is 404)."""

    async def read(conn: Conn, policy: PurposePolicy | None) -> tuple[ContextView, ReadDecision]:
        check_conversations(policy)
        view = await reads.context_view(conn, services.cache, principal.tenant_id, conversation_id)
        if view is None:
            raise ApiError(404, "not_found", f"no context view of conversation {conversation_id!r}")
        answer = ContextView(conversation_id=conversation_id, view=view)
        return answer, allowed([conversation_id])

    subject = audit.conversation_read(conversation_id)
    return await audited_read(services, principal, request, purpose, subject, read)
