"""Adding a derived store is its module, one registry line and its tests
(docs/howto-derived-store.md): a toy store, defined and registered here with ``with_store``
(no registry module edited), is required by the ledger, read by the verification probe and
the ghost audit, kept by a worker of its own, and deployed by every generated file."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import orjson
import psycopg
import pytest
import yaml
from prometheus_client import CollectorRegistry

from projections.deletion import lifecycle
from projections.deletion.coverage import keys_of
from projections.deletion.erasure import ErasureIndex
from projections.deletion.ledger import LedgerBatch, ResolvedTarget, plan_erasure, reduce_ledger
from projections.deletion.projection import LedgerCodec, LedgerProjection
from projections.memory.reducer import reduce_batch
from projections.sql import Conn, KeyLookups
from projections.stores import STORES, DerivedStore, Erased, StoreRegistry, StoreResources
from streams.agents.tombstones import TombstoneHandler
from streams.deployment.compose import compose_file
from streams.deployment.kubernetes import kubernetes_files
from streams.deployment.prometheus import scrape_targets
from streams.maintenance import LedgerMaintenance
from streams.metrics import Metrics
from streams.monitoring import MonitorService
from streams.sample import EventFactory, to_message
from streams.services import BatchConsumers, DatabaseService
from streams.settings import Settings
from streams.worker import WORKERS, WorkerParts, ledger_projection
from support.contracts.derived import ALICE, Copy, DerivedStoreContract, Holder
from support.fakes import Publisher, Source, Stops, loop_for
from topics.codec import EventCodec, InvalidMessage
from topics.deletion import Acknowledgement, DeletionRequested, Tombstone
from topics.memory import MemoryEvent
from topics.messages import InputMessage
from topics.registry import DELETION_TOMBSTONES, TopicNames, output_key
from topics.schemas import default_schemas

REPO = Path(__file__).resolve().parents[2]
NO_CONN = cast(Conn, None)  # the toy store reads no PostgreSQL
TENANT = "acme"
NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)
DEADLINE = timedelta(hours=1)


class ToyStore(DerivedStore):
    """Copies of memories and conversations about subjects, in a set: what it holds is what a
    reader could get. Shared by every instance the workers open."""

    name = "toy"
    metrics_port = 9109
    deletion_slo_seconds = 120
    held: ClassVar[set[Copy]] = set()

    @classmethod
    def open(cls, resources: StoreResources) -> ToyStore:
        return cls()

    async def erase(self, tombstone: Tombstone) -> Erased:
        doomed = {copy for copy in self.held if _erased_by(tombstone, copy)}
        ToyStore.held = self.held - doomed
        return Erased(len(doomed), await self.reachable(NO_CONN, tombstone))

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        return sorted(copy.name for copy in self.held if _erased_by(tombstone, copy))

    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        return sorted(
            copy.name
            for copy in self.held
            if (index := covered.get(copy.tenant_id)) is not None
            and index.covering(
                keys_of(
                    copy.tenant_id,
                    copy.subject,
                    memory_id=copy.memory_id,
                    conversation_id=copy.conversation_id,
                ),
                copy.at,
            )
            is not None
        )


def _erased_by(tombstone: Tombstone, copy: Copy) -> bool:
    """The tombstone's items whatever their time, and its subject's copies up to its
    cut-off."""
    if copy.tenant_id != tombstone.tenant_id:
        return False
    if copy.memory_id is not None and copy.memory_id in tombstone.ids("memory"):
        return True
    if copy.conversation_id is not None and copy.conversation_id in tombstone.conversation_ids():
        return True
    subject = tombstone.target.subject()
    return (
        subject is not None
        and (subject.type, subject.id) == copy.subject
        and (copy.at <= tombstone.cut_off)
    )


class ToyHolder:
    """The toy store under the derived store's contract."""

    holds = frozenset({"memory", "conversation"})
    timed = True
    conn = NO_CONN

    def __init__(self) -> None:
        ToyStore.held = set()
        self.store: DerivedStore = ToyStore()

    async def hold(self, copies: Sequence[Copy]) -> None:
        ToyStore.held |= set(copies)

    async def held(self) -> set[str]:
        return {copy.name for copy in ToyStore.held}

    async def record(self, tombstone: Tombstone) -> None:
        """The toy store reads nothing the ledger recorded."""


class TestToyStoreContract(DerivedStoreContract):
    """Its tests: the contract every derived store passes (tests/support/contracts)."""

    @pytest.fixture
    def run(self) -> Callable[[Callable[[Holder], Coroutine[Any, Any, T]]], T]:
        def run(scenario: Callable[[Holder], Coroutine[Any, Any, T]]) -> T:
            return asyncio.run(scenario(ToyHolder()))

        return run


WITH_TOY = WORKERS.with_store(ToyStore)
Service = TypeVar("Service")
T = TypeVar("T")


def one(kind: type[Service], parts: WorkerParts) -> Service:
    (found,) = [service for service in parts.services if isinstance(service, kind)]
    return found


def request(deletion_id: str, target: dict[str, str]) -> DeletionRequested:
    event = EventFactory(id_prefix=deletion_id, clock=NOW).deletion(TENANT, deletion_id, target)
    decoded = LedgerCodec(default_schemas()).decode(*to_message(event))
    assert isinstance(decoded, DeletionRequested)
    return decoded


def ack(deletion_id: str, store: str) -> Acknowledgement:
    return Acknowledgement(
        deletion_id=deletion_id,
        tenant_id=TENANT,
        store=store,
        status="done",
        removed_count=0,
        acked_at=NOW,
    )


def test_the_registries_take_the_store_without_changing_memprojs() -> None:
    assert WITH_TOY.stores.names == (*STORES.names, "toy")
    assert "toy" not in STORES.names and "toy" not in WORKERS.kinds
    kind = WITH_TOY.kinds["toy"]
    assert (kind.metrics_port, kind.store, kind.consumers, kind.single) == (9109, ToyStore, 1, None)
    assert WITH_TOY.metrics_ports["toy"] == 9109 and "toy" in WITH_TOY.consuming
    # A name or port another store has is refused: each is a worker's, a group's, a label's.
    with pytest.raises(ValueError, match="share a name"):
        STORES.with_store(type("Again", (ToyStore,), {"name": "cache", "metrics_port": 9199}))
    with pytest.raises(ValueError, match="share a metrics_port"):
        STORES.with_store(type("Clash", (ToyStore,), {"name": "clash", "metrics_port": 9104}))


def test_the_ledger_waits_for_its_acknowledgement() -> None:
    stores = WITH_TOY.stores
    erasure = request("d_toy", {"type": "memory", "id": "m1"})
    entry = plan_erasure(erasure, ResolvedTarget(memories=("m1",)), DEADLINE, stores.requirements)
    # Like every store that holds copies of memories (summaries and context hold none).
    assert entry.required_stores == ("embeddings", "cache", "toy")

    key = (TENANT, "d_toy")
    batch = reduce_ledger([erasure], {key: ResolvedTarget()}, {}, {}, DEADLINE, stores.requirements)
    others = [ack("d_toy", store) for store in ("embeddings", "cache")]
    batch = reduce_ledger(others, {}, batch.states, {}, DEADLINE, stores.requirements)
    assert not batch.states[key].completed and batch.states[key].stores["toy"].status == "pending"
    batch = reduce_ledger(
        [ack("d_toy", "toy")], {}, batch.states, {}, DEADLINE, stores.requirements
    )
    assert batch.states[key].completed

    # Its acknowledgements are accepted by the ledger that knows it, refused by another.
    message = ack("d_toy", "toy").model_dump_json().encode()
    key_bytes = output_key(TENANT, "d_toy").encode()
    decoded = LedgerCodec(default_schemas(), stores=stores).decode(key_bytes, message)
    assert isinstance(decoded, Acknowledgement) and decoded.store == "toy"
    with pytest.raises(InvalidMessage, match="no derived store is named 'toy'"):
        LedgerCodec(default_schemas()).decode(key_bytes, message)


def test_a_revocation_waits_for_it_too() -> None:
    f = EventFactory(id_prefix="r", clock=NOW)
    codec = EventCodec(default_schemas(), frozenset({"memory.proposed", "memory.revoked"}))
    raw = [f.proposed(TENANT, "m1", ("user", "alice")), f.revoked(TENANT, "m1")]
    events = [cast(MemoryEvent, codec.decode(*to_message(event))) for event in raw]
    (revocation,) = reduce_batch(events, {}, {}, stores=WITH_TOY.stores.requirements).revocations
    assert revocation.required_stores == ("embeddings", "cache", "toy")


def test_the_workers_of_the_registry_keep_probe_and_audit_it(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, environment="local")

    async def build(kind: str) -> WorkerParts:
        return WITH_TOY.kinds[kind].build(settings, Metrics(CollectorRegistry()))

    toy = asyncio.run(build("toy"))
    consumers = one(BatchConsumers, toy)
    assert len(consumers.runs) == 1
    deletion = asyncio.run(build("deletion"))
    probed = one(LedgerMaintenance, deletion).stores
    assert [store.name for store in probed] == list(WITH_TOY.stores.names)
    assert isinstance(probed[-1], ToyStore)
    monitor = asyncio.run(build("monitor"))
    assert [store.name for store in one(MonitorService, monitor).stores] == list(
        WITH_TOY.stores.names
    )


def honour(tombstone: Tombstone, stores: StoreRegistry) -> tuple[list[Any], list[Any]]:
    """The toy store's tombstone agent over one tombstone: its acknowledgements and dead
    letters."""
    topics = TopicNames("t.")
    key = output_key(tombstone.tenant_id, tombstone.deletion_id).encode()
    message = InputMessage(
        topics.name(DELETION_TOMBSTONES), 0, 0, key, tombstone.model_dump_json().encode(), ()
    )
    publisher = Publisher()
    agent = TombstoneHandler(
        ToyStore(), publisher, topics, Metrics(CollectorRegistry()), stores=stores
    )
    stops = Stops()
    asyncio.run(loop_for(agent, stops).run(Source([[message]])))
    assert stops.stopped == []
    decoded = [orjson.loads(m.value or b"") for m in publisher.on("deletion.acks")]
    letters = [orjson.loads(m.value or b"") for m in publisher.on(".dlq")]
    return decoded, letters


def test_its_worker_honours_tombstones_of_the_registry_it_is_built_from() -> None:
    """Every worker of a deployment is built from the same registry: one that does not know
    the toy store takes a tombstone naming it for a forgery and dead-letters it."""
    ToyStore.held = {Copy(TENANT, ALICE, NOW, memory_id="m1")}
    tombstone = plan_erasure(
        request("d_toy", {"type": "memory", "id": "m1"}),
        ResolvedTarget(memories=("m1",)),
        DEADLINE,
        WITH_TOY.stores.requirements,
    ).tombstone()
    acks, letters = honour(tombstone, WITH_TOY.stores)
    assert [(a["store"], a["status"], a["removed_count"]) for a in acks] == [("toy", "done", 1)]
    assert letters == [] and ToyStore.held == set()
    acks, letters = honour(tombstone, STORES)
    assert acks == [] and [letter["error_code"] for letter in letters] == ["invalid_event"]


def test_the_generated_deployment_files_run_and_scrape_its_worker() -> None:
    files = kubernetes_files(WITH_TOY)
    manifest = [doc for doc in yaml.safe_load_all(files["workers/toy.yaml"]) if doc]
    deployment = manifest[0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["memproj", "worker", "toy"]
    assert container["ports"][0]["containerPort"] == 9109
    assert [doc["kind"] for doc in manifest] == ["Deployment", "PodDisruptionBudget"]
    assert "workers/toy.yaml" in yaml.safe_load(files["kustomization.yaml"])["resources"]

    compose = yaml.safe_load(compose_file((REPO / "docker-compose.yml").read_text(), WITH_TOY))
    service = compose["services"]["memproj-toy"]
    assert service["command"] == ["worker", "toy"]
    assert service["ports"] == ["127.0.0.1:9109:9109"]
    targets = yaml.safe_load(compose["configs"]["memproj-targets"]["content"])
    assert {"targets": ["memproj-toy:9109"], "labels": {"worker": "toy"}} in targets
    assert {"targets": ["127.0.0.1:9109"], "labels": {"worker": "toy"}} in scrape_targets(
        "127.0.0.1", WITH_TOY
    )


# -- against PostgreSQL: the ledger, the probe and the audit built from the registry ----------


async def apply(ledger: LedgerProjection, conn: Any, events: Sequence[Any]) -> LedgerBatch:
    """One batch through the ledger, as its worker's runner applies it."""
    state = await ledger.load(conn, events)
    state = await ledger.lock(conn, events, state)
    batch = ledger.reduce(events, state, {})
    await ledger.save(conn, batch)
    await conn.commit()
    return batch


@pytest.mark.integration
def test_a_deletion_completes_with_its_acknowledgement_and_is_verified_and_audited_in_it(
    env: Any,
) -> None:
    settings: Settings = env.settings
    metrics = Metrics(CollectorRegistry())
    ledger = ledger_projection(settings, metrics, WITH_TOY.stores)
    erasure = request("d_toy", {"type": "memory", "id": "m_toy"})
    key = (TENANT, "d_toy")
    ToyStore.held = {
        Copy(TENANT, ALICE, NOW, memory_id="m_toy"),
        Copy(TENANT, ALICE, NOW, memory_id="m_kept"),
    }

    async def ledger_steps() -> None:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            await apply(ledger, conn, [erasure])
            tombstone = await lifecycle.tombstone_of(conn, TENANT, "d_toy")
            assert "toy" in tombstone.required_stores
            others = [s for s in tombstone.required_stores if s != "toy"]
            await apply(ledger, conn, [ack("d_toy", store) for store in others])
            (state,) = (await lifecycle.load_states(conn, [key], KeyLookups())).values()
            assert not state.completed and state.stores["toy"].status == "pending"
            await apply(ledger, conn, [ack("d_toy", "toy")])
            (state,) = (await lifecycle.load_states(conn, [key], KeyLookups())).values()
            assert state.completed

    async def probe_and_audit() -> tuple[dict[str, Any] | None, list[Any]]:
        deletion = WITH_TOY.kinds["deletion"].build(settings, metrics)
        monitor = WITH_TOY.kinds["monitor"].build(settings, Metrics(CollectorRegistry()))
        pools = [one(DatabaseService, parts).pool for parts in (deletion, monitor)]
        for pool in pools:
            await pool.open(wait=True)
        try:
            # The toy store acknowledged, but still holds the copy: the probe finds it.
            assert await one(LedgerMaintenance, deletion).verify_completed() == 1
            await one(MonitorService, monitor).audit()
        finally:
            for pool in pools:
                await pool.close()
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            detail = await lifecycle.request_detail(conn, TENANT, "d_toy")
            cursor = await conn.execute(
                "SELECT ghost_items, examples FROM ghost_audits WHERE store = 'toy'"
            )
            return detail, await cursor.fetchall()

    asyncio.run(ledger_steps())
    detail, audited = asyncio.run(probe_and_audit())
    assert detail is not None
    verification = detail["verification"]
    assert verification["clean"] is False
    assert verification["found"]["toy"] == [f"{TENANT}/memory/m_toy"]
    assert audited == [(1, [f"{TENANT}/memory/m_toy"])]
