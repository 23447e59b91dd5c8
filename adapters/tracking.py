"""MLflow tracking: the ONLY module of the project that imports mlflow.

Runs are addressed by id through `MlflowClient`, never through the thread-local "active run", because
Prefect tasks run in worker threads where the flow's active run is invisible (STACK_NOTES: MLflow).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

from adapters.clock import tracks
from unlearning.privacy.salt import HASH_PREFIX  # a keyed id's form (unlearning/privacy/salt.py hash_sample_id)

PIP_REQUIREMENTS = ["torch==2.13.0"]  # given explicitly: inferring them costs ~10 s per model
# A model that prepares raw rows imports unlearning.data (pandera) and, for images, Pillow.
RAW_REQUIREMENTS = ["pandera", "pillow"]
# The model's loader module: a file shipped into its code/ folder, importable there as `champion_loader`.
LOADER = Path(__file__).resolve().parent / "champion_loader.py"

# MLflow 3 opens an experiment without a kind on its GenAI overview (traces, tokens); these runs are model
# training and validation, so the UI should open on the runs table.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
EXPERIMENT_DESCRIPTION = (
    "Machine-unlearning pipeline. One run per deletion batch (`stage = deletion_batch`, named after the request "
    "file and date), with a child run per step and per unlearning candidate. The batch run's description holds "
    "its summary; its charts hold the champion's history across batches (`history/*`). Useful columns: tags "
    "`method`, `gate`, `model_version`; metrics `n_forgotten`, `wall_seconds`: the shared view `batches` shows "
    "them (`unlearn status` prints its link).")
# The registered model's description in the registry (the Models page): what a version is and how to use one.
MODEL_DESCRIPTION = (
    "The pipeline's classifier: the trained original (`unlearn train`) and, after it, one version per applied "
    "deletion batch: the model after it forgot the batch's rows, registered by the batch run it links to "
    "(tags: `batch_id`, `method`; `promoted=true` on the versions that became champion, `promoted=false` on "
    "those of a batch that failed afterwards). The alias (`champion` by default, `tracking.alias`) names the "
    "version to serve: `mlflow.pyfunc.load_model(\"models:/<name>@champion\")`. Input: the prepared store's "
    "features `[B, d]`, or raw rows for a project's own table or image folder (see the version's signature); "
    "output: class probabilities `[B, C]`, one column per class. An erasure deletes the versions trained on "
    "erased rows beyond `erasure.keep_versions` (docs/erasure.md); docs/review.md says how to review a batch.")
# A shared view of the runs table (MLflow stores shared views as experiment tags; the UI opens one from
# `?viewStateShareKey=`): the batch runs, newest first, with the columns a reviewer needs.
BATCHES_VIEW = "batches"
BATCHES_COLUMNS = ["tags.`method`", "tags.`gate`", "tags.`model_version`", "metrics.`wall_seconds`",
                   "metrics.`n_forgotten`"]
BATCHES_VIEW_STATE = {"searchFilter": "tags.stage = 'deletion_batch'", "orderByKey": "attributes.start_time",
                      "orderByAsc": False, "selectedColumns": BATCHES_COLUMNS,
                      "columnOrder": ["0", "attributes.`Run Name`", "runDateAndNestInfo", "duration", *BATCHES_COLUMNS],
                      "columnWidths": {"attributes.`Run Name`": 330, "runDateAndNestInfo": 130}}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


# --- how many requests a batch makes (bench/session_overhead.py): with UNLEARN_MLFLOW_REQUESTS=<file> set, each
# store call of a Tracker ("call") and each HTTP request to a tracking server ("http": the REST calls and the
# artifact uploads, Model.log's own included) appends one line "<stage label>\t<kind>\t<what>" to that file (what:
# the client method, or the HTTP method and path). A team server checks the login of every request
# (docs/operations.md): their number is the batch's tracking cost there.
REQUESTS_ENV = "UNLEARN_MLFLOW_REQUESTS"


def count_request(kind: str, what: str = "") -> None:
    path = os.environ.get(REQUESTS_ENV)
    if path:
        from adapters.clock import stage_label

        with open(path, "a", encoding="utf-8") as f:  # one short write: O_APPEND keeps lines whole across processes
            f.write(f"{stage_label('python')}\t{kind}\t{what}\n")


def _count_http_requests() -> None:
    """Count every HTTP request MLflow's REST client sends (its one request function, looked up by name at each
    request), once per process."""
    from mlflow.utils import rest_utils

    send = rest_utils._get_http_response_with_retries
    if getattr(send, "counted", False):
        return

    def counted(method, url, *args, **kwargs):
        from urllib.parse import urlparse

        count_request("http", f"{method} {urlparse(url).path}")
        return send(method, url, *args, **kwargs)

    counted.counted = True
    rest_utils._get_http_response_with_retries = counted


_count_http_requests()


class CountedClient:
    """An MlflowClient whose every call counts one store call (`count_request("call")`)."""

    def __init__(self, client: MlflowClient):
        self._client = client

    def __getattr__(self, name):
        if name.startswith("__") or name == "_client":  # pickling (a Dask task graph) asks before _client is set
            raise AttributeError(name)
        member = getattr(self._client, name)
        if not callable(member):
            return member

        def call(*args, **kwargs):
            count_request("call", name)
            return member(*args, **kwargs)

        return call


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached or written: found before any state changes."""


@tracks
def preflight(tracking_uri: str, timeout: float = 5.0) -> None:
    """Fail fast (well within 10 s, no retries) when the tracking store is unusable, with the fix
    (adapters.store_check: an unreachable server, an unwritable folder, a damaged SQLite file)."""
    from adapters.store_check import tracking_store_problem

    problem = tracking_store_problem(tracking_uri, timeout)
    if problem:
        raise TrackingUnavailable(problem)


# An id quoted inside a longer text: repr() in problem lines and error messages ('id', "id"), markdown (`id`).
_QUOTED = re.compile(r"""(['"`])([^'"`\s]+)\1""")
DISPLAY_HEX = 12  # hex digits of a hashed id shown where space is short (a figure's panel title)


def _redact_text(text: str, mapping: dict) -> str:
    """The text itself when it is a plain id, else the text with each QUOTED plain id replaced: error messages
    and problem lines quote the ids they name. Unquoted words stay as they are, so a number in a sentence is
    not rewritten where the dataset's ids are numbers too."""
    if text in mapping:
        return mapping[text]
    return _QUOTED.sub(lambda m: m.group(1) + mapping.get(m.group(2), m.group(2)) + m.group(1), text)


def _redact(value, mapping: dict):
    if isinstance(value, str):
        return _redact_text(value, mapping)
    if isinstance(value, dict):
        return {_redact(k, mapping) if isinstance(k, str) else k: _redact(v, mapping) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v, mapping) for v in value]
    return value


def display_form(hashed: str) -> str:
    """A hashed id cut to its first DISPLAY_HEX hex digits, for a figure's panel title: still no plain id, and
    enough to find the sample's full hash in the run's tables (any other value is returned as it is)."""
    if hashed.startswith(HASH_PREFIX):
        return hashed[:len(HASH_PREFIX) + DISPLAY_HEX]
    return hashed


@contextmanager
def fluent_store(tracking_uri: str):
    """`Model.log` is MLflow's fluent API: it writes to the process-wide tracking URI, and
    `mlflow.set_tracking_uri` also exports it as MLFLOW_TRACKING_URI (which this project reads as an override of
    every params file). So the URI is set for the call only and both are put back: a second project in the
    same process (a test, a notebook, a server serving two projects) keeps writing to its own store."""
    from mlflow.tracking._tracking_service import utils as tracking_utils

    before = getattr(tracking_utils, "_tracking_uri", None)
    before_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


@tracks
class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str | Path | None = None):
        self.tracking_uri = tracking_uri
        self.redaction: dict | None = None  # plain id -> hashed id (deletion.hash_sample_ids): nothing plain is logged
        self.client = CountedClient(MlflowClient(tracking_uri=tracking_uri))
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            location = Path(artifact_root).resolve().as_uri() if artifact_root else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id
        tags = exp.tags if exp is not None else {}
        if tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
            self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)
        if "mlflow.note.content" not in tags:
            self.client.set_experiment_tag(self.experiment_id, "mlflow.note.content", EXPERIMENT_DESCRIPTION)
        view = json.dumps(BATCHES_VIEW_STATE)
        if tags.get(f"mlflow.sharedViewState.{BATCHES_VIEW}") != view:
            self.client.set_experiment_tag(self.experiment_id, f"mlflow.sharedViewState.{BATCHES_VIEW}", view)

    # runs -------------------------------------------------------------------------------------
    def start_run(self, name: str, parent_id: str | None = None, tags: dict | None = None) -> str:
        tags = {k: str(self._r(v)) for k, v in (tags or {}).items()}
        name = str(self._r(name))
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def end_run(self, run_id: str, ok: bool = True, seconds: float | None = None) -> None:
        """End the run; `seconds`: its duration as the UI's Duration column shows it (end time = start time +
        `seconds`), so a duration the run also logs (a batch's `wall_seconds`) is the same number there."""
        end_time = None
        if seconds is not None:
            end_time = self.client.get_run(run_id).info.start_time + int(round(seconds * 1000))
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED),
                                   end_time=end_time)

    def run_seconds(self, run_id: str) -> float:
        """Seconds since the run started (its start time in the store, wall clock)."""
        import time

        return max(0.0, time.time() - self.client.get_run(run_id).info.start_time / 1000)

    def set_tags(self, run_id: str, tags: dict) -> None:
        """All tags in one call (`log_batch`; a team server checks each request's login), not one per key."""
        from mlflow.entities import RunTag

        items = [RunTag(k, str(self._r(v))) for k, v in tags.items()]
        for i in range(0, len(items), 100):  # MLflow's limit per call
            self.client.log_batch(run_id, tags=items[i:i + 100])

    DESCRIPTION_LIMIT = 8000  # MLflow's tag value limit; a longer value is cut (with a warning) by the client

    def set_description(self, run_id: str, markdown: str, artifact_file: str = "description.md") -> None:
        """The run's description in the MLflow UI (markdown, the `mlflow.note.content` tag). Past MLflow's tag
        limit the whole text goes to `artifact_file` and the description keeps its first lines and says so."""
        text = str(self._r(markdown))
        if len(text) > self.DESCRIPTION_LIMIT:
            self.client.log_text(run_id, text, artifact_file)
            note = f"\n\n... (cut here: the whole text is the artifact `{artifact_file}`)"
            head = text[:self.DESCRIPTION_LIMIT - len(note)]
            text = head[:head.rfind("\n")] + note
        self.client.set_tag(run_id, "mlflow.note.content", text)

    def _r(self, value):
        return _redact(value, self.redaction) if self.redaction else value

    def redact(self, value):
        """`value` as this tracker logs it (plain ids hashed under deletion.hash_sample_ids): for what the flow
        shows elsewhere (Prefect log lines, an error's message), so it names the ids the way the run does."""
        return self._r(value)

    def display_id(self, sample_id: str) -> str:
        """How a figure names a sample: its hashed id cut for display (`display_form`) under redaction, else
        the id itself (figures are pixels, which the redaction of logged text cannot reach)."""
        if not self.redaction or sample_id not in self.redaction:
            return sample_id
        return display_form(self.redaction[sample_id])

    # values -----------------------------------------------------------------------------------
    def log_params(self, run_id: str, params: dict) -> None:
        """All params in batched calls (one round trip per 100, MLflow's limit), not one call per key."""
        from mlflow.entities import Param

        items = []
        for k, v in _flatten(params).items():
            v = self._r(v)
            items.append(Param(k, json.dumps(v) if isinstance(v, (list, tuple)) else str(v)[:6000]))
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, metrics: dict, step: int | None = None) -> None:
        """Finite numbers only, in batched calls (MLflow's limit: 1000 metrics per call). Names keep their `/`
        (`klom_p95/forget`): MLflow groups the charts by the part before it."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in _flatten(metrics).items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i:i + 1000])

    def log_series(self, run_id: str, points: list[dict], names: dict[str, str], step_key: str = "step") -> None:
        """Step-indexed metrics in one call: for each point, metric names[k] = point[k] at step point[step_key]."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key=name, value=float(p[k]), timestamp=now, step=int(p[step_key]))
                 for p in points for k, name in names.items()
                 if isinstance(p.get(k), (int, float)) and math.isfinite(float(p[k]))]
        for i in range(0, len(batch), 1000):  # the REST API's limit per call
            self.client.log_batch(run_id, metrics=batch[i:i + 1000])

    # artifacts --------------------------------------------------------------------------------
    def log_json(self, run_id: str, obj, artifact_file: str) -> None:
        obj = self._r(json.loads(json.dumps(obj, default=str))) if self.redaction else obj
        self.client.log_text(run_id, json.dumps(obj, indent=2, sort_keys=True, default=str), artifact_file)

    def log_table(self, run_id: str, df, artifact_file: str) -> None:
        """A table the MLflow UI shows as one (`client.log_table`): a JSON artifact in pandas' "split" layout,
        so `artifact_file` ends in `.json` (MLflow refuses other names; logging a name again appends rows)."""
        self.client.log_table(run_id, self._redact_frame(df), artifact_file)

    def redact_frame(self, df):
        """The frame as `log_table` logs it: for a table the flow also shows elsewhere (a Prefect log line)."""
        return self._redact_frame(df)

    def _redact_frame(self, df):
        """The frame with every plain id in its text columns (any text dtype) replaced by its hash."""
        if not self.redaction:
            return df
        df = df.copy()
        for col in df.columns:
            if getattr(df[col].dtype, "kind", "O") not in "biufcmM":
                df[col] = df[col].map(lambda v: self.redaction.get(v, v) if isinstance(v, str) else v)
        return df

    def log_datasets(self, run_id: str, datasets: dict, source: str, name: str | None = None) -> None:
        """The run's Datasets panel: one `mlflow.data` dataset per context ("forget", "retain", ...), each with
        a digest of its whole content, its schema and its row count. MLflow stores no rows, and the frames
        should hold ids, labels and splits only, never feature values (erasure must find no copy of a
        forgotten row); the ids are redacted like every logged value."""
        import mlflow.data
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        inputs = []
        for context, df in datasets.items():
            df = self._redact_frame(df).reset_index(drop=True)
            with warnings.catch_warnings():
                # MLflow registers the local artifact store twice ("" and "file" schemes) and says a local path
                # "can be interpreted in multiple ways"; its integer-column hint is about model inputs, and
                # this schema only describes the logged frame.
                warnings.filterwarnings("ignore", "The specified dataset source can be interpreted")
                warnings.filterwarnings("ignore", "Hint: Inferred schema contains integer column")
                ds = mlflow.data.from_pandas(df, source=source, name=f"{name}-{context}" if name else context,
                                             digest=frame_digest(df))
                entity = ds._to_mlflow_entity()
            inputs.append(DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
        self.client.log_inputs(run_id, datasets=inputs)

    def log_figure(self, run_id: str, fig, artifact_file: str) -> None:
        """The figure as an image artifact. Under redaction a text of the figure that is a plain id (a panel
        titled with a sample) is replaced by `display_id` before it is rendered: once in pixels, no later
        check could find it (the caller closes the figure; its texts are changed in place)."""
        self._redact_figure(fig)
        self.client.log_figure(run_id, fig, artifact_file)

    def _redact_figure(self, fig) -> None:
        if not self.redaction:
            return
        from matplotlib.text import Text

        for text in fig.findobj(Text):
            shown = text.get_text()
            if shown in self.redaction:
                text.set_text(self.display_id(shown))

    def log_dir(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """Every file under the folder `path` (e.g. a Great Expectations Data Docs site)."""
        self.client.log_artifacts(run_id, str(path), artifact_path)

    # models -----------------------------------------------------------------------------------
    def log_model(self, run_id: str, model, registered_name: str, input_example=None,
                  class_names: list[str] | None = None, preparation: dict | None = None) -> str:
        """Log the ensemble as a pyfunc model, register it, return the new registry version.

        The model (unlearning/serving.py) maps features [B, d] (a DataFrame or an array) to class probabilities
        [B, C], a DataFrame with one column per class name. With `preparation` (a recipe of
        unlearning/data/preparation.py: a table's scaling and categories, an image folder's size and channels)
        it maps raw rows instead: its signature names the raw columns (their types: metadata `input_types`), and its
        input example is
        one row made from the recipe (`example_rows`: no data row); `input_example` is then unused. It carries
        the project's checkpoint and, as code,
        the `unlearning` package (and a custom factory's module) and its loader (adapters/champion_loader.py: bad raw
        rows answer a REST client with their one-line error), so it loads with `mlflow.pyfunc.load_model`
        without this repository. `input_example`: a few feature rows [k, d] (zeros when None: no data row
        lands in the registry unless the caller chooses one). Logged to `run_id` directly, without the
        thread-local active run (Prefect tasks run in other threads); the logged model is created in this
        experiment first (`Model.log` alone would file it under the default experiment's artifact root)."""
        import mlflow.pyfunc
        from mlflow.models import Model

        from unlearning import serving

        names = serving.class_names_for(class_names, model.n_classes)
        if preparation is not None:
            from unlearning.data.preparation import example_rows, raw_inputs

            example, signature = example_rows(preparation), raw_signature(raw_inputs(preparation), names)
            described = f"raw rows: {[c for c, _ in raw_inputs(preparation)]} (types: input_types)"
            types = dict(raw_inputs(preparation))
        else:
            example = np.zeros((2, model.in_dim), np.float32) if input_example is None else \
                np.asarray(input_example, dtype=np.float32).reshape(-1, model.in_dim)
            signature = model_signature(model.in_dim, names)
            described, types = f"features [B, {model.in_dim}] (the prepared store's columns)", None
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = serving.write_checkpoint(model, Path(tmp), names, preparation)
            code = packed_code(Path(tmp) / "code", [LOADER, *serving.code_paths(model)])
            logged = self.client.create_logged_model(self.experiment_id, name="model", source_run_id=run_id)
            # MLflow's INFO "Validating input example against model signature" on every registration is noise; a
            # failed validation is a WARNING and still shows.
            with fluent_store(self.tracking_uri), _logger_level("mlflow.pyfunc", logging.WARNING):
                info = Model.log(artifact_path=None, name="model", flavor=mlflow.pyfunc, run_id=None,
                                 model_id=logged.model_id,
                                 registered_model_name=registered_name, loader_module=LOADER.stem,
                                 data_path=str(checkpoint),
                                 code_paths=code,
                                 signature=signature, input_example=example,
                                 pip_requirements=PIP_REQUIREMENTS + (RAW_REQUIREMENTS if preparation else []),
                                 metadata={"output": "class probabilities [B, C], one column per class",
                                           "input": described,
                                           "n_members": model.n_models, "arch": model.arch,
                                           **({"input_types": types} if types else {})})
        # Model.log without the run: given one, it also copies each of the run's metrics onto the logged model,
        # one request per metric (a batch run holds ~20: a login check each on a team server). The version still
        # names the run (the logged model's source run); the run lists the model as its output (one request).
        from mlflow.entities import LoggedModelOutput

        self.client.log_outputs(run_id, models=[LoggedModelOutput(logged.model_id, step=0)])
        self.describe_model(registered_name)
        return str(info.registered_model_version)

    def describe_model(self, name: str, description: str = MODEL_DESCRIPTION) -> None:
        """The registered model's description (the registry's Models page), set where it differs."""
        if (self.client.get_registered_model(name).description or "") != description:
            self.client.update_registered_model(name, description=description)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def set_version_tags(self, name: str, version: str, tags: dict) -> None:
        for k, v in tags.items():
            self._version_tag(name, version, k, str(v))

    def _version_tag(self, name: str, version: str, key: str, value: str) -> None:
        """One tag of a model version in one request: MlflowClient.set_model_version_tag first fetches the registered
        model to refuse a prompt (a second request, a second login check on a team server); the pipeline's
        registered model (tracking.registered_model) is never one, so its registry client is asked directly."""
        count_request("call", "set_model_version_tag")
        registry = getattr(self.client, "_client", self.client)._get_registry_client()
        registry.set_model_version_tag(name, str(version), key, value)

    def alias_version(self, name: str, alias: str) -> str | None:
        return _alias_version(self.client, name, alias)

    def has_version(self, name: str, version: str) -> bool:
        """Whether the registry holds `name` version `version` (not after mlflow.db was replaced by a new one)."""
        return _has_version(self.client, name, version)

    # reconciliation and erasure ------------------------------------------------------------------
    def reconcile_alias(self, name: str, alias: str, version: str | None) -> tuple[str | None, bool]:
        """Point name@alias at `version` (what state/champion.json says) unless it already does; tag the
        champion `promoted=true`. Idempotent. Returns (alias before, changed)."""
        if version is None:
            return self.alias_version(name, alias), False
        before = self.alias_version(name, alias)
        if not self.has_version(name, version):  # a new (or another) store: nothing to point at, until a promotion
            return before, False
        changed = before != str(version)
        if changed:
            self.client.set_registered_model_alias(name, alias, str(version))
        self._version_tag(name, str(version), "promoted", "true")
        return before, changed

    def fail_stale_runs(self, stage: str = "deletion_batch") -> list[str]:
        """Mark RUNNING runs of `stage` (and their child runs) FAILED with tag killed=true: called under the
        batch lock, so no live process owns them (a killed batch)."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.stage = '{stage}' and "
                                       f"attributes.status = 'RUNNING'", max_results=1000)
        failed = []
        for r in runs:
            children = self.client.search_runs([self.experiment_id], filter_string=
                                               f"tags.mlflow.parentRunId = '{r.info.run_id}' and "
                                               f"attributes.status = 'RUNNING'", max_results=1000)
            for c in [*children, r]:
                self.client.set_tag(c.info.run_id, "killed", "true")
                self.end_run(c.info.run_id, ok=False)
                failed.append(c.info.run_id)
        return failed

    def tag_unpromoted(self, name: str, champion: str | None) -> list[str]:
        """Tag registered versions of batches that never became champion `promoted=false`."""
        tagged = []
        try:
            versions = self.client.search_model_versions(f"name = '{name}'")
        except Exception:
            return tagged
        for v in versions:
            if str(v.version) != str(champion) and "promoted" not in (v.tags or {}) and "batch_id" in (v.tags or {}):
                self._version_tag(name, v.version, "promoted", "false")
                tagged.append(str(v.version))
        return tagged

    def unpromoted_versions(self, name: str) -> list[str]:
        """The versions tagged `promoted=false` (`tag_unpromoted`: registered by batches that failed afterwards)."""
        try:
            found = self.client.search_model_versions(f"name = '{name}'")
        except Exception:
            return []
        return sorted((str(v.version) for v in found if (v.tags or {}).get("promoted") == "false"), key=int)

    def versions(self, name: str) -> list[str]:
        try:
            return sorted((str(v.version) for v in self.client.search_model_versions(f"name = '{name}'")), key=int)
        except Exception:
            return []

    def _local_path(self, uri: str) -> Path | None:
        from urllib.parse import unquote, urlparse

        if uri.startswith("file:"):
            return Path(unquote(urlparse(uri).path))
        if "://" not in uri and uri:
            return Path(uri)
        return None

    def purge_versions(self, name: str, keep: set[str]) -> list[dict]:
        """Delete every registered version of `name` not in `keep`, with its model artifacts (local stores)."""
        purged = []
        for version in self.versions(name):
            if version in keep:
                continue
            removed = None
            try:
                uri = self.client.get_model_version_download_uri(name, version)
                local = self._local_path(uri)
                if local is not None and local.exists():
                    import shutil

                    shutil.rmtree(local, ignore_errors=True)
                    removed = str(local)
                elif uri.startswith(("mlflow-artifacts:", "http://", "https://")):  # a server's store: its API
                    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

                    get_artifact_repository(uri).delete_artifacts()
                    removed = uri
            except Exception:
                pass
            self.client.delete_model_version(name, version)
            purged.append({"version": version, "artifacts_removed": removed})
        return purged

    def version_sources(self, name: str, versions) -> dict[str, dict]:
        """{version: {"run_id", "model_id"}}: the run that registered each version and its logged model (read
        before an erasure deletes them: afterwards the registry no longer knows)."""
        out = {}
        for v in versions:
            try:
                mv = self.client.get_model_version(name, str(v))
            except Exception:
                continue
            # MLflow 3 registers a logged model as `models:/<model id>` (the version's own model_id may be None)
            source = str(mv.source or "")
            model_id = getattr(mv, "model_id", None) or (source[len("models:/"):] if source.startswith("models:/m-")
                                                          else None)
            out[str(v)] = {"run_id": mv.run_id, "model_id": model_id}
        return out

    def unlink_deleted_versions(self, name: str, sources: dict[str, dict], note: str) -> None:
        """After an erasure deleted these versions (`version_sources` read them before): each logged model's
        `mlflow.modelVersions` tag (the run page's link to the registry) drops them, and the logged model and
        the run say which version was deleted and why (`deleted_model_versions`, `model_version_deleted`), so
        no page links a version that answers 404."""
        for version, src in sources.items():
            model_id, run_id = src.get("model_id"), src.get("run_id")
            if model_id:
                try:
                    tags = self.client.get_logged_model(model_id).tags or {}
                    links = [v for v in json.loads(tags.get("mlflow.modelVersions", "[]"))
                             if not (v.get("name") == name and str(v.get("version")) == version)]
                    gone = json.loads(tags.get("deleted_model_versions", "[]")) + [f"{name} v{version}: {note}"]
                    self.client.set_logged_model_tags(model_id, {"mlflow.modelVersions": json.dumps(links),
                                                                 "deleted_model_versions": json.dumps(gone)})
                except Exception:  # a logged model of another store or version: nothing links it here
                    pass
            if run_id:
                try:
                    self.client.set_tag(run_id, "model_version_deleted", f"v{version}: {note}")
                except Exception:
                    pass

    def description(self, run_id: str) -> str:
        """The run's description (`mlflow.note.content`), "" when it has none or the run is gone."""
        try:
            return self.client.get_run(run_id).data.tags.get("mlflow.note.content", "")
        except Exception:
            return ""

    def run_url_hint(self, run_id: str, tab: str = "") -> str:
        """The run's page (`tab`: e.g. "artifacts/champion_history.png"), in the model-training workflow: MLflow 3
        opens a run page on its GenAI side bar otherwise."""
        route = f"#/experiments/{self.experiment_id}/runs/{run_id}" + (f"/{tab}" if tab else "")
        return f"{route}?workflowType=machine_learning"

    def batches_url_hint(self) -> str:
        """The runs table of the batch runs with the reviewer's columns, in the model-training workflow."""
        return batches_url_hint(self.experiment_id)


def batches_url_hint(experiment_id: str) -> str:
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={BATCHES_VIEW}&workflowType=machine_learning"


# --- the review UI (adapters/mlflow_ui.py): MLflow's server, its store and its CLI ---------------------------------
def batches_views() -> dict[str, dict]:
    """Experiment id -> its `batches` shared view (the tag `Tracker` keeps), read from the running MLflow server's
    own store (the UI's page seeds it as the experiment's saved runs-table state)."""
    from mlflow.server.handlers import _get_tracking_store

    tag = f"mlflow.sharedViewState.{BATCHES_VIEW}"
    views = {}
    for exp in _get_tracking_store().search_experiments(max_results=1000):
        if tag in exp.tags:
            try:
                views[exp.experiment_id] = json.loads(exp.tags[tag])
            except ValueError:  # a damaged tag: that experiment opens as MLflow would open it
                continue
    return views


def mlflow_server_app():
    """(MLflow's server app (ASGI), the path prefix it serves its page under)."""
    from mlflow.server.fastapi_app import app
    from mlflow.server.handlers import STATIC_PREFIX_ENV_VAR

    return app, os.environ.get(STATIC_PREFIX_ENV_VAR, "")


def run_mlflow_server(argv: list[str], app_name: str, app_path: str) -> None:
    """`mlflow server <argv>` serving the app factory at `app_path` ("module:function"). MLflow's CLI takes another
    app only as an installed plugin's name (`--app-name`, an entry point); here its server runner is given
    `app_name` and the name is answered with `app_path` directly, so nothing is installed. An `--app-name` of
    the command line (basic-auth...) still wins."""
    import mlflow.server
    from mlflow.cli import cli

    find_app, run_server = mlflow.server._find_app, mlflow.server._run_server

    def run_with_app(**options):
        if options.get("app_name") is None:
            options["app_name"] = app_name
        return run_server(**options)

    mlflow.server._find_app = lambda name: app_path if name == app_name else find_app(name)
    mlflow.server._run_server = run_with_app
    cli.main(["server", *argv], prog_name="mlflow")


def _alias_version(client: MlflowClient, name: str, alias: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except Exception:  # no such model or alias yet
        return None


def _has_version(client: MlflowClient, name: str, version: str) -> bool:
    try:
        client.get_model_version(name, str(version))
        return True
    except Exception:  # no such model or version in this store
        return False


@contextmanager
def _logger_level(name: str, level: int):
    """Raise one third-party logger's level for the block (never lowers it, never touches the root logger)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(max(level, before))
    try:
        yield
    finally:
        logger.setLevel(before)


@tracks
def reset_alias(tracking_uri: str, name: str, alias: str,
                version: str | None = None) -> tuple[str | None, str | None, bool]:
    """Point `name@alias` at `version`, or remove the alias when `version` is None (`unlearn reset`).

    A `version` the registry no longer holds (an erasure purges the versions trained on erased rows, the
    trained original among them) is treated as None: the alias is removed rather than left on a model that
    remembers erased rows (MLflow's set_registered_model_alias would fail there, and may drop the alias first).
    Returns (version before, version after, whether `version` was missing); creates no experiment and no
    registered model."""
    client = MlflowClient(tracking_uri=tracking_uri)
    before = _alias_version(client, name, alias)
    missing = version is not None and not _has_version(client, name, version)
    if missing:
        version = None
    if version is not None:
        client.set_registered_model_alias(name, alias, str(version))
        return before, str(version), False
    if before is not None:
        client.delete_registered_model_alias(name, alias)
    return before, None, missing


def packed_code(folder: Path, paths: list[Path]) -> list[str]:
    """The model's code as few files as it can be: the `unlearning` package zipped into `unlearning.zip` (.py files
    only; adapters/champion_loader.py puts it on sys.path), every other path as it is (the loader, a custom
    factory's module). A tracking server takes one upload per file and checks the login of each: the package
    alone is over a hundred files."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in map(Path, paths):
        if path.is_dir() and path.name == "unlearning":
            packed = folder / "unlearning.zip"
            with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(path.rglob("*.py")):
                    if "__pycache__" not in f.parts:
                        z.write(f, Path("unlearning") / f.relative_to(path))
            out.append(str(packed))
        else:
            out.append(str(path))
    return out


def model_signature(in_dim: int, class_names: list[str]):
    """Input: d unnamed double columns, matched by position, so a DataFrame of the d feature columns (any
    names, in the prepared store's order), an array [B, d] of any float or int dtype and a list of rows all pass
    MLflow's schema check (a float32 tensor spec would refuse pandas' float64). Output: a float column per class."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("double") for _ in range(int(in_dim))]),
                          outputs=Schema([ColSpec("float", str(c)) for c in class_names]))


def raw_signature(columns: list[tuple[str, str]], class_names: list[str]):
    """Input: the raw columns by name (MLflow drops columns it does not name). An image column is `binary` (base64
    over REST). A table's columns are optional and of any type: MLflow neither converts them (its REST parser
    would cut an integer column's 24.7 to 24) nor checks them (its error quotes the whole input, every column of
    every row); the core checks each one (unlearning/data/preparation.py) and its error names the column, the
    rows and what is wrong, no value. Their types are the model's metadata `input_types`. Output: a float column
    per class."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema
    from mlflow.types.schema import AnyType

    return ModelSignature(inputs=Schema([ColSpec(kind, name) if kind == "binary" else
                                         ColSpec(AnyType(), name, required=False) for name, kind in columns]),
                          outputs=Schema([ColSpec("float", str(c)) for c in class_names]))


def frame_digest(df) -> str:
    """A digest of a frame's whole content and columns (MLflow's own digest reads only its first 10,000 rows)."""
    import hashlib

    import pandas as pd

    h = hashlib.sha256(pd.util.hash_pandas_object(df, index=False).values.tobytes())
    h.update(json.dumps([str(c) for c in df.columns]).encode())
    return h.hexdigest()[:16]


def rekey_sqlite_store(db: Path, tmp: Path, rewrite) -> bool:
    """A copy of MLflow's SQLite store `db` at `tmp` with every text value rewritten by `rewrite` (text -> the
    new text, or None when unchanged): the params, tags and descriptions that name keyed ids, re-keyed
    (unlearning/privacy/rekey.py). Returns whether anything changed (`tmp` then holds the copy; else it is removed).
    Only SQLite: a tracking server's store is its own (docs/erasure.md, "Migrating from the salt")."""
    import sqlite3

    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(tmp)
    try:
        src.backup(dst)
        changed = 0
        tables = [r[0] for r in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [r[1] for r in dst.execute(f'PRAGMA table_info("{table}")')
                       if (r[2] or "").upper().startswith(("VARCHAR", "TEXT", "CHAR", "CLOB", "STRING"))]
            for column in columns:
                rows = dst.execute(f'SELECT rowid, "{column}" FROM "{table}" WHERE "{column}" LIKE ?',
                                   ("%sha256:%",)).fetchall()
                for rowid, value in rows:
                    new = rewrite(value) if isinstance(value, str) else None
                    if new is not None:
                        dst.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', (new, rowid))
                        changed += 1
        dst.commit()
    finally:
        src.close()
        dst.close()
    if not changed:
        tmp.unlink(missing_ok=True)
    return bool(changed)


# --- the team MLflow server's login check (deploy/team.py: `authorization_function` in its auth config) -------------
# MLflow's basic auth, with least privilege that holds (docs/operations.md, "Accounts and threat model"). It runs
# inside the team's MLflow server (`mlflow server --app-name basic-auth`), which imports it by name; the policy is
# adapters/server_auth.py's (standard library). Three things MLflow 3.17's own check does not do, measured against
# `make team-up`:
# - only the admin changes accounts, roles, permissions or workspaces (`admin_only`): the auth app let an account
#   holding MANAGE grant and revoke permissions through the 3.0 API. Any other account gets 403 there, in both API
#   generations and the UI's ajax twins, before MLflow's own checks run;
# - failed logins are throttled per account and per client (`LoginThrottle`): 429 with Retry-After while one must
#   wait, the password unchecked;
# - an unknown account costs what a known one does: its password is checked against a dummy hash made as MLflow
#   makes its users' (werkzeug's default), so the time of the answer does not tell who has an account (measured
#   before: 5 ms for an unknown name, 270 ms for a real one).
# A right password goes through MLflow's own credential cache (`auth_cache_ttl_seconds`, set by deploy/team.py),
# so a batch's hundreds of requests pay the slow hash once. The throttle lives in the server process: deploy/team.py
# runs one worker (`--mlflow-workers`); with more, each counts its own.
_LOGINS: dict = {}


def _login_state():
    """The throttle and the dummy hash, made on the first login the server checks (in its process)."""
    if not _LOGINS:
        import secrets

        from werkzeug.security import generate_password_hash

        from adapters.server_auth import LoginThrottle

        _LOGINS.update(throttle=LoginThrottle(), dummy=generate_password_hash(secrets.token_urlsafe(24)))
    return _LOGINS


def _auth_app():
    """MLflow's auth app module (its user store, its 401 answer, its credential cache), inside the server."""
    import mlflow.server.auth as auth

    return auth


def _verified_before(auth, username: str, password: str) -> bool:
    """Whether MLflow's credential cache holds this login as checked (a right password, checked within its TTL):
    then no database query and no hash. Only a login checked right can be there, so this says nothing about a
    wrong one, whose cost stays the same whatever the name."""
    cache = getattr(auth, "_USER_AUTH_CACHE", None)
    if cache is None:
        return False
    with auth._USER_AUTH_CACHE_LOCK:
        return cache.get(auth._auth_cache_key(username, password)) is not None


def team_password_ok(username: str, password: str) -> bool:
    """Whether `password` is the account's, at the same cost for an account that does not exist."""
    from werkzeug.security import check_password_hash

    auth = _auth_app()
    if _verified_before(auth, username, password):
        return True
    if not auth.store.has_user(username):
        check_password_hash(_login_state()["dummy"], password)  # the time of a real check; the answer is no
        return False
    return auth._authenticate_cached(username, password) is not None


def team_authenticate():
    """The team server's `authorization_function`: the request's Authorization (MLflow's own permission checks
    follow), or the Response that refuses it: 401 (no or a wrong login), 429 (too many failed logins), 403 (a
    change only the admin may make)."""
    from flask import Response, request

    from adapters.server_auth import admin_only, retry_after_header

    from flask import g

    auth = _auth_app()
    if getattr(g, "team_login", None) is not None:  # MLflow asks several times per request: checked once
        return g.team_login
    creds = request.authorization
    if creds is None or not creds.username:
        return auth.make_basic_auth_response()
    username, password, client = creds.username, creds.password or "", request.remote_addr or "unknown"
    throttle = _login_state()["throttle"]
    wait = throttle.retry_after(username, client)
    if wait > 0:
        seconds = retry_after_header(wait)
        return Response(f"Too many failed logins: try again in {seconds} s.", status=429,
                        headers={"Retry-After": seconds, "WWW-Authenticate": 'Basic realm="mlflow"'})
    if not team_password_ok(username, password):
        throttle.failed(username, client)
        return auth.make_basic_auth_response()
    if admin_only(request.path, request.method) and not auth.store.get_user(username).is_admin:
        return Response("Permission denied: only the admin changes accounts, roles and permissions.", status=403)
    g.team_login = creds
    return creds
