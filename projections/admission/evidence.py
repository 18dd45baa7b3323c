"""The admission stamp of memory events, read from PostgreSQL when the sealer seals them: the
tenant's policy version in force, and which cited evidence events memproj holds.

The stamp goes on the sealed log with the event (``topics.memory.AdmissionStamp``), so that a
rebuild decides from what was true when the event was first decided, not from the database as
it is then. A tenant without a policy gets no stamp: its sealed events stay as they were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from projections.admission import store as admission_store
from projections.admission.policy import DERIVED_SOURCE_TYPES, Policy
from projections.conversation import store as conversation_store
from projections.idempotency import EventKey
from projections.memory import store as memory_store
from projections.sql import Conn, KeyLookups
from topics.envelope import Envelope
from topics.memory import (
    AdmissionStamp,
    EvidenceStamp,
    MemoryEvent,
    MemoryProposed,
)

Stamps = Mapping[EventKey, AdmissionStamp]
NO_STAMPS: Stamps = {}


def cited_evidence(
    events: Sequence[MemoryEvent], stored: Mapping[tuple[str, str], tuple[str, ...]]
) -> dict[EventKey, tuple[str, ...]]:
    """Per event, the evidence its decision is about: a proposal's own ids; a correction's or
    a verification's, its memory's (``stored``: the memories that exist, else the batch's
    first proposal of it)."""
    latest: dict[tuple[str, str], tuple[str, ...]] = {}
    cited: dict[EventKey, tuple[str, ...]] = {}
    for event in events:
        key = (event.tenant_id, event.memory_id)
        if isinstance(event, MemoryProposed):
            if key not in stored and key not in latest:
                # The batch's first proposal of a new memory is the one that can make it.
                latest[key] = event.payload.evidence_event_ids
            cited[event.tenant_id, event.event_id] = event.payload.evidence_event_ids
        else:
            cited[event.tenant_id, event.event_id] = latest.get(key, stored.get(key, ()))
    return cited


def stamp_of(
    cited: tuple[str, ...],
    policy: Policy,
    messages: Mapping[str, bool],
    versions: Mapping[str, str],
) -> AdmissionStamp:
    """The stamp of an event citing ``cited`` under ``policy``, given the messages (event id
    -> primary) and memory versions (event id -> source type) the tenant holds."""
    derived = DERIVED_SOURCE_TYPES | policy.derived_source_types
    available = tuple(i for i in cited if i in messages or i in versions)
    primary = tuple(
        i for i in available if messages.get(i) or (i in versions and versions[i] not in derived)
    )
    return AdmissionStamp(
        policy_version=policy.version,
        evidence=EvidenceStamp(cited=cited, available=available, primary=primary),
    )


async def read_stamps(conn: Conn, events: Sequence[Envelope], lookups: KeyLookups) -> Stamps:
    """The stamps of the batch's memory events whose tenant has a policy."""
    memory_events = [e for e in events if isinstance(e, MemoryEvent)]
    if not memory_events:
        return NO_STAMPS
    tenants = (e.tenant_id for e in memory_events)
    versions = await admission_store.current_versions(conn, tenants, lookups)
    governed = [e for e in memory_events if e.tenant_id in versions]
    if not governed:
        return NO_STAMPS
    policies = await admission_store.load_policies(conn, versions.items(), lookups)
    stored = await memory_store.evidence_of(
        conn,
        {(e.tenant_id, e.memory_id) for e in governed if not isinstance(e, MemoryProposed)},
        lookups,
    )
    cited = cited_evidence(governed, stored)
    wanted: dict[str, set[str]] = defaultdict(set)
    for (tenant, _), event_cited in cited.items():
        wanted[tenant].update(event_cited)
    stamps: dict[EventKey, AdmissionStamp] = {}
    for tenant, ids in wanted.items():
        messages = await conversation_store.evidence_messages(conn, tenant, ids)
        held = await memory_store.evidence_versions(conn, tenant, ids - messages.keys())
        policy = policies[tenant, versions[tenant]]
        for key, of_event in cited.items():
            if key[0] == tenant:
                stamps[key] = stamp_of(of_event, policy, messages, held)
    return stamps
