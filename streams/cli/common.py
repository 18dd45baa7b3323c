"""Helpers shared by the subcommands: settings from the context, JSON output, DB access."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import orjson
import psycopg

from projections.bookkeeping import Conn
from streams.settings import Settings

T = TypeVar("T")


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
