"""The plaintext audit of Redis and of the data directory (files, and LanceDB tables).

Redis: every key under the cache namespace (SCAN, never KEYS; on a Redis Cluster, of every
master), its name and its value of
whichever type, read in chunks. The data directory: every file's bytes, streamed in chunks
that overlap by a needle's length. LanceDB compresses its string columns once a data file is
large enough (a byte search of a table of a few thousand entries no longer finds a marker in
its text), so every LanceDB table is also opened through its API and every version it keeps
(an old version is readable until ``purge_history``) is searched column by column.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from projections.cache.keys import build_key, glob_literal
from projections.cache.store import RedisClient
from streams.audit.plaintext import Hit, Matcher, PlaceKind, Report

CHUNK = 1 << 20
REDIS_BATCH = 500

# -- Redis -----------------------------------------------------------------------------------


def namespace_pattern(namespace: str) -> str:
    """The SCAN pattern of every key memproj writes (``build_key`` escapes each part)."""
    return glob_literal(build_key(namespace)) + ":*"


def _bytes(value: bytes | str | None) -> bytes:
    """The client gives bytes (``decode_responses=False``); its types say bytes or text."""
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


async def _redis_values(redis: RedisClient, key: bytes, kind: bytes) -> AsyncIterator[bytes]:
    """Every member, field and value of ``key``, read in chunks (never the whole value
    set at once, except a string, which Redis can only give whole)."""
    if kind == b"string":
        yield _bytes(await redis.get(key))
    elif kind == b"hash":
        async for field_name, value in redis.hscan_iter(key, count=REDIS_BATCH):
            yield _bytes(field_name)
            yield _bytes(value)
    elif kind == b"set":
        async for member in redis.sscan_iter(key, count=REDIS_BATCH):
            yield _bytes(member)
    elif kind == b"zset":
        async for member, _score in redis.zscan_iter(key, count=REDIS_BATCH):
            yield _bytes(member)
    elif kind == b"list":
        start = 0
        while chunk := await redis.lrange(key, start, start + REDIS_BATCH - 1):
            for item in chunk:
                yield _bytes(item)
            start += len(chunk)
    elif kind == b"stream":
        after = b"-"
        while entries := await redis.xrange(key, min=after, count=REDIS_BATCH):
            for entry_id, fields in entries:
                for field_name, value in (fields or {}).items():
                    yield _bytes(field_name)
                    yield _bytes(value)
                after = b"(" + _bytes(entry_id)
    else:
        raise ValueError(f"a Redis {kind.decode(errors='replace')} cannot be audited")


async def scan_redis(redis: RedisClient, namespace: str, matcher: Matcher, report: Report) -> None:
    started = time.monotonic()
    scanned = report.source("redis")
    scanned.places += 1
    pattern = namespace_pattern(namespace)
    try:
        async for key in redis.scan_iter(match=pattern, count=REDIS_BATCH):
            scanned.items += 1
            parts = ["key"] if matcher.in_bytes(key) else []
            kind = _bytes(await redis.type(key))
            try:
                async for value in _redis_values(redis, key, kind):
                    scanned.bytes += len(value)
                    if "value" not in parts and matcher.in_blob(value):
                        parts.append("value")
            except Exception as error:  # reported; the audit goes on
                report.error(f"redis key {key.decode(errors='replace')}", error)
            if parts:
                name = key.decode(errors="replace")
                report.add(Hit(PlaceKind.REDIS, pattern, name, tuple(parts)))
    finally:
        scanned.seconds += time.monotonic() - started


# -- files -----------------------------------------------------------------------------------


def files_under(root: Path) -> Iterator[Path]:
    """Every regular file under ``root``, symbolic links not followed (they lead elsewhere)."""
    for folder, _dirs, files in os.walk(root):
        for name in sorted(files):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path


def file_holds(path: Path, matcher: Matcher) -> tuple[bool, int]:
    """Whether the file's bytes hold a needle, and how many bytes were read."""
    overlap = matcher.longest_needle - 1
    size = 0
    tail = b""
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            size += len(chunk)
            window = tail + chunk
            if matcher.in_bytes(window):
                return True, size
            tail = window[-overlap:] if overlap else b""
    return False, size


def lance_tables(root: Path) -> list[Path]:
    """The LanceDB tables under ``root``: folders ``<name>.lance`` with a ``_versions``."""
    return sorted(
        path.parent
        for path in root.rglob("_versions")
        if path.is_dir() and path.parent.suffix == ".lance"
    )


def scan_files(data_dir: Path, matcher: Matcher, report: Report) -> None:
    started = time.monotonic()
    scanned = report.source("files")
    try:
        if not data_dir.exists():
            return
        scanned.places += 1
        for path in files_under(data_dir):
            relative = str(path.relative_to(data_dir))
            scanned.items += 1
            try:
                found, size = file_holds(path, matcher)
            except OSError as error:
                report.error(f"file {relative}", error)
                continue
            scanned.bytes += size
            parts = (["name"] if matcher.in_text(relative) else []) + (["bytes"] if found else [])
            if parts:
                report.add(Hit(PlaceKind.FILE, str(data_dir), relative, tuple(parts)))
        for table in lance_tables(data_dir):
            try:
                scan_lance_table(table, data_dir, matcher, report)
            except Exception as error:  # reported; the audit goes on
                report.error(f"lance table {table.relative_to(data_dir)}", error)
    finally:
        scanned.seconds += time.monotonic() - started


def scan_lance_table(path: Path, data_dir: Path, matcher: Matcher, report: Report) -> None:
    """Every string column of every version of one LanceDB table, in streamed batches."""
    import lancedb  # about a second to import: only when a table is there

    started = time.monotonic()
    scanned = report.source("lance")
    scanned.places += 1
    table = lancedb.connect(path.parent).open_table(path.stem)
    try:
        for version in sorted(int(v["version"]) for v in table.list_versions()):
            table.checkout(version)
            _scan_lance_version(table, f"{path.relative_to(data_dir)}", version, matcher, report)
    finally:
        table.checkout_latest()  # type: ignore[no-untyped-call]
        scanned.seconds += time.monotonic() - started


def _scan_lance_version(
    table: Any, name: str, version: int, matcher: Matcher, report: Report
) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    scanned = report.source("lance")
    columns = [
        field.name
        for field in table.schema
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
    ]
    if not columns:
        return
    for batch in table.search().select(columns).limit(None).to_batches():
        scanned.items += batch.num_rows
        hits = None
        found_in = []
        for column in columns:
            values = batch.column(column)
            scanned.bytes += values.nbytes
            matched = pc.match_substring(values, matcher.texts[0])
            for form in matcher.texts[1:]:  # text kept JSON-escaped
                matched = pc.or_(matched, pc.match_substring(values, form))
            matched = pc.fill_null(matched, False)
            if pc.any(matched).as_py():
                found_in.append(column)
                hits = matched if hits is None else pc.or_(hits, matched)
        if hits is None:
            continue
        rows = batch.filter(hits)
        ids = rows.column("id").to_pylist() if "id" in columns else [None] * rows.num_rows
        for entry_id in ids:  # the report keeps the first few as examples
            example = f"v{version}" + (f" id={entry_id}" if entry_id is not None else "")
            report.add(Hit(PlaceKind.LANCE, name, example, tuple(found_in)))
