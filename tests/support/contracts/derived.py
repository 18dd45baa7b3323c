"""The derived store's contract (``projections.stores.base.DerivedStore``), for every store of
the registry on every backend: ``erase`` removes a tombstone's copies and proves them gone,
``erase_many`` does it for a batch, one result each in order and counted as if one after the
other, ``reachable`` tells the verification probe what is left, ``ghosts`` tells the audit what
an erasure covers, and the purge check says ``purged`` once no removed copy remains.

A backend's ``Holder`` writes copies in the store's own form and reads back what is left;
tests/projections/test_derived_stores.py runs the contract on each store with its fake
(no marker) and with its real backend (integration).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import pytest

from projections.deletion.erasure import (
    EntityKey,
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.deletion.purge import DuePurge
from projections.sql import Conn
from projections.stores.base import DerivedStore, Erased
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

T = TypeVar("T")
# How long a purge check is asked again, and how often (as the purge duty asks it each round).
PURGE_WAIT_SECONDS = 60.0
PURGE_ROUND_SECONDS = 0.2
CUT_OFF = datetime(2026, 9, 1, 12, tzinfo=UTC)
BEFORE, AFTER = CUT_OFF - timedelta(hours=1), CUT_OFF + timedelta(hours=1)
ALICE, BOB = ("user", "alice"), ("user", "bob")


@dataclass(frozen=True, slots=True)
class Copy:
    """A copy of one memory or of one conversation's data, about a subject, made at ``at``."""

    tenant_id: str
    subject: tuple[str, str]
    at: datetime
    memory_id: str | None = None
    conversation_id: str | None = None

    @property
    def name(self) -> str:
        """How ``Holder.held`` names it: tenant, kind and id."""
        if self.memory_id is not None:
            return f"{self.tenant_id}/memory/{self.memory_id}"
        return f"{self.tenant_id}/conversation/{self.conversation_id}"


class Holder(Protocol):
    """A store under test, and how a test reaches behind it."""

    @property
    def store(self) -> DerivedStore: ...

    @property
    def conn(self) -> Conn:
        """What ``reachable`` and ``ghosts`` are given (a PostgreSQL connection, in autocommit:
        a test's snapshot must not hold the vacuum horizon back)."""
        ...

    # Which copies the store keeps: memories, conversations or both.
    holds: frozenset[str]
    # Whether a copy keeps the time it was made: a store without it (the cache) cannot tell
    # the subject's new data from the old and removes both.
    timed: bool

    async def hold(self, copies: Sequence[Copy]) -> None:
        """Write the copies the store keeps (of the kinds in ``holds``), as its writer does."""
        ...

    async def held(self) -> set[str]:
        """The names (``Copy.name``) of every copy the store holds, of every tenant."""
        ...

    async def record(self, tombstone: Tombstone) -> None:
        """What the ledger recorded of the erasure before its tombstone went out."""
        ...


class Runner(Protocol):
    def __call__(self, scenario: Callable[[Holder], Coroutine[Any, Any, T]]) -> T: ...


def erasure(
    deletion_id: str,
    tenant_id: str,
    subject: tuple[str, str],
    memories: Sequence[str] = (),
    conversations: Sequence[str] = (),
) -> Tombstone:
    """A subject's erasure, its items resolved at ``CUT_OFF``."""
    items = [TombstoneItem(type="memory", id=m) for m in memories]
    items += [TombstoneItem(type="conversation", id=c) for c in conversations]
    return Tombstone(
        deletion_id=deletion_id,
        tenant_id=tenant_id,
        kind="erasure",
        target=DeletionTarget(type="subject", subject_type=subject[0], id=subject[1]),
        items=tuple(items),
        issued_at=CUT_OFF,
        cut_off=CUT_OFF,
        deadline_at=CUT_OFF + timedelta(hours=1),
        required_stores=("embeddings", "summaries", "cache", "context"),
    )


def erased_keys(tombstone: Tombstone) -> list[EntityKey]:
    """The erasure index rows the ledger records for a subject's erasure (``plan_erasure``):
    its resolved memories and conversations, and its subject."""
    tenant, subject = tombstone.tenant_id, tombstone.target.subject()
    assert subject is not None
    return [
        *(memory_key(tenant, m) for m in tombstone.ids("memory")),
        *(conversation_key(tenant, c) for c in tombstone.conversation_ids()),
        subject_key(tenant, subject.type, subject.id),
    ]


def covered(tombstones: Sequence[Tombstone]) -> dict[str, ErasureIndex]:
    """The audit's view of these erasures, per tenant."""
    entries: dict[str, dict[EntityKey, Erasure]] = {}
    for tombstone in tombstones:
        for key in erased_keys(tombstone):
            entries.setdefault(key[0], {})[key] = Erasure(tombstone.deletion_id, CUT_OFF)
    return {tenant: ErasureIndex(index) for tenant, index in entries.items()}


def alices(tenant: str = "acme", at: datetime = BEFORE) -> list[Copy]:
    return [
        Copy(tenant, ALICE, at, memory_id="m_alice"),
        Copy(tenant, ALICE, at, conversation_id="c_alice"),
    ]


def bobs() -> list[Copy]:
    return [
        Copy("acme", BOB, BEFORE, memory_id="m_bob"),
        Copy("acme", BOB, BEFORE, conversation_id="c_bob"),
    ]


ALICE_ERASURE = erasure("d_alice", "acme", ALICE, ["m_alice"], ["c_alice"])
BOB_ERASURE = erasure("d_bob", "acme", BOB, ["m_bob"], ["c_bob"])


class DerivedStoreContract:
    @pytest.fixture
    def run(self) -> Runner:
        raise NotImplementedError("a backend's subclass runs scenarios on its store")

    def test_an_erasure_removes_the_targets_copies_and_proves_them_gone(self, run: Runner) -> None:
        async def scenario(h: Holder) -> None:
            await h.hold([*alices(), *bobs(), *alices(tenant="beta")])
            kept = await h.held() - {c.name for c in alices()}
            await h.record(ALICE_ERASURE)

            erased = await h.store.erase(ALICE_ERASURE)

            assert erased == Erased(len(h.holds), [])
            assert await h.held() == kept
            assert await h.store.reachable(h.conn, ALICE_ERASURE) == []
            # Redelivered: nothing left to remove, and still proven.
            assert await h.store.erase(ALICE_ERASURE) == Erased(0, [])

        run(scenario)

    def test_a_batch_gives_one_result_each_in_order_counted_as_one_after_the_other(
        self, run: Runner
    ) -> None:
        async def scenario(h: Holder) -> None:
            await h.hold([*alices(), *bobs(), *alices(tenant="beta")])
            beta_alice = erasure("d_beta", "beta", ALICE, ["m_alice"], ["c_alice"])
            batch = [ALICE_ERASURE, BOB_ERASURE, beta_alice, ALICE_ERASURE]
            for tombstone in batch[:3]:
                await h.record(tombstone)

            erased = await h.store.erase_many(batch)

            n = len(h.holds)
            assert erased == [Erased(n, []), Erased(n, []), Erased(n, []), Erased(0, [])]
            assert await h.held() == set()
            assert await h.store.erase_many([]) == []

        run(scenario)

    def test_listed_items_go_whatever_their_time_and_the_subjects_up_to_the_cut_off(
        self, run: Runner
    ) -> None:
        unlisted = [
            Copy("acme", ALICE, BEFORE, memory_id="m_unlisted"),
            Copy("acme", ALICE, BEFORE, conversation_id="c_unlisted"),
        ]
        later = [
            Copy("acme", ALICE, AFTER, memory_id="m_later"),
            Copy("acme", ALICE, AFTER, conversation_id="c_later"),
        ]

        async def scenario(h: Holder) -> None:
            # Made after the cut-off, but resolved as the erasure's items: they go.
            await h.hold(alices(at=AFTER))
            # Not among its items (written after they were resolved), but the subject's
            # from before the cut-off: they go too.
            await h.hold(unlisted)
            # Made after the cut-off and not among its items: the subject's new data.
            await h.hold(later)
            await h.record(ALICE_ERASURE)

            erased = await h.store.erase(ALICE_ERASURE)

            new_data = {c.name for c in later if _kept(h, c)}
            assert await h.held() == (new_data if h.timed else set())
            assert erased.removed == len(h.holds) * (3 if not h.timed else 2)
            assert erased.reachable == []

        run(scenario)

    def test_a_copy_left_behind_is_reachable_and_a_ghost_until_erased_again(
        self, run: Runner
    ) -> None:
        async def scenario(h: Holder) -> None:
            await h.hold([*alices(), *bobs()])
            await h.record(ALICE_ERASURE)
            await h.store.erase(ALICE_ERASURE)
            assert await h.store.ghosts(h.conn, covered([ALICE_ERASURE])) == []

            # Written again behind the store's back (a writer that missed the erasure).
            await h.hold(alices())

            assert await h.store.reachable(h.conn, ALICE_ERASURE) != []
            assert await h.store.ghosts(h.conn, covered([ALICE_ERASURE])) != []
            assert await h.store.erase(ALICE_ERASURE) == Erased(len(h.holds), [])
            assert await h.store.reachable(h.conn, ALICE_ERASURE) == []
            assert await h.store.ghosts(h.conn, covered([ALICE_ERASURE])) == []
            assert await h.held() == {c.name for c in bobs() if _kept(h, c)}

        run(scenario)

    def test_an_acknowledged_erasure_is_purged_by_the_stores_own_check(self, run: Runner) -> None:
        async def scenario(h: Holder) -> None:
            # Required of this store, whichever it is (a store added to the registry too).
            erased = ALICE_ERASURE.model_copy(update={"required_stores": (h.store.name,)})
            await h.hold([*alices(), *bobs()])
            await h.record(erased)
            check = h.store.purge_check()
            assert check.place == h.store.name
            assert not check.applies(
                DuePurge(erased.model_copy(update={"required_stores": ()}), {})
            )
            await h.store.erase(erased)
            mark = await check.mark()
            due = DuePurge(erased, mark)
            assert check.applies(due)

            # Idempotent, and asked again as the purge duty asks it every round: a round that
            # vacuums may need a later one to see the horizon pass, and open transactions of
            # other sessions (the other test process has some) hold the horizon back a while.
            deadline = time.monotonic() + PURGE_WAIT_SECONDS
            purged = await check.purged([due])
            while not purged and time.monotonic() < deadline:
                await asyncio.sleep(PURGE_ROUND_SECONDS)
                purged = await check.purged([due])
            assert purged == {due.key}
            assert await check.purged([due]) == {due.key}

        run(scenario)


def _kept(h: Holder, copy: Copy) -> bool:
    return ("memory" if copy.memory_id is not None else "conversation") in h.holds
