"""The erasure's stores, a registry like the unlearning methods' (docs/erasure.md "Adding a store").

Importing this package registers every store in `STORES`, in the order `erase` purges them and
`verify_erasure` checks them: the erasure's record first, then the data, the requests, the models, MLflow,
and the DVC cache last (it re-commits the outputs the others rewrote). A new store's module is imported
before `dvc` below.
"""

from __future__ import annotations

from tasks.stores import data, requests, models, tracking  # noqa: F401, I001  (imported to register the stores)
from tasks.stores import shards  # noqa: F401, I001  (a sharded original's slice checkpoints)
from tasks.stores import traces  # noqa: F401, I001  (every written file searched for an erased id's traces)
from tasks.stores import dvc  # noqa: F401, I001  (last: it commits what the stores above rewrote)
from tasks.stores.base import STORES, Scope, Store, get_store, register_store

__all__ = ["STORES", "Scope", "Store", "get_store", "register_store"]
