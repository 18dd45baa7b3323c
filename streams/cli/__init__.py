"""The ``memproj`` command: one entry point, one subcommand group per concern."""

from __future__ import annotations

import click

from streams.cli.conversation import conversation
from streams.cli.deletion import delete, deletion
from streams.cli.demo import demo
from streams.cli.deployment import deploy
from streams.cli.dlq import dlq
from streams.cli.memory import memory, recall
from streams.cli.observe import audit, top
from streams.cli.operations import db, topics, worker
from streams.cli.replay import offsets, replay
from streams.settings import Settings


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """memproj: Kafka stream processor for AI-agent memory.

    Configuration comes from MEMPROJ_* environment variables (see README).
    """
    ctx.obj = Settings()


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
):
    cli.add_command(command)


def main() -> None:
    cli()
