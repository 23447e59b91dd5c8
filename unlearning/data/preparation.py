"""The preparation a served champion applies to raw input: the prepare stage's own functions, recorded with the
model so that a serving team sends the rows it holds (docs/design.md §3, the prepared store; docs/own-data.md,
"Serving raw rows").

A *recipe* is a plain, JSON-able dict read off dataset.json (`recipe_of`) and stored in the model's checkpoint:

- a table: `{"kind": "table", "preprocessing": <dataset.json's preprocessing>, "types": {column: type}}`: the
  feature columns in order, the training rows' means and stds, the one-hot categories (a category that only
  erased rows had is the placeholder `<erased k>`, no raw value: `erase_categories`);
- an image folder: `{"kind": "image", "column": "image", "image_size": [H, W], "grayscale": bool}`;
- None for the built-in datasets, whose features are their raw input.

`prepare_raw(rows, recipe)` turns raw input into the features [B, d] with the functions the prepare stage
itself calls (`apply_preprocessing` for a table, `image_features` for images): the same numbers as the prepared
store, nothing re-implemented. What it does with odd input (declared here, tested in
tests/unit/test_serving_raw.py):

- a table: a DataFrame (or a dict of columns, or a list of row dicts) with the table's feature columns by name,
  text categories as text; other columns (the id, the label) are ignored. A missing feature column, an empty
  cell in one, text in a number column, a fractional value in an integer column (24.7 in `age`: never cut to
  24), and a category the model never saw (an erased one included) are each an error naming the column, the
  rows (by position) and what is wrong, and the fix: nothing is guessed (an all-zero one-hot row for an unseen
  category would be an input the model never met in training). An error quotes no value of the rows: they may
  be personal (a name), and an error body lands in logs.
- images: a DataFrame with an `image` column, or a list, of image paths, the bytes of image files, or arrays of
  pixels (`image_features`); an array [B, H, W] or [B, H, W, C] is a batch of B images. An image that cannot
  be read is an error naming it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from unlearning.data.dataset import DataError
from unlearning.data.sources import apply_preprocessing, image_features, is_erased_category, positions

IMAGE_COLUMN = "image"
_BOOLEAN = frozenset({"False", "True"})


def recipe_of(info: dict) -> dict | None:
    """The serving recipe of a prepared store's dataset.json (`info`); None when its features are the raw input
    (the built-in datasets)."""
    source = info.get("source") or {}
    if isinstance(info.get("preprocessing"), dict):
        prep = info["preprocessing"]
        return {"kind": "table", "preprocessing": prep, "types": column_types(prep, info.get("feature_types"))}
    if source.get("type") == "image_folder":
        return {"kind": "image", "column": IMAGE_COLUMN, "image_size": [int(s) for s in source["image_size"]],
                "grayscale": bool(source["grayscale"])}
    return None


def column_types(preprocessing: dict, recorded: dict | None = None) -> dict[str, str]:
    """Each raw feature column's type as MLflow names it: as the prepare stage recorded it (`recorded`,
    dataset.json's `feature_types`: `long` for an integer column, see `feature_types`), else `double` for a
    standardized number column, `boolean` for a one-hot column whose categories are True/False, `string` for
    any other one-hot (text) column."""
    types = {}
    for col in preprocessing["columns"]:
        cats = preprocessing["categories"].get(col)
        if recorded and col in recorded:
            types[col] = recorded[col]
        elif cats is None:
            types[col] = "double"
        else:
            named = {c for c in cats if not is_erased_category(c)}
            types[col] = "boolean" if named and named <= _BOOLEAN else "string"
    return types


def raw_inputs(recipe: dict) -> list[tuple[str, str]]:
    """The model's raw input columns as (name, MLflow type), in order: a table's feature columns, or one binary
    `image` column (base64 over REST; a path, bytes or an array of pixels in Python)."""
    if recipe["kind"] == "table":
        return [(c, recipe["types"][c]) for c in recipe["preprocessing"]["columns"]]
    return [(recipe["column"], "binary")]


def recipe_after(recipe: dict | None, X: np.ndarray, keep: np.ndarray) -> dict | None:
    """The recipe once the rows outside `keep` [n] are erased from the features X [n, d] they were prepared
    into: categories only erased rows had become placeholders (`erase_categories`), as dataset.json's do."""
    from unlearning.data.sources import erase_categories

    if recipe is None or recipe["kind"] != "table":
        return recipe
    prep = erase_categories(recipe["preprocessing"], X, np.asarray(keep, dtype=bool))
    return {**recipe, "preprocessing": prep}


def example_rows(recipe: dict) -> pd.DataFrame:
    """One raw input row made from the recipe alone (a table: every number column at its training mean, every
    category column at its first named category; images: one black image), so no data row lands in the
    registry as the model's input example."""
    if recipe["kind"] == "image":
        import io

        from PIL import Image

        h, w = recipe["image_size"]
        buf = io.BytesIO()
        Image.new("L" if recipe["grayscale"] else "RGB", (w, h)).save(buf, format="PNG")
        return pd.DataFrame({recipe["column"]: [buf.getvalue()]})
    prep, row = recipe["preprocessing"], {}
    for col, kind in recipe["types"].items():
        if kind in ("double", "long"):
            mean = float(prep["means"][col])
            row[col] = [int(round(mean)) if kind == "long" else mean]
        else:
            first = next((c for c in prep["categories"][col] if not is_erased_category(c)), None)
            row[col] = [first == "True" if kind == "boolean" else first]
    return pd.DataFrame(row)


def prepare_raw(rows, recipe: dict) -> np.ndarray:
    """Raw rows (see the module docstring) as the model's features [B, d] float32, exactly as the prepare stage
    computed them for its own rows."""
    if recipe["kind"] == "image":
        images = _images_of(rows, recipe["column"])
        return image_features(images, recipe["image_size"], recipe["grayscale"])
    return _table_features(_frame_of(rows), recipe)


def _frame_of(rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows
    if isinstance(rows, (dict, list, tuple)):
        return pd.DataFrame(rows)
    raise DataError(f"raw rows: got a {type(rows).__name__}; send a table of rows with the table's feature columns "
                    f"by name (a DataFrame; over REST {{\"dataframe_split\": {{\"columns\": [...], \"data\": [...]}}}})")


def _table_features(df: pd.DataFrame, recipe: dict) -> np.ndarray:
    prep, types = recipe["preprocessing"], recipe["types"]
    columns = list(prep["columns"])
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"raw rows: feature columns {missing} are missing; the model reads the table's columns "
                        f"{columns} by name (other columns are ignored): add them")
    for col in columns:
        empty = df[col].isna().to_numpy()
        if empty.any():
            raise DataError(f"raw rows: column {col!r} has no value in rows {positions(empty)}; the model needs a "
                            f"value in every feature column (the prepare stage refused or dropped such rows): fill "
                            f"them")
        if types[col] in ("double", "long"):
            df = df.assign(**{col: _numbers(df[col], col, types[col] == "long")})
    return apply_preprocessing(df, prep, show_values=False)


def _numbers(s: pd.Series, col: str, integer: bool) -> pd.Series:
    """A raw number column as numbers: text that reads as a number is one; other text (a boolean too), or a
    fraction in an integer column, is refused, naming the rows, not the values."""
    numbers = s if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s) else \
        pd.to_numeric(s.map(lambda v: None if isinstance(v, bool) else v), errors="coerce")
    text = numbers.isna().to_numpy()
    if text.any():
        raise DataError(f"raw rows: column {col!r} holds text, not a number, in rows {positions(text)}; the model "
                        f"reads it as a number column: send numbers")
    if integer:
        x = numbers.to_numpy(dtype=np.float64)
        fraction = np.isfinite(x) & (x != np.round(x))
        if fraction.any():
            raise DataError(f"raw rows: column {col!r} holds a fractional number in rows {positions(fraction)}; it "
                            f"is an integer column (whole numbers in training) and a row is refused, never "
                            f"rounded: send whole numbers")
    return numbers


def _images_of(rows, column: str) -> Sequence:
    if isinstance(rows, pd.DataFrame):
        if column not in rows.columns:
            raise DataError(f"raw images: no column {column!r} in {list(rows.columns)}; send one column {column!r} "
                            f"of image paths, image file bytes (base64 over REST) or arrays of pixels")
        return rows[column].tolist()
    if isinstance(rows, np.ndarray) and rows.ndim in (3, 4):  # [B, H, W] or [B, H, W, C]
        return list(rows)
    if isinstance(rows, (list, tuple, pd.Series)):
        return list(rows)
    raise DataError(f"raw images: got a {type(rows).__name__}; send a DataFrame with a column {column!r}, or a "
                    f"list, of image paths, image file bytes or arrays of pixels")
