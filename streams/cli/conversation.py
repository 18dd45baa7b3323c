"""Reading the conversation projection: messages, summaries with sources, the context view,
and the memories derived from a conversation."""

from __future__ import annotations

from typing import Any

import click

from projections.access.pauses import SubjectPaused
from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.conversation import store
from projections.memory import store as memory_store
from projections.sql import Conn
from streams import reads
from streams.cli.common import echo_json, paused_refusal, settings_of, with_connection


@click.group()
def conversation() -> None:
    """One conversation: messages, summaries, context view, derived memories."""


@conversation.command("show")
@click.option("--tenant", required=True)
@click.option("--conversation", "conversation_id", required=True)
@click.option("--context", is_flag=True, help="show the model-ready context view instead")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def conversation_show(
    ctx: click.Context, tenant: str, conversation_id: str, context: bool, as_json: bool
) -> None:
    """Messages in order and summaries with their sources, or (--context) the context view."""

    settings = settings_of(ctx)

    async def load(conn: Conn) -> dict[str, Any] | None:
        if context:
            redis = connect_redis(settings.redis_url, settings.redis_cluster)
            try:
                cache = RedisCache(redis, settings.cache_ttl_seconds, settings.cache_namespace)
                return await reads.context_view(conn, cache, tenant, conversation_id)
            finally:
                await redis.aclose()
        detail = await store.load_conversation(conn, tenant, conversation_id)
        return detail.to_json() if detail is not None else None

    try:
        shown = with_connection(settings, load)
    except SubjectPaused as paused:
        raise paused_refusal(paused) from None
    if shown is None:
        raise click.ClickException(f"no conversation {conversation_id!r} for tenant {tenant!r}")
    if as_json:
        echo_json(shown)
    elif context:
        click.echo(
            f"context view: ~{shown['token_estimate']} of {shown['budget_tokens']} tokens, "
            f"{shown['dropped_units']} units dropped, "
            f"{shown['omitted_tool_results']} tool results omitted"
        )
        for item in shown["items"]:
            click.echo(f"  {item['role']:9} {_brief(item['content'])}")
    else:
        record = shown["conversation"]
        click.echo(
            f"{conversation_id}: owner {record['owner_type']}:{record['owner_id']}, "
            f"channel {record['channel']}, {record['message_count']} messages"
        )
        for message in shown["messages"]:
            redacted = f" (redacted {message['redactions']})" if message["redactions"] else ""
            click.echo(
                f"  #{message['seq']:<3} {message['role']:9} {_brief(message['content'])}{redacted}"
            )
        for summary in shown["summaries"]:
            sources = ", ".join(s["message_id"] for s in summary["sources"])
            click.echo(
                f"  summary v{summary['summary_version']} from [{sources}]: {summary['text']}"
            )


def _brief(content: list[dict[str, Any]]) -> str:
    parts = []
    for block in content:
        if block["type"] == "text":
            parts.append(block["text"])
        elif block["type"] == "tool_use":
            parts.append(f"<tool_use {block['name']} {block['id']}>")
        else:
            parts.append(f"<tool_result {block['tool_use_id']}>")
    text = " ".join(parts)
    return text if len(text) <= 100 else text[:97] + "..."


@conversation.command("memories")
@click.option("--tenant", required=True)
@click.option("--conversation", "conversation_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def conversation_memories(
    ctx: click.Context, tenant: str, conversation_id: str, as_json: bool
) -> None:
    """Memories whose source is a message of this conversation (any status)."""
    records = with_connection(
        settings_of(ctx),
        lambda conn: memory_store.memories_from_conversation(conn, tenant, conversation_id),
    )
    if as_json:
        echo_json([r.model_dump(mode="json") for r in records])
        return
    for record in records:
        click.echo(f"{record.memory_id:16} {record.status:9} {record.source.ref:24} {record.value}")
