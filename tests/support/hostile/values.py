"""Hostile values: strategies of certainly wrong values per field kind, and the literals
(numbers, depths, garbage) the families draw from.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from support.hostile.contract import Kind

# What orjson writes: 64-bit integers (the larger ones are made as raw JSON text).
INTS = st.integers(-(2**63), 2**64 - 1)
SMALL_LISTS = st.lists(st.integers(-3, 3), min_size=1, max_size=3)
SMALL_DICTS = st.dictionaries(
    st.sampled_from(["a", "b", "type", "id"]), st.integers(0, 3), max_size=2
)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=32)
STRINGS = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=8)
_not_str = st.one_of(INTS, _floats, st.booleans(), SMALL_LISTS, SMALL_DICTS)
_not_int = st.one_of(
    STRINGS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    SMALL_LISTS,
    SMALL_DICTS,
)
_not_container = st.one_of(STRINGS, INTS, _floats, st.booleans())
_timestamps_wrong = st.one_of(
    st.sampled_from(
        [
            "yesterday",
            "2026-08-08T09:30:00",  # no zone
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-08-08T25:00:00Z",
            "",
            "09:30:00Z",
            "2026-08-08T09:30:00+25:00",
        ]
    ),
    st.booleans(),
    SMALL_LISTS,
    SMALL_DICTS,
)


# Neither a string nor a list of objects: what no content field (a message's, a tool
# result's) accepts.
_not_content = (
    INTS,
    st.booleans(),
    st.none(),
    SMALL_DICTS,
    st.lists(INTS, min_size=1, max_size=3),
)


def _long(minimum: int) -> st.SearchStrategy[str]:
    return st.integers(minimum, minimum + 2000).map(lambda n: "x" * n)


def wrong_values(kind: Kind) -> st.SearchStrategy[Any]:
    """Values that no field of ``kind`` accepts."""
    null = st.none()
    match kind:
        case Kind.ID:
            return st.one_of(_not_str, null, st.just(""), _long(129))
        case Kind.ID_OPT:
            return st.one_of(_not_str, st.just(""), _long(129))
        case Kind.REF:
            return st.one_of(_not_str, null, st.just(""), _long(513))
        case Kind.TEXT:
            return st.one_of(_not_str, null, st.just(""), _long(4097))
        case Kind.TEXT_OPT:
            return st.one_of(_not_str, st.just(""), _long(4097))
        case Kind.STR:
            return st.one_of(_not_str, null)
        case Kind.STR1:
            return st.one_of(_not_str, null, st.just(""))
        case Kind.STR512_OPT:
            return st.one_of(_not_str, _long(513))
        case Kind.INT1:
            return st.one_of(_not_int, null, st.integers(-(2**63), 0))
        case Kind.INT1_OPT:
            return st.one_of(_not_int, st.integers(-(2**63), 0))
        case Kind.STORED_INT:
            return st.one_of(
                _not_int, null, st.integers(-(2**63), 0), st.integers(2**31, 2**63 - 1)
            )
        case Kind.VERSION:
            return st.one_of(_not_int, null, INTS.filter(lambda v: v not in (1, 2)))
        case Kind.TS:
            return st.one_of(_timestamps_wrong, null)
        case Kind.TS_OPT:
            return _timestamps_wrong
        case Kind.OBJ | Kind.DICT:
            return st.one_of(_not_container, null, SMALL_LISTS)
        case Kind.IDS:
            return st.one_of(
                STRINGS, INTS, SMALL_DICTS, SMALL_LISTS, st.just([""]), st.just([None])
            )
        case Kind.IDS1:
            return st.one_of(STRINGS, INTS, null, SMALL_DICTS, SMALL_LISTS, st.just([]))
        case Kind.ENUM:
            return st.one_of(
                st.sampled_from(["bogus", "", "USER", "Agent ", "system"]),
                INTS,
                null,
                SMALL_LISTS,
            )
        case Kind.EVENT_TYPE:
            return st.one_of(
                st.sampled_from(
                    [
                        "memory.deleted",
                        "Memory.Proposed",
                        "memory.proposed ",
                        "",
                        "conversation.ended",
                        "deletion.acknowledged.v2",
                    ]
                ),
                INTS,
                null,
                SMALL_LISTS,
                SMALL_DICTS,
            )
        case Kind.BLOCK_TYPE:
            return st.one_of(
                st.sampled_from(["image", "TEXT", "", "tool_use", "tool_result"]),
                INTS,
                null,
            )
        case Kind.BOOL:
            return st.one_of(st.sampled_from(["true", "false", "yes"]), INTS, SMALL_LISTS, null)
        case Kind.CONTENT:
            return st.one_of(
                *_not_content,
                st.sampled_from(
                    [
                        [{}],
                        [{"type": "image"}],
                        [{"type": "text"}],
                        [{"type": "text", "text": 5}],
                        [["text"]],
                    ]
                ),
            )
        case Kind.BLOCK:
            return st.one_of(
                STRINGS,
                INTS,
                null,
                SMALL_LISTS,
                st.sampled_from([{}, {"type": "image"}, {"text": "no type"}]),
            )
        case Kind.TOOL_CONTENT:
            return st.one_of(*_not_content)
    raise AssertionError(kind)


DEPTHS = st.one_of(
    st.sampled_from(
        [
            10,
            30,
            58,
            59,
            60,
            61,
            62,
            63,
            64,
            65,
            100,
            200,
            254,
            255,
            300,
            1000,
            1023,
            1024,
            1025,
            5000,
            10_000,
        ]
    ),
    st.integers(10, 10_000),
)


NOT_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"nan", b"+1", b"01", b"1.", b".5", b"0x10"]
HUGE = [b"1e400", b"-1e400", b"1E+999", b"-4e9999"]
BIG_INTS = [str(v).encode() for v in (2**63, 2**64, 2**70, -(2**70), 10**30)]


GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"[]",
            b"{}",
            b"0",
            b'"x"',
            b"true",
            b"null",
            b"{bad",
            b"[1,2",
            b"NaN",
            b'{"a":1}{"b":2}',
            b"\xff\xfe\xfd",
        ]
    ),
)
