"""The phases of a benchmark run, one after another: a phase that fails is recorded as failed
with its error (the traceback goes to stderr) and the run goes on, so that every other
phase's figures are still printed and saved. A phase that needs another's figures is not run
when that one failed, and says so."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO, TypeVar

T = TypeVar("T")


@dataclass
class Phases:
    # phase name -> what stopped it
    failed: dict[str, str] = field(default_factory=dict)
    log: TextIO = field(default_factory=lambda: sys.stderr)  # the one of when it is made

    def run(self, name: str, measure: Callable[[], T], needs: Sequence[str] = ()) -> T | None:
        """``measure()``'s figures, or None when it failed or a phase it ``needs`` did."""
        blocked = [need for need in needs if need in self.failed]
        if blocked:
            self.failed[name] = f"not run: {', '.join(blocked)} failed"
            print(f"phase {name!r} {self.failed[name]}", file=self.log, flush=True)
            return None
        try:
            return measure()
        except Exception as exc:  # reported with the run's figures; the next phase runs
            self.failed[name] = f"{type(exc).__name__}: {exc}".strip()
            print(f"phase {name!r} failed:", file=self.log, flush=True)
            traceback.print_exc(file=self.log)
            return None
