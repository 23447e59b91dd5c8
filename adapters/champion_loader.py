"""MLflow's loader hook for the champion, shipped into the model's `code/` folder as the top-level module
`champion_loader` (adapters/tracking.py `log_model`): a thin shell around unlearning/serving.py.

Why a shell at all: the pure core raises `DataError` for raw rows it cannot prepare (an unseen category, a cell
without a value, text in a number column). `mlflow models serve` answers any exception that is not an
`MlflowException` with "Encountered an unexpected error while evaluating the model" and hides the message in
a stack trace; re-raised here as an `MlflowException` (400, INVALID_PARAMETER_VALUE), the REST client reads the
one line that names the column, the rows and the fix (never a value of the input: `RowError`). The core stays free of mlflow (docs/design.md §2).

This file imports only mlflow and the `unlearning` package (both present wherever the model loads), never
`tasks`: it is loaded outside this repository.
"""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from unlearning import serving
from unlearning.data.dataset import DataError


class RowError(MlflowException):
    """A bad-input error whose message stays the core's one line: `mlflow models serve` prefixes the message of
    an MlflowException from `predict` with the whole input ("Failed to predict data '<every column of every
    row>'"), which would send a row's personal fields (a name) back in the error body and into logs."""

    @property
    def message(self) -> str:
        return self._line

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_line"):  # MlflowException.__init__ sets it once; the server's rewrite is ignored
            self._line = value


class ServedChampion:
    """`predict` of unlearning/serving.py's ProbabilityModel, its bad-input errors as MlflowException; every
    other attribute (`predict_features`, `recipe`, `class_names`, `model`) is the wrapped model's."""

    def __init__(self, inner: serving.ProbabilityModel):
        self.inner = inner

    def predict(self, model_input, params: dict | None = None):
        try:
            return self.inner.predict(model_input, params)
        except DataError as e:
            raise RowError(str(e), error_code=INVALID_PARAMETER_VALUE) from None

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _load_pyfunc(data_path: str) -> ServedChampion:
    """MLflow's loader hook: `data_path` is the checkpoint inside the downloaded model folder."""
    return ServedChampion(serving._load_pyfunc(data_path))
