"""What a deletion batch reads of the params, built once per batch (docs/design.md §2, a stage's signature says
what it reads): `BatchSettings.of(params)` is the one place the batch's path reads the whole params; each stage of
tasks/batch_path.py, tasks/stages.py, tasks/licensing.py and tasks/licensed_batch.py takes this record, or the one
slice or record it needs from it (`probe_inputs`, `step_inputs`, `reference_training`, `map_settings`,
`diagnostics_settings`, `ids`, `paths`), so a signature says what it reads.

Left out, as no batch stage reads them: report, qualify (the qualification flow's) and quality (the flow reads
it: tasks/quality.py). prepare, operations and the tracking URI are read only by the erasure and its stores, through
`erasing` (tasks/stores/base.py ErasureSettings); the flow opens the batch's tracker and hands it to `open_batch`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from tasks.id_key import IdKey
from tasks.stores.base import ErasureSettings
from unlearning.config import (
    EXACT_RETRAIN, Deletion, Diagnostics, Erasure, Gate, Licensing, Params, ProjectPaths, Tracking, Train, Validation,
)


@dataclass(frozen=True)
class DiagnosticsSettings:
    """What decides whether a batch computes the leverage diagnostics: diagnostics, validation (its mode),
    deletion.partition.mode and the project's paths (the stored qualification)."""

    diagnostics: Diagnostics
    validation: Validation
    partition_mode: str
    paths: ProjectPaths


@dataclass(frozen=True)
class BatchSettings:
    """The params sections a batch's stages read, and the records made of them once per batch (cached on first
    use: a batch that never probes never builds the probe's). Frozen: a batch that changes course (the exact
    retrain after a failed licence audit) goes on with a new record (`exact`)."""

    deletion: Deletion  # the objective, the rules and methods, the partition, the debt, hashed ids
    validation: Validation  # the references' sizes and looks, the mode, the audit
    gate: Gate
    train: Train  # the recipe and the model (references, diagnostics, the batch's params logged)
    diagnostics: Diagnostics
    licensing: Licensing  # licensed inaction: the map, the cuts, the audits
    seed: int  # base.seed: every seed stream (unlearning/seeds.py)
    progress: bool  # base.progress
    erasing: ErasureSettings  # what the batch's erasure reads (the paths, erasure, the registry, the tracking URI)

    # Builds the batch's record from the whole params, its one job (flows/deletion_batch.py, `unlearn plan`).
    @classmethod
    def of(cls, params: Params) -> "BatchSettings":
        return cls(params.deletion, params.validation, params.gate, params.train, params.diagnostics,
                   params.licensing, params.base.seed, params.base.progress, ErasureSettings.of(params))

    def exact(self) -> "BatchSettings":
        """The record a batch goes on with after a failed licence audit: the exact retrain, named (no diagnostics,
        no certificate of an approximate candidate)."""
        return replace(self, deletion=self.deletion.model_copy(update={"method": EXACT_RETRAIN}))

    @property
    def paths(self) -> ProjectPaths:
        """base.paths and the project's root (the erasure's record holds them)."""
        return self.erasing.paths

    @property
    def tracking(self) -> Tracking:
        """The registered model and its alias (the promotion's)."""
        return self.erasing.tracking

    @property
    def erasure(self) -> Erasure:
        """Whether the batch erases its rows, and how (the section `erase_batch` reads)."""
        return self.erasing.erasure

    @cached_property
    def tracking_store(self) -> str:
        """Where the registry lives, as state/champion.json records it (adapters/store_check.py)."""
        from adapters.store_check import store_identity

        return store_identity(self.erasing.tracking_uri, self.paths.root)

    @cached_property
    def ids(self) -> IdKey:
        """How the batch keys sample ids (deletion.hash_sample_ids and the project's key), as its erasure does."""
        return self.erasing.key

    @cached_property
    def probe_inputs(self):
        """tasks/planning.py ProbeInputs: what the timing probe reads."""
        from tasks.planning import ProbeInputs

        return ProbeInputs(self.train, self.validation, self.deletion.method_args, self.seed, self.paths)

    @cached_property
    def reference_training(self):
        """tasks/references.py ReferenceTraining: how the batch's references and exact retrain train."""
        from tasks.references import ReferenceTraining
        from unlearning.models.training import recipe_from

        return ReferenceTraining(self.train.model, recipe_from(self.train), self.validation, self.seed, self.progress,
                                 self.paths, self.ids)

    @cached_property
    def step_inputs(self):
        """tasks/certify.py StepInputs: what running and certifying a step reads."""
        from tasks.certify import StepInputs

        return StepInputs(self.reference_training, self.gate, self.deletion.method_args)

    @cached_property
    def map_settings(self):
        """tasks/memorization_map.py MapSettings: what the memorization map reads."""
        from tasks.memorization_map import MapSettings

        return MapSettings(self.licensing, self.gate, self.validation, self.train, self.seed, self.progress,
                           self.paths, self.ids)

    @cached_property
    def diagnostics_settings(self) -> DiagnosticsSettings:
        return DiagnosticsSettings(self.diagnostics, self.validation, self.deletion.partition.mode, self.paths)
