"""``VectorStore`` in PostgreSQL, beside the rest of a tenant's data: the one module that owns
the ``vector_entries`` and ``vector_collections`` tables (projections/migrations).

No extension: a vector is a ``bytea`` of float32. Every read names its tenant (and a search its
subject), so a search reads one subject's candidates through the subject index and ranks them
exactly in numpy (``projections.embeddings.ranking``: the cosine distances LanceDB gives), in
the calling thread: callers run the store's methods off the event loop, as LanceDB's.

Any number of processes write and read it (embeddings workers, API replicas, the deletion and
monitor workers): an upsert is an ``INSERT ... ON CONFLICT`` in one transaction, an erasure a
``DELETE`` visible to every reader at its commit. There are no table versions: a removed row
survives only as a dead tuple until a vacuum, which the purge of the PostgreSQL tables covers
(``streams.purge``), so ``purge_history`` has nothing to do and ``history_find`` finds nothing.

A collection is one vector table (the live ``embeddings``, a rebuild's
``embeddings_replay_...``): it records the embedder of its vectors and the version of its
columns, and opening one of another embedder or version refuses, as LanceDB's table does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from projections.embeddings.lexical import query_terms, term_weights, terms
from projections.embeddings.postgres_conditions import (
    any_match_condition,
    any_term_query,
    candidates_condition,
    columns,
    match_condition,
)
from projections.embeddings.ranking import NearestIds, as_vectors, nearest, vector_bytes
from projections.embeddings.vectors import (
    REPLAY_PREFIX,
    SCHEMA_VERSION,
    Candidate,
    EmbedderMismatch,
    EntryRef,
    LexicalCandidate,
    Match,
    MemoryOnly,
    RefHit,
    VectorEntry,
    VectorHit,
    VectorSchemaOutdated,
    VectorStoreMissing,
    stored_entry,
    stored_kind,
    stored_ref,
)

Pool = ConnectionPool[psycopg.Connection[tuple[Any, ...]]]

LIVE = "embeddings"
# Rows per batch of the scans that stream a tenant (``nearest``), as LanceDB's.
SCAN_BATCH_ROWS = 512

_COLUMNS = (
    "id", "kind", "tenant_id", "subject_type", "subject_id", "memory_id", "conversation_id",
    "message_id", "source_type", "source_ref", "text", "version", "occurred_at", "vector",
    "memory_kind", "scope",
)  # fmt: skip
_REF_COLUMNS = (
    "id", "kind", "tenant_id", "subject_type", "subject_id", "memory_id", "conversation_id",
    "occurred_at",
)  # fmt: skip
_KEY = ("tenant_id", "collection", "id")
# An entry's row (``_row``): its columns, then its text's search terms
# (``projections.embeddings.lexical.terms``), kept as they are (no text search configuration
# parses them again).
_INSERT = sql.SQL(
    "INSERT INTO vector_entries ({columns}, terms) VALUES ({values}, array_to_tsvector(%s::text[]))"
).format(
    columns=columns(("collection", *_COLUMNS)),
    values=sql.SQL(", ").join(sql.Placeholder() * (len(_COLUMNS) + 1)),
)


def open_pool(conninfo: str, size: int = 4) -> Pool:
    """A small pool of synchronous connections: the store's methods run in worker threads
    (``asyncio.to_thread``), each taking a connection for its statements."""
    pool: Pool = ConnectionPool(
        # Autocommit: a read of one statement is one round trip; what must be one commit
        # takes a transaction of its own (``_transaction``).
        conninfo,
        min_size=1,
        max_size=size,
        open=False,
        kwargs={"autocommit": True},
    )
    pool.open(wait=True, timeout=60)
    return pool


class PostgresVectorStore:
    """The vector store in PostgreSQL's ``vector_entries``, one collection of it.

    ``model`` names the embedder of the vectors written and searched: a collection created
    here records it, and opening one that records another refuses (``EmbedderMismatch``);
    ``adopt`` (the rebuild only) reads it whatever its model, and ``replace_all`` then records
    ``model`` with the rebuilt vectors in the same transaction. ``create=False`` (a reader)
    refuses a collection nothing created yet (``VectorStoreMissing``)."""

    def __init__(
        self,
        pool: Pool,
        dim: int,
        collection: str = LIVE,
        *,
        model: str,
        adopt: bool = False,
        create: bool = True,
    ) -> None:
        self.dim = dim
        self.model = model
        self.collection = collection
        self._pool = pool
        self._adopt, self._create = adopt, create
        self._checked = threading.Event()
        self._checking = threading.Lock()
        self._check()

    def _check(self) -> None:
        """Creates the collection (``create``) or finds it, and refuses one of another
        embedder or column version (unless ``adopt``): at the opening, so that a worker of
        the wrong model stops as it starts. A database not migrated yet (a worker opens the
        store as it is built, before its start applies the migrations) is checked at the
        first use instead."""
        if self._checked.is_set():
            return
        with self._checking:
            if self._checked.is_set():
                return
            try:
                self._open(self._adopt, self._create)
            except psycopg.errors.UndefinedTable:
                return
            self._checked.set()

    def _open(self, adopt: bool, create: bool) -> None:
        where = f"the vector collection {self.collection!r} in PostgreSQL"
        with self._pool.connection() as conn:
            if create:
                conn.execute(
                    "INSERT INTO vector_collections (name, model, dim, schema_version)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                    (self.collection, self.model, self.dim, SCHEMA_VERSION),
                )
            row = conn.execute(
                "SELECT model, dim, schema_version FROM vector_collections WHERE name = %s",
                (self.collection,),
            ).fetchone()
        if row is None:
            raise VectorStoreMissing(where)
        model, dim, version = row
        if adopt:
            return
        if model != self.model:
            raise EmbedderMismatch(where, model, self.model)
        if version != SCHEMA_VERSION:
            raise VectorSchemaOutdated(where, version, SCHEMA_VERSION)
        if dim != self.dim:
            raise ValueError(
                f"{where} holds vectors of {dim} dimensions, not {self.dim}: was it written by"
                " an embedder of another dimension?"
            )

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in one transaction, committed when the block ends."""
        self._check()
        with (
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(binary=True) as cursor,
        ):
            yield cursor

    @contextmanager
    def _statement(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor for one statement, committed by itself (autocommit)."""
        self._check()
        with self._pool.connection() as conn, conn.cursor(binary=True) as cursor:
            yield cursor

    # -- writing ----------------------------------------------------------------------------

    def upsert(self, entries: Sequence[VectorEntry]) -> None:
        if not entries:
            return
        latest = {(entry.tenant_id, entry.id): entry for entry in entries}
        # In key order: two writers upserting overlapping batches lock rows in the same order
        # and never deadlock.
        rows = [self._row(latest[key]) for key in sorted(latest)]
        statement = sql.SQL("{insert} ON CONFLICT ({key}) DO UPDATE SET {updates}").format(
            insert=_INSERT,
            key=columns(_KEY),
            updates=sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name))
                for name in (*_COLUMNS, "terms")
                if name not in _KEY
            ),
        )
        with self._transaction() as cursor:
            cursor.executemany(statement, rows)

    def _row(self, entry: VectorEntry) -> tuple[Any, ...]:
        if len(entry.vector) != self.dim:
            raise ValueError(
                f"entry {entry.id!r} has a vector of {len(entry.vector)} dimensions,"
                f" the store holds {self.dim}"
            )
        if entry.occurred_at.tzinfo is None:
            raise ValueError(f"entry {entry.id!r} has a naive occurred_at; it must be UTC-aware")
        if entry.kind == "memory" and (entry.memory_kind is None or entry.scope is None):
            # It would be out of every search confined by kind or scope, with no word said.
            raise ValueError(f"memory entry {entry.id!r} has no kind or scope")
        texts = (
            entry.id, entry.tenant_id, entry.subject_type, entry.subject_id, entry.memory_id,
            entry.conversation_id, entry.message_id, entry.source_type, entry.source_ref,
            entry.text, entry.memory_kind, entry.scope,
        )  # fmt: skip
        if any(text is not None and "\x00" in text for text in texts):
            # The contract's codec refuses such events before any store sees them.
            raise ValueError(
                f"entry {entry.id!r} holds a NUL character, which PostgreSQL cannot store"
            )
        return (
            self.collection,
            entry.id,
            entry.kind,
            entry.tenant_id,
            entry.subject_type,
            entry.subject_id,
            entry.memory_id,
            entry.conversation_id,
            entry.message_id,
            entry.source_type,
            entry.source_ref,
            entry.text,
            entry.version,
            entry.occurred_at.astimezone(UTC),
            vector_bytes(entry.vector),
            entry.memory_kind,
            entry.scope,
            list(terms(entry.text)),
        )

    def remove(self, match: Match) -> int:
        return self.remove_any([match])

    def remove_any(self, matches: Sequence[Match]) -> int:
        where = self._any_match(matches)
        if where is None:
            return 0
        with self._statement() as cursor:
            cursor.execute(sql.SQL("DELETE FROM vector_entries WHERE {}").format(where))
            return cursor.rowcount

    def replace_all(self, entries: Sequence[VectorEntry]) -> None:
        """Make ``entries`` the whole content of the collection in one transaction, recording
        this store's model: the collection now holds its vectors only."""
        latest = {(entry.tenant_id, entry.id): entry for entry in entries}
        rows = [self._row(latest[key]) for key in sorted(latest)]
        with self._transaction() as cursor:
            cursor.execute("DELETE FROM vector_entries WHERE collection = %s", (self.collection,))
            cursor.executemany(_INSERT, rows)
            cursor.execute(
                "UPDATE vector_collections SET model = %s, dim = %s, schema_version = %s"
                " WHERE name = %s",
                (self.model, self.dim, SCHEMA_VERSION, self.collection),
            )

    # -- selecting --------------------------------------------------------------------------

    def _any_match(self, matches: Sequence[Match]) -> sql.Composable | None:
        return any_match_condition(matches, self.collection)

    def find(self, match: Match) -> list[VectorEntry]:
        return self.find_any([match])

    def find_any(self, matches: Sequence[Match]) -> list[VectorEntry]:
        where = self._any_match(matches)
        if where is None:
            return []
        entries = self._select(where)
        return sorted(entries, key=lambda entry: (entry.tenant_id, entry.id))

    def get(self, tenant_id: str, entry_ids: Sequence[str]) -> list[VectorEntry]:
        found = map(self._entry, self._rows_of(tenant_id, entry_ids, _COLUMNS))
        by_id = {entry.id: entry for entry in found}
        return [by_id[entry_id] for entry_id in dict.fromkeys(entry_ids) if entry_id in by_id]

    def entries(self, tenant_id: str) -> list[VectorEntry]:
        where = sql.SQL("tenant_id = {} AND collection = {}").format(
            sql.Literal(tenant_id), sql.Literal(self.collection)
        )
        return sorted(self._select(where), key=lambda entry: entry.id)

    def _select(self, where: sql.Composable) -> list[VectorEntry]:
        statement = sql.SQL("SELECT {} FROM vector_entries WHERE {}").format(
            columns(_COLUMNS), where
        )
        with self._statement() as cursor:
            rows = cursor.execute(statement).fetchall()
        return [self._entry(row) for row in rows]

    def _entry(self, row: Sequence[Any]) -> VectorEntry:
        values = dict(zip(_COLUMNS, row, strict=True))
        vector = as_vectors(bytes(values["vector"]), self.dim)[0]
        return stored_entry(values, tuple(vector.tolist()))

    def find_refs(self, match: Match, batch_rows: int) -> Iterator[list[EntryRef]]:
        """A server-side cursor: a batch of ``batch_rows`` at a time crosses the wire."""
        where = match_condition(match, self.collection)
        if where is None:
            return
        statement = sql.SQL("SELECT {} FROM vector_entries WHERE {}").format(
            columns(_REF_COLUMNS), where
        )
        self._check()
        with (
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(name="vector_refs") as cursor,
        ):
            cursor.itersize = batch_rows
            cursor.execute(statement)
            while rows := cursor.fetchmany(batch_rows):
                yield [_ref(row) for row in rows]

    # -- ranking ----------------------------------------------------------------------------

    def _check_query(self, vector: Sequence[float]) -> None:
        if len(vector) != self.dim:
            raise ValueError(f"the query vector has {len(vector)} dimensions, not {self.dim}")

    def _rank(
        self, vector: Sequence[float], limit: int, where: sql.Composable
    ) -> list[tuple[float, str]]:
        """The ids of the ``limit`` candidates nearest to ``vector``, with their distances:
        the candidates' ids and vectors only cross the wire (binary), what the answer carries
        besides is read for the winners only (``_by_id``).

        Rows, not one row of aggregates: measured on a subject of 10,000 entries,
        ``string_agg`` of the vectors cost the server twice the wall time of sending the
        rows (ops/decisions/vector-store.md)."""
        statement = sql.SQL("SELECT id, vector FROM vector_entries WHERE {}").format(where)
        with self._statement() as cursor:
            rows = cursor.execute(statement).fetchall()
        if not rows:
            return []
        ids = [entry_id for entry_id, _ in rows]
        buffer = b"".join(stored for _, stored in rows)
        ranked = nearest(vector, ids, as_vectors(buffer, self.dim), limit)
        return [(distance, ids[row]) for distance, row in ranked]

    def _by_id(
        self, tenant_id: str, ranked: list[tuple[float, str]], columns: Sequence[str]
    ) -> list[tuple[float, tuple[Any, ...]]]:
        """The ranked entries' ``columns`` (the first is the id), in the ranking's order. An
        entry removed since the ranking is left out: it is gone."""
        rows = {row[0]: row for row in self._rows_of(tenant_id, [i for _, i in ranked], columns)}
        return [(distance, rows[entry_id]) for distance, entry_id in ranked if entry_id in rows]

    def _rows_of(
        self, tenant_id: str, entry_ids: Sequence[str], columns: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """The ``columns`` of the tenant's entries among ``entry_ids``, in no order.

        Joined with the ids, one primary-key lookup each: as ``id = ANY(...)``, a table
        without statistics yet (new, just loaded) was read through the subject index on the
        tenant alone, every entry of it filtered (89 ms for 2 ids among 31,000)."""
        if not entry_ids:
            return []
        statement = sql.SQL(
            "SELECT {} FROM unnest({}::text[]) AS wanted (id) JOIN vector_entries AS entry"
            " ON entry.tenant_id = {} AND entry.collection = {} AND entry.id = wanted.id"
        ).format(
            sql.SQL(", ").join(sql.Identifier("entry", name) for name in columns),
            sql.Literal(sorted(set(entry_ids))),
            sql.Literal(tenant_id),
            sql.Literal(self.collection),
        )
        with self._statement() as cursor:
            return [tuple(row) for row in cursor.execute(statement).fetchall()]

    def _nearest(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None,
        only: MemoryOnly | None,
    ) -> list[tuple[float, str]]:
        """The ``limit`` nearest of the tenant's (subject's, ``only``'s) candidates: what both
        searches rank before they read what each answers with."""
        self._check_query(vector)
        if limit < 1 or (only is not None and only.admits_nothing):
            return []
        where = candidates_condition(self.collection, tenant_id, subject, only)
        return self._rank(vector, limit, where)

    def search(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[VectorHit]:
        ranked = self._nearest(tenant_id, vector, limit, subject, only)
        return [
            VectorHit(self._entry(row), distance)
            for distance, row in self._by_id(tenant_id, ranked, _COLUMNS)
        ]

    def search_candidates(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[Candidate]:
        ranked = self._nearest(tenant_id, vector, limit, subject, only)
        return [
            Candidate(entry_id, stored_kind(entry_id, kind), tenant_id, memory_id, version, d)
            for d, (entry_id, kind, memory_id, version) in self._by_id(
                tenant_id, ranked, ("id", "kind", "memory_id", "version")
            )
        ]

    def lexical_candidates(
        self,
        tenant_id: str,
        text: str,
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[LexicalCandidate]:
        """Two statements, each one pass over the candidates: how many there are and how
        many hold each query term (the weights, ``term_weights``), then the best ``limit`` of
        those holding one (through the terms' GIN index or the subject's), scored in the
        database so that only they cross the wire."""
        wanted = query_terms(text)
        if limit < 1 or not wanted or (only is not None and only.admits_nothing):
            return []
        where = candidates_condition(self.collection, tenant_id, subject, only)
        counts = sql.SQL("SELECT count(*), {} FROM vector_entries WHERE {}").format(
            sql.SQL(", ").join(
                sql.SQL("count(*) FILTER (WHERE terms @@ {})").format(any_term_query([term]))
                for term in wanted
            ),
            where,
        )
        with self._statement() as cursor:
            total, *frequency = cursor.execute(counts).fetchone() or (0,)
        weights = term_weights(dict(zip(wanted, frequency, strict=True)), total)
        if not weights:
            return []
        held = sorted(weights)
        # The sum of ``lexical.score``, in its order: the weights as float8, term by term.
        scored = sql.SQL(" + ").join(
            sql.SQL("(CASE WHEN terms @@ {} THEN {}::float8 ELSE 0::float8 END)").format(
                any_term_query([term]), sql.Literal(weights[term])
            )
            for term in held
        )
        statement = sql.SQL(
            "SELECT id, kind, memory_id, version, {score} AS score FROM vector_entries"
            ' WHERE {where} AND terms @@ {query} ORDER BY score DESC, id COLLATE "C" LIMIT {limit}'
        ).format(score=scored, where=where, query=any_term_query(held), limit=limit)
        with self._statement() as cursor:
            rows = cursor.execute(statement).fetchall()
        return [
            LexicalCandidate(i, stored_kind(i, kind), tenant_id, memory_id, version, found)
            for i, kind, memory_id, version, found in rows
        ]

    def nearest(
        self, tenant_id: str, vectors: Sequence[Sequence[float]], limit: int
    ) -> list[list[RefHit]]:
        """One streamed pass over the tenant's ids and vectors (``SCAN_BATCH_ROWS`` at a time)
        whatever the number of query vectors; the winners are then read by id."""
        for vector in vectors:
            self._check_query(vector)
        if limit < 1 or not vectors:
            return [[] for _ in vectors]
        ranking = NearestIds(np.asarray(vectors, dtype=np.float32), limit)
        statement = sql.SQL("SELECT id, vector FROM vector_entries WHERE {}").format(
            candidates_condition(self.collection, tenant_id, None, None)
        )
        self._check()
        with (
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(name="vector_scan") as cursor,
        ):
            cursor.itersize = SCAN_BATCH_ROWS
            cursor.execute(statement)
            while rows := cursor.fetchmany(SCAN_BATCH_ROWS):
                buffer = b"".join(bytes(vector) for _, vector in rows)
                ranking.add([entry_id for entry_id, _ in rows], as_vectors(buffer, self.dim))
        best = ranking.best
        winners = Match(tenant_id, entry_ids=tuple({i for hits in best for _, i in hits}))
        found = {ref.id: ref for refs in self.find_refs(winners, SCAN_BATCH_ROWS) for ref in refs}
        # An entry removed between the ranking and the read is left out: it is gone.
        return [
            [RefHit(found[entry_id], distance) for distance, entry_id in hits if entry_id in found]
            for hits in best
        ]

    # -- history and inventory --------------------------------------------------------------

    def purge_history(self) -> None:
        """Nothing to do: a committed delete leaves no version a reader can reach. Its dead
        tuples are the PostgreSQL tables' purge's (a vacuum, ``streams.purge``)."""

    def history_versions(self) -> int:
        return 0

    def history_find(self, match: Match) -> list[tuple[int, VectorEntry]]:
        return []

    def count(self) -> int:
        with self._statement() as cursor:
            row = cursor.execute(
                "SELECT count(*) FROM vector_entries WHERE collection = %s", (self.collection,)
            ).fetchone()
        return int(row[0]) if row else 0

    def tenants(self) -> list[str]:
        with self._statement() as cursor:
            rows = cursor.execute(
                "SELECT DISTINCT tenant_id FROM vector_entries WHERE collection = %s",
                (self.collection,),
            ).fetchall()
        return sorted(tenant for (tenant,) in rows)


def _ref(row: Sequence[Any]) -> EntryRef:
    return stored_ref(dict(zip(_REF_COLUMNS, row, strict=True)))


# -- collections ------------------------------------------------------------------------------


class PostgresCollections:
    """The collections of ``vector_entries``: what the rebuild reads about the live one, and
    the rebuild collections beside it (``VectorShadows``: an erasure reaches them too, and
    they are dropped once older than the rebuild grace period)."""

    def __init__(self, pool: Pool, dim: int, *, model: str) -> None:
        self._pool = pool
        self._dim = dim
        self._model = model

    def tables(self) -> dict[str, datetime]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT name, created_at FROM vector_collections WHERE starts_with(name, %s)",
                (REPLAY_PREFIX,),
            ).fetchall()
        return {name: created.astimezone(UTC) for name, created in rows}

    def open(self, name: str) -> PostgresVectorStore:
        # Adopted: a rebuild collection of another model is still erased from, and dropped.
        return PostgresVectorStore(self._pool, self._dim, name, model=self._model, adopt=True)

    def drop(self, name: str) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM vector_entries WHERE collection = %s", (name,))
            conn.execute("DELETE FROM vector_collections WHERE name = %s", (name,))

    def recorded(self, name: str = LIVE) -> tuple[str, int]:
        """The embedder and the column version a collection records."""
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT model, schema_version FROM vector_collections WHERE name = %s", (name,)
            ).fetchone()
        if row is None:
            raise VectorStoreMissing(f"the vector collection {name!r} in PostgreSQL")
        return row[0], row[1]

    def create_collection(self, name: str, created: datetime) -> PostgresVectorStore:
        """A rebuild collection, recorded as made at ``created``."""
        with self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO vector_collections (name, model, dim, schema_version, created_at)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                (name, self._model, self._dim, SCHEMA_VERSION, created),
            )
        return PostgresVectorStore(self._pool, self._dim, name, model=self._model)
