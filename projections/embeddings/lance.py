"""``VectorStore`` in an embedded LanceDB table on disk.

LanceDB keeps every table version, so a row removed today is still readable in yesterday's
version: after a deletion request the worker calls ``purge_history`` to make it unreachable.

lancedb takes about a second to import, so modules that only read the port import
``projections.embeddings.vectors``; this module is imported where a store is opened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.query import LanceVectorQueryBuilder
from lancedb.table import Table

from projections.embeddings.lance_filters import (
    any_match_filter,
    any_of,
    match_filter,
    memory_only_filter,
    tenant_filter,
)
from projections.embeddings.lance_maintenance import maintain_indexes, purge_history
from projections.embeddings.lance_schema import (
    REF_COLUMNS,
    STORE_KEY,
    entry_of,
    entry_rows,
    lance_schema,
    ref_batches,
    stored_model,
    stored_schema_version,
    table_columns,
)
from projections.embeddings.lexical import (
    SEPARATORS,
    lexical_ranking,
    query_terms,
    terms,
    without_separators,
)
from projections.embeddings.ranking import NearestIds
from projections.embeddings.vectors import (
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
    stored_kind,
)

# What a read's ranking answers with (``search_candidates``): no text, no vector.
_CANDIDATE_COLUMNS = ("id", "kind", "tenant_id", "memory_id", "version")
# Rows per batch of the scans that stream a table (``nearest``): a batch of 256-dimension
# vectors is 512 KB, and its distances to 400 probe vectors 800 KB. Measured on 80,000
# entries, three verifications of 400 probes each, one run: peak +83 MB over the open store with
# 512 rows a batch, +114 MB with 2048 (the larger temporaries fragment the heap).
SCAN_BATCH_ROWS = 512
_T = TypeVar("_T")


def _is_stale_version_error(error: Exception) -> bool:
    """Whether a failure comes from reading a table version another process cleaned up.

    LanceDB reports it as a ValueError ("Version N no longer exists") on checkout, and as a
    RuntimeError ("Not found: LanceError(IO) ... .lance") or an OSError when a query touches
    the deleted data files. No exception class of its own says so: the wording is lancedb
    0.40's (pinned in ops/constraints.txt), and tests/projections/test_lance_store.py's
    ``test_removed_entries_stay_in_old_versions_until_the_history_is_purged`` and
    ``test_a_reader_whose_version_was_cleaned_up_reopens_the_table`` fail when it changes.
    """
    if isinstance(error, OSError):
        return True
    message = str(error).lower()
    return "no longer exists" in message or "not found" in message or "lanceerror(io)" in message


class LanceVectorStore:
    """The vector store in an embedded LanceDB table.

    Several processes may open the same path (the embeddings worker writes; recall reads).
    Every operation first moves the handle to the latest committed version, so readers see the
    writer's commits; if the version a handle was on gets cleaned up by ``purge_history`` in
    another process mid-read, the table is reopened and the operation retried once.

    ``model`` names the embedder of the vectors written and searched: a table created here
    records it, and opening a table that records another refuses (``EmbedderMismatch``), so
    that vectors of two models never meet in one ranking. Only the rebuild opens the live
    table with ``adopt=True``: it reads the entries whatever their model, and ``replace_all``
    then records ``model`` with the rebuilt vectors in the same commit. A table of an older
    schema (``SCHEMA_VERSION``: without the memory's kind and scope) is refused the same way
    (``VectorSchemaOutdated``), and rebuilt the same way.

    The writer keeps BTREE indexes on the columns every search's prefilter starts with
    (``projections.embeddings.lance_maintenance``, after each upsert and purge); readers only
    use them.
    """

    def __init__(
        self,
        path: Path,
        dim: int,
        table: str = "embeddings",
        *,
        model: str,
        adopt: bool = False,
        create: bool = True,
    ) -> None:
        self.dim = dim
        self.model = model
        self._name = table
        self._path = path
        self._db = lancedb.connect(path)
        self._table = self._open_or_create(lance_schema(dim, model), adopt, create)

    def _open_or_create(self, schema: pa.Schema, adopt: bool, create: bool) -> Table:
        try:
            table = self._db.open_table(self._name)
        except ValueError:
            if not create:  # a reader on a read-only mount (the API) cannot create it
                raise VectorStoreMissing(f"the table {self._name!r} at {self._path}") from None
            # Missing. exist_ok: another process may be creating it at this very moment.
            table = self._db.create_table(self._name, schema=schema, exist_ok=True)
        stored = table.schema
        if adopt:
            return table
        model = stored_model(stored)
        if model != self.model:
            raise EmbedderMismatch(f"the table {self._name!r} at {self._path}", model, self.model)
        version = stored_schema_version(stored)
        if version != SCHEMA_VERSION:
            # Never read around the missing columns: a search confined by kind and scope
            # would silently find none of its entries.
            raise VectorSchemaOutdated(
                f"the table {self._name!r} at {self._path}", version, SCHEMA_VERSION
            )
        vectors = stored.field("vector").type
        if vectors != schema.field("vector").type:
            raise ValueError(
                f"table {self._name!r} at {self._path} holds vectors of type {vectors}, not of"
                f" {self.dim} float32: was it written by an embedder of another dimension?"
            )
        if not stored.equals(schema):
            raise ValueError(f"table {self._name!r} at {self._path} has another schema:\n{stored}")
        return table

    @property
    def _schema(self) -> pa.Schema:
        return lance_schema(self.dim, self.model)

    @property
    def table(self) -> Table:
        """The underlying LanceDB table (for inspection, e.g. checking out old versions)."""
        return self._table

    def upsert(self, entries: Sequence[VectorEntry]) -> None:
        if not entries:
            return
        for entry in entries:
            if len(entry.vector) != self.dim:
                raise ValueError(
                    f"entry {entry.id!r} has a vector of {len(entry.vector)} dimensions,"
                    f" the store holds {self.dim}"
                )
        rows = entry_rows(entries, self._schema)

        def upsert(table: Table) -> None:
            # On the tenant and the id: an id names an entry within its tenant only, so that
            # no tenant's upsert can ever replace another tenant's entry.
            merge = table.merge_insert(list(STORE_KEY))
            merge.when_matched_update_all().when_not_matched_insert_all().execute(rows)
            maintain_indexes(table)

        self._run(upsert)

    def remove(self, match: Match) -> int:
        return self.remove_any([match])

    def remove_any(self, matches: Sequence[Match]) -> int:
        where = any_match_filter(matches)
        if where is None:
            return 0

        def remove(table: Table) -> int:
            found = table.count_rows(where)
            if found:
                table.delete(where)
            return found

        return self._run(remove)

    def find(self, match: Match) -> list[VectorEntry]:
        return self.find_any([match])

    def find_any(self, matches: Sequence[Match]) -> list[VectorEntry]:
        where = any_match_filter(matches)
        if where is None:
            return []
        entries = self._query(where)
        return sorted(entries, key=lambda entry: (entry.tenant_id, entry.id))

    def get(self, tenant_id: str, entry_ids: Sequence[str]) -> list[VectorEntry]:
        if not entry_ids:
            return []
        where = f"{tenant_filter(tenant_id)} AND {any_of('id', sorted(set(entry_ids)))}"
        by_id = {entry.id: entry for entry in self._query(where)}
        return [by_id[entry_id] for entry_id in dict.fromkeys(entry_ids) if entry_id in by_id]

    def search(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[VectorHit]:
        rows = self._nearest_rows(tenant_id, vector, limit, subject, only, None)
        hits = [VectorHit(entry_of(row), float(row["_distance"])) for row in rows]
        return sorted(hits, key=lambda hit: (hit.distance, hit.entry.id))

    def search_candidates(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[Candidate]:
        rows = self._nearest_rows(tenant_id, vector, limit, subject, only, _CANDIDATE_COLUMNS)
        found = [
            Candidate(
                row["id"],
                stored_kind(row["id"], row["kind"]),
                row["tenant_id"],
                row["memory_id"],
                row["version"],
                float(row["_distance"]),
            )
            for row in rows
        ]
        return sorted(found, key=lambda candidate: (candidate.distance, candidate.id))

    def _nearest_rows(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None,
        only: MemoryOnly | None,
        columns: Sequence[str] | None,
    ) -> list[dict[str, Any]]:
        """The ``limit`` rows nearest to ``vector`` with their ``_distance``: every column, or
        only ``columns`` (the ranking reads the vectors, the answer carries only these)."""
        if len(vector) != self.dim:
            raise ValueError(f"the query vector has {len(vector)} dimensions, not {self.dim}")
        if limit < 1 or (only is not None and only.admits_nothing):
            return []
        where = tenant_filter(tenant_id, subject)
        if only is not None:
            where += f" AND {memory_only_filter(only)}"

        def search(table: Table) -> pa.Table:
            query = table.search(list(vector), vector_column_name="vector")
            if not isinstance(query, LanceVectorQueryBuilder):
                raise TypeError(f"LanceDB made a {type(query).__name__} of a vector query")
            query = (
                query.distance_type("cosine")
                # A prefilter: ranking only ever sees the tenant's entries (of the kinds and
                # scopes asked for), so a nearer entry of another tenant (or of a kind the
                # purpose may not read) can neither appear nor push the wanted ones out of the
                # limit.
                .where(where, prefilter=True)
                .limit(limit)
            )
            if columns is not None:
                query = query.select([*columns, "_distance"])
            return query.to_arrow()

        rows: list[dict[str, Any]] = self._run(search).to_pylist()
        return rows

    def lexical_candidates(
        self,
        tenant_id: str,
        text: str,
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[LexicalCandidate]:
        """The candidates' texts are read (through the tenant's and subject's scalar
        indexes, in batches) and their terms taken as they are ranked: the table keeps no
        text index, so an erasure has nothing more to remove and a table of this schema
        searches as it is (ops/decisions/hybrid-retrieval.md)."""
        wanted = query_terms(text)
        if limit < 1 or not wanted or (only is not None and only.admits_nothing):
            return []
        where = tenant_filter(tenant_id, subject)
        if only is not None:
            where += f" AND {memory_only_filter(only)}"

        def read(table: Table) -> tuple[int, dict[str, dict[str, Any]], list[tuple[str, set[str]]]]:
            scan = (
                table.search()
                .where(where)
                .select([*_CANDIDATE_COLUMNS, "text"])
                .limit(None)
                .to_batches(batch_size=SCAN_BATCH_ROWS)
            )
            total, rows, held = 0, {}, []
            for batch in scan:
                total += batch.num_rows
                for row in batch.filter(_may_hold(batch.column("text"), wanted)).to_pylist():
                    found = set(wanted).intersection(terms(row["text"]))
                    if found:
                        rows[row["id"]] = row
                        held.append((row["id"], found))
            return total, rows, held

        total, rows, held = self._run(read)
        return [
            LexicalCandidate(
                entry_id,
                stored_kind(entry_id, row["kind"]),
                row["tenant_id"],
                row["memory_id"],
                row["version"],
                score,
            )
            for score, entry_id in lexical_ranking(wanted, held, total, limit)
            for row in [rows[entry_id]]
        ]

    def nearest(
        self, tenant_id: str, vectors: Sequence[Sequence[float]], limit: int
    ) -> list[list[RefHit]]:
        """One streamed pass over the tenant's ids and vectors, whatever the number of query
        vectors: LanceDB's own search reads every vector of the table per query (a flat
        search filters after reading), and its read-ahead holds a hundred MB and more of a
        large table at once. Here a batch of ``SCAN_BATCH_ROWS`` at a time is ranked against
        every query vector; the winners are then read by id, without text or vector."""
        for vector in vectors:
            if len(vector) != self.dim:
                raise ValueError(f"the query vector has {len(vector)} dimensions, not {self.dim}")
        if limit < 1 or not vectors:
            return [[] for _ in vectors]
        queries = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), self.dim)

        def rank(table: Table) -> list[list[tuple[float, str]]]:
            ranking = _Ranking(queries, limit)
            scan = (
                table.search()
                .where(tenant_filter(tenant_id))
                .select(["id", "vector"])
                .limit(None)
                .to_batches(batch_size=SCAN_BATCH_ROWS)
            )
            for batch in scan:
                ranking.add_batch(batch)
            return ranking.best

        best = self._run(rank)
        winners = Match(tenant_id, entry_ids=tuple({i for hits in best for _, i in hits}))
        found = {ref.id: ref for refs in self.find_refs(winners, SCAN_BATCH_ROWS) for ref in refs}
        # An entry removed between the ranking and the read is left out: it is gone.
        return [
            [RefHit(found[entry_id], distance) for distance, entry_id in hits if entry_id in found]
            for hits in best
        ]

    def find_refs(self, match: Match, batch_rows: int) -> Iterator[list[EntryRef]]:
        """If another process cleans up the version being scanned, the scan starts again on
        the latest one: an entry may then come twice (readers collect ids)."""
        where = match_filter(match)
        if where is None:
            return

        def scan(table: Table) -> pa.RecordBatchReader:
            query = table.search().where(where).select(list(REF_COLUMNS)).limit(None)
            return query.to_batches(batch_size=batch_rows)

        try:
            yield from ref_batches(self._run(scan), batch_rows)
        except (ValueError, RuntimeError, OSError) as error:
            if not _is_stale_version_error(error):
                raise
            self._table = self._db.open_table(self._name)
            yield from ref_batches(scan(self._table), batch_rows)

    def purge_history(self) -> None:
        self._run(purge_history)

    def history_versions(self) -> int:
        return self._run(lambda table: len(table.list_versions()) - 1)

    def history_find(self, match: Match) -> list[tuple[int, VectorEntry]]:
        where = match_filter(match)
        if where is None:
            return []

        def old_versions(table: Table) -> list[int]:
            latest = table.version
            return sorted(
                int(v["version"]) for v in table.list_versions() if v["version"] != latest
            )

        found: list[tuple[int, VectorEntry]] = []
        for version in self._run(old_versions):
            try:
                old = self._db.open_table(self._name)
                old.checkout(version)
                query = old.search().where(where).select(table_columns(old)).limit(None)
                rows = query.to_arrow()
            except (ValueError, RuntimeError, OSError) as error:
                if not _is_stale_version_error(error):
                    raise
                continue  # cleaned up meanwhile: nothing of it is left to read
            found += [(version, entry_of(row)) for row in rows.to_pylist()]
        return found

    def count(self) -> int:
        return self._run(lambda table: table.count_rows())

    def tenants(self) -> list[str]:
        def tenants(table: Table) -> pa.Table:
            return table.search().select(["tenant_id"]).limit(None).to_arrow()

        return sorted(set(self._run(tenants).column("tenant_id").to_pylist()))

    def entries(self, tenant_id: str) -> list[VectorEntry]:
        return sorted(self._query(tenant_filter(tenant_id)), key=lambda entry: entry.id)

    def replace_all(self, entries: Sequence[VectorEntry]) -> None:
        """Make ``entries`` the whole content in one commit, and drop the old versions. The
        commit records this store's model: the table now holds its vectors only."""
        rows = entry_rows(entries, self._schema)
        self._run(lambda table: table.add(rows, mode="overwrite"))
        self.purge_history()

    def _query(self, where: str) -> list[VectorEntry]:
        def query(table: Table) -> pa.Table:
            return table.search().where(where).select(table_columns(table)).limit(None).to_arrow()

        return [entry_of(row) for row in self._run(query).to_pylist()]

    def _run(self, operation: Callable[[Table], _T]) -> _T:
        try:
            self._table.checkout_latest()  # type: ignore[no-untyped-call]
            return operation(self._table)
        except (ValueError, RuntimeError, OSError) as error:
            if not _is_stale_version_error(error):
                raise
        # Another process cleaned up the version this handle held: open the table afresh.
        self._table = self._db.open_table(self._name)
        return operation(self._table)


def _may_hold(texts: pa.Array, wanted: Sequence[str]) -> pa.Array:
    """Which ``texts`` may hold one of the ``wanted`` terms (a superset, in Arrow's compute:
    ``lexical.without_separators``), so that only those are split into terms: a search of a
    subject of 10,000 entries split every text (ops/decisions/hybrid-retrieval.md)."""
    if not all(term.isascii() for term in wanted):
        return pa.array([True] * len(texts))
    squeezed = pc.replace_substring_regex(
        pc.utf8_lower(texts), pattern=f"[{re.escape(SEPARATORS)}]", replacement=""
    )
    # A text of other characters than ASCII is split whatever it holds: NFKC and case-folding
    # make ASCII of some (full-width letters, the Kelvin sign), which lowercasing does not.
    found = pc.invert(pc.string_is_ascii(texts))
    for term in set(wanted):
        found = pc.or_(found, pc.match_substring(squeezed, without_separators(term)))
    return found


class _Ranking(NearestIds):
    """``NearestIds`` fed with the table's record batches."""

    def add_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        dim = self._queries.shape[1]
        vectors = batch.column("vector").flatten().to_numpy().reshape(-1, dim)
        self.add(batch.column("id").to_pylist(), vectors)
