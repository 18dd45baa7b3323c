"""One writer per LanceDB directory: a second process stands by, and takes over when the
writer ends, SIGKILL included."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from projections.embeddings.lance_writer import LanceWriterLock, WriterBusy

HOLD = """
import sys, time
from pathlib import Path
from projections.embeddings.lance_writer import LanceWriterLock
LanceWriterLock(Path(sys.argv[1])).acquire(wait=False)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_while_the_first_holds_the_directory(tmp_path: Path) -> None:
    first, second = LanceWriterLock(tmp_path), LanceWriterLock(tmp_path)
    first.acquire(wait=False)
    with pytest.raises(WriterBusy):
        second.acquire(wait=False)
    assert not second.held
    first.release()
    second.acquire(wait=False)
    assert second.held
    second.release()


def test_a_standby_takes_over_when_the_writer_releases(tmp_path: Path) -> None:
    writer, standby = LanceWriterLock(tmp_path), LanceWriterLock(tmp_path)
    writer.acquire()
    waiting = threading.Thread(target=standby.acquire)
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and not standby.held  # standing by
    writer.release()
    waiting.join(10)
    assert standby.held
    standby.release()


def test_a_killed_writer_leaves_no_lock_behind(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(WriterBusy):
            LanceWriterLock(tmp_path).acquire(wait=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    with LanceWriterLock(tmp_path) as survivor:
        assert survivor.held
