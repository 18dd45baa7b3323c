"""The reader processes of a memory projection's rebuild (``streams.replay``): the sealed
log's partitions split into shares of about as many messages, each share applied to the
shadow by a process of its own (``streams.rebuild``), started by the replay, which applies
the first share itself. A reader that fails stops the replay; one whose replay is killed
stops at its next chunk.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer

from projections.memory.projection import MemoryProjection
from streams.failures import Explained, loggable
from streams.rebuild import MemoryRebuild, ReplayStopped
from streams.replay_reading import Position, Progress, read, reader
from streams.settings import Settings

# A rebuild's chunk: large, since its state is held in memory and it publishes nothing.
BULK_CHUNK = 10_000


async def rebuild_share(
    consumer: Consumer,
    projection: MemoryProjection,
    shadow_dsn: str,
    starts: dict[Position, int],
    ends: dict[Position, int],
    shown: Callable[[int, int], None],
    chunk_size: int = BULK_CHUNK,
) -> None:
    """Apply these partitions of the sealed log to the shadow (``streams.rebuild``);
    ``shown(events, partitions)`` after each chunk, with what this reader has done."""
    rebuild = MemoryRebuild(projection)
    mine = Progress(total=0)
    async with await psycopg.AsyncConnection.connect(shadow_dsn) as conn:
        for batch in read(consumer, starts, ends, chunk_size, mine):
            await rebuild.apply(conn, batch)
            shown(rebuild.applied, mine.partitions_done)


class ReaderFailed(Explained, RuntimeError):
    """A reader process of a rebuild failed; the text says its error by class and code."""


# How a reader's process starts: a fresh interpreter. A fork would copy the replay's running
# event loop (and its Kafka and PostgreSQL clients' threads) into a process that must run a
# loop of its own (ops/decisions/rebuild.md, "Readers").
READER_START_METHOD: Final = "spawn"


class Reader:
    """Another process applying a share of the partitions (``rebuild_share``), started by the
    replay: it is given the projection as the replay holds it (pickled), opens its own Kafka
    reader and connection, and reports how far it got through shared counters."""

    def __init__(self, process: BaseProcess, done: Any, partitions_done: Any, outcome: Any) -> None:
        self.process = process
        self.done = done
        self.partitions_done = partitions_done
        self._outcome = outcome

    @classmethod
    def start(
        cls,
        settings: Settings,
        projection: MemoryProjection,
        shadow_dsn: str,
        starts: dict[Position, int],
        ends: dict[Position, int],
    ) -> Reader:
        context = multiprocessing.get_context(READER_START_METHOD)
        done, partitions_done = context.Value("q", 0), context.Value("q", 0)
        receiving, sending = context.Pipe(duplex=False)
        process = context.Process(
            target=_read_share,
            args=(settings, projection, shadow_dsn, starts, ends, done, partitions_done, sending),
            name="memproj-replay-reader",
            daemon=True,  # ends with the replay
        )
        process.start()
        sending.close()
        return cls(process, done, partitions_done, receiving)

    def wait(self, seconds: float | None = None) -> bool:
        """Whether the reader is done (waiting up to ``seconds``); raises what stopped it."""
        self.process.join(seconds)
        if self.process.is_alive():
            return False
        failure = self._outcome.recv() if self._outcome.poll() else None
        if failure is None and self.process.exitcode != 0:
            failure = ("failed", f"exit code {self.process.exitcode}")
        if failure is None:
            return True
        kind, text = failure
        if kind == "stopped":
            raise ReplayStopped(text)
        raise ReaderFailed(f"a replay reader failed: {text}")

    def stop(self) -> None:
        """This reader's process ends (a no-op once it has)."""
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()


def _read_share(
    settings: Settings,
    projection: MemoryProjection,
    shadow_dsn: str,
    starts: dict[Position, int],
    ends: dict[Position, int],
    done: Any,
    partitions_done: Any,
    outcome: Any,
) -> None:
    """A reader's process: apply its share, send None or what stopped it."""
    replay = os.getppid()

    def shown(events: int, partitions: int) -> None:
        if os.getppid() != replay:
            os._exit(1)  # the replay was killed: its shadow is abandoned, stop writing it
        done.value, partitions_done.value = events, partitions

    consumer = reader(settings)
    try:
        asyncio.run(rebuild_share(consumer, projection, shadow_dsn, starts, ends, shown))
        outcome.send(None)
    except ReplayStopped as stopped:
        outcome.send(("stopped", str(stopped)))
    except BaseException as exc:  # reported to the replay, which raises it
        outcome.send(("failed", loggable(exc)))
    finally:
        consumer.close()


def shares_of(
    starts: dict[Position, int], ends: dict[Position, int], readers: int
) -> list[tuple[dict[Position, int], dict[Position, int]]]:
    """The partitions split into ``readers`` shares of about as many messages (the largest
    first, each to the lightest share); the first share is this process's."""
    count = max(1, min(readers, len(ends)))
    shares: list[tuple[dict[Position, int], dict[Position, int]]] = [({}, {}) for _ in range(count)]
    loads = [0] * count
    for position in sorted(ends, key=lambda p: (starts[p] - ends[p], p)):
        lightest = loads.index(min(loads))
        shares[lightest][0][position] = starts[position]
        shares[lightest][1][position] = ends[position]
        loads[lightest] += max(0, ends[position] - starts[position])
    return shares
