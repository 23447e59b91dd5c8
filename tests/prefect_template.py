"""The test session's Prefect server starts on a copy of a migrated, empty database (tests/conftest.py).

prefect_test_harness gives its server a new SQLite database, and the server then runs every Prefect migration at
its start: 15 s of its CPU against 7 s on a migrated one, on these machines. The migrated database is made once
per checkout and Prefect version, by `prefect server database upgrade` (what `make setup` does for `make run`'s
database), into .prefect/ (git-ignored); never used itself, only copied. Any doubt (it cannot be made) leaves the
harness as Prefect ships it."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
MIGRATE_ON_START = "PREFECT_SERVER_DATABASE_MIGRATE_ON_START"


def migrated_database() -> Path | None:
    """.prefect/test-harness-<prefect version>.db, made when missing; None when it cannot be made."""
    path = ROOT / ".prefect" / f"test-harness-{importlib.metadata.version('prefect')}.db"
    if path.exists():
        return path
    path.parent.mkdir(exist_ok=True)
    home = tempfile.mkdtemp(prefix="prefect-upgrade-")
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # another session may make it meanwhile
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{partial}"}
    try:
        done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                              capture_output=True, timeout=600)
        if done.returncode != 0 or not partial.exists():
            return None
        os.replace(partial, path)
        return path
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(home, ignore_errors=True)


def start_on_migrated_database(harness_module) -> Callable[[], None]:
    """Make prefect_test_harness (in `harness_module`, prefect.testing.utilities) put a copy of the migrated
    database where it makes its own, and its server skip the migrations. Returns the undo, to call once the
    harness's server runs (a server started later by a test must migrate its own database)."""
    template = migrated_database()
    if template is None:
        return lambda: None
    folder = tempfile.mkdtemp(prefix="prefect-harness-")
    shutil.copyfile(template, os.path.join(folder, "prefect-test.db"))  # the name the harness gives its database
    original_mkdtemp, before = harness_module.mkdtemp, os.environ.get(MIGRATE_ON_START)
    harness_module.mkdtemp = lambda: folder
    os.environ[MIGRATE_ON_START] = "false"  # the server process inherits the environment

    def undo() -> None:
        harness_module.mkdtemp = original_mkdtemp
        if before is None:
            os.environ.pop(MIGRATE_ON_START, None)
        else:
            os.environ[MIGRATE_ON_START] = before

    return undo
