"""Your own data: a table (CSV or Parquet) or a folder of images, as a `Dataset` with stable ids.

- `table`: one row per sample. The id column gives the sample ids (as strings), the label column the classes
  (any dtype; class names = the unique values as text, in numeric order when every one is a whole number,
  else sorted as text; label index = position in that list). The id, label, group and split columns of a
  CSV are read as text: '01' and '1' are two classes, an id or class 'NA' is a value, not a gap.
  Non-numeric feature columns (object/string/category/bool) are one-hot encoded (`col=value`, categories
  sorted, fitted on all rows); numeric ones are standardized with the mean/std of the training rows. The
  fitted `preprocessing` is recorded in dataset.json and re-applied by `apply_preprocessing`. A category that
  only erased rows had is a raw value of theirs: the store keeps its one-hot column (all zeros, the input
  width stays) under the placeholder `<erased k>` (`erase_categories`), which no value ever matches.
- `image_folder`: `<root>/<class>/<image>` (seeded stratified split) or `<root>/train|val/<class>/<image>`;
  the id is the path relative to `<root>` without its suffix. Images are converted to L or RGB (a transparent
  pixel becomes black, see `_flatten_alpha`), resized (bilinear), scaled to [0, 1] and flattened channel-first.

Missing values in a CSV: an empty cell; and, in a column whose other values are all numbers (or all
booleans), pandas' missing-value markers (`NA`, `null`, `None`, `N/A`, `nan`, ...). In text columns those
markers are values (Namibia's code is 'NA'): only an empty cell is missing there.

Neither loader skips anything silently: missing values, bad split values, duplicate or padded ids, an index
column written with the rows, features that do not fit float32, and files that are not images are errors
that name the rows or files and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from unlearning.data.dataset import DataError, Dataset, DatasetMissing, stratified_split, subsample_splits
from unlearning.privacy.ids import CONTROL_CHARACTERS

TABLE_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SPLITS = ("train", "val")
SHOW = 5  # rows / values named in an error message
MAX_CATEGORIES = 100  # distinct values of a text feature column above which one-hot encoding is refused
# pandas' default missing-value markers (read_csv `na_values`, less the empty cell): missing only in number
# and boolean columns, see `read_table`.
NA_MARKERS = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                        "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
# The rule of request files (unlearning/requests.py): an id holding one of these can never be requested.
# A whole number in pandas' float format ('3.0'): how an integer column with gaps is written by df.to_csv.
_WHOLE_FLOAT = r"-?(?:0|[1-9][0-9]*)\.0+"
# The name of a one-hot category whose rows are all erased: k numbers the erased values of its column (1-based,
# in category order). Not a hash of the value: a hash of a short string is reversed by guessing.
ERASED_CATEGORY = "<erased {}>"
_ERASED_CATEGORY = re.compile(r"<erased [0-9]+>")


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
def read_table(path: str | Path, text_columns: str | Sequence[str | None] = ()) -> pd.DataFrame:
    """A CSV or Parquet file (by suffix) as a DataFrame.

    CSV: `text_columns` (the id, label, group and split columns) are read as text, so '007' and '7' stay two
    values. An empty cell is missing; pandas' markers (`NA_MARKERS`: 'NA', 'null', 'None', 'N/A', 'nan', ...)
    are missing only in a column whose other values are all numbers or all booleans, where they can mean
    nothing else; anywhere else they are text ('NA' is Namibia, North America, a class). A UTF-8 byte order
    mark (Excel's "CSV UTF-8") is skipped. Parquet columns keep their stored types and nulls."""
    path = Path(path)
    text = [c for c in ([text_columns] if isinstance(text_columns, str) else text_columns) if c is not None]
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
            return _read_csv(path, text)
        return _decimals_as_numbers(pd.read_parquet(path), set(text))
    except ImportError as e:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow ({e})") from e
    except UnicodeDecodeError as e:
        raise DataError(f"prepare.table.path = '{path}': not UTF-8 text ({e.reason} at byte {e.start}); save the "
                         f"table as UTF-8 (\"CSV UTF-8\" in a spreadsheet)") from None
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(f"prepare.table.path = '{path}': not a readable {fmt} table: {e}") from e


def _read_csv(path: Path, text_columns: list[str]) -> pd.DataFrame:
    # keep_default_na=False: pandas would otherwise read the id 'NA' or the class 'None' as a gap. utf-8-sig
    # skips Excel's byte order mark (pandas' utf-8 does too; said here so flows/scaffold.py reads alike).
    df = pd.read_csv(path, dtype={c: str for c in text_columns}, keep_default_na=False, na_values=[""],
                     encoding="utf-8-sig")
    return _markers_as_missing(path, df, set(text_columns))


def _markers_as_missing(path: Path, df: pd.DataFrame, text_columns: set[str]) -> pd.DataFrame:
    """Columns that are numbers (or booleans) but for markers such as 'NA' or 'null' are re-read with pandas'
    default markers, so they stay numbers with gaps (what prepare read before markers became text in text
    columns). Only the columns holding a marker are read again: a table without any costs nothing more."""
    candidates = [i for i, c in enumerate(df.columns)
                  if c not in text_columns and not pd.api.types.is_numeric_dtype(df[c])
                  and df[c].isin(NA_MARKERS).any()]
    if not candidates:
        return df
    default = pd.read_csv(path, usecols=candidates, encoding="utf-8-sig")  # by position: safe with odd names
    df = df.copy()
    for i in candidates:
        s = default.iloc[:, candidates.index(i)]
        values = s.dropna()
        numbers = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
        booleans = len(values) > 0 and values.map(lambda v: isinstance(v, (bool, np.bool_))).all()
        if (numbers and len(values) > 0) or booleans:
            df[df.columns[i]] = s.to_numpy()
    return df


def _decimals_as_numbers(df: pd.DataFrame, text_columns: set[str]) -> pd.DataFrame:
    """Parquet decimal columns (a database's NUMERIC/DECIMAL, e.g. money) arrive as Python `Decimal` objects in
    an object column; they are numbers, not categories: as float64 they are standardized like any number
    column (a CSV of the same table reads them as numbers too). Text columns (id, label, group, split) stay."""
    import decimal

    out = None
    for col in df.columns:
        s = df[col]
        if col in text_columns or s.dtype != object:
            continue
        values = s.dropna()
        if len(values) and values.map(lambda v: isinstance(v, decimal.Decimal)).all():
            out = df.copy() if out is None else out
            out[col] = s.astype(np.float64)
    return df if out is None else out


def _integral(s: pd.Series) -> pd.Series:
    """Float columns holding whole numbers (a CSV integer column that had gaps) become int64."""
    if pd.api.types.is_float_dtype(s) and len(s) and np.isfinite(s).all() and (s % 1 == 0).all():
        return s.astype(np.int64)
    return s


def is_categorical(s: pd.Series) -> bool:
    return pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s)


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    """Mean and (population) std in float64. Values beyond ~1e154 overflow the squares of the plain formula;
    those columns are measured in units of their largest magnitude instead (the plain formula stays first,
    so ordinary columns keep the exact statistics that earlier prepares recorded)."""
    if x.size == 0:
        return 0.0, 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = float(x.mean()), float(x.std())
    if not (np.isfinite(mean) and np.isfinite(std)):
        scale = float(np.abs(x).max())
        y = x / scale
        mean, std = scale * float(y.mean()), scale * float(y.std())
    return mean, std


def _standardize(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    """(x - mean) / std in float64; where x - mean overflows (values near the float64 limit) the same quotient
    is taken in scaled units. A result still out of range stays inf for `_check_finite` to name."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = (x - mean) / std
    redo = ~np.isfinite(z) & np.isfinite(x)
    if redo.any():
        scale = max(abs(mean), std, float(np.abs(x[redo]).max()))
        with np.errstate(over="ignore", invalid="ignore"):
            z[redo] = (x[redo] / scale - mean / scale) / (std / scale)
    return z


def feature_types(df: pd.DataFrame, columns: Sequence[str]) -> dict[str, str]:
    """Each feature column's type as a served model's signature names it (MLflow's names): `long` for an integer
    column, `double` for another number column, `boolean`, or `string` for a text (one-hot) column. Recorded in
    dataset.json (`feature_types`, not part of the dataset's identity: unlearning/privacy/fingerprint.py) for the served
    champion (unlearning/data/preparation.py), which checks raw rows against it."""
    types = {}
    for col in columns:
        s = df[col]
        if pd.api.types.is_bool_dtype(s) or (s.dtype == object and len(s) and
                                             s.map(lambda v: isinstance(v, (bool, np.bool_))).all()):
            types[col] = "boolean"
        elif is_categorical(s):
            types[col] = "string"
        else:
            types[col] = "long" if pd.api.types.is_integer_dtype(s) else "double"
    return types


def fit_preprocessing(df: pd.DataFrame, columns: list[str], train_mask: np.ndarray) -> dict:
    """One-hot categories from all rows of `df` (stable whatever the split or subsample), mean/std (std 0 -> 1)
    from the rows in `train_mask` only. Rows erased later still count here (the raw table holds them): the
    store renames the categories only they had (`erase_categories`); the means and stds stay as fitted."""
    categories, means, stds = {}, {}, {}
    for col in columns:
        s = df[col]
        if is_categorical(s):
            categories[col] = sorted(set(s.map(str)))
        else:
            mean, std = _mean_std(s.to_numpy(dtype=np.float64)[train_mask])
            means[col], stds[col] = mean, (std if std > 0 and np.isfinite(std) else 1.0)
    return {"columns": list(columns), "feature_names": _feature_names(columns, categories), "means": means,
            "stds": stds, "categories": categories}


def _feature_names(columns: Sequence[str], categories: dict) -> list[str]:
    """One name per feature column, in the order of the feature matrix: `col=value` per category, else `col`."""
    return [n for col in columns
            for n in ([f"{col}={v}" for v in categories[col]] if col in categories else [col])]


def is_erased_category(value: str) -> bool:
    """Whether a category name is the placeholder of a value that only erased rows had."""
    return bool(_ERASED_CATEGORY.fullmatch(value))


def erase_categories(preprocessing: dict, X: np.ndarray, keep: np.ndarray) -> dict:
    """`preprocessing` (dataset.json's) once the rows outside `keep` are dropped from the features X [n, d] it
    produced: every one-hot category that a dropped row has and no kept row has is renamed `<erased k>` in place,
    and so are the placeholders of earlier erasures (k: the position among the erased values of the column).
    Such a value is a raw value of forgotten rows; in place, the feature columns (the model's input width) stay,
    all zeros for every kept row as before. Read off X alone, so the store rewritten at an erasure and a fresh
    prepare of the raw table with the same tombstones name the same placeholders."""
    if not preprocessing.get("categories"):
        return preprocessing
    held = np.asarray(X) != 0  # [n, d]: which one-hot feature each row has
    kept, dropped = held[keep].any(axis=0), held[~keep].any(axis=0)  # [d] each
    categories, start = {}, 0
    for col in preprocessing["columns"]:
        cats = preprocessing["categories"].get(col)
        if cats is None:  # a numeric column: one feature
            start += 1
            continue
        end = start + len(cats)
        categories[col] = erased_in_place(cats, kept[start:end], dropped[start:end])
        start = end
    if start != held.shape[1]:
        raise DataError(f"the features have {held.shape[1]} columns, the preprocessing describes {start}; the "
                        f"prepared store is inconsistent: re-run the prepare stage")
    return {**preprocessing, "categories": categories,
            "feature_names": _feature_names(preprocessing["columns"], categories)}


def erased_in_place(cats: list[str], kept: np.ndarray, dropped: np.ndarray) -> list[str]:
    """The categories of one column (or the class names of a dataset) with those only dropped rows had (kept,
    dropped [len(cats)]: does a kept / dropped row have it), and earlier placeholders, renumbered as
    `<erased 1>`, `<erased 2>`, ... in their places."""
    erased = [is_erased_category(c) or bool(d and not k) for c, k, d in zip(cats, kept, dropped)]
    number = np.cumsum(erased)
    return [ERASED_CATEGORY.format(n) if e else c for c, e, n in zip(cats, erased, number.tolist())]


def apply_preprocessing(df: pd.DataFrame, preprocessing: dict, ids: Sequence | None = None,
                        show_values: bool = True) -> np.ndarray:
    """The fitted preprocessing (dataset.json `preprocessing`) applied to rows of a table: [n, d] float32.
    Raises DataError naming the column and rows (by `ids`, else by position) when a feature is not a finite
    float32: training on it would give a NaN model. `show_values` False (serving raw rows): the errors quote no
    value of the rows, only their positions."""
    missing = [c for c in preprocessing["columns"] if c not in df.columns]
    if missing:
        raise DataError(f"the table lacks the feature columns {missing} of the preprocessing")
    blocks, numeric = [], {}  # numeric: column -> its position in the feature matrix
    width = 0
    for col in preprocessing["columns"]:
        s = df[col]
        if col in preprocessing["categories"]:
            cats = preprocessing["categories"][col]
            # An erased value (and its placeholder's text) is unknown like any value never seen: its column stays 0.
            known = [None if is_erased_category(c) else c for c in cats]
            values = s.map(str).to_numpy()
            unknown = sorted(set(values.tolist()) - set(known))
            if unknown and not show_values:
                rows = ~np.isin(values, np.asarray([c for c in known if c is not None], dtype=object))
                raise DataError(f"column {col!r}: rows {positions(rows)} hold "
                                f"{len(unknown)} value(s) that are not among the fitted categories "
                                f"{_first([c for c in known if c is not None], 20)}; the model has no feature for a "
                                f"value it never saw: map each to one of these, or add rows with it to the table "
                                f"and prepare and train again")
            if unknown:
                raise DataError(f"column {col!r}: values {_first(unknown)} are not among the fitted categories "
                                 f"{_first([c for c in known if c is not None], 20)}; the model has no feature for a "
                                 f"value it never saw: map each to one of these, or add rows with it to the table "
                                 f"and prepare and train again")
            blocks.append((values[:, None] == np.asarray(known, dtype=object)[None, :]).astype(np.float64))
        else:
            numeric[col] = width
            x = s.to_numpy(dtype=np.float64)
            blocks.append(_standardize(x, preprocessing["means"][col], preprocessing["stds"][col])[:, None])
        width += blocks[-1].shape[1]
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32's range: inf, named just below
        X = np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=np.float32)
    _check_finite(df, X, numeric, preprocessing, ids, show_values)
    return X


def positions(mask: np.ndarray) -> str:
    """The first SHOW positions a bool mask [n] marks, as a list, and how many in all when there are more."""
    pos = np.flatnonzero(mask)
    return str(pos[:SHOW].tolist())[:-1] + (f", ... ({len(pos)} in all)]" if len(pos) > SHOW else "]")


def _check_finite(df: pd.DataFrame, X: np.ndarray, numeric: dict, preprocessing: dict, ids,
                  show_values: bool = True) -> None:
    """Every numeric feature a finite float32 (|value| < 3.4e38 after standardizing)."""
    bad = [col for col, j in numeric.items() if not np.isfinite(X[:, j]).all()]
    if not bad:
        return
    labels = pd.Series(list(ids) if ids is not None else [f"row {i}" for i in range(len(df))])
    parts = []
    for col in bad:
        rows = ~np.isfinite(X[:, numeric[col]])
        raw = df[col].to_numpy(dtype=np.float64)[rows]
        mean, std = preprocessing["means"][col], preprocessing["stds"][col]
        such = f"values such as {raw[0]:.3g} in " if show_values else ""
        parts.append(f"{col!r} ({such}rows {_describe_rows(labels, rows)}; training mean {mean:.3g}, std {std:.3g})")
    raise DataError(f"numeric feature column(s) {', '.join(parts)} do not fit a float32 feature once standardized "
                     f"(|value| must stay below 3.4e38), so training would yield NaN. Rescale the column(s) in "
                     f"your table (e.g. take the log), or leave them out via prepare.table.feature_columns")


def _describe_rows(ids: pd.Series, mask: np.ndarray) -> str:
    pos = np.flatnonzero(mask)
    shown = [f"row {i} (no id)" if pd.isna(ids.iloc[i]) else repr(str(ids.iloc[i])) for i in pos[:SHOW]]
    return ", ".join(shown) + (f", ... ({len(pos)} rows in all)" if len(pos) > SHOW else f" ({len(pos)} rows)")


def _columns(df: pd.DataFrame, path: Path, id_column: str, label_column: str, group_column, split_column,
             feature_columns, group_as_feature: bool = False) -> list[str]:
    """The model's input columns, in the table's order (or feature_columns' order). The group column is one
    of them only with `group_as_feature` (prepare.table.group_as_feature); the id, label and split never are."""
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
    group_input = group_column if group_as_feature else None
    not_inputs = [c for c in used if c != group_input]
    if feature_columns is None:
        features = [c for c in df.columns if c not in not_inputs]
    else:
        features = _listed_features(list(feature_columns), path, available, not_inputs, group_column)
        if group_input is not None and group_input not in features:
            features.append(group_input)
    if not features:
        raise DataError(f"prepare.table: {path.name} has no feature columns besides {used}; "
                         f"add columns or set prepare.table.feature_columns")
    return features


def _listed_features(features: list[str], path: Path, available: list[str], not_inputs: list[str],
                     group_column: str | None) -> list[str]:
    """prepare.table.feature_columns, checked: columns of the table, each once, none of the id/label/split (nor
    the group column unless group_as_feature)."""
    unknown = [c for c in features if c not in available]
    if unknown:
        raise DataError(f"prepare.table.feature_columns: {unknown} are not columns of {path.name}; "
                         f"its columns: {available}")
    if group_column is not None and group_column in features and group_column in not_inputs:
        raise DataError(f"prepare.table.feature_columns = {features} lists the group column {group_column!r}; set "
                         f"prepare.table.group_as_feature: true to feed it to the model, or remove it from "
                         f"feature_columns")
    clash = [c for c in features if c in not_inputs]
    if clash:
        raise DataError(f"prepare.table.feature_columns = {features}: {clash} is also the id, label, group or "
                         f"split column; remove it from feature_columns")
    if len(set(features)) < len(features):
        raise DataError(f"prepare.table.feature_columns = {features} lists a column twice")
    return features


def load_table(path: str | Path, id_column: str, label_column: str, group_column: str | None = None,
               feature_columns: Sequence[str] | None = None, split_column: str | None = None,
               missing: str = "error", seed: int = 0, val_fraction: float = 0.2, max_train=None, max_val=None,
               targets: str = "fine", group_as_feature: bool = False, missing_markers: Sequence[str] = ("?", "NA", "N/A"),
               **_) -> Dataset:
    path = Path(path)
    df = read_table(path, (id_column, label_column, group_column, split_column))
    n_rows = len(df)
    features = _columns(df, path, id_column, label_column, group_column, split_column, feature_columns,
                        group_as_feature)
    if feature_columns is None:  # a column the user listed is theirs to keep
        _check_index_column(df, path, features)
    roles = [c for c in (id_column, label_column, group_column, split_column) if c is not None]
    used = roles + [c for c in features if c not in roles]
    df, marked = text_markers_as_missing(df, [c for c in features if c not in roles], missing_markers)
    missing_by_column = {c: int(n) for c, n in df[used].isna().sum().items() if n}
    df, file_rows = _drop_missing(df, path, id_column, used, missing, missing_markers)
    # a column of whole numbers but for its markers is an integer column once they are dropped
    df = df.assign(**{c: _integral(df[c]) for c in marked if pd.api.types.is_float_dtype(df[c])})

    ids = df[id_column].map(str)
    _check_ids(id_column, ids, file_rows)
    for col in features:
        s = df[col]
        _check_feature_column(path, col, s, ids)
        if not is_categorical(s) and not np.isfinite(s.to_numpy(dtype=np.float64)).all():
            rows = ~np.isfinite(s.to_numpy(dtype=np.float64))
            raise DataError(f"{path.name}: column {col!r} has infinite values in rows {_describe_rows(ids, rows)}; "
                             f"replace them with finite numbers")

    labels = _label_text(label_column, df[label_column])
    fine_names = _class_names(label_column, labels)
    _check_labels(label_column, labels, fine_names)
    index = {n: i for i, n in enumerate(fine_names)}
    fine = labels.map(index).to_numpy(dtype=np.int64)
    group = (_as_text(df[group_column]).to_numpy(dtype=object) if group_column
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
    X = apply_preprocessing(df.iloc[keep], prep, ids=ids_arr[keep])
    split = split[keep].astype(str)
    label, class_names = _labels(fine[keep], fine_names, group[keep], targets)
    source = {"type": "table", "path": str(path), "format": TABLE_FORMATS[path.suffix.lower()],
              "id_column": id_column, "label_column": label_column, "group_column": group_column,
              "split_column": split_column, "missing": missing, "n_rows": int(n_rows)}
    if group_column is not None:  # recorded where it decides something (a table without a group is as before)
        source["group_as_feature"] = bool(group_as_feature)
    return Dataset(
        name="table", X=X, label=label, fine_label=fine[keep], sample_id=ids_arr[keep], split=split,
        group=group[keep], class_names=class_names, fine_class_names=fine_names, image_shape=None,
        in_shape=(X.shape[1],),
        meta={"source": source, "targets": targets, "n_dropped_missing": int(n_rows - len(df)),
              # only when there is one: a table without gaps keeps the dataset identity it had
              **({"missing_by_column": missing_by_column} if missing_by_column else {}),
              **({"missing_markers_found": marked} if marked else {}),
              "feature_columns": [str(c) for c in features], "preprocessing": prep,
              "feature_types": feature_types(df, features)})


def text_markers_as_missing(df: pd.DataFrame, columns: list[str], markers: Sequence[str]) -> tuple[pd.DataFrame, dict]:
    """Text feature columns with their "no value" cells (a spaces-only cell, or one of `markers`: Adult's '?')
    made missing, so prepare.table.missing decides about them instead of their becoming a category of their
    own (a group of their own when sharding by the column). A column that is numbers but for such cells becomes
    a number column. Returns (the table, {column: cells made missing})."""
    marks, out, found = {str(m).strip() for m in markers}, None, {}
    for col in columns:
        s = df[col]
        if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):  # text: object or pandas' str dtype
            continue
        text = s.map(lambda v: v.strip() if isinstance(v, str) else v)
        gone = text.map(lambda v: isinstance(v, str) and (v == "" or v in marks)).to_numpy(dtype=bool)
        if not gone.any():
            continue
        out = df.copy() if out is None else out
        kept = s.mask(gone)
        numbers = pd.to_numeric(kept, errors="coerce")
        out[col] = numbers if numbers.notna().sum() == kept.notna().sum() and kept.notna().any() else kept
        found[col] = int(gone.sum())
    return (df if out is None else out), found


def _drop_missing(df: pd.DataFrame, path: Path, id_column: str, used: list[str],
                  missing: str, markers: Sequence[str] = ()) -> tuple[pd.DataFrame, np.ndarray]:
    """`df` without rows missing a value in a used column (missing: drop), or DataError naming them (error);
    with the file's (0-based) data row of every row left, for messages about them."""
    na = df[used].isna()
    bad = na.any(axis=1).to_numpy()
    empty = [c for c in used if len(df) and na[c].all()]
    if empty:  # `missing: drop` would drop every row, and "no rows left" would not say why
        raise DataError(f"{path.name}: columns {empty} have no value in any of the {len(df)} rows (prepare.table."
                         f"missing: drop would drop every row); fill them, or "
                         f"leave the feature columns among them out via prepare.table.feature_columns (list "
                         f"the columns to use)")
    if bad.any():
        if missing != "drop":
            counts = ", ".join(f"{c!r} {int(na[c].sum())}" for c in used if na[c].any())
            raise DataError(f"{path.name}: rows with missing values: {int(bad.sum())} (cells per column: {counts}), "
                             f"e.g. {_describe_rows(df[id_column], bad)}; a cell is missing when empty, only "
                             f"spaces, a marker in a text feature column (prepare.table.missing_markers "
                             f"{list(markers)}), or 'NA'/'null' in a column of numbers. Fill them, or set "
                             f"prepare.table.missing: drop to drop these rows")
        df = df.loc[~bad].reset_index(drop=True)
    if df.empty:
        raise DataError(f"{path.name}: no rows left (of {len(bad)}) after dropping rows with missing values")
    return df, np.flatnonzero(~bad)


def _check_index_column(df: pd.DataFrame, path: Path, features: list[str]) -> None:
    """A pandas index saved with the rows (`df.to_csv(path)` without index=False: a nameless first column of
    row numbers) must not become a feature: it encodes the row order, and so whatever the rows were sorted
    by, the label included."""
    first = df.columns[0]
    if str(first) not in ("", "Unnamed: 0") or first not in features:
        return
    s = df[first]
    # Not only 0..n-1: a filtered frame's index has gaps, a concatenated one repeats; all are row numbers.
    if not pd.api.types.is_integer_dtype(s) or pd.api.types.is_bool_dtype(s) or (s < 0).any():
        return
    raise DataError(f"{path.name}: the first column has no name ({str(first)!r}) and holds row numbers "
                     f"({_first(s.tolist())}): a pandas index written with the table, not a feature "
                     f"(it would encode the row order). Write the table with df.to_csv(path, index=False), or "
                     f"list the features in prepare.table.feature_columns")


def _rows_with(ids: pd.Series, file_rows: np.ndarray, mask: np.ndarray) -> str:
    """The ids at `mask`, exactly (repr shows spaces and line breaks), with their data row in the file."""
    pos = np.flatnonzero(mask)
    shown = ", ".join(f"{ids.iloc[i]!r} (row {file_rows[i]})" for i in pos[:SHOW])
    return shown + (f", ... ({len(pos)} in all)" if len(pos) > SHOW else "")


def unnameable_ids(ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(control, spaced): boolean masks of the ids that a deletion request could not name, by the rules of request
    files (unlearning/requests.py): a control character (line break, tab) or spaces around the id. Such a sample
    would be trained on and could never be erased."""
    control = ids.str.contains(CONTROL_CHARACTERS).to_numpy(dtype=bool)
    spaced = (ids != ids.str.strip()).to_numpy(dtype=bool)
    return control, spaced


def _check_ids(id_column: str, ids: pd.Series, file_rows: np.ndarray) -> None:
    """A table's ids: nameable by a request (`unnameable_ids`), non-empty and unique."""
    key = f"prepare.table.id_column = {id_column!r}"
    empty = (ids.str.strip() == "").to_numpy()
    if empty.any():
        raise DataError(f"{key}: empty ids in rows {_first(file_rows[empty])} (0-based data rows); every row "
                         f"needs a unique, non-empty id")
    control, spaced = unnameable_ids(ids)
    if control.any():
        raise DataError(f"{key}: ids {_rows_with(ids, file_rows, control)} (0-based data rows) hold a control "
                         f"character (a line break or tab); deletion requests refuse such ids, so these rows could "
                         f"never be erased: remove the characters from the ids in your table")
    if spaced.any():
        raise DataError(f"{key}: ids {_rows_with(ids, file_rows, spaced)} (0-based data rows) have spaces around "
                         f"them; deletion requests compare ids exactly and refuse padded ones, so these rows could "
                         f"never be erased: strip the spaces from the ids in your table")
    dup = ids[ids.duplicated(keep=False)]
    if len(dup):
        counts = dup.value_counts(sort=False)
        raise DataError(f"{key}: duplicate ids {_first([f'{i} (x{n})' for i, n in counts.items()])}; ids must be "
                         f"unique")


def _as_text(s: pd.Series) -> pd.Series:
    """Class or group values as the text naming them. Numbers (Parquet) as `str`, whole floats as ints (an
    int column with gaps is float); text as written ('007' and '7' stay two values), except a column written
    wholly in pandas' float format of whole numbers ('3.0', from df.to_csv of such a column) loses the '.0'
    when no two values merge by it."""
    if not is_categorical(s):
        return _integral(s).map(str)
    text = s.map(str)
    if len(text) and text.str.fullmatch(_WHOLE_FLOAT).all():
        short = text.str.replace(r"\.0+$", "", regex=True)
        if short.nunique() == text.nunique():
            return short
    return text


def _label_text(label_column: str, raw: pd.Series) -> pd.Series:
    """The label column as text; DataError when two different values read the same (1 and '1' in an object
    column of a Parquet file)."""
    text = _as_text(raw)
    if raw.nunique() > text.nunique():
        raise DataError(f"prepare.table.label_column = {label_column!r}: labels {_first(sorted(set(text)))} "
                         f"collide as text (e.g. the number 1 and the text '1'); give every class one spelling")
    return text


def _class_names(label_column: str, labels: pd.Series) -> list[str]:
    """The classes in a fixed order: by value when every label is a number (0, 2, 10: the order a CSV's
    integer labels had when they were read as numbers; '01' before '1' on a tie), else sorted as text.
    Numbers that are not whole are a measurement, not a class: DataError."""
    names = list(pd.unique(labels))
    values = pd.to_numeric(pd.Series(names, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        return sorted(names)
    if (values % 1 != 0).any():
        raise DataError(f"prepare.table.label_column = {label_column!r} holds non-integer numbers (e.g. "
                         f"{_first(names[:3], 3)}): this pipeline trains classifiers; bin the target into classes "
                         f"first")
    return [names[i] for i in sorted(range(len(names)), key=lambda i: (values[i], names[i]))]


def _check_feature_column(path: Path, col: str, s: pd.Series, ids: pd.Series) -> None:
    """Refuse feature columns that one-hot encoding would silently turn into noise: dates, nested values, numbers
    with a few text cells and free text (ids [n]: the rows' ids, to name them). Dates are refused however they
    arrive (a datetime dtype, Parquet DATE/TIME objects, or CSV text such as '2024-01-05' or '08:30'), so one
    table gives the same answer as CSV and as Parquet."""
    n_rows = len(ids)
    dates = _dates_in(s)
    if dates:
        raise DataError(f"{path.name}: feature column {col!r} holds dates/times ({dates}); convert it to numbers "
                         f"(e.g. days since a reference date) or to categories of your own (e.g. '2024-Q1'), or "
                         f"leave it out of prepare.table.feature_columns")
    nested = _nested_in(s)
    if nested:
        raise DataError(f"{path.name}: feature column {col!r} holds {nested} values (e.g. {_first(_examples(s), 2)}); "
                         f"prepare reads one number or one category per cell: flatten it into columns of its own, "
                         f"or leave it out of prepare.table.feature_columns")
    if is_categorical(s) and not pd.api.types.is_bool_dtype(s):
        reserved = sorted(v for v in s.map(str).unique() if is_erased_category(v))
        if reserved:
            raise DataError(f"{path.name}: text feature column {col!r} holds the values {_first(reserved)}, which "
                             f"read as placeholders of erased categories ({ERASED_CATEGORY.format('k')}); rename "
                             f"those values in your table")
        _check_stray_text(path, col, s, ids)  # before the count of distinct values: it names the cells
        distinct = int(s.map(str).nunique())
        if distinct > MAX_CATEGORIES or (distinct > 10 and distinct > 0.5 * n_rows):
            raise DataError(f"{path.name}: text feature column {col!r} has {distinct} distinct values in {n_rows} "
                             f"rows (e.g. {_first(s.map(str).unique()[:3].tolist(), 3)}); one-hot encoding it would "
                             f"add {distinct} features that identify rows rather than describe them. Leave it out "
                             f"of prepare.table.feature_columns (or encode it as numbers yourself); at most "
                             f"{MAX_CATEGORIES} categories are one-hot encoded")


STRAY_TEXT_MIN_NUMBERS = 10  # distinct numbers from which a column with a few text cells is a column of numbers
STRAY_TEXT_MAX_SHARE = 0.05  # at most this share of its cells are text


def _check_stray_text(path: Path, col: str, s: pd.Series, ids: pd.Series) -> None:
    """Refuse a text column that is numbers but for a few cells ('?', '-', 'unknown', '1,5'): one-hot encoded, every
    age or price would be a category of its own, without a word. A column counts as numbers when it has at least
    STRAY_TEXT_MIN_NUMBERS distinct numbers and at most STRAY_TEXT_MAX_SHARE of its cells are not numbers (a
    handful of category codes such as 1, 2, 3, 'A' stays categorical)."""
    present = s.notna().to_numpy()
    numbers = pd.to_numeric(s.map(lambda v: str(v).strip(), na_action="ignore"), errors="coerce")
    text = present & numbers.isna().to_numpy()
    distinct = int(numbers.nunique())
    if not text.any() or distinct < STRAY_TEXT_MIN_NUMBERS or text.sum() > STRAY_TEXT_MAX_SHARE * present.sum():
        return
    values = list(dict.fromkeys(s[text].map(str)))
    raise DataError(f"{path.name}: feature column {col!r} holds numbers ({distinct} distinct) except "
                     f"for {int(text.sum())} cell(s): {_first(values)} in rows {_describe_rows(ids, text)}; read as "
                     f"text, the whole column would be one-hot encoded, each number a category of its own. Make "
                     f"those cells empty (missing: `prepare.table.missing: drop` drops their rows) or correct them")


# Text that is a date or a time of day (every value of a column must be one for the column to count as dates):
# ISO 8601 dates with an optional time and zone, d/m/y or m/d/y with '/', '.' or '-', and hh:mm[:ss[.f]] [am/pm].
_DATE_TEXT = re.compile(
    r"\s*(?:"
    r"\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\d{4}/\d{1,2}/\d{1,2}(?: \d{1,2}:\d{2}(?::\d{2})?)?"
    r"|\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}(?: \d{1,2}:\d{2}(?::\d{2})?(?: ?[AaPp][Mm])?)?"
    r"|\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?: ?[AaPp][Mm])?"
    r")\s*")


def _examples(s: pd.Series, n: int = 2) -> list[str]:
    return [str(v) for v in s.dropna().head(n).tolist()]


def _dates_in(s: pd.Series) -> str:
    """How a column holds dates or times ('' when it does not): its dtype, date objects, or date text."""
    import datetime

    if pd.api.types.is_datetime64_any_dtype(s) or pd.api.types.is_timedelta64_dtype(s):
        return str(s.dtype)
    if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
        return ""
    values = s.dropna()
    if not len(values):
        return ""
    kinds = (datetime.date, datetime.time, datetime.timedelta, np.datetime64, np.timedelta64)
    first = values.iloc[0]  # most columns answer here: their first value is neither a date nor date text
    if not isinstance(first, kinds) and not (isinstance(first, str) and _DATE_TEXT.fullmatch(first)):
        return ""
    if values.map(lambda v: isinstance(v, kinds)).all():
        return f"{type(values.iloc[0]).__name__} values"
    if values.map(lambda v: isinstance(v, str) and _DATE_TEXT.fullmatch(v) is not None).all():
        return f"text such as {values.iloc[0]!r}"
    return ""


def _nested_in(s: pd.Series) -> str:
    """'list' (or 'dict', 'bytes', ...) when some cell of an object column holds a container, else ''."""
    if s.dtype != object:
        return ""
    for v in s.dropna():
        if isinstance(v, (list, tuple, set, dict, np.ndarray, bytes, bytearray)):
            return type(v).__name__
    return ""


def _check_labels(label_column: str, labels: pd.Series, names: list[str]) -> None:
    """A classifier needs at least two classes, and labels that are classes rather than ids."""
    if len(names) < 2:
        raise DataError(f"prepare.table.label_column = {label_column!r}: every row has the label {names[0]!r}; a "
                         f"classifier needs at least two classes")
    if len(names) > MAX_CATEGORIES and len(names) > 0.5 * len(labels):
        raise DataError(f"prepare.table.label_column = {label_column!r} has {len(names)} distinct values in "
                         f"{len(labels)} rows: that is an id or a measurement, not a class label")


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
    problems, entries, empty = [], [], []
    problems += [f"{p.relative_to(root).as_posix()} (not inside a class folder)" for p in top if not p.is_dir()]
    for split, base in bases:
        for cdir in _visible(base):
            if not cdir.is_dir():
                if base is not root:
                    problems.append(f"{cdir.relative_to(root).as_posix()} (not inside a class folder)")
                continue
            if not _visible(cdir):
                empty.append(f"{cdir.relative_to(root).as_posix()}/")
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
    if empty:  # a class the team expects would be missing from the model (its folder name says it exists)
        raise DataError(f"prepare.image_folder.path = '{root}': class folders {_first(empty, 10)} hold no image; "
                         f"add its images or delete the empty folder")
    _check_every_class_trains(root, layout, entries)
    return layout, entries


def _check_every_class_trains(root: Path, layout: str, entries: list) -> None:
    """With train/ and val/ folders, a class that has val images but no train image would be scored on val
    and never learnt (its logit trained only to be low)."""
    if layout != "split_folders":
        return
    trained = {c for _, split, c in entries if split == "train"}
    val_only = sorted({c for _, split, c in entries if split != "train"} - trained)
    if val_only:
        raise DataError(f"prepare.image_folder.path = '{root}': classes {_first(val_only, 10)} have images in val/ "
                         f"but none in train/; the model could never learn them: add train images "
                         f"(train/<class>/...) or remove them from val/")


def _image_size(image_size) -> tuple[int, int]:
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) <= 0:
        raise DataError(f"prepare.image_folder.image_size = {image_size!r}: give [height, width] or one int > 0")
    return size


# Single-channel 16-bit modes and their full scale. Pillow's convert("L") CLIPS them to 255 instead of scaling
# (a 16-bit PNG became almost all white), so they are scaled here. "I" is how Pillow opens 16-bit PNGs in some
# versions; in other formats it is 32-bit data with no known full scale (refused).
_DEEP_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
_DEEP_FULL_SCALE = 65535.0


def _flatten_alpha(im):
    """An image with transparency (RGBA, LA, a palette or tRNS transparency) composited over black.

    Converting to L or RGB alone drops the alpha channel and keeps whatever colour the transparent pixels happen
    to store (often black, sometimes white or noise from an editor), so two images that look the same could
    reach the model differently. Over black, a transparent pixel is 0 whatever it stores: "no ink", as in
    MNIST-style data."""
    from PIL import Image

    if im.mode not in ("RGBA", "LA", "PA", "La", "RGBa") and "transparency" not in im.info:
        return im
    if im.mode in _DEEP_MODES:  # convert("RGBA") would clip 16 bits to 255 (all white): the key colour goes black
        a = np.asarray(im)
        return Image.fromarray(np.where(a == im.info["transparency"], 0, a).astype(a.dtype))
    rgba = im.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba)


def _unit_pixels(im, grayscale: bool, size: tuple[int, int], resample) -> np.ndarray:
    """One image as float32 in [0, 1], resized to size (w, h): [h, w] grey or [h, w, 3] RGB."""
    from PIL import Image

    if im.mode in _DEEP_MODES or im.mode in ("I", "F"):
        a = np.asarray(im, dtype=np.float64)
        if im.mode in _DEEP_MODES or (im.mode == "I" and im.format == "PNG"):
            a = a / _DEEP_FULL_SCALE
        elif im.mode == "I":
            raise ValueError("32-bit integer pixels have no known full scale; save the image as 8- or 16-bit")
        if a.size and (a.min() < 0 or a.max() > 1):
            raise ValueError(f"{im.mode} pixels range over [{a.min():g}, {a.max():g}], outside [0, 1] (float "
                             f"images must hold intensities in [0, 1]); save the image as 8- or 16-bit")
        grey = np.asarray(Image.fromarray(a.astype(np.float32), mode="F").resize(size, resample), dtype=np.float32)
        grey = grey.clip(0.0, 1.0)  # bilinear stays in range; the clip only absorbs float rounding
        return grey if grayscale else np.repeat(grey[:, :, None], 3, axis=2)
    rgb_or_l = im.convert("L" if grayscale else "RGB").resize(size, resample)
    return np.asarray(rgb_or_l, dtype=np.float32) / 255.0


def image_features(images: Sequence, image_size, grayscale: bool = True, names: Sequence[str] | None = None
                   ) -> np.ndarray:
    """[n, C*H*W] float32 in [0, 1], one row per image: L or RGB (transparency composited over black), bilinear
    resize to (H, W), channel-first, row-major. 16-bit grey images are scaled by their full scale (65535), not
    clipped; an EXIF orientation tag is applied (the image as a viewer shows it).

    The one preparation of an image, shared by the prepare stage (`read_images`) and the served champion
    (unlearning/data/preparation.py): each image is a path, the bytes of an image file, or an array of pixels
    that `PIL.Image.fromarray` takes (uint8 [H, W] grey, [H, W, 3] RGB or [H, W, 4] RGBA; uint16 [H, W]; float
    [H, W] in [0, 1]). `names` [n] name the images in the error (default: their positions)."""
    import io

    from PIL import Image, ImageOps, UnidentifiedImageError  # lazy: only image folders need Pillow

    h, w = _image_size(image_size)
    c = 1 if grayscale else 3
    bilinear = getattr(Image, "Resampling", Image).BILINEAR
    X = np.empty((len(images), c * h * w), dtype=np.float32)
    bad = []
    for j, image in enumerate(images):
        try:
            if isinstance(image, np.ndarray):
                opened = Image.fromarray(image)
            elif isinstance(image, (bytes, bytearray, memoryview)):
                opened = Image.open(io.BytesIO(bytes(image)))
            elif isinstance(image, (str, Path)):
                opened = Image.open(image)
            else:
                raise ValueError(f"a {type(image).__name__}, not a path, the bytes of an image file or an array of "
                                 f"pixels")
            with opened as im:
                # as a viewer shows it: a phone photo stores its pixels sideways plus an EXIF orientation tag
                a = _unit_pixels(_flatten_alpha(ImageOps.exif_transpose(im)), grayscale, (w, h), bilinear)
        except UnidentifiedImageError:
            bad.append(f"{names[j] if names is not None else f'image {j}'} (not an image file that Pillow reads)")
        except (OSError, ValueError, TypeError) as e:
            bad.append(f"{names[j] if names is not None else f'image {j}'} ({e})")
            continue
        X[j] = (a if grayscale else a.transpose(2, 0, 1)).reshape(-1)
    if bad:
        raise DataError(f"{len(bad)} images could not be read: {_first(bad)}; replace or delete them")
    return X


def read_images(files: Sequence[Path], image_size, grayscale: bool = True, root: Path | None = None) -> np.ndarray:
    """The image files as features [n, C*H*W] (`image_features`), named in errors by their path under `root`."""
    return image_features(files, image_size, grayscale,
                          names=[f.relative_to(root).as_posix() if root else str(f) for f in files])


def image_id(root: Path, file: Path) -> str:
    """An image's sample id: its path inside the folder, without the suffix ('cats/001')."""
    return file.relative_to(root).with_suffix("").as_posix()


def _check_image_ids(root: Path, files: list[Path], ids: np.ndarray) -> None:
    """An image's id is its path without the suffix; one that no request could name (`unnameable_ids`: a tab or
    line break in a name, a space before the suffix or before a class folder's name) is refused by file."""
    control, spaced = unnameable_ids(pd.Series(ids, dtype=object))
    for mask, what in ((control, "hold a control character (a tab or line break)"),
                       (spaced, "have spaces around them (before the suffix, or at the start of a class folder)")):
        if mask.any():
            named = [f.relative_to(root).as_posix() for f in np.asarray(files, dtype=object)[mask]]
            raise DataError(f"prepare.image_folder.path = '{root}': the ids of files {_first(named, 10)} (the path "
                             f"without its suffix) {what}; deletion requests refuse such ids, so these images could "
                             f"never be erased: rename the files (or folders)")


def load_image_folder(path: str | Path, image_size=28, grayscale: bool = True, groups: dict | None = None,
                      seed: int = 0, val_fraction: float = 0.2, max_train=None, max_val=None,
                      targets: str = "fine", **_) -> Dataset:
    root = Path(path)
    size = _image_size(image_size)
    layout, entries = scan_image_folder(root)
    files = [f for f, _, _ in entries]
    ids = np.array([image_id(root, f) for f in files], dtype=object)
    _check_image_ids(root, files, ids)
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
