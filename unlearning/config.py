"""params.yaml as validated pydantic models: the one place for every default and threshold.

Every model forbids unknown keys. `load_params` turns pydantic's errors into one `ConfigError` that
names the key path, the bad value and the allowed values or keys.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from unlearning.certificate.resolution import can_reject, permutations_needed
from unlearning.policy.rules import Rule

PARAMS_FILE = "params.yaml"


# --- what each method is, for the code that plans, certifies and accounts for it ---------------------------------
@dataclass(frozen=True)
class MethodTraits:
    """What the pipeline needs to know of a method besides its code (unlearning/methods/registry.py MethodSpec
    hands them out as `spec.traits`). They live here, torch-free, because `unlearn status` and the retraining debt
    read them without importing the methods (which import torch)."""

    exact: bool = False  # its result IS a retrain on the retain rows: certified by construction, clears the debt
    needs_sharded_original: bool = False  # it unlearns a sharded original only (train.sharding)
    fallback: bool = False  # the exact method every candidate list ends with, whatever the rules say


METHOD_TRAITS: dict[str, MethodTraits] = {
    "retrain": MethodTraits(exact=True, fallback=True),  # unlearning/methods/retrain.py
    "sisa": MethodTraits(exact=True, needs_sharded_original=True),  # unlearning/methods/sisa.py
}
PLAIN = MethodTraits()  # every other method: approximate, any original


def method_traits(name: str) -> MethodTraits:
    """The traits of method `name` (an approximate method on any original unless declared above)."""
    return METHOD_TRAITS.get(name, PLAIN)


EXACT_RETRAIN = next(name for name, t in METHOD_TRAITS.items() if t.fallback)  # the last candidate of every batch
SHARDED_EXACT = next(name for name, t in METHOD_TRAITS.items() if t.needs_sharded_original)  # a sharded original's
# what a licence (docs/design.md §4.9, `licensing:`) promotes: the model unchanged, recorded as this method in the ledger,
# the history and the debt (it is approximate: it counts against the retraining debt)
LICENSED_INACTION = "do_nothing"


class CertificateKind(StrEnum):
    """How a candidate is certified (unlearning/planning/plan.py Step; docs/design.md §4.6)."""

    EXACT = "exact"  # exact by construction: checked against the original's accuracy, no references
    AUDIT = "audit"  # the exact retrain judged against oracles too (validation.audit_retrain)
    ABSOLUTE = "absolute"  # suppression: absolute bounds and the original's accuracy, no references
    SEQUENTIAL = "sequential"  # references in looks, rejected at the first decisive look (unlearning/sequential.py)
    QUALIFIED = "qualified"  # validation.mode qualified: the cheap checks of a licensed method, no references


def sharded_original_problem(method: str, sharded: bool, key: str = "deletion.method",
                             found: str = "this one is one model") -> str | None:
    """Why `method` cannot unlearn this original (None: it can): a method that needs a sharded original, asked
    of one model (`found`: what says so). The one rule, read by the params' validation (train.sharding off), the
    planner (the champion is one model) and the method itself (unlearning/sharding.py)."""
    if sharded or not method_traits(method).needs_sharded_original:
        return None
    return (f"{key} = {method!r} needs a sharded original, and {found}: set train.sharding.shards "
            f"(e.g. 10; docs/sharding.md) and run the train stage again (`dvc repro train`), or set "
            f"deletion.method: auto")


# docs/design.md §4.5's example list as calibrated by bench/calibration.py (params.yaml declares the same; it may declare
# its own). Dropped after the calibration bench: `high_leakage -> newton_ggn` (the raw leakage ratio fires on
# vanishing norms, and newton_ggn was farther from the oracles than do_nothing there) and `privacy_default ->
# finetune` (failed the calibrated gate on the bench's sets at a cost above a retrain, which the gate's oracles
# already are: promoting one costs nothing more).
DEFAULT_RULES: list[dict] = [
    # a sharded original (train.sharding): exact unlearning for the share of the shards the rows sit in
    {"name": "sharded_original", "method": "sisa", "when": {"sharded": True}},
    {"name": "gap_below_noise_floor", "method": "do_nothing",
     "when": {"objective": "retrain_equivalence", "predicted_gap_to_noise_lt": 0.5}},
    # retrain_equivalence only: a retrain keeps what the forget set shares with the rest, so it cannot suppress
    {"name": "retrain_within_budget", "method": "retrain",
     "when": {"objective": "retrain_equivalence", "retrain_cost_lt_budget": True}},
    {"name": "oracles_are_retrains", "method": "retrain", "when": {"objective": "retrain_equivalence"}},
    {"name": "suppression_with_adjacency", "method": "al_wpgd",
     "when": {"objective": "suppression", "adjacent_fraction_gt": 0.0}},
    {"name": "suppression", "method": "descent_ascent", "when": {"objective": "suppression"}},
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Paths(Strict):
    """Project-relative paths (resolved against the folder that holds params.yaml)."""

    prepared_dir: str = "data/prepared"
    models_dir: str = "models"
    state_dir: str = "state"
    inbox: str = "requests/inbox"
    cache_dir: str = "cache"
    reports_dir: str = "reports"
    metrics_dir: str = "metrics"  # DVC metrics and plot data (train.json, deletion.json, history.json)
    mlflow_db: str = "mlflow.db"
    mlflow_artifacts: str = "mlartifacts"
    archive_dir: str = "archive"  # `unlearn reset` moves the state and the cache here (archive/<UTC time>/)
    processed: str = "requests/processed"  # applied (or already applied) request files move here
    rejected: str = "requests/rejected"    # files rejected by validation or the gate, with <name>.error.json
    held: str = "requests/held"  # batches no candidate passed: held for `unlearn approve`, with <name>.held.json
    tombstones: str = "data/tombstones.txt"  # erased ids (hashed with deletion.hash_sample_ids), outside every DVC out
    gx_dir: str = "gx"  # the Great Expectations project (suite committed; uncommitted/ holds results, Data Docs)
    # the secret id key of hashed ids (unlearning/privacy/salt.py): mode 0600, git-ignored, never in the state, DVC or MLflow
    # (UNLEARNING_ID_KEY instead of the file: docs/erasure.md, "The key")
    salt: str = ".unlearning/salt"


class Base(Strict):
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    progress: bool = True
    paths: Paths = Paths()


# The placeholder path of the data section not in use: a folder kept in git (data/raw/.gitkeep), because
# dvc.yaml lists both sections' paths as dependencies of prepare and DVC 3.67 fails on a null or missing one.
UNUSED_PATH = "data/raw"


class TableSource(Strict):
    """prepare.dataset: table -- the CSV/Parquet file and its columns."""

    path: str = Field(UNUSED_PATH, description="the .csv/.parquet file, relative to the params folder; a DVC "
                                               "dependency of prepare")
    id_column: str | None = Field(None, description="unique, non-empty sample ids (read as text)")
    label_column: str | None = Field(None, description="the class of each row (any dtype; classes = sorted unique)")
    group_column: str | None = Field(None, description="super-class/attribute of each row; null = the class")
    group_as_feature: bool = Field(False, description="true: the group column is also a model input; false: it only "
                                                      "groups rows (partition, super-class targets)")
    feature_columns: list[str] | None = Field(None, description="null = every other column")
    split_column: str | None = Field(None, description="values exactly train/val; null = stratified val_fraction")
    missing: Literal["error", "drop"] = Field("error", description="rows with missing values: stop, or drop them")
    missing_markers: list[str] = Field(["?", "NA", "N/A"], description="cells of a text feature column that mean "
                                       "'no value' (besides an empty or spaces-only cell): missing, as prepare.table."
                                       "missing says; [] keeps them as categories (never in the id, label, group or "
                                       "split column)")

    @model_validator(mode="after")
    def _group_input_needs_a_group(self) -> "TableSource":
        if self.group_as_feature and self.group_column is None:
            raise ValueError("prepare.table.group_as_feature = true needs prepare.table.group_column (the column to "
                             "feed to the model); set group_column, or group_as_feature: false")
        return self


class ImageFolderSource(Strict):
    """prepare.dataset: image_folder -- <path>/<class>/<image> or <path>/train|val/<class>/<image>."""

    path: str = Field(UNUSED_PATH, description="the image folder, relative to the params folder; a DVC dependency "
                                               "of prepare")
    image_size: tuple[int, int] = Field((28, 28), description="[height, width] (or one int) after resizing")
    grayscale: bool = Field(True, description="true: 1 channel (L); false: 3 channels (RGB)")
    groups: dict[str, str] | None = Field(None, description="class folder -> group; null = group is the class")

    @field_validator("image_size", mode="before")
    @classmethod
    def _size(cls, v):
        v = (v, v) if isinstance(v, int) else v
        if isinstance(v, (list, tuple)) and any(isinstance(s, int) and s <= 0 for s in v):
            raise ValueError(f"sizes must be positive, got {list(v)}")
        return v

    @field_validator("groups", mode="before")
    @classmethod
    def _text_keys(cls, v):  # folder names like 0, 1 arrive from YAML as ints
        return {str(k): str(g) for k, g in v.items()} if isinstance(v, dict) else v


class Prepare(Strict):
    dataset: Literal["digits", "fashion_mnist", "table", "image_folder"] = "digits"
    table: TableSource = TableSource()
    image_folder: ImageFolderSource = ImageFolderSource()
    val_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share when the data has no split of its own")
    fashion_mnist_dir: str = "/usr/share/datasets/fashion-mnist"
    max_train: int | None = Field(None, gt=0, description="deterministic subsample of the training split")
    max_val: int | None = Field(None, gt=0)
    targets: Literal["fine", "super"] = Field("fine", description="super: train on the groups instead of the classes")

    @model_validator(mode="after")
    def _section_for_dataset(self) -> "Prepare":
        if self.dataset == "table":
            missing = [k for k in ("id_column", "label_column") if getattr(self.table, k) is None]
            if missing or self.table.path == UNUSED_PATH:
                raise ValueError("prepare.dataset = 'table' needs prepare.table.path (your .csv/.parquet file), "
                                 "prepare.table.id_column and prepare.table.label_column, e.g. table: {path: "
                                 "data/people.csv, id_column: id, label_column: label}"
                                 + (f"; missing: {['prepare.table.' + k for k in missing]}" if missing else ""))
        if self.dataset == "image_folder" and self.image_folder.path == UNUSED_PATH:
            raise ValueError("prepare.dataset = 'image_folder' needs prepare.image_folder.path: the folder holding "
                             "<class>/<image> (or train|val/<class>/<image>)")
        return self

    def section(self) -> TableSource | ImageFolderSource | None:
        """The data section of the dataset in use (None for the built-in datasets)."""
        return {"table": self.table, "image_folder": self.image_folder}.get(self.dataset)

    def source_path(self, root: Path) -> Path:
        """prepare.table.path or prepare.image_folder.path, resolved against the params folder."""
        p = Path(self.section().path)
        return p if p.is_absolute() else Path(root) / p


class ModelCfg(Strict):
    """The architecture. Every arch is a plain nn.Module mapping [B, *in_shape] -> [B, n_classes]; the
    ensemble adapter (unlearning/models/ensemble.py) vectorizes it over members."""

    arch: Literal["mlp", "cnn", "resnet", "custom"] = "mlp"
    hidden: list[int] = Field([32], description="mlp: hidden layer widths")
    channels: list[int] = Field([8, 16], description="cnn: channels per conv3x3 + maxpool stage")
    widths: list[int] = Field([16, 32, 64], description="resnet: width per stage (stride 2 after the first)")
    blocks: int = Field(1, gt=0, description="resnet: basic blocks per stage")
    factory: str | None = Field(None, description="custom: 'module.path:callable' (project folder or a package)")
    kwargs: dict[str, Any] = Field({}, description="custom: keyword arguments passed to the factory")
    feature_layer: str | None = Field(None, description="layer whose INPUT is the penultimate feature "
                                                        "(embedding partition); null = the last nn.Linear the "
                                                        "forward calls (the last registered if none is called)")

    @field_validator("hidden", "channels", "widths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h <= 0 for h in v):
            raise ValueError(f"layer sizes must be positive, got {v}")
        return v

    @model_validator(mode="after")
    def _factory_iff_custom(self) -> "ModelCfg":
        if self.arch == "custom" and not self.factory:
            raise ValueError("arch 'custom' needs train.model.factory: 'module.path:callable' (a function of "
                             "in_shape, n_classes and train.model.kwargs returning an nn.Module)")
        if self.arch != "custom" and (self.factory or self.kwargs):
            raise ValueError(f"train.model.factory / kwargs are for arch 'custom', but arch is {self.arch!r}; "
                             f"set arch: custom or remove them")
        if not self.widths:
            raise ValueError("train.model.widths must name at least one stage")
        return self



class Sharding(Strict):
    """train.sharding: SISA training of the original (unlearning/sharding.py, docs/sharding.md; Bourtoule et al.,
    IEEE S&P 2021): S constituents, one per shard, each trained in R slices with a checkpoint after each; the
    champion is their aggregate, and method `sisa` retrains only the shards a deletion touches."""

    shards: int | None = Field(None, ge=1, description="constituents S (null = off: one model on every row)")
    slices: int = Field(1, ge=1, description="slices R per shard (a checkpoint after each)")
    by: Literal["random", "group", "column"] = Field(
        "random", description="random (rows spread evenly) | group (the data's group column) | column (any "
                              "column of your table, e.g. a customer id): every value of the key in one shard")
    column: str | None = Field(None, description="by: column -- the table column whose values pick the shard")
    aggregate: Literal["mean_probs", "size_weighted", "vote"] = Field(
        "mean_probs", description="how the constituents predict together: mean_probs (the mean of their softmax) | "
                                  "size_weighted (that mean weighted by each shard's rows: for skewed shards) | vote")
    max_skew: float = Field(3.0, gt=1, description="warn (at `unlearn init --shard-by` and at train) when the largest "
                                                   "shard holds more than this multiple of the mean shard's rows")

    @model_validator(mode="after")
    def _column_iff_by_column(self) -> "Sharding":
        if self.by == "column" and not self.column:
            raise ValueError("train.sharding.by = 'column' needs train.sharding.column: the name of a column of your "
                             "table (e.g. customer_id)")
        if self.by != "column" and self.column:
            raise ValueError(f"train.sharding.column = {self.column!r} is for by: column, but by is {self.by!r}; set "
                             f"by: column or remove column")
        return self

    @property
    def on(self) -> bool:
        return self.shards is not None


class Train(Strict):
    """The training recipe of the original; oracles and shadows retrain with exactly this recipe."""

    model: ModelCfg = ModelCfg()
    epochs: int = Field(30, gt=0)
    batch_size: int = Field(64, gt=0)
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="adamw (decoupled decay) | sgd (momentum)")
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd only")
    schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = Field(5e-4, ge=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    init_checkpoint: str | None = Field(
        None, description="a state_dict of the module (torch.save(module.state_dict(), path)) used as the original "
                          "instead of training it; relative to the params folder")
    sharding: Sharding = Sharding()

    @model_validator(mode="after")
    def _sharding_trains(self) -> "Train":
        if self.sharding.on and self.init_checkpoint:
            raise ValueError(f"train.sharding.shards = {self.sharding.shards} trains the original in shards, but "
                             f"train.init_checkpoint = {self.init_checkpoint!r} loads one trained model; set "
                             f"train.sharding.shards: null or train.init_checkpoint: null")
        return self


class Partition(Strict):
    mode: Literal["group", "leverage", "embedding"] = "group"
    top_fraction: float = Field(0.2, gt=0, le=1, description="leverage mode: share of retain marked adjacent")
    k_neighbors: int = Field(10, gt=0, description="embedding mode: neighbours per forget sample")


class Debt(Strict):
    """Retraining debt: approximate deletions accumulate; past either bound the batch's candidate list
    is exact retrain alone (the oracles trained for validation are exact retrains, so it costs no extra training).
    Counted since the last exact retrain (or the original), from the ledger; null = that bound is off."""

    max_forgotten_fraction: float | None = Field(
        0.1, gt=0, le=1, description="samples forgotten approximately since the last exact retrain, including this "
                                     "batch, as a fraction of the original training set; above it: retrain")
    max_batches_since_retrain: int | None = Field(
        10, ge=0, description="batches applied approximately since the last exact retrain; a batch that would be "
                              "one more than this is retrained")


AUTO = "auto"  # deletion.method: walk the rules (`Deletion.walks_rules`)


class Deletion(Strict):
    objective: Literal["retrain_equivalence", "suppression"] = "retrain_equivalence"
    method: str = Field(AUTO, description="a registered method, or 'auto' to walk `rules`")
    rules: list[Rule] = Field(default_factory=lambda: [Rule(**r) for r in DEFAULT_RULES],
                              description="ordered selection rules (unlearning/policy/selection_policy.py)")
    fallback: list[str] = Field([], description="tried after the rule candidates (retrain is always last)")
    method_args: dict[str, dict[str, Any]] = {}
    budget_gradient_evals: int = Field(20_000, gt=0)
    weigh_cost: bool = Field(True, description="skip an approximate candidate whose certificate costs more than an "
                                               "exact retrain (it trains oracle retrains), for retrain; false = "
                                               "certify it anyway (unlearning/planning/plan.py)")
    hash_sample_ids: bool = Field(True, description="the ledger, the tombstones, kept request files and MLflow "
                                                    "artifacts name ids only by their HMAC-SHA256 under the project's "
                                                    "secret id key (base.paths.salt); false = plain ids everywhere")
    max_clock_skew_seconds: float = Field(300, ge=0, description="a requested_at later than now + this is rejected")
    partition: Partition = Partition()
    debt: Debt = Debt()

    @property
    def walks_rules(self) -> bool:
        """deletion.method is 'auto': the ordered rules pick the candidates (else the one method named)."""
        return self.method == AUTO



class Diagnostics(Strict):
    """Leverage diagnostics (docs/design.md §4.1) computed for every batch before unlearning."""

    enabled: bool = True
    record: bool = Field(False, description="compute them for every batch's record, also when no candidate the plan "
                                            "could try reads them (false: skipped then, saying why)")
    solver: Literal["auto", "exact", "projected", "cg", "last_layer"] = "auto"
    lam: float | None = Field(None, gt=0, description="GGN damping; null = n_train * train.weight_decay")
    min_lam: float = Field(1.0, gt=0, description="lower bound of the derived damping")
    proj_dim: int = Field(2048, gt=0)
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="the full model's Jacobians and projections; sums and factorizations are float64 "
                               "either way, and the last-layer mode computes in float64")
    check_subset: int = Field(16, ge=0, description="forget samples checked against exact when the solver is not "
                                                    "exact (0 = no check)")
    check_rows: int = Field(64, ge=1, description="past the dense size, the check solves exactly on this many "
                                                  "random retain rows (weighted to stand for all of them)")
    cross_sample: int | None = Field(2000, ge=1, description="cross-leverage on this many random retain rows, with "
                                                             "the standard errors of its summary; null = every row "
                                                             "(deletion.partition.mode leverage always uses every row)")
    last_layer_above: int | None = Field(
        50_000, ge=1, description="solver auto: past this many parameters, the GGN of the head over the penultimate "
                                  "features (null = never by count)")
    head_rank: int | None = Field(
        256, ge=1, description="last-layer mode: the head moves within this many principal directions of its input "
                               "features (p = classes x rank instead of classes x (features + 1)); null = all")
    threads: int | None = Field(1, ge=1, description="intra-op threads while the diagnostics run on CPU (1, as "
                                                     "training: many mid-sized ops; null = as set)")
    max_retrains: float | None = Field(
        1.0, gt=0, description="solver auto: when the full-model solver's estimated cost exceeds this many plain "
                               "retrains of the model, the last-layer mode instead (null = by parameter count only)")

    def damping(self, n_train: int, weight_decay: float) -> float:
        """The GGN damping lam: `lam`, else n_train * weight_decay (the recipe's L2 on a sum-of-losses
        objective: train.weight_decay), at least `min_lam`."""
        return self.lam if self.lam is not None else max(n_train * weight_decay, self.min_lam)


class AuditSchedule(Strict):
    """Which qualified batches the full certificate audits (unlearning/certificate/qualification.py audit_due): every k-th
    batch, or each with a probability drawn from the batch's seed."""

    every: int | None = Field(None, ge=1, description="audit batch 0, k, 2k, ... (1 = every batch)")
    probability: float | None = Field(None, ge=0, le=1, description="audit each batch with this probability "
                                                                    "(seeded by base.seed and the batch index)")

    @model_validator(mode="after")
    def _one_rule(self):
        if (self.every is None) == (self.probability is None):
            raise ValueError(f"validation.audit = {{every: {self.every}, probability: {self.probability}}} must set "
                             f"exactly one of them: e.g. {{every: 5}} or {{probability: 0.2}}")
        return self


class ProbeSettings(Strict):
    """validation.probe: how the planner's timing probe measures (unlearning/planning/costs.py ProbeConditions,
    tasks/planning.py probe; docs/design.md §4.6): rounds until they agree, and when a cached probe is stale."""

    max_spread: float = Field(0.25, gt=0, description="time the cost curve again until the slowest and fastest round "
                                                      "differ by at most this share of the median (else the plan "
                                                      "reports the spread it measured)")
    max_rounds: int = Field(3, ge=1, le=20, description="rounds of the curve at most")
    max_age_hours: float = Field(24.0, gt=0, description="probe again when the cached figure is older than this")
    max_load_ratio: float = Field(2.0, gt=1, description="probe again when the load per core differs from the "
                                                         "probe's by more than this factor either way (a probe taken "
                                                         "under another load prices a batch wrongly)")


class Validation(Strict):
    """How candidates are certified against reference models (docs/design.md §4.2, §4.5; unlearning/planning/plan.py)."""

    mode: Literal["per_batch", "qualified"] = Field(
        "per_batch", description="per_batch: every batch's candidate is certified against reference models; "
                                 "qualified: the method the model's qualification licenses at the batch's predicted "
                                 "gap runs with cheap checks, and sampled audits run the full certificate "
                                 "(docs/certificate.md, \"Two modes\")")
    qualified_min_pass: float = Field(0.9, gt=0, le=1, description="qualified mode: a method is licensed at a predicted "
                                                                   "gap where its qualified pass rate is at least this")
    qualified_bound: Literal["lower", "point"] = Field(
        "lower", description="the qualified pass rate: the lower end of its interval (qualify.confidence) or the "
                             "point estimate")
    qualified_max_class_share: float | None = Field(
        0.5, gt=0, le=1, description="qualified mode's cheap checks: a batch whose forget rows hold more than this "
                                     "share of some class's training rows is a class-level request, never licensed "
                                     "(no reference-free check sees it: docs/certificate.md); null = off")
    audit: AuditSchedule = Field(AuditSchedule(every=5), description="qualified mode: which batches are audited")

    n_oracles: int = Field(80, ge=2)
    n_shadows: int = Field(80, ge=1)
    chunk_size: int | None = Field(None, gt=0, description="members trained together at most; null = auto: "
                                                           "32 on a CPU, as many as the device memory holds on "
                                                           "CUDA (the memory budget may lower it; the cost curve "
                                                           "of the plan's probe may pick fewer; chunks are sized "
                                                           "to the workers)")
    looks: list[int] = Field([16, 32], description="references per role at the sequential certificate's interim "
                                                   "looks (the final look is at n_oracles/n_shadows; looks at or "
                                                   "past it are not taken); [] = one look")
    interim_alpha_share: float = Field(0.5, ge=0, lt=1, description="share of the gate's alpha spent on the interim "
                                                                    "looks, split equally between them")
    audit_retrain: bool = Field(False, description="certify an exact retrain against oracles too (it is exact by "
                                                   "construction: by default it trains one model, checked against "
                                                   "the original's accuracy)")
    memory_mb: int = Field(4096, ge=64, description="peak memory budget of a batch's training and evaluation (MB)")
    gpu_memory_mb: int | None = Field(None, ge=64, description="CUDA: device memory the reference chunks may use "
                                                               "(MB); null = 90% of the free device memory at "
                                                               "the plan (torch.cuda.mem_get_info)")
    certificate_rows: int | None = Field(2000, ge=100, description="the sequential certificate evaluates every "
                                                                   "forget row and a seeded sample of at most this "
                                                                   "many retain and validation rows each (null = "
                                                                   "every row)")
    task_runner: Literal["threads", "dask"] = "threads"
    dask_address: str | None = None
    dask_workers: int = Field(2, gt=0)
    probe: ProbeSettings = Field(ProbeSettings(), description="the planner's timing probe: rounds, and when a "
                                                              "cached one is taken again")

    @model_validator(mode="after")
    def _looks_increase(self):
        # looks at or past the final one (min(n_oracles, n_shadows)) are not taken: a small N keeps one look
        if any(b <= a for a, b in zip(self.looks, self.looks[1:])) or any(n < 2 for n in self.looks):
            raise ValueError(f"validation.looks = {self.looks} must increase, each at least 2 (references per role); "
                             f"e.g. [16, 32], or [] for one look at n_oracles")
        return self


class RetrainEquivalenceGate(Strict):
    alpha: float = Field(0.01, gt=0, lt=1, description="a split passes when its KLoM permutation p-value >= alpha "
                                                       "(per split; unlearning/metrics/permutation.py)")
    n_permutations: int = Field(200, ge=19, le=100_000, description="relabelings of the permutation test "
                                                                    "(p-value resolution 1 / (1 + n))")
    accuracy_z: float = Field(2.0, ge=0, description="candidate accuracy per split must lie in [min, max] of the "
                                                     "oracle accuracies widened by this many binomial std errors")
    max_accuracy_gap: float | None = Field(
        None, ge=0, le=1, description="optional extra bound |acc(candidate) - mean acc(oracles)| per split (null = off)")
    max_validation_drop: float | None = Field(
        0.05, ge=0, le=1, description="validation accuracy at least the original's minus this (null = off)")
    min_validation_accuracy: float | None = Field(
        None, ge=0, le=1, description="absolute floor for the candidate's validation accuracy (dataset-specific; "
                                      "null = off)")
    max_klom_p95_forget: float | None = Field(None, ge=0, description="absolute bound on the forget split's KLoM P95")
    max_klom_to_noise_floor: float | None = Field(
        None, gt=0, description="optional extra bound: KLoM P95 of each split <= this x the same-size noise floor "
                                "(median of the permutation null) P95 (null = off)")

    @model_validator(mode="after")
    def _test_can_fail(self):
        # The smallest p-value the permutation test can give is 1 / (1 + n_permutations): above alpha, no
        # candidate could ever fail the test, whatever it did (unlearning/certificate/resolution.py).
        if not can_reject(self.alpha, self.n_permutations):
            need = permutations_needed(self.alpha)
            raise ValueError(f"n_permutations = {self.n_permutations} cannot give a p-value below alpha = "
                             f"{self.alpha} (its smallest is 1/(1 + n) = {1 / (1 + self.n_permutations):.4f}), so the "
                             f"KLoM test could never fail: set n_permutations >= {need} or raise alpha")
        return self


class SuppressionGate(Strict):
    max_forget_accuracy: float = Field(0.05, ge=0, le=1)
    min_adjacent_retention: float = Field(0.9, ge=0, le=1, description="adjacent acc / original adjacent acc")
    max_validation_drop: float | None = Field(
        0.25, ge=0, le=1, description="validation accuracy at least the original's minus this (null = off); wider "
                                      "than retrain_equivalence's: suppressing a class costs its validation rows")
    min_validation_accuracy: float | None = Field(None, ge=0, le=1, description="absolute floor (null = off)")


class EpsilonGate(Strict):
    """The equivalence question (docs/certificate.md, "Two questions"): how far from retraining, at most,
    in differential privacy's epsilon, per row of each split, aggregated by a high quantile or the capped mean."""

    max: float = Field(3.0, gt=0, description="the budget: a split passes when the `quantile` of its rows' epsilon "
                                              "upper bounds is at most this (rejected early when the lower bounds' "
                                              "quantile exceeds it)")
    delta: float = Field(1e-3, gt=0, lt=1, description="the delta of (epsilon, delta)-indistinguishability")
    quantile: float = Field(0.95, gt=0, le=1, description="the batch's epsilon: this quantile over a split's rows "
                                                          "(1 = the worst row; the mean is logged beside it)")
    estimator: Literal["threshold", "gaussian"] = Field(
        "gaussian", description="per-row estimator (unlearning/metrics/epsilon.py): threshold = the NeurIPS 2023 "
                                "challenge's scan with Clopper-Pearson bounds (floor ~1.4, cap log N); gaussian = "
                                "a Gaussian fit per row read through the Gaussian-DP curve, bootstrap bounds")
    n_bootstrap: int = Field(200, ge=20, le=100_000, description="bootstrap resamples of the references for the "
                                                                 "gaussian estimator's bounds (raised to 2/alpha)")
    aggregate: Literal["quantile", "mean"] = Field(
        "quantile", description="a split's epsilon from its rows': quantile = the `quantile` of the rows' bounds "
                                "(every row but 1 - quantile within the budget); mean = the rows' mean, each row "
                                "capped at `row_cap`, bounded by a joint bootstrap over the models (the average "
                                "row; gaussian estimator only)")
    row_cap: float = Field(10.0, gt=0, description="aggregate mean: a row counts at most this much (a memorized row "
                                                   "moves a split's mean by at most row_cap / its rows)")

    @model_validator(mode="after")
    def _mean_needs_the_joint_bootstrap(self):
        if self.aggregate == "mean" and self.estimator != "gaussian":
            raise ValueError(f"aggregate = 'mean' needs estimator = 'gaussian' (its joint bootstrap over the models "
                             f"bounds the mean), got estimator = {self.estimator!r}: set estimator: gaussian, or "
                             f"aggregate: quantile")
        return self


class Gate(Strict):
    criterion: Literal["difference", "epsilon"] = Field(
        "difference", description="retrain_equivalence's question: difference = can the candidate be told apart "
                                  "from retrains (KLoM permutation test, accuracy intervals); epsilon = is it within "
                                  "`epsilon.max` of retraining, at the look's confidence")
    epsilon: EpsilonGate = EpsilonGate()
    retrain_equivalence: RetrainEquivalenceGate = RetrainEquivalenceGate()
    suppression: SuppressionGate = SuppressionGate()
    exact_retrain_overrides: bool = Field(
        True, description="promote an exact retrain the gate rejected (a false reject of the gate: the retrain IS "
                          "an oracle), logged as such; false = reject the batch")


class Tracking(Strict):
    experiment: str = "unlearning"
    registered_model: str = "unlearning-classifier"
    alias: str = "champion"


CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
CRON_NAMES = {3: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
              4: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]}
CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly")


def _cron_field_values(part: str, k: int) -> set[int] | str:
    """The values one field of a cron expression names (field `k` of CRON_FIELDS), or why it is not a field."""
    name, lo, hi = CRON_FIELDS[k]
    names = CRON_NAMES.get(k, [])

    def value(v: str) -> int | None:
        if v in names:
            return names.index(v) + (1 if k == 3 else 0)
        return int(v) if v.isdigit() and lo <= int(v) <= hi else None

    out: set[int] = set()
    for item in part.split(","):
        rng, _, step = item.partition("/")
        if step and not (step.isdigit() and int(step) > 0):
            return f"{name} field {part!r}: step {step!r} must be a positive whole number"
        if rng == "*":
            first, last = lo, hi
        else:
            ends = rng.split("-")
            if len(ends) > 2 or any(value(v) is None for v in ends):
                return f"{name} field {part!r}: {rng!r} is not a value or range within {lo}-{hi}"
            first, last = value(ends[0]), value(ends[-1])
            if first > last:
                return f"{name} field {part!r}: range {rng!r} runs backwards"
            if len(ends) == 1 and step:  # `a/n` is a..hi every n, as cron reads it
                last = hi
        out.update(range(first, last + 1, int(step or 1)))
    return out


MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 29 exists in leap years


def cron_problem(expr: str) -> str | None:
    """Why `expr` is not a 5-field cron expression (minute hour day-of-month month day-of-week; each field
    `*`, a value, a range `a-b`, a step `*/n` or `a-b/n`, or a comma list of those; month and weekday names
    allowed) or a macro such as @daily; None when it is one. Checked at load, so `unlearn serve` fails with
    the key before it starts (the same forms Prefect's cron schedule takes, without its random/hash forms).
    An expression whose days of the month never occur in its months ('0 0 31 2 *', the 30th of February) is
    refused too: Prefect's scheduler accepted it and then logged an error on the server, and nothing ran."""
    text = expr.strip().lower()
    if text in CRON_MACROS:
        return None
    parts = text.split()
    if len(parts) != 5:
        return f"has {len(parts)} field(s); a cron expression has 5 (minute hour day-of-month month day-of-week)"
    values = []
    for k, part in enumerate(parts):
        got = _cron_field_values(part, k)
        if isinstance(got, str):
            return got
        values.append(got)
    days, months = values[2], values[3]
    # also with a weekday named: Prefect's croniter finds no run time for '0 0 31 2 mon' either
    if not any(d <= MONTH_DAYS[m - 1] for m in months for d in days):
        return (f"day of month field {parts[2]!r} names no day that month field {parts[3]!r} has (February has at "
                f"most 29 days; April, June, September and November 30): the schedule would never fire")
    return None


@functools.lru_cache(maxsize=1)
def _available_timezones() -> frozenset[str]:
    from zoneinfo import available_timezones

    return frozenset(available_timezones())  # a walk of the zone files: once per process


class Operations(Strict):
    """Unattended operation: `unlearn serve` deployments, the inbox watcher, the batch lock, DVC lineage."""

    cron: str = "0 2 * * *"
    timezone: str = "UTC"
    lock_timeout_seconds: float = Field(3600, gt=0)
    inbox_settle_seconds: float = Field(2.0, ge=0, le=600, description="the inbox watcher announces an entry once "
                                                                       "it has not changed for this long")
    inbox_retry_seconds: float = Field(60.0, ge=1, le=86400, description=(
        "an announced entry still in the inbox while no run is live (its event was lost in a server outage, its "
        "run failed) is announced again after this long, then after twice as long each time, up to an hour"))
    dvc_commit: bool = Field(True, description="deployment runs commit state to the DVC cache afterwards")
    dvc_remote: str | None = Field("dvc-remote", description="local folder or DVC remote name for `dvc push`; null = no push")

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        problem = cron_problem(v)
        if problem:
            raise ValueError(f"not a cron expression: it {problem}" if problem.startswith("has") else
                             f"not a cron expression: {problem} (e.g. '0 2 * * *' is 02:00 every day)")
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("not an IANA time zone name (UTC, Europe/Berlin, America/New_York, ...)") from None
        # ZoneInfo also loads files that are no zone names (posixrules, right/UTC); Prefect's schedule takes only
        # the names available_timezones() lists and `unlearn serve` died with a traceback on the others
        if v != "UTC" and v not in _available_timezones():
            raise ValueError("a time zone file, not one of the IANA zone names a schedule takes (UTC, Europe/Berlin, "
                             "America/New_York, ...)")
        return v


class Erasure(Strict):
    """Erasure after each promoted batch (docs/design.md §3): forgotten rows leave every store, not just the model."""

    enabled: bool = Field(True, description="erase the forgotten rows from every store after a promoted batch")
    keep_versions: int = Field(0, ge=0, description="registered versions trained on forgotten rows kept besides the "
                                                    "champion (newest first); 0 = purge all of them")
    dvc_gc: bool = Field(True, description="re-commit the rewritten DVC outputs and `dvc gc -w` the cache (and "
                                           "`-c` the remote) when the project is a DVC repo")
    keep_request_files: str | int = Field(
        "until_applied", description="how long an applied request file keeps its plain ids in requests/processed/ "
                                     "(deletion.hash_sample_ids): until_applied = hashed when it is moved there; N = "
                                     "N days after it was applied, then hashed")

    @field_validator("keep_request_files", mode="before")
    @classmethod
    def _keep_request_files(cls, v):
        if v == "until_applied" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return v
        raise ValueError("allowed: until_applied (the default: an applied request file keeps hashed ids only) or a "
                         "whole number of days >= 0 (its plain ids kept that long after the batch is applied)")

    def request_file_days(self) -> int:
        """Days an applied request file keeps its plain ids (0: until it is applied)."""
        return 0 if self.keep_request_files == "until_applied" else int(self.keep_request_files)


class Quality(Strict):
    """What a promoted batch cost the model, said out loud (unlearning/batch/quality.py; tasks/quality.py announces it):
    warnings in the console, the batch's MLflow run, a Prefect artifact and `unlearn status`."""

    max_validation_drop: float | None = Field(
        0.05, ge=0, le=1, description="warn when the champion's validation accuracy falls by more than this against "
                                      "the original's (null = off)")
    max_oracle_spread: float | None = Field(
        0.15, ge=0, le=1, description="warn when the oracles' validation accuracies (exact retrains, other seeds) "
                                      "spread wider than this, max - min: an unstable recipe (null = off)")
    refuse: list[Literal["class_lost", "validation_drop", "unstable_recipe"]] = Field(
        [], description="warnings that hold the batch for review instead of warning (requests/held/, exit 5, the "
                        "previous champion stays until `unlearn approve`): an erasure is never refused")


class LicensingMap(Strict):
    """The per-row memorization map of a model version (unlearning/licensing/memorization.py; docs/certificate.md, "The map"):
    N members on random halves of the training rows, trained once and reused while the recipe and the data are
    unchanged (tasks/licensing.py says what that means)."""

    members: int | None = Field(None, ge=4, description="members on random halves (even: complementary pairs); "
                                                        "null = the planner sizes it within max_retrains")
    min_members: int = Field(16, ge=4, description="the fewest members the planner builds a map of: when even these "
                                                   "cost more than max_retrains, the map is not affordable and "
                                                   "nothing is licensed")
    max_members: int = Field(64, ge=4, description="the most members the planner sizes a map to")
    max_retrains: float = Field(8.0, gt=0, description="the map's training cost at most, in retrains of the model "
                                                       "(the planner's probe); ignored when `members` is set")
    stream_length: int = Field(100, ge=1, description="requests a map is expected to serve: its cost per request "
                                                      "is stated over this many")
    max_erased_fraction: float = Field(0.25, gt=0, le=1, description="the map's own debt: past this share of its "
                                                                     "rows erased since it was built (licensed or "
                                                                     "retrained), the next batch builds a new one")
    confidence: float = Field(0.9, gt=0.5, lt=1, description="one-sided confidence of each row's epsilon bounds")
    n_bootstrap: int = Field(200, ge=20, le=100_000, description="bootstrap resamples of each row's members")

    @model_validator(mode="after")
    def _even_sizes(self):
        for key in ("members", "min_members", "max_members"):
            value = getattr(self, key)
            if value is not None and value % 2:
                raise ValueError(f"{key} = {value} must be even: the members train on complementary "
                                 f"pairs of halves (e.g. {value + 1})")
        if self.max_members < self.min_members:
            raise ValueError(f"max_members = {self.max_members} is below min_members = "
                             f"{self.min_members}; raise max_members or lower min_members")
        return self


class LicensingAudit(Strict):
    """Which licensed batches are audited by the gate with fresh oracles (a failed audit: exact retrain in the same
    run, and the cut comes down)."""

    probability: float = Field(0.02, ge=0, le=1, description="audit each licensed batch with this probability "
                                                             "(seeded by base.seed and the batch index); 0 = never")


class Licensing(Strict):
    """Licensed inaction (docs/design.md §4.9; docs/certificate.md, "Licensed inaction"): a retrain-equivalence
    request whose rows the model never memorized leaves the model unchanged (no new version) and its rows leave
    every store as in any erasure."""

    enabled: bool = Field(True, description="license requests where the planner finds the map affordable; false = "
                                            "every request takes the exact path")
    score: Literal["upper", "point", "loss"] = Field(
        "upper", description="a row's map score against the cut: its epsilon upper bound, the point estimate, or "
                             "the model's training loss on it (the free fallback)")
    target: float = Field(0.05, gt=0, lt=1, description="the audited false-accept rate the cut keeps, per request")
    max_rows: int = Field(20, ge=1, description="cuts are fitted for requests of 1 to this many rows; larger "
                                                "requests are never licensed")
    min_calibration_rows: int = Field(20, ge=1, description="a cut licenses at least this many calibration rows")
    max_class_share: float = Field(0.1, gt=0, le=1, description="a request whose rows take more than this share of "
                                                                "a class's training rows is a class, never licensed "
                                                                "(validation.qualified_max_class_share is its "
                                                                "qualified-mode twin)")
    max_adjacent_share: float = Field(0.5, ge=0, le=1, description="a request of which more than this share of rows "
                                                                   "have another of its rows among their k_neighbors "
                                                                   "nearest training rows is a cluster, never "
                                                                   "licensed")
    k_neighbors: int = Field(10, ge=1, description="nearest training rows (the model's penultimate features) the "
                                                   "cluster guard looks at")
    max_debt_rows: int | None = Field(10, ge=0, description="licensed rows since the last exact retrain, the "
                                                            "request's included, at most; past it the request takes "
                                                            "the exact path (null = off: deletion.debt still applies)")
    map: LicensingMap = LicensingMap()
    audit: LicensingAudit = LicensingAudit()


# --- report: the evidence studies (`make report`, report/dvc.yaml; unlearning/studies) -------------------------------------
SweepSetting = dict[str, Any]  # method args of one sweep point, e.g. {lr: 1.0e-4, epochs: 5}


class S3Random(Strict):
    """S3 "Ascent Fails to Forget": random digits forget sets, methods and a GA/GDA sweep against the gate."""

    enabled: bool = True
    seed: int = Field(3, description="base seed of the study's forget sets and model roles")
    n_models: int = Field(64, ge=4, description="oracles per set (set A, the gate's; set B, independent retrains) "
                                                "and shadow originals")
    sizes: list[int] = Field([10, 50, 200], min_length=1, description="forget-set sizes")
    sets_per_size: int = Field(3, ge=1)
    methods: list[str] = Field(["do_nothing", "finetune", "retrain"],
                               description="methods at their defaults (retrain = an independent oracle of set B)")
    newton_sets_per_size: int = Field(1, ge=0, description="newton_ggn on the first k sets of each size (slow)")
    far_ratio: float = Field(1.5, gt=1, description="a candidate whose KLoM P95 against the independent oracle set B "
                                                    "exceeds this x the A-vs-B floor is far from a retrain: a gate "
                                                    "pass there counts as a false accept")
    sweep: dict[str, list[SweepSetting]] = Field(
        default_factory=lambda: {
            "gradient_ascent": [{"lr": 1e-4, "epochs": 5}, {"lr": 1e-3, "epochs": 2}, {"lr": 1e-3, "epochs": 10},
                                {"lr": 1e-2, "epochs": 10}],
            "descent_ascent": [{"lr": 1e-4, "epochs": 1}, {"lr": 1e-3, "epochs": 1}, {"lr": 1e-3, "epochs": 2},
                               {"lr": 1e-2, "epochs": 2}]},
        description="per method, the settings swept (args merged over the method's defaults)")

    @field_validator("sizes")
    @classmethod
    def _positive(cls, v):
        if any(s < 1 for s in v):
            raise ValueError(f"every size must be >= 1, got {v}")
        return v


class S4Entanglement(Strict):
    """S4 "Retain-Forget Entanglement": Fashion-MNIST, forget = Shirt, objective suppression."""

    enabled: bool = True
    seed: int = 0
    max_train: int | None = Field(10_000, gt=0, description="training rows kept (null = all 60,000)")
    max_val: int | None = Field(2_000, gt=0, description="t10k rows kept (null = all 10,000)")
    targets: list[Literal["fine", "super"]] = Field(["fine", "super"], min_length=1)
    models: list[Literal["mlp", "cnn", "resnet"]] = Field(["mlp", "cnn"], min_length=1)
    hidden: list[int] = Field([128], description="mlp hidden widths")
    channels: list[int] = Field([8, 16], description="cnn channels per stage")
    epochs: int = Field(8, gt=0)
    batch_size: int = Field(128, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    methods: list[str] = Field(["retrain", "finetune", "gradient_ascent", "descent_ascent", "scrub", "salun",
                                "al_wpgd"], description="run after the original; retrain = trained from scratch on R")
    method_args: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"al_wpgd": {"max_grad_evals": 1_500_000}},
        description="per-method args merged over the study's presets (al_wpgd capped: its super-class preset "
                    "spends 5.6M gradient evaluations, 20 min on the CNN on 2 cores)")
    frontier_weights: list[float] = Field([1.0, 10.0], description="from-scratch suppression weights of the frontier "
                                                                   "reference (empty = none)")


S5_STRUCTURES = ("random10", "random50", "random200", "class", "half_class", "group", "high_self_leverage",
                 "low_self_leverage")


class S5Diagnostics(Strict):
    """S5 "Loss is Not Behavior": leverage diagnostics before unlearning against each method's realised gap."""

    enabled: bool = True
    seed: int = 5
    n_models: int = Field(32, ge=4, description="oracles and shadow originals per structure")
    structures: list[Literal[S5_STRUCTURES]] = Field(list(S5_STRUCTURES), min_length=2)  # type: ignore[valid-type]
    structure_size: int = Field(50, ge=2, description="rows of the group / high / low self-leverage sets")
    methods: list[str] = Field(["do_nothing", "finetune", "gradient_ascent", "descent_ascent", "retrain"])


class Report(Strict):
    studies: list[Literal["s3", "s4", "s5"]] = Field(["s3", "s4", "s5"], description="studies the report runs")
    readme: str | None = Field("docs/evidence.md", description="file whose results section is regenerated (null = none)")
    threads: int = Field(2, gt=0, description="torch threads")
    s3: S3Random = S3Random()
    s4: S4Entanglement = S4Entanglement()
    s5: S5Diagnostics = S5Diagnostics()


class QualifySet(Strict):
    """One entry of the qualification suite (unlearning/certificate/qualification.py draw_suite)."""

    kind: Literal["random", "group", "class", "high_self_leverage", "low_self_leverage"]
    size: int | None = Field(None, ge=1, description="rows per set (class/group: null = every row of it; required "
                                                     "for the other kinds)")
    count: int = Field(1, ge=1, description="sets of this kind")

    @model_validator(mode="after")
    def _size_needed(self):
        if self.size is None and self.kind not in ("class", "group"):
            raise ValueError(f"qualify.suite entry kind {self.kind!r} needs a size (rows per set), e.g. "
                             f"{{kind: {self.kind}, size: 50, count: 1}}")
        return self


class Qualify(Strict):
    """The qualify stage: the oracle certificate of every declared method on a suite of forget sets, once per
    trained model (flows/qualify.py; docs/certificate.md, "Two modes")."""

    methods: list[str] = Field(["do_nothing", "gradient_ascent"], min_length=1,
                               description="methods to qualify, cheapest first (the license reorders them by their "
                                           "runs timed on the model; exact retrain is always the fallback)")
    suite: list[QualifySet] = Field(
        [QualifySet(kind="random", size=10, count=10), QualifySet(kind="random", size=50, count=10),
         QualifySet(kind="random", size=200, count=4), QualifySet(kind="group", count=1),
         QualifySet(kind="class", count=1), QualifySet(kind="high_self_leverage", size=50, count=1),
         QualifySet(kind="low_self_leverage", size=50, count=1)], min_length=1,
        description="the forget sets the qualification certifies each method on")
    bins: list[float] = Field([0.5, 1.0, 2.0, 4.0], min_length=1,
                              description="upper edges of the predicted-gap bins (noise units); the last bin is open")
    confidence: float = Field(0.8, gt=0, lt=1, description="two-sided confidence of each row's interval")
    interval: Literal["wilson", "clopper_pearson"] = "wilson"
    min_sets_per_bin: int = Field(0, ge=0, description="after the suite, draw more sets (aimed along the self-"
                                                       "leverage ranking) until every bin of predicted gap holds at "
                                                       "least this many; 0 = the suite alone")
    max_extra_sets: int = Field(20, ge=0, description="the budget of sets drawn for min_sets_per_bin; bins still "
                                                      "short are named in the qualification")
    extra_set_size: int = Field(50, ge=1, description="rows per set drawn for min_sets_per_bin")

    @model_validator(mode="after")
    def _bins_increase(self):
        if any(b <= a for a, b in zip(self.bins, self.bins[1:])) or self.bins[0] <= 0:
            raise ValueError(f"qualify.bins = {self.bins} must be positive and increasing, e.g. [0.5, 1, 2, 4]")
        exact = [m for m in self.methods if method_traits(m).exact]
        if exact:
            raise ValueError(f"qualify.methods = {self.methods} must not list {', '.join(exact)}: an exact method is exact by "
                             f"construction (exact retrain is always the fallback) and needs no qualification")
        return self


class Params(Strict):
    base: Base = Base()
    prepare: Prepare = Prepare()
    train: Train = Train()
    deletion: Deletion = Deletion()
    diagnostics: Diagnostics = Diagnostics()
    validation: Validation = Validation()
    gate: Gate = Gate()
    tracking: Tracking = Tracking()
    operations: Operations = Operations()
    erasure: Erasure = Erasure()
    quality: Quality = Quality()
    report: Report = Report()
    qualify: Qualify = Qualify()
    licensing: Licensing = Licensing()

    # The folder params.yaml was read from; every relative path resolves against it.
    root: Path = Field(default_factory=Path.cwd, exclude=True)

    @model_validator(mode="after")
    def _sisa_needs_shards(self) -> "Params":
        problem = sharded_original_problem(self.deletion.method, self.train.sharding.on,
                                           found="train.sharding.shards is null (one model)")
        if problem:
            raise ValueError(problem)
        return self

    def path(self, name: str) -> Path:
        return self.project_paths.path(name)

    @property
    def project_paths(self) -> "ProjectPaths":
        """base.paths resolved against the project folder: the slice of a function that only finds files."""
        return ProjectPaths(self.root, self.base.paths)

    def ggn_damping(self, n_train: int) -> float:
        """The GGN damping lam of the leverage diagnostics (Diagnostics.damping with the recipe's weight decay)."""
        return self.diagnostics.damping(n_train, self.train.weight_decay)

    def mlflow_tracking_uri(self) -> str:
        """MLFLOW_TRACKING_URI wins; else the project's SQLite store."""
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.path('mlflow_db').resolve()}"


@dataclass(frozen=True)
class ProjectPaths:
    """base.paths and the folder params.yaml was read from (`Params.project_paths`): what a stage that only reads
    and writes the project's files takes instead of the whole params. `path(name)`: base.paths.<name>, relative
    ones against `root`."""

    root: Path
    paths: Paths

    def path(self, name: str) -> Path:
        p = Path(getattr(self.paths, name))
        return p if p.is_absolute() else self.root / p


def is_tracking_server(uri: str) -> bool:
    """Whether an MLflow tracking URI names a tracking server (which stores the artifacts and serves the UI
    itself) rather than a local store."""
    return uri.startswith(("http://", "https://"))


class ConfigError(ValueError):
    """A params.yaml problem, with the key path, the value and what is allowed."""


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        ann = next((a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)), ann)  # X | None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def _format(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'; allowed keys here: {_allowed_keys(Params, e['loc'])}")
        elif e["type"] == "missing":
            lines.append(f"{source}: {key}: required key missing")
        elif e["type"] == "value_error" and isinstance(e.get("input"), dict):  # a section-level check
            lines.append(f"{source}: {key + ': ' if key else ''}{e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{source}: {key} = {e.get('input')!r}: {e['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def parse_params(data: dict | None, root: Path | None = None, source: str = PARAMS_FILE) -> Params:
    try:
        params = Params(**(data or {}))
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None
    if root is not None:
        params.root = Path(root).resolve()
    return params


# libyaml's safe loader when PyYAML was built with it: the same documents and errors, about 10x faster than the
# pure-Python one (0.1 s of a bad request file's answer, which reads params.yaml twice)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_params(path: str | Path = PARAMS_FILE, overrides: dict | None = None) -> Params:
    """Read and validate params.yaml; `overrides` is a nested dict merged on top (for tests and CLI)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found; run from the project root or pass --params PATH")
    try:
        text = path.read_text()
        data = yaml.load(text, Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        lines = text.splitlines()
        if mark is not None and mark.line < len(lines) and mark.column < len(lines[mark.line]) \
                and lines[mark.line][mark.column] == "\t":
            problem += " (a tab: YAML indents with spaces only)"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}; fix the syntax there") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (base:, prepare:, train:, ...), "
                          f"not a {type(data).__name__}")
    if overrides:
        data = deep_merge(data, overrides)
    return parse_params(data, root=path.resolve().parent, source=str(path.name))


def deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Device nodes a CUDA (or ROCm, or WSL GPU) device shows up as; none of them: torch cannot find one either.
GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def device_problem(base: Base) -> str | None:
    """`base.device: cuda` (`base`: params.base) on a machine with no GPU device node at all: said before any
    server starts or torch is imported (2-3 s); where a node exists, torch decides later (resolve_device)."""
    import glob

    if base.device != "cuda" or any(glob.glob(p) for p in GPU_DEVICE_NODES):
        return None
    return "base.device = 'cuda' but this machine has no GPU device (no /dev/nvidia*); use 'auto' or 'cpu'"


def resolve_device(device: str) -> str:
    """base.device as a device name (unlearning/devices.py decides); no CUDA for 'cuda' is a ConfigError."""
    from unlearning.devices import DeviceUnavailable, resolve_device as resolve

    try:
        return resolve(device, "base.device").type
    except DeviceUnavailable as e:
        raise ConfigError(str(e)) from None
