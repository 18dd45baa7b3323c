"""What a worker's /healthz and /readyz answer: pure decisions over observed facts.

The facts are gathered elsewhere (``streams.services.ProbeService``: the event loop's
heartbeat, the consumer's rebalance callbacks, a ``SELECT 1``, the shutdown and the
breaker); here they become a verdict, so that every rule is written once and tested
without a worker.

- Live: the event loop answered within ``stale_after`` seconds (its heartbeat ticks every
  second). A blocked or dead loop is the one thing a restart fixes.
- Ready: every check passes:
  - ``group``: the worker joined its consumer group and its last assignment completed; not
    while a rebalance is in progress. An empty assignment counts as ready: a group with more
    members than partitions has idle members by design, and they take over partitions at the
    next rebalance. A worker without a consumer group (the monitor) has no such check.
  - ``database``: PostgreSQL answered ``SELECT 1`` (checked at most every
    ``DATABASE_CHECK_TTL_SECONDS``).
  - ``running``: not shutting down (SIGTERM) and not stopped by a failure (the circuit breaker
    or any other fault that stops the worker).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DATABASE_CHECK_TTL_SECONDS = 1.5
HEARTBEAT_INTERVAL_SECONDS = 1.0
# A stopping worker answers /readyz 503 "shutting down" for at least this long after its stop
# began, even when it has nothing to drain and its services stop at once (the monitor): a
# watcher polling /readyz (memproj top, a rolling restart's check between pods) sees the
# shutdown, not only a refused connection. A worker that takes longer to stop is not held.
NOT_READY_HOLD_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def status(self) -> int:
        return 200 if self.ok else 503

    def body(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "fail",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
        }


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """The consumer group as the consumer's rebalance callbacks report it."""

    assigned: frozenset[tuple[str, int]] | None = None  # None: no assignment completed yet
    rebalancing: bool = False

    def revoked(self) -> GroupMembership:
        """A rebalance started (partitions are revoked before the new assignment)."""
        return GroupMembership(self.assigned, rebalancing=True)

    def assigned_to(self, partitions: Iterable[tuple[str, int]]) -> GroupMembership:
        return GroupMembership(frozenset(partitions), rebalancing=False)

    def check(self) -> Check:
        if self.assigned is None:
            return Check("group", False, "not yet joined")
        if self.rebalancing:
            return Check("group", False, "rebalancing")
        return Check("group", True, f"{len(self.assigned)} partitions assigned")


@dataclass(frozen=True, slots=True)
class DatabaseAnswer:
    ok: bool
    detail: str
    at: float  # monotonic time of the check


def database_check(answer: DatabaseAnswer | None) -> Check:
    if answer is None:
        return Check("database", False, "not yet checked")
    return Check("database", answer.ok, answer.detail)


def needs_database_check(answer: DatabaseAnswer | None, now: float) -> bool:
    return answer is None or now - answer.at >= DATABASE_CHECK_TTL_SECONDS


def running_check(stopping: bool, failure: BaseException | None) -> Check:
    if failure is not None:
        # The class only: an exception's message may quote data.
        return Check("running", False, f"stopped by {type(failure).__name__}")
    if stopping:
        return Check("running", False, "shutting down")
    return Check("running", True, "running")


def liveness(heartbeat_age: float, stale_after: float) -> Verdict:
    ok = heartbeat_age <= stale_after
    return Verdict((Check("event_loop", ok, f"answered {heartbeat_age:.1f} s ago"),))


def readiness(
    membership: GroupMembership | None,
    database: DatabaseAnswer | None,
    stopping: bool,
    failure: BaseException | None,
) -> Verdict:
    """``membership`` None: a worker that belongs to no consumer group."""
    checks = [] if membership is None else [membership.check()]
    checks += [database_check(database), running_check(stopping, failure)]
    return Verdict(tuple(checks))


@dataclass(frozen=True, slots=True)
class ShutdownBudget:
    """How the shutdown bound is spent: the batch in progress gets most of it, and the rest
    is left for the offset commit, leaving the group and closing the connections. Past the
    whole bound the process exits regardless."""

    total_seconds: float

    @property
    def drain_seconds(self) -> float:
        return self.total_seconds - self.reserve_seconds

    @property
    def reserve_seconds(self) -> float:
        return min(10.0, self.total_seconds / 3)
