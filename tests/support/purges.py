"""Completed deletions as the purge checks see them, for the purge tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from projections.deletion.purge import DuePurge
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def due(
    deletion_id: str,
    memories: Sequence[str] = ("m1",),
    kind: str = "erasure",
    stores: Sequence[str] = ("embeddings", "summaries", "cache", "context"),
    mark: dict[str, object] | None = None,
) -> DuePurge:
    tombstone = Tombstone(
        deletion_id=deletion_id,
        tenant_id="acme",
        kind="erasure" if kind == "erasure" else "revocation",
        target=DeletionTarget(type="subject", id="alice", subject_type="user"),
        items=tuple(TombstoneItem(type="memory", id=m) for m in memories),
        issued_at=NOW,
        cut_off=NOW,
        deadline_at=NOW,
        required_stores=tuple(stores),
    )
    return DuePurge(tombstone, mark or {})
