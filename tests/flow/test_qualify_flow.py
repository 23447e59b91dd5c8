"""The qualify stage (flows/qualify.py): skipped in seconds under per_batch; under qualified, the oracle
certificate of each declared method on each suite set, the table in models/qualification.json, MLflow's table,
plot and the registered version's tag."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_project
from unlearning.qualification import Qualification

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
    from flows.prepare import prepare
    from flows.train import train

    root = tmp_path_factory.mktemp("qualify_project")
    params_path = make_project(root, QUALIFIED, inbox_files=False)
    prepare(str(params_path))
    train(str(params_path))
    return root


def test_per_batch_mode_skips_the_stage(project, tmp_path):
    import yaml

    from flows.qualify import qualify

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["validation"]["mode"] = "per_batch"
    path = project / "params_per_batch.yaml"
    path.write_text(yaml.safe_dump(params))
    out = qualify(str(path))
    assert out["skipped"].startswith("validation.mode is per_batch") and out["trials"] == []
    assert json.loads((project / "models" / "qualification.json").read_text())["skipped"]


def test_qualified_mode_certifies_every_method_on_every_set(project):
    from flows.qualify import qualify
    from tasks.tracking import Tracker  # noqa: F401  (the project's tracker reads the same store)
    from flows.common import tracker_for
    from unlearning.config import load_params

    out = qualify(str(project / "params.yaml"))
    q = Qualification.from_dict(json.loads((project / "models" / "qualification.json").read_text()))
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
    version = tracker.client.get_model_version(params.tracking.registered_model, "1")
    assert version.tags["qualification"].endswith("do_nothing " + f"{sum(t.passed for t in q.trials)}/4")


def request_file(root, path, ids) -> None:
    rows = [f"q-{path.stem}-{i},{s},2026-12-04T10:00:00Z,gdpr" for i, s in enumerate(ids)]
    path.write_text("request_id,sample_id,requested_at,reason\n" + "\n".join(rows) + "\n")


def test_a_qualified_batch_runs_the_licensed_method_with_cheap_checks_and_tags_its_version(project):
    """After the qualification: a small random set is licensed do_nothing (point estimate, min_pass 0.5 on this
    tiny suite), passes the cheap checks and is promoted "qualified, not audited", with no reference model
    trained; under the default rule (lower bound) the tiny suite licenses nothing: exact retrain."""
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
    assert tags["qualified"] == ("qualified, not audited" if r["method"] == "do_nothing" else "exact retrain")
    assert tags["audit"] == ("due" if r["method"] == "do_nothing" else "not needed")  # batch 0 of every: 2
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


def test_a_qualified_batch_refuses_a_missing_or_stale_qualification(project, tmp_path):
    from tasks.qualification import require_qualification
    from unlearning.config import ConfigError, load_params

    params = load_params(project / "params.yaml", {"base": {"paths": {"models_dir": str(tmp_path)}}})
    state = type("S", (), {"fingerprint": {"digest": "abc"}})()
    with pytest.raises(ConfigError, match=r"does not exist: run `dvc repro qualify`"):
        require_qualification(params, state)
    (tmp_path / "qualification.json").write_text((project / "models" / "qualification.json").read_text())
    with pytest.raises(ConfigError, match=r"qualifies another original \(fingerprint \w+, this one abc\)"):
        require_qualification(params, state)
