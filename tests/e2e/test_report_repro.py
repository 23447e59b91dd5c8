"""`dvc repro report/dvc.yaml` (`make report`) in a temporary git + DVC copy of the project, with tiny study sizes:
the three reports, one MLflow run with the figures, and the section of docs/evidence.md regenerated between its
markers (the rest unchanged). A plain `dvc repro` at the root never reaches the report stage."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_dvc_repro import copy_project, sh
from tests.helpers import FAST
from unlearning.studies import readme

pytestmark = pytest.mark.slow

TINY_REPORT = {"report": {
    "threads": 1,
    "s3": {"n_models": 4, "sizes": [10], "sets_per_size": 1, "newton_sets_per_size": 0,
           "methods": ["do_nothing", "retrain"], "sweep": {"gradient_ascent": [{"lr": 1.0e-3, "epochs": 2}]}},
    "s4": {"max_train": 600, "max_val": 200, "epochs": 1, "models": ["mlp"], "targets": ["fine"],
           "methods": ["retrain", "gradient_ascent"], "frontier_weights": [1.0]},
    "s5": {"n_models": 4, "structures": ["random10", "class"], "methods": ["do_nothing", "retrain"]},
}}


def test_dvc_repro_report_regenerates_the_results_page_section(tmp_path, monkeypatch):
    from unlearning.config import deep_merge

    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("S4 needs the Debian package dataset-fashion-mnist")
    proj = tmp_path / "proj"
    copy_project(proj)
    params = deep_merge(deep_merge(yaml.safe_load((proj / "params.yaml").read_text()), FAST), TINY_REPORT)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    page = proj / "docs" / "evidence.md"   # report.readme
    before = page.read_text()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    git = ["git", "-c", "user.email=t@localhost", "-c", "user.name=t"]
    sh(["git", "init", "-q"], proj, env)
    sh([*git, "add", "-A"], proj, env)
    sh([*git, "commit", "-qm", "copy"], proj, env)
    commit = sh(["git", "rev-parse", "--short", "HEAD"], proj, env).strip()

    out = sh([sys.executable, "-m", "dvc", "repro", "report/dvc.yaml"], proj, env)
    assert "regenerated the results section" in out
    assert not (proj / "state").exists() and not (proj / "models" / "original.pt").exists()  # report only
    reports = {n: json.loads((proj / "reports" / f"{n}.json").read_text()) for n in ("s3", "s4", "s5")}
    assert reports["s3"]["summary"]["retrain"]["n_sets"] == 1
    assert [s["model"] for s in reports["s4"]["settings"]] == ["mlp"]
    assert [r["structure"] for r in reports["s5"]["structures"]] == ["random10", "class"]

    after = page.read_text()
    head, tail = before.split(readme.BEGIN.split(" (")[0])[0], before.split(readme.END)[1]
    assert after.startswith(head) and after.endswith(tail)          # only the section changed
    section = after[len(head):len(after) - len(tail)]
    assert f"at commit `{commit}" in section   # `+dirty` follows when DVC touched a tracked file (.gitignore)
    for study in ("**S3", "**S4", "**S5"):
        assert study in section, section
    assert "(not generated yet" not in section
    # every number of the S3 table comes from the JSON: the retrain's pass rate and its KLoM ratio
    r = reports["s3"]["summary"]["retrain"]
    assert f"| `retrain` | 1 | {r['pass_rate']:.2f} | {r['klom_to_floor/forget']:.2f} /" in section

    from adapters.tracking import Tracker
    from unlearning.config import load_params

    # mlflow.set_tracking_uri (any Tracker an earlier test built in this process) exports MLFLOW_TRACKING_URI,
    # which mlflow_tracking_uri() honours: read the copy's own store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    p = load_params(proj / "params.yaml")
    tracker = Tracker(p.mlflow_tracking_uri(), p.tracking.experiment)
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.stage = 'report'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    files = {a.path for a in tracker.client.list_artifacts(runs[0].info.run_id)}
    assert {"s3_sweep.png", "s4_accuracy.png", "s5_predicted_vs_realised.png", "reports"} <= files
    assert runs[0].data.tags["mlflow.note.content"].startswith(readme.BEGIN)
    assert len(runs[0].data.tags["mlflow.note.content"]) <= 8000

    # nothing changed: DVC runs nothing (the page is not the stage's dependency)
    out = sh([sys.executable, "-m", "dvc", "repro", "report/dvc.yaml"], proj, env)
    assert "didn't change" in out or "up to date" in out

    # a plain `dvc repro` at the root runs the pipeline, never the studies (stand-in inputs so --dry walks it all)
    (proj / "data" / "prepared").mkdir(parents=True)
    (proj / "data" / "prepared" / "x").write_text("x")
    (proj / "models" / "original.pt").parent.mkdir(exist_ok=True)
    (proj / "models" / "original.pt").write_text("x")
    dry = sh([sys.executable, "-m", "dvc", "repro", "--dry"], proj, env)
    assert "'deletion'" in dry and "report" not in dry, dry
