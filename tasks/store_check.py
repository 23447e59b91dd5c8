"""Is the MLflow tracking store usable: answered in milliseconds with the stdlib, before MLflow (1.7 s to
import), Prefect or a flow starts. A store that fails here would fail later inside a flow, with an 80-line
SQLAlchemy or urllib traceback; here it is one line with the fix, and nothing was changed yet."""

from __future__ import annotations

import os
import sqlite3
import urllib.request
from pathlib import Path

from unlearning.config import is_tracking_server


LOCKED = "locked by another process"


def sqlite_problem(db: Path) -> str | None:
    """What makes `db` unreadable as an SQLite database (truncated, overwritten, not a database), or None."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        # locked for the whole 5 s wait: another process holds an exclusive lock (a normal writer's commit takes
        # milliseconds); MLflow then failed after ~30 s with four sqlalchemy tracebacks
        if "locked" in str(e):
            return (f"{LOCKED} for more than 5 s (a long write transaction, or a tool holding it "
                    f"open: `fuser {db}` names it); wait for it to finish, or stop that process")
        return str(e)
    except sqlite3.DatabaseError as e:
        return str(e)
    return None


def tracking_store_problem(tracking_uri: str, timeout: float = 5.0) -> str | None:
    """Why the tracking store at `tracking_uri` cannot be used (one line, with the fix), or None."""
    if is_tracking_server(tracking_uri):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                if r.status >= 400:
                    raise OSError(f"HTTP {r.status}")
        except Exception as e:
            return (f"MLflow tracking server {tracking_uri} is unreachable ({getattr(e, 'reason', e)}); start it "
                    f"(`make ui`, or `mlflow server --host 127.0.0.1 --port 5000 ...`) or unset MLFLOW_TRACKING_URI "
                    f"to use the project's SQLite store; nothing was changed")
        return None
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri[len("sqlite:///"):])
    if not db.parent.exists() or not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
        return (f"MLflow store {tracking_uri} is not writable (folder {db.parent}); fix the permissions or set "
                f"MLFLOW_TRACKING_URI; nothing was changed")
    problem = sqlite_problem(db) if db.exists() else None
    if problem and problem.startswith(LOCKED):
        return f"MLflow store {tracking_uri} is {problem}; nothing was changed"
    if problem:
        return (f"MLflow store {tracking_uri} is not a readable SQLite database ({problem}); restore {db.name} from a "
                f"backup, or move it away (`mv {db} {db}.broken`): the next command creates an empty store; nothing "
                f"was changed")
    return None
