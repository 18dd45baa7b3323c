"""Process tuning of the workers and replays. Pure: no service."""

from __future__ import annotations

import gc
import platform
from collections.abc import Iterator

import pytest

from streams.runtime import YOUNG_THRESHOLD, limit_malloc_arenas, tune_garbage_collection


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


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_malloc_arenas_are_capped_where_glibc_allocates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is True
