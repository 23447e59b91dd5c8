"""The erasure's stores, a registry like the unlearning methods' (docs/erasure.md "Adding a store").

Importing this package registers every store and puts `STORES` in the order `ORDER` declares: the order `erase`
purges them and `verify_erasure` checks them. The erasure's record first, then the data, the requests, the
models, MLflow, and the DVC cache last (it re-commits the outputs the others rewrote). A new store's module is
imported below and its name added to `ORDER` (an unlisted store is an error at import).
"""

from __future__ import annotations

from tasks.stores import data, dvc, memorization, models, requests, shards, tracking, traces  # noqa: F401  (imported to register the stores)
from tasks.stores.base import STORES, Scope, Store, StoreBase, get_store, in_declared_order, register_store

ORDER: tuple[str, ...] = (
    "erasure reports", "tombstones", "prepared store", "state manifest", "source table", "source image folder",
    "request files", "Great Expectations results",
    "ensemble cache", "models",
    "memorization map",  # per-row scores under hashed ids (licensed inaction's map)
    "MLflow registry", "MLflow artifacts",
    "shard checkpoints",  # a sharded original's slice checkpoints
    "id traces",  # every written file searched for an erased id's plain text or unsalted hashes
    "DVC cache",  # last: it commits what the stores above rewrote
)
STORES[:] = in_declared_order(STORES, ORDER)

__all__ = ["ORDER", "STORES", "Scope", "Store", "StoreBase", "get_store", "register_store"]
