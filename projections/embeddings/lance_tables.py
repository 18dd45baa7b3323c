"""The tables of a LanceDB vector store's directory: what each records (the embedder, the
column version), the rebuild tables beside the live one (``LanceShadows``: an erasure reaches
them too, and they are dropped once older than the rebuild grace period), and dropping one.
The live table's reads and writes are ``projections.embeddings.lance``'s.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

import lancedb

from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.lance_schema import stored_model, stored_schema_version
from projections.embeddings.vectors import REPLAY_PREFIX


def table_model(path: Path, table: str = "embeddings") -> str:
    """The embedder whose vectors the table holds (it is opened, or created, first)."""
    return stored_model(lancedb.connect(path).open_table(table).schema)


def table_schema_version(path: Path, table: str = "embeddings") -> int:
    """The version of the table's columns (``SCHEMA_VERSION`` for a table made now)."""
    return stored_schema_version(lancedb.connect(path).open_table(table).schema)


def drop_table(path: Path, table: str) -> None:
    with contextlib.suppress(ValueError):  # missing: a rebuild of nothing never created it
        lancedb.connect(path).drop_table(table)


def replay_tables(path: Path) -> dict[str, datetime]:
    """The rebuild tables still in the store (a rebuild that was killed leaves its own), with
    when each was created."""
    database = lancedb.connect(path)
    found: dict[str, datetime] = {}
    token: str | None = None
    while True:
        page = database.list_tables(page_token=token)
        for name in page.tables:
            if name.startswith(REPLAY_PREFIX):
                stamp = name.removeprefix(REPLAY_PREFIX).split("_", 1)[0]
                with contextlib.suppress(ValueError):
                    found[name] = datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=UTC)
        token = page.page_token
        if not token:
            return found


class LanceShadows:
    """The rebuild tables beside the live store: an erasure reaches them too, and they are
    dropped once older than the rebuild grace period (``projections.stores.embeddings``)."""

    def __init__(self, path: Path, dim: int, *, model: str) -> None:
        self._path = path
        self._dim = dim
        self._model = model

    def tables(self) -> dict[str, datetime]:
        return replay_tables(self._path) if self._path.exists() else {}

    def open(self, name: str) -> LanceVectorStore:
        # Adopted: a rebuild table of another model is still erased from, and dropped in time.
        return LanceVectorStore(self._path, self._dim, table=name, model=self._model, adopt=True)

    def drop(self, name: str) -> None:
        drop_table(self._path, name)

    def recorded(self, name: str = "embeddings") -> tuple[str, int]:
        return table_model(self._path, name), table_schema_version(self._path, name)
