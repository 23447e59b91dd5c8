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
