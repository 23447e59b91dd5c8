"""Datasets with stable sample ids, the manifest, and the prepared store."""

from unlearning.data.registry import DATASETS, Dataset, DatasetMissing, load_dataset
from unlearning.data.store import (
    MANIFEST_SCHEMA, STATE_MANIFEST_SCHEMA, Prepared, initial_state_manifest, load_prepared, manifest_of,
    read_state_manifest, write_prepared,
)

__all__ = ["DATASETS", "Dataset", "DatasetMissing", "load_dataset", "MANIFEST_SCHEMA", "STATE_MANIFEST_SCHEMA",
           "Prepared", "initial_state_manifest", "load_prepared", "manifest_of", "read_state_manifest",
           "write_prepared"]
