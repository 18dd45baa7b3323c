"""The cache port (``RecallCache``); ``projections.cache.store.RedisCache`` keeps it in Redis.
Modules that only use the port import this one, not redis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from projections.cache.entries import Holdings, Subject


class RecallCache(Protocol):
    """The cache port: recall results and context views of every tenant, each entry indexed
    under the subjects, memories and conversations it holds (``holdings_of``), so that an
    invalidation and its check find them without a scan. ``RedisCache`` keeps it in Redis;
    every adapter passes the contract of tests/support/contracts/cache.py."""

    async def get_recall(
        self, tenant_id: str, subject: Subject, query_key: str
    ) -> list[dict[str, Any]] | None: ...

    async def put_recall(
        self,
        tenant_id: str,
        subject: Subject,
        query_key: str,
        records: Sequence[Mapping[str, Any]],
    ) -> None: ...

    async def get_context(self, tenant_id: str, conversation_id: str) -> dict[str, Any] | None: ...

    async def put_context(
        self, tenant_id: str, conversation_id: str, owner: Subject, view: Mapping[str, Any]
    ) -> None: ...

    async def invalidate(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> int: ...

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]: ...

    async def reachable(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> list[str]: ...

    async def reachable_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]: ...

    async def indexed_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]: ...

    async def entries(self, tenant_id: str) -> list[tuple[str, dict[str, Any]]]: ...
