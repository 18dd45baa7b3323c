"""What the suite produces and what must become of it: the planned messages, their
expectations, the corpus and the topics it writes to.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from projections.stores import STORES
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    CONVERSATION_SEALED,
    DELETION_ACKS,
    DELETION_REQUESTS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_SEALED,
    TopicSpec,
)

VALID_TENANTS = frozenset({"tenant_0", "tenant_1"})
EDGE_TENANT = "edge"
FORGED_TENANT = "forged"
# Under MESSAGE_MAX_BYTES (1,000,000) with room for the record's framing.
LARGE = 900_000
ARRAY = 100_000
# The clock of every hostile event: recent, so that nothing is judged by a stale deadline.
CLOCK = datetime(2026, 1, 1, tzinfo=UTC)


class Expect(StrEnum):
    VALID = "valid"
    DEAD = "dead"
    EITHER = "either"


@dataclass(frozen=True, slots=True)
class Planned:
    spec: TopicSpec
    key: bytes | None
    value: bytes | None
    expect: Expect
    kind: str
    # For the events of the input and sealed topics: the body's ids (as the last of
    # duplicate keys says), to match a dead letter written after sealing and to find the
    # event among what its projection decided.
    event_id: str | None = None
    tenant_id: str | None = None
    projection: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    # When it is produced: 0 with the memory and conversation events, 1 once those are
    # applied (forged seals that only the data keys of the events before can tell from the
    # real ones), 2 after that (the deletion requests).
    phase: int = 0

    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"")


# How many workers consume each topic, each dead-lettering on its own.
CONSUMERS: dict[str, int] = {
    MEMORY_EVENTS.base_name: 1,  # the memory worker, which seals it
    CONVERSATION_EVENTS.base_name: 1,  # the conversation worker, which seals it
    DELETION_REQUESTS.base_name: 1,  # the ledger
    DELETION_ACKS.base_name: 1,  # the ledger
    MEMORY_SEALED.base_name: 1,  # the memory projection of the sealed log
    CONVERSATION_SEALED.base_name: 1,  # the conversation projection of the sealed log
    DELETION_TOMBSTONES.base_name: len(STORES.names),  # every derived store
    MEMORY_CURRENT.base_name: 2,  # embeddings-index and cache-freshness
    CONVERSATION_MESSAGES.base_name: 1,  # embeddings-index
}

PHASES = 3


@dataclass(slots=True)
class Corpus:
    """What to produce, phase by phase (each once the one before is applied), topic by topic,
    in order."""

    phases: list[dict[str, list[Planned]]]
    # The valid deletion requests: (tenant, deletion_id), all of which must complete.
    deletions: list[tuple[str, str]]

    def everything(self) -> Iterator[Planned]:
        for phase in self.phases:
            for messages in phase.values():
                yield from messages

    def valid_only(self) -> Corpus:
        phases = [
            {
                t: kept
                for t, ms in phase.items()
                if (kept := [p for p in ms if p.expect is Expect.VALID])
            }
            for phase in self.phases
        ]
        return Corpus(phases, list(self.deletions))

    def counts(self) -> dict[str, dict[str, int]]:
        """topic -> expectation -> messages, for the report."""
        found: dict[str, dict[str, int]] = {}
        for planned in self.everything():
            per = found.setdefault(planned.spec.base_name, {})
            per[planned.expect.value] = per.get(planned.expect.value, 0) + 1
        return found

    def kinds(self) -> dict[str, int]:
        """family of hostile message (the kind up to its first colon) -> messages."""
        found: dict[str, int] = {}
        for planned in self.everything():
            if planned.expect is not Expect.VALID:
                family = f"{planned.spec.base_name} {planned.kind.split(':')[0]}"
                found[family] = found.get(family, 0) + 1
        return dict(sorted(found.items()))


SPECS = {
    spec.base_name: spec
    for spec in (
        MEMORY_EVENTS,
        CONVERSATION_EVENTS,
        DELETION_REQUESTS,
        MEMORY_SEALED,
        CONVERSATION_SEALED,
        DELETION_ACKS,
        DELETION_TOMBSTONES,
        MEMORY_CURRENT,
        CONVERSATION_MESSAGES,
    )
}
