"""The records of conversation.messages: personal fields sealed with the conversation's data
key, identity readable, an edited record unreadable, plaintext records of before still read.
No services."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from projections.conversation.published import encode_record, parse_record
from projections.conversation.reducer import MessageRecord
from projections.sealing.crypto import Unreadable, new_data_key
from projections.sealing.fields import Shredded

SECRET = "the user's door code is 4711"
MESSAGE = MessageRecord(
    tenant_id="acme:x",
    conversation_id="c:1",
    message_id="m",
    seq=3,
    role="user",
    content=({"type": "text", "text": SECRET},),
    occurred_at=datetime(2026, 8, 8, 9, 30, 0, 250000, tzinfo=UTC),
    event_id="evt-1",
    redactions={"password": 1},
    owner_type="user",
    owner_id="alice",
)


def test_a_record_keeps_its_identity_readable_and_its_personal_fields_sealed() -> None:
    key = new_data_key()
    value = encode_record(MESSAGE, key)

    assert SECRET.encode() not in value and b"password" not in value
    raw = orjson.loads(value)
    assert raw["sealed"]["entity"] == "conversation:c:1"
    assert "content" not in raw and "redactions" not in raw
    published = parse_record(value)
    assert published.content is None
    assert published.entity == ("acme:x", "conversation", "c:1")
    assert (published.tenant_id, published.conversation_id, published.message_id) == (
        "acme:x",
        "c:1",
        "m",
    )
    assert published.owner == ("user", "alice")
    assert published.occurred_at == MESSAGE.occurred_at

    opened = published.opened(key)
    assert opened.content == MESSAGE.content and opened.sealed is None


def test_without_its_key_a_record_is_shredded() -> None:
    published = parse_record(encode_record(MESSAGE, new_data_key()))
    with pytest.raises(Shredded):
        published.opened(None)
    with pytest.raises(Unreadable):
        published.opened(new_data_key())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant_id", "acme"),
        ("conversation_id", "c"),
        ("message_id", "1:m"),
        ("owner_id", "bob"),
        ("occurred_at", "2026-08-08T09:30:00+00:00"),
        ("event_id", "evt-2"),
        ("role", "assistant"),
        ("seq", 4),
    ],
)
def test_a_record_edited_outside_the_seal_does_not_open(field: str, value: object) -> None:
    key = new_data_key()
    raw = orjson.loads(encode_record(MESSAGE, key))
    raw[field] = value
    with pytest.raises(Unreadable):
        parse_record(orjson.dumps(raw)).opened(key)


def test_a_sealed_record_with_plaintext_beside_the_seal_does_not_open() -> None:
    key = new_data_key()
    raw = orjson.loads(encode_record(MESSAGE, key))
    raw["content"] = [{"type": "text", "text": "forged"}]
    with pytest.raises(Unreadable):
        parse_record(orjson.dumps(raw)).opened(key)


def test_a_plaintext_record_of_before_the_seal_still_reads() -> None:
    legacy = orjson.dumps(
        {
            "tenant_id": "acme",
            "conversation_id": "c1",
            "message_id": "m1",
            "seq": 1,
            "role": "user",
            "content": [{"type": "text", "text": "hello"}],
            "occurred_at": "2026-08-08T09:30:00+00:00",
            "event_id": "evt-1",
            "redactions": {},
            "owner_type": "user",
            "owner_id": "alice",
        }
    )
    published = parse_record(legacy)
    assert published.sealed is None
    assert published.opened(None).content == ({"type": "text", "text": "hello"},)


@pytest.mark.parametrize(
    "change",
    [
        {"tenant_id": 5},
        {"content": "abc"},
        {"content": [1]},
        {"occurred_at": "2026-08-08T09:30:00"},
        {"sealed": "not an object"},
        {"sealed": {"entity": "conversation:c1", "fields": 5}},
    ],
)
def test_records_that_are_not_of_this_topic_are_refused(change: dict[str, object]) -> None:
    raw = {**orjson.loads(encode_record(MESSAGE, new_data_key())), **change}
    if "content" in change:
        del raw["sealed"]
    with pytest.raises((ValueError, KeyError, TypeError)):
        parse_record(orjson.dumps(raw))
