"""The prepared dataset on disk (a DVC output) and the manifest table.

Files in the prepared folder: `features.npy` (X [n, d] float32, C-contiguous, opened memory-mapped and
read-only), `labels.npy` (label [n] int64), `manifest.csv` (sample_id, split, label, group, class_name) and
`dataset.json` (name, class names, `in_shape`, `n_features`, `image_shape`, `source`, and for tables the fitted
`preprocessing`). Folders written before the .npy format (`features.npz`) are still read.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pandera.errors
import pandera.pandas as pa

from unlearning.data.registry import DataError, Dataset
from unlearning.data.sources import erase_categories, erased_in_place
from unlearning.io import StateCorrupt, atomic_save, atomic_write_json

MANIFEST_SCHEMA = pa.DataFrameSchema(
    {
        "sample_id": pa.Column(str, unique=True, nullable=False),
        "split": pa.Column(str, pa.Check.isin(["train", "val"])),
        "label": pa.Column(int, pa.Check.ge(0)),
        "group": pa.Column(str, nullable=False),
        "class_name": pa.Column(str, nullable=False),
    },
    strict=True, coerce=True, name="manifest",
)

# The live manifest in the state folder adds the deletion status of every sample.
STATE_MANIFEST_SCHEMA = MANIFEST_SCHEMA.add_columns({
    "status": pa.Column(str, pa.Check.isin(["retained", "deleted"])),
    "deleted_in_batch": pa.Column(str, nullable=True),
})


# The text columns of a manifest CSV, read as written: a sample id 'NA' or a group '01' is a value, not a gap
# or the number 1 (pandas' default reading would make it NaN or 1, and the schema's coercion then 'nan' / '1').
_TEXT = {"sample_id": str, "split": str, "group": str, "class_name": str}


def _read_manifest_csv(path, **extra) -> pd.DataFrame:
    return pd.read_csv(path, dtype={**_TEXT, **extra}, keep_default_na=False)


def manifest_of(ds: Dataset) -> pd.DataFrame:
    df = pd.DataFrame({"sample_id": ds.sample_id.astype(str), "split": ds.split, "label": ds.label,
                       "group": ds.group.astype(str), "class_name": [ds.fine_class_names[c] for c in ds.fine_label]})
    return MANIFEST_SCHEMA.validate(df)


def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp):  # a file object: np.save would append ".npy" to the temporary name
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)

    atomic_save(path, write)


def _info(ds: Dataset) -> dict:
    return {"name": ds.name, "class_names": ds.class_names, "fine_class_names": ds.fine_class_names,
            "image_shape": list(ds.image_shape) if ds.image_shape else None, "in_shape": list(ds.in_shape),
            "n_features": int(ds.X.shape[1]), "n_samples": int(len(ds.label)),
            "n_train": int((ds.split == "train").sum()), "n_val": int((ds.split == "val").sum()), **ds.meta}


def _write_arrays(folder: Path, X: np.ndarray, label: np.ndarray, manifest: pd.DataFrame, info: dict) -> None:
    _save_npy(folder / "features.npy", np.ascontiguousarray(X, dtype=np.float32))
    _save_npy(folder / "labels.npy", np.ascontiguousarray(label, dtype=np.int64))
    (folder / "features.npz").unlink(missing_ok=True)  # the old format, never read beside the new one
    atomic_save(folder / "manifest.csv", lambda tmp: manifest.to_csv(tmp, index=False))
    atomic_write_json(folder / "dataset.json", info)


def _held(names: list[str], values: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, dropped) [len(names)]: whether a kept / a dropped row has each name (values [n]: row -> index)."""
    kept, dropped = np.zeros(len(names), dtype=bool), np.zeros(len(names), dtype=bool)
    kept[np.unique(values[keep])] = True
    dropped[np.unique(values[~keep])] = True
    return kept, dropped


def erased_class_names(info: dict, manifest: pd.DataFrame, keep: np.ndarray) -> dict:
    """`class_names` and `fine_class_names` of a store of your own data (info with a `source`: a table's label
    values, an image folder's class folders) once the `manifest` rows outside `keep` [n] are dropped: a class that
    only dropped rows had (a one-row class, a person's name as the label) is renamed `<erased k>` in place, as an
    erased one-hot category is (erase_categories): the output width and every kept row's label stay. The built-in
    datasets' class names are their fixed vocabulary, not values of rows: unchanged."""
    names = {k: list(info[k]) for k in ("class_names", "fine_class_names") if isinstance(info.get(k), list)}
    if "source" not in info or not names:
        return names
    keep = np.asarray(keep, dtype=bool)
    out = {}
    if "class_names" in names:
        labels = manifest["label"].to_numpy(dtype=np.int64)
        out["class_names"] = erased_in_place(names["class_names"], *_held(names["class_names"], labels, keep))
    if "fine_class_names" in names and "class_name" in manifest.columns:
        fine = names["fine_class_names"]
        index = {c: i for i, c in enumerate(fine)}
        rows = manifest["class_name"].map(index)
        known = rows.notna().to_numpy()  # every row's class is a fine name; a row that is not counts for none
        out["fine_class_names"] = erased_in_place(fine, *_held(fine, rows[known].to_numpy(dtype=np.int64),
                                                               keep[known]))
    return {**names, **out}


def class_names_after(info: dict, manifest: pd.DataFrame, keep: np.ndarray) -> list[str]:
    """The model's output names once the rows outside `keep` are erased (`erased_class_names`): what a batch's
    champion is registered with, so that the registry holds no class name the erasure removes."""
    return erased_class_names(info, manifest, keep).get("class_names", list(info.get("class_names", [])))


def erased_info(info: dict, manifest: pd.DataFrame, keep: np.ndarray, X: np.ndarray) -> dict:
    """dataset.json after dropping rows (X [n, d]: the features of the `manifest` rows; `keep` [n]): counts of
    what is left, one-hot categories and class names that only dropped rows had renamed `<erased k>` in place
    (their raw values must not outlive the rows: `erase_categories`, `erased_class_names`), and under `erasure`
    the dataset identity of the store before
    any erasure (so the state fingerprint survives an erasure; it holds no category values, see fingerprint.py).
    The prepare stage (write_prepared) and an erasure (rewrite_without) both come here: they write the same."""
    from unlearning.privacy.fingerprint import dataset_identity

    identity = dataset_identity(info, manifest["sample_id"].tolist(), manifest["split"].tolist(),
                                manifest["label"].tolist())
    kept = manifest[keep]
    before = int(info.get("erasure", {}).get("n_erased", 0))
    out = {k: v for k, v in info.items() if k != "erasure"}
    out.update(n_samples=int(len(kept)), n_train=int((kept["split"] == "train").sum()),
               n_val=int((kept["split"] == "val").sum()))
    if isinstance(out.get("preprocessing"), dict):
        out["preprocessing"] = erase_categories(out["preprocessing"], X, keep)
    out.update(erased_class_names(out, manifest, keep))
    out["erasure"] = {"identity": identity, "n_erased": before + int((~keep).sum())}
    return out


def _check_finite(ds: Dataset) -> None:
    """The last guard before features.npy: a NaN or inf feature trains a NaN model without another word. The
    loaders name the column and rows first (unlearning/data/sources.py); this names the feature."""
    if ds.X.size == 0 or (np.isfinite(ds.X.min()) and np.isfinite(ds.X.max())):  # NaN propagates: no mask needed
        return
    finite = np.isfinite(ds.X)
    cols = np.flatnonzero(~finite.all(axis=0))
    names = ds.meta.get("preprocessing", {}).get("feature_names") or []
    shown = [names[c] if c < len(names) else f"feature {c}" for c in cols[:5]]
    raise DataError(f"dataset {ds.name!r}: {int((~finite).any(axis=1).sum())} rows have NaN or infinite features "
                    f"in {shown}{' and more' if len(cols) > 5 else ''}; nothing was written. Rescale or drop "
                    f"those columns (prepare.table.feature_columns) or fix the rows")


def write_prepared(ds: Dataset, folder: str | Path, erased=None) -> dict:
    """Write the prepared store. `erased`: a predicate on sample ids (the tombstones): those rows are left
    out, so a re-run of prepare never brings erased rows back (docs/design.md §3, "Erasure vs the DVC DAG")."""
    folder = Path(folder)
    _check_finite(ds)
    manifest = manifest_of(ds)
    info = _info(ds)
    X, label = ds.X, ds.label
    if erased is not None:
        keep = ~manifest["sample_id"].map(erased).to_numpy(dtype=bool)
        if not keep.all():
            info = erased_info(info, manifest, keep, ds.X)
            X, label = ds.X[keep], ds.label[keep]
            manifest = manifest[keep].reset_index(drop=True)
    _write_arrays(folder, X, label, manifest, info)
    return info


def rewrite_without(folder: str | Path, dest: str | Path, erased) -> int:
    """Copy the prepared store at `folder` into `dest` without the rows whose id satisfies `erased`;
    returns how many rows were dropped (0: nothing written)."""
    p = load_prepared(folder)
    keep = ~p.manifest["sample_id"].map(erased).to_numpy(dtype=bool)
    if keep.all():
        return 0
    info = erased_info(p.info, p.manifest, keep, p.X)
    _write_arrays(Path(dest), np.asarray(p.X)[keep], np.asarray(p.label)[keep],
                  p.manifest[keep].reset_index(drop=True), info)
    return int((~keep).sum())


@dataclass
class Prepared:
    """The prepared dataset loaded back: rows of X align with the manifest rows."""

    X: np.ndarray
    label: np.ndarray
    manifest: pd.DataFrame
    info: dict

    @property
    def n_classes(self) -> int:
        return len(self.info["class_names"])

    @property
    def in_shape(self) -> list[int]:
        """Shape of one sample before flattening; folders from before `in_shape` derive it."""
        if self.info.get("in_shape"):
            return [int(s) for s in self.info["in_shape"]]
        shape = self.info.get("image_shape")
        return [1, *map(int, shape)] if shape else [int(self.X.shape[1])]

    def tensor(self, rows=None):
        """X (or X[rows]) as a float32 torch tensor in memory: a writable copy of the read-only memory map
        (torch.as_tensor on the map itself would warn about a non-writable array)."""
        import torch

        X = np.array(self.X, dtype=np.float32) if rows is None else np.asarray(self.X[rows], dtype=np.float32)
        return torch.from_numpy(X if X.flags.writeable else X.copy())

    def rows(self, sample_ids) -> np.ndarray:
        """Row positions of the given sample ids (KeyError naming the first unknown id)."""
        pos = pd.Index(self.manifest["sample_id"]).get_indexer(pd.Index(list(sample_ids)))
        if (pos < 0).any():
            raise KeyError(f"sample_id {list(sample_ids)[int(np.flatnonzero(pos < 0)[0])]!r} is not in the manifest")
        return pos


PREPARED_RESTORE = ("restore it with `dvc checkout data/prepared` (the last store DVC recorded), or prepare it again "
                    "(`dvc repro -f prepare`)")


def load_prepared(folder: str | Path) -> Prepared:
    """X is memory-mapped read-only (opening does not read the features); use `Prepared.tensor` for torch.
    A damaged store (a truncated array, an edited manifest or dataset.json, files of different lengths) is
    StateCorrupt: one line naming the file and how to restore it."""
    folder = Path(folder)
    try:
        prepared = _load_prepared(folder)
    except FileNotFoundError:
        raise
    except (pandera.errors.SchemaError, pandera.errors.SchemaErrors) as e:
        raise StateCorrupt(f"{folder}: the prepared store is damaged (manifest.csv does not match the manifest "
                           f"schema: {_schema_failures(e)}); {PREPARED_RESTORE}") from None
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise StateCorrupt(f"{folder}: the prepared store is damaged ({type(e).__name__}: {first}); "
                           f"{PREPARED_RESTORE}") from None
    lengths = {"features": len(prepared.X), "labels": len(prepared.label), "manifest.csv": len(prepared.manifest)}
    if len(set(lengths.values())) > 1:
        raise StateCorrupt(f"{folder}: the prepared store is damaged (its files have different row counts: "
                           f"{lengths}); {PREPARED_RESTORE}")
    return prepared


def _schema_failures(e: Exception, shown: int = 3) -> str:
    """The first failure cases of a pandera error, on one line: "column: check (value)"."""
    cases = getattr(e, "failure_cases", None)
    if isinstance(e, pandera.errors.SchemaError) or not isinstance(cases, pd.DataFrame) or not len(cases):
        first = (str(e).splitlines() or [type(e).__name__])[0]  # "Column 'split' failed ... failure cases: x, y"
        return first if len(first) <= 240 else first[:240] + "..."
    parts = [f"{r.get('column')}: {r.get('check')} ({r.get('failure_case')!r})" for r in cases.head(shown).to_dict("records")]
    more = f"; {len(cases) - shown} more" if len(cases) > shown else ""
    return "; ".join(parts) + more


def _load_prepared(folder: Path) -> Prepared:
    if (folder / "features.npy").exists():
        X = np.load(folder / "features.npy", mmap_mode="r", allow_pickle=False)
        label = np.load(folder / "labels.npy", allow_pickle=False)
    elif (folder / "features.npz").exists():  # written before the memory-mapped format
        with np.load(folder / "features.npz") as z:
            X, label = z["X"], z["label"]
    else:
        raise FileNotFoundError(f"{folder}/features.npy not found: run the prepare stage first "
                                f"(`dvc repro prepare` or `python -m flows.prepare`)")
    manifest = MANIFEST_SCHEMA.validate(_read_manifest_csv(folder / "manifest.csv"))
    return Prepared(X=X, label=label, manifest=manifest, info=json.loads((folder / "dataset.json").read_text()))


def initial_state_manifest(manifest: pd.DataFrame) -> pd.DataFrame:
    df = manifest.copy()
    df["status"] = "retained"
    df["deleted_in_batch"] = None
    return STATE_MANIFEST_SCHEMA.validate(df)


def read_state_manifest(path: str | Path) -> pd.DataFrame:
    """state/manifest.csv, validated; StateCorrupt (one line, how to restore it) when it cannot be read."""
    from unlearning.io import RESTORE_HINT, StateCorrupt

    try:
        df = _read_manifest_csv(path, deleted_in_batch=str)
        df["deleted_in_batch"] = df["deleted_in_batch"].replace("", None)
        return STATE_MANIFEST_SCHEMA.validate(df)
    except (pa.errors.SchemaError, pa.errors.SchemaErrors, pd.errors.ParserError, pd.errors.EmptyDataError, KeyError,
            UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StateCorrupt(f"{path}: not a valid state manifest ({first[:200]}); {RESTORE_HINT}") from None


def manifest_csv_bytes(df: pd.DataFrame) -> bytes:
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return buf.getvalue().encode()
