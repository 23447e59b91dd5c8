"""Test configuration: offline switches, markers, GPU auto-skip, the shared Prefect harness."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

for key, value in {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1",
                   "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "GIT_PYTHON_REFRESH": "quiet"}.items():
    os.environ.setdefault(key, value)

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny test models run many times slower with 2 threads on a shared 2-core machine (thread contention).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        # the marker, not `"gpu" in item.keywords`: keywords hold the names of the folders above the test too,
        # so a checkout in a folder named gpu skipped every test
        if item.get_closest_marker("gpu") is not None and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect server (SQLite) for the whole session: entering it costs ~17 s."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
