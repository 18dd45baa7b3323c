"""Making messages: template events with fresh ids, the planned message of an event as
memproj reads it, and one round of hypothesis choices (``Round``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import Enum
from typing import Any

import orjson
import pydantic_core
from hypothesis import strategies as st

from streams.sample import EventFactory, RawEvent, key_of
from support.hostile.contract import PROJECTION_OF
from support.hostile.plan import CLOCK, EDGE_TENANT, FORGED_TENANT, VALID_TENANTS, Expect, Planned
from topics.registry import DELETION_REQUESTS, TopicSpec


class Maker:
    """Fresh ids and template events, each a valid event until a mutation makes it not."""

    def __init__(self) -> None:
        self.factory = EventFactory(id_prefix="h", clock=CLOCK)
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count:05d}"

    def template(self, event_type: str, tenant: str, entity: str | None = None) -> RawEvent:
        f = self.factory
        later = f.clock + timedelta(days=400)
        if event_type.startswith("memory."):
            memory_id = entity or self.fresh("h_mem_")
            if event_type == "memory.proposed":
                event = f.proposed(
                    tenant, memory_id, ("user", "u_hostile"), {"text": "a fact"}, expires_at=later
                )
                event["payload"]["evidence_event_ids"] = ["evt-1"]
                return event
            if event_type == "memory.verified":
                return f.verified(tenant, memory_id, 1)
            if event_type == "memory.corrected":
                return f.corrected(
                    tenant,
                    memory_id,
                    1,
                    {"text": "another fact"},
                    verification="crm_field",
                    expires_at=later,
                )
            if event_type == "memory.reviewed":
                return f.reviewed(tenant, memory_id, 1, note="checked with the customer")
            return f.revoked(tenant, memory_id, "asked", expected_version=1)
        if event_type.startswith("conversation."):
            conversation_id = entity or self.fresh("h_conv_")
            if event_type == "conversation.started":
                return f.started(tenant, conversation_id, ("user", "u_hostile"), provider_ref="r")
            if event_type == "conversation.message_added":
                blocks: list[dict[str, Any]] = [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "tu1", "name": "search", "input": {"q": "x"}},
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": "y",
                        "is_error": False,
                    },
                ]
                return f.message(tenant, conversation_id, self.fresh("h_msg_"), "assistant", blocks)
            return f.summary(tenant, conversation_id, 1, "a summary", ["h_msg_1"])
        deletion_id = entity or self.fresh("h_del_")
        # A subject nobody has: should a hostile request be applied, it erases nothing real.
        target = {"type": "subject", "id": "u_nobody", "subject_type": "user"}
        return f.deletion(tenant, deletion_id, target, deadline_at=later)


def _projection(event_type: object, topic: TopicSpec) -> str | None:
    if not isinstance(event_type, str):
        return None
    if event_type.startswith("memory."):
        return "memory"
    if event_type.startswith("conversation."):
        return "conversation"
    if event_type.startswith("deletion."):
        return "deletion"
    return PROJECTION_OF.get(topic.base_name)


class _Key(Enum):
    AUTO = "the template's own key"


class _Value(Enum):
    AUTO = "the event's JSON"


def planned_event(
    spec: TopicSpec,
    event: RawEvent,
    expect: Expect,
    kind: str,
    value: bytes | _Value | None = _Value.AUTO,
    key: bytes | _Key | None = _Key.AUTO,
    template: RawEvent | None = None,
) -> Planned:
    """A message made from ``event`` (or the raw ``value`` it was turned into), under the key
    of its ``template`` (the event before a mutation made ``event`` of it; by default
    ``event`` itself) or ``key``. Its ids are the body's as memproj reads them (the last of
    duplicate names), when it reads them at all."""
    raw = orjson.dumps(event) if value is _Value.AUTO else value
    body = _parsed(raw) if raw is not None else None
    read = body if body is not None else event
    return Planned(
        spec,
        key_of(event if template is None else template) if key is _Key.AUTO else key,
        raw,
        expect,
        kind,
        event_id=read.get("event_id") if isinstance(read.get("event_id"), str) else None,
        tenant_id=read.get("tenant_id") if isinstance(read.get("tenant_id"), str) else None,
        projection=_projection(read.get("event_type"), spec),
    )


def _parsed(value: bytes) -> dict[str, Any] | None:
    for parse in (orjson.loads, pydantic_core.from_json):
        try:
            found = parse(value)
        except ValueError:
            continue
        return found if isinstance(found, dict) else None
    return None


Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass(slots=True)
class Round:
    """One hypothesis example's worth of hostile messages."""

    draw: Draw
    maker: Maker
    real: dict[str, list[tuple[str, str]]]  # input topic -> (tenant, entity) of valid events
    large: bool  # whether this round makes the few large messages
    out: list[Planned] = field(default_factory=list)

    def tenant_entity(self, topic: str) -> tuple[str, str | None]:
        """A valid tenant, and a real entity of it or a fresh one (None)."""
        if self.real.get(topic) and self.draw(st.booleans()):
            tenant, entity = self.draw(st.sampled_from(self.real[topic]))
            return tenant, entity
        return self.draw(st.sampled_from(sorted(VALID_TENANTS))), None

    def edge(self, event_type: str) -> RawEvent:
        """A template in ``EDGE_TENANT``, for what may be applied."""
        return self.maker.template(event_type, EDGE_TENANT)

    def add(self, planned: Planned) -> None:
        assert planned.size() < 960_000, (planned.kind, planned.size())
        if planned.spec == DELETION_REQUESTS:
            planned = replace(planned, phase=2)
        self.out.append(planned)


def wrong_and_missing(
    r: Round,
    spec: TopicSpec,
    make: Callable[[], dict[str, Any]],
    id_field: str,
    wrongs: dict[str, st.SearchStrategy[Any]],
    required: list[str],
    label: str,
) -> tuple[dict[str, Any], bytes]:
    """Forged records of ``make``, keyed by ``FORGED_TENANT`` and their ``id_field``: each
    field of ``wrongs`` with a wrong value (``<label>_wrong:<field>``), then one of the
    ``required`` fields missing (``<label>_missing:<field>``). The last record made and its
    key, for the forgeries that follow."""
    for name, wrong in wrongs.items():
        record = {**make(), name: r.draw(wrong)}
        key = f"{FORGED_TENANT}:{record[id_field]}".encode()
        r.add(Planned(spec, key, orjson.dumps(record), Expect.DEAD, f"{label}_wrong:{name}"))
    record = make()
    key = f"{FORGED_TENANT}:{record[id_field]}".encode()
    missing = r.draw(st.sampled_from(required))
    without = {k: v for k, v in record.items() if k != missing}
    r.add(Planned(spec, key, orjson.dumps(without), Expect.DEAD, f"{label}_missing:{missing}"))
    return record, key
