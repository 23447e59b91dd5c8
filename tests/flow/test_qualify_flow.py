"""The qualify stage (flows/qualify.py): skipped in seconds under per_batch; under qualified, the oracle
certificate of each declared method on each suite set, the table in models/qualification.json, MLflow's table,
plot and the registered version's tag."""

from __future__ import annotations

import json

import pytest

from tests.helpers import trained_project
from unlearning.certificate.qualification import Qualification

pytestmark = pytest.mark.flow

QUALIFIED = {"validation": {"mode": "qualified", "n_oracles": 8, "n_shadows": 8, "looks": [4], "chunk_size": 4},
             "diagnostics": {"solver": "exact"},
             "qualify": {"methods": ["do_nothing"], "bins": [1.0],
                         "suite": [{"kind": "random", "size": 5, "count": 2}, {"kind": "class", "count": 1},
                                   {"kind": "high_self_leverage", "size": 10, "count": 1}]}}


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_harness):
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    root = tmp_path_factory.mktemp("qualify_project")
    trained_project(root, QUALIFIED, inbox_files=False)
    return root


@pytest.fixture(scope="module")
def qualified(project):
    """The qualify stage run once under validation.mode qualified: models/qualification.json, which the
    qualified batches below read (each test asks for it; none relies on another test having run)."""
    from flows.common import tracker_for
    from flows.qualify import qualify
    from unlearning.config import load_params

    out = qualify(str(project / "params.yaml"))
    params = load_params(project / "params.yaml")
    # the original's version tags as the stage left them (a later batch's erasure may purge that version)
    tags = tracker_for(params).client.get_model_version(params.tracking.registered_model, "1").tags
    return out, tags


def test_per_batch_mode_skips_the_stage(project, tmp_path):
    """Written to a models folder of its own: the project's qualification stays what the other tests read."""
    import yaml

    from flows.qualify import qualify

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["validation"]["mode"] = "per_batch"
    params["base"]["paths"]["models_dir"] = str(tmp_path / "models")
    path = tmp_path / "params_per_batch.yaml"
    path.write_text(yaml.safe_dump(params))
    out = qualify(str(path))
    assert out["skipped"].startswith("validation.mode is per_batch") and out["trials"] == []
    assert json.loads((tmp_path / "models" / "qualification.json").read_text())["skipped"]


def test_qualified_mode_certifies_every_method_on_every_set(project, qualified):
    from adapters.tracking import Tracker  # noqa: F401  (the project's tracker reads the same store)
    from flows.common import tracker_for
    from unlearning.config import load_params

    out, tags = qualified
    q = Qualification.from_dict(out)  # as written to models/qualification.json (the audit test later edits it)
    assert q.skipped is None and q.noise > 0
    assert [t.kind for t in q.trials] == ["random", "random", "class", "high_self_leverage"]
    assert all(t.method == "do_nothing" and t.gap_to_noise >= 0 for t in q.trials)
    # the class set is far from a retrain: do_nothing fails it, and its gap is the largest
    cls = next(t for t in q.trials if t.kind == "class")
    assert not cls.passed and cls.gap_to_noise == max(t.gap_to_noise for t in q.trials)
    assert sum(r.n for r in q.table) == 4 and out["table"][0]["row_id"] == "do_nothing gap [0, 1)"
    params = load_params(project / "params.yaml")
    tracker = tracker_for(params)
    run = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.stage = 'qualify'")[0]
    names = {a.path for a in tracker.client.list_artifacts(run.info.run_id)}
    assert {"qualification_table.json", "qualification_rates.png", "qualification.json"} <= names
    assert tags["qualification"].endswith("do_nothing " + f"{sum(t.passed for t in q.trials)}/4")


def request_file(root, path, ids) -> None:
    rows = [f"q-{path.stem}-{i},{s},2026-12-04T10:00:00Z,gdpr" for i, s in enumerate(ids)]
    path.write_text("request_id,sample_id,requested_at,reason\n" + "\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def licensed_batches(project, qualified):
    """The module's first two qualified batches, once, whichever test asks first (the audit test's batch comes
    after them, so its batch index and audit count do not depend on the test order)."""
    licensed_and_exact_batches(project)


def test_a_qualified_batch_runs_the_licensed_method_with_cheap_checks_and_tags_its_version(licensed_batches):
    """The checks are in `licensed_and_exact_batches` (run once, by the module fixture)."""


def licensed_and_exact_batches(project):
    """After the qualification: a small random set is licensed do_nothing (point estimate, min_pass 0.5 on this
    tiny suite), passes the cheap checks and is promoted with no reference model trained, then audited (batch 0
    of every 2); under the default rule (lower bound) the tiny suite licenses nothing: exact retrain."""
    import pandas as pd
    import yaml

    from flows.common import tracker_for
    from flows.deletion_batch import run
    from unlearning.config import load_params

    params_yaml = yaml.safe_load((project / "params.yaml").read_text())
    params_yaml["validation"].update(qualified_bound="point", qualified_min_pass=0.5, audit={"every": 2})
    path = project / "params_licensed.yaml"
    path.write_text(yaml.safe_dump(params_yaml))
    q = Qualification.from_dict(json.loads((project / "models" / "qualification.json").read_text()))
    m = pd.read_csv(project / "data/prepared/manifest.csv", dtype=str)
    train = m[m.split == "train"]
    req = project / "small.csv"
    request_file(project, req, train.sample_id.sample(5, random_state=3).tolist())
    (r,) = run(str(req), str(path))
    params = load_params(path)
    tracker = tracker_for(params)
    lic = json.loads(tracker.client.download_artifacts(r["run_id"], "qualification_license.json", str(project)) and
                     (project / "qualification_license.json").read_text())
    row = lic["license"]["row"]
    assert r["status"] == "applied" and r["method"] == lic["license"]["method"] == "do_nothing", lic
    if row is not None:  # licensed: the row it names is one of the table's, at this batch's gap
        assert row["row_id"] in {x.row_id for x in q.table} and row["gap_lo"] <= lic["gap_to_noise"]
        assert row["passes"] / row["n"] >= 0.5
    tags = tracker.client.get_model_version(params.tracking.registered_model, r["model_version"]).tags
    assert tags["validation_mode"] == "qualified"
    # batch 0 of audit every: 2 is audited after its promotion (its full certificate passes do_nothing here)
    from tasks.qualification import read_audits

    records = read_audits(params.project_paths)
    assert [a["kind"] for a in records] == ["promoted", "audit"] and records[0]["audit"] == "due"
    assert records[1]["passed"] and records[1]["version"] == r["model_version"] and "then" not in records[1]
    assert (tags["qualified"], tags["audit"]) == ("qualified, audited", "passed")
    desc = tracker.client.get_run(r["run_id"]).data.tags["mlflow.note.content"]
    assert "qualification" in desc and "validation.mode qualified" in desc
    children = tracker.client.search_runs([tracker.experiment_id],
                                          filter_string=f"tags.mlflow.parentRunId = '{r['run_id']}'")
    assert not [c for c in children if c.info.run_name == "ensembles" and c.data.metrics.get("n_oracles", 0) > 0]

    # the defaults (Wilson lower bound >= 0.9) license nothing on three or four sets a bin: exact retrain
    req2 = project / "second.csv"
    request_file(project, req2, train.sample_id[~train.sample_id.isin(pd.read_csv(req).sample_id)]
                 .sample(5, random_state=4).tolist())
    (r2,) = run(str(req2), str(project / "params.yaml"))
    assert (r2["status"], r2["method"]) == ("applied", "retrain")
    tags2 = tracker.client.get_model_version(params.tracking.registered_model, r2["model_version"]).tags
    assert tags2["qualified"] == "exact retrain" and tags2["qualification_row"] == "none"
    assert tags2["audit"] == "not needed"
    # nothing licensed at any gap: the diagnostics, which could change nothing, did not run
    (project / "qualification_license.json").unlink()
    tracker.client.download_artifacts(r2["run_id"], "qualification_license.json", str(project))
    lic2 = json.loads((project / "qualification_license.json").read_text())
    assert "diagnostics skipped" in lic2["license"]["reason"] and lic2["gap_to_noise"] != lic2["gap_to_noise"]


def test_a_qualified_batch_refuses_a_missing_or_stale_qualification(project, qualified, tmp_path):
    from tasks.qualification import require_qualification
    from unlearning.config import ConfigError, load_params

    params = load_params(project / "params.yaml", {"base": {"paths": {"models_dir": str(tmp_path)}}})
    state = type("S", (), {"fingerprint": {"digest": "abc"}})()
    with pytest.raises(ConfigError, match=r"does not exist: run `dvc repro qualify`"):
        require_qualification(params.project_paths, state)
    (tmp_path / "qualification.json").write_text((project / "models" / "qualification.json").read_text())
    with pytest.raises(ConfigError, match=r"qualifies another original \(fingerprint \w+, this one abc\)"):
        require_qualification(params.project_paths, state)


def test_an_audit_runs_the_full_certificate_after_promotion_and_a_failed_one_retrains(project, licensed_batches):
    """The 30 highest-loss rows, licensed do_nothing by a one-bin table (min_pass 0.25): the cheap checks pass them
    (their losses look like held-out rows'), the audit
    (every batch) runs the full certificate after the promotion, fails it, and an exact retrain is promoted in
    the same run; state/audits.jsonl and the registry tags say so, and the table counts the audit."""
    import pandas as pd
    import yaml

    from flows.common import tracker_for
    from flows.deletion_batch import run
    from tasks.qualification import read_audits, require_qualification, with_audits
    from tasks.state import StateSettings, load_state
    from unlearning.config import load_params

    qpath = project / "models" / "qualification.json"
    q = json.loads(qpath.read_text())
    q["bins"] = [1000.0]
    qpath.write_text(json.dumps(q))
    params_yaml = yaml.safe_load((project / "params.yaml").read_text())
    params_yaml["validation"].update(qualified_bound="point", qualified_min_pass=0.25, audit={"every": 1})
    path = project / "params_audit.yaml"
    path.write_text(yaml.safe_dump(params_yaml))
    params = load_params(path)
    import torch

    from unlearning.batch.rows import eval_logits, retained_train_rows

    state = load_state(StateSettings.of(params), "cpu")  # the highest-loss retained rows: members whose loss still looks held out
    D = retained_train_rows(state.manifest)
    loss = torch.nn.functional.cross_entropy(eval_logits(state.model, state.prepared, D)[0],
                                             torch.as_tensor(state.prepared.label[D]), reduction="none").numpy()
    req = project / "high_loss.csv"
    request_file(project, req, state.manifest["sample_id"].to_numpy()[D[loss.argsort()[::-1][:30]]].tolist())
    (r,) = run(str(req), str(path))
    assert r["status"] == "applied" and r["method"] == "do_nothing", r
    audits = [a for a in read_audits(params.project_paths) if a["kind"] == "audit" and a["batch_id"] == r["batch_id"]]
    assert len(audits) == 1 and audits[0]["method"] == "do_nothing" and audits[0]["references"] >= 8
    qualified, retrain = audits[0]["version"], audits[0]["then"]["exact_retrain_version"]
    assert not audits[0]["passed"] and retrain != qualified
    assert r["model_version"] == retrain  # the version that stands after the batch's run
    tracker = tracker_for(params)
    name = params.tracking.registered_model
    # (the failed version is tagged "qualified, audit FAILED"; the batch's erasure then purges it from the
    # registry, since it holds the erased rows: erasure.keep_versions)
    assert qualified not in tracker.versions(name)
    assert tracker.client.get_model_version(name, retrain).tags["audit_retrain_of"] == qualified
    state = load_state(StateSettings.of(params), "cpu")
    assert str(state.champion["model_version"]) == retrain and state.champion["method"] == "retrain"
    assert tracker.alias_version(name, params.tracking.alias) == retrain
    before = require_qualification(params.project_paths, state)
    every = [a for a in read_audits(params.project_paths) if a["kind"] == "audit"]  # this one and any other test's
    after = with_audits(before, read_audits(params.project_paths))
    assert after.table[0].n == before.table[0].n + len(every)
    assert after.table[0].passes == before.table[0].passes + sum(a["passed"] for a in every)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "flows.cli", "--params", str(path), "status", "--json"],
                         capture_output=True, text=True, cwd=project)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)["qualified"]
    assert status["failed"] == sum(not a["passed"] for a in every) and status["unaudited_versions"] == []
    assert [a["exact_retrain_version"] for a in status["audits"] if not a["passed"]] == [retrain]
    text = subprocess.run([sys.executable, "-m", "flows.cli", "--params", str(path), "status"], capture_output=True,
                          text=True, cwd=project).stdout
    failed = sum(not a["passed"] for a in every)  # this test's, and any other qualified batch's of the module
    assert f"qualified versions not audited: none; audits: {len(every)}, {failed} failed" in text
