"""Worker processes for the integration tests, forked from a process that imported memproj
once.

A worker started as ``python -m streams worker KIND`` spends one to two seconds of CPU
importing memproj and its libraries before it reads a message, and a test session starts
hundreds of them on a 2-core machine. Here a worker is a child of Python's fork server
(``multiprocessing``'s ``forkserver`` start method), which imported ``streams.cli`` when it
started: each worker is a fork of that process, with the environment, working directory and
log file a subprocess would have, running the same entry point (``streams.cli.main``). It is
a process of its own (its own pid, signals, exit status), so SIGTERM drains it and SIGKILL
kills it as it would a subprocess.

The fork server is single-threaded and runs nothing but imports, so a fork of it is safe (a
fork of the test process, with its Kafka clients' threads, would not be).

The operator's command line itself (``python -m streams ...``) is what the CLI tests run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# The modules a worker needs, imported once by the fork server; and the test process's main
# module, as multiprocessing preloads by default, so that a child finds it already imported
# rather than running it again.
PRELOADED = ["__main__", "streams.cli"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOADED)


def _run(arguments: Sequence[str], environment: Mapping[str, str], log: str, cwd: str) -> None:
    """In the forked child: a subprocess's surroundings, then the command's entry point."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    sys.argv = ["memproj", *arguments]
    from streams.cli import main

    main()  # exits through SystemExit; multiprocessing turns its code into the exit status


class ForkedProcess:
    """A started worker, answering as ``subprocess.Popen`` does for what the tests use:
    ``pid``, ``poll``, ``wait`` (``TimeoutExpired`` past the timeout), ``returncode`` (the
    negative signal number for a worker a signal ended), ``send_signal``, ``terminate``,
    ``kill``."""

    def __init__(
        self, arguments: Sequence[str], environment: Mapping[str, str], log: Path, cwd: Path
    ):
        self.args = list(arguments)
        self._process = _CONTEXT.Process(
            target=_run,
            args=(self.args, dict(environment), str(log), str(cwd)),
            name=f"memproj {' '.join(self.args)}",
        )
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
