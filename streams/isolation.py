"""Isolation: a failure that one message causes is that message's dead letter.

``bisect`` splits a part of a batch that fails because of a message (``streams.failures``
says which failures are) in halves until the message is alone; every other message is applied
in order. ``stage`` names where in the work a failure happened, for its dead letter. The
``CircuitBreaker`` tells a systemic fault (a bug every event hits) from a poison pill: when
most of the messages just seen failed the same way, it stops the worker instead of
dead-lettering the stream. ``DeadLetters`` builds every worker's dead letters one way.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from psycopg_pool import AsyncConnectionPool

from projections.deadletters.keys import LetterKeys, PostgresLetterKeys
from projections.deadletters.sealing import DeadLetterMessage, LetterSealer, Position, letter_keys
from projections.outbox import OutboxMessage
from projections.sealing.crypto import MasterKeys
from projections.sql import Conn, KeyLookups
from streams.failures import UNSTORABLE, FailureKind, SystemicFailure, classify, error_code
from topics.codec import InvalidMessage, encode
from topics.messages import InputMessage
from topics.outputs import KEY_MAX_CHARS, ORIGINAL_MAX_BYTES, DeadLetter, DeadLetterReason
from topics.registry import DLQ_SUFFIX

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class StageFailed(Exception):
    """A message failure, tagged with the stage of the work where it happened."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        # The cause's text is the dead letter's sealed detail, never this exception's.
        super().__init__(f"{stage}: {type(cause).__name__}")
        self.stage = stage
        self.cause = cause


class stage:
    """Names the stage of the work in the failures raised inside it; transient and
    environment failures pass through unchanged, for the retry and the stop."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        if (
            isinstance(exc, Exception)
            and not isinstance(exc, StageFailed | InvalidMessage)
            and classify(exc) is FailureKind.MESSAGE
        ):
            raise StageFailed(self.name, exc) from exc


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one message could not be applied: ``detail`` (the exception's text, which may
    quote the message) goes sealed into the dead letter, ``loggable()`` to the log."""

    code: DeadLetterReason
    stage: str
    error_class: str
    detail: str
    error_code: str | None = None  # content-free (streams.failures.error_code)

    @classmethod
    def of(cls, exc: BaseException, default_stage: str = "apply") -> Failure:
        stage_name = default_stage
        if isinstance(exc, StageFailed):
            stage_name, exc = exc.stage, exc.cause
        code = (
            DeadLetterReason.UNSTORABLE
            if isinstance(exc, UNSTORABLE)
            else DeadLetterReason.PROCESSING_FAILED
        )
        return cls(code, stage_name, type(exc).__name__, str(exc)[:1000], error_code(exc))

    @property
    def signature(self) -> tuple[str, str]:
        return (self.stage, self.error_class)

    def describe(self) -> str:
        """The whole failure, detail included: for the sealed letter only."""
        return f"{self.stage}: {self.error_class}: {self.detail}"

    def loggable(self) -> str:
        """The stage, the class and the content-free code: what a log line may say."""
        code = f" [{self.error_code}]" if self.error_code else ""
        return f"{self.stage}: {self.error_class}{code}"


def message_failure(exc: BaseException, default_stage: str = "apply") -> Failure:
    """The failure of one message, or ``exc`` raised again when it is not about a message."""
    cause = exc.cause if isinstance(exc, StageFailed) else exc
    if classify(cause) is not FailureKind.MESSAGE:
        raise exc
    return Failure.of(exc, default_stage)


async def bisect(
    items: Sequence[T], attempt: Callable[[Sequence[T]], Awaitable[R]]
) -> tuple[list[R], list[tuple[T, Failure]]]:
    """Apply ``items`` with ``attempt``, in order, splitting a part that fails because of a
    message in halves until that message is alone. Returns what the applied parts returned
    and each failed message with its failure. Transient and environment failures propagate:
    they are not about a message."""
    if not items:
        return [], []
    try:
        return [await attempt(items)], []
    except Exception as exc:
        failure = message_failure(exc)
        if len(items) == 1:
            return [], [(items[0], failure)]
    half = len(items) // 2
    first, first_failed = await bisect(items[:half], attempt)
    second, second_failed = await bisect(items[half:], attempt)
    return first + second, first_failed + second_failed


class CircuitBreaker:
    """Trips when most of the messages just seen failed the same way.

    It looks at the current batch, topped up with the messages before it to ``window``
    messages, so that a trickle of one-message batches is judged like one batch. It trips
    when one failure signature (stage and exception class) covers more than ``ratio`` of
    those messages and at least ``min_failures`` of them. Tripping raises
    ``SystemicFailure``, before any dead letter of the batch is written.
    """

    def __init__(
        self, name: str, ratio: float = 0.5, min_failures: int = 5, window: int = 20
    ) -> None:
        self.name = name
        self.ratio = ratio
        self.min_failures = min_failures
        self._window = window
        self._recent: deque[tuple[str, str] | None] = deque(maxlen=window)

    def check(self, messages: int, failures: Sequence[Failure]) -> None:
        """Judge a batch of ``messages`` of which ``failures`` failed; raise to stop."""
        current: list[tuple[str, str] | None] = [f.signature for f in failures]
        current += [None] * max(0, messages - len(failures))
        room = max(0, self._window - len(current))
        earlier = list(self._recent)[max(0, len(self._recent) - room) :] if room else []
        observed = earlier + current
        counts = Counter(s for s in observed if s is not None)
        if counts and failures:
            signature, count = counts.most_common(1)[0]
            if count >= self.min_failures and count > self.ratio * len(observed):
                example = next((f for f in failures if f.signature == signature), failures[0])
                raise SystemicFailure(
                    f"{self.name}: circuit breaker tripped: {count} of the last"
                    f" {len(observed)} messages failed the same way ({example.loggable()});"
                    " stopping instead of dead-lettering the stream"
                )
        self._recent.extend(current)


class DeadLetters:
    """Builds the dead letter of a message, the same way for every worker: the original and
    the error's detail sealed under a fresh key (``projections.deadletters``), the letter's
    ``error`` free of anything the message held. The key row travels with the message
    (``DeadLetterMessage``) and is made durable by ``keep_in`` (in a projection's batch
    transaction) or ``keep`` (an agent, before it publishes)."""

    def __init__(
        self,
        sealer: LetterSealer,
        keys: LetterKeys,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sealer = sealer
        self._keys = keys
        self._clock = clock

    @classmethod
    def in_postgres(
        cls, master_keys: bytes | MasterKeys, pool: AsyncConnectionPool[Conn], lookups: KeyLookups
    ) -> DeadLetters:
        return cls(LetterSealer(master_keys), PostgresLetterKeys(pool, lookups))

    def of(
        self, message: InputMessage, code: DeadLetterReason, error: str, detail: str
    ) -> DeadLetterMessage:
        """The letter of ``message``: ``error`` is published as it is, ``detail`` sealed."""
        failed_at = self._clock()
        at = Position(message.topic, message.partition, message.offset)
        sealed, letter_key = self._sealer.seal(at, message.key, message.value, detail, failed_at)
        value = message.value or b""
        record = DeadLetter(
            original="",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=error,
            error_code=code,
            key=None
            if message.key is None
            else message.key.decode(errors="replace")[:KEY_MAX_CHARS],
            failed_at=failed_at,
            original_truncated=len(value) > ORIGINAL_MAX_BYTES,
            original_size=len(value),
            sealed_original=sealed,
        )
        # The original key may be as large as a message: the dead letter keeps its first bytes
        # (as ``record.key`` keeps its first characters), so that the letter always fits.
        key = None if message.key is None else message.key[:KEY_MAX_CHARS]
        return DeadLetterMessage(
            message.topic + DLQ_SUFFIX, key, encode(record), letter_key=letter_key
        )

    def invalid(self, message: InputMessage, invalid: InvalidMessage) -> OutboxMessage:
        # The codec's detail may quote the message (a key, an event type, a field name).
        return self.of(
            message, invalid.code, f"{invalid.code.value} (detail sealed)", invalid.detail
        )

    def failed(self, message: InputMessage, failure: Failure) -> OutboxMessage:
        # An exception's text may quote what it failed on (a database error quotes the row).
        error = f"{failure.stage}: {failure.error_class} (detail sealed)"
        return self.of(message, failure.code, error, failure.describe())

    async def keep_in(self, conn: Conn, messages: Sequence[OutboxMessage]) -> None:
        """Store the key rows of the letters among ``messages`` in the caller's transaction."""
        await self._keys.save_in(conn, letter_keys(messages))

    async def keep(self, messages: Sequence[OutboxMessage]) -> None:
        """Store the key rows of the letters among ``messages``; call before publishing."""
        await self._keys.save(letter_keys(messages))


class DeadLetterObserver(Protocol):
    def dead_lettered(self, topic: str, error: str) -> None: ...


class Isolation:
    """What every worker's handler uses to keep a failing message from failing the rest: one
    per agent, owned by its batch loop (the breaker remembers the messages before)."""

    def __init__(
        self,
        breaker: CircuitBreaker,
        observer: DeadLetterObserver,
        dead_letters: DeadLetters,
    ) -> None:
        self.breaker = breaker
        self.dead_letters = dead_letters
        self._observer = observer

    async def each(
        self,
        messages: Sequence[InputMessage],
        handle: Callable[[InputMessage], Awaitable[None]],
        stage_name: str = "apply",
    ) -> list[OutboxMessage]:
        """Handle every message on its own, then judge the failures: returns the dead letters
        to publish (of messages refused as invalid and of messages that failed)."""
        letters: list[OutboxMessage] = []
        failed: list[tuple[InputMessage, Failure]] = []
        for message in messages:
            try:
                await handle(message)
            except InvalidMessage as invalid:
                letters.append(self.invalid(message, invalid))
            except Exception as exc:
                failed.append((message, message_failure(exc, stage_name)))
        return letters + self.judge(len(messages), failed)

    async def split(
        self,
        messages: Sequence[InputMessage],
        attempt: Callable[[Sequence[InputMessage]], Awaitable[R]],
    ) -> tuple[list[R], list[tuple[InputMessage, Failure]]]:
        """Apply the batch as a whole, bisecting it around the messages that fail."""
        return await bisect(messages, attempt)

    def judge(
        self, messages: int, failed: Sequence[tuple[InputMessage, Failure]]
    ) -> list[OutboxMessage]:
        """The dead letters of ``failed`` out of a batch of ``messages``, or
        ``SystemicFailure`` when the breaker says the failures are not about the messages."""
        self.breaker.check(messages, [failure for _, failure in failed])
        letters = []
        for message, failure in failed:
            log.warning(
                "%s: %s[%d]@%d failed (%s): dead-lettered, the detail sealed in the letter",
                self.breaker.name,
                message.topic,
                message.partition,
                message.offset,
                failure.loggable(),
            )
            self._observer.dead_lettered(message.topic, failure.code.value)
            letters.append(self.dead_letters.failed(message, failure))
        return letters

    def invalid(self, message: InputMessage, invalid: InvalidMessage) -> OutboxMessage:
        """The dead letter of a message the codec refused (not a failure: no breaker)."""
        self._observer.dead_lettered(message.topic, invalid.code.value)
        return self.dead_letters.invalid(message, invalid)


def position(message: InputMessage) -> Position:
    """Where ``message`` was read: what names it within a batch."""
    return Position(message.topic, message.partition, message.offset)


async def raise_refused(refused: Mapping[Position, Exception], message: InputMessage) -> None:
    """The handler a batch decoded up front gives ``Isolation``: re-raises, in the ``decode``
    stage, what refused ``message`` then (nothing for the others), so that the isolated
    message is dead-lettered for it alone."""
    failure = refused.get(position(message))
    if failure is not None:
        with stage("decode"):
            raise failure
