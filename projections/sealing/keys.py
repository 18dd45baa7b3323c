"""The data keys in PostgreSQL, wrapped by the master key from configuration.

``entity_keys.wrap_format`` says how a key is wrapped:

- 1 (keys created before migration 008): AES-GCM under the master key itself, associated data
  ``"<tenant>:<type>:<id>"``, which is ambiguous when ids hold ``:`` (tenant ``a:memory:b`` /
  memory ``c`` and tenant ``a`` / memory ``b:memory:c`` are one string). Still opened.
- 2 (every key created since): AES-GCM under a key derived from the master key for this
  purpose only, associated data the JSON array ``["entity_key", 2, tenant, type, id]``.

``entity_keys.master_key_id`` (migration 011) names the master key that wrapped it (rows
before it: ``default``, the id of ``MEMPROJ_MASTER_KEY``). The newest configured master key
wraps every new key; ``rewrap_batch`` re-wraps the others under it, in the current format, so
that after a rotation the older master keys can be removed. The id is a lookup hint, not
authenticated: a row labelled with another key's id does not open (AES-GCM), and keeping the
format's associated data as it is lets a worker of the previous release read every key wrapped
by the key it knows during an upgrade.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from projections.deletion.erasure import ErasureScope
from projections.distribution import cross_tenant
from projections.sealing.crypto import (
    DEFAULT_MASTER_KEY_ID,
    KeyWrapping,
    MasterKeys,
    as_master_keys,
    encode_associated,
    new_data_key,
)
from projections.sealing.fields import SOURCE_KEY_ENTITY, EntityRef, entity_name
from projections.sealing.rewrap import Rewrapped, rewrap_keys
from projections.sql import ONE_TENANT, Conn, KeyLookups

WRAP_FORMAT = 2
_WRAPPING_PURPOSE = b"memproj/entity-key-wrapping/v2"


def wrap_associated(ref: EntityRef, wrap_format: int) -> bytes:
    if wrap_format == 1:
        return entity_name(ref).encode()
    if wrap_format == 2:
        return encode_associated("entity_key", 2, *ref)
    raise ValueError(f"unknown key wrap format {wrap_format}")


class KeyStore:
    def __init__(self, master_keys: bytes | MasterKeys, lookups: KeyLookups) -> None:
        self.master_keys = as_master_keys(master_keys)
        self.lookups = lookups
        self._formats = {
            1: KeyWrapping(self.master_keys, None),
            2: KeyWrapping(self.master_keys, _WRAPPING_PURPOSE),
        }

    @property
    def key_id(self) -> str:
        """The id of the master key that wraps new keys: the newest."""
        return self.master_keys.newest_id

    def wrap(self, ref: EntityRef, data_key: bytes, wrap_format: int = WRAP_FORMAT) -> bytes:
        """``data_key`` wrapped by the newest master key."""
        return self._formats[wrap_format].wrap(data_key, wrap_associated(ref, wrap_format))

    def unwrap(
        self,
        ref: EntityRef,
        wrapped: bytes,
        wrap_format: int,
        master_key_id: str = DEFAULT_MASTER_KEY_ID,
    ) -> bytes:
        if wrap_format not in (1, 2):
            raise ValueError(f"unknown key wrap format {wrap_format} of {entity_name(ref)}")
        return self._formats[wrap_format].unwrap(
            wrapped, wrap_associated(ref, wrap_format), master_key_id
        )

    async def rekeyed(self, conn: Conn, refs: Iterable[EntityRef]) -> set[EntityRef]:
        """Of ``refs`` (entities that have a key), those whose earlier key an erasure
        destroyed: see ``ever_shredded``."""
        return await ever_shredded(conn, refs, self.lookups)

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
            found.update({ref: fresh[ref] for ref in await self.add(conn, fresh)})
            # Another worker created the rest between the read and the insert.
            found.update(await self._stored(conn, [ref for ref in missing if ref not in found]))
        return found

    async def add(self, conn: Conn, fresh: Mapping[EntityRef, bytes]) -> set[EntityRef]:
        """Store ``fresh`` keys for entities that have none; returns those stored (an entity
        that got a key meanwhile keeps it)."""
        if not fresh:
            return set()
        rows = await self.lookups.fetch(
            conn,
            "INSERT INTO entity_keys"
            " (tenant_id, entity_type, entity_id, wrapped_key, wrap_format, master_key_id)"
            " SELECT tenant_id, entity_type, entity_id, decode(wrapped_key, 'hex'),"
            " %(format)s::smallint, %(key_id)s FROM {keys}"
            " ON CONFLICT DO NOTHING RETURNING tenant_id, entity_type, entity_id",
            ("tenant_id", "entity_type", "entity_id", "wrapped_key"),
            ((*ref, self.wrap(ref, key).hex()) for ref, key in fresh.items()),
            {"format": WRAP_FORMAT, "key_id": self.key_id},
        )
        return {(tenant, kind, entity_id) for tenant, kind, entity_id in rows}

    async def _stored(self, conn: Conn, refs: Sequence[EntityRef]) -> dict[EntityRef, bytes]:
        if not refs:
            return {}
        rows = await self.lookups.fetch(
            conn,
            "SELECT tenant_id, entity_type, entity_id, wrapped_key, wrap_format, master_key_id"
            " FROM entity_keys JOIN {keys} USING (tenant_id, entity_type, entity_id)"
            " WHERE entity_keys.tenant_id = {tenant}",
            ("tenant_id", "entity_type", "entity_id"),
            refs,
        )
        found = {}
        for tenant, entity_type, entity_id, wrapped, wrap_format, key_id in rows:
            ref = (tenant, entity_type, entity_id)
            found[ref] = self.unwrap(ref, bytes(wrapped), wrap_format, key_id)
        return found


# -- rotation -----------------------------------------------------------------------------------


async def rewrap_batch(conn: Conn, store: KeyStore, limit: int) -> Rewrapped:
    """Re-wrap up to ``limit`` data keys not wrapped by the newest master key in the current
    format, in the caller's transaction (``rewrap_keys``: rows held elsewhere are left to a
    later batch, a key shredded meanwhile is not brought back)."""

    def rewrap(row: tuple[Any, ...]) -> tuple[tuple[Any, ...], str]:
        tenant, entity_type, entity_id, wrapped, wrap_format, key_id = row
        ref = (tenant, entity_type, entity_id)
        data_key = store.unwrap(ref, bytes(wrapped), wrap_format, key_id)
        return (store.wrap(ref, data_key), WRAP_FORMAT, store.key_id, *ref), key_id

    return await rewrap_keys(
        conn,
        cross_tenant("key-rotation")
        + "SELECT tenant_id, entity_type, entity_id, wrapped_key, wrap_format, master_key_id"
        " FROM entity_keys WHERE master_key_id <> %s OR wrap_format <> %s"
        " ORDER BY tenant_id, entity_type, entity_id LIMIT %s FOR UPDATE SKIP LOCKED",
        (store.key_id, WRAP_FORMAT, limit),
        rewrap,
        "UPDATE entity_keys SET wrapped_key = %s, wrap_format = %s, master_key_id = %s"
        " WHERE tenant_id = %s AND entity_type = %s AND entity_id = %s",
    )


async def count_not_newest(conn: Conn, store: KeyStore) -> dict[str, int]:
    """Data keys per master key id other than the newest's (or in an older format)."""
    cursor = await conn.execute(
        cross_tenant("key-rotation") + "SELECT master_key_id, count(*) FROM entity_keys"
        " WHERE master_key_id <> %s OR wrap_format <> %s GROUP BY master_key_id",
        (store.key_id, WRAP_FORMAT),
    )
    return {key_id: count for key_id, count in await cursor.fetchall()}


async def shred_refused(
    conn: Conn, entity_type: str, refused: Mapping[tuple[str, str], str]
) -> None:
    """Destroy the keys of entities a projection refused as erased, (tenant, id) -> the
    deletion that covers them."""
    by_deletion: dict[str, list[EntityRef]] = {}
    for (tenant_id, entity_id), deletion_id in refused.items():
        by_deletion.setdefault(deletion_id, []).append((tenant_id, entity_type, entity_id))
    for deletion_id, refs in sorted(by_deletion.items()):  # a deletion is one tenant's
        await shred(conn, refs, deletion_id, ONE_TENANT)


async def shred(
    conn: Conn, refs: Iterable[EntityRef], deletion_id: str, lookups: KeyLookups
) -> int:
    """Destroy the data keys of ``refs``: their sealed fields become unreadable everywhere."""
    wanted = sorted(set(refs))
    if not wanted:
        return 0
    columns = ("tenant_id", "entity_type", "entity_id")
    shredded = await lookups.fetch(
        conn,
        "DELETE FROM entity_keys e USING {keys} WHERE e.tenant_id = {tenant}"
        " AND e.entity_type = k.entity_type AND e.entity_id = k.entity_id RETURNING e.entity_id",
        columns,
        wanted,
    )
    await lookups.fetch(
        conn,
        "INSERT INTO shredded_keys (tenant_id, entity_type, entity_id, deletion_id)"
        " SELECT tenant_id, entity_type, entity_id, %(deletion)s FROM {keys}"
        " ON CONFLICT DO NOTHING RETURNING entity_id",
        columns,
        wanted,
        {"deletion": deletion_id},
    )
    return len(shredded)


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """Crypto-shredding: the sealed log keeps the erased memories' and conversations' events,
    but no key opens them any more. A content erasure leaves the conversations' source keys:
    the values of the memories taken from them are sealed under those (seal format 4)."""
    await shred(
        conn,
        [(scope.tenant_id, "memory", m) for m in scope.memories]
        + [(scope.tenant_id, "conversation", c) for c in scope.conversations]
        + [(scope.tenant_id, SOURCE_KEY_ENTITY, c) for c in scope.sources],
        scope.deletion_id,
        ONE_TENANT,
    )


async def ever_shredded(
    conn: Conn, refs: Iterable[EntityRef], lookups: KeyLookups
) -> set[EntityRef]:
    """Which of ``refs`` had a key destroyed by a deletion. An entity that has data again
    after its erasure has a new key; what was sealed under the destroyed one does not open
    with it, and is shredded, not tampered."""
    wanted = sorted(set(refs))
    if not wanted:
        return set()
    rows = await lookups.fetch(
        conn,
        "SELECT DISTINCT tenant_id, entity_type, entity_id FROM shredded_keys"
        " JOIN {keys} USING (tenant_id, entity_type, entity_id)"
        " WHERE shredded_keys.tenant_id = {tenant}",
        ("tenant_id", "entity_type", "entity_id"),
        wanted,
    )
    return {(row[0], row[1], row[2]) for row in rows}
