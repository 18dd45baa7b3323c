"""The data keys in PostgreSQL, wrapped by the master key from configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from projections.bookkeeping import Conn, keyset, keyset_param
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
        if create:
            new_keys = [
                (*ref, wrap_key(self._master, new_data_key(), entity_name(ref)).hex())
                for ref in wanted
            ]
            await conn.execute(
                "INSERT INTO entity_keys (tenant_id, entity_type, entity_id, wrapped_key)"
                " SELECT tenant_id, entity_type, entity_id, decode(wrapped_key, 'hex')"
                f" FROM {keyset('tenant_id', 'entity_type', 'entity_id', 'wrapped_key')}"
                " ON CONFLICT DO NOTHING",
                (keyset_param(new_keys),),
            )
        cursor = await conn.execute(
            "SELECT tenant_id, entity_type, entity_id, wrapped_key FROM entity_keys"
            f" JOIN {keyset('tenant_id', 'entity_type', 'entity_id')}"
            " USING (tenant_id, entity_type, entity_id)",
            (keyset_param(wanted),),
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
    refs_relation = keyset("tenant_id", "entity_type", "entity_id")
    keys_param = keyset_param(wanted)
    cursor = await conn.execute(
        f"DELETE FROM entity_keys e USING {refs_relation} WHERE e.tenant_id = k.tenant_id"
        " AND e.entity_type = k.entity_type AND e.entity_id = k.entity_id",
        (keys_param,),
    )
    await conn.execute(
        "INSERT INTO shredded_keys (tenant_id, entity_type, entity_id, deletion_id)"
        f" SELECT tenant_id, entity_type, entity_id, %s FROM {refs_relation}"
        " ON CONFLICT DO NOTHING",
        (deletion_id, keys_param),
    )
    return cursor.rowcount
