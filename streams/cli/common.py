"""Helpers shared by the subcommands: settings from the context, JSON output, DB access."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import click
import orjson
import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from projections.access.pauses import SubjectPaused
from projections.migrate import migrate
from projections.sql import Conn
from streams.kafka import producer_config
from streams.settings import Settings
from topics.registry import TopicSpec

T = TypeVar("T")
P = ParamSpec("P")

# How long a command waits for a broker to answer at all; a refusal is named within seconds.
KAFKA_CHECK_TIMEOUT_SECONDS = 20.0


def settings_of(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def echo_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def with_connection(settings: Settings, work: Callable[[Conn], Awaitable[T]]) -> T:
    async def run() -> T:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            return await work(conn)

    return asyncio.run(run())


def paused_refusal(paused: SubjectPaused) -> click.ClickException:
    """A read of a paused subject, as a command says it (exit 1, one line)."""
    return click.ClickException(
        f"{paused.message} (subject_paused); memproj subject resume --tenant {paused.tenant_id}"
        f" --subject-type {paused.subject_type} --subject-id {paused.subject_id} serves it again"
    )


def with_migrated(settings: Settings, work: Callable[[Conn], Awaitable[T]]) -> T:
    """Runs ``work`` on a connection to a schema migrated up to date (for the tables an
    operator's command writes before any worker has started), committing what it does."""

    async def run() -> T:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            await migrate(conn)
            async with conn.transaction():
                return await work(conn)

    return asyncio.run(run())


def check_kafka(settings: Settings, group: str | None = None) -> None:
    """The workers' startup check (``KafkaCluster.check_connection``), for a command: a
    wrong password, an untrusted CA or a missing ACL (on ``group`` too, if given) raises
    ``KafkaSecurityError`` within seconds, no answer ``KafkaUnreachable``; ``main`` prints
    either as one line naming the broker and the cause."""
    settings.kafka.check_connection(KAFKA_CHECK_TIMEOUT_SECONDS, group)


def talks_to_kafka(
    group_of: Callable[[Settings, dict[str, Any]], str] | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """For a command that talks to Kafka: ``check_kafka`` before it runs (with the consumer
    group ``group_of(settings, params)`` names), and any Kafka error it raises later as the
    same one line (``KafkaCluster.unavailable``) instead of a traceback."""

    def decorate(command: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(command)
        def checked(*args: P.args, **kwargs: P.kwargs) -> T:
            ctx = click.get_current_context()
            settings = settings_of(ctx)
            check_kafka(settings, None if group_of is None else group_of(settings, ctx.params))
            try:
                return command(*args, **kwargs)
            except KafkaException as exc:
                raise settings.kafka.unavailable(exc) from None

        checked.talks_to_kafka = True  # type: ignore[attr-defined]  # (tests list them)
        return checked

    return decorate


def publish(settings: Settings, spec: TopicSpec, key: bytes, value: bytes, what: str) -> None:
    """One message of an operator's command, delivered before the command goes on: not
    delivered within 30 s is an error naming ``what``, and a broker's refusal (an ACL on the
    topic, say) the one line ``KafkaCluster.unavailable`` names."""
    refused: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            refused.append(error)

    producer = Producer(producer_config(settings.kafka))
    producer.produce(settings.topics.name(spec), value, key, on_delivery=on_delivery)
    if producer.flush(30):
        raise click.ClickException(f"{what} was not delivered to Kafka")
    if refused:
        raise settings.kafka.unavailable(refused[0])
