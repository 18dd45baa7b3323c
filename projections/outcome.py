"""What every projection's batch result exposes, whoever runs it: the worker's runner
(``streams.runner``) and the one-hop adapter that wraps a projection
(``projections.sealing.fused``)."""

from __future__ import annotations

from typing import Protocol

from projections.idempotency import ProcessedEvent
from topics.outputs import Rejection


class Outcome(Protocol):
    """A reducer's batch result, as the runner records and reports it."""

    @property
    def processed(self) -> list[ProcessedEvent]: ...

    @property
    def rejections(self) -> list[Rejection]: ...

    @property
    def redelivered(self) -> int: ...

    @property
    def shredded(self) -> int: ...

    def applied_event_types(self) -> list[str]: ...
