"""Process tuning of the workers and replays. Pure: no service."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streams.runtime import YOUNG_THRESHOLD, tune_garbage_collection


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
