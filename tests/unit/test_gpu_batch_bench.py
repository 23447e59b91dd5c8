"""bench/gpu_batch.py at a tiny size on the CPU: the core batch path (plan, references, candidate, sequential
certificate, acceptance) runs without Prefect, MLflow or DVC, and its JSON holds, per path, the actual and
predicted seconds and the cost in retrains, naming the device."""

import json
import subprocess
import sys

from tests.helpers import ROOT

RUN = """
import runpy, sys
sys.argv = ["gpu_batch.py", "--small", "--points", "mlp", "--device", "cpu", "--out", sys.argv[1]]
runpy.run_path("bench/gpu_batch.py", run_name="__main__")
servers = sorted({m.split(".")[0] for m in sys.modules} & {"prefect", "mlflow", "dvc", "great_expectations"})
assert not servers, f"the bench imported {servers}"
"""


def test_the_bench_runs_the_core_batch_path_with_no_server(tmp_path):
    out = tmp_path / "gpu_batch.json"
    proc = subprocess.run([sys.executable, "-c", RUN, str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device_type"] == "cpu" and result["device"].startswith("CPU") and result["small"]
    (point,) = result["points"]
    assert point["model"] == "mlp" and point["n"] == 6 and point["retrain_seconds"] > 0
    assert point["probe"]["curve"]["sizes"][0] == 1
    paths = point["paths"]
    assert set(paths) == {"exact", "do_nothing", "audited_retrain"}
    for p in paths.values():
        assert p["seconds"] > 0 and p["predicted_seconds"] > 0 and p["cost_retrains"] > 0
    assert paths["do_nothing"]["decision"] in ("accepted", "rejected")
    assert paths["audited_retrain"]["oracles"] == 6 and paths["exact"]["passed"] in (True, False)
