"""Upkeep of the LanceDB vector table, by its one writer (the indexer's upserts and the
purge, under the embeddings writes' lock): the scalar indexes every search's prefilter uses,
and the purge of the history that keeps removed rows readable. The store
(``projections.embeddings.lance``) calls it; a reader never writes a table version.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

from lancedb.index import BTree
from lancedb.table import Table

from projections.embeddings.lance_schema import table_columns

# BTREE scalar indexes on the columns every search's prefilter starts with (``tenant_filter``):
# without them LanceDB reads every row's tenant and subject to find a subject's few dozen.
# Measured in-process on 100,000 rows of 2,000 subjects: 87 ms of CPU a search without, 9 ms
# with (ops/decisions/api-core.md). The kind and scope need none: they refine the few rows the
# subject's index selected.
INDEXED_COLUMNS = ("tenant_id", "subject_id")
# Rows written since an index was last brought up to date are scanned unindexed (10% of the
# table unindexed: about twice the CPU a search). ``upsert`` refreshes the indexes (LanceDB's
# ``optimize``: it compacts the small files of the indexer's batches too) once that many rows
# are behind, at least INDEX_REFRESH_MIN_ROWS so that a small table is not refreshed for every
# batch.
INDEX_REFRESH_FRACTION = 0.10
INDEX_REFRESH_MIN_ROWS = 10_000


def indexes_behind(indexed: int, unindexed: int) -> bool:
    """Whether an index leaves enough rows unindexed to be worth a refresh."""
    return unindexed >= max(INDEX_REFRESH_MIN_ROWS, INDEX_REFRESH_FRACTION * indexed)


def purge_history(table: Table) -> None:
    """Makes what was removed from the table unreachable: its old versions dropped, and the
    removed rows rewritten out of the data files that still hold them."""
    _optimize_dropping_history(table)
    rewritten = deleted_rows_remain(table)
    if rewritten:
        # Compaction leaves a data file alone while few of its rows are deleted: the
        # removed rows stay on disk, hidden by a deletion file. Rewriting the live rows
        # (streamed, not loaded whole) and cleaning up again erases them for real.
        live = table.search().select(table_columns(table)).limit(None).to_batches()
        table.add(live, mode="overwrite")
    # An overwrite (this rewrite, ``replace_all``'s) leaves the table without indexes;
    # making them is a version too, which the cleanup drops.
    if _create_missing_indexes(table) or rewritten:
        _optimize_dropping_history(table)


def _create_missing_indexes(table: Table) -> bool:
    """Creates the scalar indexes a table lacks (a new table, or one just overwritten); whether
    it had to. Only the writer calls it (the indexer's upserts and the purge, under the
    embeddings writes' lock): a reader never writes a table version."""
    present = {config.columns[0] for config in table.list_indices() if len(config.columns) == 1}
    missing = [column for column in INDEXED_COLUMNS if column not in present]
    for column in missing:
        table.create_index(column, config=BTree(), replace=True)
    return bool(missing)


def maintain_indexes(table: Table) -> None:
    """Creates the scalar indexes a table lacks, and brings them up to date once too many rows
    are unindexed (``indexes_behind``)."""
    if _create_missing_indexes(table):
        return  # made just now, of every row
    for column in INDEXED_COLUMNS:
        stats = table.index_stats(f"{column}_idx")
        if stats is not None and indexes_behind(stats.num_indexed_rows, stats.num_unindexed_rows):
            # Compaction and the indexes' update; old versions stay (the purge drops them).
            table.optimize()
            return


def _optimize_dropping_history(table: Table) -> None:
    with warnings.catch_warnings():
        # LanceDB warns that other readers of old versions will fail. It is expected: this
        # process is the only writer, and readers reopen the table when that happens. No
        # parameter or warning class of LanceDB's tells this warning apart (the other
        # cleanup, ``cleanup_old_versions``, needs pylance, which lancedb 0.40 no longer
        # installs), so the filter matches lancedb 0.40's wording (pinned in
        # ops/constraints.txt); tests/projections/test_lance_store.py's
        # ``test_purging_the_history_warns_nothing`` fails when it changes.
        warnings.filterwarnings(
            "ignore", message=r"optimize\(cleanup_older_than=0\)", category=UserWarning
        )
        # With scalar indexes, optimize commits their update after its cleanup: that one
        # version stays until a second optimize, with nothing left to compact or index.
        for _ in range(OPTIMIZE_ROUNDS):
            table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
            if len(table.list_versions()) == 1:
                return


OPTIMIZE_ROUNDS = 3


def deleted_rows_remain(table: Table) -> bool:
    """Whether the latest version hides deleted rows that are still in its data files.

    Lance records it in a version's metadata (``list_versions``, public) as the statistic
    ``total_deletion_file_rows``, which LanceDB does not document: ``Table.stats()`` counts
    rows after deletions and gives per-fragment lengths only as percentiles, and pylance's
    ``dataset_stats`` is not installed with lancedb 0.40 (pinned in ops/constraints.txt).
    tests/projections/test_lance_store.py's
    ``test_lancedb_records_the_deleted_rows_a_purge_rewrites`` fails when it changes."""
    latest = max(table.list_versions(), key=lambda version: int(version["version"]))
    metadata = latest.get("metadata", {})
    # Without the statistic, assume the worst: a needless rewrite is only slower.
    return str(metadata.get("total_deletion_file_rows", "unknown")) != "0"
