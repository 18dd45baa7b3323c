"""``memproj demo clean`` and ``memproj demo review`` against the real broker and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.cli import cli
from streams.kafka import admin_config, consumer_config
from streams.settings import Settings
from support.environment import settings_environment

pytestmark = pytest.mark.integration


def make_run(settings: Settings, run: str) -> None:
    """What a demo run leaves behind: a topic, a consumer group with offsets, a schema."""
    admin = AdminClient(admin_config(settings.kafka_bootstrap))
    for creation in admin.create_topics([NewTopic(f"{run}.memory.events", 1, 1)]).values():
        creation.result(timeout=30)
    consumer = Consumer(
        consumer_config(settings.kafka_bootstrap, **{"group.id": f"memproj-{run}-memory"})
    )
    consumer.commit(offsets=[TopicPartition(f"{run}.memory.events", 0, 0)], asynchronous=False)
    consumer.close()
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {run}")


def left_of(settings: Settings, run: str) -> set[str]:
    admin = AdminClient(admin_config(settings.kafka_bootstrap))
    left = set()
    if f"{run}.memory.events" in admin.list_topics(timeout=30).topics:
        left.add("topic")
    groups = admin.list_consumer_groups().result(timeout=30).valid
    if f"memproj-{run}-memory" in {group.group_id for group in groups}:
        left.add("group")
    with psycopg.connect(settings.postgres_dsn) as conn:
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (run,)).fetchone():
            left.add("schema")
    return left


def test_demo_clean_removes_only_the_runs_older_than_the_current_one(stack: Settings) -> None:
    # Run names far below any real run's unix time, so that a developer's demo runs on the
    # same stack are newer than "current" and left alone.
    base = int(uuid.uuid4().int % 10**6) * 10
    older, current, newer = (f"demo{base + offset}" for offset in (1, 2, 3))
    make_run(stack, older)
    make_run(stack, newer)
    try:
        result = CliRunner().invoke(cli, ["demo", "clean", "--before", current])
        assert result.exit_code == 0, result.output
        assert left_of(stack, older) == set()
        assert left_of(stack, newer) == {"topic", "group", "schema"}
        refused = CliRunner().invoke(cli, ["demo", "clean", "--before", "latest"])
        assert refused.exit_code != 0 and "not a demo run name" in refused.output
    finally:
        CliRunner().invoke(cli, ["demo", "clean", "--before", f"demo{base + 4}"])


def test_the_review_demo_holds_shows_approves_and_serves(env: Any) -> None:
    env.worker("conversation")
    env.worker()
    result = CliRunner().invoke(
        cli, ["demo", "review", "--tenant", "acme"], env=settings_environment(env.settings)
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "policy v1 of acme" in out
    assert "held for review by policy:risk (policy v1)" in out
    assert "+ proposed: {'text': 'disputes the March charge with their bank'}" in out
    assert "- served:   nothing (never served)" in out
    assert "user: I am disputing the March charge with my bank" in out
    assert "approved v1 as operator:demo_reviewer" in out
    assert "v2 proposed {'text': 'disputes the March charge with their bank'}" in out
