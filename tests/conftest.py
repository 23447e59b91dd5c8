"""Test configuration: offline switches, markers, GPU auto-skip, the shared Prefect harness, a progress line with
an ETA (tests/progress_eta.py), and what a test must not leave behind in the pytest process (signal handlers,
logging handlers bound to a capture that pytest closes)."""

import os
import signal
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

from tests import mlflow_store_template  # noqa: E402
from tests.capture_safe_logging import follow_open_stderr  # noqa: E402

# Tiny test models run many times slower with 2 threads on a shared 2-core machine (thread contention).
torch.set_num_threads(1)


def pytest_configure(config):
    from tests.progress_eta import ProgressEta

    # under pytest-xdist the controller reports the progress (a worker's output is not the terminal)
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("progress-eta"):
        config.pluginmanager.register(ProgressEta(), "progress-eta")


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
    """One temporary Prefect server (SQLite) for the whole session: entering it costs ~10 s (~17 s when its
    database is migrated at its start: tests/prefect_template.py)."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing import utilities

    from tests.prefect_template import start_on_migrated_database

    undo = start_on_migrated_database(utilities)  # its database migrated once per checkout, not per session
    try:
        with utilities.prefect_test_harness(server_startup_timeout=120):
            undo()
            follow_open_stderr()
            yield
            follow_open_stderr()  # a handler made since (its teardown logs to the console)
    finally:
        undo()


# --- what a test leaves in the pytest process ------------------------------------------------------------------
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A test that runs a command's main() in this process (flows.session installs a SIGTERM handler that raises
    KeyboardInterrupt) leaves its handlers to the next test and to pytest: restored after each test."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) is not handler:
            signal.signal(s, handler)


# Set by a command's main() run in this process (`unlearn --debug` sets UNLEARN_DEBUG for Prefect's console): left
# behind, the stages the next tests start in subprocesses print tracebacks instead of one `error:` line.
PROCESS_WIDE_SWITCHES = ("UNLEARN_DEBUG",)


@pytest.fixture(autouse=True)
def _process_wide_switches_restored():
    """A command's switches that a test's in-process main() sets in os.environ are restored after the test."""
    before = {name: os.environ.get(name) for name in PROCESS_WIDE_SWITCHES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _new_mlflow_stores_from_a_template():
    """New SQLite MLflow stores are copies of one migrated store (tests/mlflow_store_template.py), once MLflow is
    imported; each test checks, since a test may be the first to import it."""
    mlflow_store_template.install()
    yield


def pytest_collection_finish(session):
    follow_open_stderr()
    mlflow_store_template.install()
