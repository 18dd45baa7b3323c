"""The governed-writes bench's workload (ops/bench/governed_writes.py): the sample memory
stream of two tenants, its proposals rewritten to cite evidence in their tenant's
conversations and given one of ten kinds, those conversations, and the policy that reviews one
kind in ten. Pure: builds messages, produces nothing."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from projections.admission.policy import PolicyDocument, RuleDocument
from streams.sample import EventFactory, to_message

Message = tuple[bytes | None, bytes | None]
TENANTS = 2
# Ten kinds, one of them reviewed: a proposal's kind is chosen by its memory id.
KINDS = tuple(f"kind_{n}" for n in range(10))
REVIEWED_KIND = KINDS[0]
# One memory in this many cites a message that was never sent: refused under the policy.
MISSING_EVIDENCE_EVERY = 50
CONVERSATIONS_PER_TENANT = 40


def tenants() -> list[str]:
    return [f"tenant_{n}" for n in range(TENANTS)]  # as sample_memory_stream names them


def _bucket(memory_id: str, salt: str, buckets: int) -> int:
    return zlib.crc32(f"{salt}/{memory_id}".encode()) % buckets


@dataclass(frozen=True, slots=True)
class Conversations:
    messages: list[Message]
    # Per tenant, the event ids of its user messages: primary evidence once applied.
    evidence: dict[str, list[str]]
    message_count: int


def conversation_stream(per_tenant: int = CONVERSATIONS_PER_TENANT) -> Conversations:
    """Per tenant, ``per_tenant`` conversations of a user message and an answer."""
    factory = EventFactory(id_prefix="gwconv")
    messages: list[Message] = []
    evidence: dict[str, list[str]] = {tenant: [] for tenant in tenants()}
    count = 0
    for tenant in tenants():
        for number in range(per_tenant):
            conversation = f"conv_{number}"
            messages.append(to_message(factory.started(tenant, conversation)))
            asked = factory.message(tenant, conversation, "msg_1", "user", f"I prefer {number}")
            messages.append(to_message(asked))
            evidence[tenant].append(asked["event_id"])
            answer = factory.message(tenant, conversation, "msg_2", "assistant", "noted")
            messages.append(to_message(answer))
            count += 2
    return Conversations(messages, evidence, count)


def citing_evidence(
    messages: Iterable[Message], evidence: Mapping[str, Sequence[str]]
) -> list[Message]:
    """The memory stream with each proposal of a known tenant given one of ten kinds and one
    evidence event id of its tenant (one memory in ``MISSING_EVIDENCE_EVERY`` cites an id
    that was never sent), both chosen by its memory id: a redelivered duplicate is rewritten
    as its original was, so it stays a duplicate. Anything else passes unchanged."""
    rewritten: list[Message] = []
    for key, value in messages:
        try:
            event = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            rewritten.append((key, value))
            continue
        payload = event.get("payload") if isinstance(event, dict) else None
        cited = evidence.get(event.get("tenant_id", "")) if isinstance(event, dict) else None
        if (
            not isinstance(payload, dict)
            or event.get("event_type") != "memory.proposed"
            or not cited
            or not isinstance(payload.get("memory_id"), str)
        ):
            rewritten.append((key, value))
            continue
        memory_id = payload["memory_id"]
        payload["kind"] = KINDS[_bucket(memory_id, "kind", len(KINDS))]
        if _bucket(memory_id, "missing", MISSING_EVIDENCE_EVERY) == 0:
            payload["evidence_event_ids"] = [f"never-sent-{memory_id}"]
        else:
            payload["evidence_event_ids"] = [cited[_bucket(memory_id, "cites", len(cited))]]
        rewritten.append((key, orjson.dumps(event)))
    return rewritten


def governing_policy() -> PolicyDocument:
    """One kind in ten reviewed, the others admitted; every rule requires evidence."""
    return PolicyDocument(
        rules=tuple(
            RuleDocument(
                kind=kind,
                decision="review" if kind == REVIEWED_KIND else "admit",
                evidence_required=True,
            )
            for kind in KINDS
        )
    ).check()
