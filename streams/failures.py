"""Which failures are worth retrying, and the retry itself.

A transient failure (PostgreSQL or the broker unreachable, a concurrent claim) passes if the
same work is tried again later. An unstorable one comes from what a message holds, and would
fail the same way forever: it is never retried, whatever its exception class says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from projections import bookkeeping
from streams.kafka import PublishFailed

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE = (psycopg.OperationalError, bookkeeping.ConcurrentClaim, PublishFailed)


class OversizedOutput(ValueError):
    """An output would be larger than a Kafka message may be."""


# ProgramLimitExceeded is an OperationalError: this is checked before RETRYABLE.
UNSTORABLE = (psycopg.errors.DataError, psycopg.errors.ProgramLimitExceeded, OversizedOutput)


async def retry_transient(
    what: str,
    work: Callable[[], Awaitable[T]],
    max_backoff_seconds: float = 30.0,
    on_retry: Callable[[Exception], None] = lambda _: None,
) -> T:
    """Run ``work`` until it succeeds or fails with something other than a transient error."""
    attempt = 0
    while True:
        try:
            return await work()
        except UNSTORABLE:
            raise
        except RETRYABLE as exc:
            attempt += 1
            delay = min(max_backoff_seconds, 0.1 * 2**attempt)
            on_retry(exc)
            log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, delay)
            await asyncio.sleep(delay)
