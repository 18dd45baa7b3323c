"""The purge milestone's decisions (projections.deletion.purge): when the horizon, the
compacted log, the raw input's low watermarks and the stores let a completed deletion count
as purged."""

from __future__ import annotations

import asyncio

from projections.deletion.purge import (
    PurgedAtAck,
    compaction_leftovers,
    erasures,
    horizon_passed,
    of_stores,
    trimmed_past,
)
from support.purges import due


def test_the_horizon_must_reach_the_mark() -> None:
    assert not horizon_passed(mark_xid=1000, horizon_xid=999)  # a snapshot from before
    assert horizon_passed(mark_xid=1000, horizon_xid=1000)
    assert horizon_passed(mark_xid=1000, horizon_xid=5000)


def test_a_value_before_a_later_null_is_a_leftover_and_new_data_is_not() -> None:
    erased, other = b"acme:m1", b"acme:m2"
    keys = {erased}
    assert compaction_leftovers([(erased, False), (other, False), (erased, True)], keys) == {erased}
    # Compacted: only the null is left (and then not even that): purged.
    assert compaction_leftovers([(other, False), (erased, True)], keys) == set()
    assert compaction_leftovers([], keys) == set()
    # A value written after the null is new data, not a copy of what was erased.
    assert compaction_leftovers([(erased, True), (erased, False)], keys) == set()
    # Another key's history is not looked at; keyless records are skipped.
    assert compaction_leftovers([(other, False), (None, True), (other, True)], keys) == set()


def test_raw_input_is_trimmed_past_once_every_partition_is() -> None:
    mark = {"memory.events": {"0": 10, "1": 4}, "conversation.events": {"0": 7}}
    low = {"memory.events": {"0": 10, "1": 4}, "conversation.events": {"0": 9}}
    assert trimmed_past(mark, low)
    assert not trimmed_past(mark, {**low, "memory.events": {"0": 10, "1": 3}})
    assert not trimmed_past(mark, {"memory.events": {"0": 10, "1": 4}})  # a topic unseen


def test_which_places_apply() -> None:
    revocation = due("r1", kind="revocation", stores=("embeddings", "cache"))
    assert erasures(due("d1")) and not erasures(revocation)
    assert of_stores("summaries")(due("d1")) and not of_stores("summaries")(revocation)
    cache = PurgedAtAck("cache")
    assert cache.applies(revocation)
    assert asyncio.run(cache.purged([revocation])) == {("acme", "r1")}
