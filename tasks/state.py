"""The pipeline's live state (a DVC output): production model, live manifest, ledger, champion info.

state/model.pt, state/manifest.csv, state/ledger.jsonl, state/champion.json. A batch writes a complete
new state into a staging folder and swaps it in at the end (all or nothing).

The state is bound to what it was built from (unlearning/privacy/fingerprint.py): champion.json records the
fingerprint of (dataset, model spec, recipe), and `load_state` refuses (`StateMismatch`) to continue a
state, or to start one from `models/original.pt`, that was built from other params or data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from prefect import task

from adapters.clock import computes
from tasks.id_key import IdKey
from tasks.retry import transient_io_only

from unlearning.config import ModelCfg, Params, ProjectPaths, Train
from unlearning.data import initial_state_manifest, load_prepared, read_state_manifest
from unlearning.data.store import Prepared, manifest_csv_bytes
from unlearning.privacy.erasure import clean_of_tombstones, read_tombstones, tombstones_digest
from unlearning.privacy.fingerprint import (
    RESET_HINT, RETRAIN_HINT, StateMismatch, matches, mismatch_error, prepared_fingerprint,
)
from unlearning.io import (
    RESTORE_HINT, StateCorrupt, atomic_save, atomic_write_bytes, atomic_write_json, atomic_write_text, load_checkpoint,
    read_json_file, recover_dir,
)
from unlearning.privacy.ledger import ledger_text, read_ledger
from unlearning.models import load_model, save_model
from unlearning.privacy.salt import remove_state_copy

if TYPE_CHECKING:
    from unlearning.models import Ensemble

ORIGINAL = "original.pt"


@dataclass
class State:
    prepared: Prepared
    model: Ensemble
    manifest: pd.DataFrame
    ledger: list[dict]
    champion: dict
    fingerprint: dict  # of the current params + prepared folder (equal to the recorded one, once checked)


@dataclass(frozen=True)
class StateSettings:
    """What reading, checking and starting the state reads of the params (docs/design.md: a stage takes its
    slice of the params or a small frozen settings record built once by the caller): the project's folders
    (state/, the prepared dataset, models/original.pt), `train` and `base.seed` (the fingerprint's model and
    recipe, unlearning/privacy/fingerprint.py; `train.model` for a checkpoint from before fingerprints) and how
    ids are keyed (a sharded champion's plan, tasks/sharding.py attach_state)."""

    paths: ProjectPaths  # base.paths; its root is where a custom model's factory is found (the fingerprint)
    train: Train
    seed: int  # base.seed
    key: IdKey

    # Builds the slice record from the whole params, its one job.
    @classmethod
    def of(cls, params: Params) -> "StateSettings":
        return cls(params.project_paths, params.train, params.base.seed, IdKey.of(params))


def original_path(paths: ProjectPaths) -> Path:
    return paths.path("models_dir") / ORIGINAL


def current_fingerprint(settings: StateSettings, prepared: Prepared) -> dict:
    """The fingerprint of the current params and the prepared dataset (see unlearning/privacy/fingerprint.py)."""
    return prepared_fingerprint(settings.train, settings.seed, settings.paths.root, prepared.info, prepared.manifest)


def _checkpoint(path: Path) -> dict:
    return load_checkpoint(path)


def _spec_differences(saved: dict | None, model: ModelCfg, prepared: Prepared) -> list[str]:
    """For checkpoints written before fingerprints: differences between the saved architecture spec and the
    one the current params build (train.model `model` for this data), on the keys both have. Empty when nothing
    can be told."""
    if not isinstance(saved, dict):
        return []
    try:
        from tasks.training import model_spec

        now = model_spec(model, prepared)
        try:  # compare canonical forms (legacy flat specs included) where the models package offers them
            from unlearning.models import normalize_spec

            now, saved = normalize_spec(now), normalize_spec(saved)
        except Exception:
            pass
        now, saved = json.loads(json.dumps(now, default=str)), json.loads(json.dumps(saved, default=str))
    except Exception:  # the spec cannot be computed or compared: cannot tell
        return []
    # The input shape is left out: its encoding changed over versions (in_dim vs in_shape) and the dataset
    # check covers the data; the architecture choice is what can be told here.
    keys = (set(saved) & set(now)) - {"in_shape", "in_dim", "image_shape", "feature_layer"}
    return [f"model: {k} was {json.dumps(saved[k])}, now {json.dumps(now[k])}" for k in sorted(keys)
            if saved[k] != now[k]]


def check_original(paths: ProjectPaths, model: ModelCfg, prepared: Prepared, current: dict,
                   extra: dict | None = None) -> None:
    """Raise StateMismatch when models/original.pt was trained from other params or data than the current
    ones (params changed but the train stage not re-run). `current`: their fingerprint (current_fingerprint);
    `model`: train.model."""
    path = original_path(paths)
    if extra is None:
        extra = _checkpoint(path).get("extra", {})
    recorded = extra.get("fingerprint")
    if recorded is not None:
        if not matches(recorded, current):
            raise mismatch_error(str(path), recorded, current, RETRAIN_HINT)
        return
    # A checkpoint from before fingerprints: only its architecture spec can be compared.
    lines = _spec_differences(extra.get("spec"), model, prepared)
    if lines:
        raise mismatch_error(str(path), None, current, RETRAIN_HINT, lines)


def _original_hint(paths: ProjectPaths, model: ModelCfg, prepared: Prepared, current: dict) -> str:
    """An addition to the reset hint when models/original.pt does not match the current params either."""
    path = original_path(paths)
    if not path.exists():
        return f"; then run the train stage (`dvc repro` or `unlearn train`): {path} is missing"
    try:
        check_original(paths, model, prepared, current)
    except StateMismatch:
        return (f"; {path} does not match the current params either: after the reset, re-run the train stage "
                f"(`dvc repro` or `unlearn train`)")
    return ""


def check_state(paths: ProjectPaths, model: ModelCfg, prepared: Prepared, champion: dict,
                model_spec_saved: dict | None, manifest: pd.DataFrame, current: dict) -> None:
    """Raise StateMismatch when the state folder was built from other params or data than the current ones
    (`current`: their fingerprint; `model`: train.model)."""
    state_dir = paths.path("state_dir")
    recorded = champion.get("fingerprint")
    if recorded is not None:
        if not matches(recorded, current):
            raise mismatch_error(str(state_dir), recorded, current,
                                 RESET_HINT + _original_hint(paths, model, prepared, current))
        return
    # A state written before fingerprints. It is a mismatch only where that can be told: its manifest holds
    # other samples than the prepared dataset, or its model has another architecture than the params
    # build. The recipe cannot be told; such a state is accepted, and the next state write records the
    # current fingerprint (write_state).
    lines = []
    state_ids, prepared_ids = set(manifest["sample_id"]), set(prepared.manifest["sample_id"])
    if state_ids != prepared_ids:
        lines.append(f"dataset: the state's manifest has {len(state_ids - prepared_ids)} sample(s) not in "
                     f"{paths.path('prepared_dir')} and lacks {len(prepared_ids - state_ids)} of its samples")
    lines += _spec_differences(model_spec_saved, model, prepared)
    if lines:
        raise mismatch_error(str(state_dir), None, current,
                             RESET_HINT + _original_hint(paths, model, prepared, current), lines)


def stale_unbatched_state(settings: StateSettings, prepared: Prepared | None = None,
                          current: dict | None = None) -> bool:
    """Whether state/ holds no batch (an empty ledger, the champion still the original a first run copied in),
    was built from other params or data than the current ones, and models/original.pt matches the current
    ones: the model or data changed before any deletion and the train stage re-ran. Such a state has nothing
    to keep (no erasure, no unlearned model), so it follows the retrained original instead of failing with a
    mismatch (and the registry alias with it)."""
    paths = settings.paths
    state_dir = paths.path("state_dir")
    if not (state_dir / "model.pt").exists() or read_ledger(state_dir / "ledger.jsonl"):
        return False
    champion = read_json_file(state_dir / "champion.json")
    if champion.get("method") != "original" or champion.get("batch_id") is not None:
        return False
    if prepared is None and not (paths.path("prepared_dir") / "dataset.json").exists():
        return False  # nothing prepared to compare with: the next prepare decides
    prepared = prepared or load_prepared(paths.path("prepared_dir"))
    current = current or current_fingerprint(settings, prepared)
    if matches(champion.get("fingerprint") or {}, current):
        return False
    try:
        check_original(paths, settings.train.model, prepared, current)
    except (FileNotFoundError, StateMismatch):
        return False
    return True


def check_original_is_erased(paths: ProjectPaths, extra: dict) -> str:
    """Refuse to start a state from a models/original.pt that was trained on rows erased since (after `unlearn
    reset` with an erasure still pending, models/original.pt is the model the erased rows were forgotten FROM):
    the fresh state would hold them again and the tombstones would keep them from ever being requested.
    Returns the digest of the tombstones the original is clean of (champion.json's `started_clean_of`)."""
    tombstones = read_tombstones(paths.path("tombstones"))
    if not clean_of_tombstones(extra, tombstones):
        raise StateMismatch(
            f"{original_path(paths)} was trained before rows that are erased now ({len(tombstones)} tombstoned "
            f"id(s) in {paths.path('tombstones')}): a state started from it would hold them again. To go on: "
            f"`unlearn erase` when state/ still holds the champion (it replaces the original with it); otherwise "
            f"(after `unlearn reset`) retrain the original without them: `dvc repro -f prepare` (prepare leaves "
            f"tombstoned rows out, train follows), or `unlearn prepare && unlearn train`")
    return tombstones_digest(tombstones)


def check_state_complete(state_dir: Path) -> None:
    """StateCorrupt when state/ holds some of its files but not the model: a state is written whole (staging
    folder, then swap), so a missing model.pt beside champion.json or a ledger is damage (a half copy, a hand
    edit). Taken as "no state yet", it was rebuilt from the original silently: the champion history lost its
    batches and verify-erasure then failed."""
    if (state_dir / "model.pt").exists():
        return
    present = [n for n in ("champion.json", "ledger.jsonl", "manifest.csv") if (state_dir / n).exists()]
    if present:
        raise StateCorrupt(f"{state_dir / 'model.pt'}: missing, while {state_dir} holds {present}; "
                           f"{RESTORE_HINT.replace('restore it', 'restore the state')}")


# Retries: transient IO only (tasks/retry.py); a StateMismatch or a missing original fails at once.
@task(name="load-state", retries=2, retry_delay_seconds=[1, 3], retry_condition_fn=transient_io_only)
@computes
def load_state(settings: StateSettings, device: str) -> State:
    """Read the state folder; on the first batch, start from the trained original and the prepared manifest.

    Raises StateMismatch when the state (or, on the first batch, the original) was built from other params
    or data than the current ones."""
    paths = settings.paths
    state_dir = paths.path("state_dir")
    recover_dir(state_dir)
    check_state_complete(state_dir)
    prepared = load_prepared(paths.path("prepared_dir"))
    current = current_fingerprint(settings, prepared)
    # Checked before a model is built: a changed architecture fails with what changed, not a load error.
    if (state_dir / "model.pt").exists() and not stale_unbatched_state(settings, prepared, current):
        manifest = read_state_manifest(state_dir / "manifest.csv")
        champion = read_json_file(state_dir / "champion.json")
        saved_spec = None if "fingerprint" in champion else _checkpoint(state_dir / "model.pt").get("spec")
        check_state(paths, settings.train.model, prepared, champion, saved_spec, manifest, current)
        model, _ = load_model(state_dir / "model.pt", device)
        from_original = False
    else:
        if not original_path(paths).exists():
            raise FileNotFoundError(f"{original_path(paths)} not found: run the train stage first "
                                    f"(`dvc repro train` or `python -m flows.train`)")
        ckpt = _checkpoint(original_path(paths))
        check_original(paths, settings.train.model, prepared, current,
                       {"spec": ckpt.get("spec"), **ckpt.get("extra", {})})
        clean_of = check_original_is_erased(paths, ckpt.get("extra", {}))
        model, extra = load_model(original_path(paths), device)
        from_original = True  # state/shards/, if any, is a former state's: the original's are in models/shards/
        manifest = initial_state_manifest(prepared.manifest)
        champion = {"model_version": extra.get("model_version"), "method": "original", "batch_id": None,
                    "started_clean_of": clean_of,
                    **({"tracking_store": extra["tracking_store"]} if extra.get("tracking_store") else {})}
    from tasks.sharding import attach_state

    # a sharded champion: its plan and slice checkpoints (the original's, when the state starts from it now)
    model = attach_state(paths, settings.key, prepared, model, device, from_original=from_original)
    return State(prepared=prepared, model=model, manifest=manifest, ledger=read_ledger(state_dir / "ledger.jsonl"),
                 champion=champion, fingerprint=current)


def write_state(folder: Path, model: Ensemble, manifest: pd.DataFrame, ledger: list[dict], champion: dict,
                fingerprint: dict | None = None) -> None:
    """Write a complete state; champion.json (and model.pt's extra) record the fingerprint it was built from
    (`fingerprint`, or champion["fingerprint"]): a state without one could not be checked later."""
    fingerprint = fingerprint or champion.get("fingerprint")
    if not fingerprint:
        raise ValueError("write_state needs the fingerprint the state was built from (State.fingerprint)")
    champion = {**champion, "fingerprint": fingerprint}
    folder.mkdir(parents=True, exist_ok=True)
    # the store the version is registered in travels with the model (the erasure makes it models/original.pt)
    extra = {"model_version": champion.get("model_version"), "fingerprint": fingerprint,
             **({"tracking_store": champion["tracking_store"]} if champion.get("tracking_store") else {})}
    atomic_save(folder / "model.pt", lambda tmp: save_model(model, tmp, extra))
    if getattr(model, "shard_state", None) is not None:  # a sharded champion: its plan and every slice checkpoint
        from tasks.sharding import write_into

        write_into(folder / "shards", model.shard_state)
    elif (folder / "shards").exists():  # a former sharded champion's, copied into the staging folder: not this one's
        import shutil

        shutil.rmtree(folder / "shards")
    atomic_write_bytes(folder / "manifest.csv", manifest_csv_bytes(manifest))
    atomic_write_text(folder / "ledger.jsonl", ledger_text(ledger))
    atomic_write_json(folder / "champion.json", champion)


def ensure_state(settings: StateSettings, device: str) -> bool:
    """Create the state folder from the trained original when it does not exist yet (an empty inbox on the
    first run), or when it holds no batch and the original was retrained since (`stale_unbatched_state`): the
    state is the deletion stage's DVC output, and `unlearn status` reads it. Returns True when it wrote one.
    All or nothing, like a batch (staging folder, then swap)."""
    from unlearning.io import commit_dir, discard_dir, staging_dir

    state_dir = settings.paths.path("state_dir")
    recover_dir(state_dir)
    check_state_complete(state_dir)
    if (state_dir / "model.pt").exists() and not stale_unbatched_state(settings):
        return False
    state = load_state.fn(settings, device)  # the trained original (also for a stale state that holds no batch)
    stage = staging_dir(state_dir)
    try:
        write_state(stage, state.model, state.manifest, state.ledger, state.champion, state.fingerprint)
        remove_state_copy(stage)  # the state is backed up by DVC: never with the id key (unlearning/privacy/salt.py)
        commit_dir(stage, state_dir)
    except BaseException:
        discard_dir(stage)
        raise
    return True


def original_version_if_current(settings: StateSettings) -> str | None:
    """The registry version of models/original.pt when it matches the current params and prepared data
    (the model a fresh state starts from), else None."""
    path = original_path(settings.paths)
    try:
        prepared = load_prepared(settings.paths.path("prepared_dir"))
        extra = _checkpoint(path).get("extra", {})
        check_original(settings.paths, settings.train.model, prepared, current_fingerprint(settings, prepared),
                       extra)
    except (FileNotFoundError, StateMismatch):
        return None
    version = extra.get("model_version")
    return str(version) if version is not None else None


def _unique_dir(parent: Path, name: str) -> Path:
    out, n = parent / name, 1
    while out.exists():
        n += 1
        out = parent / f"{name}-{n}"
    return out


def batch_lock(paths: ProjectPaths, timeout: float, say_waiting: bool = True):
    """The one lock of a project's state (state/ and what a batch writes beside it): a batch, `unlearn erase`
    and `unlearn reset` hold it, so none of them runs under another."""
    from unlearning.io import exclusive_lock

    state_dir = paths.path("state_dir")
    return exclusive_lock(state_dir.with_name(f".{state_dir.name}.lock"), timeout, say_waiting=say_waiting)


def archive_state(paths: ProjectPaths, now=None, lock_timeout: float = 10.0) -> dict:
    """`unlearn reset`: move the state folder and the ensemble cache to archive/<UTC time>/ (under the batch
    lock, so never under a running batch). Nothing is deleted: the ledger of applied erasures stays in the
    archive. Returns what was moved and the archived ledger's size."""
    import shutil
    from datetime import datetime, timezone

    now = now or datetime.now(timezone.utc)
    state_dir, cache_dir = paths.path("state_dir"), paths.path("cache_dir")
    with batch_lock(paths, lock_timeout):
        recover_dir(state_dir)
        sources = [(n, p) for n, p in (("state", state_dir), ("cache", cache_dir)) if p.exists()]
        ledger = read_ledger(state_dir / "ledger.jsonl")
        champion_file = state_dir / "champion.json"
        champion = read_json_file(champion_file) if champion_file.exists() else None
        if not sources:
            return {"archive": None, "moved": {}, "ledger": ledger, "ledger_path": None, "champion": None}
        dest = _unique_dir(paths.path("archive_dir"), now.strftime("%Y%m%dT%H%M%SZ"))
        dest.mkdir(parents=True)
        moved = {}
        for name, src in sources:
            shutil.move(str(src), str(dest / src.name))
            moved[name] = (src, dest / src.name)
        atomic_write_json(dest / "reset.json", {
            "archived_at": now.isoformat(), "moved": {n: str(d) for n, (_, d) in moved.items()},
            "ledger_entries": len(ledger), "champion": champion})
    ledger_path = dest / state_dir.name / "ledger.jsonl" if "state" in moved else None
    return {"archive": dest, "moved": moved, "ledger": ledger, "ledger_path": ledger_path, "champion": champion}
