"""MLflow's loader hook for the champion, shipped into the model's `code/` folder as the top-level module
`champion_loader` (adapters/tracking.py `log_model`): a thin shell around unlearning/serving.py.

Why a shell at all: the pure core raises `DataError` for raw rows it cannot prepare (an unseen category, a cell
without a value, text in a number column). `mlflow models serve` answers any exception that is not an
`MlflowException` with "Encountered an unexpected error while evaluating the model" and hides the message in
a stack trace; re-raised here as an `MlflowException` (400, INVALID_PARAMETER_VALUE), the REST client reads the
one line that names the column, the rows and the fix (never a value of the input: `RowError`). The core stays free of mlflow (docs/design.md §2).

Loading the champion also guards the scoring server it runs in (`guard_scoring_server`): `mlflow models serve`
quotes a malformed JSON body whole in its answer, lists the fields and the content type it got, and answers a
`text/csv` body against raw columns typed `any` with a stack trace of local paths. Every failed request is answered
with one line of unlearning/serving.py `safe_error_message` instead (nothing of the request, no path), and a CSV
body of raw rows is read as the JSON one is (pandas' own types, no schema dtypes to fail on).

This file imports only mlflow and the `unlearning` package (both present wherever the model loads), never
`tasks`: it is loaded outside this repository.
"""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import BAD_REQUEST, INTERNAL_ERROR, INVALID_PARAMETER_VALUE
from mlflow.utils.file_utils import exists
from mlflow.utils.model_utils import _add_code_to_system_path

# The model's code/ folder holds the `unlearning` package as one zip file (adapters/tracking.py `packed_code`: a
# tracking server takes one upload per file, and checks the login of each). Python imports it from there once the
# zip is on sys.path; beside the repository there is no zip and the package imports as it is.
PACKED = __file__[: len(__file__) - len("champion_loader.py")] + "unlearning.zip"
if exists(PACKED):
    _add_code_to_system_path(PACKED)

from unlearning import serving  # noqa: E402  (after the zip is on sys.path)
from unlearning.data.dataset import DataError  # noqa: E402


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


def guard_scoring_server() -> None:
    """Wrap MLflow's scoring server's request handler (`mlflow.pyfunc.scoring_server.invocations`, which its app
    calls by that name) once per process: a failed request is answered with `serving.safe_error_message` (the
    champion's own bad-row errors are value-free already and pass), a refused content type with a fixed line,
    and a CSV body against raw columns (typed `any`) is parsed without the schema's dtypes, as the JSON body is."""
    from mlflow.pyfunc import scoring_server as server

    if getattr(server.invocations, "champion_guard", False):
        return
    unguarded = server.invocations

    def invocations(data, content_type, model, input_schema):
        mime = str(content_type or "").split(";")[0].strip().lower()
        schema = None if mime == server.CONTENT_TYPE_CSV and _untyped(input_schema) else input_schema
        try:
            result = unguarded(data, content_type, model, schema)
        except RowError:
            raise
        except MlflowException as e:
            raise RowError(serving.safe_error_message(str(e.message), e.__cause__ or e.__context__),
                           error_code=BAD_REQUEST if e.get_http_status_code() < 500 else INTERNAL_ERROR) from None
        except Exception as e:  # noqa: BLE001  (any failure: its message and trace stay in the server)
            raise RowError(serving.safe_error_message("", e), error_code=BAD_REQUEST) from None
        if result.status >= 400:
            body = RowError(serving.unsupported_request_message(result.status), error_code=BAD_REQUEST)
            return server.InvocationsResponse(body.serialize_as_json(), result.status, "application/json")
        return result

    invocations.champion_guard = True
    server.invocations = invocations


def _untyped(schema) -> bool:
    """Whether a signature's input columns are all of any type (a raw table's: unlearning checks them itself)."""
    from mlflow.types.schema import AnyType

    inputs = getattr(schema, "inputs", None) or []
    return bool(inputs) and all(isinstance(getattr(c, "type", None), AnyType) for c in inputs)


def _load_pyfunc(data_path: str) -> ServedChampion:
    """MLflow's loader hook: `data_path` is the checkpoint inside the downloaded model folder. Loaded inside a
    scoring server (`mlflow models serve`), it guards the server's answers first (`guard_scoring_server`)."""
    guard_scoring_server()
    return ServedChampion(serving._load_pyfunc(data_path))
