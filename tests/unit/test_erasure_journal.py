"""The erasure journal (unlearning/privacy/erasure_journal.py): what an erase has finished, store by store, so a kill
between two stores is resumed, named by `unlearn status` and finished before `make run`'s `dvc repro`."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_project
from unlearning.privacy.erasure_journal import Journal, has_unfinished, journal_dir, unfinished
from unlearning.io import StateCorrupt

ORDER = ["erasure reports", "tombstones", "prepared store", "state manifest", "DVC cache"]


def _start(state_dir, batch="batch-1"):
    return Journal.start(journal_dir(state_dir), batch, run_id="r1", champion_version=2, keys=["sha256:b", "sha256:a"],
                         n_ids=2, row_digests=["sha256:d"], order=ORDER)


def test_a_journal_records_each_store_and_goes_when_closed(tmp_path):
    state = tmp_path / "state"
    assert not has_unfinished(state) and unfinished(state) == []
    j = _start(state)
    assert journal_dir(state) == tmp_path / ".state.erasure-journal" and has_unfinished(state)
    j.record("erasure reports", [])
    j.record("prepared store", [{"store": "prepared", "purged_rows": 3}])
    again = unfinished(state)[0]  # what the next process reads back
    assert again.batch_id == "batch-1" and again.keys == ["sha256:a", "sha256:b"] and again.champion_version == "2"
    assert again.finished("prepared store") and not again.finished("tombstones")
    assert again.stores["prepared store"] == [{"store": "prepared", "purged_rows": 3}]
    line = again.describe()
    assert "2 of 5 store(s) done" in line and "next: tombstones" in line and "state manifest" in line
    again.close()
    assert not has_unfinished(state)


def test_a_store_left_pending_is_not_finished_until_recorded_again(tmp_path):
    j = _start(tmp_path / "state")
    j.record("prepared store", [{"store": "prepared", "pending": True}], pending="prepared store")
    assert not j.finished("prepared store")
    assert "pending (a store `dvc repro` held) for `unlearn erase`: prepared store" in j.describe()
    j.record("prepared store", [{"store": "prepared", "purged_rows": 3}])
    assert j.finished("prepared store") and j.pending == {}


def test_the_journal_is_written_whole_and_holds_no_temp_file(tmp_path):
    j = _start(tmp_path / "state")
    j.record("tombstones", [{"entries": 2}])
    files = sorted(p.name for p in journal_dir(tmp_path / "state").iterdir())
    assert files == ["batch-1.json"]
    assert json.loads((journal_dir(tmp_path / "state") / "batch-1.json").read_text())["version"] == 1


def test_a_damaged_journal_says_what_to_do(tmp_path):
    folder = journal_dir(tmp_path / "state")
    folder.mkdir(parents=True)
    (folder / "b.json").write_text('{"batch_id": "b"}')  # no version: another program's file
    with pytest.raises(StateCorrupt, match="not an erasure journal of this version.*unlearn erase"):
        unfinished(tmp_path / "state")
    (folder / "b.json").write_text('{"batch_')  # cut by hand
    with pytest.raises(StateCorrupt, match="not valid JSON"):
        unfinished(tmp_path / "state")


def test_unfinished_erases_come_oldest_first(tmp_path):
    state = tmp_path / "state"
    first = _start(state, "z-first")
    second = _start(state, "a-second")
    first.started_at, second.started_at = "2026-01-01T00:00:00", "2026-01-02T00:00:00"
    first.write(), second.write()
    assert [j.batch_id for j in unfinished(state)] == ["z-first", "a-second"]


def test_make_run_finishes_an_unfinished_erase_before_dvc_repro(tmp_path, monkeypatch, capsys):
    from flows.intake import erase_first

    make_project(tmp_path, inbox_files=False)
    monkeypatch.chdir(tmp_path)
    commands = [["dvc", "repro", "deletion"], ["/v/bin/unlearn", "--params", "params.yaml", "erase"],
                ["/v/bin/unlearn", "status"]]
    assert erase_first(commands) == commands  # nothing unfinished: unchanged, nothing said
    assert capsys.readouterr().out == ""
    _start(tmp_path / "state")
    assert erase_first(commands) == [commands[1], *commands]
    assert "`unlearn erase` finishes it before `dvc repro`" in capsys.readouterr().out
    assert erase_first([["python", "-m", "dvc", "repro"]])[0][-2:] == ["flows.cli", "erase"]
    assert erase_first([["ls"], ["dvc", "repro"]]) == [["ls"], ["dvc", "repro"]]  # only before a dvc repro


def test_status_names_the_unfinished_erase(tmp_path):
    from tasks.pending import pending_erasures
    from unlearning.config import load_params

    params = load_params(make_project(tmp_path, inbox_files=False))
    assert pending_erasures(params) == []
    _start(params.path("state_dir")).record("erasure reports", [])
    lines = pending_erasures(params)
    assert len(lines) == 1 and lines[0].startswith("unfinished erase: batch batch-1: erase started")
    assert "1 of 5 store(s) done (next: tombstones" in lines[0]
