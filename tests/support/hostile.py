"""Hostile messages for every topic memproj consumes, each with what must become of it.

``corpus()`` builds, deterministically, a realistic valid stream (``streams.sample``) and,
shuffled in among it, hostile messages drawn with hypothesis: on the input topics every field
of every event type with a wrong type or missing, nesting from 10 to 10,000 levels, huge and
non-finite numbers, duplicate keys, lone surrogates and invalid UTF-8, NUL and control
characters, 900 KB strings and 100,000-element arrays, keys that do not match the body,
non-JSON bytes, JSON that is not an object, unknown event types and schema versions; and on
memproj's own topics (the sealed logs, ``deletion.tombstones``, ``deletion.acks``,
``memory.current``, ``conversation.messages``) forgeries and garbage.

Every message carries an ``Expect``:

- ``VALID``: an event of the valid stream, in one of ``VALID_TENANTS``: never dead-lettered,
  applied exactly as a stream of only the valid events applies it;
- ``DEAD``: certainly invalid under the contract: exactly one dead letter per consuming
  worker, never applied (those in the valid tenants would show in the projection's checksum);
- ``EITHER``: legal but strange, or beyond what the contract decides (a valid event with a
  900 KB ignored field, an integer no 64-bit type holds): one dead letter per consuming worker
  or none, and then decided by its projection (applied or rejected), never lost. Those that
  could change a projection live in ``EDGE_TENANT`` (or ``FORGED_TENANT`` on the outputs).

Hypothesis only chooses (which wrong value, which depth, which field...): the messages are
built from its choices, so that a few hundred choices per example make a few hundred
messages, and the large values are repeated, not drawn. Six derandomized examples make the
corpus, the same on every run of the same code.

``bursts()`` and ``oversized_letters()`` are small corpora of their own, for what the big one
cannot hold without losing its other findings: runs of one poison pill alone on a topic (the
circuit breaker's case), and messages whose dead letter is larger than a Kafka message.
"""

from __future__ import annotations

import base64
import copy
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import Any

import orjson
import pydantic_core
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from projections.stores import STORE_NAMES as STORES
from streams.sample import (
    EPOCH,
    EventFactory,
    RawEvent,
    iso,
    key_of,
    sample_conversation_stream,
    sample_memory_stream,
)
from topics.deletion import Acknowledgement
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
    DELETION_TOMBSTONES.base_name: len(STORES),  # every derived store
    MEMORY_CURRENT.base_name: 2,  # embeddings-index and cache-freshness
    CONVERSATION_MESSAGES.base_name: 1,  # embeddings-index
}
# Where the sealer writes what it accepted from an input topic.
SEALED_OF = {
    MEMORY_EVENTS.base_name: MEMORY_SEALED,
    CONVERSATION_EVENTS.base_name: CONVERSATION_SEALED,
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


# -- JSON surgery ---------------------------------------------------------------------------

Path = tuple[str | int, ...]
_HOLE = "@@hole@@"
_MEMBER = "@@member@@"


def _set(event: Any, path: Path, value: Any) -> Any:
    """A deep copy of ``event`` with ``value`` at ``path`` (added when missing)."""
    event = copy.deepcopy(event)
    target = event
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return event


def _delete(event: Any, path: Path) -> Any:
    event = copy.deepcopy(event)
    target = event
    for step in path[:-1]:
        target = target[step]
    del target[path[-1]]
    return event


def _get(event: Any, path: Path) -> Any:
    for step in path:
        event = event[step]
    return event


def raw_at(event: RawEvent, path: Path, fragment: bytes) -> bytes:
    """The event's JSON with raw JSON text ``fragment`` as the value at ``path``."""
    text = orjson.dumps(_set(event, path, _HOLE))
    assert text.count(b'"' + _HOLE.encode() + b'"') == 1
    return text.replace(b'"' + _HOLE.encode() + b'"', fragment)


def member_in(event: RawEvent, path: Path, member: bytes, first: bool) -> bytes:
    """The event's JSON with the raw member ``member`` (``"name":value``) added to the object
    at ``path``, before its other members or after them."""
    target = _get(event, path)
    assert isinstance(target, dict)
    rebuilt = {_MEMBER: 0, **target} if first else {**target, _MEMBER: 0}
    text = orjson.dumps(_set(event, path, rebuilt) if path else rebuilt)
    marker = b'"' + _MEMBER.encode() + b'":0'
    assert text.count(marker) == 1
    return text.replace(marker, member)


def nested(depth: int, objects: bool) -> bytes:
    """JSON nesting ``depth`` containers deep."""
    if objects:
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth + b"]" * depth


# -- what each field of each event type accepts -------------------------------------------


class Kind(StrEnum):
    ID = "id"  # Identifier: a string of 1 to 128 characters
    ID_OPT = "id_opt"  # an Identifier or null
    REF = "ref"  # 1 to 512 characters
    TEXT = "text"  # 1 to 4096 characters
    STR = "str"  # any string
    STR1 = "str1"  # a non-empty string
    STR512_OPT = "str512_opt"  # at most 512 characters, or null
    INT1 = "int1"  # an integer >= 1 (strict: not "1", not 1.0, not true)
    INT1_OPT = "int1_opt"
    STORED_INT = "stored_int"  # 1 to 2**31 - 1
    VERSION = "version"  # schema_version: exactly the current version
    TS = "ts"  # an RFC 3339 timestamp with a zone
    TS_OPT = "ts_opt"
    OBJ = "obj"  # a nested object (subject, source, actor, owner, target)
    DICT = "dict"  # any JSON object (value, tool input)
    IDS = "ids"  # a list of Identifiers
    IDS1 = "ids1"  # a non-empty list of Identifiers
    ENUM = "enum"  # one of a few strings
    EVENT_TYPE = "event_type"
    BLOCK_TYPE = "block_type"  # "text" in the first content block
    BOOL = "bool"  # strict: true or false
    CONTENT = "content"  # a string or a list of content blocks (message_added v1)
    BLOCK = "block"  # one content block
    TOOL_CONTENT = "tool_content"  # a string or a list of objects


OPTIONAL = {Kind.ID_OPT, Kind.STR512_OPT, Kind.INT1_OPT, Kind.TS_OPT, Kind.IDS, Kind.BOOL}

ENVELOPE: dict[Path, Kind] = {
    ("event_id",): Kind.ID,
    ("event_type",): Kind.EVENT_TYPE,
    ("schema_version",): Kind.VERSION,
    ("tenant_id",): Kind.ID,
    ("occurred_at",): Kind.TS,
    ("actor",): Kind.OBJ,
    ("actor", "type"): Kind.ENUM,
    ("actor", "id"): Kind.ID,
    ("payload",): Kind.OBJ,
}
_SOURCE: dict[Path, Kind] = {
    ("payload", "source"): Kind.OBJ,
    ("payload", "source", "type"): Kind.ID,
    ("payload", "source", "ref"): Kind.REF,
}
PAYLOADS: dict[str, dict[Path, Kind]] = {
    "memory.proposed": {
        ("payload", "memory_id"): Kind.ID,
        ("payload", "subject"): Kind.OBJ,
        ("payload", "subject", "type"): Kind.ID,
        ("payload", "subject", "id"): Kind.ID,
        ("payload", "scope"): Kind.ID,
        ("payload", "kind"): Kind.ID,
        ("payload", "value"): Kind.DICT,
        **_SOURCE,
        ("payload", "observed_at"): Kind.TS,
        ("payload", "expires_at"): Kind.TS_OPT,
        ("payload", "evidence_event_ids"): Kind.IDS,
        ("payload", "evidence_event_ids", 0): Kind.ID,
    },
    "memory.verified": {
        ("payload", "memory_id"): Kind.ID,
        ("payload", "expected_version"): Kind.INT1,
        ("payload", "verification"): Kind.ID_OPT,
    },
    "memory.corrected": {
        ("payload", "memory_id"): Kind.ID,
        ("payload", "expected_version"): Kind.INT1,
        ("payload", "value"): Kind.DICT,
        **_SOURCE,
        ("payload", "observed_at"): Kind.TS,
        ("payload", "expires_at"): Kind.TS_OPT,
        ("payload", "verification"): Kind.ID_OPT,
    },
    "memory.revoked": {
        ("payload", "memory_id"): Kind.ID,
        ("payload", "expected_version"): Kind.INT1_OPT,
        ("payload", "reason"): Kind.TEXT,
    },
    "conversation.started": {
        ("payload", "conversation_id"): Kind.ID,
        ("payload", "owner"): Kind.OBJ,
        ("payload", "owner", "type"): Kind.ID,
        ("payload", "owner", "id"): Kind.ID,
        ("payload", "channel"): Kind.ID,
        ("payload", "retention_class"): Kind.ID,
        ("payload", "provider_conversation_ref"): Kind.STR512_OPT,
    },
    "conversation.message_added": {
        ("payload", "conversation_id"): Kind.ID,
        ("payload", "message_id"): Kind.ID,
        ("payload", "role"): Kind.ENUM,
        ("payload", "content"): Kind.CONTENT,
        ("payload", "content", 0): Kind.BLOCK,
        ("payload", "content", 0, "type"): Kind.BLOCK_TYPE,
        ("payload", "content", 0, "text"): Kind.STR,
        ("payload", "content", 1, "id"): Kind.ID,
        ("payload", "content", 1, "name"): Kind.ID,
        ("payload", "content", 1, "input"): Kind.DICT,
        ("payload", "content", 2, "tool_use_id"): Kind.ID,
        ("payload", "content", 2, "content"): Kind.TOOL_CONTENT,
        ("payload", "content", 2, "is_error"): Kind.BOOL,
    },
    "conversation.summary_updated": {
        ("payload", "conversation_id"): Kind.ID,
        ("payload", "summary_version"): Kind.STORED_INT,
        ("payload", "text"): Kind.STR1,
        ("payload", "source_message_ids"): Kind.IDS1,
        ("payload", "source_message_ids", 0): Kind.ID,
    },
    "deletion.requested": {
        ("payload", "deletion_id"): Kind.ID,
        ("payload", "target"): Kind.OBJ,
        ("payload", "target", "type"): Kind.ENUM,
        ("payload", "target", "id"): Kind.ID,
        # Required: the target is a subject.
        ("payload", "target", "subject_type"): Kind.ID,
        ("payload", "reason"): Kind.TEXT,
        ("payload", "deadline_at"): Kind.TS_OPT,
    },
}
EVENT_TYPES = {
    MEMORY_EVENTS.base_name: (
        "memory.proposed",
        "memory.verified",
        "memory.corrected",
        "memory.revoked",
    ),
    CONVERSATION_EVENTS.base_name: (
        "conversation.started",
        "conversation.message_added",
        "conversation.summary_updated",
    ),
    DELETION_REQUESTS.base_name: ("deletion.requested",),
}
ALL_EVENT_TYPES = frozenset(t for types in EVENT_TYPES.values() for t in types)
PROJECTION_OF = {
    MEMORY_EVENTS.base_name: "memory",
    CONVERSATION_EVENTS.base_name: "conversation",
    DELETION_REQUESTS.base_name: "deletion",
}
# The deepest nesting the codec accepts (topics.codec.MAX_NESTING).
MAX_NESTING = 64

# -- strategies of certainly wrong values ----------------------------------------------------

# What orjson writes: 64-bit integers (the larger ones are made as raw JSON text).
_ints = st.integers(-(2**63), 2**64 - 1)
_small_lists = st.lists(st.integers(-3, 3), min_size=1, max_size=3)
_small_dicts = st.dictionaries(
    st.sampled_from(["a", "b", "type", "id"]), st.integers(0, 3), max_size=2
)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=32)
_strings = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=8)
_not_str = st.one_of(_ints, _floats, st.booleans(), _small_lists, _small_dicts)
_not_int = st.one_of(
    _strings,
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    _small_lists,
    _small_dicts,
)
_not_container = st.one_of(_strings, _ints, _floats, st.booleans())
_timestamps_wrong = st.one_of(
    st.sampled_from(
        [
            "yesterday",
            "2026-08-08T09:30:00",  # no zone
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-08-08T25:00:00Z",
            "",
            "09:30:00Z",
            "2026-08-08T09:30:00+25:00",
        ]
    ),
    st.booleans(),
    _small_lists,
    _small_dicts,
)


def _long(minimum: int) -> st.SearchStrategy[str]:
    return st.integers(minimum, minimum + 2000).map(lambda n: "x" * n)


def wrong_values(kind: Kind) -> st.SearchStrategy[Any]:
    """Values that no field of ``kind`` accepts."""
    null = st.none()
    match kind:
        case Kind.ID:
            return st.one_of(_not_str, null, st.just(""), _long(129))
        case Kind.ID_OPT:
            return st.one_of(_not_str, st.just(""), _long(129))
        case Kind.REF:
            return st.one_of(_not_str, null, st.just(""), _long(513))
        case Kind.TEXT:
            return st.one_of(_not_str, null, st.just(""), _long(4097))
        case Kind.STR:
            return st.one_of(_not_str, null)
        case Kind.STR1:
            return st.one_of(_not_str, null, st.just(""))
        case Kind.STR512_OPT:
            return st.one_of(_not_str, _long(513))
        case Kind.INT1:
            return st.one_of(_not_int, null, st.integers(-(2**63), 0))
        case Kind.INT1_OPT:
            return st.one_of(_not_int, st.integers(-(2**63), 0))
        case Kind.STORED_INT:
            return st.one_of(
                _not_int, null, st.integers(-(2**63), 0), st.integers(2**31, 2**63 - 1)
            )
        case Kind.VERSION:
            return st.one_of(_not_int, null, _ints.filter(lambda v: v not in (1, 2)))
        case Kind.TS:
            return st.one_of(_timestamps_wrong, null)
        case Kind.TS_OPT:
            return _timestamps_wrong
        case Kind.OBJ | Kind.DICT:
            return st.one_of(_not_container, null, _small_lists)
        case Kind.IDS:
            return st.one_of(
                _strings, _ints, _small_dicts, _small_lists, st.just([""]), st.just([None])
            )
        case Kind.IDS1:
            return st.one_of(_strings, _ints, null, _small_dicts, _small_lists, st.just([]))
        case Kind.ENUM:
            return st.one_of(
                st.sampled_from(["bogus", "", "USER", "Agent ", "system"]),
                _ints,
                null,
                _small_lists,
            )
        case Kind.EVENT_TYPE:
            return st.one_of(
                st.sampled_from(
                    [
                        "memory.deleted",
                        "Memory.Proposed",
                        "memory.proposed ",
                        "",
                        "conversation.ended",
                        "deletion.acknowledged.v2",
                    ]
                ),
                _ints,
                null,
                _small_lists,
                _small_dicts,
            )
        case Kind.BLOCK_TYPE:
            return st.one_of(
                st.sampled_from(["image", "TEXT", "", "tool_use", "tool_result"]),
                _ints,
                null,
            )
        case Kind.BOOL:
            return st.one_of(st.sampled_from(["true", "false", "yes"]), _ints, _small_lists, null)
        case Kind.CONTENT:
            return st.one_of(
                _ints,
                st.booleans(),
                null,
                _small_dicts,
                st.lists(_ints, min_size=1, max_size=3),
                st.sampled_from(
                    [
                        [{}],
                        [{"type": "image"}],
                        [{"type": "text"}],
                        [{"type": "text", "text": 5}],
                        [["text"]],
                    ]
                ),
            )
        case Kind.BLOCK:
            return st.one_of(
                _strings,
                _ints,
                null,
                _small_lists,
                st.sampled_from([{}, {"type": "image"}, {"text": "no type"}]),
            )
        case Kind.TOOL_CONTENT:
            return st.one_of(
                _ints,
                st.booleans(),
                null,
                _small_dicts,
                st.lists(_ints, min_size=1, max_size=3),
            )
    raise AssertionError(kind)


# -- the templates ---------------------------------------------------------------------------


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


def _entity_field(event_type: str) -> str:
    if event_type.startswith("memory."):
        return "memory_id"
    if event_type.startswith("conversation."):
        return "conversation_id"
    return "deletion_id"


def _key(event: RawEvent) -> bytes:
    return key_of(event)


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
) -> Planned:
    """A message made from ``event`` (or the raw ``value`` it was turned into)."""
    return planned_body(spec, event, event, expect, kind, value, key)


def planned_body(
    spec: TopicSpec,
    template: RawEvent,
    event: RawEvent,
    expect: Expect,
    kind: str,
    value: bytes | _Value | None = _Value.AUTO,
    key: bytes | _Key | None = _Key.AUTO,
) -> Planned:
    """A message of ``event``, a ``template`` as a mutation left it, under the template's key
    (or ``key``). Its ids are the body's as memproj reads them (the last of duplicate names),
    when it reads them at all."""
    raw = orjson.dumps(event) if value is _Value.AUTO else value
    body = _parsed(raw) if raw is not None else None
    read = body if body is not None else event
    return Planned(
        spec,
        _key(template) if key is _Key.AUTO else key,
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


# -- the hostile families --------------------------------------------------------------------

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

    def add(self, planned: Planned) -> None:
        assert planned.size() < 960_000, (planned.kind, planned.size())
        if planned.spec == DELETION_REQUESTS:
            planned = replace(planned, phase=2)
        self.out.append(planned)


def wrong_types(r: Round, spec: TopicSpec) -> None:
    """Every field of every event type of the topic with a wrong value, and every required
    field missing."""
    for event_type in EVENT_TYPES[spec.base_name]:
        for path, kind in {**ENVELOPE, **PAYLOADS[event_type]}.items():
            tenant, entity = r.tenant_entity(spec.base_name)
            event = r.maker.template(event_type, tenant, entity)
            label = ".".join(str(p) for p in path)
            wrong = r.draw(wrong_values(kind))
            r.add(
                planned_body(
                    spec,
                    event,
                    _set(event, path, wrong),
                    Expect.DEAD,
                    f"wrong_type:{event_type}:{label}",
                )
            )
            # A list without its first element is still a list.
            if kind not in OPTIONAL and not isinstance(path[-1], int):
                r.add(
                    planned_body(
                        spec,
                        event,
                        _delete(event, path),
                        Expect.DEAD,
                        f"missing:{event_type}:{label}",
                    )
                )


def _edge(r: Round, event_type: str) -> RawEvent:
    return r.maker.template(event_type, EDGE_TENANT)


# Where a nesting goes, per event type: (path of the hole, whether the contract reads it).
def _nest_paths(event_type: str) -> list[Path]:
    paths: list[Path] = [("extra",), ("payload", "extra")]
    if event_type in ("memory.proposed", "memory.corrected"):
        paths.append(("payload", "value", "deep"))
    if event_type == "conversation.message_added":
        paths.append(("payload", "content", 1, "input", "deep"))
    return paths


_DEPTHS = st.one_of(
    st.sampled_from(
        [
            10,
            30,
            58,
            59,
            60,
            61,
            62,
            63,
            64,
            65,
            100,
            200,
            254,
            255,
            300,
            1000,
            1023,
            1024,
            1025,
            5000,
            10_000,
        ]
    ),
    st.integers(10, 10_000),
)


def nesting(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        depth = r.draw(_DEPTHS)
        objects = r.draw(st.booleans())
        path = r.draw(st.sampled_from(_nest_paths(event_type)))
        event = _edge(r, event_type)
        total = len(path) + depth
        expect = Expect.DEAD if total > MAX_NESTING else Expect.EITHER
        kind = f"nesting:{event_type}:{'.'.join(map(str, path))}:{depth}"
        r.add(planned_event(spec, event, expect, kind, raw_at(event, path, nested(depth, objects))))
        # In a field that holds a string: wrong, whatever the depth.
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        string_path = r.draw(
            st.sampled_from(
                [("event_id",), ("actor", "id"), ("payload", _entity_field(event_type))]
            )
        )
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"nesting_in_string:{event_type}:{depth}",
                raw_at(event, string_path, nested(depth, objects)),
            )
        )


_NOT_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"nan", b"+1", b"01", b"1.", b".5", b"0x10"]
_HUGE = [b"1e400", b"-1e400", b"1E+999", b"-4e9999"]
_BIG_INTS = [str(v).encode() for v in (2**63, 2**64, 2**70, -(2**70), 10**30)]


def numbers(r: Round, spec: TopicSpec) -> None:
    event_types = EVENT_TYPES[spec.base_name]
    for event_type in event_types:
        for where in _nest_paths(event_type):
            event = _edge(r, event_type)
            literal = r.draw(st.sampled_from(_NOT_NUMBERS + _HUGE + _BIG_INTS))
            # Not a number JSON has (NaN), or none a double holds (1e400): in a value the
            # projection stores, it could only be stored altered.
            read = where[-1] == "deep"
            if literal in _NOT_NUMBERS or (read and literal in _HUGE):
                expect = Expect.DEAD
            else:
                expect = Expect.EITHER
            r.add(
                planned_event(
                    spec,
                    event,
                    expect,
                    f"number:{event_type}:{where[-1]}:{literal!r}",
                    raw_at(event, where, literal),
                )
            )
    # The integer fields: schema_version is exactly the current one; versions are counted.
    for event_type in event_types:
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        literal = r.draw(st.sampled_from(_NOT_NUMBERS + _HUGE + _BIG_INTS))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"number:{event_type}:schema_version",
                raw_at(event, ("schema_version",), literal),
            )
        )
    int_fields = {
        "memory.verified": ("payload", "expected_version"),
        "memory.corrected": ("payload", "expected_version"),
        "memory.revoked": ("payload", "expected_version"),
        "conversation.summary_updated": ("payload", "summary_version"),
    }
    for event_type, path in int_fields.items():
        if event_type not in event_types:
            continue
        literal = r.draw(st.sampled_from(_NOT_NUMBERS + _HUGE + _BIG_INTS))
        stored = event_type == "conversation.summary_updated"
        if literal in _BIG_INTS and literal.startswith(b"-"):
            expect = Expect.DEAD
        elif literal in _BIG_INTS and not stored:
            # expected_version has no upper bound: a version conflict, or a dead letter.
            expect = Expect.EITHER
        else:
            expect = Expect.DEAD
        event = (
            _edge(r, event_type)
            if expect is Expect.EITHER
            else r.maker.template(event_type, *r.tenant_entity(spec.base_name))
        )
        r.add(
            planned_event(
                spec,
                event,
                expect,
                f"number:{event_type}:{path[-1]}:{literal!r}",
                raw_at(event, path, literal),
            )
        )


def duplicates(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        entity_field = _entity_field(event_type)
        # The last one wins in both of memproj's parsers: a last that does not match the key.
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        other = orjson.dumps(r.maker.fresh("h_dup_"))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"duplicate:{event_type}:last_mismatch",
                member_in(
                    event, ("payload",), b'"' + entity_field.encode() + b'":' + other, first=False
                ),
            )
        )
        # A last that is of the wrong type.
        name = r.draw(st.sampled_from(["event_id", "tenant_id", "occurred_at", "payload"]))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"duplicate:{event_type}:last_wrong:{name}",
                member_in(event, (), b'"' + name.encode() + b'":[12]', first=False),
            )
        )
        # A first that is wrong and a last that is right, or both the same: what is applied
        # is the last; a dead letter would do too (duplicate names are not interoperable).
        event = _edge(r, event_type)
        name = r.draw(st.sampled_from(["event_id", "occurred_at", "payload", "actor"]))
        first = r.draw(st.sampled_from([b"12", b"null", orjson.dumps(event[name])]))
        r.add(
            planned_event(
                spec,
                event,
                Expect.EITHER,
                f"duplicate:{event_type}:first_wrong:{name}",
                member_in(event, (), b'"' + name.encode() + b'":' + first, first=True),
            )
        )


_SURROGATES = [b'"\\ud800"', b'"a\\udfffb"', b'"\\ud800\\ud800"', b'"\\udbff"', b'"x\\ud83d"']
_BAD_UTF8 = [b'"\xff"', b'"\xc0\x80"', b'"\xed\xa0\x80"', b'"a\xe2\x82"', b'"\xf8\x88\x80\x80\x80"']
_NUL = [b'"\\u0000"', b'"a\\u0000b"', b'"\x00"', b'"a\x01b"', b'"tab\there"', b'"\x1f"']
_CONTROL_OK = [
    b'"a\\u0001b"',
    b'"\\u001f"',
    b'"\\u007f"',
    b'"\\u2028\\u2029"',
    b'"\\ud83d\\ude00"',
    b'"\\u0085\\ufeff"',
    b'"\\t\\n\\r"',
]


def unicode(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        fragment = r.draw(st.sampled_from(_SURROGATES + _BAD_UTF8 + _NUL))
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        paths = [*_nest_paths(event_type), ("event_id",), ("actor", "id")]
        if event_type in ("memory.proposed", "memory.corrected"):
            paths.append(("payload", "value", "text"))
        if event_type == "conversation.message_added":
            paths.append(("payload", "content", 0, "text"))
        path = r.draw(st.sampled_from(paths))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"unicode:{event_type}:{path[-1]}:{fragment!r}",
                raw_at(event, path, fragment),
            )
        )
        # The same as a member name.
        fragment = r.draw(st.sampled_from(_SURROGATES + _BAD_UTF8 + _NUL))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"unicode_name:{event_type}:{fragment!r}",
                member_in(
                    event,
                    r.draw(st.sampled_from([(), ("payload",)])),
                    fragment + b":1",
                    first=r.draw(st.booleans()),
                ),
            )
        )
        # Escaped control characters and astral characters are valid strings.
        fragment = r.draw(st.sampled_from(_CONTROL_OK))
        event = _edge(r, event_type)
        path = r.draw(st.sampled_from(paths))
        r.add(
            planned_event(
                spec,
                event,
                Expect.EITHER,
                f"control:{event_type}:{path[-1]}:{fragment!r}",
                raw_at(event, path, fragment),
            )
        )
    # Control characters in the ids, and so in the key (which matches the body).
    event_type = r.draw(st.sampled_from(EVENT_TYPES[spec.base_name]))
    odd = r.draw(st.sampled_from(["\x01", "\x7f", "\u2028", "\U0001f600", "\t", "\ufeff"]))
    event = r.maker.template(event_type, EDGE_TENANT + odd, r.maker.fresh("h_odd_") + odd)
    r.add(planned_event(spec, event, Expect.EITHER, f"control_ids:{event_type}:{odd!r}"))


def sizes(r: Round, spec: TopicSpec) -> None:
    """900 KB strings and 100,000-element arrays (made by the large rounds only)."""
    topic = spec.base_name
    seed = r.draw(
        st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1, max_size=4)
    )
    big = (seed * (LARGE // len(seed) + 1))[:LARGE]
    if topic == MEMORY_EVENTS.base_name:
        tenant, entity = r.tenant_entity(topic)
        cases: list[tuple[str, Path, Any, Expect]] = [
            ("memory.proposed", ("payload", "value", "blob"), big, Expect.DEAD),
            ("memory.revoked", ("payload", "reason"), big, Expect.DEAD),
            ("memory.verified", ("event_id",), big, Expect.DEAD),
            ("memory.proposed", ("payload", "value", "list"), [0] * ARRAY, Expect.DEAD),
            ("memory.proposed", ("payload", "subject", "id"), [0] * ARRAY, Expect.DEAD),
        ]
        for event_type, path, value, expect in cases:
            event = r.maker.template(event_type, tenant, entity)
            r.add(
                planned_body(
                    spec, event, _set(event, path, value), expect, f"size:{event_type}:{path[-1]}"
                )
            )
        edge_cases: list[tuple[str, Path, Any]] = [
            ("memory.proposed", ("extra",), big),
            ("memory.verified", ("payload", "extra"), [0] * ARRAY),
            ("memory.proposed", ("payload", "evidence_event_ids"), ["e"] * ARRAY),
        ]
        for event_type, path, value in edge_cases:
            event = _edge(r, event_type)
            r.add(
                planned_body(
                    spec,
                    event,
                    _set(event, path, value),
                    Expect.EITHER,
                    f"size:{event_type}:{path[-1]}",
                )
            )
    elif topic == CONVERSATION_EVENTS.base_name:
        edge_cases = [
            ("conversation.message_added", ("payload", "content"), big),
            ("conversation.message_added", ("payload", "content"), big[: LARGE * 2 // 3]),
            ("conversation.message_added", ("payload", "content", 2, "content"), big),
            ("conversation.summary_updated", ("payload", "text"), big),
            (
                "conversation.summary_updated",
                ("payload", "source_message_ids"),
                [f"m{i}" for i in range(ARRAY)],
            ),
            ("conversation.started", ("extra",), [0] * ARRAY),
        ]
        for event_type, path, value in edge_cases:
            event = _edge(r, event_type)
            r.add(
                planned_body(
                    spec,
                    event,
                    _set(event, path, value),
                    Expect.EITHER,
                    f"size:{event_type}:{path[-1]}",
                )
            )
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("conversation.message_added", tenant, entity)
        r.add(
            planned_body(
                spec,
                event,
                _set(event, ("payload", "content"), ["x"] * ARRAY),
                Expect.DEAD,
                "size:conversation.message_added:content_strings",
            )
        )
    else:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("deletion.requested", tenant, entity)
        r.add(
            planned_body(
                spec,
                event,
                _set(event, ("payload", "reason"), big),
                Expect.DEAD,
                "size:deletion.requested:reason",
            )
        )
        event = r.maker.template("deletion.requested", tenant, entity)
        r.add(
            planned_body(
                spec,
                event,
                _set(event, ("payload", "target", "id"), [0] * ARRAY),
                Expect.DEAD,
                "size:deletion.requested:target.id",
            )
        )
    # A key of 900 KB (its dead letter holds its first 4096 characters, and the message's key
    # is the original one).
    event_type = EVENT_TYPES[topic][0]
    tenant, entity = r.tenant_entity(topic)
    event = r.maker.template(event_type, tenant, entity)
    r.add(
        planned_event(
            spec,
            event,
            Expect.DEAD,
            "size:key:900KB",
            key=_key(event) + big.encode()[: LARGE - 1000],
        )
    )


def keys(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        proper = _key(event)
        other_tenant = next(t for t in sorted(VALID_TENANTS) if t != tenant)
        wrong = r.draw(
            st.sampled_from(
                [
                    None,
                    b"",
                    proper + b" ",
                    proper.upper(),
                    proper.split(b":", 1)[1],
                    other_tenant.encode() + b":" + proper.split(b":", 1)[1],
                    proper + b"\x00",
                    proper + b"\xff",
                    b"\xff\xfe" + proper,
                    proper.replace(b":", b"::", 1),
                    b":" + proper,
                    proper + b":",
                ]
            )
        )
        r.add(planned_event(spec, event, Expect.DEAD, f"key:{event_type}:{wrong!r}", key=wrong))


def framing(r: Round, spec: TopicSpec) -> None:
    tenant, entity = r.tenant_entity(spec.base_name)
    event_type = r.draw(st.sampled_from(EVENT_TYPES[spec.base_name]))
    event = r.maker.template(event_type, tenant, entity)
    text = orjson.dumps(event)
    cut = r.draw(st.integers(0, len(text) - 1))
    noise = r.draw(st.binary(min_size=1, max_size=48))
    values: list[tuple[str, bytes | None]] = [
        ("null_value", None),
        ("empty", b""),
        ("binary", noise),
        ("truncated", text[:cut]),
        ("trailing_garbage", text + b"}"),
        ("two_documents", text + b" " + text),
        ("nul_after", text + b"\x00"),
        ("array_of_event", b"[" + text + b"]"),
        (
            "json",
            r.draw(
                st.sampled_from(
                    [
                        b"[]",
                        b"{}",
                        b"0",
                        b"-1.5",
                        b'"text"',
                        b"true",
                        b"null",
                        b'[{"event_id":"x"}]',
                        b"1e400",
                    ]
                )
            ),
        ),
        (
            "not_json",
            r.draw(
                st.sampled_from(
                    [
                        b"{not json",
                        b"<xml/>",
                        b"\x1f\x8b\x08\x00",
                        b"event_id=1&tenant_id=t",
                        b"{'a': 1}",
                    ]
                )
            ),
        ),
    ]
    for name, value in values:
        r.add(planned_event(spec, event, Expect.DEAD, f"framing:{name}", value=value))
    # Whitespace around the object is JSON; a byte order mark may be ignored or refused.
    event = _edge(r, event_type)
    text = orjson.dumps(event)
    wrapped = r.draw(st.sampled_from([b" \n\t" + text + b"\r\n ", b"\xef\xbb\xbf" + text]))
    r.add(
        planned_event(spec, event, Expect.EITHER, f"framing:wrapped:{wrapped[:3]!r}", value=wrapped)
    )


def types_and_versions(r: Round, spec: TopicSpec) -> None:
    topic = spec.base_name
    for event_type in EVENT_TYPES[topic]:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template(event_type, tenant, entity)
        version = r.draw(
            st.one_of(
                st.sampled_from([0, -1, 3, 99, 2**31, 2**63 - 1, "1", 1.0, True, None, [1]]),
                st.integers(3, 2**63 - 1),
            )
        )
        if event_type != "conversation.message_added" and version == 2:
            version = 3
        r.add(
            planned_body(
                spec,
                event,
                _set(event, ("schema_version",), version),
                Expect.DEAD,
                f"schema_version:{event_type}:{version!r}",
            )
        )
    # message_added at version 2 carries blocks only: a string is the v1 form.
    if topic == CONVERSATION_EVENTS.base_name:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("conversation.message_added", tenant, entity)
        event["schema_version"] = 2
        r.add(
            planned_body(
                spec,
                event,
                _set(event, ("payload", "content"), "a string"),
                Expect.DEAD,
                "schema_version:message_added_v2_string",
            )
        )
        event = _set(_edge(r, "conversation.message_added"), ("schema_version",), 2)
        r.add(planned_event(spec, event, Expect.EITHER, "schema_version:message_added_v2_blocks"))
    # Event types of other topics: not valid here (the contract names each topic's types).
    foreign = sorted(ALL_EVENT_TYPES - set(EVENT_TYPES[topic]))
    event_type = r.draw(st.sampled_from(foreign))
    event = r.maker.template(event_type, EDGE_TENANT)
    r.add(planned_event(spec, event, Expect.DEAD, f"foreign_type:{event_type}"))
    if topic == DELETION_REQUESTS.base_name:
        ack = acknowledgement(r.maker, EDGE_TENANT)
        r.add(
            Planned(
                spec,
                _ack_key(ack),
                orjson.dumps(ack),
                Expect.DEAD,
                "foreign_type:ack",
                event_id=_ack_event_id(ack),
                tenant_id=EDGE_TENANT,
                projection="deletion",
            )
        )


INPUT_FAMILIES = (
    wrong_types,
    nesting,
    numbers,
    duplicates,
    unicode,
    keys,
    framing,
    types_and_versions,
)


# -- forgeries on memproj's own topics -------------------------------------------------------

_GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"[]",
            b"{}",
            b"0",
            b'"x"',
            b"true",
            b"null",
            b"{bad",
            b"[1,2",
            b"NaN",
            b'{"a":1}{"b":2}',
            b"\xff\xfe\xfd",
        ]
    ),
)


def sealed_event(event: RawEvent, sealed: Any) -> RawEvent:
    """``event`` as the sealed log carries it, its personal fields replaced by ``sealed``."""
    personal = {
        "memory.proposed": ("value",),
        "memory.corrected": ("value",),
        "conversation.message_added": ("content",),
        "conversation.summary_updated": ("text",),
    }
    payload = {
        k: v for k, v in event["payload"].items() if k not in personal.get(event["event_type"], ())
    }
    payload["sealed"] = sealed
    return {**event, "payload": payload}


def _seal_name(topic: str, event: RawEvent) -> str:
    entity_type = "memory" if topic.startswith("memory") else "conversation"
    return f"{entity_type}:{event['payload'][_entity_field(event['event_type'])]}"


_FIELDS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(["", "!!!not base64!!!", "AAAA", "=", 5, None, [], {}]),
    st.binary(min_size=1, max_size=60).map(lambda b: base64.b64encode(b).decode()),
)


def forged_sealed(r: Round, spec: TopicSpec) -> None:
    topic = SEALED_RAW[spec.base_name]
    personal_types = [
        t
        for t in EVENT_TYPES[topic]
        if t
        in (
            "memory.proposed",
            "memory.corrected",
            "conversation.message_added",
            "conversation.summary_updated",
        )
    ]
    for _ in range(2):
        event_type = r.draw(st.sampled_from(personal_types))
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template(event_type, tenant, entity)
        name = _seal_name(topic, event)
        # Sealed fields that are not an object: refused whatever the keys.
        sealed = r.draw(st.sampled_from(["sealed", [], None, 5, True]))
        r.add(
            planned_body(
                spec,
                event,
                sealed_event(event, sealed),
                Expect.DEAD,
                f"forged_seal:{event_type}:{type(sealed).__name__}",
            )
        )
        # Sealed fields that are an object: refused as unreadable when the entity has a data
        # key (it cannot open them), taken as shredded when it has none (a deletion destroyed
        # it, as far as memproj can tell): decided, never applied.
        sealed = r.draw(
            st.sampled_from(
                [
                    {"entity": name, "fields": r.draw(_FIELDS)},
                    {"entity": "memory:somebody_else", "fields": "AAAA"},
                    {"fields": r.draw(_FIELDS)},
                    {"entity": name},
                ]
            )
        )
        r.add(
            planned_body(
                spec,
                event,
                sealed_event(event, sealed),
                Expect.EITHER,
                f"forged_seal_object:{event_type}",
            )
        )
        # The payload not an object.
        payload = r.draw(st.sampled_from(["x", [1], None, 5, [event["payload"]]]))
        r.add(
            planned_body(
                spec,
                event,
                {**event, "payload": payload},
                Expect.DEAD,
                f"forged_payload:{event_type}:{type(payload).__name__}",
            )
        )
        # Garbage, and every field with a wrong type (the sealed form decodes like the raw).
        r.add(Planned(spec, _key(event), r.draw(_GARBAGE), Expect.DEAD, "forged_garbage"))
        path, kind = r.draw(st.sampled_from(sorted(ENVELOPE.items())))
        wrong = _set(
            sealed_event(event, {"entity": name, "fields": "AAAA"}),
            path,
            r.draw(wrong_values(kind)),
        )
        r.add(
            planned_body(
                spec, event, wrong, Expect.DEAD, f"forged_wrong_type:{'.'.join(map(str, path))}"
            )
        )
        r.add(
            planned_body(
                spec,
                event,
                sealed_event(event, {"entity": name, "fields": "AAAA"}),
                Expect.DEAD,
                "forged_key_mismatch",
                key=b"tenant_0:someone_else",
            )
        )
        nest = r.draw(st.integers(MAX_NESTING - 1, 10_000))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"forged_nesting:{nest}",
                raw_at(
                    sealed_event(event, {"entity": name}),
                    ("payload", "x"),
                    nested(nest, r.draw(st.booleans())),
                ),
            )
        )
    # Forged fields for an entity of the valid stream whose data key exists (tenant_1 has no
    # deletion): they cannot be opened. Produced once the valid stream is sealed.
    real = [(t, e) for t, e in r.real.get(topic, []) if t == "tenant_1"]
    for _ in range(3):
        tenant, entity = r.draw(st.sampled_from(real))
        event_type = r.draw(st.sampled_from(personal_types))
        event = r.maker.template(event_type, tenant, entity)
        sealed = {"entity": _seal_name(topic, event), "fields": r.draw(_FIELDS)}
        r.add(
            replace(
                planned_body(
                    spec,
                    event,
                    sealed_event(event, sealed),
                    Expect.DEAD,
                    f"forged_seal_unopenable:{event_type}",
                ),
                phase=1,
            )
        )
    # Marked erased by the sealer: a forgery memproj cannot tell, decided as unreadable; and
    # a plaintext event without a seal, which the sealed codec takes as it is.
    event_type = r.draw(st.sampled_from(personal_types))
    event = _edge(r, event_type)
    r.add(
        planned_body(
            spec,
            event,
            sealed_event(event, {"entity": _seal_name(topic, event), "erased": True}),
            Expect.EITHER,
            f"forged_erased:{event_type}",
        )
    )
    r.add(planned_event(spec, _edge(r, event_type), Expect.EITHER, f"forged_plain:{event_type}"))


SEALED_RAW = {
    MEMORY_SEALED.base_name: MEMORY_EVENTS.base_name,
    CONVERSATION_SEALED.base_name: CONVERSATION_EVENTS.base_name,
}


def acknowledgement(maker: Maker, tenant: str) -> dict[str, Any]:
    return {
        "event_type": "deletion.acknowledged",
        "deletion_id": maker.fresh("h_ackdel_"),
        "tenant_id": tenant,
        "store": "embeddings",
        "status": "done",
        "removed_count": 0,
        "acked_at": iso(CLOCK),
        "error": None,
        "attempt": 1,
    }


def _ack_key(ack: dict[str, Any]) -> bytes:
    return f"{ack['tenant_id']}:{ack['deletion_id']}".encode()


def _ack_event_id(ack: dict[str, Any]) -> str | None:
    try:
        return Acknowledgement.model_validate(ack).event_id
    except ValueError:
        return None


_ACK_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "deletion_id": st.one_of(_ints, st.none(), _small_lists, _small_dicts),
    "tenant_id": st.one_of(_ints, st.none(), _small_lists),
    "store": st.one_of(st.sampled_from(["bogus", "EMBEDDINGS", ""]), _ints, st.none()),
    "status": st.one_of(st.sampled_from(["maybe", "DONE", ""]), _ints, st.none()),
    "removed_count": st.one_of(
        st.sampled_from(["abc", -1, 2**31, 2**40, 1.5]), st.none(), _small_lists
    ),
    "acked_at": st.one_of(
        st.sampled_from(["yesterday", "", "2026-13-01T00:00:00Z"]),
        st.none(),
        _small_lists,
        _small_dicts,
    ),
    "error": st.one_of(_ints, _small_lists, _small_dicts),
    "attempt": st.one_of(st.sampled_from(["abc", 1.5]), st.none(), _small_lists),
}


def forged_acks(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _ACK_WRONG.items():
        ack = {**acknowledgement(r.maker, "tenant_0"), name: r.draw(wrong)}
        key = b"tenant_0:" + str(ack["deletion_id"]).encode()
        r.add(Planned(spec, key, orjson.dumps(ack), Expect.DEAD, f"ack_wrong_type:{name}"))
        missing = acknowledgement(r.maker, "tenant_0")
        if name != "error" and name != "attempt":
            del missing[name]
            r.add(
                Planned(
                    spec,
                    b"tenant_0:" + str(missing.get("deletion_id")).encode(),
                    orjson.dumps(missing),
                    Expect.DEAD,
                    f"ack_missing:{name}",
                )
            )
    ack = acknowledgement(r.maker, "tenant_0")
    r.add(Planned(spec, b"tenant_0:other", orjson.dumps(ack), Expect.DEAD, "ack_key_mismatch"))
    r.add(Planned(spec, None, orjson.dumps(ack), Expect.DEAD, "ack_no_key"))
    r.add(Planned(spec, _ack_key(ack), r.draw(_GARBAGE), Expect.DEAD, "ack_garbage"))
    r.add(Planned(spec, _ack_key(ack), None, Expect.DEAD, "ack_null"))
    headless = {k: v for k, v in acknowledgement(r.maker, "tenant_0").items() if k != "event_type"}
    r.add(Planned(spec, _ack_key(headless), orjson.dumps(headless), Expect.DEAD, "ack_untyped"))
    nest = r.draw(_DEPTHS)
    ack = acknowledgement(r.maker, EDGE_TENANT)
    text = raw_at(ack, ("extra",), nested(nest, r.draw(st.booleans())))
    # The acknowledgement model has no nesting limit of its own: an ignored deep field is
    # the codec's business (applied, or refused as too deep; never a crash).
    r.add(
        Planned(
            spec,
            _ack_key(ack),
            text,
            Expect.EITHER,
            f"ack_nesting:{nest}",
            event_id=_ack_event_id(ack),
            tenant_id=EDGE_TENANT,
            projection="deletion",
        )
    )
    ack = acknowledgement(r.maker, EDGE_TENANT)
    r.add(
        Planned(
            spec,
            _ack_key(ack),
            orjson.dumps(ack),
            Expect.EITHER,
            "ack_unknown_deletion",
            event_id=_ack_event_id(ack),
            tenant_id=EDGE_TENANT,
            projection="deletion",
        )
    )
    # A deletion request on the acknowledgements' topic is not an acknowledgement.
    event = r.maker.template("deletion.requested", EDGE_TENANT)
    r.add(planned_event(spec, event, Expect.DEAD, "foreign_type:deletion.requested"))


def tombstone(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    deletion_id = maker.fresh("h_tomb_")
    return {
        "event_type": "deletion.tombstone",
        "deletion_id": deletion_id,
        "tenant_id": tenant,
        "kind": "erasure",
        "target": {"type": "memory", "id": "nobody"},
        "items": [{"type": "memory", "id": "nobody"}],
        "issued_at": iso(CLOCK),
        "cut_off": iso(CLOCK),
        "deadline_at": iso(CLOCK + timedelta(days=1)),
        "required_stores": list(STORES),
    }


_TOMBSTONE_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "event_type": st.one_of(st.sampled_from(["deletion.erased", ""]), _ints),
    "deletion_id": st.one_of(_ints, st.none(), _small_lists),
    "tenant_id": st.one_of(_ints, st.none(), _small_dicts),
    "kind": st.one_of(st.sampled_from(["purge", ""]), st.none(), _ints),
    "target": st.one_of(
        st.sampled_from(
            ["x", {"type": "bogus", "id": "a"}, {"type": "memory"}, {"type": "subject", "id": "a"}]
        ),
        st.none(),
    ),
    "items": st.one_of(
        st.sampled_from(
            ["x", [5], [{"type": "bogus", "id": "a"}], [{}], [{"type": "memory", "id": 5}]]
        ),
        st.none(),
    ),
    "issued_at": st.one_of(st.sampled_from(["yesterday", ""]), st.none(), _small_lists),
    "cut_off": st.one_of(st.sampled_from(["yesterday"]), st.none(), _small_dicts),
    "deadline_at": st.one_of(st.sampled_from(["2026-13-01T00:00:00Z"]), st.none()),
    "required_stores": st.one_of(st.sampled_from(["embeddings", ["bogus"], [5], {}]), st.none()),
    "for_stores": st.one_of(st.sampled_from(["cache", ["bogus"], 5]), _small_dicts),
}


def forged_tombstones(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _TOMBSTONE_WRONG.items():
        forged = {**tombstone(r.maker), name: r.draw(wrong)}
        key = f"{FORGED_TENANT}:{forged['deletion_id']}".encode()
        r.add(Planned(spec, key, orjson.dumps(forged), Expect.DEAD, f"tombstone_wrong:{name}"))
    forged = tombstone(r.maker)
    key = f"{FORGED_TENANT}:{forged['deletion_id']}".encode()
    missing = r.draw(
        st.sampled_from(
            [
                "deletion_id",
                "tenant_id",
                "kind",
                "target",
                "items",
                "issued_at",
                "cut_off",
                "deadline_at",
                "required_stores",
            ]
        )
    )
    r.add(
        Planned(
            spec,
            key,
            orjson.dumps({k: v for k, v in forged.items() if k != missing}),
            Expect.DEAD,
            f"tombstone_missing:{missing}",
        )
    )
    r.add(Planned(spec, key + b"x", orjson.dumps(forged), Expect.DEAD, "tombstone_key_mismatch"))
    r.add(Planned(spec, key, r.draw(_GARBAGE), Expect.DEAD, "tombstone_garbage"))
    r.add(Planned(spec, key, None, Expect.DEAD, "tombstone_null"))
    nest = r.draw(st.integers(300, 10_000))
    r.add(
        Planned(
            spec,
            key,
            raw_at(forged, ("items", 0, "id"), nested(nest, False)),
            Expect.DEAD,
            f"tombstone_nesting:{nest}",
        )
    )
    # Well-formed, for a deletion nobody asked for, of things nobody has: erased (nothing),
    # acknowledged, and refused by the ledger; or for no store at all.
    forged = tombstone(r.maker)
    forged["required_stores"] = r.draw(st.sampled_from([list(STORES), [], ["cache"]]))
    key = f"{FORGED_TENANT}:{forged['deletion_id']}".encode()
    r.add(Planned(spec, key, orjson.dumps(forged), Expect.EITHER, "tombstone_unknown"))


def memory_record(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    memory_id = maker.fresh("h_cur_")
    return {
        "tenant_id": tenant,
        "memory_id": memory_id,
        "subject": {"type": "user", "id": "nobody"},
        "scope": "user",
        "kind": "fact",
        "value": {"text": "forged"},
        "source": {"type": "crm", "ref": "x"},
        "status": "verified",
        "version": 1,
        "observed_at": iso(CLOCK),
        "created_at": iso(CLOCK),
        "updated_at": iso(CLOCK),
        "last_event_id": "h-forged",
    }


_RECORD_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "subject": st.one_of(
        st.sampled_from(["user:1", {"type": "user"}, {"type": 5, "id": "a"}]),
        st.none(),
        _small_lists,
    ),
    "value": st.one_of(_strings, st.none(), _small_lists, _ints),
    "status": st.one_of(st.sampled_from(["deleted", ""]), st.none(), _ints),
    "version": st.one_of(st.sampled_from(["abc", 1.5]), st.none(), _small_lists),
    "observed_at": st.one_of(st.sampled_from(["yesterday", "2026-08-08T09:30:00"]), st.none()),
    "source": st.one_of(st.sampled_from(["x", {"type": "crm"}]), st.none()),
    "tenant_id": st.one_of(_ints, st.none(), st.just("")),
    "memory_id": st.one_of(_ints, st.none(), st.just("x" * 200)),
}


def forged_current(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _RECORD_WRONG.items():
        record = memory_record(r.maker)
        key = f"{FORGED_TENANT}:{record['memory_id']}".encode()
        record[name] = r.draw(wrong)
        r.add(Planned(spec, key, orjson.dumps(record), Expect.DEAD, f"current_wrong:{name}"))
    record = memory_record(r.maker)
    key = f"{FORGED_TENANT}:{record['memory_id']}".encode()
    del record[r.draw(st.sampled_from(["subject", "value", "status", "version", "created_at"]))]
    r.add(Planned(spec, key, orjson.dumps(record), Expect.DEAD, "current_missing"))
    garbage = r.draw(_GARBAGE)
    if garbage:  # an empty value is a null on a compacted topic: the memory is gone
        r.add(Planned(spec, key, garbage, Expect.DEAD, "current_garbage"))
    nest = r.draw(st.integers(300, 10_000))
    r.add(
        Planned(
            spec,
            key,
            raw_at(memory_record(r.maker), ("value", "deep"), nested(nest, True)),
            Expect.DEAD,
            f"current_nesting:{nest}",
        )
    )
    # Keys and headers that are not UTF-8: they name no memory.
    bad = r.draw(st.sampled_from([b"\xff\xfe", b"forged:\xc0\x80", b"\xed\xa0\x80:m"]))
    r.add(Planned(spec, bad, None, Expect.DEAD, "current_bad_key_null"))
    r.add(
        Planned(
            spec, bad, orjson.dumps(memory_record(r.maker)), Expect.DEAD, "current_bad_key_record"
        )
    )
    r.add(
        Planned(
            spec,
            key,
            None,
            Expect.DEAD,
            "current_bad_header",
            headers=(("tenant_id", b"\xff"), ("entity_id", b"m")),
        )
    )
    # (A compacted topic takes no message without a key: the broker refuses it.)
    # Legitimate: a null (the memory is gone), an empty value, a well-formed record of a
    # memory nobody has (stale for the index), odd content.
    legit: list[tuple[str, bytes | None, bytes | None]] = [
        ("current_null", key, None),
        ("current_empty", key, b""),
        ("current_unknown", key, orjson.dumps(memory_record(r.maker))),
        (
            "current_huge_number",
            key,
            raw_at(
                memory_record(r.maker), ("value", "n"), r.draw(st.sampled_from(_HUGE + _BIG_INTS))
            ),
        ),
        ("current_nul", key, orjson.dumps({**memory_record(r.maker), "scope": "a\x00b"})),
    ]
    for name, legit_key, value in legit:
        r.add(Planned(spec, legit_key, value, Expect.EITHER, name))


def conversation_message(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "conversation_id": maker.fresh("h_cm_"),
        "message_id": "m1",
        "seq": 1,
        "role": "user",
        "content": [{"type": "text", "text": "forged"}],
        "occurred_at": iso(CLOCK),
        "event_id": maker.fresh("h-cm-"),
        "redactions": {},
        "owner_type": "user",
        "owner_id": "nobody",
    }


_MESSAGE_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "content": st.one_of(_ints, st.none(), st.booleans()),
    "occurred_at": st.one_of(
        st.sampled_from(["yesterday", "", "2026-13-01T00:00:00Z"]),
        _ints,
        st.none(),
        _small_lists,
    ),
}


def forged_messages(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _MESSAGE_WRONG.items():
        message = conversation_message(r.maker)
        message[name] = r.draw(wrong)
        key = f"{FORGED_TENANT}:{message['conversation_id']}".encode()
        r.add(Planned(spec, key, orjson.dumps(message), Expect.DEAD, f"message_wrong:{name}"))
    message = conversation_message(r.maker)
    key = f"{FORGED_TENANT}:{message['conversation_id']}".encode()
    missing = r.draw(
        st.sampled_from(
            [
                "tenant_id",
                "conversation_id",
                "message_id",
                "owner_type",
                "owner_id",
                "content",
                "occurred_at",
                "event_id",
            ]
        )
    )
    r.add(
        Planned(
            spec,
            key,
            orjson.dumps({k: v for k, v in message.items() if k != missing}),
            Expect.DEAD,
            f"message_missing:{missing}",
        )
    )
    for name, value in [
        ("message_garbage", r.draw(_GARBAGE)),
        ("message_null", None),
        ("message_empty", b""),
        ("message_scalar", r.draw(st.sampled_from([b"[]", b"5", b'"x"', b"true", b"null"]))),
    ]:
        r.add(Planned(spec, key, value, Expect.DEAD, name))
    nest = r.draw(st.integers(1100, 10_000))
    r.add(
        Planned(
            spec,
            key,
            raw_at(message, ("content", 0, "x"), nested(nest, False)),
            Expect.DEAD,
            f"message_nesting:{nest}",
        )
    )
    # Well-formed but of nothing the projection holds, or with odd values the indexer does
    # not look at (a message it does not hold is stale, whatever it says).
    legit = [
        ("message_unknown", conversation_message(r.maker)),
        (
            "message_naive_time",
            {**conversation_message(r.maker), "occurred_at": "2026-08-08T09:30:00"},
        ),
        ("message_number_tenant", {**conversation_message(r.maker), "tenant_id": 5}),
        ("message_string_content", {**conversation_message(r.maker), "content": "abc"}),
    ]
    for name, body in legit:
        r.add(Planned(spec, key, orjson.dumps(body), Expect.EITHER, name))


OUTPUT_FAMILIES: dict[str, Callable[[Round, TopicSpec], None]] = {
    MEMORY_SEALED.base_name: forged_sealed,
    CONVERSATION_SEALED.base_name: forged_sealed,
    DELETION_ACKS.base_name: forged_acks,
    DELETION_TOMBSTONES.base_name: forged_tombstones,
    MEMORY_CURRENT.base_name: forged_current,
    CONVERSATION_MESSAGES.base_name: forged_messages,
}
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


# -- the valid stream ------------------------------------------------------------------------


def valid_stream(memories: int, conversations: int) -> tuple[list[Planned], list[tuple[str, str]]]:
    """The demo's realistic streams (without their malformed messages) in two tenants, and two
    deletion requests of tenant_0: a conversation (with the memories learned in it) and a
    memory."""
    tenants = len(VALID_TENANTS)
    valid: list[Planned] = []
    for spec, stream in (
        (MEMORY_EVENTS, sample_memory_stream(memories, tenants=tenants, seed=41)),
        (CONVERSATION_EVENTS, sample_conversation_stream(conversations, tenants=tenants, seed=41)),
    ):
        for sample in stream:
            if sample.expectation.startswith("dlq:"):
                continue
            assert sample.value is not None
            event = orjson.loads(sample.value)
            planned = planned_event(spec, event, Expect.VALID, f"valid:{sample.expectation}")
            valid.append(replace(planned, key=sample.key, value=sample.value))
    # After every sample event (one second apart from EPOCH), with a deadline that never
    # passes during the test.
    factory = EventFactory(id_prefix="del", clock=EPOCH + timedelta(days=1))
    deadline = EPOCH + timedelta(days=3650)
    requests = [
        factory.deletion(
            "tenant_0",
            "d_conversation",
            {"type": "conversation", "id": "conv_1"},
            deadline_at=deadline,
        ),
        factory.deletion(
            "tenant_0", "d_memory", {"type": "memory", "id": "mem_00004"}, deadline_at=deadline
        ),
    ]
    for event in requests:
        valid.append(
            replace(
                planned_event(DELETION_REQUESTS, event, Expect.VALID, "valid:deletion"), phase=2
            )
        )
    return valid, [("tenant_0", "d_conversation"), ("tenant_0", "d_memory")]


def _real_entities(messages: Sequence[Planned]) -> list[tuple[str, str]]:
    found = []
    for planned in messages:
        if planned.expect is Expect.VALID and planned.key is not None:
            tenant, _, entity = planned.key.decode().partition(":")
            found.append((tenant, entity))
    return sorted(set(found))


# -- drawing it all --------------------------------------------------------------------------


def hostile_rounds(real: dict[str, list[tuple[str, str]]], rounds: int) -> list[Planned]:
    """``rounds`` hypothesis examples, each making every family of hostile messages once (the
    first also the large ones), drawn deterministically."""
    maker = Maker()
    made: list[list[Planned]] = []

    @settings(
        max_examples=rounds,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(st.data())
    def draw_round(data: st.DataObject) -> None:
        r = Round(data.draw, maker, real, large=not made)
        for topic in (MEMORY_EVENTS, CONVERSATION_EVENTS, DELETION_REQUESTS):
            for family in INPUT_FAMILIES:
                family(r, topic)
            if r.large:
                sizes(r, topic)
        for name, forge in OUTPUT_FAMILIES.items():
            forge(r, SPECS[name])
        if r.large:
            big = "x" * LARGE
            for name in OUTPUT_FAMILIES:
                key = f"{FORGED_TENANT}:big".encode()
                r.add(
                    Planned(
                        SPECS[name], key, orjson.dumps({"junk": big}), Expect.DEAD, "forged_large"
                    )
                )
        made.append(r.out)

    # Derandomized: the corpus depends on this file, the hypothesis version and the literals
    # hypothesis picks up from the loaded modules; every expectation is derived from the
    # corpus itself, so any corpus it draws is judged the same way.
    draw_round()
    return [planned for batch in made for planned in batch]


def interleave(
    valid: Sequence[Planned], hostile: Sequence[Planned], rng: random.Random
) -> list[Planned]:
    """The hostile messages shuffled in among the valid ones, which keep their order."""
    slots = [True] * len(valid) + [False] * len(hostile)
    rng.shuffle(slots)
    hostile = list(hostile)
    rng.shuffle(hostile)
    ordered, shuffled = iter(valid), iter(hostile)
    return [next(ordered) if is_valid else next(shuffled) for is_valid in slots]


def corpus(
    rounds: int = 6,
    memories: int = 300,
    conversations: int = 80,
    seed: int = 20261201,
) -> Corpus:
    """The whole input of the suite: the valid stream with the hostile messages of ``rounds``
    rounds shuffled in, per phase and topic, deterministically."""
    valid, deletions = valid_stream(memories, conversations)
    real = {
        topic: _real_entities([p for p in valid if p.spec.base_name == topic])
        for topic in EVENT_TYPES
    }
    everything = [*valid, *hostile_rounds(real, rounds)]
    rng = random.Random(seed)
    phases: list[dict[str, list[Planned]]] = []
    for phase in range(PHASES):
        topics: dict[str, list[Planned]] = {}
        for topic in SPECS:
            mine = [p for p in everything if p.phase == phase and p.spec.base_name == topic]
            if mine:
                topics[topic] = interleave(
                    [p for p in mine if p.expect is Expect.VALID],
                    [p for p in mine if p.expect is not Expect.VALID],
                    rng,
                )
        phases.append(topics)
    return Corpus(phases, deletions)


# -- bursts ----------------------------------------------------------------------------------

BURST = 8


def bursts(length: int = BURST) -> Corpus:
    """Runs of one hostile kind, each alone on its topic, so that a worker's batches hold
    nothing else (the sealer's two topics are one stream: only one of them gets a run), each
    followed by valid events where the topic has any: the kinds that fail in processing (a
    bug they hit, which the circuit breaker counts, unlike a refusal by a codec) and, for
    contrast, kinds that a codec refuses."""
    maker = Maker()
    topics: dict[str, list[Planned]] = {}

    def add(planned: Planned) -> None:
        topics.setdefault(planned.spec.base_name, []).append(planned)

    def valid_after(spec: TopicSpec, event_type: str) -> None:
        for _ in range(2):
            add(
                planned_event(
                    spec, maker.template(event_type, "tenant_0"), Expect.VALID, "valid:after_burst"
                )
            )

    for _ in range(length):
        # An integer no 64-bit type holds, in a memory value: the sealer fails on it.
        event = maker.template("memory.proposed", "tenant_0")
        big = str(2**70).encode()
        add(
            planned_event(
                MEMORY_EVENTS,
                event,
                Expect.EITHER,
                "burst:big_int_in_value",
                raw_at(event, ("payload", "value", "n"), big),
            )
        )
    valid_after(MEMORY_EVENTS, "memory.proposed")
    for spec in (MEMORY_SEALED, CONVERSATION_SEALED):
        event_type = "memory.proposed" if spec == MEMORY_SEALED else "conversation.message_added"
        for _ in range(length):
            # Nesting that orjson reads (at most 1024 levels) and does not write (254), in a
            # sealed event whose entity has no data key.
            event = maker.template(event_type, "tenant_0")
            sealed = sealed_event(event, {"entity": _seal_name(SEALED_RAW[spec.base_name], event)})
            add(
                planned_event(
                    spec,
                    event,
                    Expect.DEAD,
                    "burst:sealed_nesting_300",
                    raw_at(sealed, ("payload", "x"), nested(300, False)),
                )
            )
    for index in range(length):
        add(
            Planned(
                MEMORY_CURRENT, b"\xff" + bytes([index]), None, Expect.DEAD, "burst:key_not_utf8"
            )
        )
    for _ in range(length):
        add(
            Planned(
                DELETION_TOMBSTONES,
                f"{FORGED_TENANT}:x".encode(),
                b"[1,2",
                Expect.DEAD,
                "burst:tombstone_garbage",
            )
        )
    for _ in range(length):
        event = maker.template("deletion.requested", "tenant_0")
        add(
            planned_body(
                DELETION_REQUESTS,
                event,
                _set(event, ("schema_version",), 99),
                Expect.DEAD,
                "burst:unknown_schema_version",
            )
        )
    return Corpus([topics], [])


def oversized_letters() -> Corpus:
    """On every topic memproj consumes, a message whose key is large enough that the key and
    a dead letter of the value (base64 of its first 512 KiB) do not fit in one Kafka message
    together, though the message itself does; valid events after it where the topic has any.
    """
    maker = Maker()
    topics: dict[str, list[Planned]] = {}
    for name, spec in SPECS.items():
        key = b"tenant_0:" + b"k" * 300_000
        topics[name] = [Planned(spec, key, b"x" * 524_288, Expect.DEAD, "oversized_letter")]
        event_types = EVENT_TYPES.get(name)
        if event_types:
            event = maker.template(event_types[0], "tenant_0")
            topics[name].append(planned_event(spec, event, Expect.VALID, "valid:after"))
    return Corpus([topics], [])
