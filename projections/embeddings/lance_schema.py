"""The LanceDB vector table's layout: its columns, the metadata recorded with them (the
embedder and the column version), and an entry as a row and back. Pure (pyarrow only); the
store (``projections.embeddings.lance``) reads and writes with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from projections.embeddings.embedder import hashing_name
from projections.embeddings.vectors import (
    SCHEMA_VERSION,
    EntryRef,
    VectorEntry,
    stored_entry,
    stored_ref,
)

if TYPE_CHECKING:  # lancedb takes about a second to import; the layout needs none of it
    from lancedb.table import Table

# The schema metadata that records which embedder wrote a table's vectors. A table without it
# was written before embedders were named, when the hashing embedder was the only one.
MODEL_KEY = b"memproj.embedder"
DIM_KEY = b"memproj.embedding_dim"
# The version of the table's columns (``SCHEMA_VERSION``). A table without the key is of
# version 1.
SCHEMA_VERSION_KEY = b"memproj.vector_schema"


def stored_model(schema: pa.Schema) -> str:
    """The embedder a table's vectors come from, as its schema metadata records it."""
    metadata = schema.metadata or {}
    if MODEL_KEY in metadata:
        return bytes(metadata[MODEL_KEY]).decode()
    return hashing_name(schema.field("vector").type.list_size)


def stored_schema_version(schema: pa.Schema) -> int:
    """The version of a table's columns, as its schema metadata records it."""
    metadata = schema.metadata or {}
    return int(bytes(metadata[SCHEMA_VERSION_KEY])) if SCHEMA_VERSION_KEY in metadata else 1


def lance_schema(dim: int, model: str | None = None) -> pa.Schema:
    """The table's columns; with ``model``, the metadata recording the embedder (every write
    carries it: an overwrite replaces the table's schema, metadata included)."""
    schema = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("tenant_id", pa.string(), nullable=False),
            pa.field("subject_type", pa.string(), nullable=False),
            pa.field("subject_id", pa.string(), nullable=False),
            pa.field("memory_id", pa.string(), nullable=True),
            pa.field("conversation_id", pa.string(), nullable=True),
            pa.field("message_id", pa.string(), nullable=True),
            pa.field("source_type", pa.string(), nullable=False),
            pa.field("source_ref", pa.string(), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("occurred_at", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
            pa.field("memory_kind", pa.string(), nullable=True),
            pa.field("scope", pa.string(), nullable=True),
        ]
    )
    if model is None:
        return schema
    return schema.with_metadata(
        {
            MODEL_KEY: model.encode(),
            DIM_KEY: str(dim).encode(),
            SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(),
        }
    )


_COLUMNS = tuple(lance_schema(1).names)
# The columns of version 1 tables lack (``entry_of`` reads them as None): only the rebuild and
# the erasures of rebuild tables (``adopt``) ever read such a table.
_ADDED_COLUMNS = ("memory_kind", "scope")
REF_COLUMNS = (
    "id", "kind", "tenant_id", "subject_type", "subject_id", "memory_id", "conversation_id",
    "occurred_at",
)  # fmt: skip


def table_columns(table: Table) -> list[str]:
    """The entry's columns the table has: all of them but in a table of version 1."""
    present = set(table.schema.names)
    return [column for column in _COLUMNS if column in present or column not in _ADDED_COLUMNS]


# What names an entry in the table: its id within its tenant.
STORE_KEY = ("tenant_id", "id")


def entry_rows(entries: Sequence[VectorEntry], schema: pa.Schema) -> pa.Table:
    """The entries as rows, only the last of several with one tenant and id: LanceDB's
    merge_insert inserts every copy of a new key and refuses two copies of a stored one."""
    latest = {(entry.tenant_id, entry.id): entry for entry in entries}
    return pa.Table.from_pylist([_row(entry) for entry in latest.values()], schema=schema)


def _row(entry: VectorEntry) -> dict[str, Any]:
    if entry.occurred_at.tzinfo is None:
        raise ValueError(f"entry {entry.id!r} has a naive occurred_at; it must be UTC-aware")
    if entry.kind == "memory" and (entry.memory_kind is None or entry.scope is None):
        # It would be out of every search confined by kind or scope, with no word said.
        raise ValueError(f"memory entry {entry.id!r} has no kind or scope")
    return {
        "id": entry.id,
        "kind": entry.kind,
        "tenant_id": entry.tenant_id,
        "subject_type": entry.subject_type,
        "subject_id": entry.subject_id,
        "memory_id": entry.memory_id,
        "conversation_id": entry.conversation_id,
        "message_id": entry.message_id,
        "source_type": entry.source_type,
        "source_ref": entry.source_ref,
        "text": entry.text,
        "version": entry.version,
        "occurred_at": entry.occurred_at.astimezone(UTC),
        "vector": list(entry.vector),
        "memory_kind": entry.memory_kind,
        "scope": entry.scope,
    }


def entry_of(row: Mapping[str, Any]) -> VectorEntry:
    # pyarrow returns zoneinfo's UTC; stored_entry gives datetime.UTC like the rest of memproj.
    return stored_entry(row, tuple(row["vector"]))


def ref_batches(reader: pa.RecordBatchReader, rows: int) -> Iterator[list[EntryRef]]:
    for batch in reader:
        for offset in range(0, batch.num_rows, rows):
            yield [stored_ref(row) for row in batch.slice(offset, rows).to_pylist()]
