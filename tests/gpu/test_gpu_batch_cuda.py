"""bench/gpu_batch.py on CUDA at a small size: every point runs the core batch path on the device, the probe's
curve and the plan's chunks come from the device (each role's references in one chunk: the device holds them)."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_bench_runs_on_cuda(tmp_path):
    out = tmp_path / "gpu_batch.json"
    proc = subprocess.run([sys.executable, "bench/gpu_batch.py", "--small", "--device", "cuda", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device_type"] == "cuda" and result["device"] == torch.cuda.get_device_name(0)
    assert [p["model"] for p in result["points"]] == ["mlp", "cnn", "resnet"]
    for point in result["points"]:
        assert point["probe"]["curve"]["sizes"][-1] == point["n"]  # the planned chunk: every member of a role
        for path in point["paths"].values():
            assert path["seconds"] > 0 and path["predicted_seconds"] > 0
        assert point["paths"]["audited_retrain"]["chunk"] == point["n"]
