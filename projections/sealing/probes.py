"""Sealing deletion probes: the vectors of erased text that the verification searches the
vector store with. Pure.

A hashing embedder's vector is an unkeyed function of the words: anyone who reads it can embed
a guess and compare. A probe is therefore stored sealed, AES-GCM under a key derived from the
master key for this purpose only, bound to its tenant, deletion and item (a sealed probe moved
to another row does not open). Only a holder of the master key (the deletion worker) can open
it, to search with it.

Probes live until their deletion is verified or its deadline passes, so they carry no master-key
id: the newest configured master key seals, and opening tries each configured key, newest
first (a wrong key fails its tag at once). A rotation re-seals them under the newest
(``reseal``), so that the older keys can be removed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from projections.sealing.crypto import (
    MasterKeys,
    Unreadable,
    as_master_keys,
    derive_key,
    encode_associated,
    open_bytes,
    seal_bytes,
)

_PURPOSE = b"memproj/deletion-probes/v1"
_FLOAT = struct.Struct("<f")


class ProbeSealer:
    def __init__(self, master_keys: bytes | MasterKeys) -> None:
        ring = as_master_keys(master_keys)
        # Newest first: the first seals, each opens.
        self._keys = [derive_key(key, _PURPOSE) for _, key in ring]
        self._key = self._keys[0]

    def seal(
        self,
        tenant_id: str,
        deletion_id: str,
        item_type: str,
        item_id: str,
        vector: Sequence[float],
    ) -> bytes:
        """The vector as float32, sealed: the stores keep float32, so nothing is lost."""
        plain = struct.pack(f"<{len(vector)}f", *vector)
        return seal_bytes(self._key, plain, _associated(tenant_id, deletion_id, item_type, item_id))

    def open(
        self, tenant_id: str, deletion_id: str, item_type: str, item_id: str, sealed: bytes
    ) -> list[float]:
        plain = self._open(_associated(tenant_id, deletion_id, item_type, item_id), sealed)[1]
        if len(plain) % _FLOAT.size:
            raise Unreadable("a sealed probe is not a float32 vector")
        return list(struct.unpack(f"<{len(plain) // _FLOAT.size}f", plain))

    def reseal(
        self, tenant_id: str, deletion_id: str, item_type: str, item_id: str, sealed: bytes
    ) -> bytes | None:
        """The probe sealed under the newest key, or None when it already is (``Unreadable``
        when no configured key opens it)."""
        associated = _associated(tenant_id, deletion_id, item_type, item_id)
        position, plain = self._open(associated, sealed)
        return None if position == 0 else seal_bytes(self._key, plain, associated)

    def _open(self, associated: bytes, sealed: bytes) -> tuple[int, bytes]:
        for position, key in enumerate(self._keys):
            try:
                return position, open_bytes(key, sealed, associated)
            except Unreadable:
                continue
        raise Unreadable("cannot open the probe with any configured master key")


def _associated(tenant_id: str, deletion_id: str, item_type: str, item_id: str) -> bytes:
    return encode_associated("deletion_probe", 1, tenant_id, deletion_id, item_type, item_id)
