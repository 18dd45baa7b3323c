"""Message keys (input and output, contract 1.2) and the headers that name a keyed message's
entity, with no services."""

from __future__ import annotations

import pytest

from topics.messages import header_pairs
from topics.registry import (
    ALL_TOPICS,
    COMPACTION_SEGMENT_MS,
    MEMORY_CURRENT,
    TopicReplication,
    entity_headers,
    entity_of_message,
    input_key,
    is_key_of,
    keys_of,
    output_key,
    split_output_key,
)


def test_output_keys_escape_the_tenant_id_so_no_two_tenants_share_one() -> None:
    # The input convention joins them ambiguously: tenant "a" with memory "b:m" and tenant
    # "a:b" with memory "m" are both "a:b:m".
    assert input_key("a", "b:m") == input_key("a:b", "m") == "a:b:m"
    assert output_key("a", "b:m") == "a:b:m"
    assert output_key("a:b", "m") == "a%3Ab:m"
    assert output_key("100%:x", "m") == "100%25%3Ax:m"
    assert output_key("acme", "m1") == input_key("acme", "m1")  # plain ids: unchanged


def test_an_output_key_splits_back_into_its_ids() -> None:
    for tenant, entity in [
        ("a", "b:m"),
        ("a:b", "m"),
        ("%3A", "x"),  # a tenant id that looks escaped itself
        ("%", "%3A:"),
        ("", ""),
        ("t:%25:", "e"),
    ]:
        assert split_output_key(output_key(tenant, entity).encode()) == (tenant, entity)


def test_readers_accept_an_output_key_in_either_form_and_no_other() -> None:
    # Records written before 1.2 keep their input-form keys until their next change.
    assert keys_of("acme", "m1") == ("acme:m1",)
    assert keys_of("a:b", "m") == ("a%3Ab:m", "a:b:m")
    assert is_key_of(b"a%3Ab:m", "a:b", "m") and is_key_of(b"a:b:m", "a:b", "m")
    assert not is_key_of(b"a%3Ab:m", "a", "b:m")
    assert not is_key_of(None, "acme", "m1") and not is_key_of(b"\xff", "acme", "m1")


def test_headers_name_the_entity_whatever_the_key() -> None:
    headers = header_pairs(
        [(name, value.encode()) for name, value in entity_headers("org:acme", "m1")]
    )
    # A record written before 1.2: its key alone reads as tenant "org", memory "acme:m1".
    assert entity_of_message(input_key("org:acme", "m1").encode(), headers) == ("org:acme", "m1")
    assert entity_of_message(output_key("org:acme", "m1").encode(), headers) == ("org:acme", "m1")


def test_a_message_without_headers_is_read_from_its_output_key() -> None:
    assert entity_of_message(b"acme:m_tea", None) == ("acme", "m_tea")
    assert entity_of_message(b"acme:m_tea", [("trace", b"x")]) == ("acme", "m_tea")
    assert entity_of_message(b"org%3Aacme:m1", None) == ("org:acme", "m1")


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


def test_replication_sets_min_insync_replicas_within_the_factor() -> None:
    assert TopicReplication().config() == {"min.insync.replicas": "1"}
    assert TopicReplication(3, 2).config() == {"min.insync.replicas": "2"}
    for factor, min_insync in ((3, 4), (1, 0), (0, 0)):
        with pytest.raises(ValueError, match=r"min\.insync\.replicas"):
            TopicReplication(factor, min_insync)
