"""A kill between the two renames of a state swap (unlearning.io.commit_dir) leaves `.state.previous` and no
`state/`: every command first completes or rolls back that swap (unlearning.io.settle_interrupted_swaps,
called by flows.cli before the command runs), under the project's lock. The layouts are made by hand."""

from __future__ import annotations

import json

import pandas as pd

from flows.cli import main
from tests.helpers import make_project
from unlearning.data.store import manifest_csv_bytes
from unlearning.io import exclusive_lock, settle_interrupted_swaps, state_lock_path


def _folder(path, text: str):
    path.mkdir(parents=True)
    (path / "champion.json").write_text(text)
    return path


def test_killed_between_the_renames_is_rolled_back(tmp_path):
    state = tmp_path / "state"
    _folder(tmp_path / ".state.previous", '{"v": "old"}')
    _folder(tmp_path / ".state.staging-abc", '{"v": "new"}')  # the staged folder the kill left
    notes = settle_interrupted_swaps(state)
    assert len(notes) == 1 and "rolled back" in notes[0]
    assert json.loads((state / "champion.json").read_text()) == {"v": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".state.lock", "state"]
    assert settle_interrupted_swaps(state) == []  # settled: nothing more to do


def test_killed_after_the_second_rename_is_completed(tmp_path):
    state = _folder(tmp_path / "state", '{"v": "new"}')
    _folder(tmp_path / ".state.previous", '{"v": "old"}')
    notes = settle_interrupted_swaps(state)
    assert len(notes) == 1 and "completed" in notes[0]
    assert json.loads((state / "champion.json").read_text()) == {"v": "new"}
    assert not (tmp_path / ".state.previous").exists()


def test_the_prepared_store_is_settled_too(tmp_path):
    _folder(tmp_path / "state", "{}")
    _folder(tmp_path / ".prepared.previous", "{}")
    notes = settle_interrupted_swaps(tmp_path / "state", tmp_path / "prepared")
    assert len(notes) == 1 and (tmp_path / "prepared").is_dir()


def test_a_running_batch_keeps_its_swap(tmp_path):
    """The lock is held (a batch between its renames): nothing is touched; the batch settles it itself."""
    _folder(tmp_path / ".state.previous", "{}")
    _folder(tmp_path / ".state.staging-abc", "{}")
    with exclusive_lock(state_lock_path(tmp_path / "state"), timeout=1):
        assert settle_interrupted_swaps(tmp_path / "state") == []
    assert (tmp_path / ".state.previous").is_dir() and (tmp_path / ".state.staging-abc").is_dir()
    assert not (tmp_path / "state").exists()


def _state(folder):
    folder.mkdir(parents=True)
    (folder / "champion.json").write_text(json.dumps({"model_version": "3", "method": "finetune",
                                                      "batch_id": "batch-abc", "history": []}))
    (folder / "ledger.jsonl").write_text("")
    (folder / "model.pt").write_bytes(b"")
    manifest = pd.DataFrame({"sample_id": ["a", "b"], "split": ["train", "val"], "label": [0, 1],
                             "group": ["g", "g"], "class_name": ["c", "c"], "status": ["retained", "retained"],
                             "deleted_in_batch": [None, None]})
    (folder / "manifest.csv").write_bytes(manifest_csv_bytes(manifest))


def test_status_and_verify_erasure_roll_back_a_half_swapped_state(tmp_path, capsys):
    params = make_project(tmp_path, inbox_files=False)
    _state(tmp_path / ".state.previous")  # killed between the renames: state/ is gone
    (tmp_path / ".state.staging-x1").mkdir()
    assert main(["--params", str(params), "status", "--json"]) == 0
    out = capsys.readouterr()
    status = json.loads(out.out)
    assert status["champion"]["model_version"] == "3" and status["n_samples"] == 2, status
    assert "rolled back" in out.err and (tmp_path / "state" / "champion.json").is_file()
    (tmp_path / "state").rename(tmp_path / ".state.previous")  # the same kill again
    main(["--params", str(params), "verify-erasure"])
    out = capsys.readouterr()
    assert "No such file or directory" not in out.out + out.err and "rolled back" in out.err, out
    assert (tmp_path / "state" / "champion.json").is_file()
