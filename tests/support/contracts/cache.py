"""The cache's contract (``projections.cache.port.RecallCache``): entries put and got per
tenant, invalidated by subject, memory and conversation through their indexes, checked with
(``reachable``) and without (``indexed_each``) a walk of the tenant's keys, in batches counted
per erasure; and the cache derived store's ``erase_many`` on it.

Run against the in-memory fake and against Redis (tests/projections/test_cache_store.py, the
latter under the integration marker). A backend gives ``run``: it runs a scenario on a fresh,
empty cache (``Harness``) in its own event loop and returns what the scenario returns.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import orjson
import pytest

from projections.cache.entries import Holdings
from projections.cache.keys import TenantKeys
from projections.cache.port import RecallCache
from projections.stores.cache import CacheStore
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

T = TypeVar("T")

ALICE = ("user", "alice")
BOB = ("user", "bob")
CAROL = ("user", "carol")


class Harness(Protocol):
    """One scenario's cache, and what a test does to it behind the port's back."""

    @property
    def cache(self) -> RecallCache: ...

    @property
    def namespace(self) -> str: ...

    async def write_unindexed(self, key: str, value: bytes) -> None:
        """A value written under ``key`` without any index, as another writer could."""
        ...

    async def delete(self, *keys: str) -> None: ...

    async def exists(self, key: str) -> bool:
        """Whether ``key`` names an entry or a non-empty index."""
        ...

    def forbid_scan(self, cache: RecallCache) -> None:
        """From now on a walk of the keyspace by ``cache`` fails the test."""
        ...

    def another(self, refill: Sequence[dict[str, Any]]) -> RecallCache:
        """A second cache on the same data whose every ``invalidate_each`` is followed by a
        recall for Alice filled with ``refill`` (as a read right after an erasure may be)."""
        ...


class Runner(Protocol):
    def __call__(self, scenario: Callable[[Harness], Coroutine[Any, Any, T]]) -> T: ...


def memory(memory_id: str, conversation_id: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"memory_id": memory_id, "value": {"text": f"fact {memory_id}"}}
    if conversation_id is not None:
        record["source"] = {"type": "message", "ref": f"{conversation_id}/msg_2"}
    return record


def erasure(tenant_id: str, subject: tuple[str, str], items: Sequence[TombstoneItem]) -> Tombstone:
    now = datetime.now(UTC)
    return Tombstone(
        deletion_id=f"d_{subject[1]}",
        tenant_id=tenant_id,
        kind="erasure",
        target=DeletionTarget(type="subject", subject_type=subject[0], id=subject[1]),
        items=tuple(items),
        issued_at=now,
        cut_off=now,
        deadline_at=now + timedelta(hours=1),
        required_stores=("cache",),
    )


class CacheContract:
    @pytest.fixture
    def run(self) -> Runner:
        raise NotImplementedError("a backend's subclass runs scenarios on its cache")

    def test_entries_come_back_per_tenant_key_and_conversation(self, run: Runner) -> None:
        records = [memory("m_tea", "conv_1"), memory("m_city")]
        view = {"items": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}

        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            await cache.put_recall("acme", ALICE, "q_all", records)
            await cache.put_context("acme", "conv_1", ALICE, view)
            assert await cache.get_recall("acme", ALICE, "q_all") == records
            assert await cache.get_recall("acme", ALICE, "q_other") is None
            assert await cache.get_recall("beta", ALICE, "q_all") is None
            assert await cache.get_context("acme", "conv_1") == view
            assert await cache.get_context("acme", "conv_2") is None
            assert [key for key, _ in await cache.entries("acme")] == sorted(
                [keys.recall(ALICE, "q_all"), keys.context("conv_1")]
            )
            assert await cache.entries("beta") == []

        run(scenario)

    def test_invalidate_by_subject_spares_other_subjects_and_tenants(self, run: Runner) -> None:
        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
            await cache.put_recall("acme", ALICE, "q_recent", [memory("m_city")])
            await cache.put_context("acme", "conv_1", ALICE, {"items": []})
            await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
            await cache.put_context("acme", "conv_bob", BOB, {"items": []})
            await cache.put_recall("beta", ALICE, "q_all", [memory("m_tea", "conv_1")])

            assert await cache.invalidate("acme", subject=ALICE) == 3

            assert await cache.get_recall("acme", ALICE, "q_all") is None
            assert await cache.get_recall("acme", ALICE, "q_recent") is None
            assert await cache.get_context("acme", "conv_1") is None
            assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob")]
            assert await cache.get_context("acme", "conv_bob") == {"items": []}
            assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_tea", "conv_1")]
            assert await cache.reachable("acme", subject=ALICE) == []
            assert await cache.reachable("beta", subject=ALICE) == [
                TenantKeys(h.namespace, "beta").recall(ALICE, "q_all")
            ]
            assert not await h.exists(keys.subject_index(ALICE))
            assert await cache.invalidate("acme", subject=ALICE) == 0

        run(scenario)

    def test_invalidate_by_memory_removes_it_from_every_subject(self, run: Runner) -> None:
        async def scenario(h: Harness) -> None:
            cache = h.cache
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_shared"), memory("m_tea")])
            await cache.put_recall("acme", BOB, "q_all", [memory("m_shared")])
            await cache.put_recall("acme", BOB, "q_recent", [memory("m_bob")])
            await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])
            await cache.put_recall("beta", ALICE, "q_all", [memory("m_shared")])

            assert await cache.invalidate("acme", memory_ids=["m_shared"]) == 2

            assert await cache.get_recall("acme", ALICE, "q_all") is None
            assert await cache.get_recall("acme", BOB, "q_all") is None
            assert await cache.get_recall("acme", BOB, "q_recent") == [memory("m_bob")]
            assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
            assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_shared")]
            assert await cache.reachable("acme", memory_ids=["m_shared", "m_tea"]) == []
            # m_tea's entry went with m_shared: its index is left with a dangling member only.
            assert await cache.invalidate("acme", memory_ids=["m_tea"]) == 0

        run(scenario)

    def test_invalidate_by_conversation_follows_memory_sources(self, run: Runner) -> None:
        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            await cache.put_context("acme", "conv_1", ALICE, {"items": [1]})
            await cache.put_context("acme", "conv_2", ALICE, {"items": [2]})
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
            await cache.put_recall("acme", BOB, "q_all", [memory("m_bob", "conv_2")])
            await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])

            assert await cache.invalidate("acme", conversation_ids=["conv_1"]) == 2

            assert await cache.get_context("acme", "conv_1") is None
            assert await cache.get_recall("acme", ALICE, "q_all") is None
            assert await cache.get_context("acme", "conv_2") == {"items": [2]}
            assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob", "conv_2")]
            assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
            assert await cache.reachable("acme", conversation_ids=["conv_1"]) == []
            assert await cache.reachable("acme", conversation_ids=["conv_2"]) == sorted(
                [keys.context("conv_2"), keys.recall(BOB, "q_all")]
            )
            assert not await h.exists(keys.conversation_index("conv_1"))

        run(scenario)

    def test_reachable_finds_entries_written_behind_the_index(self, run: Runner) -> None:
        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            rogue_recall = keys.recall(CAROL, "q_rogue")
            rogue_context = keys.context("conv_rogue")
            unreadable = keys.recall(CAROL, "q_unreadable")
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea")])
            rogue = {
                "subject": ["user", "carol"],
                "memory_ids": [],
                "records": [memory("m_x", "c9")],
            }
            await h.write_unindexed(rogue_recall, orjson.dumps(rogue))
            await h.write_unindexed(rogue_context, orjson.dumps({"conversation_id": "conv_rogue"}))
            await h.write_unindexed(unreadable, b"not an entry")

            assert await cache.invalidate("acme", memory_ids=["m_x"]) == 0
            # A value that is not an entry is reported whatever the targets.
            assert await cache.reachable("acme", memory_ids=["m_x"]) == [
                rogue_recall,
                unreadable,
            ]
            assert await cache.reachable("acme", conversation_ids=["c9"]) == [
                rogue_recall,
                unreadable,
            ]
            assert await cache.reachable("acme", subject=CAROL) == [rogue_recall, unreadable]
            assert await cache.reachable("acme", conversation_ids=["conv_rogue"]) == [
                rogue_context,
                unreadable,
            ]
            assert await cache.reachable("beta", memory_ids=["m_x"], subject=CAROL) == []
            assert dict(await cache.entries("acme"))[unreadable] == {"unreadable": True}

            # Known from its conversation, the unindexed context entry is still invalidated.
            assert await cache.invalidate("acme", conversation_ids=["conv_rogue"]) == 1
            await h.delete(rogue_recall, unreadable)
            assert await cache.reachable("acme", memory_ids=["m_x"], subject=CAROL) == []
            assert [key for key, _ in await cache.entries("acme")] == [keys.recall(ALICE, "q_all")]

        run(scenario)

    def test_ids_with_separators_and_glob_characters_stay_apart(self, run: Runner) -> None:
        placed: list[tuple[str, tuple[str, str], str]] = [
            ("a:b", ("user", "c"), "m:1"),
            ("a", ("user", "b:c"), "m*"),
            ("a", ("user:b", "c"), "m[1]"),
            ("a*", ("user", "*"), "m?"),
            ("ab", ("user", "*"), "m1"),
            ("[a]b", ("us\\er", "%3A"), "%"),
            ("{a}", ("user", "}{"), "m{1}"),
        ]

        async def scenario(h: Harness) -> None:
            cache, ns = h.cache, h.namespace
            for tenant, subject, memory_id in placed:
                await cache.put_recall(tenant, subject, "q:*", [memory(memory_id, "c:[1]")])
            for tenant, subject, memory_id in placed:
                wanted = [memory(memory_id, "c:[1]")]
                assert await cache.get_recall(tenant, subject, "q:*") == wanted
            assert len(await cache.entries("a")) == 2
            for tenant in ("a:b", "a*", "ab", "[a]b", "{a}"):
                assert len(await cache.entries(tenant)) == 1
            assert await cache.entries("b") == []

            assert await cache.invalidate("a", memory_ids=["m*"]) == 1
            assert await cache.get_recall("a", ("user:b", "c"), "q:*") is not None
            assert await cache.invalidate("a*", subject=("user", "*")) == 1
            assert await cache.get_recall("ab", ("user", "*"), "q:*") is not None
            assert await cache.reachable("ab", subject=("user", "*")) == [
                TenantKeys(ns, "ab").recall(("user", "*"), "q:*")
            ]
            assert await cache.invalidate("a:b", conversation_ids=["c:[1]"]) == 1
            assert await cache.get_recall("a", ("user:b", "c"), "q:*") is not None
            assert await cache.invalidate("[a]b", memory_ids=["%"]) == 1
            assert await cache.invalidate("{a}", subject=("user", "}{")) == 1
            remaining = {key for tenant in ("a", "ab") for key, _ in await cache.entries(tenant)}
            assert remaining == {
                TenantKeys(ns, "a").recall(("user:b", "c"), "q:*"),
                TenantKeys(ns, "ab").recall(("user", "*"), "q:*"),
            }

        run(scenario)

    def test_invalidate_of_unknown_ids_deletes_nothing(self, run: Runner) -> None:
        async def scenario(h: Harness) -> None:
            cache = h.cache
            assert await cache.invalidate("acme", subject=ALICE) == 0
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
            await cache.put_context("acme", "conv_1", ALICE, {"items": []})
            unknown = await cache.invalidate(
                "acme", subject=BOB, conversation_ids=["conv_9"], memory_ids=["m_9"]
            )
            assert unknown == 0
            assert await cache.invalidate("acme") == 0
            assert await cache.invalidate("beta", subject=ALICE, memory_ids=["m_tea"]) == 0
            assert len(await cache.entries("acme")) == 2
            with pytest.raises(TypeError):
                await cache.invalidate("acme", conversation_ids="conv_1")

        run(scenario)

    def test_a_batch_of_invalidations_is_counted_and_checked_per_erasure(self, run: Runner) -> None:
        erasures = [
            ("acme", Holdings.targets(ALICE, [], [])),
            # Alice's entry holds it too, but the erasure before removed it: it counts once.
            ("acme", Holdings.targets(None, [], ["m_shared"])),
            ("beta", Holdings.targets(None, ["conv_9"], [])),
            ("beta", Holdings.targets(CAROL, [], [])),
        ]

        async def scenario(h: Harness) -> None:
            cache = h.cache
            acme, beta = TenantKeys(h.namespace, "acme"), TenantKeys(h.namespace, "beta")
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_shared"), memory("m_tea")])
            await cache.put_recall("acme", BOB, "q_all", [memory("m_shared")])
            await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])
            await cache.put_recall("beta", ALICE, "q_all", [memory("m_shared")])
            await cache.put_context("beta", "conv_9", BOB, {"items": []})
            assert await cache.reachable_each(erasures) == [
                [acme.recall(ALICE, "q_all")],
                sorted([acme.recall(ALICE, "q_all"), acme.recall(BOB, "q_all")]),
                [beta.context("conv_9")],
                [],
            ]

            assert await cache.invalidate_each(erasures) == [1, 1, 1, 0]

            assert await cache.reachable_each(erasures) == [[], [], [], []]
            assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
            assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_shared")]
            assert not await h.exists(acme.memory_index("m_shared"))
            assert await cache.invalidate_each([]) == [] and await cache.reachable_each([]) == []

        run(scenario)

    def test_the_check_after_an_invalidation_reads_the_indexes_not_the_keyspace(
        self, run: Runner
    ) -> None:
        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            rogue = keys.recall(CAROL, "q_rogue")
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
            await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
            await cache.put_recall("beta", ALICE, "q_all", [memory("m_tea")])
            # Unindexed: a context entry (known from its conversation) and a recall entry.
            context = orjson.dumps({"conversation_id": "conv_9"})
            await h.write_unindexed(keys.context("conv_9"), context)
            await h.write_unindexed(rogue, orjson.dumps({"records": [memory("m_tea")]}))
            erasures = [
                ("acme", Holdings.targets(None, [], ["m_tea"])),
                ("acme", Holdings.targets(None, ["conv_9"], [])),
                ("acme", Holdings.targets(None, ["conv_1"], ["m_none"])),
                ("beta", Holdings.targets(None, [], ["m_bob"])),
            ]
            scanning = await cache.reachable_each(erasures)
            h.forbid_scan(cache)
            indexed = await cache.indexed_each(erasures)

            assert indexed == [
                [keys.recall(ALICE, "q_all")],
                [keys.context("conv_9")],
                [keys.recall(ALICE, "q_all")],
                [],
            ]
            # Only the scan finds what was written behind the indexes' back.
            assert scanning == [sorted([keys.recall(ALICE, "q_all"), rogue]), *indexed[1:]]
            assert await cache.indexed_each([]) == []

        run(scenario)

    def test_erase_many_checks_the_items_not_the_subject_in_rounds_that_ignore_the_keyspace(
        self, run: Runner
    ) -> None:
        tombstones = [
            erasure(
                "acme",
                ALICE,
                [
                    TombstoneItem(type="memory", id="m_tea"),
                    TombstoneItem(type="conversation", id="conv_1"),
                ],
            ),
            erasure("beta", BOB, [TombstoneItem(type="memory", id="m_bob")]),
        ]

        async def scenario(h: Harness) -> None:
            keys, cache = TenantKeys(h.namespace, "acme"), h.cache
            await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea"), memory("m_city")])
            await cache.put_context("acme", "conv_1", ALICE, {"items": []})
            await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
            await cache.put_recall("beta", BOB, "q_all", [memory("m_bob")])

            # Filled after the erasure, Alice's new entry holds nothing erased: not a failure.
            fresh = h.another([memory("m_new")])
            h.forbid_scan(fresh)
            erased = await CacheStore(fresh).erase_many(tombstones)
            assert [(e.removed, e.reachable) for e in erased] == [(2, []), (1, [])]
            assert await cache.get_recall("acme", ALICE, "q_after") == [memory("m_new")]
            assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob")]

            # One that still holds an erased memory (a fill that broke the rule) is reported,
            # and so by the verification probe's own check, which scans too.
            broken = h.another([memory("m_tea")])
            h.forbid_scan(broken)
            (alice, _) = await CacheStore(broken).erase_many(tombstones)
            assert (alice.removed, alice.reachable) == (1, [keys.recall(ALICE, "q_after")])
            assert await CacheStore(cache).reachable(None, tombstones[0]) == alice.reachable  # type: ignore[arg-type]

        run(scenario)
