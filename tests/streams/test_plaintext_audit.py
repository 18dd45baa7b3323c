"""``memproj audit plaintext``: a marker planted in every place memproj writes is found there,
against the real PostgreSQL, Kafka and Redis and a real LanceDB table; a sealed copy counts
while its data key exists and not once it is shredded; an unplanted marker is found nowhere."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from redis import Redis
from redis.asyncio import RedisCluster

from projections.cache.keys import TenantKeys
from projections.cache.store import connect as connect_redis
from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.vectors import VectorEntry
from projections.sealing.crypto import new_data_key, parse_master_key
from projections.sealing.fields import EntityRef, seal, sealing_keys
from projections.sealing.keys import KeyStore, shred
from projections.sql import KeyLookups
from streams.audit.openers import OpenerContext, SealedEventOpener
from streams.audit.plaintext import (
    Hit,
    Matcher,
    PlaceKind,
    Report,
    TopicKind,
    TopicRecord,
    record_parts,
    within_window,
)
from streams.audit.postgres import memproj_schemas
from streams.audit.stores import file_holds, namespace_pattern, scan_redis
from streams.cli import cli
from streams.kafka import producer_config
from streams.sample import EventFactory, to_message
from streams.settings import Settings
from support.new_event_type import annotated, register_annotations
from topics.registry import (
    CONVERSATION_REJECTIONS,
    DELETION_ACKS,
    DELETION_REJECTIONS,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_REJECTIONS,
    MEMORY_SEALED,
    output_key,
)

# -- the pure core -------------------------------------------------------------------------

QUOTED = 'mk-"quoted"-é-✓'


def test_the_marker_is_found_in_every_json_spelling() -> None:
    matcher = Matcher.of(QUOTED)
    assert matcher.in_bytes(QUOTED.encode())
    assert matcher.in_bytes(orjson.dumps({"v": QUOTED}))  # \" escapes, UTF-8 as is
    assert matcher.in_bytes(json.dumps({"v": QUOTED}).encode())  # \u00e9 escapes
    assert matcher.in_bytes(json.dumps({"v": QUOTED}).encode().replace(b"\\u00e9", b"\\u00E9"))
    every_char_escaped = '{"v": "' + "".join(f"\\u{ord(c):04x}" for c in QUOTED) + '"}'
    assert not matcher.in_bytes(every_char_escaped.encode())
    assert matcher.in_blob(every_char_escaped.encode())  # parsed, the escapes undone
    assert matcher.in_blob(orjson.dumps({QUOTED: 1}))  # an object key too
    assert not matcher.in_blob(b'{"v": "mk-quoted"}')
    assert matcher.redact(f"key:{QUOTED}:x") == "key:<marker>:x"


def test_an_empty_or_nul_marker_is_refused() -> None:
    for marker in ("", "a\x00b"):
        with pytest.raises(ValueError):
            Matcher.of(marker)


def test_record_parts_and_raw_window() -> None:
    matcher = Matcher.of("mk-1")
    record = TopicRecord("t", 0, 7, 1000, b"a:mk-1", b"{}", (("h", b"x"), ("trace", b"mk-1")))
    assert record_parts(matcher, record, [("opener", b'{"x": "mk-1"}'), ("other", None)]) == [
        "key",
        "header",
        "opened:opener",
    ]
    assert within_window(TopicKind.RAW_INPUT, 1000, 1500, 500) is True
    assert within_window(TopicKind.RAW_INPUT, 1000, 1501, 500) is False
    assert within_window(TopicKind.RAW_INPUT, None, 1501, 500) is False
    assert within_window(TopicKind.SEALED, 1000, 1000, 500) is None


def test_a_marker_in_an_output_keys_escaped_tenant_id_is_found() -> None:
    matcher = Matcher.of("org:mk-2")
    key = output_key("org:mk-2", "m1").encode()  # org%3Amk-2:m1
    assert record_parts(matcher, TopicRecord("t", 0, 1, 1000, key, None)) == ["key"]
    assert record_parts(matcher, TopicRecord("t", 0, 2, 1000, b"org:m1", None)) == []


def test_a_file_is_searched_across_chunk_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * ((1 << 20) - 2) + b"mk-boundary" + b"y" * 10)
    assert file_holds(path, Matcher.of("mk-boundary"))[0]
    assert not file_holds(path, Matcher.of("mk-elsewhere"))[0]


def test_the_exit_status() -> None:
    report = Report(Matcher.of("mk"))
    assert report.exit_status() == 0
    report.add(Hit(PlaceKind.TOPIC, "raw", "0@1", ("value",), within_window=True))
    assert report.exit_status() == 0  # only inside a raw window
    report.add(Hit(PlaceKind.TABLE, "s.t", "id=1", ("details",)))
    assert report.exit_status() == 1
    report.error("topic x", "down")
    assert report.exit_status() == 2


class _LiveKeys:
    """The key store's read: ``key`` for every entity while the keys live, none once shredded."""

    def __init__(self, key: bytes | None) -> None:
        self._key = key

    async def keys(self, conn: object, refs: Iterable[EntityRef]) -> dict[EntityRef, bytes]:
        return {} if self._key is None else dict.fromkeys(refs, self._key)


def test_every_field_the_contract_marks_personal_is_opened_while_its_key_lives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The audit opens what the sealer's table seals, and that table is the marks: a new event
    # type's marked field (memory.annotated's note) is covered with no change to the audit.
    register_annotations(monkeypatch)
    marker = "mk-personal-field"
    f = EventFactory()
    events = [
        f.proposed("acme", "m1", value={"note": marker}),
        f.corrected("acme", "m1", 1, {"note": marker}),
        f.revoked("acme", "m1", f"{marker} asked"),
        f.message("acme", "c1", "x1", "user", f"{marker} said"),
        f.summary("acme", "c1", 1, f"{marker} summed up", ["x1"]),
        annotated("acme", "m1", f"{marker} noted"),
    ]
    key = new_data_key()
    records = [
        TopicRecord("t.sealed", 0, offset, 1000, None, orjson.dumps(seal(event, key)))
        for offset, event in enumerate(events)
    ]
    matcher = Matcher.of(marker)
    assert not any(matcher.in_blob(record.value) for record in records)
    for live_key, readable in ((key, True), (None, False)):
        context = OpenerContext(None, _LiveKeys(live_key), None)  # type: ignore[arg-type]
        opener = SealedEventOpener(context)
        asyncio.run(opener.prepare(records))
        found = [
            record_parts(matcher, record, [(opener.name, opener.open(record))])
            for record in records
        ]
        assert found == [["opened:sealed_fields"] if readable else []] * len(events)


# -- against the real stack ----------------------------------------------------------------


def _audit(
    env: Any, marker: str, *schemas: str, stdin: str | None = None, source: str | None = None
) -> tuple[int, dict[str, Any]]:
    arguments = ["audit", "plaintext", marker, "--json"]
    for schema in schemas:
        arguments += ["--schema", schema]
    if source is not None:
        arguments += ["--source", source]
    environment = env.settings.as_environment()
    result = CliRunner().invoke(cli, arguments, env=environment, input=stdin)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, orjson.loads(result.output)


def _places(found: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["kind"], f["name"]): f for f in found["findings"]}


def _produce(env: Any, topic: str, key: bytes | None, value: bytes | None, **extra: Any) -> None:
    producer = Producer(producer_config(env.settings.kafka_bootstrap))
    producer.produce(topic, value, key, **extra)
    assert producer.flush(30) == 0


def _plant_tables(env: Any, marker: str, replay: str) -> None:
    now = datetime.now(UTC)
    with env.connect() as conn:
        conn.execute(
            "INSERT INTO memories (tenant_id, memory_id, subject_type, subject_id, scope, kind,"
            " value, source_type, source_ref, status, version, observed_at, created_at,"
            " updated_at, last_event_id) VALUES ('acme', 'm1', 'user', 'u1', 'profile',"
            " 'preference', %s, 'message', 'c1/m1', 'proposed', 1, %s, %s, %s, 'e1')",
            (psycopg.types.json.Jsonb({"likes": marker}), now, now, now),
        )
        conn.execute(
            "INSERT INTO outbox (producer, batch_id, topic, key, value)"
            " VALUES ('memory', %s, 'memory.current', %s, %s)",
            (uuid.uuid4(), b"acme:m2", orjson.dumps({"value": {"note": marker}})),
        )
        conn.execute(f"CREATE SCHEMA {replay}")
        # Registered as a rebuild registers its shadow: the env's teardown drops it.
        conn.execute(
            "INSERT INTO rebuild_schemas (schema_name, projection, role)"
            " VALUES (%s, 'memory', 'shadow')",
            (replay,),
        )
        conn.execute(
            f"CREATE TABLE {replay}.rejections (LIKE {env.schema}.rejections INCLUDING DEFAULTS)"
        )
        conn.execute(
            f"INSERT INTO {replay}.rejections (id, projection, tenant_id, entity_id, event_id,"
            ' event_type, reason, details, occurred_at, topic, partition, "offset")'
            " VALUES (41, 'memory', 'acme', 'm3', 'e3', 'memory.proposed', 'erased', %s, %s,"
            " 'memory.events.sealed', 0, 3)",
            (f"value was {marker}", now),
        )


def _plant_topics(env: Any, marker: str) -> None:
    events = EventFactory()
    _produce(env, env.topic(MEMORY_REJECTIONS), b"acme:m4", orjson.dumps({"details": marker}))
    _produce(env, env.topic(MEMORY_CURRENT), f"acme:{marker}".encode(), b"{}")
    _produce(env, env.topic(DELETION_ACKS), b"acme:d1", b"{}", headers=[("trace", marker)])
    escaped = '{"details": "' + "".join(f"\\u{ord(c):04x}" for c in marker) + '"}'
    _produce(env, env.topic(CONVERSATION_REJECTIONS), b"acme:c9", escaped.encode())
    original = orjson.dumps(events.proposed("acme", "m5", value={"secret": marker}))
    letter = {"original": base64.b64encode(original).decode(), "topic": "memory.events"}
    _produce(env, env.topic(MEMORY_EVENTS) + ".dlq", b"acme:m5", orjson.dumps(letter))
    # An aborted transaction's record is still on disk: an auditor reads it too.
    producer = Producer(
        producer_config(env.settings.kafka_bootstrap, **{"transactional.id": uuid.uuid4().hex})
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(env.topic(DELETION_REJECTIONS), orjson.dumps({"d": marker}), b"acme:d2")
    producer.flush(30)
    producer.abort_transaction(30)
    # Raw input, as a producer sends it: readable, but inside the topic's window.
    key, value = to_message(events.proposed("acme", "m6", value={"secret": marker}))
    _produce(env, env.topic(MEMORY_EVENTS), key, value)


def _plant_sealed(env: Any, marker: str) -> tuple[str, str, str]:
    """A memory.proposed sealed with its real data key, on the sealed topic."""
    keys = KeyStore(parse_master_key(env.settings.master_key), KeyLookups())
    ref = ("acme", "memory", "m7")
    event = EventFactory().proposed("acme", "m7", value={"secret": marker})

    async def keys_of(conn: psycopg.AsyncConnection[Any]) -> dict[EntityRef, bytes]:
        found = await keys.keys(conn, sealing_keys(event), create=True)
        await conn.commit()
        return found

    sealed = orjson.dumps(seal(event, env.run(keys_of).get))
    assert marker.encode() not in sealed
    _produce(env, env.topic(MEMORY_SEALED), b"acme:m7", sealed)
    return ref


def _plant_redis_and_files(env: Any, marker: str) -> None:
    namespace = env.settings.cache_namespace
    redis = Redis.from_url(env.settings.redis_url)
    try:
        redis.set(f"{namespace}:cache:acme:context:{marker}", b"[]", ex=600)
        redis.hset(f"{namespace}:cache:acme:recall:q", "body", orjson.dumps({"t": marker}))
        redis.expire(f"{namespace}:cache:acme:recall:q", 600)
    finally:
        redis.close()
    left = env.settings.data_dir / "exports" / "left-over.json"
    left.parent.mkdir(parents=True, exist_ok=True)
    left.write_bytes(json.dumps({"text": marker}).encode())  # \u escapes, as Python writes
    # Enough entries that LanceDB compresses the text column: no byte search finds it there.
    # LanceDB's files, whichever store the workers use: the audit reads every table version.
    model = env.settings.embedder_identity
    store = LanceVectorStore(env.settings.vector_store_path, model.dim, model=model.name)
    now = datetime.now(UTC)
    store.upsert(
        [
            VectorEntry(
                id=f"e{i}",
                kind="memory",
                tenant_id="acme",
                subject_type="user",
                subject_id="u1",
                memory_id=f"m{i}",
                conversation_id=None,
                message_id=None,
                source_type="message",
                source_ref="c1/m1",
                text=f"entry {i} holds nothing much " * 10 + (marker if i == 1234 else ""),
                version=1,
                occurred_at=now,
                vector=(0.5,) * store.dim,
                memory_kind="preference",
                scope="user",
            )
            for i in range(5000)
        ]
    )


@pytest.mark.integration
def test_a_planted_marker_is_found_everywhere_and_a_shredded_one_nowhere(env: Any) -> None:
    marker = f'audit-{uuid.uuid4().hex[:12]}-"é'
    replay = f"replay_memory_{env.schema}"
    _plant_tables(env, marker, replay)
    _plant_topics(env, marker)
    ref = _plant_sealed(env, marker)
    _plant_redis_and_files(env, marker)

    schemas = asyncio.run(_schemas(env))
    assert schemas[0] == env.schema and replay in schemas  # found without being named

    status, found = _audit(env, marker, env.schema, replay)
    print("\nscan of the test's data:", found["scanned"])
    assert status == 1 and found["errors"] == []
    places = _places(found)
    topic = env.topic
    expected = {
        ("table", f"{env.schema}.memories"): ["value"],
        ("table", f"{env.schema}.outbox"): ["value"],
        ("table", f"{replay}.rejections"): ["details"],
        ("topic", topic(MEMORY_REJECTIONS)): ["value"],
        ("topic", topic(MEMORY_CURRENT)): ["key"],
        ("topic", topic(DELETION_ACKS)): ["header"],
        ("topic", topic(DELETION_REJECTIONS)): ["value"],  # aborted
        ("topic", topic(CONVERSATION_REJECTIONS)): ["value"],
        ("topic", topic(MEMORY_EVENTS) + ".dlq"): ["opened:dead_letter_original"],
        ("topic", topic(MEMORY_EVENTS)): ["value"],
        ("topic", topic(MEMORY_SEALED)): ["opened:sealed_fields"],
        ("redis", namespace_pattern(env.settings.cache_namespace)): ["key", "value"],
        ("file", str(env.settings.data_dir)): ["bytes"],
        ("lance", "lancedb/embeddings.lance"): ["text"],
    }
    for place, parts in expected.items():
        assert place in places, (place, sorted(places))
        assert places[place]["found_in"] == parts, (place, places[place])
    assert places[("table", f"{env.schema}.memories")]["examples"] == [
        "tenant_id=acme, memory_id=m1"
    ]
    assert places[("table", f"{replay}.rejections")]["examples"] == ["ctid=(0,1)"]  # no key
    # v1: the empty table; v2 the upsert; after it the versions of its scalar indexes, which
    # hold the same data files.
    lance_examples = places[("lance", "lancedb/embeddings.lance")]["examples"]
    assert lance_examples[0] == "v2 id=e1234", lance_examples
    assert all(example.endswith(" id=e1234") for example in lance_examples), lance_examples
    assert places[("file", str(env.settings.data_dir))]["examples"] == ["exports/left-over.json"]
    assert places[("topic", topic(MEMORY_EVENTS))]["within_window"] is True
    assert places[("topic", topic(MEMORY_SEALED))]["within_window"] is None
    assert marker not in orjson.dumps(found).decode()  # ids and offsets, never the marker

    # Shredding the data key makes the sealed copy unreadable: no longer found.
    async def shred_key(conn: psycopg.AsyncConnection[Any]) -> None:
        await shred(conn, [ref], "del-1", KeyLookups())
        await conn.commit()

    env.run(shred_key)
    status, found = _audit(env, marker, env.schema, replay)
    assert status == 1
    assert ("topic", topic(MEMORY_SEALED)) not in _places(found)

    # A marker that is only in a raw input topic, inside its window, is allowed: exit 0.
    raw_only = f"raw-only-{uuid.uuid4().hex}"
    raw_event = EventFactory("raw").proposed("acme", "m8", value={"x": raw_only})
    _produce(env, topic(MEMORY_EVENTS), *to_message(raw_event))
    status, found = _audit(env, raw_only, env.schema, replay)
    assert status == 0, found
    assert [(f["name"], f["within_window"]) for f in found["findings"]] == [
        (topic(MEMORY_EVENTS), True)
    ]

    # Read from standard input, it stays out of the process list.
    unplanted = f"never-planted-{uuid.uuid4().hex}\n"
    status, found = _audit(env, "-", env.schema, replay, stdin=unplanted)
    assert (status, found["findings"], found["errors"]) == (0, [], [])


async def _schemas(env: Any) -> list[str]:
    async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
        return await memproj_schemas(conn)


@pytest.mark.integration
def test_a_table_dropped_during_the_audit_is_skipped_not_an_error(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild copy the deletion worker drops while the audit runs: the catalog named it,
    the scan finds it gone, and nothing is readable there, so the audit reports no error."""
    from streams.audit import postgres

    gone = postgres.TableShape(
        env.schema, f"dropped_{uuid.uuid4().hex[:8]}", (postgres.Column("id", False),), ("id",)
    )
    monkeypatch.setattr(postgres, "table_shapes", lambda *_: _async_value([gone]))

    async def run() -> Report:
        report = Report(Matcher.of(f"marker-{uuid.uuid4().hex}"))
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            await postgres.scan_postgres(conn, report.matcher, report, only=[env.schema])
        return report

    assert asyncio.run(run()).errors == []


async def _async_value(value: Any) -> Any:
    return value


@pytest.mark.integration
def test_dead_tuples_are_read_until_a_vacuum_removes_them(env: Any) -> None:
    """A deleted row and a row's superseded version stay on the table's pages until a vacuum:
    the audit reads them there (pg_dirtyread), and not once they are vacuumed."""
    marker = f"dead-{uuid.uuid4().hex}"
    _plant_tables(env, marker, f"replay_memory_{env.schema}")
    with env.connect() as conn:
        conn.execute("DELETE FROM outbox")
        conn.execute("UPDATE memories SET value = '{\"likes\": \"tea\"}' WHERE memory_id = 'm1'")
    status, found = _audit(env, marker, env.schema, source="postgres")
    assert status == 1 and found["errors"] == [], found
    places = _places(found)
    assert ("table", f"{env.schema}.memories") not in places  # the live row holds no marker
    dead = places[("dead_tuples", f"{env.schema}.memories")]
    assert (dead["count"], dead["found_in"], dead["examples"]) == (
        1,
        ["value"],
        ["tenant_id=acme, memory_id=m1"],
    )
    assert places[("dead_tuples", f"{env.schema}.outbox")]["found_in"] == ["value"]

    with env.connect() as conn:
        conn.autocommit = True
        env.wait_vacuum_horizon()
        conn.execute("VACUUM (FREEZE, INDEX_CLEANUP ON) memories, outbox")
    status, found = _audit(env, marker, env.schema, source="postgres")
    assert (status, found["findings"], found["errors"]) == (0, [], []), found


@pytest.mark.integration
def test_without_pg_dirtyread_the_audit_says_it_could_not_look_at_dead_tuples(env: Any) -> None:
    """A database without the extension: an incomplete look, exit 2."""
    database = f"nodirty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(env.settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        dsn = psycopg.conninfo.make_conninfo(env.settings.postgres_dsn, dbname=database)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.schema_migrations (version integer PRIMARY KEY)")
        environment = {**env.settings.as_environment(), "MEMPROJ_POSTGRES_DSN": dsn}
        result = CliRunner().invoke(
            cli,
            ["audit", "plaintext", "--json", "--source", "postgres", f"m-{uuid.uuid4().hex}"],
            env=environment,
        )
        assert result.exit_code == 2, result.output
        errors = orjson.loads(result.output)["errors"]
        assert any("could not look at dead tuples" in error for error in errors), errors
    finally:
        with psycopg.connect(env.settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database} WITH (FORCE)")


@pytest.mark.integration
def test_the_redis_audit_reads_every_master_of_a_cluster(
    redis_cluster: Settings, redis_cluster_namespace: str
) -> None:
    """On a Redis Cluster the audit's SCAN walks each master: a marker is found in the keys of
    tenants whose slots are on all three, of every type the audit reads."""
    marker, tenants = f"mk-{uuid.uuid4().hex}", [f"t-{n}" for n in range(9)]

    async def main() -> tuple[Report, set[str]]:
        client = connect_redis(redis_cluster.redis_url, cluster=True)
        assert isinstance(client, RedisCluster)
        try:
            masters = set()
            for n, tenant in enumerate(tenants):
                keys = TenantKeys(redis_cluster_namespace, tenant)
                key = keys.recall(("user", "u1"), "q")
                if n % 3 == 0:
                    await client.set(key, orjson.dumps({"text": marker}), ex=600)
                elif n % 3 == 1:
                    await client.hset(key, "body", orjson.dumps({"text": marker}))
                else:
                    await client.sadd(keys.memory_index(marker), key)
                await client.set(keys.context("clean"), b"{}", ex=600)
                node = client.get_node_from_key(key)
                assert node is not None
                masters.add(node.name)
            report = Report(Matcher.of(marker))
            await scan_redis(client, redis_cluster_namespace, report.matcher, report)
            return report, masters
        finally:
            await client.aclose()

    report, masters = asyncio.run(main())
    assert len(masters) == 3
    assert report.errors == []
    assert report.scanned["redis"].items == 2 * len(tenants)
    (finding,) = report.findings.values()
    assert finding.count == len(tenants)
