"""Ports for the servers a test starts (workers' probes, API servers, Prometheus).

Never the kernel's ephemeral ports: a port the kernel handed out once and that was closed
again is handed out again, to any process, for a client connection or a ``bind(0)``, and the
session's test processes (pytest-xdist) start servers at the same time. Each test process
takes its ports in turn from a block of its own, below the ephemeral range and clear of the
stack's ports, skipping any that something else holds.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator

FIRST_PORT = 21000  # the blocks: 21000-26999 (ops/stack's ports and the kernel's lie outside)
BLOCK_SIZE = 1000
BLOCKS = 6


def test_process_number() -> int:
    """This process's number in the session: n of pytest-xdist's ``gw<n>``, 0 without it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def _candidates() -> Iterator[int]:
    start = FIRST_PORT + (test_process_number() % BLOCKS) * BLOCK_SIZE
    return itertools.cycle(range(start, start + BLOCK_SIZE))


_next_port = _candidates()


def free_port() -> int:
    """The next port of this process's block that nothing listens on or holds."""
    for _ in range(BLOCK_SIZE):
        port = next(_next_port)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in this test process's block of {BLOCK_SIZE}")
