"""params.yaml as validated pydantic models: the one place for every default and threshold.

Every model forbids unknown keys. `load_params` turns pydantic's errors into one `ConfigError` that
names the key path, the bad value and the allowed values or keys.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from unlearning.policy import Rule

PARAMS_FILE = "params.yaml"


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
    mlflow_db: str = "mlflow.db"
    mlflow_artifacts: str = "mlartifacts"


class Base(Strict):
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    progress: bool = True
    paths: Paths = Paths()


class Prepare(Strict):
    dataset: Literal["digits", "fashion_mnist"] = "digits"
    val_fraction: float = Field(0.2, gt=0, lt=1, description="digits only: held-out share")
    fashion_mnist_dir: str = "/usr/share/datasets/fashion-mnist"
    max_train: int | None = Field(None, gt=0, description="deterministic subsample of the training split")
    max_val: int | None = Field(None, gt=0)
    targets: Literal["fine", "super"] = "fine"


class ModelCfg(Strict):
    arch: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = [32]
    channels: list[int] = [8, 16]

    @field_validator("hidden", "channels")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h <= 0 for h in v):
            raise ValueError(f"layer sizes must be positive, got {v}")
        return v


class Train(Strict):
    model: ModelCfg = ModelCfg()
    epochs: int = Field(30, gt=0)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(5e-4, ge=0)


class Partition(Strict):
    mode: Literal["group", "leverage", "embedding"] = "group"
    top_fraction: float = Field(0.2, gt=0, le=1, description="leverage mode: share of retain marked adjacent")
    k_neighbors: int = Field(10, gt=0, description="embedding mode: neighbours per forget sample")


class Deletion(Strict):
    objective: Literal["retrain_equivalence", "suppression"] = "retrain_equivalence"
    method: str = Field("auto", description="a registered method, or 'auto' to walk `rules`")
    rules: list[Rule] = Field(default_factory=list, description="ordered selection rules (unlearning/policy.py)")
    fallback: list[str] = ["retrain"]
    method_args: dict[str, dict[str, Any]] = {}
    budget_gradient_evals: int = Field(2_000_000, gt=0)
    hash_sample_ids: bool = False
    partition: Partition = Partition()


class Diagnostics(Strict):
    """Leverage diagnostics (DESIGN §4.1) computed for every batch before unlearning."""

    enabled: bool = True
    solver: Literal["auto", "exact", "projected", "cg"] = "auto"
    lam: float | None = Field(None, gt=0, description="GGN damping; null = n_train * train.weight_decay")
    min_lam: float = Field(1.0, gt=0, description="lower bound of the derived damping")
    proj_dim: int = Field(2048, gt=0)
    check_subset: int = Field(16, ge=0, description="forget samples checked against exact when the solver is not exact")


class Validation(Strict):
    n_oracles: int = Field(8, ge=2)
    n_shadows: int = Field(8, ge=1)
    chunk_size: int = Field(32, gt=0)
    task_runner: Literal["threads", "dask"] = "threads"
    dask_address: str | None = None
    dask_workers: int = Field(2, gt=0)


class RetrainEquivalenceGate(Strict):
    max_accuracy_gap: float = Field(0.05, ge=0, le=1, description="|acc(candidate) - mean acc(oracles)| per split")
    min_validation_accuracy: float = Field(0.8, ge=0, le=1)
    max_klom_p95_forget: float | None = Field(None, ge=0, description="absolute bound on the forget split's KLoM P95")
    max_klom_to_noise_floor: float | None = Field(
        1.5, gt=0, description="KLoM P95 of each split <= this x the oracle noise floor's P95 (null = off)")


class SuppressionGate(Strict):
    max_forget_accuracy: float = Field(0.05, ge=0, le=1)
    min_adjacent_retention: float = Field(0.9, ge=0, le=1, description="adjacent acc / original adjacent acc")
    min_validation_accuracy: float = Field(0.5, ge=0, le=1)


class Gate(Strict):
    retrain_equivalence: RetrainEquivalenceGate = RetrainEquivalenceGate()
    suppression: SuppressionGate = SuppressionGate()


class Tracking(Strict):
    experiment: str = "unlearning"
    registered_model: str = "unlearning-classifier"
    alias: str = "champion"


class Operations(Strict):
    """Unattended operation: `unlearn serve` deployments, the inbox watcher, the batch lock, DVC lineage."""

    cron: str = "0 2 * * *"
    timezone: str = "UTC"
    lock_timeout_seconds: float = Field(3600, gt=0)
    dvc_commit: bool = Field(True, description="deployment runs commit state to the DVC cache afterwards")
    dvc_remote: str | None = Field("dvc-remote", description="local folder or DVC remote name for `dvc push`; null = no push")


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

    # The folder params.yaml was read from; every relative path resolves against it.
    root: Path = Field(default_factory=Path.cwd, exclude=True)

    def path(self, name: str) -> Path:
        p = Path(getattr(self.base.paths, name))
        return p if p.is_absolute() else self.root / p

    def mlflow_tracking_uri(self) -> str:
        """MLFLOW_TRACKING_URI wins; else the project's SQLite store."""
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.path('mlflow_db').resolve()}"


class ConfigError(ValueError):
    """A params.yaml problem, with the key path, the value and what is allowed."""


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
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
        else:
            lines.append(f"{source}: {key} = {e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)


def parse_params(data: dict | None, root: Path | None = None, source: str = PARAMS_FILE) -> Params:
    try:
        params = Params(**(data or {}))
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None
    if root is not None:
        params.root = Path(root).resolve()
    return params


def load_params(path: str | Path = PARAMS_FILE, overrides: dict | None = None) -> Params:
    """Read and validate params.yaml; `overrides` is a nested dict merged on top (for tests and CLI)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found; run from the project root or pass --params PATH")
    data = yaml.safe_load(path.read_text()) or {}
    if overrides:
        data = deep_merge(data, overrides)
    return parse_params(data, root=path.resolve().parent, source=str(path.name))


def deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("base.device = 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return device
