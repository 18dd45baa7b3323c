"""Message keys and the headers that name a keyed message's entity, with no services."""

from __future__ import annotations

from topics.messages import header_pairs
from topics.registry import (
    ALL_TOPICS,
    COMPACTION_SEGMENT_MS,
    MEMORY_CURRENT,
    entity_headers,
    entity_key,
    entity_of_message,
)


def test_headers_name_the_entity_when_the_tenant_id_holds_a_colon() -> None:
    key = entity_key("org:acme", "m1").encode()
    headers = header_pairs(
        [(name, value.encode()) for name, value in entity_headers("org:acme", "m1")]
    )

    assert entity_of_message(key, headers) == ("org:acme", "m1")
    # The key alone is ambiguous: it reads the same as tenant "org", memory "acme:m1".
    assert key == entity_key("org", "acme:m1").encode()


def test_a_message_without_headers_is_split_at_the_keys_first_colon() -> None:
    assert entity_of_message(b"acme:m_tea", None) == ("acme", "m_tea")
    assert entity_of_message(b"acme:m_tea", [("trace", b"x")]) == ("acme", "m_tea")


def test_header_pairs_accepts_what_kafka_clients_return() -> None:
    assert header_pairs(None) == []
    assert header_pairs({"tenant_id": b"t"}) == [("tenant_id", b"t")]
    assert header_pairs([("tenant_id", "t"), ("empty", None)]) == [
        ("tenant_id", b"t"),
        ("empty", b""),
    ]


def test_memory_current_carries_its_compaction_bound_and_other_topics_none() -> None:
    config = MEMORY_CURRENT.config()
    assert config["cleanup.policy"] == "compact"
    assert config["segment.ms"] == str(COMPACTION_SEGMENT_MS)
    assert int(config["max.compaction.lag.ms"]) <= COMPACTION_SEGMENT_MS  # due once rolled
    assert config["min.compaction.lag.ms"] == "0"
    assert [spec.base_name for spec in ALL_TOPICS if spec.lifetime] == ["memory.current"]
