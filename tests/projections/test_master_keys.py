"""Several master keys, pure: the newest wraps, each unwraps what it wrapped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from projections.deadletters.sealing import LetterSealer, Position
from projections.sealing.crypto import (
    DEFAULT_MASTER_KEY_ID,
    MasterKeys,
    UnknownMasterKey,
    Unreadable,
    new_data_key,
)
from projections.sealing.keys import WRAP_FORMAT, KeyStore
from projections.sealing.probes import ProbeSealer
from projections.sql import KeyLookups

A, B = b"a" * 32, b"b" * 32
OLD = MasterKeys((("ka", A),))
BOTH = MasterKeys((("kb", B), ("ka", A)))
NEW = MasterKeys((("kb", B),))
REF = ("acme", "memory", "m1")
AT = Position("memory.events", 0, 7)
VECTOR = [0.25, -1.5, 3.0]


def test_the_newest_key_wraps_and_every_configured_key_unwraps() -> None:
    data_key = new_data_key()
    under_a = KeyStore(OLD, KeyLookups()).wrap(REF, data_key)
    rotating = KeyStore(BOTH, KeyLookups())
    assert rotating.key_id == "kb"
    assert rotating.unwrap(REF, under_a, WRAP_FORMAT, "ka") == data_key
    under_b = rotating.wrap(REF, data_key)
    assert KeyStore(NEW, KeyLookups()).unwrap(REF, under_b, WRAP_FORMAT, "kb") == data_key
    with pytest.raises(UnknownMasterKey, match="'ka', which is not configured"):
        KeyStore(NEW, KeyLookups()).unwrap(REF, under_a, WRAP_FORMAT, "ka")
    with pytest.raises(Unreadable):  # the id is a hint: the wrong key under it does not open
        KeyStore(MasterKeys((("ka", B),)), KeyLookups()).unwrap(REF, under_a, WRAP_FORMAT, "ka")


def test_a_format_1_key_opens_under_its_master_key_id() -> None:
    data_key = new_data_key()
    legacy = KeyStore(A, KeyLookups()).wrap(REF, data_key, 1)
    assert (
        KeyStore(MasterKeys((("kb", B), (DEFAULT_MASTER_KEY_ID, A))), KeyLookups()).unwrap(
            REF, legacy, 1
        )
        == data_key
    )


def test_bytes_are_the_single_default_key() -> None:
    assert KeyStore(A, KeyLookups()).master_keys == MasterKeys.single(A)
    assert repr(BOTH) == "MasterKeys(ids=['kb', 'ka'])" and str(A) not in repr(BOTH)


def test_dead_letter_keys_carry_the_id_of_their_master_key() -> None:
    sealed, row = LetterSealer(OLD).seal(AT, b"acme:m1", b"value", "detail", datetime.now(UTC))
    assert row.master_key_id == "ka"
    rotating = LetterSealer(BOTH)
    assert rotating.open(sealed, row.wrapped_key, AT, "ka").value == b"value"
    data_key = rotating.unwrap(row.key_id, row.wrapped_key, "ka")
    moved = rotating.wrap(row.key_id, data_key)
    assert LetterSealer(NEW).open(sealed, moved, AT, "kb").value == b"value"
    with pytest.raises(UnknownMasterKey):
        LetterSealer(NEW).open(sealed, row.wrapped_key, AT, "ka")


def test_probes_open_under_any_configured_key_and_reseal_under_the_newest() -> None:
    where = ("acme", "d1", "memory", "m1")
    under_a = ProbeSealer(OLD).seal(*where, VECTOR)
    rotating = ProbeSealer(BOTH)
    assert rotating.open(*where, under_a) == VECTOR
    resealed = rotating.reseal(*where, under_a)
    assert resealed is not None and rotating.reseal(*where, resealed) is None
    assert ProbeSealer(NEW).open(*where, resealed) == VECTOR
    with pytest.raises(Unreadable):
        ProbeSealer(NEW).open(*where, under_a)
