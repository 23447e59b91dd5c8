"""`unlearn ui`: the MLflow UI over any project's store with the batches-first page (adapters/mlflow_ui.py), from
the installed package; fast: the server is replaced by a recorder (the browser test, tests/e2e/test_operations.py,
checks what the page then shows)."""

from __future__ import annotations

import socket
import sqlite3

import pytest

from flows.cli import main


def store(path, experiment="unlearning", eid="7"):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT, lifecycle_stage TEXT)")
    con.execute("INSERT INTO experiments VALUES (?, ?, 'active')", (int(eid), experiment))
    con.commit()
    con.close()


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_ui_serves_the_projects_store_with_the_batches_page(project, monkeypatch, capsys):
    import adapters.tracking as tracking

    store(project / "mlflow.db")
    served = {}
    monkeypatch.setattr(tracking, "run_mlflow_server", lambda argv, name, app: served.update(argv=argv, app=app))
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["ui", "--port", str(port)]) == 0
    out = capsys.readouterr().out
    assert f"http://127.0.0.1:{port}/#/experiments/7/runs?viewStateShareKey=batches&workflowType=machine_learning" in out
    assert served["app"] == "adapters.mlflow_ui:app"  # the page script, shipped in the package's adapters/
    argv = served["argv"]
    assert argv[argv.index("--backend-store-uri") + 1] == f"sqlite:///{project / 'mlflow.db'}"
    assert argv[argv.index("--default-artifact-root") + 1] == (project / "mlartifacts").as_uri()
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(port)


def test_ui_refuses_a_taken_port_and_a_missing_store_in_one_line(project, capsys):
    assert main(["ui"]) == 2  # no store yet
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no MLflow store at" in err[0] and "unlearn repro" in err[0]
    store(project / "mlflow.db")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["ui", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port}" in err[0] and f"--port {port + 1}" in err[0]


def test_a_tracking_server_serves_its_own_ui(project, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert main(["ui"]) == 0
    assert "open http://127.0.0.1:5999/" in capsys.readouterr().out


def test_the_page_script_ships_with_the_package():
    """pyproject's package list holds adapters/, so `unlearn init` projects (outside this checkout) import it."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert any(pat.rstrip("*") == "adapters" for pat in include)
    assert (root / "adapters" / "mlflow_ui.py").exists() and (root / "adapters" / "__init__.py").exists()
