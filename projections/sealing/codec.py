"""Decoding the sealed log: open the personal fields with the entity's data key, then decode
under the contract as usual."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from projections.sealing.crypto import Unreadable
from projections.sealing.fields import (
    EntityRef,
    Shredded,
    sealing_keys,
    unseal,
    with_placeholders,
)
from projections.sealing.keys import KeyStore
from projections.sql import Conn
from topics.codec import EventCodec, InvalidMessage, check_faithful
from topics.envelope import Envelope
from topics.outputs import DeadLetterReason


class SealedCodec:
    def __init__(self, inner: EventCodec, keys: KeyStore) -> None:
        self._inner = inner
        self._keystore = keys
        self._keys: dict[EntityRef, bytes] = {}
        # The batch's values as parsed to find their keys, so that decoding parses none again.
        self._parsed: dict[bytes, Any] = {}
        self._rekeyed: set[EntityRef] = set()

    async def load_keys(self, conn: Conn, values: Iterable[bytes | None]) -> None:
        """The data keys of a batch, read in the batch's transaction: a key destroyed by a
        deletion that committed before is gone for this batch too."""
        refs: list[EntityRef] = []
        self._parsed = {}
        for value in values:
            if not value:
                continue
            try:
                raw = self._parsed[value] = orjson.loads(value)
                if isinstance(raw, dict) and "payload" in raw:
                    refs.extend(sealing_keys(raw))
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue  # decoding says what is wrong with it, as a dead letter
        self._keys = await self._keystore.keys(conn, refs)
        # Entities that have a key again after an erasure destroyed their first: what was
        # sealed under the destroyed key is shredded, though the new key does not open it.
        self._rekeyed = await self._keystore.rekeyed(conn, [r for r in refs if r in self._keys])

    def decode(self, key: bytes | None, value: bytes | None, topic: str | None = None) -> Envelope:
        """``topic`` is not needed: a projection reads one sealed topic, and its codec accepts
        that topic's event types only."""
        if value is None:
            return self._inner.decode(key, value)
        check_faithful(value)  # before anything below writes it again
        raw: Any = self._parsed.get(value)
        if raw is None:
            try:
                raw = orjson.loads(value)
            except orjson.JSONDecodeError:
                return self._inner.decode(key, value)  # says why, as a dead letter
        if not (isinstance(raw, dict) and isinstance(raw.get("payload"), dict)):
            return self._inner.decode(key, value)
        try:
            return self._inner.decode(key, orjson.dumps(unseal(raw, self._keys.get)))
        except Shredded:
            return self._shredded(key, raw)
        except Unreadable as exc:
            if self._rekeyed and not self._rekeyed.isdisjoint(_sealing_keys(raw)):
                return self._shredded(key, raw)
            raise InvalidMessage(DeadLetterReason.UNREADABLE_SEAL, str(exc)) from exc
        except (KeyError, TypeError) as exc:
            raise InvalidMessage(DeadLetterReason.UNREADABLE_SEAL, str(exc)) from exc

    def _shredded(self, key: bytes | None, raw: dict[str, Any]) -> Envelope:
        """A deletion destroyed the key: the event keeps its identity (for the erasure guard
        and idempotency) and is marked so that nothing ever applies it."""
        return self._inner.decode(key, orjson.dumps(with_placeholders(raw))).unreadable_copy()


def _sealing_keys(raw: dict[str, Any]) -> tuple[EntityRef, ...]:
    try:
        return sealing_keys(raw)
    except (KeyError, TypeError, AttributeError):
        return ()
