"""``memory.current``, the compacted topic of current memory records: its messages, written
once for the memory worker and the deletion ledger.

A memory's record is keyed by its output key (contract 1.2: the tenant id escaped) and names
its ids in the headers; a null says it is gone. Records written before 1.2 are keyed by the
input key, which differs from the output key when the tenant id holds ``:`` or ``%``; such a
record stays under that key until something replaces it there. So an erasure nulls both keys
(no record of an erased memory may outlive the compaction), and since the old key may be
another memory's key (tenant ``a:b``, memory ``m`` was ``a:b:m``, the key of tenant ``a``,
memory ``b:m``), that memory's record is published again after the null.
"""

from __future__ import annotations

from projections.deletion.erasure import ErasureScope
from projections.memory.evolve import MemoryKey
from projections.outbox import OutboxMessage, remove_pending_messages
from projections.sql import Conn
from topics.codec import encode
from topics.outputs import MemoryRecord
from topics.registry import (
    MEMORY_CURRENT,
    entity_headers,
    input_key,
    keys_of,
    output_key,
    split_output_key,
)


def current_message(topic: str, key: MemoryKey, record: MemoryRecord) -> OutboxMessage:
    """The record as the memory's current state: a memory no read path may serve (revoked,
    or its content erased) gets a null value (compaction removes what was there)."""
    value = encode(record) if record.servable else None
    return OutboxMessage(topic, output_key(*key).encode(), value, entity_headers(*key))


def erased_messages(topic: str, key: MemoryKey) -> list[OutboxMessage]:
    """The nulls of an erased memory: under its output key, and under the key a record
    written before 1.2 has (``sharing_old_key`` names whose record to publish again)."""
    return [
        OutboxMessage(topic, text.encode(), None, entity_headers(*key)) for text in keys_of(*key)
    ]


def sharing_old_key(key: MemoryKey) -> MemoryKey | None:
    """The other memory whose output key is this memory's key from before 1.2, if any."""
    old = input_key(*key)
    other = split_output_key(old.encode())
    return other if other != key and output_key(*other) == old else None


async def erase_pending(conn: Conn, scope: ErasureScope) -> None:
    """The erased memories' values still waiting in any outbox are never published: the
    ledger's null is the last record of their keys on memory.current."""
    await remove_pending_messages(conn, MEMORY_CURRENT.base_name, scope.tenant_id, scope.memories)
