"""The sharded original on disk (docs/sharding.md): the train stage's SISA training, the shard folder
(`plan.json` + one checkpoint per (shard, slice)), reading it back for method `sisa`, and checking it for
erasure.

Folders: `models/shards/` is the train stage's DVC output (the original's plan and checkpoints); `state/shards/`
is the champion's, written with the state by every promoted `sisa` batch (tasks/state.py write_state). A
deletion reads `state/shards/` when it exists, else `models/shards/`; the erasure replaces `models/shards/` by
the champion's (`replace_original_shards`), as it replaces models/original.pt by the champion. The plan names
rows by `unlearning.sharding.id_hash` (salted), never by id, and records each checkpoint's rows digest: `check_folder`
proves every checkpoint was trained on exactly the plan's rows and that no forgotten row is among them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tasks.id_key import IdKey
from unlearning.config import ConfigError, Prepare, ProjectPaths, Sharding
from unlearning.data.store import Prepared
from unlearning.io import atomic_save, atomic_write_json, load_checkpoint, read_json_file
from unlearning.models import Ensemble, TrainRecipe, load_model, save_model, seeds_for
from unlearning.sharding import (ShardPlan, ShardState, id_hash, legacy_plan, make_plan, skew_warning,
                                 train_from_scratch)

PLAN = "plan.json"
SHARD_SEED_OFFSET = 7_000  # the constituents' seeds: their own block of the base seed's stream


@dataclass(frozen=True)
class ShardTraining:
    """What the train stage's SISA training reads of the params (built by tasks/training.py train_original):
    train.sharding, the prepare section and the project folder (a `column` key is read from the table), the
    seed, base.progress, where models/shards/ is, and the id key the plan's row hashes are keyed with."""

    sharding: Sharding
    prepare: Prepare
    seed: int
    progress: bool
    paths: ProjectPaths
    ids: IdKey


def original_shards(paths: ProjectPaths) -> Path:
    return paths.path("models_dir") / "shards"


def state_shards(paths: ProjectPaths) -> Path:
    return paths.path("state_dir") / "shards"


def checkpoint_name(k: int, r: int) -> str:
    return f"shard{k:03d}-slice{r:03d}.pt"


def shard_keys(s: Sharding, prepare: Prepare, root: Path, prepared: Prepared, rows: np.ndarray) -> np.ndarray:
    """The key that picks each training row's shard (`s`: train.sharding): the id (`random`), the data's group
    (`group`), or a column of the user's table (`column`: the manifest's group when it is the group column, else
    read from the table, `prepare`'s source under the project folder `root`)."""
    manifest = prepared.manifest.iloc[rows]
    if s.by == "random":
        return manifest["sample_id"].astype(str).to_numpy()
    if s.by == "group":
        return manifest["group"].astype(str).to_numpy()
    table = prepare.table
    if prepare.dataset != "table":
        raise ConfigError(f"train.sharding.by = 'column' reads a column of your table, but prepare.dataset = "
                          f"{prepare.dataset!r}; use by: group or by: random")
    if s.column == table.group_column:
        return manifest["group"].astype(str).to_numpy()
    from unlearning.data.sources import read_table

    df = read_table(prepare.source_path(root), (table.id_column, s.column))
    if s.column not in df.columns:
        raise ConfigError(f"train.sharding.column = {s.column!r} is not a column of {table.path}; its columns: "
                          f"{list(df.columns)[:20]}")
    values = dict(zip(df[table.id_column].map(str), df[s.column].map(str)))
    return np.asarray([values[i] for i in manifest["sample_id"].astype(str)], dtype=object)


def train_sharded(cfg: ShardTraining, prepared: Prepared, train_rows: np.ndarray, recipe: TrainRecipe, spec: dict,
                  device: str) -> tuple[Ensemble, dict]:
    """Train the S constituents in slices, each (shard, slice) checkpointed into models/shards/ (written to a
    staging folder, then swapped in), and return the aggregate (with its shard state) and what it did."""
    s = cfg.sharding
    ids = prepared.manifest["sample_id"].astype(str).to_numpy()[train_rows]
    keys = shard_keys(s, cfg.prepare, cfg.paths.root, prepared, train_rows)
    salt = cfg.ids.salt()
    plan = make_plan([id_hash(i, salt) for i in ids], keys, s.shards, s.slices, cfg.seed, recipe.epochs,
                     seeds_for(cfg.seed, s.shards, SHARD_SEED_OFFSET), s.by, s.column)
    skewed = skew_warning(plan.sizes(), s.max_skew, keys if s.by != "random" else None, key_label(s))
    X = torch.as_tensor(np.asarray(prepared.X[train_rows]), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label[train_rows]), dtype=torch.long)
    checkpoints: dict[tuple[int, int], Ensemble] = {}
    constituents, report = train_from_scratch(
        spec, plan, X.to(device), y.to(device), recipe, device=device, search_paths=[str(cfg.paths.root)],
        checkpoint=lambda k, r, m: checkpoints.__setitem__((k, r), m.select(0).cpu()),
        progress=f"train {s.shards} shards" if cfg.progress else False)
    state = ShardState(plan, X, y, checkpoints, s.aggregate, salt)
    write_folder(original_shards(cfg.paths), state)
    return state.model(constituents.cpu()).to(device), {
        "shards": s.shards, "slices": s.slices, "by": s.by, "shard_rows": plan.sizes(),
        "slice_epochs": plan.slice_epochs, "gradient_evals": report.gradient_evals, "skew_warning": skewed,
        "aggregate": s.aggregate}


def key_label(s: Sharding) -> str:
    """How the shard key (train.sharding `s`) is named in a warning: the column, the data's group, or the id."""
    return {"column": f"column {s.column!r}", "group": "the group column"}.get(s.by, "the id")


def sharded_accuracy_lines(model, X_val: torch.Tensor, y_val: torch.Tensor, sharding: dict) -> tuple[list[str], dict]:
    """What the train stage says of a sharded original (docs/sharding.md): the aggregate's validation accuracy
    against its constituents' (each trained on one shard), and how to measure a single model on every row
    (the comparison needs a training run of its own). Returns (console lines, metrics)."""
    from unlearning.models import accuracy

    agg = float(accuracy(model, X_val, y_val)[0])
    each = [float(a) for a in accuracy(model.constituents, X_val, y_val)]
    largest = int(np.argmax(sharding["shard_rows"]))
    lines = [f"sharded original: the aggregate ({sharding['aggregate']}) of {len(each)} constituents has val accuracy "
             f"{agg:.3f}; the constituents alone {min(each):.3f} to {max(each):.3f} (the largest shard's "
             f"{each[largest]:.3f}); a single model on every row: `dvc exp run -S train.sharding.shards=null` "
             f"(or `unlearn train` with it) and compare val_accuracy (`dvc exp show`, metrics/train.json)"]
    if sharding.get("skew_warning"):
        lines.append(sharding["skew_warning"])
    return lines, {"constituent_val_accuracy_min": min(each), "constituent_val_accuracy_max": max(each)}


def write_folder(folder: Path, state: ShardState) -> None:
    """plan.json and every (shard, slice) checkpoint of `state` into `folder` (a staging copy swapped in)."""
    from unlearning.io import commit_dir, discard_dir, staging_dir

    folder = Path(folder)
    stage = staging_dir(folder)
    try:
        for f in stage.glob("*.pt"):
            f.unlink()
        write_into(stage, state)
        commit_dir(stage, folder)
    except BaseException:
        discard_dir(stage)
        raise


def write_into(folder: Path, state: ShardState) -> None:
    """Write `state` into an existing (staging) folder: checkpoints first, the plan last."""
    folder.mkdir(parents=True, exist_ok=True)
    for (k, r), member in sorted(state.checkpoints.items()):
        atomic_save(folder / checkpoint_name(k, r),
                    lambda tmp, m=member, k=k, r=r: save_model(m, tmp, {"shard": k, "slice": r,
                                                                       "rows_digest": state.checkpoint_digest(k, r)}))
    atomic_write_json(folder / PLAN, {"format": "unlearning-shards/1", "aggregate": state.aggregate,
                                      **state.plan.to_dict()})


def write_unsharded(paths: ProjectPaths) -> None:
    """models/shards/ of an original trained as one model: a plan that says so (the folder is a DVC output)."""
    folder = original_shards(paths)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    atomic_write_json(folder / PLAN, {"format": "unlearning-shards/1", "shards": None})


def shards_folder(paths: ProjectPaths) -> Path:
    """Where the champion's shards are: state/shards/ once a batch promoted, else the original's."""
    return state_shards(paths) if (state_shards(paths) / PLAN).exists() else original_shards(paths)


def read_plan(folder: Path) -> tuple[ShardPlan, str] | None:
    path = Path(folder) / PLAN
    if not path.exists():
        return None
    d = read_json_file(path)
    if d.get("shards") is None:
        return None
    return ShardPlan.from_dict(d), d.get("aggregate", "mean_probs")


def attach_state(paths: ProjectPaths, ids: IdKey, prepared: Prepared, model, device: str = "cpu",
                 from_original: bool = False):
    """Hang the shard state on a loaded aggregate (no-op for a model trained as one): the plan, the rows it
    holds (features and labels from the prepared store, in plan order) and every checkpoint. `from_original`:
    the model is models/original.pt (a state starting from it), whose checkpoints are models/shards/."""
    if not hasattr(model, "constituents"):
        return model
    folder = original_shards(paths) if from_original else shards_folder(paths)
    found = read_plan(folder)
    if found is None:
        raise FileNotFoundError(f"{folder / PLAN}: the champion is a sharded aggregate but its shard plan is missing; "
                                f"run the train stage again (`dvc repro train`) or restore {folder}")
    plan, aggregate = found
    salt = plan_salt(ids, folder, plan)
    hashes = np.asarray([id_hash(i, salt) for i in prepared.manifest["sample_id"].astype(str)], dtype=object)
    where = {h: i for i, h in enumerate(hashes)}
    missing = [h for h in plan.sample_ids if h not in where]
    if missing:
        raise FileNotFoundError(f"{folder / PLAN}: {len(missing)} row(s) of the shard plan are not in "
                                f"{paths.path('prepared_dir')} (erased from the data but not from the plan?): "
                                f"run `unlearn erase`")
    rows = np.asarray([where[h] for h in plan.sample_ids], dtype=np.int64)
    X = torch.as_tensor(np.asarray(prepared.X[rows]), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label[rows]), dtype=torch.long)
    checkpoints = {(k, r): load_model(folder / checkpoint_name(k, r), device)[0]
                   for k in range(plan.shards) for r in range(plan.slices)}
    model.shard_state = ShardState(plan, X, y, checkpoints, aggregate, salt)
    return model


def plan_salt(ids: IdKey, folder: Path, plan: ShardPlan) -> str | None:
    """The salt the plan's ids are keyed with: the project's (`ids.salt()`), or None for a plan an older version
    wrote with unsalted id hashes: it keeps working, and one warning line says how to replace it."""
    if not legacy_plan(plan):
        return ids.salt()
    from tasks.reporting import run_logger

    run_logger().warning(f"{folder / PLAN} names its rows by unsalted id hashes (an older version): hashing every id "
                         f"of the dataset undoes them; `dvc repro -f train` writes it again with salted ones")
    return None


def check_folder(folder: Path, forgotten_hashes: set[str]) -> list[str]:
    """Problems of one shard folder: a forgotten row in the plan, a missing checkpoint, or a checkpoint not
    trained on exactly the plan's rows of its (shard, slice) (trained before a deletion and never rewritten)."""
    found = read_plan(folder)
    if found is None:
        return []
    plan, aggregate = found
    problems = []
    held = sorted(set(map(str, plan.sample_ids)) & forgotten_hashes)
    if held:
        problems.append(f"{folder / PLAN}: {len(held)} forgotten row(s) still in the shard plan")
    state = ShardState(plan, torch.empty(0), torch.empty(0), {}, aggregate)
    for k in range(plan.shards):
        for r in range(plan.slices):
            f = folder / checkpoint_name(k, r)
            if not f.exists():
                problems.append(f"{f}: missing")
                continue
            digest = load_checkpoint(f).get("extra", {}).get("rows_digest")
            if digest != state.checkpoint_digest(k, r):
                problems.append(f"{f}: trained on other rows than the plan's shard {k} slices 0..{r} (a checkpoint "
                                f"from before a deletion)")
    return problems


def replace_original_shards(paths: ProjectPaths) -> str | None:
    """models/shards/ := the champion's state/shards/ (after an erasure: no checkpoint trained on a forgotten row
    stays among the train stage's outputs). None when there is nothing to replace."""
    src, dst = state_shards(paths), original_shards(paths)
    if not (src / PLAN).exists():
        return None
    from unlearning.io import commit_dir, staging_dir

    stage = staging_dir(dst)
    shutil.rmtree(stage)
    shutil.copytree(src, stage)
    commit_dir(stage, dst)
    return str(dst)


def sisa_share(state, rows) -> float | None:
    """The share of a full retrain (of every shard) that `sisa` retrains for this batch's forget rows; None when
    the champion is not sharded (the planner then refuses or skips `sisa`)."""
    st = getattr(state.model, "shard_state", None)
    if st is None:
        return None
    from unlearning.sharding import affected, cost_in_retrains

    ids = state.prepared.manifest["sample_id"].astype(str).to_numpy()[rows.forget]
    return cost_in_retrains(st.plan, affected(st.plan, st.plan.positions([id_hash(i, st.salt) for i in ids])))
