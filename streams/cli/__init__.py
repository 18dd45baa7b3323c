"""The ``memproj`` command: one entry point, one subcommand group per concern."""

from __future__ import annotations

import click
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from streams.cli.conversation import conversation
from streams.cli.deletion import delete, deletion
from streams.cli.demo import demo
from streams.cli.deployment import deploy
from streams.cli.dlq import dlq
from streams.cli.keys import keys
from streams.cli.memory import memory, recall
from streams.cli.observe import audit, top
from streams.cli.operations import db, topics, worker
from streams.cli.replay import offsets, replay
from streams.cli.serve import serve
from streams.kafka_security import KafkaSecurityError
from streams.settings import DevelopmentKeyRefused, Settings


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """memproj: Kafka stream processor for AI-agent memory.

    Configuration comes from MEMPROJ_* environment variables (see README).
    """
    try:
        ctx.obj = Settings()
    except ValidationError as exc:  # the errors name settings, never values (secrets)
        problems = "; ".join(
            f"{error['msg']} ({'.'.join(map(str, error['loc']))})".replace(" ()", "")
            for error in exc.errors()
        )
        raise click.ClickException(f"configuration: {problems}") from None


for command in (
    topics,
    db,
    worker,
    recall,
    memory,
    conversation,
    delete,
    deletion,
    audit,
    top,
    replay,
    offsets,
    demo,
    dlq,
    deploy,
    keys,
    serve,
):
    cli.add_command(command)


# Broker refusals a command cannot retry away: one line naming the cause, not a traceback.
_REFUSED = frozenset(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    }
)


def main() -> None:
    try:
        cli()
    except (DevelopmentKeyRefused, KafkaSecurityError) as exc:
        raise SystemExit(f"memproj: {exc}") from None
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is None or error.code() not in _REFUSED:
            raise
        raise SystemExit(
            f"memproj: Kafka refused the request ({error.name()}: {error.str()}):"
            " check the principal's credentials and ACLs"
        ) from None
