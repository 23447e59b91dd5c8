"""What a model or a state was built from: a fingerprint of (dataset, model spec, training recipe).

The train stage records it in `models/original.pt`, every state write in `state/champion.json`, every
ledger entry its digest. `tasks.state.load_state` compares the recorded fingerprint with the one of the
current params + prepared folder and raises `StateMismatch` (listing what changed) when they differ, so a
state is never continued with a model, a dataset or a recipe it was not built from.

Pure: standard library only (the prepared folder is read with `json` and `csv`).

Components (each `{"digest": ..., "value": ...}`):
- `dataset`: the prepared dataset's identity, from `dataset.json` without volatile keys (timestamps,
  durations) and without one-hot category values or, for your own data, class names (counts instead: any value
  may later belong only to erased rows, and this identity outlives an erasure in the state, the original's
  checkpoint and `erasure.identity`), plus `manifest_digest`, a digest of the sorted (sample_id, split, label)
  rows of its manifest;
- `model`: `params.train.model.model_dump()`;
- `recipe`: every other key of `params.train` (`model_dump(exclude={"model"})`, so keys added later count
  too) plus `seed` (`base.seed`: the original is trained with it).

It takes those slices (`train`, `seed`, and the project `root` a custom model's factory is found under), not
the whole params.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # annotations only: the core module stays standard library at run time
    from unlearning.config import Train

COMPONENTS = ("dataset", "model", "recipe")

# dataset.json keys that change on every prepare run without changing the data.
_VOLATILE = re.compile(r"(^|_)(at|time|timestamp|date|datetime|seconds|duration|elapsed|host|hostname)$")

RESET_HINT = ("`unlearn reset` archives the state (the ledger of applied erasures is kept in the archive) and "
              "starts over from the current params; or restore the previous params")
RETRAIN_HINT = ("re-run the train stage for the current params (`dvc repro`, or `unlearn prepare` and "
                "`unlearn train`; `dvc repro -f train` when only your model file changed and dvc.yaml does not "
                "list it under the train stage's deps); or restore the previous params")


class StateMismatch(ValueError):
    """The state (or the trained original) was built from another dataset, model or recipe than the
    current params describe."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any) -> str:
    """sha256 hex (16 chars) of the canonical JSON of `value`: independent of dict key order."""
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:16]


def manifest_digest(sample_ids: Iterable, splits: Iterable | None = None, labels: Iterable | None = None) -> str:
    """Digest of the manifest's rows (sample_id, and split/label when given), independent of row order."""
    ids = [str(s) for s in sample_ids]
    cols = [ids] + [[str(v) for v in c] for c in (splits, labels) if c is not None]
    rows = sorted("\t".join(r) for r in zip(*cols))
    if len(rows) != len(ids):
        raise ValueError("manifest columns have different lengths")
    return digest(rows)


def _without_volatile(d: dict) -> dict:
    return {k: _without_volatile(v) if isinstance(v, dict) else v for k, v in d.items()
            if not _VOLATILE.search(str(k).lower())}


# the class names of your own data are its label values (or class folders): an erasure may rename them too
_CLASS_NAME_KEYS = ("class_names", "fine_class_names")


def _without_category_values(value: dict) -> dict:
    """The identity's `preprocessing` with each one-hot column's count of categories for its values, and no
    `feature_names` (which spell them out); for your own data (a `source`), the count of class names for the
    names. The identity recorded before an erasure must still match after it, when the values only forgotten
    rows had are gone from dataset.json (`<erased k>`): so it holds none. Also turns an identity recorded with
    values (before this rule) into today's form. Idempotent."""
    if "source" in value:
        value = {**value, **{k: len(value[k]) for k in _CLASS_NAME_KEYS if isinstance(value.get(k), list)}}
    prep = value.get("preprocessing")
    if not isinstance(prep, dict) or not isinstance(prep.get("categories"), dict):
        return value
    counts = {col: len(v) if isinstance(v, list) else v for col, v in prep["categories"].items()}
    prep = {k: v for k, v in prep.items() if k != "feature_names"}
    return {**value, "preprocessing": {**prep, "categories": counts}}


def dataset_identity(info: dict, sample_ids: Iterable, splits: Iterable | None = None,
                     labels: Iterable | None = None) -> dict:
    """The `dataset` component's value from `dataset.json`'s content and the manifest columns. A store with
    erased rows records the identity it had before the erasure (`erasure.identity`): erasing rows does not
    make the state "built from other data"."""
    if isinstance(info.get("erasure"), dict) and info["erasure"].get("identity"):
        return _without_category_values(info["erasure"]["identity"])
    # feature_types: how the served champion types its raw input (a column's dtype, not its data)
    value = _without_category_values(_without_volatile({k: v for k, v in info.items() if k != "feature_types"}))
    value["manifest_digest"] = manifest_digest(sample_ids, splits, labels)
    return value


def read_dataset_identity(prepared_dir: str | Path) -> dict:
    """`dataset_identity` of a prepared folder (dataset.json + manifest.csv), read with the stdlib."""
    folder = Path(prepared_dir)
    for name in ("dataset.json", "manifest.csv"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name} not found: run the prepare stage first "
                                    f"(`dvc repro prepare` or `unlearn prepare`)")
    info = json.loads((folder / "dataset.json").read_text())
    with open(folder / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cols = rows[0].keys() if rows else ()
    return dataset_identity(info, [r["sample_id"] for r in rows],
                            [r["split"] for r in rows] if "split" in cols else None,
                            [r["label"] for r in rows] if "label" in cols else None)


def _as_plain(value: Any) -> Any:
    """JSON-plain copy (tuples -> lists, paths -> str) so a recorded value compares equal after a reload."""
    return json.loads(_canonical(value))


def fingerprint(dataset: dict, model: dict, recipe: dict) -> dict:
    """`{"digest": ..., "components": {name: {"digest": ..., "value": ...}}}`."""
    components = {name: {"digest": digest(v), "value": _as_plain(v)}
                  for name, v in (("dataset", dataset), ("model", model), ("recipe", recipe))}
    return {"digest": digest({n: c["digest"] for n, c in components.items()}), "components": components}


def factory_source_digest(factory: str | None, search_paths: Iterable[str | Path] = ()) -> str | None:
    """Digest of the source file of a custom model factory's module (`"module.path:callable"`), so that
    editing the team's model file counts as a model change; None when it cannot be located."""
    if not factory or ":" not in factory:
        return None
    import importlib.util
    import sys

    paths = [str(Path(p).resolve()) for p in search_paths]
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        spec = importlib.util.find_spec(factory.split(":")[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        for p in added:
            sys.path.remove(p)
    origin = getattr(spec, "origin", None)
    if not origin or not Path(origin).is_file():
        return None
    return hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:16]


def params_fingerprint(train: Train, seed: int, root: str | Path, dataset: dict) -> dict:
    """The fingerprint of the params' slices it is of and a `dataset_identity`: `train` (the validated
    `params.train`: its model and every other key, the recipe), `seed` (`base.seed`) and `root` (the project
    folder, where a custom model's factory module is looked up). A custom factory's module source counts as
    part of the model (`factory_source`)."""
    recipe = {**train.model_dump(mode="json", exclude={"model"}), "seed": seed}
    model = train.model.model_dump(mode="json")
    if model.get("arch") == "custom":
        model["factory_source"] = factory_source_digest(model.get("factory"), [root])
    return fingerprint(dataset, model, recipe)


def prepared_fingerprint(train: Train, seed: int, root: str | Path, info: dict, manifest) -> dict:
    """The fingerprint of the current params' slices (`params_fingerprint`) and a prepared dataset (its
    dataset.json content and its manifest frame, with sample_id, split and label columns)."""
    dataset = dataset_identity(info, manifest["sample_id"].tolist(), manifest["split"].tolist(),
                               manifest["label"].tolist())
    return params_fingerprint(train, seed, root, dataset)


def _current_form(recorded: dict | None) -> dict | None:
    """A recorded fingerprint whose dataset identity still holds category values (recorded before identities
    left them out) as it reads today: the same data then still matches, and a mismatch report does not print
    the values. Digests are recomputed from the recorded value; other fingerprints come back as they are."""
    component = ((recorded or {}).get("components") or {}).get("dataset")
    if not isinstance(component, dict) or not isinstance(component.get("value"), dict):
        return recorded
    value = _without_category_values(component["value"])
    if value == component["value"]:
        return recorded
    components = {**recorded["components"], "dataset": {"digest": digest(value), "value": value}}
    return {**recorded, "digest": digest({n: c.get("digest") for n, c in components.items()}),
            "components": components}


def matches(recorded: dict | None, current: dict) -> bool:
    recorded = _current_form(recorded)
    return bool(recorded) and recorded.get("digest") == current.get("digest")


def _flat(value: Any, prefix: str = "") -> dict:
    """Nested dicts as {"a.b": leaf}; an empty dict has no leaves (kwargs {} then {width: 4} reads as one key
    added, "kwargs.width was (absent), now 4", not as kwargs itself gone)."""
    if isinstance(value, dict) and not value and prefix:
        return {}
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "(value)": value}


def _show(v: Any, width: int = 80) -> str:
    s = "(absent)" if v is _ABSENT else json.dumps(v, default=str)
    return s if len(s) <= width else s[: width - 3] + "..."


_ABSENT = object()


def describe_mismatch(recorded: dict | None, current: dict) -> list[str]:
    """Human lines: each component that changed, with the recorded and current values of the keys that
    differ (`recipe: epochs was 30, now 5`). Empty when the fingerprints match."""
    if matches(recorded, current):
        return []
    recorded = _current_form(recorded)
    rec = (recorded or {}).get("components") or {}
    cur = current.get("components") or {}
    lines = []
    for name in [*COMPONENTS, *sorted((set(rec) | set(cur)) - set(COMPONENTS))]:
        r, c = rec.get(name), cur.get(name)
        if r is None and c is None:
            continue
        if r is None:
            lines.append(f"{name}: not recorded before")
            continue
        if c is None:
            lines.append(f"{name}: recorded but not computed now")
            continue
        if r.get("digest") == c.get("digest"):
            continue
        rf, cf = _flat(r.get("value")), _flat(c.get("value"))
        diffs = [k for k in sorted(set(rf) | set(cf)) if rf.get(k, _ABSENT) != cf.get(k, _ABSENT)]
        if not diffs:
            lines.append(f"{name}: changed (digest {r.get('digest')} -> {c.get('digest')})")
        for k in diffs:
            lines.append(f"{name}: {k} was {_show(rf.get(k, _ABSENT))}, now {_show(cf.get(k, _ABSENT))}")
    if not lines:
        lines.append(f"fingerprint changed ({(recorded or {}).get('digest')} -> {current.get('digest')})")
    return lines


def mismatch_error(what: str, recorded: dict | None, current: dict, hint: str = RESET_HINT,
                   lines: list[str] | None = None) -> StateMismatch:
    """A `StateMismatch` whose message names `what`, lists the changes and says how to go on."""
    changes = lines if lines is not None else describe_mismatch(recorded, current)
    return StateMismatch(f"{what} was built from other params or data than the current ones: "
                         + "; ".join(changes) + f". To go on: {hint}")
