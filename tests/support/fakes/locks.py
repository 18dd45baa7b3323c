"""Duty locks in memory (``projections.coordination.LockSession``): each session holds what
it took until it closes or is dropped (as a killed replica's connection is)."""

from __future__ import annotations

import itertools


class InMemoryLocks:
    """The lock table every session of one "database" shares."""

    def __init__(self) -> None:
        self.holders: dict[str, int] = {}
        self.sessions: list[InMemoryLockSession] = []
        self._ids = itertools.count(1)

    async def session(self) -> InMemoryLockSession:
        self.sessions.append(InMemoryLockSession(self, next(self._ids)))
        return self.sessions[-1]


class InMemoryLockSession:
    def __init__(self, locks: InMemoryLocks, session_id: int) -> None:
        self._locks = locks
        self.session_id = session_id
        self.closed = False

    async def try_hold(self, duty: str) -> bool:
        if self.closed:
            raise ConnectionError("session closed")
        holder = self._locks.holders.setdefault(duty, self.session_id)
        return holder == self.session_id

    async def alive(self) -> bool:
        if self.closed:
            raise ConnectionError("session closed")
        return True

    async def close(self) -> None:
        self.drop()

    def drop(self) -> None:
        """The session ends (its replica killed, its connection lost): its locks go."""
        self.closed = True
        for duty in [d for d, holder in self._locks.holders.items() if holder == self.session_id]:
            del self._locks.holders[duty]
