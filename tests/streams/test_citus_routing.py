"""Every statement memproj runs can be routed by Citus to one tenant's shard: a scenario of the
workers, the CLI and the API over two tenants, recorded by pg_stat_statements and checked
statement by statement against projections.distribution (tests/support/routing.py).

Also on the migrated schema: every distributed table's primary key starts with tenant_id and
every unique index holds it, as Citus requires of a table sharded by it, and the distribution
script runs on it (Citus's functions stood in for, since Citus cannot be installed here)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from click.testing import CliRunner

from projections.access.proposals import DELETE, PROPOSE
from projections.admission import store as admission_store
from projections.bookkeeping import load_seen
from projections.conversation import store as conversation_store
from projections.conversation.context import ContextSettings
from projections.deletion import guard as erasure_guard
from projections.deletion import lifecycle
from projections.distribution import CROSS_TENANT, Placement, citus_sql, placed
from projections.memory import store as memory_store
from projections.retention import classes as retention_classes
from projections.sealing.keys import ever_shredded
from projections.sql import KeyLookups
from streams.cli import cli
from streams.sample import EventFactory
from streams.settings import Settings
from support.api_server import serving
from support.deletion_scenario import ALICE, BOB, recent_factory
from support.environment import Env, settings_environment
from support.routing import judge
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration

TENANTS = ("acme", "globex")


TOOL_USE = {"type": "tool_use", "id": "tu_1", "name": "search", "input": {"q": "safe"}}


def scenario(env: Env, f: EventFactory) -> None:
    """Two tenants' memories and conversations through the workers, reads and a deletion
    through the API, an operator's look through the CLI."""
    env.start("memory", "conversation", "deletion")
    for tenant in TENANTS:
        env.produce_events(
            [
                f.started(tenant, "c1", ALICE),
                f.message(tenant, "c1", "m1", "user", "I am allergic to peanuts"),
                f.message(tenant, "c1", "m2", "assistant", "Noted."),
                f.summary(tenant, "c1", 1, "Allergic to peanuts.", ["m1", "m2"]),
                f.message(tenant, "c1", "m3", "user", "which restaurants are safe?"),
                f.message(tenant, "c1", "m4", "assistant", [TOOL_USE]),
            ],
            CONVERSATION_EVENTS,
        )
        env.produce_events(
            [
                f.proposed(tenant, "mem_a", ALICE, {"text": "allergic to peanuts"}),
                f.proposed(tenant, "mem_b", BOB, {"text": "plays tennis"}),
                f.revoked(tenant, "mem_b", "wrong"),
            ],
            MEMORY_EVENTS,
        )
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    # The tool's results in a later batch: the context rebuild looks up the tool_use they
    # answer (``tool_use_seqs``).
    for tenant in TENANTS:
        answer = {"type": "tool_result", "tool_use_id": TOOL_USE["id"], "content": "two"}
        env.produce_events([f.message(tenant, "c1", "m5", "user", [answer])], CONVERSATION_EVENTS)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    with serving(env) as api:
        api.set_purpose("acme", "support", conversations=True)
        key = api.create_key("acme", [PROPOSE, DELETE, "support"], actor="agent:support_agent")
        with api.client(key.token) as client:
            recall = client.get(
                f"/v1/subjects/{ALICE[0]}/{ALICE[1]}/memories", params={"purpose": "support"}
            )
            assert recall.status_code == 200, recall.text
            event = f.proposed("acme", "mem_c", ALICE, {"text": "likes tea"})
            assert client.post("/v1/memory-events", json=event).status_code == 202
            deletion = client.post(
                "/v1/deletions",
                json={
                    "target": {"type": "subject", "id": BOB[1], "subject_type": BOB[0]},
                    "reason": "asked to be forgotten",
                },
            )
            assert deletion.status_code == 202, deletion.text
            status_url = deletion.json()["status_url"]

            def recorded() -> bool:
                return bool(client.get(status_url).status_code == 200)

            env.wait_until(recorded, "the deletion recorded")
    environment = settings_environment(env.settings)
    for command in (
        ["memory", "show", "--tenant", "acme", "--memory-id", "mem_a", "--history"],
        ["conversation", "show", "--tenant", "globex", "--conversation", "c1"],
        ["subject", "pause", "--tenant", "globex", "--subject", "user:alice", "--reason", "x"],
        ["subject", "resume", "--tenant", "globex", "--subject", "user:alice", "--reason", "y"],
        ["recall", "--tenant", "acme", "--subject", "user:alice"],
        ["retention", "set", "--tenant", "acme", "--class", "*", "--period", "90d"],
        ["retention", "report", "--tenant", "acme"],
        ["hold", "add", "--tenant", "acme", "--subject", "user:alice", "--reason", "litigation"],
        ["hold", "list", "--tenant", "acme"],
        ["deletion", "list", "--tenant", "acme"],
        ["keys", "status"],
    ):
        result = CliRunner().invoke(cli, command, env=environment)
        assert result.exit_code == 0, f"{command}: {result.output}"


@pytest.fixture
def own_role(stack: Settings) -> Iterator[str]:
    """A PostgreSQL role of the test's own: pg_stat_statements records who ran a statement,
    and other tests of the session (in other processes) run theirs on the same server at the
    same time. Set up before ``env`` and so dropped after its workers have stopped."""
    role = f"routing_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")  # the stack trusts loopback
    try:
        yield role
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def as_role(env: Env, role: str) -> None:
    """The env's workers, CLI and API connect as ``role`` from now on."""
    dsn = urlsplit(env.settings.postgres_dsn)
    netloc = f"{role}@{dsn.netloc.rpartition('@')[2]}"
    env.settings = env.settings.model_copy(
        update={"postgres_dsn": urlunsplit(dsn._replace(netloc=netloc)), "postgres_password": None}
    )


def recorded_statements(env: Env, role: str) -> list[tuple[str, int]]:
    with psycopg.connect(env.settings.postgres_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.query, s.calls::int FROM public.pg_stat_statements s"
            " JOIN pg_database d ON d.oid = s.dbid JOIN pg_roles r ON r.oid = s.userid"
            " WHERE d.datname = current_database() AND r.rolname = %s",
            (role,),
        ).fetchall()
    return [(str(query), int(calls)) for query, calls in rows]


def reset_statements(env: Env) -> None:
    with psycopg.connect(env.settings.postgres_dsn, autocommit=True) as conn:
        preloaded = conn.execute("SHOW shared_preload_libraries").fetchone()
        assert preloaded and "pg_stat_statements" in str(preloaded[0]), (
            "PostgreSQL runs without pg_stat_statements: ops/stack up restarts it with it"
        )
        conn.execute("SELECT public.pg_stat_statements_reset()")


def test_every_statement_of_the_workers_the_cli_and_the_api_is_routable(
    own_role: str, env: Env
) -> None:
    # As deployed on Citus: a batch's keys looked up by one statement per tenant.
    env.settings = env.settings.model_copy(update={"lookups_per_tenant": True})
    as_role(env, own_role)
    reset_statements(env)
    scenario(env, recent_factory())
    statements = recorded_statements(env, own_role)
    verdicts = [judge(query) for query, _ in statements]
    unroutable = [f"{v.problems}\n    {v.query}" for v in verdicts if not v.routable]
    assert unroutable == [], "statements Citus cannot route to one tenant:\n" + "\n".join(
        unroutable
    )
    # The scenario did reach the tenant tables (not an empty pass).
    routed = " ".join(v.query for v in verdicts if v.cross_tenant is None)
    for table in ("memories", "conversation_messages", "deletion_requests", "api_read_audit"):
        assert table in routed, f"the scenario ran no statement on {table}"
    assert "conversation_tool_use_keys" in routed, "the scenario looked up no earlier tool_use"
    assert {v.cross_tenant for v in verdicts} - {None} <= set(CROSS_TENANT)
    batched = sorted({f"{v.batch}: {v.query}" for v in verdicts if v.batch})
    assert batched == [], "statements of several tenants' keys:\n" + "\n".join(batched)
    assert_lookups_agree(env)


def assert_lookups_agree(env: Env) -> None:
    """Every batch lookup finds the same rows, one statement per tenant or one for all: asked
    for the scenario's keys of both tenants (and keys of a tenant that has none)."""

    async def compare() -> None:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            # One snapshot for both (the workers still run); each rebuild of the context
            # views rolled back.
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            async with conn.transaction():
                async with conn.transaction(force_rollback=True):
                    both = await lookups_of_every_store(conn, KeyLookups(per_tenant=False))
                async with conn.transaction(force_rollback=True):
                    each = await lookups_of_every_store(conn, KeyLookups(per_tenant=True))
        assert each == both
        for name in ("records", "messages", "deletions", "seen", "tool_uses"):
            assert {key[0] for key in both[name]} == set(TENANTS), name

    asyncio.run(compare())


async def lookups_of_every_store(
    conn: psycopg.AsyncConnection[Any], lookups: KeyLookups
) -> dict[str, Any]:
    async def keys(table: str, *columns: str) -> list[Any]:
        cursor = await conn.execute(f"SELECT tenant_id, {', '.join(columns)} FROM {table}")
        rows = [tuple(map(str, row)) for row in await cursor.fetchall()]
        return [*rows, ("nobody", *columns)]

    memories = await keys("memories", "memory_id")
    conversations = await keys("conversations", "conversation_id")
    messages = await keys("conversation_messages", "conversation_id", "message_id")
    deletions = await keys("deletion_requests", "deletion_id")
    erasures = await keys("erased_entities", "entity_type", "subject_type", "entity_id")
    events = await keys("processed_events", "event_id")
    entities = await keys("entity_keys", "entity_type", "entity_id")
    tenants = [*TENANTS, "nobody"]
    records = await memory_store.load_records(conn, memories, lookups)
    return {
        "records": records,
        "heads": await memory_store.load_heads(conn, records, lookups),
        "evidence": await memory_store.evidence_of(conn, memories, lookups),
        "versions": await memory_store.held_versions(conn, memories, lookups),
        "messages": await conversation_store.held_messages(conn, messages, lookups),
        "tool_uses": await conversation_store.tool_use_seqs(
            conn, {(tenant, "c1"): {str(TOOL_USE["id"]), "tu_none"} for tenant in tenants}, lookups
        ),
        "context": [
            await conversation_store.rebuild_context(
                conn, conversations, ContextSettings(), lookups
            )
        ],
        "deletions": await lifecycle.load_states(conn, deletions, lookups),
        "purges": await lifecycle.purge_times(conn, deletions, lookups),
        "erasures": (await erasure_guard.read_erasures(conn, erasures, lookups)).rows,
        "seen": await load_seen(conn, "memory", events, lookups),
        "shredded": await ever_shredded(conn, entities, lookups),
        "policies": await admission_store.current_versions(conn, tenants, lookups),
        "retention": await retention_classes.policies(conn, tenants, None, lookups),
    }


def test_distributed_tables_have_tenant_first_keys_and_tenant_unique_indexes(env: Env) -> None:
    with env.connect() as conn:
        rows = conn.execute(
            "SELECT c.relname, i.indisprimary,"
            " array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
            "       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            "       ORDER BY k.n)::text[]"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE c.relnamespace = current_schema()::regnamespace AND i.indisunique"
        ).fetchall()
    keys: dict[str, list[str]] = {}
    wrong = []
    for table, primary, columns in rows:
        if table not in placed(Placement.DISTRIBUTED):
            continue
        if primary:
            keys[table] = columns
        if "tenant_id" not in columns:
            wrong.append(f"{table}: unique ({', '.join(columns)}) without tenant_id")
    for table in placed(Placement.DISTRIBUTED):
        if keys.get(table, [""])[0] != "tenant_id":
            wrong.append(f"{table}: primary key {keys.get(table)} does not start with tenant_id")
    assert wrong == []


def test_the_distribution_script_runs_on_the_migrated_schema(env: Env) -> None:
    """Citus's catalog and functions stood in for by a table and two recording functions:
    the script names only tables that exist, distributes each once, and a second run (after a
    migration that adds none) changes nothing."""
    stand_in = (
        "CREATE TABLE pg_dist_partition (logicalrelid regclass PRIMARY KEY, call text);"
        "CREATE FUNCTION create_distributed_table(t regclass, col text, colocate_with text"
        " DEFAULT 'default') RETURNS void LANGUAGE sql AS"
        " $$ INSERT INTO pg_dist_partition VALUES (t, 'distributed ' || col || ' ' ||"
        " colocate_with) $$;"
        "CREATE FUNCTION create_reference_table(t regclass) RETURNS void LANGUAGE sql AS"
        " $$ INSERT INTO pg_dist_partition VALUES (t, 'reference') $$;"
    )
    script = citus_sql().replace("CREATE EXTENSION IF NOT EXISTS citus;\n", "")
    with env.connect() as conn:
        conn.execute(stand_in)
        conn.execute(script)
        conn.execute(script)
        calls: dict[str, Any] = dict(
            conn.execute("SELECT logicalrelid::text, call FROM pg_dist_partition").fetchall()
        )
    assert calls["memories"] == "distributed tenant_id default"
    for table in placed(Placement.DISTRIBUTED):
        if table != "memories":
            assert calls[table] == "distributed tenant_id memories", table
    for table in placed(Placement.REFERENCE):
        assert calls[table] == "reference"
    assert not set(calls) & set(placed(Placement.COORDINATOR))
