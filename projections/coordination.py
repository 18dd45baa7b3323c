"""Duties that run once among a worker kind's replicas, coordinated through PostgreSQL
advisory locks, one lock per duty.

Two shapes, one lock space:

- a round's lock (``try_lead_round``): taken in the round's transaction, released at its end;
  a replica that does not get it skips the round;
- a lease (``try_hold``, then ``alive`` each round): a session lock held on a connection of
  its own, released by ``release`` or when the session ends, so a replica that dies (SIGKILL
  too: the kernel closes its socket) hands the duty over at the next round of a survivor.

A lock is named by its duty and scoped to the schema the projections live in
(``current_schema()``): deployments, or tests, that share a database but not a schema never
contend.

Whether a replica leads is decided here too, apart from the I/O (``step``): from whether it
led before and what PostgreSQL answered this round.
"""

from __future__ import annotations

from typing import Literal, Protocol

import psycopg

from projections.sql import Conn

# The lock of a duty: a 64-bit hash of the schema and the duty's name.
_KEY = "hashtextextended(coalesce(current_schema(), '') || ':memproj:' || %s, 0)"

# What a replica saw of its lease this round: its session still alive (it held the lock),
# the lock acquired or refused (it did not), or the database unreachable.
Seen = Literal["alive", "acquired", "refused", "failed"]
# What that makes of it: it took the duty, kept it, lost it, or waits for it.
Change = Literal["took", "kept", "lost", "waiting"]


def step(leader: bool, seen: Seen) -> Change:
    """A lease's next standing. A leader keeps the duty while its session lives (a session
    lock is held until the session ends); one whose session failed has lost it, since
    PostgreSQL released the lock with the session and another replica may hold it now."""
    if leader:
        return "kept" if seen in ("alive", "acquired") else "lost"
    return "took" if seen == "acquired" else "waiting"


def leads(change: Change) -> bool:
    return change in ("took", "kept")


async def try_lead_round(conn: Conn, duty: str) -> bool:
    """Whether this transaction leads ``duty``'s round (released when it ends)."""
    cursor = await conn.execute(f"SELECT pg_try_advisory_xact_lock({_KEY})", (duty,))
    row = await cursor.fetchone()
    return bool(row and row[0])


async def try_hold(conn: Conn, duty: str) -> bool:
    """Whether this session now holds ``duty`` (until ``release`` or the session's end). A
    session that already holds it gets it again (and must release it as often)."""
    cursor = await conn.execute(f"SELECT pg_try_advisory_lock({_KEY})", (duty,))
    row = await cursor.fetchone()
    return bool(row and row[0])


async def release(conn: Conn, duty: str) -> None:
    await conn.execute(f"SELECT pg_advisory_unlock({_KEY})", (duty,))


async def alive(conn: Conn) -> bool:
    """Whether the session answers: a live session still holds every lock it took."""
    cursor = await conn.execute("SELECT 1")
    return await cursor.fetchone() is not None


class LockSession(Protocol):
    """A session a lease holds its duty's lock on (``streams.coordination.Lease``)."""

    async def try_hold(self, duty: str) -> bool:
        """Whether this session holds ``duty`` now (it may already have held it)."""
        ...

    async def alive(self) -> bool:
        """Whether the session still answers, and so still holds what it took."""
        ...

    async def close(self) -> None:
        """End the session: every lock it held is released."""
        ...


class PostgresLockSession:
    """A ``LockSession`` on a PostgreSQL connection of its own (autocommit: the lock is the
    session's, never a transaction's)."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._held: set[str] = set()

    @classmethod
    async def connect(cls, conninfo: str) -> PostgresLockSession:
        return cls(await psycopg.AsyncConnection.connect(conninfo, autocommit=True))

    async def try_hold(self, duty: str) -> bool:
        if duty in self._held:
            # Held already: taking it again would need a second release.
            return await self.alive()
        taken = await try_hold(self._conn, duty)
        if taken:
            self._held.add(duty)
        return taken

    async def alive(self) -> bool:
        return not self._conn.closed and await alive(self._conn)

    @property
    def backend_pid(self) -> int:
        """The server process of the session (what an operator terminates to move a duty)."""
        return self._conn.info.backend_pid

    async def close(self) -> None:
        await self._conn.close()
