"""Dead letters without services: owner extraction from hostile input, the seal, the letter's
bound, and which state a letter is read in."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections.deadletters.keys import StoredKey, key_state
from projections.deadletters.owner import LetterOwner, owner_of
from projections.deadletters.sealing import (
    DEAD_LETTER_RETENTION,
    DeadLetterMessage,
    LetterSealer,
    Position,
    letter_keys,
)
from projections.deletion.erasure import conversation_key, memory_key, subject_key
from projections.sealing.crypto import Unreadable
from streams.isolation import Failure
from streams.sample import EventFactory, to_message
from support.deadletters import TEST_MASTER_KEY, MemoryLetterKeys, memory_dead_letters
from topics.codec import InvalidMessage, encode
from topics.messages import InputMessage
from topics.outputs import (
    KEY_MAX_CHARS,
    ORIGINAL_MAX_BYTES,
    DeadLetter,
    DeadLetterReason,
)
from topics.registry import DEAD_LETTER_RETENTION_MS, MESSAGE_MAX_BYTES

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
AT = Position("memory.events", 2, 41)


# -- owner extraction -------------------------------------------------------------------------


def test_the_owner_of_a_valid_memory_event_is_its_tenant_subject_memory_and_source() -> None:
    event = EventFactory().proposed("acme", "m1", source=("message", "conv_7/msg_1"))
    key, value = to_message(event)
    owner = owner_of(key, value)
    assert owner.tenant_id == "acme" and owner.memory_id == "m1"
    assert (owner.subject_type, owner.subject_id) == (
        event["payload"]["subject"]["type"],
        event["payload"]["subject"]["id"],
    )
    assert owner.conversation_id == "conv_7"
    assert owner.message_key == "acme:m1"
    assert owner.occurred_at is not None


def test_a_malformed_copy_that_still_names_its_subject_is_owned_by_it() -> None:
    event = EventFactory().proposed("acme", "m1")
    event["payload"]["value"] = "not an object"
    event["payload"]["observed_at"] = 17
    owner = owner_of(b"acme:m1", orjson.dumps(event))
    assert owner.subject_id == event["payload"]["subject"]["id"]


def test_a_conversation_start_is_owned_by_its_owner_and_a_published_message_by_its_fields() -> None:
    started = {
        "tenant_id": "acme",
        "payload": {"conversation_id": "c1", "owner": {"type": "user", "id": "u1"}},
    }
    assert owner_of(b"acme:c1", orjson.dumps(started)) == LetterOwner(
        "acme", "user", "u1", None, "c1", "acme:c1"
    )
    published = {
        "tenant_id": "acme",
        "conversation_id": "c1",
        "owner_type": "user",
        "owner_id": "u",
    }
    owner = owner_of(b"acme:c1", orjson.dumps(published))
    assert (owner.subject_type, owner.subject_id, owner.conversation_id) == ("user", "u", "c1")


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b"\xff\xfe",
        b"[" * 5000 + b"]" * 5000,
        orjson.dumps({"tenant_id": 7, "payload": "x"}),
        orjson.dumps({"tenant_id": ["acme"], "payload": {"subject": "u1", "memory_id": {}}}),
        orjson.dumps({"tenant_id": "", "payload": {"subject": {"type": 1, "id": None}}}),
        orjson.dumps({"tenant_id": "t" * 129, "payload": {"memory_id": "m" * 129}}),
        orjson.dumps({"payload": {"source": {"type": "message", "ref": 5}}}),
        orjson.dumps({"occurred_at": "yesterday", "payload": {"owner": ["user", "u1"]}}),
        orjson.dumps({"occurred_at": "2026-01-01T00:00:00"}),  # no zone: not a time
    ],
)
def test_hostile_values_name_no_owner(value: bytes) -> None:
    assert owner_of(None, value) == LetterOwner()


@pytest.mark.parametrize(
    "key",
    [None, b"", b"no-colon", b"\xff:\xfe", b"acme:" + b"x" * 5000, b"a\x00:b", b"x" * 1_000_000],
)
def test_hostile_keys_name_no_owner(key: bytes | None) -> None:
    assert owner_of(key, None) == LetterOwner()


def test_a_key_alone_names_its_tenant_only_when_unambiguous_and_every_split_for_erasure() -> None:
    owner = owner_of(b"acme:x:m1", b"{broken")
    # Two colons: the tenant is "acme" or "acme:x", so none is guessed.
    assert owner.tenant_id is None and owner.message_key == "acme:x:m1"
    assert owner_of(b"acme:m1", b"{broken").tenant_id == "acme"
    keys = owner.erasure_keys()
    # Either split of the key: tenant "acme" with "x:m1", or tenant "acme:x" with "m1".
    assert memory_key("acme", "x:m1") in keys and memory_key("acme:x", "m1") in keys
    assert conversation_key("acme:x", "m1") in keys


def test_an_output_keys_escaped_tenant_id_is_one_more_reading_for_erasure() -> None:
    # A dead letter of memory.current (contract 1.2): tenant "acme:x", memory "m1".
    owner = owner_of(b"acme%3Ax:m1", b"{broken")
    assert owner.tenant_id is None  # as an input key, the tenant would be "acme%3Ax"
    keys = owner.erasure_keys()
    assert memory_key("acme:x", "m1") in keys and memory_key("acme%3Ax", "m1") in keys


def test_a_subject_without_its_type_or_id_is_no_subject() -> None:
    value = orjson.dumps({"tenant_id": "acme", "payload": {"subject": {"id": "u1"}}})
    owner = owner_of(None, value)
    assert (owner.subject_type, owner.subject_id) == (None, None)
    assert subject_key("acme", "user", "u1") not in owner.erasure_keys()


@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=300)))
def test_any_input_has_an_owner_of_identifiers_or_none(value: bytes, key: bytes | None) -> None:
    owner = owner_of(key, value)
    for part in (owner.tenant_id, owner.subject_id, owner.memory_id, owner.conversation_id):
        assert part is None or 0 < len(part) <= 128


JSON = st.recursive(
    st.none() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
)


@given(JSON)
def test_any_json_has_an_owner_of_identifiers_or_none(document: object) -> None:
    # The standard library writes integers of any size, which orjson refuses to read.
    value = json.dumps({"tenant_id": "t", "payload": document}).encode()
    owner = owner_of(b"t:e", value)
    assert owner.tenant_id == "t"


# -- the seal ---------------------------------------------------------------------------------


def test_a_sealed_letter_opens_with_its_key_and_at_its_position_only() -> None:
    sealer = LetterSealer(TEST_MASTER_KEY)
    sealed, row = sealer.seal(AT, b"acme:m1", b'{"secret": "marker"}', "detail", NOW)
    assert b"marker" not in base64.b64decode(sealed.ciphertext)
    opened = sealer.open(sealed, row.wrapped_key, AT)
    assert (opened.value, opened.key, opened.detail) == (
        b'{"secret": "marker"}',
        b"acme:m1",
        "detail",
    )
    assert row.expires_at == NOW + DEAD_LETTER_RETENTION
    assert timedelta(milliseconds=DEAD_LETTER_RETENTION_MS) == DEAD_LETTER_RETENTION
    with pytest.raises(Unreadable):
        sealer.open(sealed, row.wrapped_key, replace(AT, offset=42))
    other_sealed, other_row = sealer.seal(AT, None, b"x", "", NOW)
    with pytest.raises(Unreadable):
        sealer.open(sealed, other_row.wrapped_key, AT)  # another letter's key
    with pytest.raises(Unreadable):
        LetterSealer(b"k" * 32).open(sealed, row.wrapped_key, AT)  # another master key
    opened_other = sealer.open(other_sealed, other_row.wrapped_key, AT)
    assert (opened_other.key, opened_other.value) == (None, b"x")


def _message(value: bytes | None, key: bytes | None = b"acme:m1") -> InputMessage:
    return InputMessage("memory.events", 0, 5, key, value, ())


def test_a_dead_letter_holds_no_plaintext_and_its_error_quotes_nothing() -> None:
    keys = MemoryLetterKeys()
    letters = memory_dead_letters(keys)
    value = b'{"event_type": "marker-in-the-type"}'
    invalid = InvalidMessage(DeadLetterReason.UNKNOWN_EVENT_TYPE, "event_type 'marker-in-the-type'")
    message = letters.invalid(_message(value, b"acme:marker-key"), invalid)
    assert isinstance(message, DeadLetterMessage)
    assert message.value is not None and b"marker-in-the" not in message.value
    letter = DeadLetter.model_validate_json(message.value)
    assert letter.original == "" and base64.b64decode(letter.original) == b""
    assert letter.error == "unknown_event_type (detail sealed)"
    assert letter.sealed_original is not None
    opened = LetterSealer(TEST_MASTER_KEY).open(
        letter.sealed_original, message.letter_key.wrapped_key, Position("memory.events", 0, 5)
    )
    assert opened.value == value and opened.detail == invalid.detail
    assert letter_keys([message]) == [message.letter_key]

    failure = Failure(DeadLetterReason.UNSTORABLE, "write", "UniqueViolation", "Key (v)=(marker)")
    failed = DeadLetter.model_validate_json(letters.failed(_message(b"{}"), failure).value or b"")
    assert failed.error == "write: UniqueViolation (detail sealed)"


def test_a_dead_letter_keeps_at_most_its_bound_of_the_original_and_always_fits() -> None:
    letters = memory_dead_letters()
    big_value, big_key = b"x" * (ORIGINAL_MAX_BYTES + 10), b"k:" + b"y" * 300_000
    message = letters.invalid(
        _message(big_value, big_key), InvalidMessage(DeadLetterReason.VALUE_TOO_LARGE, "big")
    )
    assert isinstance(message, DeadLetterMessage) and message.value is not None
    assert len(message.value) + len(message.key or b"") < MESSAGE_MAX_BYTES - 16 * 1024
    letter = DeadLetter.model_validate_json(message.value)
    assert (letter.original_truncated, letter.original_size) == (True, len(big_value))
    assert letter.sealed_original is not None
    opened = LetterSealer(TEST_MASTER_KEY).open(
        letter.sealed_original, message.letter_key.wrapped_key, Position("memory.events", 0, 5)
    )
    assert opened.value == big_value[:ORIGINAL_MAX_BYTES]
    assert opened.key == big_key[:KEY_MAX_CHARS] and message.key == big_key[:KEY_MAX_CHARS]


def test_a_letter_written_before_sealing_still_reads_under_the_contract() -> None:
    old = {
        "original": base64.b64encode(b"{}").decode(),
        "topic": "memory.events",
        "partition": 0,
        "offset": 1,
        "error": "e",
        "error_code": "invalid_event",
        "key": "acme:m1",
        "failed_at": NOW.isoformat(),
    }
    letter = DeadLetter.model_validate_json(orjson.dumps(old))
    assert letter.sealed_original is None
    assert orjson.loads(encode(letter))["original"] == old["original"]


# -- the state a letter is read in -----------------------------------------------------------


def test_a_letter_opens_while_its_key_lives_and_says_why_not_otherwise() -> None:
    expires = NOW + DEAD_LETTER_RETENTION
    assert key_state(StoredKey(b"k", None, expires), NOW, NOW) == "open"
    assert key_state(StoredKey(b"k", None, expires), NOW, expires) == "expired"
    assert key_state(StoredKey(None, "d1", expires), NOW, NOW) == "erased"
    assert key_state(None, NOW, expires) == "expired"  # its row is gone with its window
    assert key_state(None, NOW, NOW + timedelta(days=1)) == "missing"


def test_key_ids_are_fresh_per_letter() -> None:
    sealer = LetterSealer(TEST_MASTER_KEY)
    ids = {sealer.seal(AT, None, b"x", "", NOW)[1].key_id for _ in range(50)}
    assert len(ids) == 50 and all(uuid.UUID(i) for i in ids)
