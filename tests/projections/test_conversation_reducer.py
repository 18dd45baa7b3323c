"""The conversation reducer, with no services."""

from __future__ import annotations

from typing import Any

from projections.conversation.reducer import ConversationState, reduce_batch
from streams.sample import EventFactory, to_message
from topics.codec import EventCodec
from topics.conversation import ConversationEvent
from topics.outputs import RejectionReason
from topics.schemas import default_schemas

CODEC = EventCodec(
    default_schemas(),
    frozenset(
        {"conversation.started", "conversation.message_added", "conversation.summary_updated"}
    ),
)


def decode(*raws: dict[str, Any]) -> list[ConversationEvent]:
    return [CODEC.decode(*to_message(raw)) for raw in raws]  # type: ignore[misc]


def test_messages_in_order_and_a_summary_with_its_sources() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.started("t1", "c1", ("user", "alice"), provider_ref="prov-9"),
            f.message("t1", "c1", "m1", "user", "hello"),
            f.message("t1", "c1", "m2", "assistant", [{"type": "text", "text": "hi"}]),
            f.summary("t1", "c1", 1, "greetings exchanged", ["m1", "m2"]),
        ),
        ConversationState({}),
        {},
    )
    assert not result.rejections
    record = result.records[("t1", "c1")]
    assert (record.message_count, record.summary_version) == (2, 1)
    assert record.provider_conversation_ref == "prov-9"
    assert [(m.message_id, m.seq, m.owner_id) for m in result.messages] == [
        ("m1", 1, "alice"),
        ("m2", 2, "alice"),
    ]
    # A v1 string content is upcast to one text block.
    assert result.messages[0].content == ({"type": "text", "text": "hello"},)
    assert result.summaries[0].source_message_ids == ("m1", "m2")


def test_a_summary_citing_an_unknown_message_is_refused_with_a_reason() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.started("t1", "c1"),
            f.message("t1", "c1", "m1", "user", "hello"),
            f.summary("t1", "c1", 1, "made up", ["m1", "m404"]),
        ),
        ConversationState({}),
        {},
    )
    assert result.summaries == []
    rejection = result.rejections[0]
    assert rejection.reason is RejectionReason.UNKNOWN_SOURCE_MESSAGE
    assert "m404" in rejection.details
    assert rejection.subject is not None and rejection.subject.id == "u1"


def test_stored_messages_count_as_known_sources() -> None:
    f = EventFactory()
    first = reduce_batch(
        decode(f.started("t1", "c1"), f.message("t1", "c1", "m1", "user", "hello")),
        ConversationState({}),
        {},
    )
    later = reduce_batch(
        decode(f.summary("t1", "c1", 1, "a summary", ["m1"])),
        ConversationState(first.records, frozenset({("t1", "c1", "m1")})),
        {},
    )
    assert not later.rejections and len(later.summaries) == 1


def test_refusals() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.message("t1", "nope", "m1", "user", "orphan"),
            f.started("t1", "c1"),
            f.started("t1", "c1"),
            f.message("t1", "c1", "m1", "user", "hello"),
            f.message("t1", "c1", "m1", "user", "hello again"),
            f.summary("t1", "c1", 2, "v2", ["m1"]),
            f.summary("t1", "c1", 1, "older", ["m1"]),
        ),
        ConversationState({}),
        {},
    )
    assert [r.reason for r in result.rejections] == [
        RejectionReason.UNKNOWN_CONVERSATION,
        RejectionReason.CONVERSATION_EXISTS,
        RejectionReason.MESSAGE_EXISTS,
        RejectionReason.STALE_SUMMARY,
    ]


def test_credentials_are_masked_in_every_block_and_counted() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.started("t1", "c1"),
            f.message(
                "t1",
                "c1",
                "m1",
                "assistant",
                [
                    {"type": "text", "text": "my password is hunter22"},
                    {
                        "type": "tool_use",
                        "id": "tu1",
                        "name": "http",
                        "input": {"headers": {"Authorization": "Bearer abcdefghijklmnop12345"}},
                    },
                ],
            ),
            f.message(
                "t1",
                "c1",
                "m2",
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": "key sk-abcdefghijklmnopqrstu",
                    }
                ],
            ),
            f.summary("t1", "c1", 1, "card 4111111111111111 was used", ["m1", "m2"]),
        ),
        ConversationState({}),
        {},
    )
    stored = str([m.content for m in result.messages]) + result.summaries[0].text
    for secret in (
        "hunter22",
        "abcdefghijklmnop12345",
        "sk-abcdefghijklmnopqrstu",
        "4111111111111111",
    ):
        assert secret not in stored
    assert result.redactions == {"password": 1, "bearer_token": 1, "api_key": 1, "card_number": 1}
    assert result.messages[0].redactions == {"password": 1, "bearer_token": 1}
