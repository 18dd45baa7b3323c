"""The erasure orchestrator: an erasure walks the registered erasers, in order, in the
ledger's transaction, the way a tombstone walks the derived stores (``projections.stores``).

Each eraser is a function of the module that owns the tables it erases from: it takes the
erasure's ``ErasureScope`` (plain data: tenant, deletion, subject, memories, conversations)
and removes from its tables what the scope covers. The orchestrator knows no table. Adding a
table that holds personal data: its owner's eraser, and its line in ``ERASERS`` (or, for a
test or another composition, ``ERASERS.with_eraser``).

Derived stores (vectors, cache, summaries, context views) are not erasers: they are told by
the tombstone the ledger publishes, and acknowledge it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from projections import rebuilds, rejections
from projections.access import audit as read_audit
from projections.access import pauses
from projections.admission import flags as evidence_flags
from projections.conversation import store as conversation_store
from projections.deadletters import keys as letter_keys
from projections.deletion.erasure import ErasureScope
from projections.deletion.ledger import LedgerEntry
from projections.memory import current as memory_current
from projections.memory import store as memory_store
from projections.sealing import keys as entity_keys
from projections.sql import Conn

Eraser = Callable[[Conn, ErasureScope], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Erasers:
    """The erasers, by name, in the order an erasure runs them."""

    erasers: tuple[tuple[str, Eraser], ...]

    def __post_init__(self) -> None:
        names = self.names
        shared = sorted({name for name in names if names.count(name) > 1})
        if shared:
            raise ValueError(f"erasers share a name: {', '.join(shared)}")

    def __iter__(self) -> Iterator[tuple[str, Eraser]]:
        return iter(self.erasers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.erasers)

    def with_eraser(self, name: str, eraser: Eraser) -> Erasers:
        """These erasers and ``eraser``, last."""
        return Erasers((*self.erasers, (name, eraser)))


ERASERS = Erasers(
    (
        ("evidence flags", evidence_flags.erase),
        ("memories", memory_store.erase),
        ("conversations", conversation_store.erase),
        ("data keys", entity_keys.erase),
        ("rejections", rejections.erase_rejections),
        ("rebuild copies", rebuilds.erase),
        ("dead letters", letter_keys.erase),
        ("read audit", read_audit.erase_reads),
        ("pause reasons", pauses.erase),
        ("outbox", memory_current.erase_pending),
    )
)


def scope_of(entry: LedgerEntry) -> ErasureScope:
    return ErasureScope(
        tenant_id=entry.tenant_id,
        deletion_id=entry.deletion_id,
        subject=entry.target.subject(),
        memories=entry.resolved.memories,
        conversations=entry.resolved.conversations,
        cut_off=entry.cut_off,
        sources=() if entry.scope == "content" else entry.resolved.conversations,
    )


async def erase(conn: Conn, entry: LedgerEntry, erasers: Erasers = ERASERS) -> None:
    """Remove the entry's items from every table that holds them, in the caller's
    transaction."""
    scope = scope_of(entry)
    for _, eraser in erasers:
        await eraser(conn, scope)
