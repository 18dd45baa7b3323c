"""Which fields of which event are personal, read from the marks on the contract's models.

The marks live on the models (``topics.envelope``): ``Personal`` on a payload field (at the
payload's top level: the sealer moves whole payload fields), ``NotPersonal`` on a string that is
readable everywhere (every ``Identifier`` and ``Reference`` carries one), and a ``Literal`` is
an enumeration. Every string of an event, at any depth, must be one of the three:
``unmarked_strings`` lists the others, and a test holds that list empty for every event type,
so an event type with an unmarked free-text field fails CI rather than reach PostgreSQL in
plaintext.

Everything memproj does with personal fields derives from here: the sealer's table
(``projections.sealing.fields``), the reducers' redaction (``projections.redaction``), the
plaintext audit (which opens what the sealer's table seals) and the hostile-input generator.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum, StrEnum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AwareDatetime, BaseModel

from topics.envelope import Envelope, NotPersonal, Personal, Source
from topics.schemas import default_schemas

# Types whose values hold no text: kept as they are wherever they are.
_SCALARS: tuple[type, ...] = (bool, int, float, datetime, date, AwareDatetime, type(None))


@dataclass(frozen=True, slots=True)
class PersonalFields:
    """The personal fields of one event type, and what sealing them needs."""

    event_type: str
    # The entity whose data key seals them: its type and the payload field naming it.
    entity_type: str
    entity_field: str
    # The payload fields marked ``Personal``, in the model's order.
    names: tuple[str, ...]
    placeholders: Mapping[str, Any]
    # The fields the sealer once wrote in plaintext (``Personal.legacy_plaintext``).
    legacy_plaintext: frozenset[str]
    # The payload field (a ``Source``) saying where the personal value was taken from: when it
    # points into a conversation, that conversation's key seals the fields too. None without.
    source_field: str | None


class Shape(StrEnum):
    """What a value holds, for redaction: the redactor walks a personal field by these."""

    KEPT = "kept"  # no free text: ids, enumerations, numbers, times, booleans
    FREE = "free"  # free text, or any JSON holding it: every string in it is redacted
    MODELS = "models"  # a model, or a sequence of models: walked field by field


def _split(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """A type without its ``Annotated`` layers, and their metadata."""
    metadata: list[Any] = []
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        metadata.extend(extra)
    return annotation, tuple(metadata)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> tuple[Any, ...] | None:
    """The members of a union (``X | Y``, ``Optional[X]``), or None for any other type."""
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return None


def _declared(base: Any, metadata: tuple[Any, ...]) -> bool:
    """Declared to hold no personal text: ``NotPersonal``, or an enumeration."""
    if any(isinstance(mark, NotPersonal) for mark in metadata):
        return True
    return get_origin(base) is Literal or (isinstance(base, type) and issubclass(base, Enum))


def _is_scalar(base: Any) -> bool:
    return isinstance(base, type) and issubclass(base, _SCALARS)


def _items(base: Any) -> tuple[Any, ...] | None:
    """The item types of a list or tuple (``Any`` when not given), or None for another type."""
    if get_origin(base) in (list, tuple) or base in (list, tuple):
        return tuple(arg for arg in get_args(base) if arg is not Ellipsis) or (Any,)
    return None


def _model_fields(model: type[BaseModel]) -> Iterator[tuple[str, Any]]:
    """Each field with its whole annotation (pydantic keeps a field's top-level metadata apart
    from its type)."""
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        if info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        yield name, annotation


@functools.cache
def field_shapes(model: type[BaseModel]) -> Mapping[str, Shape]:
    """The shape of each field of ``model``."""
    return {name: shape_of(annotation) for name, annotation in _model_fields(model)}


def shape_of(annotation: Any) -> Shape:
    base, metadata = _split(annotation)
    if _declared(base, metadata) or _is_scalar(base):
        return Shape.KEPT
    if base is str or base is Any or get_origin(base) is dict or base is dict:
        return Shape.FREE
    if _is_model(base):
        return Shape.MODELS
    members = _members(base) or _items(base)
    if members is None:
        raise TypeError(f"cannot tell whether {annotation!r} holds text")
    shapes = {shape_of(member) for member in members} or {Shape.KEPT}
    if shapes <= {Shape.KEPT}:
        return Shape.KEPT
    if Shape.MODELS in shapes:
        if shapes - {Shape.MODELS, Shape.KEPT}:
            raise TypeError(f"{annotation!r} mixes models and free text: give each its field")
        return Shape.MODELS
    return Shape.FREE


def unmarked_strings(model: type[BaseModel]) -> list[str]:
    """The paths of the strings in ``model`` (at any depth) that are neither inside a
    ``Personal`` field, nor declared ``NotPersonal``, nor an enumeration; and of every
    ``Personal`` mark that is not on a field at the top level of an event's payload."""
    return list(_unmarked(model, "", covered=False, stack=()))


def _unmarked(annotation: Any, path: str, covered: bool, stack: tuple[type, ...]) -> Iterator[str]:
    base, metadata = _split(annotation)
    if any(isinstance(mark, Personal) for mark in metadata):
        if not _PAYLOAD_FIELD.fullmatch(path):
            yield f"{path}: marked Personal below a payload's top level"
        covered = True
    if _declared(base, metadata) or _is_scalar(base):
        return
    if base is str or base is Any:
        if not covered:
            yield f"{path}: a string neither Personal nor NotPersonal"
        return
    if _is_model(base):
        if base in stack:
            return
        for name, field in _model_fields(base):
            yield from _unmarked(field, f"{path}.{name}" if path else name, covered, (*stack, base))
        return
    members = _members(base)
    if members is not None:
        for member in members:
            yield from _unmarked(member, path, covered, stack)
        return
    if get_origin(base) is dict or base is dict:
        key, value = get_args(base) or (Any, Any)
        yield from _unmarked(key, f"{path}[key]", covered, stack)
        yield from _unmarked(value, f"{path}[]", covered, stack)
        return
    items = _items(base)
    if items is not None:
        for item in items:
            yield from _unmarked(item, f"{path}[]", covered, stack)
        return
    if not covered:
        yield f"{path}: {annotation!r}: cannot tell whether it holds text"


_PAYLOAD_FIELD = re.compile(r"payload\.\w+")


@functools.cache
def personal_fields(model: type[Envelope]) -> PersonalFields | None:
    """What ``model``'s marks say of its personal fields; None when it has none."""
    payload: Any = model.model_fields["payload"].annotation
    if not _is_model(payload):
        raise TypeError(f"{model.__name__}'s payload is not a model")
    names: list[str] = []
    placeholders: dict[str, Any] = {}
    legacy: set[str] = set()
    sources: list[str] = []
    for name, annotation in _model_fields(payload):
        mark = _personal_mark(annotation)
        if mark is not None:
            names.append(name)
            placeholders[name] = mark.placeholder
            if mark.legacy_plaintext:
                legacy.add(name)
        base, _ = _split(annotation)
        if base is Source or Source in (_members(base) or ()):
            sources.append(name)
    if not names:
        return None
    if len(sources) > 1:
        raise TypeError(f"{model.__name__} names {len(sources)} sources: at most one is sealed")
    return PersonalFields(
        event_type=model.declared_event_type(),
        entity_type=model.entity_type,
        entity_field=model.entity_field,
        names=tuple(names),
        placeholders=placeholders,
        legacy_plaintext=frozenset(legacy),
        source_field=sources[0] if sources else None,
    )


def _personal_mark(annotation: Any) -> Personal | None:
    """The ``Personal`` mark of a field: on its type, or on a member of its union (an optional
    field marked inside its ``| None``)."""
    base, metadata = _split(annotation)
    marks = [mark for mark in metadata if isinstance(mark, Personal)]
    for member in _members(base) or ():
        inner = _personal_mark(member)
        if inner is not None:
            marks.append(inner)
    return marks[-1] if marks else None


def personal_events(models: Iterable[type[Envelope]]) -> dict[str, PersonalFields]:
    """Per event type with personal fields, what they are."""
    found = (personal_fields(model) for model in models)
    return {fields.event_type: fields for fields in found if fields is not None}


# Every event type the contract accepts, with personal fields.
PERSONAL_EVENTS: Mapping[str, PersonalFields] = types.MappingProxyType(
    personal_events(default_schemas().models())
)
