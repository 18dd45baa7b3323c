"""The plans of the earlier-tool-use lookup (``conversation.store.tool_use_seqs``), as one
statement for several tenants and as one tenant's statement.

    .venv/bin/python ops/bench/tool_use_plans.py [--messages 200000] [--json PATH]

In a schema of its own on the stack's PostgreSQL (``MEMPROJ_POSTGRES_DSN``), migrated, then
``--messages`` messages that each hold one tool_use, half of them of one large tenant and the
rest spread over 199 others, then ``VACUUM ANALYZE``. Looked up: 100 ids of 51 tenants in one
statement, and 50 ids of the large tenant in its own, each with ``EXPLAIN ANALYZE``: the plan's
scans and the execution time. The schema is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
from environment import print_and_save  # ops/bench/environment.py, beside this script

from projections.conversation.store import tool_use_seqs
from projections.migrate import migrate
from projections.sql import KeyLookups


def tenant_of(i: int) -> str:
    return "big" if i % 2 == 0 else f"t{i % 200}"


async def explained(conn: psycopg.AsyncConnection[Any], keys: list[list[str]]) -> dict[str, Any]:
    """The lookup of ``keys``, its statement's plan as PostgreSQL's ``auto_explain`` reports it
    (sent to this session as a notice)."""
    notices: list[str] = []

    def keep(notice: psycopg.errors.Diagnostic) -> None:
        notices.append(notice.message_primary or "")

    conn.add_notice_handler(keep)
    answered: dict[tuple[str, str], set[str]] = {}
    for tenant, conversation, tool in keys:
        answered.setdefault((tenant, conversation), set()).add(tool)
    await conn.execute("SET auto_explain.log_min_duration = 0")
    try:
        found = await tool_use_seqs(conn, answered, KeyLookups())
    finally:
        await conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(keep)
    (plan,) = [text for text in notices if "conversation_tool_use_keys" in text]
    return {
        "found": sum(map(len, found.values())),
        "execution_ms": float(re.findall(r"duration: ([\d.]+) ms", plan)[0]),
        "scans": [
            line.strip() for line in plan.splitlines() if "Scan on" in line or "Join" in line
        ],
    }


async def measure(messages: int) -> dict[str, Any]:
    dsn = os.environ["MEMPROJ_POSTGRES_DSN"]
    schema = f"bench_tool_use_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
        try:
            await conn.execute(f"SET search_path TO {schema}")
            await migrate(conn)
            await conn.commit()
            await conn.set_autocommit(True)  # migrate leaves it off; VACUUM needs it on
            await conn.execute("LOAD 'auto_explain'")
            await conn.execute("SET auto_explain.log_analyze = on")
            await conn.execute("SET client_min_messages = log")
            await conn.execute(
                "INSERT INTO conversation_messages (tenant_id, conversation_id, message_id, seq,"
                " role, content, occurred_at, event_id, redactions, owner_type, owner_id)"
                " SELECT CASE WHEN i %% 2 = 0 THEN 'big' ELSE 't' || (i %% 200) END,"
                " 'c' || (i %% 5000), 'm' || i, i, 'assistant',"
                " jsonb_build_array(jsonb_build_object('type', 'tool_use', 'id', 'tu' || i,"
                " 'name', 's', 'input', '{}'::jsonb)), now(), 'e' || i, '[]'::jsonb, 'user', 'u'"
                " FROM generate_series(1, %s) AS i",
                (messages,),
            )
            await conn.execute("VACUUM ANALYZE conversation_messages")
            step = max(1, messages // 100) | 1  # odd: every other id is the large tenant's
            several = [[tenant_of(i), f"c{i % 5000}", f"tu{i}"] for i in range(1, messages, step)]
            own = [key for key in several if key[0] == "big"]
            return {
                "messages": messages,
                "several_tenants": {
                    "ids": len(several),
                    "tenants": len({key[0] for key in several}),
                    **await explained(conn, several),
                },
                "one_tenant": {"ids": len(own), **await explained(conn, own)},
            }
        finally:
            await conn.rollback()
            await conn.set_autocommit(True)
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "tool_use_plans.json"
    )
    args = parser.parse_args()
    print_and_save(asyncio.run(measure(args.messages)), args.json)


if __name__ == "__main__":
    main()
