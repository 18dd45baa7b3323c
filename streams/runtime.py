"""Process-wide tuning for the long-running, allocation-heavy commands (workers, replays)."""

from __future__ import annotations

import ctypes
import gc
import os
import sys

# Every event allocates a few hundred short-lived objects (decoded bytes, pydantic models,
# rows). With CPython's default threshold of 700 the collector runs every few events and
# keeps promoting a batch's still-referenced objects into the old generations, whose full
# scans then walk every module, schema and library object of the process. Collecting the young
# generation every 50,000 net allocations (a batch or so) and freezing what start-up built
# measured 13-17% less CPU per event in the sealer and 8-12% in the memory worker; cycles
# are still collected, just less often.
YOUNG_THRESHOLD = 50_000


def tune_garbage_collection() -> None:
    """Call once start-up has imported and built everything the process keeps."""
    gc.collect()
    gc.freeze()  # start-up objects live as long as the process: never scan them again
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


# glibc gives each thread that finds the others' arenas busy an arena of its own, up to 8 per
# core, and keeps what an arena once held: LanceDB's Rust runtime scans on a pool of threads,
# and its freed read buffers stayed resident in a dozen arenas (ops/decisions/worker-memory.md:
# 100 flat searches of 80k vectors peaked at 480 MB with the default, 340 MB with 2).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas, unless ``MALLOC_ARENA_MAX`` already set them (glibc reads it
    at start: an operator's value wins). Call before the process starts its threads. Whether
    the cap was set here; False without glibc (musl, macOS), where there is nothing to cap."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


# pyarrow allocates from mimalloc by default, which keeps what it freed in per-thread heaps:
# LanceDB hands its results over as arrow arrays on a dozen threads. With glibc's malloc (its
# arenas capped as above) the embeddings worker's scenario of ops/bench/store_memory.py (200
# index updates, 20 erasures on 80,000 entries) peaked 66-110 MB lower, at no more CPU
# (ops/decisions/worker-memory.md).
ARROW_MEMORY_POOL = "system"
_ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_arrow_pool() -> bool:
    """Make pyarrow allocate with the system's malloc, unless ``ARROW_DEFAULT_MEMORY_POOL``
    is set (an operator's value wins). Arrow reads the variable when its default pool is first
    asked for; if pyarrow is imported already, its default pool is switched now. Whether the
    pool was chosen here."""
    if _ARROW_POOL_VARIABLE in os.environ:
        return False
    os.environ[_ARROW_POOL_VARIABLE] = ARROW_MEMORY_POOL
    if "pyarrow" in sys.modules:
        import pyarrow

        pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    return True
