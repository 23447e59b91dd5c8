"""A new MLflow SQLite store in the test session starts as a copy of one made once (tests/conftest.py installs it).

MLflow makes a new SQLite store by creating its tables and then running every one of its migrations (about 60
Alembic revisions, each its own commit): 1.4-1.6 s of CPU a store on these machines, and several seconds of
wall time under load (every DDL commit is an fsync). The tests make a new store for nearly every project they
train and every tracker they open, dozens per run. Here the first new store of the session is made by MLflow's
own `_initialize_tables` into a template; every later one is that template copied into the new file with
SQLite's backup API. The result is the same database (the same tables, indexes and Alembic revision): what
MLflow does next (its schema check, the Default experiment) runs on it unchanged. Stores on other databases,
and stores made by other processes (`make setup`, the e2e tests' commands), are made by MLflow as always."""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

_state: dict = {"original": None, "template": None}


def template_path() -> Path:
    """The session's template store, made by MLflow's own `_initialize_tables` on first use."""
    if _state["template"] is None:
        import sqlalchemy

        folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
        atexit.register(shutil.rmtree, folder, True)
        engine = sqlalchemy.create_engine(f"sqlite:///{folder / 'template.db'}")
        try:
            _state["original"](engine)
        finally:
            engine.dispose()
        _state["template"] = folder / "template.db"
    return _state["template"]


def initialize_from_template(engine) -> None:
    """In place of mlflow.store.db.utils._initialize_tables: a SQLite file gets the template's content, any
    other database MLflow's own migrations."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return _state["original"](engine)
    source, target = sqlite3.connect(template_path()), sqlite3.connect(url.database)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def install() -> None:
    """Use the template for new stores from now on, once MLflow is imported (a run that never imports MLflow
    never makes a template)."""
    if "mlflow" not in sys.modules:
        return
    import mlflow.store.db.utils as utils

    if _state["original"] is None:
        _state["original"] = utils._initialize_tables
        utils._initialize_tables = initialize_from_template
    registry = sys.modules.get("mlflow.store.model_registry.sqlalchemy_store")  # imported the function by name
    if registry is not None and registry._initialize_tables is not initialize_from_template:
        registry._initialize_tables = initialize_from_template
