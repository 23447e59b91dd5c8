"""The registry must hold the champion that state/champion.json records, in the store it was registered in.

Found by a fault sweep of `unlearn serve`: with mlflow.db moved away, the next batch registered its model in a
new, empty store (v1) without a word; once the old store was back, its `@champion` alias still pointed at a
model holding the row that batch had erased."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.store_check import champion_store_problem, registry_holds, store_identity

NAME = "unlearning-classifier"


def registry_with_versions(db: Path, n: int) -> str:
    """A real MLflow SQLite store at `db` whose registry holds NAME v1..vn (no artifacts needed)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(NAME)
    for _ in range(n):
        client.create_model_version(NAME, source=str(db.parent / "model"))
    return uri


def test_store_identity_is_project_relative_for_its_sqlite_file_and_never_holds_credentials(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    assert store_identity(f"sqlite:///{root / 'mlflow.db'}", root) == "sqlite:mlflow.db"
    # a copied or moved project keeps its identity; a file outside it is named by its absolute path
    moved = tmp_path / "moved"
    moved.mkdir()
    assert store_identity(f"sqlite:///{moved / 'mlflow.db'}", moved) == "sqlite:mlflow.db"
    assert store_identity(f"sqlite:///{tmp_path / 'other.db'}", root) == f"sqlite:{(tmp_path / 'other.db').as_posix()}"
    assert store_identity("http://127.0.0.1:5000/", root) == "http://127.0.0.1:5000"
    assert store_identity("postgresql://team:s3cret@db.local:5432/mlflow?sslmode=require", root) == \
        "postgresql://db.local:5432/mlflow"


def test_registry_holds_reads_a_real_store_without_creating_a_missing_one(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = registry_with_versions(db, 2)
    assert registry_holds(uri, NAME, "2") is True
    assert registry_holds(uri, NAME, "3") is False and registry_holds(uri, "other-model", "1") is False
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri, registry_uri=uri).delete_model_version(NAME, "2")  # kept as Deleted_Internal
    assert registry_holds(uri, NAME, "2") is False
    missing = tmp_path / "gone.db"
    assert registry_holds(f"sqlite:///{missing}", NAME, "1") is False and not missing.exists()
    empty = tmp_path / "empty.db"
    empty.touch()  # an SQLite file without MLflow's tables
    assert registry_holds(f"sqlite:///{empty}", NAME, "1") is False
    assert registry_holds("postgresql://h/db", NAME, "1") is None  # cannot tell cheaply: no verdict


def test_a_lost_store_is_a_problem_another_store_a_note_and_an_old_state_neither(tmp_path):
    root = tmp_path
    uri = registry_with_versions(root / "mlflow.db", 1)
    champion = {"model_version": "4", "batch_id": "batch-abc", "tracking_store": "sqlite:mlflow.db"}
    problem, note = champion_store_problem(uri, root, champion, NAME)
    assert note is None and "does not hold unlearning-classifier v4" in problem and "(batch batch-abc)" in problem
    assert "lost or replaced" in problem and "base.paths.mlflow_db" in problem and "nothing was changed" in problem
    # the store holds it: nothing to say
    assert champion_store_problem(uri, root, {**champion, "model_version": "1"}, NAME) == (None, None)
    # the champion lives in another store on purpose (MLFLOW_TRACKING_URI changed): a note, the batch goes on
    problem, note = champion_store_problem(uri, root, {**champion, "tracking_store": "http://team:5000"}, NAME)
    assert problem is None and "registered in the tracking store http://team:5000" in note
    # a state written before the store was recorded: no verdict (as before)
    assert champion_store_problem(uri, root, {"model_version": "4"}, NAME) == (None, None)
    # a missing file at the recorded place is lost too (and is not created by the check)
    (root / "mlflow.db").rename(root / "mlflow.db.away")
    problem, _ = champion_store_problem(uri, root, {**champion, "model_version": "1"}, NAME)
    assert "does not hold unlearning-classifier v1" in problem and not (root / "mlflow.db").exists()


@pytest.mark.parametrize("version_known", [True, False])
def test_the_check_needs_no_mlflow_import(version_known, tmp_path):
    """It runs in `unlearn run`'s fast path, before the heavy imports."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from adapters.store_check import champion_store_problem; "
            f"champion_store_problem('sqlite:///{tmp_path}/x.db', Path('{tmp_path}'), "
            f"{{'model_version': {'1' if version_known else None!r}, 'tracking_store': 'sqlite:x.db'}}, 'm'); "
            "sys.exit('mlflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2]).returncode == 0
