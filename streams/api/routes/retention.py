"""The retention receipt of the key's tenant, for a key with the ``admin`` purpose: per class,
what is inside its period, held, due, erased on time and late, and the oldest overdue."""

from __future__ import annotations

from dataclasses import asdict
from typing import Final

from fastapi import APIRouter

from projections.retention import store as schedule_store
from streams.api.auth import CurrentPrincipal, Services
from streams.api.errors import error_responses
from streams.sample import iso
from topics.api.models import RetentionClassReceipt, RetentionReceipt

ADMIN: Final = "admin"
router = APIRouter(prefix="/v1", tags=["retention"])


@router.get(
    "/retention/report",
    response_model=RetentionReceipt,
    responses=error_responses(401, 403, 413, 422, 429, 500),
    summary="The retention receipt of the key's tenant",
    operation_id="get_retention_report",
)
async def get_retention_report(services: Services, principal: CurrentPrincipal) -> RetentionReceipt:
    principal.check_purpose(ADMIN)
    now = services.clock()
    async with services.pool.connection() as conn:
        lines = await schedule_store.receipt(
            conn, now, services.settings.retention_default, principal.tenant_id
        )
    return RetentionReceipt(
        at=iso(now), classes=[RetentionClassReceipt(**asdict(line)) for line in lines]
    )
