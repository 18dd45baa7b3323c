"""The plaintext audit's pure core: the marker's readable forms, the matcher, and the report.

An auditor plants a unique marker (in a test, or in a real subject's data before erasing it)
and asks where it can still be read. "Readable" means: its UTF-8 bytes, or the same text as a
JSON string writes it (a quote, a backslash, a control or a non-ASCII character is escaped
there), or any string inside a value that parses as JSON. Sources (PostgreSQL, Kafka, Redis,
the data directory) hand bytes and texts to the ``Matcher`` and report ``Hit``s; the ``Report``
counts them per place. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from streams.failures import loggable
from topics.registry import (
    CONVERSATION_MESSAGES,
    SEALED_TOPICS,
    TopicRole,
    TopicSpec,
    split_output_key,
)

# How many ids, offsets or paths a finding shows: enough to look one up, never a dump.
EXAMPLES_PER_PLACE = 5
REDACTED = "<marker>"


class PlaceKind(StrEnum):
    TABLE = "table"
    # A table's dead tuples (deleted or superseded rows a vacuum has not removed yet), read
    # with the pg_dirtyread extension.
    DEAD_TUPLES = "dead_tuples"
    TOPIC = "topic"
    REDIS = "redis"
    FILE = "file"
    # A LanceDB table read through its API: its data files may compress text out of sight.
    LANCE = "lance"


class TopicKind(StrEnum):
    """How a topic's records are opened: each kind has its own list of openers."""

    RAW_INPUT = "raw_input"
    SEALED = "sealed"
    DEAD_LETTER = "dead_letter"
    CONVERSATION_MESSAGES = "conversation_messages"
    OUTPUT = "output"


def topic_kind(spec: TopicSpec) -> TopicKind:
    if spec.role is TopicRole.DEAD_LETTER:
        return TopicKind.DEAD_LETTER
    if spec in SEALED_TOPICS:
        return TopicKind.SEALED
    if spec.role is TopicRole.INPUT:
        return TopicKind.RAW_INPUT
    if spec == CONVERSATION_MESSAGES:
        return TopicKind.CONVERSATION_MESSAGES
    return TopicKind.OUTPUT


class InvalidMarker(ValueError):
    pass


def _json_escaped(marker: str, ensure_ascii: bool) -> str:
    """The marker as it appears between the quotes of a JSON string."""
    return json.dumps(marker, ensure_ascii=ensure_ascii)[1:-1]


_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-f]{4})")


@dataclass(frozen=True, slots=True)
class Matcher:
    """Finds the marker in bytes, in text and in parsed JSON."""

    marker: str
    texts: tuple[str, ...]
    needles: tuple[bytes, ...]

    @classmethod
    def of(cls, marker: str) -> Matcher:
        if not marker:
            raise InvalidMarker("the marker is empty")
        if "\x00" in marker:
            # PostgreSQL text cannot hold NUL, so no table could be searched for it.
            raise InvalidMarker("the marker holds a NUL character")
        escaped = _json_escaped(marker, ensure_ascii=False)  # orjson, PostgreSQL jsonb
        ascii_escaped = _json_escaped(marker, ensure_ascii=True)  # Python's json module
        upper = _UNICODE_ESCAPE.sub(lambda m: "\\u" + m.group(1).upper(), ascii_escaped)  # Java
        texts = tuple(dict.fromkeys((marker, escaped, ascii_escaped, upper)))
        return cls(marker, texts, tuple(text.encode() for text in texts))

    @property
    def longest_needle(self) -> int:
        return max(len(needle) for needle in self.needles)

    def in_text(self, text: str) -> bool:
        return any(form in text for form in self.texts)

    def in_bytes(self, data: bytes) -> bool:
        return any(needle in data for needle in self.needles)

    def in_json(self, value: Any) -> bool:
        return any(self.marker in text for text in json_strings(value))

    def in_blob(self, data: bytes | None) -> bool:
        """In the bytes, or in any string of them parsed as JSON (which undoes every escape,
        e.g. ``\\/`` or an escaped ASCII letter)."""
        if not data:
            return False
        if self.in_bytes(data):
            return True
        parsed = parse_json(data)
        return parsed is not None and self.in_json(parsed)

    def redact(self, text: str) -> str:
        """``text`` with the marker replaced: examples name where, never what."""
        for form in self.texts:
            text = text.replace(form, REDACTED)
        return text


def parse_json(data: bytes) -> Any | None:
    """The parsed JSON document, or None when ``data`` is not one (only containers and
    strings: a bare number cannot hold a marker)."""
    if data.lstrip()[:1] not in (b"{", b"[", b'"'):
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def json_strings(value: Any) -> Iterator[str]:
    """Every string of a parsed JSON document, object keys included (iterative: a deeply
    nested document cannot exhaust the stack)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield str(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


# -- topics --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def record_parts(
    matcher: Matcher, record: TopicRecord, opened: Iterable[tuple[str, bytes | None]] = ()
) -> list[str]:
    """The parts of a record where the marker is readable: ``key``, ``value``, ``header``,
    and ``opened:<opener>`` for what an opener could still open (a sealed field, a dead
    letter's original)."""
    parts = []
    if matcher.in_blob(record.key) or _in_output_key(matcher, record.key):
        parts.append("key")
    if matcher.in_blob(record.value):
        parts.append("value")
    if any(matcher.in_text(name) or matcher.in_blob(value) for name, value in record.headers):
        parts.append("header")
    parts.extend(f"opened:{name}" for name, plaintext in opened if matcher.in_blob(plaintext))
    return parts


def _in_output_key(matcher: Matcher, key: bytes | None) -> bool:
    """In the ids an output key names (contract 1.2 escapes ``%`` and ``:`` in its tenant
    id): a tenant id that holds the marker reads so, whatever the key shows."""
    if not key or b"%" not in key:
        return False
    try:
        tenant_id, entity_id = split_output_key(key)
    except UnicodeDecodeError:
        return False
    return matcher.in_text(f"{tenant_id}:{entity_id}")


def within_window(
    kind: TopicKind, timestamp_ms: int | None, now_ms: int, window_ms: int | None
) -> bool | None:
    """Whether a finding on a raw input topic is still inside the topic's plaintext window
    (allowed: the sealer has not dropped it yet); None on every other topic, where no
    plaintext is allowed at all. A record without a timestamp is judged outside."""
    if kind is not TopicKind.RAW_INPUT:
        return None
    if window_ms is None:
        return True  # a topic kept forever: every record is inside its window
    return timestamp_ms is not None and now_ms - timestamp_ms <= window_ms


# -- the report ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hit:
    """One row, record, Redis key or file where the marker is readable."""

    kind: PlaceKind
    name: str
    example: str  # an id, offset or path: never the content
    parts: tuple[str, ...] = ()  # the columns, record parts or Redis fields it was found in
    within_window: bool | None = None


@dataclass(slots=True)
class Finding:
    kind: PlaceKind
    name: str
    within_window: bool | None
    count: int = 0
    examples: list[str] = field(default_factory=list)
    parts: set[str] = field(default_factory=set)

    @property
    def allowed(self) -> bool:
        return self.within_window is True

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "name": self.name,
            "count": self.count,
            "examples": self.examples,
            "found_in": sorted(self.parts),
            "within_window": self.within_window,
        }


@dataclass(slots=True)
class Scanned:
    """What one source looked at, for the report's coverage and timing."""

    places: int = 0
    items: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "places": self.places,
            "items": self.items,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        }


@dataclass(slots=True)
class Report:
    matcher: Matcher
    findings: dict[tuple[PlaceKind, str, bool | None], Finding] = field(default_factory=dict)
    scanned: dict[str, Scanned] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, hit: Hit, count: int = 1) -> None:
        name = self.matcher.redact(hit.name)
        place = (hit.kind, name, hit.within_window)
        finding = self.findings.setdefault(place, Finding(hit.kind, name, hit.within_window))
        finding.count += count
        finding.parts.update(hit.parts)
        if len(finding.examples) < EXAMPLES_PER_PLACE:
            finding.examples.append(self.matcher.redact(hit.example))

    def error(self, where: str, error: BaseException | str) -> None:
        # An exception by class and code: its text may quote what the audit was reading.
        said = loggable(error) if isinstance(error, BaseException) else error
        self.errors.append(self.matcher.redact(f"{where}: {said}"))

    def source(self, name: str) -> Scanned:
        return self.scanned.setdefault(name, Scanned())

    @property
    def readable(self) -> list[Finding]:
        """The findings that break the guarantee: everything outside an allowed window."""
        return [finding for finding in self.sorted_findings() if not finding.allowed]

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings.values(), key=lambda f: (f.kind.value, f.name, f.within_window is True)
        )

    def exit_status(self) -> int:
        """2: the audit could not look everywhere; 1: the marker is readable outside an
        allowed window; 0: nowhere (or only inside a raw topic's window)."""
        if self.errors:
            return 2
        return 1 if self.readable else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "readable": bool(self.readable),
            "findings": [finding.to_json() for finding in self.sorted_findings()],
            "scanned": {name: scanned.to_json() for name, scanned in self.scanned.items()},
            "errors": self.errors,
        }

    def lines(self) -> list[str]:
        """The human report."""
        lines = []
        for finding in self.sorted_findings():
            window = {True: "  (within raw window)", False: "  (OUTSIDE raw window)", None: ""}
            parts = f" in {', '.join(sorted(finding.parts))}" if finding.parts else ""
            lines.append(
                f"{finding.kind.value:6} {finding.name}: {finding.count}{parts}"
                f"{window[finding.within_window]}  e.g. {', '.join(finding.examples)}"
            )
        if not self.findings:
            lines.append("the marker is readable nowhere memproj writes")
        elif not self.readable:
            lines.append("readable only inside raw input windows (allowed)")
        for name, scanned in self.scanned.items():
            lines.append(
                f"scanned {name}: {scanned.places} places, {scanned.items} items,"
                f" {scanned.bytes} bytes in {scanned.seconds:.2f}s"
            )
        lines.extend(f"ERROR {error}" for error in self.errors)
        return lines
