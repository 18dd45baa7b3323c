"""Process tuning of the workers and replays. Pure: no service."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
from collections.abc import Iterator

import pytest

from streams.runtime import (
    YOUNG_THRESHOLD,
    limit_malloc_arenas,
    tune_garbage_collection,
    use_system_arrow_pool,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    _, middle, old = gc.get_threshold()
    tune_garbage_collection()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    assert gc.isenabled()


def test_an_operators_malloc_arena_max_is_left_as_glibc_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_malloc_arenas_are_capped_where_glibc_allocates(monkeypatch: pytest.MonkeyPatch) -> None:
    # Capped with glibc (mallopt is glibc's); nothing to cap elsewhere (musl, macOS). Either
    # way the test runs: a skipped test would fail CI.
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")


def test_an_operators_arrow_memory_pool_is_left_as_pyarrow_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    assert use_system_arrow_pool() is False
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"


def test_pyarrow_allocates_with_the_system_malloc_once_chosen_before_its_import() -> None:
    # A process of its own: pyarrow reads its pool once, at its first import.
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    program = (
        "from streams.runtime import use_system_arrow_pool\n"
        "assert use_system_arrow_pool()\n"
        "import pyarrow\n"
        "print(pyarrow.default_memory_pool().backend_name)"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "system"


def test_pyarrow_imported_before_is_switched_to_the_system_malloc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow

    before = pyarrow.default_memory_pool()
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    try:
        assert use_system_arrow_pool() is True
        assert pyarrow.default_memory_pool().backend_name == "system"
    finally:
        pyarrow.set_memory_pool(before)
