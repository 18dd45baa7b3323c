"""The verification probe's vectors of an erasure (``deletion_probes``), sealed: the text of
every erased memory and message, embedded before it is erased, so that the probe can later
search the vector store for it."""

from __future__ import annotations

from collections.abc import Sequence

from projections.bookkeeping import Conn, copy_rows
from projections.deletion.ledger import LedgerEntry
from projections.sealing.probes import ProbeSealer


async def record_probes(
    conn: Conn,
    entry: LedgerEntry,
    vectors: Sequence[tuple[str, str, Sequence[float]]],
    probes: ProbeSealer,
) -> None:
    """The probe vectors, sealed (``ProbeSealer``): nothing stored lets anyone without the
    master key test a guess of the erased words against them."""
    tenant, deletion = entry.tenant_id, entry.deletion_id
    await copy_rows(
        conn,
        "deletion_probes",
        ("tenant_id", "deletion_id", "item_type", "item_id", "sealed_vector"),
        ((tenant, deletion, t, i, probes.seal(tenant, deletion, t, i, v)) for t, i, v in vectors),
    )


async def load_probes(
    conn: Conn, tenant_id: str, deletion_id: str, probes: ProbeSealer
) -> list[tuple[str, str, list[float]]]:
    """The probe vectors, opened. A plaintext ``vector`` is one written before migration 008
    (or by a worker of the release before it): read as it is, deleted like the others."""
    cursor = await conn.execute(
        "SELECT item_type, item_id, sealed_vector, vector FROM deletion_probes"
        " WHERE tenant_id = %s AND deletion_id = %s",
        (tenant_id, deletion_id),
    )
    return [
        (
            item_type,
            item_id,
            list(vector)
            if sealed is None
            else probes.open(tenant_id, deletion_id, item_type, item_id, bytes(sealed)),
        )
        for item_type, item_id, sealed, vector in await cursor.fetchall()
    ]
