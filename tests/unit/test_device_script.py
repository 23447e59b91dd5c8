"""The prepared device check (bench/device/run.sh, docs/gpu.md "Measuring on a device") runs end to end: its dry
run (SMALL=1: bench/gpu_batch.py --small, here on the CPU) leaves the bench's JSON and the logs in $OUT and does
not touch docs/gpu.md, whose table only a device run writes."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow  # bash, then a fresh interpreter running the bench on three models: the end-to-end tier
def test_the_device_script_dry_run_leaves_its_results_in_out(tmp_path):
    docs_before = (ROOT / "docs" / "gpu.md").read_text()
    env = {**os.environ, "PY": sys.executable, "SMALL": "1", "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", "bench/device/run.sh", "bench"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_batch.json").read_text())
    assert result["small"] is True and [p["model"] for p in result["points"]] == ["mlp", "cnn", "resnet"]
    assert {"device.txt", "gpu_batch.log", "gpu.md"} <= {p.name for p in tmp_path.iterdir()}
    assert (ROOT / "docs" / "gpu.md").read_text() == docs_before
