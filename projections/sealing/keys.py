"""The data keys in PostgreSQL, wrapped by the master key from configuration.

``entity_keys.wrap_format`` says how a key is wrapped:

- 1 (keys created before migration 008): AES-GCM under the master key itself, associated data
  ``"<tenant>:<type>:<id>"``, which is ambiguous when ids hold ``:`` (tenant ``a:memory:b`` /
  memory ``c`` and tenant ``a`` / memory ``b:memory:c`` are one string). Still opened.
- 2 (every key created since): AES-GCM under a key derived from the master key for this
  purpose only, associated data the JSON array ``["entity_key", 2, tenant, type, id]``.

A master-key rotation (issue 16) adds a key id per row and a format whose associated data
names it; it re-wraps format-1 keys on the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from projections.bookkeeping import Conn, keyset, keyset_param
from projections.sealing.crypto import (
    derive_key,
    encode_associated,
    new_data_key,
    unwrap_key,
    wrap_key,
)
from projections.sealing.fields import EntityRef, entity_name

WRAP_FORMAT = 2
_WRAPPING_PURPOSE = b"memproj/entity-key-wrapping/v2"


def wrap_associated(ref: EntityRef, wrap_format: int) -> bytes:
    if wrap_format == 1:
        return entity_name(ref).encode()
    if wrap_format == 2:
        return encode_associated("entity_key", 2, *ref)
    raise ValueError(f"unknown key wrap format {wrap_format}")


class KeyStore:
    def __init__(self, master_key: bytes) -> None:
        self._wrapping = {1: master_key, 2: derive_key(master_key, _WRAPPING_PURPOSE)}

    def wrap(self, ref: EntityRef, data_key: bytes, wrap_format: int = WRAP_FORMAT) -> bytes:
        return wrap_key(self._wrapping[wrap_format], data_key, wrap_associated(ref, wrap_format))

    def unwrap(self, ref: EntityRef, wrapped: bytes, wrap_format: int) -> bytes:
        if wrap_format not in self._wrapping:
            raise ValueError(f"unknown key wrap format {wrap_format} of {entity_name(ref)}")
        return unwrap_key(self._wrapping[wrap_format], wrapped, wrap_associated(ref, wrap_format))

    async def keys(
        self, conn: Conn, refs: Iterable[EntityRef], *, create: bool = False
    ) -> dict[EntityRef, bytes]:
        """The data keys of ``refs``; with ``create``, a new key for each that has none (a
        shredded entity gets a new key only for data that is new after its deletion)."""
        wanted = sorted(set(refs))
        found = await self._stored(conn, wanted)
        missing = [ref for ref in wanted if ref not in found]
        if create and missing:
            fresh = {ref: new_data_key() for ref in missing}
            cursor = await conn.execute(
                "INSERT INTO entity_keys"
                " (tenant_id, entity_type, entity_id, wrapped_key, wrap_format)"
                " SELECT tenant_id, entity_type, entity_id, decode(wrapped_key, 'hex'),"
                " %s::smallint"
                f" FROM {keyset('tenant_id', 'entity_type', 'entity_id', 'wrapped_key')}"
                " ON CONFLICT DO NOTHING RETURNING tenant_id, entity_type, entity_id",
                (
                    WRAP_FORMAT,
                    keyset_param((*ref, self.wrap(ref, key).hex()) for ref, key in fresh.items()),
                ),
            )
            for tenant, entity_type, entity_id in await cursor.fetchall():
                ref = (tenant, entity_type, entity_id)
                found[ref] = fresh[ref]
            # Another worker created the rest between the read and the insert.
            found.update(await self._stored(conn, [ref for ref in missing if ref not in found]))
        return found

    async def _stored(self, conn: Conn, refs: Sequence[EntityRef]) -> dict[EntityRef, bytes]:
        if not refs:
            return {}
        cursor = await conn.execute(
            "SELECT tenant_id, entity_type, entity_id, wrapped_key, wrap_format FROM entity_keys"
            f" JOIN {keyset('tenant_id', 'entity_type', 'entity_id')}"
            " USING (tenant_id, entity_type, entity_id)",
            (keyset_param(refs),),
        )
        found = {}
        for tenant, entity_type, entity_id, wrapped, wrap_format in await cursor.fetchall():
            ref = (tenant, entity_type, entity_id)
            found[ref] = self.unwrap(ref, bytes(wrapped), wrap_format)
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
