"""The one-hop stages against the real services: the upgrade from the two-stage
deployment hands the sealer's raw offsets over to the fused workers."""

from __future__ import annotations

from typing import Any

import pytest

from streams.progress import end_offsets
from streams.sample import EventFactory
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS, MEMORY_SEALED

pytestmark = pytest.mark.integration


def test_a_fused_worker_starts_at_the_sealers_raw_offsets(env: Any) -> None:
    f = EventFactory(id_prefix="hop")
    raw = env.topic(MEMORY_EVENTS)
    # What the old sealer sealed (and the old memory worker projected from the sealed log):
    # the fused worker must not seal or apply it again.
    env.produce_events(f.proposed("acme", f"old_{i}") for i in range(12))
    ends = end_offsets(env.settings.kafka_bootstrap, raw)
    with env.connect() as conn:
        for partition, offset in ends.items():
            conn.execute(
                "INSERT INTO projection_offsets (projection, topic, partition, next_offset)"
                " VALUES ('sealer', %s, %s, %s)",
                (raw, partition, offset),
            )
        # The old sealer's offsets of the other raw topic are the conversation worker's.
        conn.execute(
            "INSERT INTO projection_offsets (projection, topic, partition, next_offset)"
            " VALUES ('sealer', %s, 0, 7)",
            (env.topic(CONVERSATION_EVENTS),),
        )
    env.produce_events(f.proposed("acme", f"new_{i}") for i in range(5))
    env.worker("memory", raw_input_trim_seconds=0)
    env.wait_caught_up()

    with env.connect() as conn:
        stored = {row[0] for row in conn.execute("SELECT memory_id FROM memories")}
        tracked = dict(
            conn.execute(
                "SELECT partition, next_offset FROM projection_offsets"
                " WHERE projection = 'memory' AND topic = %s",
                (raw,),
            ).fetchall()
        )
    assert stored == {f"new_{i}" for i in range(5)}
    sealed = {value["payload"]["memory_id"] for _, value in env.read(MEMORY_SEALED)}
    assert sealed == {f"new_{i}" for i in range(5)}
    assert sum(tracked.values()) == 17
    # Only positions the fused worker reads were handed over.
    with env.connect() as conn:
        (conversation,) = conn.execute(
            "SELECT count(*) FROM projection_offsets WHERE projection = 'conversation'"
        ).fetchone()
    assert conversation == 0
