"""Which failures are worth retrying, which stop the worker, and the retry itself.

Every failure is classified once, here:

- **transient** (``RETRYABLE``: PostgreSQL, the broker or Redis unreachable, a concurrent
  claim): the same work passes if tried again later; it is retried with backoff, and a batch
  is never dropped for it.
- **environment** (``ENVIRONMENT``: a table, column or function that is gone, a missing
  privilege, a read-only database; or the circuit breaker tripped): no message causes it and
  no retry mends it; the worker stops with that error, for its supervisor and its operator.
- **message** (anything else): what one message holds makes the work fail, and it would fail
  the same way forever. It is never retried, whatever its exception class says: the message
  is isolated and dead-lettered (``streams.isolation``). ``UNSTORABLE`` failures (what
  PostgreSQL or Kafka cannot hold) are message failures with a dead-letter code of their own.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from redis import exceptions as redis_errors

from projections import bookkeeping
from streams.kafka import PublishFailed

log = logging.getLogger(__name__)

T = TypeVar("T")


class OversizedOutput(ValueError):
    """An output would be larger than a Kafka message may be."""


RETRYABLE: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    bookkeeping.ConcurrentClaim,
    PublishFailed,
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)
# ProgramLimitExceeded is an OperationalError: UNSTORABLE is checked before RETRYABLE.
UNSTORABLE: tuple[type[BaseException], ...] = (
    psycopg.errors.DataError,
    psycopg.errors.ProgramLimitExceeded,
    OversizedOutput,
)
# memproj's SQL is fixed: these say the database is not what the workers were built for.
ENVIRONMENT: tuple[type[BaseException], ...] = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.InsufficientPrivilege,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.InterfaceError,
    MemoryError,
)


class FailureKind(enum.Enum):
    TRANSIENT = "transient"
    ENVIRONMENT = "environment"
    MESSAGE = "message"


class SystemicFailure(RuntimeError):
    """Not about one message: the worker stops (the breaker tripped, or an environment
    fault). Nothing of the failing batch was committed or acknowledged."""


def classify(exc: BaseException) -> FailureKind:
    if isinstance(exc, SystemicFailure):
        return FailureKind.ENVIRONMENT
    if isinstance(exc, UNSTORABLE):
        return FailureKind.MESSAGE
    if isinstance(exc, RETRYABLE):
        return FailureKind.TRANSIENT
    if isinstance(exc, ENVIRONMENT):
        return FailureKind.ENVIRONMENT
    return FailureKind.MESSAGE


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
        except Exception as exc:
            if classify(exc) is not FailureKind.TRANSIENT:
                raise
            attempt += 1
            delay = min(max_backoff_seconds, 0.1 * 2**attempt)
            on_retry(exc)
            log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, delay)
            await asyncio.sleep(delay)
