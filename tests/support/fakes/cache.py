"""``RecallCache`` in memory: the cache port's contract (tests/support/contracts/cache.py)
without Redis, for tests of what reads or invalidates the cache.

It keeps what Redis keeps, under the same keys (``TenantKeys``): each entry's value as bytes
and an index (a set of entry keys) per subject, memory and conversation an entry holds, and it
judges entries by the same rule (``holdings_of``, an unreadable value holds anything). It does
not expire anything: a TTL is Redis's to keep (tests/projections/test_cache_store.py).
``write_unindexed`` writes a value behind the indexes' back, as another writer could.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from projections.cache.entries import (
    UNREADABLE,
    Holdings,
    Subject,
    context_entry,
    decode_entry,
    holdings_of,
    recall_entry,
)
from projections.cache.keys import TenantKeys


class InMemoryCache:
    def __init__(self, namespace: str = "memproj") -> None:
        self._namespace = namespace
        self.values: dict[str, bytes] = {}
        self.indexes: dict[str, set[str]] = {}

    def _keys(self, tenant_id: str) -> TenantKeys:
        return TenantKeys(self._namespace, tenant_id)

    def write_unindexed(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def exists(self, key: str) -> bool:
        return key in self.values or bool(self.indexes.get(key))

    async def get_recall(
        self, tenant_id: str, subject: Subject, query_key: str
    ) -> list[dict[str, Any]] | None:
        entry = self._get(self._keys(tenant_id).recall(subject, query_key))
        records = entry.get("records") if entry else None
        return records if isinstance(records, list) else None

    async def put_recall(
        self,
        tenant_id: str,
        subject: Subject,
        query_key: str,
        records: Sequence[Mapping[str, Any]],
    ) -> None:
        keys = self._keys(tenant_id)
        self._put(keys, keys.recall(subject, query_key), recall_entry(subject, records))

    async def get_context(self, tenant_id: str, conversation_id: str) -> dict[str, Any] | None:
        entry = self._get(self._keys(tenant_id).context(conversation_id))
        view = entry.get("view") if entry else None
        return view if isinstance(view, dict) else None

    async def put_context(
        self, tenant_id: str, conversation_id: str, owner: Subject, view: Mapping[str, Any]
    ) -> None:
        keys = self._keys(tenant_id)
        entry = context_entry(conversation_id, owner, view)
        self._put(keys, keys.context(conversation_id), entry)

    async def invalidate(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> int:
        targets = Holdings.targets(subject, conversation_ids, memory_ids)
        (deleted,) = await self.invalidate_each([(tenant_id, targets)])
        return deleted

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        deleted = []
        for tenant_id, targets in erasures:
            doomed = self._candidates(tenant_id, targets)
            deleted.append(sum(1 for key in doomed if self.values.pop(key, None) is not None))
            for index in self._keys(tenant_id).indexes(targets):
                self.indexes.pop(index, None)
        return deleted

    async def reachable(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> list[str]:
        targets = Holdings.targets(subject, conversation_ids, memory_ids)
        (found,) = await self.reachable_each([(tenant_id, targets)])
        return found

    async def reachable_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]:
        """Every entry of the tenant is a candidate: the scan Redis does."""
        return [
            self._holding(targets, self._tenant_keys(tenant_id)) for tenant_id, targets in erasures
        ]

    async def indexed_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]:
        return [
            self._holding(targets, self._candidates(tenant_id, targets))
            for tenant_id, targets in erasures
        ]

    async def entries(self, tenant_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (key, dict(UNREADABLE) if entry is None else entry)
            for key in sorted(self._tenant_keys(tenant_id))
            for entry in [decode_entry(self.values[key])]
        ]

    def _get(self, key: str) -> dict[str, Any] | None:
        value = self.values.get(key)
        return None if value is None else decode_entry(value)

    def _put(self, keys: TenantKeys, key: str, entry: dict[str, Any]) -> None:
        self.values[key] = orjson.dumps(entry)
        for index in keys.indexes(holdings_of(entry)):
            self.indexes.setdefault(index, set()).add(key)

    def _candidates(self, tenant_id: str, targets: Holdings) -> set[str]:
        """What the targets' indexes name, and their context keys (known without an index)."""
        keys = self._keys(tenant_id)
        found = set(map(keys.context, targets.conversation_ids))
        for index in keys.indexes(targets):
            found |= self.indexes.get(index, set())
        return found

    def _tenant_keys(self, tenant_id: str) -> set[str]:
        prefix = self._keys(tenant_id).cache_prefix()
        return {key for key in self.values if key.startswith(prefix)}

    def _holding(self, targets: Holdings, candidates: Iterable[str]) -> list[str]:
        """Of ``candidates``, the entries that exist and hold a target (or are unreadable)."""
        found = []
        for key in sorted(set(candidates)):
            if key not in self.values:
                continue
            entry = decode_entry(self.values[key])
            if entry is None or holdings_of(entry).overlaps(targets):
                found.append(key)
        return found
