"""Builders for contract events, and the demo's sample stream.

The builders produce raw JSON-ready dicts exactly as an outside producer would send them; the
demo, the benchmark and the tests all build their input here so that there is one way to do it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from topics.registry import input_key

RawEvent = dict[str, Any]
EPOCH = datetime(2026, 8, 8, 9, 0, tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class EventFactory:
    """Makes contract events with unique ids and a clock that moves one second per event."""

    id_prefix: str = "evt"
    clock: datetime = EPOCH
    _counter: int = field(default=0)

    def _envelope(self, event_type: str, tenant_id: str, payload: RawEvent) -> RawEvent:
        self._counter += 1
        self.clock += timedelta(seconds=1)
        return {
            "event_id": f"{self.id_prefix}-{self._counter:08d}",
            "event_type": event_type,
            "schema_version": 1,
            "tenant_id": tenant_id,
            "occurred_at": iso(self.clock),
            "actor": {"type": "agent", "id": "support_agent"},
            "payload": payload,
        }

    def proposed(
        self,
        tenant_id: str,
        memory_id: str,
        subject: tuple[str, str] = ("user", "u1"),
        value: dict[str, Any] | None = None,
        *,
        scope: str = "user",
        kind: str = "preference",
        source: tuple[str, str] = ("message", "conv_1/msg_1"),
        expires_at: datetime | None = None,
        evidence: Sequence[str] = (),
    ) -> RawEvent:
        payload: RawEvent = {
            "memory_id": memory_id,
            "subject": {"type": subject[0], "id": subject[1]},
            "scope": scope,
            "kind": kind,
            "value": value if value is not None else {"text": f"fact about {memory_id}"},
            "source": {"type": source[0], "ref": source[1]},
            "observed_at": iso(self.clock),
        }
        if expires_at is not None:
            payload["expires_at"] = iso(expires_at)
        if evidence:
            payload["evidence_event_ids"] = list(evidence)
        return self._envelope("memory.proposed", tenant_id, payload)

    def reviewed(
        self,
        tenant_id: str,
        memory_id: str,
        reviewed_version: int,
        decision: str = "approved",
        *,
        actor: tuple[str, str] = ("operator", "reviewer_1"),
        note: str | None = None,
    ) -> RawEvent:
        payload: RawEvent = {
            "memory_id": memory_id,
            "reviewed_version": reviewed_version,
            "decision": decision,
        }
        if note is not None:
            payload["note"] = note
        event = self._envelope("memory.reviewed", tenant_id, payload)
        event["actor"] = {"type": actor[0], "id": actor[1]}
        return event

    def verified(
        self,
        tenant_id: str,
        memory_id: str,
        expected_version: int,
        verification: str = "user_supplied",
    ) -> RawEvent:
        return self._envelope(
            "memory.verified",
            tenant_id,
            {
                "memory_id": memory_id,
                "expected_version": expected_version,
                "verification": verification,
            },
        )

    def corrected(
        self,
        tenant_id: str,
        memory_id: str,
        expected_version: int,
        value: dict[str, Any],
        *,
        source: tuple[str, str] = ("message", "conv_1/msg_2"),
        verification: str | None = None,
        expires_at: datetime | None = None,
    ) -> RawEvent:
        payload: RawEvent = {
            "memory_id": memory_id,
            "expected_version": expected_version,
            "value": value,
            "source": {"type": source[0], "ref": source[1]},
            "observed_at": iso(self.clock),
        }
        if verification is not None:
            payload["verification"] = verification
        if expires_at is not None:
            payload["expires_at"] = iso(expires_at)
        return self._envelope("memory.corrected", tenant_id, payload)

    def revoked(
        self,
        tenant_id: str,
        memory_id: str,
        reason: str = "user asked",
        expected_version: int | None = None,
    ) -> RawEvent:
        payload: RawEvent = {"memory_id": memory_id, "reason": reason}
        if expected_version is not None:
            payload["expected_version"] = expected_version
        return self._envelope("memory.revoked", tenant_id, payload)

    def started(
        self,
        tenant_id: str,
        conversation_id: str,
        owner: tuple[str, str] = ("user", "u1"),
        *,
        channel: str = "chat",
        retention_class: str = "standard",
        provider_ref: str | None = None,
    ) -> RawEvent:
        payload: RawEvent = {
            "conversation_id": conversation_id,
            "owner": {"type": owner[0], "id": owner[1]},
            "channel": channel,
            "retention_class": retention_class,
        }
        if provider_ref is not None:
            payload["provider_conversation_ref"] = provider_ref
        return self._envelope("conversation.started", tenant_id, payload)

    def message(
        self,
        tenant_id: str,
        conversation_id: str,
        message_id: str,
        role: str,
        content: str | list[dict[str, Any]],
    ) -> RawEvent:
        """A contract v1 message: ``content`` may be a string or a list of blocks."""
        return self._envelope(
            "conversation.message_added",
            tenant_id,
            {
                "conversation_id": conversation_id,
                "message_id": message_id,
                "role": role,
                "content": content,
            },
        )

    def summary(
        self,
        tenant_id: str,
        conversation_id: str,
        version: int,
        text: str,
        sources: list[str],
    ) -> RawEvent:
        return self._envelope(
            "conversation.summary_updated",
            tenant_id,
            {
                "conversation_id": conversation_id,
                "summary_version": version,
                "text": text,
                "source_message_ids": sources,
            },
        )

    def deletion(
        self,
        tenant_id: str,
        deletion_id: str,
        target: dict[str, str],
        *,
        reason: str = "user asked to be forgotten",
        deadline_at: datetime | None = None,
    ) -> RawEvent:
        payload: RawEvent = {"deletion_id": deletion_id, "target": target, "reason": reason}
        if deadline_at is not None:
            payload["deadline_at"] = iso(deadline_at)
        event = self._envelope("deletion.requested", tenant_id, payload)
        event["actor"] = {"type": "operator", "id": "privacy_desk"}
        return event


def key_of(event: RawEvent) -> bytes:
    payload = event["payload"]
    entity_id = payload.get("memory_id") or payload.get("conversation_id") or payload["deletion_id"]
    return input_key(event["tenant_id"], entity_id).encode()


def to_message(event: RawEvent) -> tuple[bytes, bytes]:
    return key_of(event), orjson.dumps(event)


@dataclass(frozen=True, slots=True)
class SampleMessage:
    key: bytes | None
    value: bytes | None
    # What the demo expects to happen to it, so the summary can be checked by eye.
    expectation: str


def sample_memory_stream(
    memories: int = 1000, tenants: int = 4, seed: int = 7
) -> Iterator[SampleMessage]:
    """A realistic mix: proposals, verifications, corrections, revocations, duplicates,
    version conflicts, expiring memories and a few malformed messages."""
    rng = random.Random(seed)
    factory = EventFactory(id_prefix=f"demo{seed}")
    versions: dict[tuple[str, str], int] = {}
    sent: list[RawEvent] = []

    def emit(event: RawEvent, expectation: str = "applied") -> SampleMessage:
        sent.append(event)
        key, value = to_message(event)
        return SampleMessage(key, value, expectation)

    for index in range(memories):
        tenant = f"tenant_{index % tenants}"
        memory_id = f"mem_{index:05d}"
        subject = ("user", f"user_{rng.randrange(25)}")
        kind = rng.choice(["preference", "fact", "profile", "goal"])
        # Some memories have already expired by the time anyone reads them; some never will.
        lifetime = rng.choice([timedelta(days=1), timedelta(days=3650)])
        expires_at = factory.clock + lifetime if rng.random() < 0.05 else None
        yield emit(
            factory.proposed(
                tenant,
                memory_id,
                subject,
                {"text": f"{kind} {index} of {subject[1]}", "weight": rng.randrange(100)},
                kind=kind,
                source=("message", f"conv_{(index // tenants) % 30}/msg_{index % 4 + 1}"),
                expires_at=expires_at,
            )
        )
        versions[(tenant, memory_id)] = 1
        roll = rng.random()
        key = (tenant, memory_id)
        if roll < 0.35:
            yield emit(factory.verified(tenant, memory_id, versions[key]))
            versions[key] += 1
        if roll < 0.2:
            yield emit(
                factory.corrected(
                    tenant,
                    memory_id,
                    versions[key],
                    {"text": f"corrected {kind} {index}", "weight": rng.randrange(100)},
                    source=("message", f"conv_{(index // tenants) % 30}/msg_{index % 4 + 2}"),
                    verification="crm_field" if rng.random() < 0.5 else None,
                )
            )
            versions[key] += 1
        if rng.random() < 0.08:
            yield emit(factory.verified(tenant, memory_id, versions[key] + 3), "version_conflict")
        if rng.random() < 0.06:
            yield emit(factory.revoked(tenant, memory_id, "user asked to forget"))
            versions[key] += 1
            if rng.random() < 0.5:
                yield emit(factory.verified(tenant, memory_id, versions[key]), "revoked")
        if rng.random() < 0.02:
            yield emit(factory.verified(tenant, f"missing_{index}", 1), "unknown_memory")
        if sent and rng.random() < 0.05:
            duplicate = rng.choice(sent)
            yield SampleMessage(*to_message(duplicate), "redelivered")
        if rng.random() < 0.01:
            yield from _malformed(rng, factory, tenant, index)


def _malformed(
    rng: random.Random, factory: EventFactory, tenant: str, index: int
) -> Iterator[SampleMessage]:
    choice = rng.randrange(5)
    if choice == 0:
        yield SampleMessage(f"{tenant}:bad_{index}".encode(), b"{not json", "dlq:malformed_json")
    elif choice == 1:
        event = factory.proposed(tenant, f"bad_{index}")
        yield SampleMessage(f"{tenant}:other".encode(), orjson.dumps(event), "dlq:key_mismatch")
    elif choice == 2:
        event = factory.proposed(tenant, f"bad_{index}")
        event["schema_version"] = 99
        yield SampleMessage(*to_message(event), "dlq:unknown_schema_version")
    elif choice == 3:
        event = factory.proposed(tenant, f"bad_{index}")
        del event["payload"]["subject"]
        yield SampleMessage(*to_message(event), "dlq:invalid_event")
    else:
        event = factory.proposed(tenant, f"bad_{index}", value={"blob": "x" * 70_000})
        yield SampleMessage(*to_message(event), "dlq:value_too_large")


_CREDENTIALS = (
    "my api key is sk-live-4f9a8b7c6d5e4f3a2b1c",
    "use Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.ZGVtbw.c2ln",
    "the wifi password is Tr0ub4dor&3",
    "card 4111 1111 1111 1111, expiry 09/29",
)


def sample_conversation_stream(
    conversations: int = 120, tenants: int = 4, seed: int = 7
) -> Iterator[SampleMessage]:
    """Conversations with questions, tool exchanges (some with very large results),
    summaries citing their sources, credentials to mask, and refusals."""
    rng = random.Random(seed)
    factory = EventFactory(id_prefix=f"conv{seed}")
    sent: list[RawEvent] = []

    def emit(event: RawEvent, expectation: str = "applied") -> SampleMessage:
        sent.append(event)
        return SampleMessage(*to_message(event), expectation)

    for index in range(conversations):
        tenant = f"tenant_{index % tenants}"
        conversation_id = f"conv_{index // tenants}"
        owner = ("user", f"user_{rng.randrange(25)}")
        yield emit(factory.started(tenant, conversation_id, owner, provider_ref=f"thr_{index}"))
        message_ids: list[str] = []
        for turn in range(rng.randrange(1, 5)):
            ask = f"question {turn} in {conversation_id}"
            if rng.random() < 0.15:
                ask += " - " + rng.choice(_CREDENTIALS)
            message_id = f"msg_{len(message_ids) + 1}"
            message_ids.append(message_id)
            yield emit(factory.message(tenant, conversation_id, message_id, "user", ask))
            if rng.random() < 0.5:
                tool_id = f"tu_{index}_{turn}"
                message_id = f"msg_{len(message_ids) + 1}"
                message_ids.append(message_id)
                use = {"type": "tool_use", "id": tool_id, "name": "search", "input": {"q": ask}}
                yield emit(factory.message(tenant, conversation_id, message_id, "assistant", [use]))
                size = rng.choice([40, 400, 9000])
                result = {"type": "tool_result", "tool_use_id": tool_id, "content": "r" * size}
                message_id = f"msg_{len(message_ids) + 1}"
                message_ids.append(message_id)
                yield emit(factory.message(tenant, conversation_id, message_id, "user", [result]))
            message_id = f"msg_{len(message_ids) + 1}"
            message_ids.append(message_id)
            answer = f"answer {turn} in {conversation_id}"
            yield emit(factory.message(tenant, conversation_id, message_id, "assistant", answer))
        if len(message_ids) > 2 and rng.random() < 0.6:
            sources = message_ids[:-1]
            yield emit(
                factory.summary(tenant, conversation_id, 1, "so far: " + conversation_id, sources)
            )
        if rng.random() < 0.05:
            yield emit(
                factory.summary(tenant, conversation_id, 9, "invented", ["msg_404"]),
                "unknown_source_message",
            )
        if rng.random() < 0.05:
            yield emit(
                factory.message(tenant, f"never_started_{index}", "msg_1", "user", "hello?"),
                "unknown_conversation",
            )
        if sent and rng.random() < 0.05:
            yield SampleMessage(*to_message(rng.choice(sent)), "redelivered")
        if rng.random() < 0.03:
            yield SampleMessage(f"{tenant}:{conversation_id}".encode(), b"[]", "dlq:malformed_json")
