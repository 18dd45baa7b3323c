"""An id in an API path: one segment that a client sends on unchanged and the server decodes
back to the id (``topics.api.paths``, ``streams.api.paths``)."""

from __future__ import annotations

import httpx
from hypothesis import given
from hypothesis import strategies as st

from streams.api.paths import SegmentConvertor
from topics.api.paths import encode_segment

IDS = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1)


@given(IDS)
def test_an_encoded_id_is_one_segment_that_decodes_to_the_id(value: str) -> None:
    segment = encode_segment(value)
    assert "/" not in segment and segment not in (".", "..")
    assert SegmentConvertor().convert(segment) == value


@given(IDS)
def test_a_client_sends_the_encoded_segment_unchanged(value: str) -> None:
    path = f"/v1/memories/{encode_segment(value)}"
    assert httpx.URL(f"http://memproj{path}?purpose=x").raw_path == f"{path}?purpose=x".encode()


def test_the_dot_ids_are_encoded() -> None:
    assert encode_segment(".") == "%2E"
    assert encode_segment("..") == "%2E%2E"
    assert encode_segment("m/../x%2F:y ü") == "m%2F..%2Fx%252F%3Ay%20%C3%BC"
