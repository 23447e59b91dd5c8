"""The batch plans, then trains only what its decision needs (unlearning/planning/plan.py, tasks/certify.py): an
approximate candidate is rejected at the first decisive look of its sequential certificate, batch t+1's shadows
are batch t's oracles (found in the cache), and `unlearn plan` says all of it before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers import trained_project
from unlearning.config import load_params

pytestmark = pytest.mark.flow

# do_nothing named explicitly and certified with looks of 8 and 16 references per role, then 24
SEQUENTIAL = {"validation": {"n_oracles": 24, "n_shadows": 24, "looks": [8, 16], "chunk_size": 8},
              "diagnostics": {"enabled": False}, "deletion": {"method": "do_nothing"}}


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_harness):
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("plan_project")
    trained_project(root, SEQUENTIAL, inbox_files=False)
    return root


def class_request(root, path, label: str, k: int, skip: int = 0) -> None:
    """A request for k retained training rows of one class: far from a retrain, do_nothing must be rejected."""
    m = pd.read_csv(root / ("state/manifest.csv" if (root / "state").exists() else "data/prepared/manifest.csv"),
                    dtype=str)
    keep = m[(m.split == "train") & (m.get("status", "retained") == "retained") & (m.label == label)]
    ids = keep["sample_id"].tolist()[skip: skip + k]
    # the file's name in the request ids: one id names one request forever (the ledger refuses a reuse)
    rows = [f"r-{path.stem}-{label}-{skip}-{i},{s},2026-11-30T10:00:00Z,gdpr" for i, s in enumerate(ids)]
    path.write_text("request_id,sample_id,requested_at,reason\n" + "\n".join(rows) + "\n")


def looks_of(tracker, run_id: str) -> list[dict]:
    import mlflow

    from adapters.tracking import fluent_store

    child = next(c for c in tracker.client.search_runs([tracker.experiment_id],
                                                       filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
                 if c.info.run_name == "unlearn-do_nothing")
    with fluent_store(tracker.tracking_uri):
        return json.loads(mlflow.artifacts.load_text(f"runs:/{child.info.run_id}/certificate_looks.json"))


def ensembles_metrics(tracker, run_id: str) -> dict:
    child = next(c for c in tracker.client.search_runs([tracker.experiment_id],
                                                       filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
                 if c.info.run_name == "ensembles")
    return child.data.metrics


def test_unlearn_plan_says_what_the_batch_will_train_before_anything_runs(project):
    req = project / "plan.csv"
    class_request(project, req, "3", 60)
    before = sorted(p.name for p in (project / "data" / "prepared").iterdir())
    ledger = project / "state" / "ledger.jsonl"
    ledger_before = ledger.read_text() if ledger.exists() else None  # another test's batches may have made one
    out = subprocess.run([sys.executable, "-m", "flows.cli", "--params", str(project / "params.yaml"), "plan",
                          str(req), "--json"], capture_output=True, text=True, cwd=project)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [s["method"] for s in plan["steps"]] == ["do_nothing", "retrain"]
    assert plan["steps"][0]["looks"] == [[8, 8], [16, 16], [24, 24]]
    assert plan["models_to_train"] == {"retrain": 1, "oracles": 24, "shadows": 24}
    assert plan["predicted_seconds"]["total"] > 0 and plan["peak_mb"] > 0 and plan["refusal"] is None
    from unlearning.planning.overhead import PHASES

    wall = plan["wall_seconds"]  # the phases the batch's plan-vs-actual line measures, with their range
    assert list(wall["phases"]) == list(PHASES) and wall["batch"] == pytest.approx(sum(wall["phases"].values()), abs=1e-2)
    assert wall["range_total"][0] <= wall["batch"] <= wall["range_total"][1]
    assert plan["timing"]["conditions"]["rounds"] >= 1 and plan["timing"]["conditions"]["threads"] == 1
    assert plan["gate_criterion"] == {"criterion": "difference"}
    assert any(n.startswith("gate criterion: difference") for n in plan["notes_cli"])
    assert sorted(p.name for p in (project / "data" / "prepared").iterdir()) == before
    assert (ledger.read_text() if ledger.exists() else None) == ledger_before  # the plan wrote nothing


def test_the_standalone_plan_skips_the_diagnostics_the_batch_skips(project):
    """Diagnostics on, the rules' default: only the exact retrain is left once certifying costs more than it
    (deletion.weigh_cost), so the batch skips them (tasks/batch_path.py diagnostics_unused), and the plan
    predicts that rather than counting diagnostics.max_retrains."""
    req = project / "diag.csv"
    class_request(project, req, "6", 5)
    params = load_params(project / "params.yaml", {"diagnostics": {"enabled": True}, "deletion": {"method": "auto"}})
    from flows.plan_cli import batch_plan_for

    plan, timing, selection, notes = batch_plan_for(req, params, "cpu")
    assert plan.methods == ["retrain"] and plan.predicted_seconds["diagnostics"] == 0
    assert any(n.startswith("diagnostics: skipped by the batch: the only candidate(s)") for n in notes), notes


def test_a_plan_that_cannot_fit_the_memory_budget_is_refused_naming_the_key(project):
    req = project / "tiny_budget.csv"
    class_request(project, req, "4", 5)
    params = load_params(project / "params.yaml", {"validation": {"memory_mb": 64}})
    from flows.plan_cli import batch_plan_for

    plan, *_ = batch_plan_for(req, params, "cpu")
    assert plan.refusal and "validation.memory_mb = 64" in plan.refusal


def test_do_nothing_is_rejected_at_the_first_look_then_its_oracles_are_the_next_shadows(project):
    """A whole-class forget set: do_nothing is far from a retrain, rejected with 8 + 8 references (the
    certificate trained no more), and the exact retrain is promoted. The next batch's shadows are those 8
    oracles: its ensembles come from the cache."""
    from flows.deletion_batch import run
    from adapters.tracking import Tracker

    params = load_params(project / "params.yaml")
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    req = project / "first.csv"
    class_request(project, req, "3", 60)
    (r,) = run(str(req), str(project / "params.yaml"))
    assert (r["status"], r["method"]) == ("applied", "retrain")
    (look,) = looks_of(tracker, r["run_id"])
    assert look["decision"] == "reject" and (look["n_shadows"], look["n_oracles"]) == (8, 8)
    assert look["tested"]["forget"] < look["alpha"]
    first = ensembles_metrics(tracker, r["run_id"])
    assert (first["n_oracles"], first["n_shadows"]) == (8, 8)
    # one accounting: the batch's phases sum to its wall time, beside the plan's same phases
    from unlearning.planning.overhead import PHASES

    metrics = tracker.client.get_run(r["run_id"]).data.metrics
    actual = {k: metrics[f"actual_seconds/{k}"] for k in PHASES}
    assert sum(actual.values()) == pytest.approx(metrics["actual_seconds/total"]) and min(actual.values()) >= 0
    assert actual["references"] > 0 and actual["tracking"] > 0 and actual["validation"] > 0
    assert {f"predicted_seconds/{k}" for k in PHASES} <= set(metrics)
    history = [json.loads(line) for line in (project / "cache" / "costs" / "phases.jsonl").read_text().splitlines()]
    assert history[-1]["actual"] == pytest.approx(actual, abs=1e-3)  # the next plans learn from it

    req2 = project / "second.csv"
    class_request(project, req2, "5", 60)
    (r2,) = run(str(req2), str(project / "params.yaml"))
    assert r2["status"] == "applied"
    second = ensembles_metrics(tracker, r2["run_id"])
    assert second["n_shadows"] >= 8 and second["shadows_cached_chunks"] >= 1  # batch 1's oracles, reused
    assert second["oracles_cached_chunks"] == 0  # this batch's oracles are new models of a new stream


def test_under_the_epsilon_criterion_the_batch_logs_its_epsilon_and_rejects_on_the_lower_bound(project):
    """gate.criterion: epsilon: `unlearn plan` states the budget; a whole class under do_nothing is rejected at an
    interim look because its forget rows' epsilon lower bound exceeds it (not at the first, 8 models per role:
    too few for the bias-corrected bound at alpha 0.0025), and the candidate's MLflow run holds the estimate and
    its bounds."""
    from flows.deletion_batch import run
    from adapters.tracking import Tracker

    eps = {"gate": {"criterion": "epsilon", "epsilon": {"max": 2.0}}}
    req = project / "eps.csv"
    class_request(project, req, "6", 60)
    params = load_params(project / "params.yaml", eps)
    from unlearning.certificate.gate import criterion_line

    assert "epsilon" in criterion_line(params.gate) and "<= 2" in criterion_line(params.gate)
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    (r,) = run(str(req), str(project / "params.yaml"), eps)
    assert (r["status"], r["method"]) == ("applied", "retrain")
    looks = looks_of(tracker, r["run_id"])  # the bias-corrected bound cannot reject at 8 models per role
    look = looks[-1]
    assert look["decision"] == "reject" and len(looks) < 3 and look["budget"] == 2.0 and look["tested"]["forget"] > 2.0
    child = next(c for c in tracker.client.search_runs([tracker.experiment_id],
                                                       filter_string=f"tags.mlflow.parentRunId = '{r['run_id']}'")
                 if c.info.run_name == "unlearn-do_nothing")
    m = child.data.metrics
    assert m["epsilon_lower/forget"] > 2.0 and m["epsilon_upper/forget"] >= m["epsilon/forget"]


def test_an_audited_retrain_trains_the_oracles_alone(tmp_path_factory, prefect_harness):
    """validation.audit_retrain: the retrain is oracle member 0, trained in the oracles' pass and judged against
    the others; no shadow is trained (it trained n_shadows unused ones besides)."""
    import os

    from adapters.tracking import Tracker
    from flows.deletion_batch import run

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("audit_project")
    trained_project(root, {"validation": {"audit_retrain": True, "n_oracles": 6, "n_shadows": 6, "looks": []},
                           "diagnostics": {"enabled": False}, "deletion": {"method": "retrain"}}, inbox_files=False)
    params = load_params(root / "params.yaml")
    req = root / "audit.csv"
    class_request(root, req, "2", 5)
    (r,) = run(str(req), str(root / "params.yaml"))
    assert (r["status"], r["method"]) == ("applied", "retrain")
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    refs = ensembles_metrics(tracker, r["run_id"])
    assert (refs["n_oracles"], refs["n_shadows"]) == (6, 0)


def test_unlearn_plan_loads_a_custom_model_module_beside_params_yaml(tmp_path_factory, prefect_harness):
    """`train.model.factory: team_net:bn_mlp` with team_net.py in the project folder: `unlearn plan` run from
    another folder imports it from the project path, as `unlearn run` does (without it: "cannot import module")."""
    import os
    import shutil
    from pathlib import Path

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("plan_custom")
    shutil.copy(Path(__file__).resolve().parents[1] / "unit" / "custom_modules.py", root / "team_net.py")
    custom = {**SEQUENTIAL, "train": {"model": {"arch": "custom", "factory": "team_net:bn_mlp"}}}
    trained_project(root, custom, inbox_files=False)
    req = root / "plan.csv"
    class_request(root, req, "3", 5)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # not the project folder: `python -m` puts the cwd on sys.path
    out = subprocess.run([sys.executable, "-m", "flows.cli", "--params", str(root / "params.yaml"), "plan", str(req),
                          "--json"], capture_output=True, text=True, cwd=elsewhere,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr
    assert "cannot import" not in out.stderr
    assert json.loads(out.stdout)["steps"][0]["method"] == "do_nothing"
