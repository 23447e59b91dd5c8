"""`make server PREFECT_PORT=<port>`: the Prefect UI's page asks its API on that port (Prefect derives the UI's API
URL from its settings, port 4200, not from `--port`; the target sets PREFECT_UI_API_URL from the port)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_server_points_the_ui_at_its_own_port():
    out = subprocess.run(["make", "-n", "server", "PREFECT_PORT=4321"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    start = out[out.index("PREFECT_UI_API_URL="):]
    assert start.startswith("PREFECT_UI_API_URL=${PREFECT_UI_API_URL:-http://127.0.0.1:4321/api}")
    assert "prefect server start --host 127.0.0.1 --port 4321" in start
