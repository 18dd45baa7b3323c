"""Every derived store memproj keeps, one object each (``base.DerivedStore``), in one registry.

The store workers, the ledger's required stores, the verification probe, the ghost audit, the
metrics, the alerts' SLOs and the deployment files (``memproj deploy``) come from ``STORES``.
Adding a store: its module here and its line below (docs/howto-derived-store.md). A test, or
another composition, adds one with ``STORES.with_store(...)`` without editing this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import get_args

from projections.stores.base import DerivedStore, Erased, StoreResources
from projections.stores.cache import CacheStore
from projections.stores.embeddings import EmbeddingsStore
from projections.stores.tables import ContextStore, SummariesStore
from topics.deletion import StoreName, TargetType


@dataclass(frozen=True, slots=True)
class StoreRegistry:
    """The derived stores, in the order their workers, acknowledgements and reports list
    them. Names and metrics ports are each a store's own."""

    stores: tuple[type[DerivedStore], ...]

    def __post_init__(self) -> None:
        for fact in ("name", "metrics_port"):
            values = [getattr(store, fact) for store in self.stores]
            shared = sorted({str(v) for v in values if values.count(v) > 1})
            if shared:
                raise ValueError(f"derived stores share a {fact}: {', '.join(shared)}")

    def __iter__(self) -> Iterator[type[DerivedStore]]:
        return iter(self.stores)

    def __getitem__(self, name: str) -> type[DerivedStore]:
        for store in self.stores:
            if store.name == name:
                return store
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(store.name for store in self.stores)

    def with_store(self, store: type[DerivedStore]) -> StoreRegistry:
        """These stores and ``store``, last."""
        return StoreRegistry((*self.stores, store))

    def required(self, target: TargetType) -> tuple[str, ...]:
        """The stores that must acknowledge a deletion of ``target``: those that hold
        copies."""
        return tuple(store.name for store in self.stores if target in store.covers)

    @property
    def requirements(self) -> dict[TargetType, tuple[StoreName, ...]]:
        """``required`` of every target: the plain data the deletion ledger plans with."""
        return {target: self.required(target) for target in get_args(TargetType)}

    def open_all(self, resources: StoreResources) -> list[DerivedStore]:
        return [store.open(resources) for store in self.stores]


STORES = StoreRegistry((EmbeddingsStore, SummariesStore, CacheStore, ContextStore))

__all__ = [
    "STORES",
    "DerivedStore",
    "Erased",
    "StoreRegistry",
    "StoreResources",
]
