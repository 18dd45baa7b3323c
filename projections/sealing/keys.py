"""The data keys in PostgreSQL, wrapped by the master key from configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from projections.bookkeeping import Conn
from projections.sealing.crypto import new_data_key, unwrap_key, wrap_key
from projections.sealing.fields import EntityRef, entity_name


class KeyStore:
    def __init__(self, master_key: bytes) -> None:
        self._master = master_key

    async def keys(
        self, conn: Conn, refs: Iterable[EntityRef], *, create: bool = False
    ) -> dict[EntityRef, bytes]:
        """The data keys of ``refs``; with ``create``, a new key for each that has none (a
        shredded entity gets a new key only for data that is new after its deletion)."""
        wanted = sorted(set(refs))
        if not wanted:
            return {}
        columns = [list(column) for column in zip(*wanted, strict=True)]
        if create:
            await conn.execute(
                "INSERT INTO entity_keys (tenant_id, entity_type, entity_id, wrapped_key)"
                " SELECT t, k, i, w FROM unnest(%s::text[], %s::text[], %s::text[], %s::bytea[])"
                " AS x(t, k, i, w) ON CONFLICT DO NOTHING",
                [
                    *columns,
                    [wrap_key(self._master, new_data_key(), entity_name(r)) for r in wanted],
                ],
            )
        cursor = await conn.execute(
            "SELECT tenant_id, entity_type, entity_id, wrapped_key FROM entity_keys"
            " JOIN unnest(%s::text[], %s::text[], %s::text[]) AS x(tenant_id, entity_type,"
            " entity_id) USING (tenant_id, entity_type, entity_id)",
            columns,
        )
        found = {}
        for tenant, entity_type, entity_id, wrapped in await cursor.fetchall():
            ref = (tenant, entity_type, entity_id)
            found[ref] = unwrap_key(self._master, bytes(wrapped), entity_name(ref))
        return found


async def shred_refused(
    conn: Conn, entity_type: str, refused: Mapping[tuple[str, str], str]
) -> None:
    """Destroy the keys of entities a projection refused as erased, (tenant, id) -> the
    deletion that covers them."""
    by_deletion: dict[str, list[EntityRef]] = {}
    for (tenant_id, entity_id), deletion_id in refused.items():
        by_deletion.setdefault(deletion_id, []).append((tenant_id, entity_type, entity_id))
    for deletion_id, refs in sorted(by_deletion.items()):
        await shred(conn, refs, deletion_id)


async def shred(conn: Conn, refs: Iterable[EntityRef], deletion_id: str) -> int:
    """Destroy the data keys of ``refs``: their sealed fields become unreadable everywhere."""
    wanted = sorted(set(refs))
    if not wanted:
        return 0
    columns = [list(column) for column in zip(*wanted, strict=True)]
    cursor = await conn.execute(
        "DELETE FROM entity_keys USING unnest(%s::text[], %s::text[], %s::text[])"
        " AS x(t, k, i) WHERE tenant_id = x.t AND entity_type = x.k AND entity_id = x.i",
        columns,
    )
    await conn.execute(
        "INSERT INTO shredded_keys (tenant_id, entity_type, entity_id, deletion_id)"
        " SELECT t, k, i, %s FROM unnest(%s::text[], %s::text[], %s::text[]) AS x(t, k, i)"
        " ON CONFLICT DO NOTHING",
        [deletion_id, *columns],
    )
    return cursor.rowcount
