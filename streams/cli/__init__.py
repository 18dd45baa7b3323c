"""The ``memproj`` command: one entry point, one subcommand group per concern."""

from __future__ import annotations

import click
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
from streams.cli.policy import policy
from streams.cli.replay import offsets, replay
from streams.cli.retention import hold, retention
from streams.cli.review import review
from streams.cli.serve import serve
from streams.cli.subject import subject
from streams.kafka_security import KafkaUnavailable
from streams.logs import install as install_content_free_logging
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
    subject,
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
    policy,
    retention,
    hold,
    review,
):
    cli.add_command(command)


def main() -> None:
    install_content_free_logging()
    try:
        cli()
    except (DevelopmentKeyRefused, KafkaUnavailable) as exc:
        # One line naming the cause (and for Kafka the broker), never a traceback.
        raise SystemExit(f"memproj: {exc}") from None
