"""The champion as a model a serving team can load: MLflow's pyfunc `loader_module` contract, kept pure.

Why a loader module and not an `mlflow.pyfunc.PythonModel` subclass: a subclass would import mlflow (only
`adapters/tracking.py` may) and be cloudpickled by reference to its module, so it would load only where that
module is importable. With a loader module the model folder holds the project's own checkpoint (`save_model`:
spec, seeds, weights; no pickled code) and, in `code/`, this package (and a custom factory's module): MLflow
puts `code/` on sys.path and calls `_load_pyfunc(data_path)`, which rebuilds the ensemble with `build_model`.
The repository is not needed at load time.

Input: raw rows when the checkpoint holds a preparation recipe (a table's or an image folder's, see
unlearning/data/preparation.py): a DataFrame with the table's own feature columns, text categories as text, or
images (paths, file bytes, arrays of pixels). The recipe's function (`prepare_raw`, the prepare stage's own)
turns them into the prepared features, then the model's forward runs on them. An array [B, d] is taken as the
prepared features themselves (`predict_features`), and so is any input of a model without a recipe (the
built-in datasets).
Output: a DataFrame [B, C] of class probabilities, one column per class name: the mean of the members'
softmax (the champion has one member: its softmax). No member dimension.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from unlearning.models import Ensemble, load_model, save_model

CHECKPOINT = "ensemble.pt"  # the file MLflow copies into the model's data/ folder (data_path)


class ProbabilityModel:
    """What `mlflow.pyfunc.load_model` returns the calls to: `predict(rows) -> probabilities`. `recipe`: the
    preparation of raw input (unlearning/data/preparation.py), None when the features are the raw input."""

    def __init__(self, model: Ensemble, class_names: Sequence[str], recipe: dict | None = None):
        self.model = model.cpu().eval()
        self.class_names = [str(c) for c in class_names]
        self.recipe = recipe

    def predict(self, model_input, params: dict | None = None) -> pd.DataFrame:
        """Class probabilities [B, C] (columns: the class names) of raw rows, or of prepared features [B, d]
        (an array [B, d], or any input of a model without a recipe)."""
        if self.recipe is None or _is_features(model_input, self.model.in_dim):
            return self.predict_features(model_input)
        from unlearning.data.preparation import prepare_raw

        return self.predict_features(prepare_raw(model_input, self.recipe))

    def predict_features(self, features) -> pd.DataFrame:
        """Class probabilities [B, C] of the prepared features [B, d] (the prepared store's columns, in order)."""
        return pd.DataFrame(probabilities(self.model, features), columns=self.class_names)


def _is_features(model_input, in_dim: int) -> bool:
    """An array (or tensor) [B, d] of numbers: prepared features. DataFrames, lists and image batches
    [B, H, W(, C)] are raw input."""
    shape = getattr(model_input, "shape", None)
    return (isinstance(model_input, (np.ndarray, torch.Tensor)) and shape is not None and len(shape) == 2
            and shape[1] == in_dim and np.dtype(str(model_input.dtype).replace("torch.", "")).kind in "fiu")


def probabilities(model: Ensemble, features) -> np.ndarray:
    """The members' mean softmax [B, C] of flat features [B, d] (an array or a DataFrame of d columns)."""
    # np.array copies: pandas hands out read-only arrays, which torch.as_tensor would warn about
    try:
        array = np.array(features, dtype=np.float32)
    except (TypeError, ValueError):  # numpy's own message quotes the cell: a served row's value stays unsaid
        raise ValueError(f"expected features [B, {model.in_dim}] of numbers (the prepared store's feature columns); "
                         f"the input holds a value that is not a number") from None
    x = torch.from_numpy(array).to(next(model.parameters()).dtype)
    if x.dim() != 2 or x.shape[1] != model.in_dim:
        raise ValueError(f"expected features [B, {model.in_dim}] (the prepared store's feature columns), "
                         f"got shape {list(x.shape)}")
    with torch.inference_mode():
        return torch.softmax(model(x), dim=-1).mean(0).numpy()


def class_names_for(names: Sequence[str] | None, n_classes: int) -> list[str]:
    """The output's column names: the given class names, or class_0.. when there are none of that length."""
    names = [str(n) for n in names or []]
    return names if len(names) == n_classes else [f"class_{i}" for i in range(n_classes)]


def input_example(X: np.ndarray, manifest: pd.DataFrame, k: int = 2) -> np.ndarray:
    """The input example of a model that takes prepared features [B, d]: k rows of zeros (a standardized
    column's training mean; a black image), not rows of X. A request may name a validation row too, and a data
    row in the registry would be one more copy for the erasure to find. (A model with a preparation recipe
    makes its example from the recipe: unlearning/data/preparation.py `example_rows`.)"""
    return np.zeros((k, int(np.shape(X)[1])), dtype=np.float32)


def write_checkpoint(model: Ensemble, folder: Path, class_names: Sequence[str], recipe: dict | None = None) -> Path:
    """The checkpoint the pyfunc model loads: the ensemble, the output's column names and the preparation
    recipe of raw input (None: features only; the model stays on its device; `_load_pyfunc` maps the weights to
    the CPU)."""
    path = Path(folder) / CHECKPOINT
    extra = {"class_names": [str(c) for c in class_names]}
    if recipe is not None:
        extra["preparation"] = recipe
    save_model(model, path, extra)
    return path


def code_paths(model: Ensemble) -> list[Path]:
    """What the model needs on sys.path besides torch: this package and, for a custom factory, the
    top-level module or package that defines it, unless it is an installed one (then it is a requirement)."""
    paths = [Path(__file__).resolve().parent]
    factory = model.spec().get("factory")
    own = _source_of(factory.split(":")[0].split(".")[0]) if factory else None
    return paths + [own] if own is not None and own not in paths else paths


def _source_of(top_level: str) -> Path | None:
    """The file (module) or folder (package) of an imported top-level module, None for an installed one."""
    module = sys.modules.get(top_level) or importlib.import_module(top_level)
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    path = Path(file).resolve()
    path = path.parent if path.name == "__init__.py" else path
    return None if any(p in ("site-packages", "dist-packages") for p in path.parts) else path


def _load_pyfunc(data_path: str) -> ProbabilityModel:
    """MLflow's loader hook: `data_path` is the checkpoint inside the downloaded model folder."""
    model, extra = load_model(data_path, device="cpu")
    return ProbabilityModel(model, class_names_for(extra.get("class_names"), model.n_classes), extra.get("preparation"))


# --- what a scoring server may answer (adapters/champion_loader.py guards MLflow's) ---------------------------------
# `mlflow models serve` answers odd requests with messages that quote them: a malformed JSON body whole ("Input:
# <body>"), the fields it found, the content type it got, "Failed to predict data '<every column of every row>'",
# and stack traces that show the server's local paths. A response carries only the fixed lines below, each naming
# what to send instead; the numbers of a CSV parse error (line and field counts) are the only part taken over.
CONTENT_TYPES_HINT = "application/json (dataframe_split or dataframe_records), text/csv or application/vnd.apache.parquet"
SIGNATURE_HINT = "docs/own-data.md, \"Serving raw rows\""
SAFE_ANSWERS = (  # (how MLflow 3.17's message starts, the line answered instead)
    ("Ensure that input is a valid JSON formatted string", "the request body is not valid JSON{where}: send "
     "{{\"dataframe_split\": {{\"columns\": [...], \"data\": [[...]]}}}} or {{\"dataframe_records\": [{{...}}]}}"),
    ("Ensure that input is a valid UTF-8 encoded string", "the request body is not UTF-8 text: send it as UTF-8"),
    ("The input must be a JSON dictionary with exactly one of", "the JSON body must be an object with exactly one of "
     "the fields dataframe_split, dataframe_records, instances or inputs"),
    ("Failed to parse input as a Pandas DataFrame", "the request body is not a table{where}: send CSV with a header "
     "line and one line per row (or Parquet), as pandas' to_csv/to_parquet write it"),
    ("Failed to enforce schema", f"the input does not match the model's signature (its columns and their types: "
     f"{SIGNATURE_HINT})"),
    ("Data is not compatible with model signature", f"the input does not match the model's signature (its columns "
     f"and their types: {SIGNATURE_HINT})"),
)
_CSV_WHERE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def safe_error_message(message: str, cause: BaseException | None = None) -> str:
    """The one line a scoring server answers for a failed request (MLflow's `message`, `cause` its exception's
    cause): nothing of the request (no value, field, column or content type it sent) and no local path. Where
    MLflow found the problem is kept as numbers only (a JSON error's line and column, a CSV row's fields)."""
    text = message.split("Error: ", 1)[-1] if message.startswith("Failed to predict data") else message
    text = text.removeprefix("Invalid input. ")  # MLflow's MlflowInvalidInputException says it first
    for prefix, answer in SAFE_ANSWERS:
        if text.startswith(prefix) or (prefix == "Failed to enforce schema" and prefix in text):
            return answer.format(where=_where(message, cause))
    return (f"the request could not be scored ({type(cause).__name__ if cause else 'an error of the scoring server'})"
            f": send {CONTENT_TYPES_HINT} with the model's input ({SIGNATURE_HINT})")


def unsupported_request_message(status: int) -> str:
    """The line answered instead of MLflow's 415 bodies, which quote the request's content type or parameters."""
    return f"unsupported request (HTTP {status}): send {CONTENT_TYPES_HINT}, as UTF-8 without content-type parameters"


def _where(message: str, cause: BaseException | None) -> str:
    if isinstance(cause, json.JSONDecodeError):
        return f" (line {cause.lineno}, column {cause.colno})"
    found = _CSV_WHERE.search(message)
    return f" (line {found.group(2)}: {found.group(3)} fields, the header has {found.group(1)})" if found else ""
