"""Sealing deletion probes: the vectors of erased text that the verification searches the
vector store with. Pure.

A hashing embedder's vector is an unkeyed function of the words: anyone who reads it can embed
a guess and compare. A probe is therefore stored sealed, AES-GCM under a key derived from the
master key for this purpose only, bound to its tenant, deletion and item (a sealed probe moved
to another row does not open). Only a holder of the master key (the deletion worker) can open
it, to search with it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from projections.sealing.crypto import (
    Unreadable,
    derive_key,
    encode_associated,
    open_bytes,
    seal_bytes,
)

_PURPOSE = b"memproj/deletion-probes/v1"
_FLOAT = struct.Struct("<f")


class ProbeSealer:
    def __init__(self, master_key: bytes) -> None:
        self._key = derive_key(master_key, _PURPOSE)

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
        plain = open_bytes(
            self._key, sealed, _associated(tenant_id, deletion_id, item_type, item_id)
        )
        if len(plain) % _FLOAT.size:
            raise Unreadable("a sealed probe is not a float32 vector")
        return list(struct.unpack(f"<{len(plain) // _FLOAT.size}f", plain))


def _associated(tenant_id: str, deletion_id: str, item_type: str, item_id: str) -> bytes:
    return encode_associated("deletion_probe", 1, tenant_id, deletion_id, item_type, item_id)
