"""Every derived store memproj keeps, one object each (``base.DerivedStore``), in one registry.

The store workers, the ledger's required stores, the verification probe, the ghost audit, the
metrics, the Prometheus configs, the alerts' SLOs and docker-compose come from ``REGISTRY`` or
are tested against it. Adding a store: its module here, its line below, its service in
docker-compose.yml.
"""

from __future__ import annotations

from projections.stores.base import DerivedStore, Erased, StoreResources
from projections.stores.cache import CacheStore
from projections.stores.embeddings import EmbeddingsStore
from projections.stores.tables import ContextStore, SummariesStore
from topics.deletion import TargetType

REGISTRY: tuple[type[DerivedStore], ...] = (
    EmbeddingsStore,
    SummariesStore,
    CacheStore,
    ContextStore,
)
BY_NAME: dict[str, type[DerivedStore]] = {store.name: store for store in REGISTRY}
STORE_NAMES: tuple[str, ...] = tuple(BY_NAME)


def required_stores(target: TargetType) -> tuple[str, ...]:
    """The stores that must acknowledge a deletion of ``target``: those that hold copies."""
    return tuple(store.name for store in REGISTRY if target in store.covers)


def open_all(resources: StoreResources) -> list[DerivedStore]:
    return [store.open(resources) for store in REGISTRY]


__all__ = [
    "BY_NAME",
    "REGISTRY",
    "STORE_NAMES",
    "DerivedStore",
    "Erased",
    "StoreResources",
    "open_all",
    "required_stores",
]
