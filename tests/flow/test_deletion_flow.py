"""The whole pipeline on digits under the shared Prefect test harness, with a real SQLite MLflow store."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from tests.helpers import sample_requests, trained_project
from unlearning.config import load_params
from unlearning.requests import RequestValidationError

pytestmark = pytest.mark.flow


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_harness):
    """prepare + train once for the tests that run batches of their own. A test that needs the sample request
    applied first (a state, an inbox holding its own files only) asks for `sample_applied`; the tests of the
    sample batch's record read `applied` (a project of its own); none relies on the file order."""
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("project")
    trained_project(root)
    return root


@pytest.fixture(scope="module")
def applied_project(tmp_path_factory, prefect_harness):
    """A project of its own for the tests that read the sample batch's record (its ledger, versions, runs): the
    other tests' batches never change what they read, whatever the order."""
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("applied_project")
    trained_project(root)
    return root


@pytest.fixture(scope="module")
def sample_applied(project):
    """The sample request applied to `project` once: a state with a champion, and an inbox holding only what a
    test puts there (for the tests that run the whole inbox)."""
    from flows.deletion_batch import run

    return run(None, str(project / "params.yaml"))


def fresh_ids(root, k: int, skip: int) -> list[str]:
    """k retained training ids (skip keeps tests on disjoint samples): of the live manifest once a batch made
    the state, else of the prepared one, never one the sample request names (the `applied` fixture erases
    those), so a test that only needs ids runs alone, first or last."""
    live = root / "state" / "manifest.csv"
    m = pd.read_csv(live if live.exists() else root / "data" / "prepared" / "manifest.csv", dtype=str)
    sample = set().union(*(set(pd.read_csv(f, dtype=str)["sample_id"]) for f in sample_requests()))
    keep = (m.split == "train") & (m.get("status", "retained") == "retained") & ~m.sample_id.isin(sample)
    ids = m.loc[keep, "sample_id"].tolist()
    return ids[skip : skip + k]


@pytest.fixture
def dask_cluster():
    """A 2-process local Dask cluster of this test's own (loopback, dashboard on a free port), closed in teardown, with
    connect timeouts that a loaded machine does not run past; the batch reaches it by validation.dask_address."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.comm.timeouts.connect": "120s", "distributed.comm.timeouts.tcp": "300s"}):
        cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                               dashboard_address=":0")  # a free port: None still took 8787
        try:
            yield cluster.scheduler_address
        finally:
            cluster.close(timeout=60)


def snapshot(root):
    state = root / "state"
    return {str(p.relative_to(state)): p.read_bytes() for p in state.rglob("*") if p.is_file()} if state.exists() else {}


@pytest.fixture(scope="module")
def applied(applied_project):
    """The inbox's sample file applied once for the module; the tests below each read one concern of it."""
    from flows.deletion_batch import run
    from adapters.tracking import Tracker

    params = load_params(applied_project / "params.yaml")
    request_file = next((applied_project / "requests" / "inbox").glob("*.csv"))
    requests = pd.read_csv(request_file, dtype=str)
    results = run(None, str(applied_project / "params.yaml"))
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    r = results[0]
    children = tracker.client.search_runs([tracker.experiment_id],
                                          filter_string=f"tags.mlflow.parentRunId = '{r['run_id']}'")
    return {"params": params, "request_file": request_file, "requests": requests, "results": results, "r": r,
            "tracker": tracker, "run": tracker.client.get_run(r["run_id"]), "children": children}


def _artifact_text(applied, name: str) -> str:
    """A text artifact of the batch run (downloaded from the MLflow store)."""
    import mlflow

    from adapters.tracking import fluent_store

    with fluent_store(applied["tracker"].tracking_uri):
        return mlflow.artifacts.load_text(f"runs:/{applied['r']['run_id']}/{name}")


def child_run(applied, name):
    return next(c for c in applied["children"] if c.info.run_name == name)


def test_the_applied_file_leaves_the_inbox_and_enters_the_ledger(applied_project, applied):
    r, request_file, requests = applied["r"], applied["request_file"], applied["requests"]
    assert [x["status"] for x in applied["results"]] == ["applied"]
    # The applied file left the inbox for requests/processed/.
    assert not request_file.exists() and (applied_project / "requests" / "processed" / request_file.name).exists()
    ledger = [json.loads(l) for l in (applied_project / "state" / "ledger.jsonl").read_text().splitlines()]
    assert [e["request_id"] for e in ledger] == requests["request_id"].tolist()
    assert {e["model_version_after"] for e in ledger} == {r["model_version"]}


def test_the_forgotten_rows_leave_the_prepared_store_and_the_manifest(applied_project, applied):
    """Erased: the forgotten rows left the prepared store and the live manifest; the ledger and the tombstones
    keep the record."""
    from unlearning.privacy.erasure import id_key, read_tombstones
    from unlearning.privacy.salt import id_salt

    forgotten = set(applied["requests"]["sample_id"])
    manifest = pd.read_csv(applied_project / "state" / "manifest.csv", dtype=str)
    assert not set(manifest["sample_id"]) & forgotten
    prepared = pd.read_csv(applied_project / "data" / "prepared" / "manifest.csv", dtype=str)
    assert not set(prepared["sample_id"]) & forgotten
    # the tombstones name them by their salted hash (deletion.hash_sample_ids is on by default)
    key = id_key(True, id_salt(load_params(applied_project / "params.yaml")))
    assert {key(s) for s in forgotten} <= read_tombstones(applied_project / "data" / "tombstones.txt")


def test_the_alias_moves_and_the_batch_run_holds_its_datasets_and_stage_runs(applied):
    params, tracker, r, run_ = applied["params"], applied["tracker"], applied["r"], applied["run"]
    assert tracker.alias_version(params.tracking.registered_model, "champion") == r["model_version"]
    assert r["model_version"] != "1"
    assert run_.info.status == "FINISHED" and run_.data.tags["gate"] == "passed"
    # The forget and retain sets are the batch run's datasets (MLflow's Datasets panel), with digests.
    contexts = {t.value for i in run_.inputs.dataset_inputs for t in i.tags if t.key == "mlflow.data.context"}
    assert contexts == {"forget", "retain"} and all(i.dataset.digest for i in run_.inputs.dataset_inputs)
    names = {c.info.run_name for c in applied["children"]}
    assert {"validate", "partition"} <= names and any(n.startswith("unlearn-") for n in names)
    # the sample batch goes to exact retrain: it trains one model and no reference ensemble, as planned
    assert "ensembles" not in names
    plan = json.loads(_artifact_text(applied, "plan.json"))
    assert plan["models_to_train"] == {"retrain": 1, "oracles": 0, "shadows": 0}
    assert [s["certificate"] for s in plan["steps"]] == ["exact"]


def test_the_candidate_run_holds_metrics_figures_and_a_per_sample_table(applied):
    tracker = applied["tracker"]
    unlearn_run = child_run(applied, f"unlearn-{applied['r']['method']}")
    artifacts = {a.path for a in tracker.client.list_artifacts(unlearn_run.info.run_id)}
    assert {"accuracy_per_split.png", "gate_verdict.json", "per_sample_klom.json"} <= artifacts
    assert "klom_per_split.png" not in artifacts  # an exact retrain is checked against the original, not oracles
    for split in ("forget", "adjacent", "remote", "validation"):
        assert f"acc/{split}" in unlearn_run.data.metrics
    from adapters.tracking import fluent_store

    with fluent_store(tracker.tracking_uri):  # load_table reads the process-wide tracking URI
        table = tracker.client.load_table(tracker.experiment_id, "per_sample_klom.json",
                                          run_ids=[unlearn_run.info.run_id])  # an MLflow table, not CSV text
    assert len(table) > 0


def test_the_champion_loads_as_a_pyfunc_model_returning_probabilities(applied_project, applied):
    import mlflow

    from adapters.tracking import fluent_store
    from unlearning.data import load_prepared

    params, tracker = applied["params"], applied["tracker"]
    with fluent_store(tracker.tracking_uri):  # `models:/` URIs read the process-wide tracking URI
        served = mlflow.pyfunc.load_model(f"models:/{params.tracking.registered_model}@champion")
    prep = load_prepared(applied_project / "data" / "prepared")
    probs = served.predict(pd.DataFrame(np.asarray(prep.X[:3], dtype="float64")))
    assert probs.shape == (3, len(prep.info["class_names"])) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)


def test_the_validate_run_holds_the_gx_result_and_its_data_docs(applied):
    validate_run = child_run(applied, "validate")
    validate_artifacts = {a.path for a in applied["tracker"].client.list_artifacts(validate_run.info.run_id)}
    assert {"gx_result.json", "data_docs"} <= validate_artifacts  # GX's Data Docs of this validation


def test_the_batch_reads_well_in_the_mlflow_ui(applied_project, applied):
    """A readable name, the hash as a tag, the summary as the description, the champion's history as
    step-indexed metrics and a figure; the experiment opens on the runs table."""
    tracker, r, run_, request_file = applied["tracker"], applied["r"], applied["run"], applied["request_file"]
    assert run_.info.run_name.startswith(request_file.stem + " @ ") and run_.data.tags["batch_id"] == r["batch_id"]
    note = run_.data.tags["mlflow.note.content"]
    assert f"`{request_file.name}`: applied" in note and f"`{r['method']}` | passed" in note
    assert f"-> v{r['model_version']}" in note and "Erasure:" in note
    assert "champion_history.png" in {a.path for a in tracker.client.list_artifacts(r["run_id"])}
    assert [m.step for m in tracker.client.get_metric_history(r["run_id"], "history/forgotten_fraction")] == [1]
    assert tracker.client.get_experiment(tracker.experiment_id).tags["mlflow.experimentKind"] == \
        "custom_model_development"
    champion = json.loads((applied_project / "state" / "champion.json").read_text())
    assert [p["step"] for p in champion["history"]] == [1]


def test_the_model_version_is_tagged_with_its_batch(applied):
    params, r = applied["params"], applied["r"]
    mv_tags = applied["tracker"].client.get_model_version(params.tracking.registered_model, r["model_version"]).tags
    assert mv_tags["batch_id"] == r["batch_id"] and mv_tags["method"] == r["method"]
    assert mv_tags["parent_run_id"] == r["run_id"] and mv_tags["n_forgotten"] == str(len(applied["requests"]))
    assert mv_tags["verdict"] in ("passed", "promoted_as_gate_false_reject")


def test_the_prefect_flow_run_holds_the_batch_summary(applied):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from tasks.reporting import artifact_key

    r = applied["r"]
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(r["batch_id"])])))
    assert arts and arts[0].type == "markdown" and f"`{applied['request_file'].name}`: applied" in arts[0].data


def test_the_same_file_again_is_a_no_op_that_changes_nothing(applied_project, applied):
    from flows.deletion_batch import run

    request_file = applied["request_file"]
    before = snapshot(applied_project)
    # the file as it was sent (the processed copy holds hashed ids: deletion.hash_sample_ids is on by default)
    (original,) = [f for f in sample_requests() if f.name == request_file.name]
    shutil.copy(original, request_file)
    again = run(None, str(applied_project / "params.yaml"))
    assert [x["status"] for x in again] == ["already_processed"]
    assert snapshot(applied_project) == before
    assert not request_file.exists()


def test_bad_file_changes_nothing_and_lists_every_problem(project, tmp_path):
    from flows.deletion_batch import run

    before = snapshot(project)
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,sample_id,requested_at,reason\n"
                   "x1,digits-9999,2026-11-30,gdpr\n"      # unknown id
                   "x1,digits-0003,not-a-date,gdpr\n")     # duplicate request id, bad time, already deleted
    with pytest.raises(RequestValidationError) as e:
        run(str(bad), str(project / "params.yaml"))
    text = str(e.value)
    # every problem of the cheap checks; the manifest rules (digits-9999 unknown) run once those pass, and the
    # note says so (adapters/request_check.py: Great Expectations only for a file that passed pandera)
    assert "not-a-date" in text and "'x1' appears more than once" in text
    assert "not yet checked against the manifest" in text and "nothing was changed" in text
    assert snapshot(project) == before


def test_failure_mid_batch_changes_nothing(project, sample_applied, monkeypatch):
    """A fault inside the unlearning task (the method itself raising: the one fault here no input can cause,
    since bad method args are refused before the batch starts) leaves the previous model, manifest and ledger
    standing, and the MLflow batch run is marked FAILED."""
    import dataclasses

    from flows.deletion_batch import run
    from adapters.tracking import Tracker
    from unlearning.methods import REGISTRY

    def broken(ctx, args):
        raise ValueError("finetune broke mid-batch")

    before = snapshot(project)
    req = project / "one.csv"
    (sid,) = fresh_ids(project, 1, skip=100)
    req.write_text(f"request_id,sample_id,requested_at,reason\nfail-1,{sid},2026-11-30T10:00:00Z,gdpr\n")
    overrides = {"deletion": {"method": "finetune"}}
    monkeypatch.setitem(REGISTRY, "finetune", dataclasses.replace(REGISTRY["finetune"], run=broken))
    with pytest.raises(ValueError, match="broke mid-batch"):
        run(str(req), str(project / "params.yaml"), overrides)
    assert snapshot(project) == before
    params = load_params(project / "params.yaml")
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.request_file = 'one.csv'")
    assert runs and runs[0].info.status == "FAILED" and runs[0].data.tags["gate"] == "error"


def test_bad_method_args_are_refused_before_the_batch_starts(project, sample_applied):
    from flows.deletion_batch import run
    from adapters.tracking import Tracker
    from unlearning.config import ConfigError

    before = snapshot(project)
    req = project / "two.csv"
    (sid,) = fresh_ids(project, 1, skip=110)
    req.write_text(f"request_id,sample_id,requested_at,reason\nfail-2,{sid},2026-11-30T10:00:00Z,gdpr\n")
    overrides = {"deletion": {"method": "finetune", "method_args": {"finetune": {"no_such_arg": 1}}}}
    with pytest.raises(ConfigError, match="deletion.method_args.finetune: .*no_such_arg"):
        run(str(req), str(project / "params.yaml"), overrides)
    assert snapshot(project) == before
    params = load_params(project / "params.yaml")
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    assert not tracker.client.search_runs([tracker.experiment_id], filter_string="tags.request_file = 'two.csv'")


def test_audit_changes_nothing(project, sample_applied):
    from flows.audit import audit

    before = snapshot(project)
    req = project / "proposal.csv"
    a, b = fresh_ids(project, 2, skip=200)
    req.write_text(f"request_id,sample_id,requested_at,reason\na-1,{a},2026-11-30T10:00:00Z,audit\n"
                   f"a-2,{b},2026-11-30T10:00:00Z,audit\n")
    result = audit(str(req), str(project / "params.yaml"))
    rep = result["report"]
    assert rep["n_forget"] == 2 and rep["self_leverage"]["n"] == 2 and rep["leakage_ratio"] >= 0
    assert snapshot(project) == before


@pytest.mark.slow  # a Dask scheduler and two worker processes (real processes: the slow tier)
def test_dask_task_runner_local_cluster(project, dask_cluster):
    """Ensemble chunks run as Prefect tasks on a 2-process local Dask cluster (validation.task_runner)."""
    from flows.deletion_batch import run

    req = project / "dask.csv"
    (sid,) = fresh_ids(project, 1, skip=300)
    req.write_text(f"request_id,sample_id,requested_at,reason\ndask-1,{sid},2026-11-30T10:00:00Z,gdpr\n")
    # do_nothing named explicitly is certified against references: their chunks run on the Dask workers
    overrides = {"validation": {"task_runner": "dask", "dask_address": dask_cluster},
                 "diagnostics": {"enabled": False}, "deletion": {"method": "do_nothing"}}
    results = run(str(req), str(project / "params.yaml"), overrides)
    assert [r["status"] for r in results] == ["applied"]
    assert results[0]["metrics"]["n_oracles"] == 4.0


def test_inbox_rejects_bad_files_and_later_files_proceed(project, sample_applied):
    """No head-of-line blocking: a file rejected by validation, one rejected by the gate, an unknown suffix
    and a directory all leave the inbox for requests/rejected/ (with an error report); the good file after
    them is applied and moves to requests/processed/."""
    from flows.deletion_batch import run

    inbox, rejected = project / "requests" / "inbox", project / "requests" / "rejected"
    a, b = fresh_ids(project, 2, skip=400)
    (inbox / "a_bad.csv").write_text("request_id,sample_id,requested_at,reason\nbad-1,digits-9999,2026-11-30,gdpr\n")
    (inbox / "b_notes.txt").write_text("hello")
    (inbox / "c_dir.csv").mkdir()
    (inbox / "d_good.CSV").write_text(f"request_id,sample_id,requested_at,reason\ngood-1,{a},2026-11-30T10:00:00Z,gdpr\n")
    results = run(None, str(project / "params.yaml"), {"diagnostics": {"enabled": False}})
    # the entries that are no request files first (each a result of its own: `unlearn run` exits 2 for them)
    assert [(r["file"], r["status"], r.get("reason")) for r in results] == [
        ("b_notes.txt", "rejected", "not a request file"), ("c_dir.csv", "rejected", "not a request file"),
        ("a_bad.csv", "rejected", "validation"), ("d_good.CSV", "applied", None)]
    for name in ("a_bad.csv", "b_notes.txt", "c_dir.csv"):
        assert (rejected / name).exists() and (rejected / f"{name}.error.json").exists()
    # the report names the unknown id by its salted hash (deletion.hash_sample_ids is on by default)
    from unlearning.privacy.erasure import id_key
    from unlearning.privacy.salt import id_salt

    report = (rejected / "a_bad.csv.error.json").read_text()
    key = id_key(True, id_salt(load_params(project / "params.yaml")))
    assert key("digits-9999") in report and "digits-9999" not in report
    assert (project / "requests" / "processed" / "d_good.CSV").exists() and not list(inbox.iterdir())

    # A batch no candidate passes (an unreachable accuracy floor) is moved aside too, held for review (an erasure
    # is never refused for the model's quality), and nothing changes until `unlearn approve`.
    before = snapshot(project)
    (inbox / "e_gate.csv").write_text(f"request_id,sample_id,requested_at,reason\ngate-1,{b},2026-11-30T10:00:00Z,gdpr\n")
    strict = {"diagnostics": {"enabled": False}, "deletion": {"method": "retrain"},
              "gate": {"retrain_equivalence": {"min_validation_accuracy": 1.0}}}
    results = run(None, str(project / "params.yaml"), strict)
    assert [r["status"] for r in results] == ["held"]
    held = project / "requests" / "held"
    assert (held / "e_gate.csv.held.json").exists() and snapshot(project) == before
    for f in held.iterdir():  # the request dropped (the documented way): the module's project has no held batch
        f.unlink()


def test_a_file_still_being_written_stays_in_the_inbox_until_complete(project, sample_applied, monkeypatch):
    """A writer that appends to the file while its batch runs (not an atomic drop): what was read is applied
    and recorded, the file is neither filed as processed nor rejected, and the next run applies the rest."""
    import flows.deletion_batch as db

    inbox = project / "requests" / "inbox"
    a, b = fresh_ids(project, 2, skip=430)
    path = inbox / "f_slow.csv"
    path.write_text(f"request_id,sample_id,requested_at,reason\nslow-1,{a},2026-11-30T10:00:00Z,gdpr\n")
    original = db.process_request_file

    def writer_appends_meanwhile(f, params, device):
        out = original(f, params, device)
        with open(f, "a") as fh:
            fh.write(f"slow-2,{b},2026-11-30T10:00:05Z,gdpr\n")
        return out

    monkeypatch.setattr(db, "process_request_file", writer_appends_meanwhile)
    quick = {"diagnostics": {"enabled": False}, "deletion": {"method": "retrain"}}
    (first,) = db.run(None, str(project / "params.yaml"), quick)
    assert first["status"] == "changed" and first["applied_status"] == "applied" and first["moved_to"] is None
    assert path.exists() and not (project / "requests" / "processed" / "f_slow.csv").exists()
    ledger = [json.loads(line) for line in (project / "state" / "ledger.jsonl").read_text().splitlines()]
    assert [e["request_id"] for e in ledger if e["request_id"].startswith("slow-")] == ["slow-1"]

    monkeypatch.setattr(db, "process_request_file", original)
    (second,) = db.run(None, str(project / "params.yaml"), quick)
    assert second["status"] == "applied" and not path.exists()
    ledger = [json.loads(line) for line in (project / "state" / "ledger.jsonl").read_text().splitlines()]
    assert [e["request_id"] for e in ledger if e["request_id"].startswith("slow-")] == ["slow-1", "slow-2"]


def test_status_warns_that_the_next_batch_would_stop(project, sample_applied, capsys):
    """`unlearn status` with params the state was not built from: the batch would stop; status says so."""
    import yaml

    from flows.cli import main
    from flows.deletion_batch import run

    if not (project / "state" / "champion.json").exists():
        run(None, str(project / "params.yaml"), {"diagnostics": {"enabled": False}})
    other = yaml.safe_load((project / "params.yaml").read_text())
    other["train"]["epochs"] += 1
    (project / "params-other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    capsys.readouterr()
    assert main(["--params", str(project / "params-other.yaml"), "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert len(status["warnings"]) == 1 and "the next batch will stop" in status["warnings"][0]
    assert f"epochs was {other['train']['epochs'] - 1}, now {other['train']['epochs']}" in status["warnings"][0]
    assert main(["--params", str(project / "params.yaml"), "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def test_a_run_that_rejects_a_file_says_so_in_its_state(project, sample_applied):
    """The deployment's run of a rejected file: Completed with rejections (its message names the file), not a
    plain Completed an operator would pass over; the caller still gets the results."""
    from flows.deletion_batch import deletion_batch

    inbox = project / "requests" / "inbox"
    (inbox / "g_bad.csv").write_text("request_id,sample_id,requested_at,reason\nbad-9,digits-9999,2026-11-30,gdpr\n")
    state = deletion_batch(None, str(project / "params.yaml"), {"diagnostics": {"enabled": False}},
                           return_state=True)
    assert state.is_completed() and state.name == "Completed with rejections"
    assert "g_bad.csv (rejected: validation)" in state.message
    assert [r["status"] for r in state.result()] == ["rejected"]


def test_a_lost_mlflow_store_stops_the_batch_instead_of_starting_a_new_registry(project, sample_applied, capsys):
    """mlflow.db moved away under a promoted state (a sweep of `unlearn serve` did it): the batch registered
    its model as v1 in a new, empty store, and the old store, once back, kept `@champion` on a model holding
    the row the batch erased. Now the batch stops before anything changes, and so does a recreated empty
    store (`make setup` recreates mlflow.db); another store on purpose goes on with a note."""
    from flows.cli import main
    from flows.deletion_batch import run
    from adapters.store_check import state_champion_store_problem
    from adapters.tracking import TrackingUnavailable

    params_path = str(project / "params.yaml")
    if not (project / "state" / "champion.json").exists() or \
            json.loads((project / "state" / "champion.json").read_text()).get("batch_id") is None:
        run(None, params_path, {"diagnostics": {"enabled": False}})
    champion = json.loads((project / "state" / "champion.json").read_text())
    assert champion["tracking_store"] == "sqlite:mlflow.db"
    req = project / "lost-store.csv"
    (sid,) = fresh_ids(project, 1, skip=130)
    req.write_text(f"request_id,sample_id,requested_at,reason\nlost-1,{sid},2026-11-30T10:00:00Z,gdpr\n")
    db = project / "mlflow.db"
    db.rename(project / "mlflow.db.away")
    try:
        before = snapshot(project)
        with pytest.raises(TrackingUnavailable, match=f"does not hold unlearning-classifier v{champion['model_version']}"):
            run(str(req), params_path)
        assert snapshot(project) == before and not db.exists()  # nothing changed, no new store created
        capsys.readouterr()
        assert main(["--params", params_path, "status", "--json"]) == 0
        warnings = json.loads(capsys.readouterr().out)["warnings"]
        assert any("lost or replaced" in w for w in warnings) and not db.exists()
        # verify-erasure cannot vouch for a registry it cannot see: exit 1, saying which store
        assert main(["--params", params_path, "verify-erasure"]) == 1
        assert "NOT ERASED: MLflow registry: not verified: MLflow store" in capsys.readouterr().err
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # a new, empty store at the same place
        with pytest.raises(TrackingUnavailable, match="lost or replaced"):
            run(str(req), params_path)
        assert snapshot(project) == before
        other = project / "elsewhere.db"  # a move on purpose: another place, a note, no refusal
        params = load_params(project / "params.yaml", {"base": {"paths": {"mlflow_db": str(other)}}})
        problem, note = state_champion_store_problem(params)
        assert problem is None and "registered in the tracking store sqlite:mlflow.db" in note
    finally:
        db.unlink(missing_ok=True)
        (project / "mlflow.db.away").rename(db)
        req.unlink(missing_ok=True)
    assert state_champion_store_problem(load_params(project / "params.yaml")) == (None, None)
