"""`dvc repro` in a temporary git + DVC copy of the project: prepare -> train -> deletion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import FAST, copy_project  # noqa: F401  (copy_project: imported from here by other e2e tests)

pytestmark = pytest.mark.slow


def sh(cmd, cwd, env, timeout=900):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr


def sh_json(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return json.loads(res.stdout)


def test_dvc_repro_end_to_end(tmp_path):
    from unlearning.config import deep_merge

    proj = tmp_path / "proj"
    copy_project(proj)
    params = deep_merge(yaml.safe_load((proj / "params.yaml").read_text()), FAST)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    sh(["git", "init", "-q"], proj, env)
    sh(["git", "-c", "user.email=t@localhost", "-c", "user.name=t", "add", "-A"], proj, env)
    sh(["git", "-c", "user.email=t@localhost", "-c", "user.name=t", "commit", "-qm", "copy"], proj, env)
    # Through `make run`'s session: one temporary Prefect server and the warm worker for every stage (the later
    # `dvc repro` calls below run each stage cold, in its own process with its own temporary server).
    out = sh([sys.executable, "-m", "flows.session", sys.executable, "-m", "dvc", "repro", "deletion"], proj, env)
    assert "promoted" in out and "running flows." not in out  # no stage fell back to its own process
    table = {line.split()[0]: line.split()[1:] for line in out.split("wall time per stage")[1].splitlines()[2:]
             if line.startswith("  ") and len(line.split()) == 5}
    assert {"prepare", "train", "deletion", "total"} <= set(table), out[-3000:]
    assert float(table["deletion"][1].rstrip("s")) > 0 and float(table["train"][2].rstrip("s")) > 0  # compute, tracking
    ledger = [json.loads(l) for l in (proj / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 12 and {e["verdict"] for e in ledger} == {"passed"}
    # DVC sees the stages' metrics and the champion's history plot.
    shown = sh_json([sys.executable, "-m", "dvc", "metrics", "show", "--json"], proj, env)
    files = {f: d["data"] for rev in shown.values() for f, d in rev["data"].items()}
    assert files["metrics/train.json"]["val_accuracy"] > 0.5
    assert files["metrics/deletion.json"]["n_batches"] == 1 and files["metrics/deletion.json"]["n_forgotten"] == 12
    plots = sh_json([sys.executable, "-m", "dvc", "plots", "show", "--json"], proj, env)
    assert "champion across batches" in plots["data"] and not plots.get("errors")

    # The MLflow store holds the batch run, and the registry's champion alias points at its model.
    from adapters.tracking import Tracker
    from unlearning.config import load_params

    p = load_params(proj / "params.yaml")
    tracker = Tracker(p.mlflow_tracking_uri(), p.tracking.experiment)
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.stage = 'deletion_batch'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert tracker.alias_version(p.tracking.registered_model, "champion") == ledger[0]["model_version_after"]

    # A second repro with nothing changed runs nothing; a forced deletion stage is an idempotent no-op.
    out = sh([sys.executable, "-m", "dvc", "repro", "deletion"], proj, env)
    assert "didn't change" in out or "up to date" in out
    out = sh([sys.executable, "-m", "dvc", "repro", "-f", "-s", "deletion"], proj, env)
    assert "nothing to do" in out
    assert len((proj / "state" / "ledger.jsonl").read_text().splitlines()) == 12

    # Inside `dvc repro` the erasure of other stages' outputs and of the DVC cache is left pending;
    # `unlearn erase` finishes it (rewrite, dvc commit, dvc gc), and `dvc repro` stays a no-op afterwards.
    res = subprocess.run([sys.executable, "-m", "flows.cli", "verify-erasure"], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1 and "pending" in res.stderr
    sh([sys.executable, "-m", "flows.cli", "erase"], proj, env)
    out = sh([sys.executable, "-m", "flows.cli", "verify-erasure"], proj, env)
    assert "erasure verified" in out
    out = sh([sys.executable, "-m", "dvc", "repro", "deletion"], proj, env)
    assert "didn't change" in out or "up to date" in out

    # Recipes compared as DVC experiments: `dvc exp run -S train.epochs=...` retrains the original with the
    # other recipe, and `dvc exp show` lists it beside the workspace with its params and train metrics.
    epochs = yaml.safe_load((proj / "params.yaml").read_text())["train"]["epochs"] + 1
    sh([sys.executable, "-m", "dvc", "exp", "run", "-S", f"train.epochs={epochs}", "train"], proj, env)
    shown = sh_json([sys.executable, "-m", "dvc", "exp", "show", "--json"], proj, env)
    # (a revision without the file, e.g. the git commit, whose metrics are not in git, carries an error instead)
    runs = [(d["params"]["params.yaml"].get("data", {}).get("train", {}).get("epochs"),
             d["metrics"]["metrics/train.json"].get("data", {}))
            for d in _with_key(shown, "metrics") if "metrics/train.json" in (d["metrics"] or {})]
    assert any(e == epochs and m.get("val_accuracy", 0) > 0.5 for e, m in runs), json.dumps(shown)[:3000]


def _with_key(obj, key: str):
    """Every dict inside `obj` (a `dvc exp show --json` answer) that has `key`."""
    if isinstance(obj, dict):
        if key in obj:
            yield obj
        for v in obj.values():
            yield from _with_key(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _with_key(v, key)


def test_unlearn_repro_leaves_dvc_status_clean_and_finishes_a_killed_erase(tmp_path):
    """`unlearn repro` (every stage, qualify too) commits what its erase rewrote: `dvc status` is clean and the next
    `dvc repro` starts no stage. An `unlearn run` killed after the prepared store's purge and before the state
    manifest's (the reported failure) is finished by the next `unlearn repro` before its `dvc repro` (the erase's
    journal), after which verify-erasure is clean, `dvc status` too, and the batch page says the erasure is done."""
    import pandas as pd

    from unlearning.config import deep_merge

    proj = tmp_path / "proj"
    copy_project(proj)
    params = deep_merge(yaml.safe_load((proj / "params.yaml").read_text()), {**FAST, "diagnostics": {"enabled": False}})
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "UNLEARN_FAULT"):
        env.pop(key, None)
    git = ["git", "-c", "user.email=t@localhost", "-c", "user.name=t"]
    sh(["git", "init", "-q"], proj, env)
    sh([*git, "add", "-A"], proj, env)
    sh([*git, "commit", "-qm", "copy"], proj, env)
    unlearn = [sys.executable, "-m", "flows.cli"]
    sh([*unlearn, "repro"], proj, env)
    status = [sys.executable, "-m", "dvc", "status", "dvc.yaml"]  # the pipeline (report/dvc.yaml: `make report`)
    out = sh(status, proj, env)
    assert "Data and pipelines are up to date" in out, out

    from adapters.tracking import Tracker
    from unlearning.config import load_params

    p = load_params(proj / "params.yaml")
    tracker = Tracker(p.mlflow_tracking_uri(), p.tracking.experiment)
    first = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.stage = 'deletion_batch'")
    note = first[0].data.tags["mlflow.note.content"]
    assert "**Erasure:** done" in note and "PENDING" not in note  # pending inside `dvc repro`, done by `unlearn erase`
    assert first[0].data.tags["erasure"] == "done"

    state = pd.read_csv(proj / "state" / "manifest.csv", dtype=str)
    ids = state[(state["split"] == "train") & (state["status"] == "retained")]["sample_id"].head(4).tolist()
    pd.DataFrame({"request_id": [f"k-{i}" for i in range(4)], "sample_id": ids, "requested_at": "2026-12-01T09:00:00Z",
                  "reason": "gdpr"}).to_csv(proj / "requests" / "inbox" / "2026-12-02T0900_more.csv", index=False)
    killed = subprocess.run([*unlearn, "run"], cwd=proj, env={**env, "UNLEARN_FAULT": "erase:after:prepared_store"},
                            capture_output=True, text=True, timeout=900)
    assert killed.returncode == 137, killed.stdout[-2000:] + killed.stderr[-2000:]
    told = subprocess.run([*unlearn, "status"], cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    assert told.returncode == 4 and "unfinished erase: batch" in told.stdout, told.stdout + told.stderr

    out = sh([*unlearn, "repro"], proj, env)
    assert "`unlearn erase` finishes it before `dvc repro`" in out and "finished the erase of batch(es)" in out
    assert "Traceback" not in out
    out = sh([*unlearn, "verify-erasure"], proj, env)
    assert "erasure verified" in out
    out = sh(status, proj, env)
    assert "Data and pipelines are up to date" in out, out
    out = sh([sys.executable, "-m", "dvc", "repro"], proj, env)
    assert "Running stage" not in out, out
    prepared = pd.read_csv(proj / "data" / "prepared" / "manifest.csv", dtype=str)
    assert list(pd.read_csv(proj / "state" / "manifest.csv", dtype=str)["sample_id"]) == list(prepared["sample_id"])
