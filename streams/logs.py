"""What memproj's processes log about an exception, wherever it is logged from: its class and
content-free code (``streams.failures.loggable``), never its text, which may quote what
failed. A log is a place memproj writes that no erasure reaches.

``install`` (run once by the ``memproj`` entry point, before a worker, the API or a command
starts) applies that to every log record of the process: an exception given as an argument
of the message (mode's ``Crashed reason=%r``) and the traceback of ``log.exception`` alike;
and to the traceback of an exception nobody caught, in any thread. The frames stay: they are
code, not data.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from types import TracebackType
from typing import Any

from streams.failures import loggable


def content_free_traceback(exc: BaseException) -> str:
    """``exc``'s traceback, each exception of its chain said by ``loggable``."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    parts: list[str] = []
    for earlier in reversed(chain):
        if parts:
            parts.append("\nwhich led to:\n\n")
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_tb(earlier.__traceback__))
        parts.append(f"{loggable(earlier)}\n")
    return "".join(parts).rstrip("\n")


def content_free(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with every exception it carries said by ``loggable``."""
    if isinstance(record.msg, BaseException):
        record.msg = loggable(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(
            loggable(arg) if isinstance(arg, BaseException) else arg for arg in record.args
        )
    if record.exc_info and record.exc_info[1] is not None:
        # Formatters print exc_text as it is; some handlers render exc_info themselves.
        record.exc_text = content_free_traceback(record.exc_info[1])
        record.exc_info = None
    return record


def _uncaught(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, where: str = ""
) -> None:
    if exc.__traceback__ is None:
        exc = exc.with_traceback(tb)
    print(f"{where}{content_free_traceback(exc)}", file=sys.stderr, flush=True)


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "a thread"
    _uncaught(args.exc_type, args.exc_value, args.exc_traceback, f"Exception in {name}:\n")


def install() -> None:
    """Make this process log exceptions content-free (idempotent)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "content_free", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return content_free(previous(*args, **kwargs))

    factory.content_free = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread
