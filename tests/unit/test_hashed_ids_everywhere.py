"""`deletion.hash_sample_ids`: what the pipeline publishes names hashed ids only (docs/erasure.md: "MLflow artifacts, params
and tags carry hashed ids only"), also where the audit found plain ones: `unlearn audit`'s MLflow run and
Prefect log lines, and the candidate's figure of its worst forget samples (titles rendered into pixels).

Fast: a tiny digits project (150 training rows, one epoch) and the audit flow's body with its Prefect tasks
run as plain functions, so no Prefect server starts; `run_logger` then logs to the `unlearning` logger,
which is where the flow's Prefect log lines come from. The MLflow stores are SQLite files under tmp_path."""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pandas as pd
import pytest

from tests.helpers import make_project
from unlearning.config import load_params
from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id
from unlearning.requests import RequestValidationError

UNKNOWN = "ZZSECRET-0077"  # named by a request, in no manifest (a typo, or an id erased earlier)
HASHED = {"mlflow_db": "mlflow-hashed.db", "mlflow_artifacts": "mlartifacts-hashed"}
PLAIN = {"mlflow_db": "mlflow-plain.db", "mlflow_artifacts": "mlartifacts-plain"}
WORD = re.compile(r"[A-Za-z0-9_.\-]+")


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def params_file(root, name: str, hashed: bool, paths: dict):
    path = make_project(root, {"deletion": {"hash_sample_ids": hashed}, "base": {"paths": paths},
                               "train": {"epochs": 1}, "prepare": {"max_train": 150, "max_val": 40}},
                        inbox_files=False)
    return path.rename(root / name)


def train_original(params) -> None:
    """prepare + the original, as `dvc repro train` leaves them (task bodies only: no Prefect server)."""
    from tasks.state import StateSettings, current_fingerprint, original_path
    from tasks.training import model_spec, prepare_dataset, save_checkpoint, train_original
    from unlearning.data import load_prepared

    prepare_dataset.fn(params)
    prepared = load_prepared(params.path("prepared_dir"))
    model, metrics = train_original.fn(params, prepared, "cpu")
    save_checkpoint.fn(model.cpu(), original_path(params.project_paths), {
        "model_version": "1", "spec": model_spec(params.train.model, prepared), "metrics": metrics,
        "fingerprint": current_fingerprint(StateSettings.of(params), prepared)})


def request_file(path, ids: list[str]):
    path.write_text("request_id,sample_id,requested_at,reason\n"
                    + "".join(f"a-{i},{s},2026-11-30T10:00:00Z,audit\n" for i, s in enumerate(ids)))
    return path


def run_audit(request, params_path) -> tuple[dict | None, list[str], Exception | None]:
    """(result, log lines, the error it raised) of the audit flow's body. The params decide the store:
    mlflow.set_tracking_uri (in Tracker) exports MLFLOW_TRACKING_URI, which would send the next run to this one's."""
    import flows.audit as A

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    lines, logger = Lines(), logging.getLogger("unlearning")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        return A.audit.fn(str(request), str(params_path)), lines.messages, None
    except RequestValidationError as e:
        return None, lines.messages, e
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    import prefect

    import flows.audit as A
    from unlearning.data import load_prepared
    from unlearning.privacy.salt import id_salt

    root = tmp_path_factory.mktemp("audit-hashed")
    hashed, plain = params_file(root, "hashed.yaml", True, HASHED), params_file(root, "plain.yaml", False, PLAIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for name, obj in list(vars(A).items()):  # whatever tasks the flow calls, as plain functions
            if isinstance(obj, prefect.Task):
                mp.setattr(A, name, obj.fn)
        params = load_params(hashed)
        train_original(params)
        prepared = load_prepared(params.path("prepared_dir"))
        m = prepared.manifest
        forget = m.loc[m["split"] == "train", "sample_id"].astype(str).tolist()[:3]
        good, bad = request_file(root / "good.csv", forget), request_file(root / "bad.csv", [UNKNOWN, forget[0]])
        out = {"root": root, "salt": id_salt(params), "forget": forget,
               "plain_ids": {*m["sample_id"].astype(str), UNKNOWN},
               "hashed": run_audit(good, hashed), "bad": run_audit(bad, hashed), "plain": run_audit(good, plain)}
    return out


def store_files(root, paths: dict):
    yield root / paths["mlflow_db"]
    yield from (f for f in (root / paths["mlflow_artifacts"]).rglob("*") if f.is_file())


def plain_ids_in(text: str, plain_ids: set[str]) -> set[str]:
    return set(WORD.findall(text)) & plain_ids


def artifact_json(root, paths: dict, run_id: str, name: str):
    (path,) = [f for f in store_files(root, paths) if run_id in f.parts and f.name == name]
    return json.loads(path.read_text())


def test_the_audit_run_in_mlflow_names_hashed_ids_only(audited):
    """Artifacts (leverage tables, report, GX result, Data Docs), params, tags, run names: the SQLite store and
    the artifact folder, byte for byte, of a valid and an invalid file's audit."""
    root, plain_ids = audited["root"], audited["plain_ids"]
    leaks = {str(f.relative_to(root)): sorted(plain_ids_in(f.read_bytes().decode("latin-1"), plain_ids))[:3]
             for f in store_files(root, HASHED)}
    assert {f: ids for f, ids in leaks.items() if ids} == {}
    result = audited["hashed"][0]
    table = artifact_json(root, HASHED, result["run_id"], "leverage_forget.json")
    ids = [row[table["columns"].index("sample_id")] for row in table["data"]]
    assert sorted(ids) == sorted(hash_sample_id(s, audited["salt"]) for s in audited["forget"])


def test_the_audit_log_lines_name_hashed_ids_only(audited):
    _, lines, error = audited["hashed"]
    assert error is None and any("highest self-leverage" in line for line in lines)
    text = "\n".join(lines)
    assert plain_ids_in(text, audited["plain_ids"]) == set()
    assert any(hash_sample_id(s, audited["salt"]) in text for s in audited["forget"])  # the table is still there


def test_an_invalid_file_fails_naming_hashed_ids_only(audited):
    """The error the flow raises (Prefect logs it) names the unknown id by its hash, like the batch's problems."""
    _, lines, error = audited["bad"]
    assert isinstance(error, RequestValidationError)
    message = str(error)
    assert "not in the manifest" in message and hash_sample_id(UNKNOWN, audited["salt"]) in message
    assert plain_ids_in(message + "\n".join(lines), audited["plain_ids"]) == set()


def test_without_hashing_the_audit_is_unchanged(audited):
    result, lines, error = audited["plain"]
    assert error is None
    table = artifact_json(audited["root"], PLAIN, result["run_id"], "leverage_forget.json")
    assert sorted(row[table["columns"].index("sample_id")] for row in table["data"]) == sorted(audited["forget"])
    top = next(line for line in lines if "highest self-leverage" in line)
    assert set(audited["forget"]) & set(WORD.findall(top))


# --- figures: a Tracker whose MLflow client records what it is given ----------------------------------------


class Recorder:
    """The MLflow client's calls a figure or a text goes through: the figures' texts, the texts, the tags."""

    def __init__(self):
        self.figures: dict[str, dict] = {}
        self.texts: dict[str, str] = {}
        self.tags: dict[str, str] = {}

    def log_figure(self, run_id, fig, artifact_file):
        from matplotlib.text import Text

        self.figures[artifact_file] = {"titles": [ax.get_title() for ax in fig.axes],
                                       "texts": [t.get_text() for t in fig.findobj(Text)]}

    def log_text(self, run_id, text, artifact_file):
        self.texts[artifact_file] = text

    def set_tag(self, run_id, key, value):
        self.tags[key] = value

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.tags.update({t.key: t.value for t in tags})


def recording_tracker(redaction: dict | None):
    from adapters.tracking import Tracker

    tracker = Tracker.__new__(Tracker)  # no MLflow store: only what reaches the client matters here
    tracker.redaction, tracker.client = redaction, Recorder()
    return tracker


NAMES = ["ZZSECRET-0077", "ZZSECRET-0078"]
KEYED = {s: hash_sample_id(s, "digits") for s in [*NAMES, "ZZSECRET-0079"]}


def candidate(names: list[str]):
    from tasks.batch import CandidateOutcome
    from unlearning.certificate.gate import Verdict

    rng = np.random.default_rng(0)
    per_sample = pd.DataFrame({"sample_id": names, "split": ["forget"] * len(names), "klom": [0.1, 0.2],
                               "klom_null_example": [0.1, 0.1]})
    return CandidateOutcome(method="finetune", model=None, metrics={"acc/forget": 0.5}, cost={},
                            verdict=Verdict(passed=True, objective="retrain_equivalence"), per_sample=per_sample,
                            worst={"unlearned": rng.normal(size=(4, 2)), "oracle": rng.normal(size=(4, 2)),
                                   "names": list(names)})


def test_worst_forget_margins_panels_are_titled_with_hashed_ids():
    from tasks.stages import log_candidate_figures

    tracker = recording_tracker(KEYED)
    log_candidate_figures(tracker, "run", candidate(NAMES), alpha=0.01)
    titles = tracker.client.figures["worst_forget_margins.png"]["titles"]
    assert len(titles) == 2
    for name, title in zip(NAMES, titles):
        assert title.startswith(HASH_PREFIX) and len(title) >= len(HASH_PREFIX) + 12 and KEYED[name].startswith(title)
    texts = [t for f in tracker.client.figures.values() for t in f["texts"]]
    assert not any(name in t for name in NAMES for t in texts)


def test_without_hashing_the_panels_keep_the_ids():
    from tasks.stages import log_candidate_figures

    tracker = recording_tracker(None)
    log_candidate_figures(tracker, "run", candidate(NAMES), alpha=0.01)
    assert tracker.client.figures["worst_forget_margins.png"]["titles"] == NAMES


def test_any_figure_text_that_is_a_plain_id_is_hashed_before_it_is_rendered():
    """Tracker.log_figure's own net, for a figure a caller titled with an id (a title is pixels once saved)."""
    import matplotlib.pyplot as plt

    tracker = recording_tracker(KEYED)
    fig, ax = plt.subplots()
    ax.set_title("ZZSECRET-0079")
    ax.annotate("3", (0, 0))  # a number stays a number
    tracker.log_figure("run", fig, "f.png")
    plt.close(fig)
    texts = tracker.client.figures["f.png"]["texts"]
    assert "ZZSECRET-0079" not in texts and KEYED["ZZSECRET-0079"][:len(HASH_PREFIX) + 12] in texts and "3" in texts


def test_quoted_ids_inside_logged_text_are_hashed():
    """An error message or a problem line quotes the ids it names (repr): logged, they carry the hash; an
    unquoted word equal to an id is left alone (ids may be plain numbers)."""
    tracker = recording_tracker({**KEYED, "7": hash_sample_id("7", "digits")})
    tracker.log_json("run", {"error": "value 'ZZSECRET-0077' is not in the manifest (ids look like "
                                      "['ZZSECRET-0078']); 7 rows"}, "error.json")
    tracker.set_tags("run", {"note": "see `ZZSECRET-0079`"})
    logged = json.loads(tracker.client.texts["error.json"])["error"]
    assert KEYED["ZZSECRET-0077"] in logged and KEYED["ZZSECRET-0078"] in logged and "; 7 rows" in logged
    assert tracker.client.tags["note"] == f"see `{KEYED['ZZSECRET-0079']}`"
    assert tracker.redact("ZZSECRET-0077") == KEYED["ZZSECRET-0077"]
