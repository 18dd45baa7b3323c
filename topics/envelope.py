"""The envelope every input event carries, and the field types the contract shares."""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Protocol, Self, TypeVar, cast, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints


# Every string an event carries is personal, declared not personal, or an enumeration (a
# ``Literal``); ``topics.personal`` reads these marks, and a test refuses an event type with a
# string that is none of the three. Plain metadata: validation and the published schemas
# (OpenAPI) are the same with or without them.
@dataclass(frozen=True, eq=False, slots=True)
class Personal:
    """Marks a payload field (at the payload's top level) as personal: the sealer seals it
    under its entity's data key, the reducers redact the free text in it before it is stored,
    and the plaintext audit opens it as a sealed field.

    ``placeholder``: what stands in for it once it can no longer be opened (crypto-shredded),
    valid for the field: the event still decodes, and is never applied.
    ``legacy_plaintext``: the sealer once wrote this field in plaintext; such an event on the
    sealed log is read as it is (any other personal field in plaintext there is refused)."""

    placeholder: Any
    legacy_plaintext: bool = False


@dataclass(frozen=True, eq=False, slots=True)
class NotPersonal:
    """Declares a string readable everywhere, and why: ids and references (pseudonymous: keep
    personal data out of them) and the few texts kept on purpose, such as a deletion's
    reason."""

    why: str


PSEUDONYMOUS_ID = NotPersonal("an id: pseudonymous, readable everywhere")

IDENTIFIER_MAX_LENGTH = 128
Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=IDENTIFIER_MAX_LENGTH), PSEUDONYMOUS_ID
]
# References such as "conv_71/msg_993" join two identifiers, so they get more room.
Reference = Annotated[str, StringConstraints(min_length=1, max_length=512), PSEUDONYMOUS_ID]
# Free text: an event's field of this type is marked ``Personal`` or ``NotPersonal`` where it is
# used (``topics.personal``).
Text = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Timestamp = AwareDatetime
# Counts and versions are stored in PostgreSQL ``integer`` columns: a larger one is an invalid
# event, refused at decoding (binary COPY would otherwise wrap it silently).
StoredInt = Annotated[int, Field(le=2**31 - 1)]
ActorType = Literal["user", "agent", "service", "operator"]


def model_json(model: BaseModel) -> bytes:
    """A model's JSON by its own serializer: the bytes ``pydantic_core.to_json`` writes for it
    (body hashes stored before depend on them), without inferring its type first, which takes
    as long again."""
    return model.__pydantic_serializer__.to_json(model)


class Frozen(BaseModel):
    # Extra fields are ignored rather than refused: the contract lets producers add optional
    # fields, and a newer producer must not send an older worker's input to the DLQ.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Wire(Frozen):
    """Input from other services: types are checked strictly ("2" is not a version)."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


class Actor(Wire):
    type: ActorType
    id: Identifier


class Subject(Wire):
    type: Identifier
    id: Identifier


class Source(Wire):
    type: Identifier
    ref: Reference

    @property
    def conversation_id(self) -> str | None:
        """The conversation a ``message`` source points into (``source_conversation``)."""
        return source_conversation(self.type, self.ref)


# A ``message`` source's ref is ``<conversation_id>/<message_id>``. The conversation id is
# written with ``%`` as ``%25`` and ``/`` as ``%2F`` (``message_ref``), as output keys escape
# their tenant part: the ref is cut at its first ``/``, so a conversation id with ``/`` is
# addressable, and a message id may hold ``/`` as it is. Ids without either character are
# written as they are. ``projections/migrations`` generates the same rule in SQL
# (``memproj_source_conversation``), and a test holds the two to each other.
def message_ref(conversation_id: str, message_id: str) -> str:
    """The ``ref`` of a ``message`` source that points at this message."""
    escaped = conversation_id.replace("%", "%25").replace("/", "%2F")
    return f"{escaped}/{message_id}"


def source_conversation(source_type: str, source_ref: str) -> str | None:
    """The conversation a source points into: a ``message`` source's ref, up to its first
    ``/``, unescaped (``message_ref``); None for any other source."""
    if source_type != "message" or "/" not in source_ref:
        return None
    escaped = source_ref.split("/", 1)[0]
    if not escaped:
        return None
    if "%" not in escaped:
        return escaped
    return _ESCAPE.sub(lambda escape: "%" if escape.group(1) == "25" else "/", escaped)


_ESCAPE = re.compile(r"%(2[Ff]|25)")


class EventLike(Protocol):
    """What the runner, the idempotency check and rejections need of any input event."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def event_id(self) -> str: ...

    @property
    def entity_id(self) -> str: ...

    @property
    def event_type(self) -> str: ...

    @property
    def occurred_at(self) -> datetime: ...

    def body_hash(self) -> bytes: ...

    @property
    def readable(self) -> bool: ...


class Envelope(Wire):
    """Fields common to every input event; concrete events add ``event_type`` and ``payload``."""

    event_id: Identifier
    event_type: str
    schema_version: int = Field(ge=1)
    tenant_id: Identifier
    occurred_at: Timestamp
    actor: Actor
    payload: Any

    # The payload field naming the entity the message key must point at, and the entity's
    # type (whose data key seals the event's personal fields).
    entity_field: ClassVar[str]
    entity_type: ClassVar[str]
    # False for an event whose personal fields could not be opened (crypto-shredded): it
    # keeps its identity for the erasure guard and idempotency, and must never be applied.
    # A class attribute of a marked subclass, not a pydantic private attribute: those are
    # set up on every validation, which took a quarter of the time of decoding an event.
    readable: ClassVar[bool] = True

    def unreadable_copy(self) -> Self:
        """This event, marked as one whose personal fields could not be opened."""
        marked = _unreadable_class(type(self))
        return cast(Self, marked.model_construct(_fields_set=self.model_fields_set, **dict(self)))

    @classmethod
    def declared_event_type(cls) -> str:
        """The ``event_type`` literal a concrete event class accepts."""
        (event_type,) = get_args(cls.model_fields["event_type"].annotation)
        return str(event_type)

    @property
    def entity_id(self) -> str:
        return str(getattr(self.payload, self.entity_field))

    def body_hash(self) -> bytes:
        """A digest of the event's meaning, to tell a redelivery from a reused event_id.

        It covers the validated model, not the raw bytes, so whitespace, key order or unknown
        extra fields in a re-serialised copy still make the same event.
        """
        # Serialised in the models' field order, so the same event always gives the same bytes.
        return hashlib.sha256(model_json(self)).digest()


EnvelopeT = TypeVar("EnvelopeT", bound=Envelope)


@functools.cache
def _unreadable_class(event_class: type[EnvelopeT]) -> type[EnvelopeT]:
    # A subclass, so that singledispatch reducers and isinstance checks treat it as the event.
    return type(
        f"Unreadable{event_class.__name__}",
        (event_class,),
        {"readable": False, "__module__": event_class.__module__},
    )
