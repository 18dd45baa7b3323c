"""What each field of each event type accepts, per the contract: the field kinds, the
envelope's and each payload's fields, each input topic's event types.
"""

from __future__ import annotations

from enum import StrEnum

from support.hostile.json_surgery import Path
from topics.conversation import CONVERSATION_EVENT_TYPES
from topics.deletion import DELETION_EVENT_TYPES
from topics.memory import MEMORY_EVENT_TYPES
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_EVENTS
from topics.schemas import default_schemas


class Kind(StrEnum):
    ID = "id"  # Identifier: a string of 1 to 128 characters
    ID_OPT = "id_opt"  # an Identifier or null
    REF = "ref"  # 1 to 512 characters
    TEXT = "text"  # 1 to 4096 characters
    TEXT_OPT = "text_opt"  # 1 to 4096 characters, or null
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


OPTIONAL = {
    Kind.ID_OPT, Kind.TEXT_OPT, Kind.STR512_OPT, Kind.INT1_OPT, Kind.TS_OPT, Kind.IDS, Kind.BOOL
}  # fmt: skip

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
    "memory.reviewed": {
        ("payload", "memory_id"): Kind.ID,
        ("payload", "reviewed_version"): Kind.INT1,
        ("payload", "decision"): Kind.ENUM,
        ("payload", "note"): Kind.TEXT_OPT,
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
# Each input topic's event types, from the contract's models: a new event type is in the
# corpus at once, and ``PAYLOADS`` must say what its fields accept (a KeyError otherwise).
EVENT_TYPES = {
    MEMORY_EVENTS.base_name: tuple(m.declared_event_type() for m in MEMORY_EVENT_TYPES),
    CONVERSATION_EVENTS.base_name: tuple(m.declared_event_type() for m in CONVERSATION_EVENT_TYPES),
    DELETION_REQUESTS.base_name: tuple(m.declared_event_type() for m in DELETION_EVENT_TYPES),
}
ALL_EVENT_TYPES = frozenset(t for types in EVENT_TYPES.values() for t in types)
PROJECTION_OF = {
    MEMORY_EVENTS.base_name: "memory",
    CONVERSATION_EVENTS.base_name: "conversation",
    DELETION_REQUESTS.base_name: "deletion",
}
# The deepest nesting the codec accepts (topics.codec.MAX_NESTING).
MAX_NESTING = 64


def entity_field(event_type: str) -> str:
    return _MODELS[event_type].entity_field


_MODELS = {model.declared_event_type(): model for model in default_schemas().models()}
