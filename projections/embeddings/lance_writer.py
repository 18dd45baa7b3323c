"""One writer per LanceDB directory: an exclusive lock on a file inside it.

LanceDB's history purge (``LanceVectorStore.purge_history``) drops every version but the
newest, which is only safe while no other process is writing a version of its own. The
PostgreSQL vector store has no such limit; with LanceDB, a second embeddings worker started on
the same directory (a scaled Compose service, two processes on one host) waits as a standby
until the writer stops, rather than writing beside it.

The lock is ``flock`` on ``<directory>/.writer.lock``: the kernel releases it when the holding
process ends, however it ends (SIGKILL included), so a standby takes over without a stale lock
to clear. It guards processes that share one filesystem, which is what a LanceDB directory is
(a network filesystem's ``flock`` is not relied on: the deployment guide mounts the directory
on one node).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"


class WriterBusy(Exception):
    """Another process holds the directory's writer lock."""


class LanceWriterLock:
    """The writer lock of one LanceDB directory, held from ``acquire`` until ``release`` or
    the end of the process."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: bool = True) -> None:
        """Take the lock; ``wait``: as a standby, until the holder stops (logged once), else
        raise ``WriterBusy`` at once."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise WriterBusy(f"another process writes {self.path.parent}") from None
                log.warning(
                    "another process writes the LanceDB directory %s: standing by until it stops",
                    self.path.parent,
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
                log.info("the LanceDB directory %s is this process's to write", self.path.parent)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    def __enter__(self) -> LanceWriterLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
