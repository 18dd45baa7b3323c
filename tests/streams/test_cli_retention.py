"""How `memproj retention` writes a period: as an operator sets it, and as it parses back."""

from __future__ import annotations

import pytest

from streams.cli.memory import parse_duration
from streams.cli.retention import period_text


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "keep"),
        (2.0, "2s"),
        (120.0, "2m"),
        (7200.0, "2h"),
        (2592000.0, "30d"),
        (90.5, "90.5s"),
    ],
)
def test_aperiod_text_is_shown_in_its_largest_whole_unit(seconds: float | None, shown: str) -> None:
    assert period_text(seconds) == shown


@pytest.mark.parametrize("seconds", [2.0, 120.0, 7200.0, 2592000.0])
def test_a_shownperiod_text_parses_back_to_itself(seconds: float) -> None:
    assert parse_duration(period_text(seconds)).total_seconds() == seconds
