"""Datasets with stable sample ids, the manifest, and the prepared store."""

from unlearning.data.registry import DATASETS, DataError, Dataset, DatasetMissing, load_dataset
from unlearning.data.sources import apply_preprocessing, load_image_folder, load_table
from unlearning.data.store import (
    MANIFEST_SCHEMA, STATE_MANIFEST_SCHEMA, Prepared, initial_state_manifest, load_prepared, manifest_of,
    read_state_manifest, write_prepared,
)

__all__ = ["DATASETS", "DataError", "Dataset", "DatasetMissing", "load_dataset", "apply_preprocessing", "load_image_folder",
           "load_table", "MANIFEST_SCHEMA", "STATE_MANIFEST_SCHEMA",
           "Prepared", "initial_state_manifest", "load_prepared", "manifest_of", "read_state_manifest",
           "write_prepared"]
