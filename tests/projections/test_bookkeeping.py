"""The binary COPY dumpers, with no services: byte for byte what psycopg's own would send."""

from __future__ import annotations

import pytest
from psycopg import postgres
from psycopg.adapt import Transformer
from psycopg.pq import Format

from projections.bookkeeping import _JsonbTextDumper, _TextArrayDumper


def _psycopg_dumps(oid: int, value: object) -> bytes:
    transformer = Transformer()
    transformer.set_dumper_types([oid], Format.BINARY)
    (dumped,) = transformer.dump_sequence([value], [])  # formats come from the types set
    assert dumped is not None
    return bytes(dumped)


@pytest.mark.parametrize(
    "items", [[], ["e1"], ["e1", "e2", "e3"], ["évidence", "", 'with,comma "quoted"'], ["a", None]]
)
def test_text_arrays_are_dumped_as_psycopg_dumps_them(items: list[str | None]) -> None:
    ours = _TextArrayDumper(list).dump(items)
    assert ours == _psycopg_dumps(postgres.types["text"].array_oid, items)


def test_jsonb_takes_the_serialised_text_as_it_is() -> None:
    assert _JsonbTextDumper(str).dump('{"a":[1,"é"]}') == b'\x01{"a":[1,"\xc3\xa9"]}'
