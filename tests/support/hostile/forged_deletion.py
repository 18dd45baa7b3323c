"""Forgeries on the deletion topics memproj writes: ``deletion.acks`` and
``deletion.tombstones``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
from hypothesis import strategies as st

from projections.stores import STORES
from streams.sample import iso
from support.hostile.json_surgery import nested, raw_at
from support.hostile.making import Maker, Round, planned_event, wrong_and_missing
from support.hostile.plan import CLOCK, EDGE_TENANT, FORGED_TENANT, Expect, Planned
from support.hostile.values import (
    DEPTHS,
    GARBAGE,
    INTS,
    SMALL_DICTS,
    SMALL_LISTS,
)
from topics.deletion import Acknowledgement
from topics.registry import TopicSpec


def acknowledgement(maker: Maker, tenant: str) -> dict[str, Any]:
    return {
        "event_type": "deletion.acknowledged",
        "deletion_id": maker.fresh("h_ackdel_"),
        "tenant_id": tenant,
        "store": "embeddings",
        "status": "done",
        "removed_count": 0,
        "acked_at": iso(CLOCK),
        "error": None,
        "attempt": 1,
    }


def ack_key(ack: dict[str, Any]) -> bytes:
    return f"{ack['tenant_id']}:{ack['deletion_id']}".encode()


def _ack_event_id(ack: dict[str, Any]) -> str | None:
    try:
        return Acknowledgement.model_validate(ack).event_id
    except ValueError:
        return None


def planned_ack(
    spec: TopicSpec, ack: dict[str, Any], expect: Expect, kind: str, value: bytes | None = None
) -> Planned:
    """A message of ``ack`` (or of the raw ``value`` it was turned into), with the ids memproj
    reads from it, to find it among what the ledger decided."""
    return Planned(
        spec,
        ack_key(ack),
        orjson.dumps(ack) if value is None else value,
        expect,
        kind,
        event_id=_ack_event_id(ack),
        tenant_id=ack["tenant_id"],
        projection="deletion",
    )


_ACK_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "deletion_id": st.one_of(INTS, st.none(), SMALL_LISTS, SMALL_DICTS),
    "tenant_id": st.one_of(INTS, st.none(), SMALL_LISTS),
    "store": st.one_of(st.sampled_from(["bogus", "EMBEDDINGS", ""]), INTS, st.none()),
    "status": st.one_of(st.sampled_from(["maybe", "DONE", ""]), INTS, st.none()),
    "removed_count": st.one_of(
        st.sampled_from(["abc", -1, 2**31, 2**40, 1.5]), st.none(), SMALL_LISTS
    ),
    "acked_at": st.one_of(
        st.sampled_from(["yesterday", "", "2026-13-01T00:00:00Z"]),
        st.none(),
        SMALL_LISTS,
        SMALL_DICTS,
    ),
    "error": st.one_of(INTS, SMALL_LISTS, SMALL_DICTS),
    "attempt": st.one_of(st.sampled_from(["abc", 1.5]), st.none(), SMALL_LISTS),
}


def forged_acks(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _ACK_WRONG.items():
        ack = {**acknowledgement(r.maker, "tenant_0"), name: r.draw(wrong)}
        key = b"tenant_0:" + str(ack["deletion_id"]).encode()
        r.add(Planned(spec, key, orjson.dumps(ack), Expect.DEAD, f"ack_wrong_type:{name}"))
        missing = acknowledgement(r.maker, "tenant_0")
        if name != "error" and name != "attempt":
            del missing[name]
            r.add(
                Planned(
                    spec,
                    b"tenant_0:" + str(missing.get("deletion_id")).encode(),
                    orjson.dumps(missing),
                    Expect.DEAD,
                    f"ack_missing:{name}",
                )
            )
    ack = acknowledgement(r.maker, "tenant_0")
    r.add(Planned(spec, b"tenant_0:other", orjson.dumps(ack), Expect.DEAD, "ack_key_mismatch"))
    r.add(Planned(spec, None, orjson.dumps(ack), Expect.DEAD, "ack_no_key"))
    r.add(Planned(spec, ack_key(ack), r.draw(GARBAGE), Expect.DEAD, "ack_garbage"))
    r.add(Planned(spec, ack_key(ack), None, Expect.DEAD, "ack_null"))
    headless = {k: v for k, v in acknowledgement(r.maker, "tenant_0").items() if k != "event_type"}
    r.add(Planned(spec, ack_key(headless), orjson.dumps(headless), Expect.DEAD, "ack_untyped"))
    nest = r.draw(DEPTHS)
    ack = acknowledgement(r.maker, EDGE_TENANT)
    text = raw_at(ack, ("extra",), nested(nest, r.draw(st.booleans())))
    # The acknowledgement model has no nesting limit of its own: an ignored deep field is
    # the codec's business (applied, or refused as too deep; never a crash).
    r.add(planned_ack(spec, ack, Expect.EITHER, f"ack_nesting:{nest}", text))
    ack = acknowledgement(r.maker, EDGE_TENANT)
    r.add(planned_ack(spec, ack, Expect.EITHER, "ack_unknown_deletion"))
    # A deletion request on the acknowledgements' topic is not an acknowledgement.
    event = r.maker.template("deletion.requested", EDGE_TENANT)
    r.add(planned_event(spec, event, Expect.DEAD, "foreign_type:deletion.requested"))


def tombstone(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    deletion_id = maker.fresh("h_tomb_")
    return {
        "event_type": "deletion.tombstone",
        "deletion_id": deletion_id,
        "tenant_id": tenant,
        "kind": "erasure",
        "target": {"type": "memory", "id": "nobody"},
        "items": [{"type": "memory", "id": "nobody"}],
        "issued_at": iso(CLOCK),
        "cut_off": iso(CLOCK),
        "deadline_at": iso(CLOCK + timedelta(days=1)),
        "required_stores": list(STORES.names),
    }


_TOMBSTONE_REQUIRED = [
    "deletion_id",
    "tenant_id",
    "kind",
    "target",
    "items",
    "issued_at",
    "cut_off",
    "deadline_at",
    "required_stores",
]

_TOMBSTONE_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "event_type": st.one_of(st.sampled_from(["deletion.erased", ""]), INTS),
    "deletion_id": st.one_of(INTS, st.none(), SMALL_LISTS),
    "tenant_id": st.one_of(INTS, st.none(), SMALL_DICTS),
    "kind": st.one_of(st.sampled_from(["purge", ""]), st.none(), INTS),
    "target": st.one_of(
        st.sampled_from(
            ["x", {"type": "bogus", "id": "a"}, {"type": "memory"}, {"type": "subject", "id": "a"}]
        ),
        st.none(),
    ),
    "items": st.one_of(
        st.sampled_from(
            ["x", [5], [{"type": "bogus", "id": "a"}], [{}], [{"type": "memory", "id": 5}]]
        ),
        st.none(),
    ),
    "issued_at": st.one_of(st.sampled_from(["yesterday", ""]), st.none(), SMALL_LISTS),
    "cut_off": st.one_of(st.sampled_from(["yesterday"]), st.none(), SMALL_DICTS),
    "deadline_at": st.one_of(st.sampled_from(["2026-13-01T00:00:00Z"]), st.none()),
    "required_stores": st.one_of(st.sampled_from(["embeddings", ["bogus"], [5], {}]), st.none()),
    "for_stores": st.one_of(st.sampled_from(["cache", ["bogus"], 5]), SMALL_DICTS),
}


def forged_tombstones(r: Round, spec: TopicSpec) -> None:
    forged, key = wrong_and_missing(
        r,
        spec,
        lambda: tombstone(r.maker),
        "deletion_id",
        _TOMBSTONE_WRONG,
        _TOMBSTONE_REQUIRED,
        "tombstone",
    )
    r.add(Planned(spec, key + b"x", orjson.dumps(forged), Expect.DEAD, "tombstone_key_mismatch"))
    r.add(Planned(spec, key, r.draw(GARBAGE), Expect.DEAD, "tombstone_garbage"))
    r.add(Planned(spec, key, None, Expect.DEAD, "tombstone_null"))
    nest = r.draw(st.integers(300, 10_000))
    deep = raw_at(forged, ("items", 0, "id"), nested(nest, False))
    r.add(Planned(spec, key, deep, Expect.DEAD, f"tombstone_nesting:{nest}"))
    # Well-formed, for a deletion nobody asked for, of things nobody has: erased (nothing),
    # acknowledged, and refused by the ledger; or for no store at all.
    forged = tombstone(r.maker)
    forged["required_stores"] = r.draw(st.sampled_from([list(STORES.names), [], ["cache"]]))
    key = f"{FORGED_TENANT}:{forged['deletion_id']}".encode()
    r.add(Planned(spec, key, orjson.dumps(forged), Expect.EITHER, "tombstone_unknown"))
