"""Is the MLflow tracking store usable: answered in milliseconds with the stdlib, before MLflow (1.7 s to
import), Prefect or a flow starts. A store that fails here would fail later inside a flow, with an 80-line
SQLAlchemy or urllib traceback; here it is one line with the fix, and nothing was changed yet."""

from __future__ import annotations

import os
import sqlite3
import urllib.request
from pathlib import Path

from adapters.server_auth import mlflow_headers, mlflow_login_problem, mlflow_tls
from unlearning.config import is_tracking_server


LOCKED = "locked by another process"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///...` tracking URI; None for any other kind of store."""
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


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
            with urllib.request.urlopen(url, timeout=timeout, context=mlflow_tls()) as r:
                if r.status >= 400:
                    raise OSError(f"HTTP {r.status}")
        except Exception as e:
            return (f"MLflow tracking server {tracking_uri} is unreachable ({getattr(e, 'reason', e)}); start it "
                    f"(`make ui`, or `mlflow server --host 127.0.0.1 --port 5000 ...`) or unset MLFLOW_TRACKING_URI "
                    f"to use the project's SQLite store; nothing was changed")
        return mlflow_login_problem(tracking_uri, timeout)  # /health answers without a login
    db = sqlite_file(tracking_uri)
    if db is None:
        return None
    if not db.parent.exists() or not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
        return (f"MLflow store {tracking_uri} is not writable (folder {db.parent}); fix the permissions or set "
                f"MLFLOW_TRACKING_URI; nothing was changed")
    problem = sqlite_problem(db) if db.exists() else None
    if problem and problem.startswith(LOCKED):
        return f"MLflow store {tracking_uri} is {problem}; nothing was changed"
    if problem:
        return (f"MLflow store {tracking_uri} is not a readable SQLite database ({problem}); restore {db.name} from a "
                f"backup, or give the project a new store at another place (base.paths.mlflow_db, or "
                f"MLFLOW_TRACKING_URI): its registry starts empty; nothing was changed")
    return None


def store_identity(tracking_uri: str, root: Path) -> str:
    """Where a tracking store's registry lives, as state/champion.json records it (`tracking_store`): a SQLite
    file inside the project as a path relative to it (a copied or moved project keeps its identity), any other
    URI without its user, password and query (no credentials in the state)."""
    from urllib.parse import urlsplit, urlunsplit

    db = sqlite_file(tracking_uri)
    if db is not None:
        try:
            return f"sqlite:{db.resolve().relative_to(Path(root).resolve()).as_posix()}"
        except ValueError:
            return f"sqlite:{db.resolve().as_posix()}"
    parts = urlsplit(tracking_uri)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def registry_holds(tracking_uri: str, name: str, version: str, timeout: float = 5.0) -> bool | None:
    """Whether the store's registry holds `name` version `version` (not deleted); None when that cannot be told
    cheaply (another database backend, an unexpected answer). Stdlib only: a missing SQLite file is not created."""
    db = sqlite_file(tracking_uri)
    if db is not None:
        if not db.exists():
            return False
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout)
            try:
                # an MLflow deletion keeps the row, marked Deleted_Internal
                row = con.execute("SELECT 1 FROM model_versions WHERE name = ? AND version = ? AND "
                                  "(current_stage IS NULL OR current_stage != 'Deleted_Internal')",
                                  (name, int(version))).fetchone()
            finally:
                con.close()
        except (sqlite3.Error, ValueError) as e:
            return False if "no such table" in str(e) else None  # no registry at all: a new, empty file
        return row is not None
    if is_tracking_server(tracking_uri):
        import json
        from urllib.error import HTTPError
        from urllib.parse import urlencode

        url = (tracking_uri.rstrip("/") + "/api/2.0/mlflow/model-versions/get?"
               + urlencode({"name": name, "version": str(version)}))
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=mlflow_headers()), timeout=timeout,
                                        context=mlflow_tls()) as r:
                return bool(json.load(r).get("model_version"))
        except HTTPError as e:
            return False if e.code == 404 else None
        except Exception:  # unreachable: preflight's tracking_store_problem says so
            return None
    return None


def champion_store_problem(tracking_uri: str, root: Path, champion: dict, name: str) -> tuple[str | None, str | None]:
    """(problem, note) for the registry against state/champion.json. A problem: the store the champion was
    registered in (the same place) no longer holds it, so it was lost or replaced, e.g. mlflow.db moved away
    while `unlearn serve` ran, or recreated empty by `make setup`; a batch would register its model in a new,
    empty registry while the old one, once back, kept its alias on a model that still holds the rows this
    batch erases. A note: the champion lives in ANOTHER store (MLFLOW_TRACKING_URI or base.paths.mlflow_db
    changed: a move to the team servers, say), where the next promoted batch registers its model."""
    version, recorded = champion.get("model_version"), champion.get("tracking_store")
    if version is None or recorded is None:  # no champion yet, or a state from before stores were recorded
        return None, None
    if registry_holds(tracking_uri, name, str(version)) is not False:
        return None, None
    current = store_identity(tracking_uri, root)
    if recorded != current:
        return None, (f"the champion {name} v{version} was registered in the tracking store {recorded}; this store "
                      f"({current}) does not hold it: the next promoted batch registers its model here")
    batch = champion.get("batch_id")
    return (f"MLflow store {tracking_uri} does not hold {name} v{version}, the champion state/champion.json records"
            f"{f' (batch {batch})' if batch else ''}: the store was lost or replaced by a new one since. Restore "
            f"it (the store and its artifact folder) from a backup. To go on with a new store on purpose, give it "
            f"another place (base.paths.mlflow_db, or MLFLOW_TRACKING_URI): the next promoted batch registers its "
            f"model there, and the old store is no longer reconciled or erased by this pipeline; nothing was "
            f"changed"), None


def alias_in_sync(params, version) -> bool:
    """Whether the project's local SQLite registry already points tracking.alias of tracking.registered_model at
    `version` (state/champion.json's): then `unlearn status` has nothing to reconcile and needs no MLflow
    import (3-6 s on a loaded machine). False whenever that cannot be told this way (a tracking server, no
    store, another schema): the caller reconciles through MLflow, as before. Stdlib only."""
    if version is None:
        return False
    db = sqlite_file(params.mlflow_tracking_uri())
    if db is None or not db.exists():
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
        try:
            row = con.execute("SELECT version FROM registered_model_aliases WHERE name = ? AND alias = ?",
                              (params.tracking.registered_model, params.tracking.alias)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return row is not None and str(row[0]) == str(version)


def state_champion_store_problem(params) -> tuple[str | None, str | None]:
    """`champion_store_problem` for the project's state/champion.json and tracking store (nothing without a
    state)."""
    import json

    champion_file = params.path("state_dir") / "champion.json"
    try:
        champion = json.loads(champion_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):  # no state yet; a damaged file is StateCorrupt where it is read
        return None, None
    return champion_store_problem(params.mlflow_tracking_uri(), params.root, champion,
                                  params.tracking.registered_model)
