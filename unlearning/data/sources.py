"""Your own data: a table (CSV or Parquet) or a folder of images, as a `Dataset` with stable ids.

- `table`: one row per sample. The id column gives the sample ids (as strings), the label column the classes
  (any dtype; class names = the sorted unique values as strings; label index = position in that list).
  Non-numeric feature columns (object/string/category/bool) are one-hot encoded (`col=value`, categories
  sorted, fitted on all rows); numeric ones are standardized with the mean/std of the training rows. The
  fitted `preprocessing` is recorded in dataset.json and re-applied by `apply_preprocessing`.
- `image_folder`: `<root>/<class>/<image>` (seeded stratified split) or `<root>/train|val/<class>/<image>`;
  the id is the path relative to `<root>` without its suffix. Images are converted to L or RGB, resized
  (bilinear), scaled to [0, 1] and flattened channel-first.

Neither loader skips anything silently: missing values, bad split values, duplicate ids and files that
are not images are errors that name the rows or files and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from unlearning.data.registry import DataError, Dataset, DatasetMissing, stratified_split, subsample_splits

TABLE_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SPLITS = ("train", "val")
SHOW = 5  # rows / values named in an error message
MAX_CATEGORIES = 100  # distinct values of a text feature column above which one-hot encoding is refused


def _first(items: Sequence, n: int = SHOW) -> str:
    items = list(items)
    shown = ", ".join(repr(i) if isinstance(i, str) else str(i) for i in items[:n])
    return shown + (f", ... ({len(items)} in all)" if len(items) > n else "")


def _labels(fine: np.ndarray, fine_names: list[str], group: np.ndarray, targets: str):
    """Training target: the class (targets fine) or the group (targets super)."""
    if targets == "super":
        names = sorted(set(group.tolist()))
        index = {g: i for i, g in enumerate(names)}
        return np.array([index[g] for g in group], dtype=np.int64), names
    return fine, list(fine_names)


# ----------------------------------------------------------------------------------------------- tables
def read_table(path: str | Path, id_column: str | None = None) -> pd.DataFrame:
    """A CSV or Parquet file (by suffix) as a DataFrame; the id column of a CSV is read as text."""
    path = Path(path)
    fmt = TABLE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"prepare.table.path = '{path}': prepare.dataset 'table' reads {sorted(TABLE_FORMATS)} files "
                         f"(by suffix), not '{path.suffix or path.name}'; convert the table or point prepare.table.path "
                         f"at a .csv or .parquet file")
    if not path.is_file():
        raise DatasetMissing(f"prepare.table.path = '{path}': no such file (relative paths start at the folder of "
                             f"params.yaml); point prepare.table.path at your .csv or .parquet table")
    try:
        if fmt == "csv":
            return pd.read_csv(path, dtype={id_column: str} if id_column else None)
        return pd.read_parquet(path)
    except ImportError as e:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow ({e})") from e
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(f"prepare.table.path = '{path}': not a readable {fmt} table: {e}") from e


def _integral(s: pd.Series) -> pd.Series:
    """Float columns holding whole numbers (a CSV integer column that had gaps) become int64."""
    if pd.api.types.is_float_dtype(s) and len(s) and np.isfinite(s).all() and (s % 1 == 0).all():
        return s.astype(np.int64)
    return s


def is_categorical(s: pd.Series) -> bool:
    return pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s)


def fit_preprocessing(df: pd.DataFrame, columns: list[str], train_mask: np.ndarray) -> dict:
    """One-hot categories from all rows of `df` (stable whatever the split or subsample), mean/std (std 0 -> 1)
    from the rows in `train_mask` only."""
    categories, means, stds = {}, {}, {}
    for col in columns:
        s = df[col]
        if is_categorical(s):
            categories[col] = sorted(set(s.map(str)))
        else:
            x = s.to_numpy(dtype=np.float64)[train_mask]
            mean, std = float(x.mean()), float(x.std())
            means[col], stds[col] = mean, (std if std > 0 and np.isfinite(std) else 1.0)
    names = [n for col in columns
             for n in ([f"{col}={v}" for v in categories[col]] if col in categories else [col])]
    return {"columns": list(columns), "feature_names": names, "means": means, "stds": stds,
            "categories": categories}


def apply_preprocessing(df: pd.DataFrame, preprocessing: dict) -> np.ndarray:
    """The fitted preprocessing (dataset.json `preprocessing`) applied to rows of a table: [n, d] float32."""
    missing = [c for c in preprocessing["columns"] if c not in df.columns]
    if missing:
        raise DataError(f"the table lacks the feature columns {missing} of the preprocessing")
    blocks = []
    for col in preprocessing["columns"]:
        s = df[col]
        if col in preprocessing["categories"]:
            cats = preprocessing["categories"][col]
            values = s.map(str).to_numpy()
            unknown = sorted(set(values.tolist()) - set(cats))
            if unknown:
                raise DataError(f"column {col!r}: values {_first(unknown)} are not among the fitted categories "
                                 f"{_first(cats, 20)}")
            blocks.append((values[:, None] == np.asarray(cats, dtype=object)[None, :]).astype(np.float64))
        else:
            x = s.to_numpy(dtype=np.float64)
            blocks.append(((x - preprocessing["means"][col]) / preprocessing["stds"][col])[:, None])
    return np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=np.float32)


def _describe_rows(ids: pd.Series, mask: np.ndarray) -> str:
    pos = np.flatnonzero(mask)
    shown = [f"row {i} (no id)" if pd.isna(ids.iloc[i]) else repr(str(ids.iloc[i])) for i in pos[:SHOW]]
    return ", ".join(shown) + (f", ... ({len(pos)} rows in all)" if len(pos) > SHOW else f" ({len(pos)} rows)")


def _columns(df: pd.DataFrame, path: Path, id_column: str, label_column: str, group_column, split_column,
             feature_columns) -> list[str]:
    available = [str(c) for c in df.columns]
    roles = {"id_column": id_column, "label_column": label_column, "group_column": group_column,
             "split_column": split_column}
    for key, col in roles.items():
        if col is not None and col not in df.columns:
            raise DataError(f"prepare.table.{key} = {col!r}: {path.name} has no such column; its columns: {available}")
    used = [c for c in roles.values() if c is not None]
    if len(set(used)) < len(used):
        raise DataError(f"prepare.table: id_column, label_column, group_column and split_column must be different "
                         f"columns, got {roles}")
    if feature_columns is None:
        features = [c for c in df.columns if c not in used]
    else:
        features = list(feature_columns)
        unknown = [c for c in features if c not in df.columns]
        if unknown:
            raise DataError(f"prepare.table.feature_columns: {unknown} are not columns of {path.name}; "
                             f"its columns: {available}")
        clash = [c for c in features if c in used]
        if clash:
            raise DataError(f"prepare.table.feature_columns = {features}: {clash} is also the id, label, group or "
                             f"split column; remove it from feature_columns")
        if len(set(features)) < len(features):
            raise DataError(f"prepare.table.feature_columns = {features} lists a column twice")
    if not features:
        raise DataError(f"prepare.table: {path.name} has no feature columns besides {used}; "
                         f"add columns or set prepare.table.feature_columns")
    return features


def load_table(path: str | Path, id_column: str, label_column: str, group_column: str | None = None,
               feature_columns: Sequence[str] | None = None, split_column: str | None = None,
               missing: str = "error", seed: int = 0, val_fraction: float = 0.2, max_train=None, max_val=None,
               targets: str = "fine", **_) -> Dataset:
    path = Path(path)
    df = read_table(path, id_column)
    n_rows = len(df)
    features = _columns(df, path, id_column, label_column, group_column, split_column, feature_columns)
    used = [c for c in (id_column, label_column, group_column, split_column) if c is not None] + features

    na = df[used].isna()
    bad = na.any(axis=1).to_numpy()
    if bad.any():
        if missing != "drop":
            cols = [c for c in used if na[c].any()]
            raise DataError(f"{path.name}: rows with missing values: {_describe_rows(df[id_column], bad)}; in "
                             f"columns {cols}. Fill them, or set prepare.table.missing: drop to drop these rows")
        df = df.loc[~bad].reset_index(drop=True)
    if df.empty:
        raise DataError(f"{path.name}: no rows left (of {n_rows}) after dropping rows with missing values")

    ids = df[id_column].map(str)
    empty = (ids.str.strip() == "").to_numpy()
    if empty.any():
        raise DataError(f"prepare.table.id_column = {id_column!r}: empty ids in rows {_first(np.flatnonzero(empty))} "
                         f"(0-based data rows); every row needs a unique, non-empty id")
    dup = ids[ids.duplicated(keep=False)]
    if len(dup):
        counts = dup.value_counts(sort=False)
        raise DataError(f"prepare.table.id_column = {id_column!r}: duplicate ids "
                         f"{_first([f'{i} (x{n})' for i, n in counts.items()])}; ids must be unique")
    for col in features:
        s = df[col]
        _check_feature_column(path, col, s, len(df))
        if not is_categorical(s) and not np.isfinite(s.to_numpy(dtype=np.float64)).all():
            rows = ~np.isfinite(s.to_numpy(dtype=np.float64))
            raise DataError(f"{path.name}: column {col!r} has infinite values in rows {_describe_rows(ids, rows)}; "
                             f"replace them with finite numbers")

    raw_labels = _integral(df[label_column])
    uniq = list(pd.unique(raw_labels))
    try:
        ordered = sorted(uniq)
    except TypeError:  # mixed types: order by text
        ordered = sorted(uniq, key=str)
    fine_names = [str(v) for v in ordered]
    if len(set(fine_names)) < len(fine_names):
        raise DataError(f"prepare.table.label_column = {label_column!r}: labels {fine_names} collide as text")
    _check_labels(label_column, raw_labels, fine_names)
    index = {n: i for i, n in enumerate(fine_names)}
    fine = raw_labels.map(str).map(index).to_numpy(dtype=np.int64)
    group = (_integral(df[group_column]).map(str).to_numpy(dtype=object) if group_column
             else np.array([fine_names[c] for c in fine], dtype=object))

    rng = np.random.default_rng(seed)
    ids_arr = ids.to_numpy(dtype=object)
    if split_column:
        split = df[split_column].map(str).to_numpy(dtype=object)
        wrong = ~np.isin(split, SPLITS)
        if wrong.any():
            raise DataError(f"prepare.table.split_column = {split_column!r}: values must be exactly 'train' or 'val'; "
                             f"found {_first(sorted(set(split[wrong].tolist())))} in rows "
                             f"{_describe_rows(ids, wrong)}")
        if not (split == "train").any():
            raise DataError(f"prepare.table.split_column = {split_column!r}: no row is 'train'")
    else:
        split = stratified_split(fine, val_fraction, rng, ids=ids_arr)
    if not (split == "val").any():
        raise DataError(f"{path.name}: the validation split is empty ({len(df)} rows, {len(fine_names)} classes, "
                         f"val_fraction {val_fraction}); the gate needs validation rows: raise prepare.val_fraction "
                         f"or give a prepare.table.split_column with some 'val' rows")
    keep = subsample_splits(split, max_train, max_val, rng)
    train_rows = np.zeros(len(df), dtype=bool)
    train_rows[keep[split[keep] == "train"]] = True
    prep = fit_preprocessing(df, features, train_rows)
    X = apply_preprocessing(df.iloc[keep], prep)
    split = split[keep].astype(str)
    label, class_names = _labels(fine[keep], fine_names, group[keep], targets)
    source = {"type": "table", "path": str(path), "format": TABLE_FORMATS[path.suffix.lower()],
              "id_column": id_column, "label_column": label_column, "group_column": group_column,
              "split_column": split_column, "missing": missing, "n_rows": int(n_rows)}
    return Dataset(
        name="table", X=X, label=label, fine_label=fine[keep], sample_id=ids_arr[keep], split=split,
        group=group[keep], class_names=class_names, fine_class_names=fine_names, image_shape=None,
        in_shape=(X.shape[1],),
        meta={"source": source, "targets": targets, "n_dropped_missing": int(bad.sum()), "preprocessing": prep})


def _check_feature_column(path: Path, col: str, s: pd.Series, n_rows: int) -> None:
    """Refuse feature columns that one-hot encoding would silently turn into noise: dates and free text."""
    if pd.api.types.is_datetime64_any_dtype(s) or pd.api.types.is_timedelta64_dtype(s):
        raise DataError(f"{path.name}: feature column {col!r} holds dates/times ({s.dtype}); convert it to numbers "
                         f"(e.g. days since a reference date) or leave it out of prepare.table.feature_columns")
    if is_categorical(s) and not pd.api.types.is_bool_dtype(s):
        distinct = int(s.map(str).nunique())
        if distinct > MAX_CATEGORIES or (distinct > 10 and distinct > 0.5 * n_rows):
            raise DataError(f"{path.name}: text feature column {col!r} has {distinct} distinct values in {n_rows} "
                             f"rows (e.g. {_first(s.map(str).unique()[:3].tolist(), 3)}); one-hot encoding it would "
                             f"add {distinct} features that identify rows rather than describe them. Leave it out "
                             f"of prepare.table.feature_columns (or encode it as numbers yourself); at most "
                             f"{MAX_CATEGORIES} categories are one-hot encoded")


def _check_labels(label_column: str, raw: pd.Series, names: list[str]) -> None:
    """A classifier needs at least two classes, and labels that are classes rather than measurements."""
    if len(names) < 2:
        raise DataError(f"prepare.table.label_column = {label_column!r}: every row has the label {names[0]!r}; a "
                         f"classifier needs at least two classes")
    if pd.api.types.is_float_dtype(raw) and not (raw % 1 == 0).all():
        raise DataError(f"prepare.table.label_column = {label_column!r} holds non-integer numbers (e.g. "
                         f"{_first(raw.unique()[:3].tolist(), 3)}): this pipeline trains classifiers; bin the "
                         f"target into classes first")
    if len(names) > MAX_CATEGORIES and len(names) > 0.5 * len(raw):
        raise DataError(f"prepare.table.label_column = {label_column!r} has {len(names)} distinct values in "
                         f"{len(raw)} rows: that is an id or a measurement, not a class label")


# ----------------------------------------------------------------------------------------------- images
def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def scan_image_folder(root: str | Path) -> tuple[str, list[tuple[Path, str | None, str]]]:
    """(layout, [(file, split or None, class)]) in path order; raises naming every entry that is not an
    image in the expected layout (hidden files and folders, starting with '.', are ignored)."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetMissing(f"prepare.image_folder.path = '{root}': no such folder (relative paths start at the folder of "
                             f"params.yaml); prepare.dataset 'image_folder' reads <path>/<class>/<image> or "
                             f"<path>/train|val/<class>/<image>")
    top = _visible(root)
    names = {p.name for p in top if p.is_dir()}
    if names and names <= set(SPLITS):
        if "train" not in names:
            raise DataError(f"prepare.image_folder.path = '{root}': has val/ but no train/ folder")
        layout, bases = "split_folders", [(p.name, p) for p in top if p.is_dir()]
    elif names & set(SPLITS):
        raise DataError(f"prepare.image_folder.path = '{root}': mixes split folders {sorted(names & set(SPLITS))} with class "
                         f"folders {sorted(names - set(SPLITS))}; use <path>/<class>/<image> or "
                         f"<path>/train|val/<class>/<image>")
    else:
        layout, bases = "class_folders", [(None, root)]
    problems, entries = [], []
    problems += [f"{p.relative_to(root).as_posix()} (not inside a class folder)" for p in top if not p.is_dir()]
    for split, base in bases:
        for cdir in _visible(base):
            if not cdir.is_dir():
                if base is not root:
                    problems.append(f"{cdir.relative_to(root).as_posix()} (not inside a class folder)")
                continue
            for f in _visible(cdir):
                rel = f.relative_to(root).as_posix()
                if f.is_dir():
                    problems.append(f"{rel}/ (a folder inside a class folder)")
                elif f.suffix.lower() not in IMAGE_SUFFIXES:
                    problems.append(f"{rel} (not a {'/'.join(IMAGE_SUFFIXES)} file)")
                else:
                    entries.append((f, split, cdir.name))
    if problems:
        raise DataError(f"prepare.image_folder.path = '{root}': {len(problems)} entries are not images in the layout "
                         f"<class>/<image> ({', '.join(IMAGE_SUFFIXES)}, any case): {_first(problems, 10)}; move or "
                         f"delete them (hidden files starting with '.' are ignored)")
    if not entries:
        raise DataError(f"prepare.image_folder.path = '{root}': no images found; expected <path>/<class>/<image> or "
                         f"<path>/train|val/<class>/<image>")
    return layout, entries


def _image_size(image_size) -> tuple[int, int]:
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) <= 0:
        raise DataError(f"prepare.image_folder.image_size = {image_size!r}: give [height, width] or one int > 0")
    return size


def read_images(files: Sequence[Path], image_size, grayscale: bool = True, root: Path | None = None) -> np.ndarray:
    """[n, C*H*W] float32 in [0, 1]: L or RGB, bilinear resize to (H, W), channel-first, row-major."""
    from PIL import Image, UnidentifiedImageError  # lazy: only image folders need Pillow

    h, w = _image_size(image_size)
    c = 1 if grayscale else 3
    bilinear = getattr(Image, "Resampling", Image).BILINEAR
    X = np.empty((len(files), c * h * w), dtype=np.float32)
    bad = []
    for j, f in enumerate(files):
        try:
            with Image.open(f) as im:
                a = np.asarray(im.convert("L" if grayscale else "RGB").resize((w, h), bilinear), dtype=np.float32)
        except (UnidentifiedImageError, OSError, ValueError) as e:
            bad.append(f"{f.relative_to(root).as_posix() if root else f} ({e})")
            continue
        X[j] = (a if grayscale else a.transpose(2, 0, 1)).reshape(-1) / 255.0
    if bad:
        raise DataError(f"{len(bad)} images could not be read: {_first(bad)}; replace or delete them")
    return X


def load_image_folder(path: str | Path, image_size=28, grayscale: bool = True, groups: dict | None = None,
                      seed: int = 0, val_fraction: float = 0.2, max_train=None, max_val=None,
                      targets: str = "fine", **_) -> Dataset:
    root = Path(path)
    size = _image_size(image_size)
    layout, entries = scan_image_folder(root)
    files = [f for f, _, _ in entries]
    ids = np.array([f.relative_to(root).with_suffix("").as_posix() for f in files], dtype=object)
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        shared = set(uniq[counts > 1].tolist())
        dups = [f.relative_to(root).as_posix() for f, i in zip(files, ids) if i in shared]
        raise DataError(f"prepare.image_folder.path = '{root}': files {_first(dups)} share an id (the path without its "
                         f"suffix); rename one of each pair")
    fine_names = sorted({c for _, _, c in entries})
    if groups is not None:
        unmapped = [c for c in fine_names if c not in groups]
        unknown = sorted(set(groups) - set(fine_names))
        if unmapped or unknown:
            raise DataError(f"prepare.image_folder.groups: "
                             + (f"classes {unmapped} have no group; " if unmapped else "")
                             + (f"{unknown} are not class folders; " if unknown else "")
                             + f"map every class folder of {fine_names} to a group (or set groups: null)")
    index = {c: i for i, c in enumerate(fine_names)}
    fine = np.array([index[c] for _, _, c in entries], dtype=np.int64)
    group = np.array([groups[c] if groups is not None else c for _, _, c in entries], dtype=object)
    rng = np.random.default_rng(seed)
    if layout == "split_folders":
        split = np.array([s for _, s, _ in entries], dtype=object)
    else:
        split = stratified_split(fine, val_fraction, rng, ids=ids)
    keep = subsample_splits(split, max_train, max_val, rng)
    X = read_images([files[i] for i in keep], size, grayscale, root=root)
    label, class_names = _labels(fine[keep], fine_names, group[keep], targets)
    channels = 1 if grayscale else 3
    source = {"type": "image_folder", "path": str(root), "layout": layout, "image_size": list(size),
              "grayscale": bool(grayscale), "groups": groups, "n_files": len(files)}
    return Dataset(
        name="image_folder", X=X, label=label, fine_label=fine[keep], sample_id=ids[keep],
        split=split[keep].astype(str), group=group[keep], class_names=class_names, fine_class_names=fine_names,
        image_shape=size, in_shape=(channels, *size), meta={"source": source, "targets": targets})
