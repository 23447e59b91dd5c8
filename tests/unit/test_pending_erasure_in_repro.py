"""A batch killed between its commit and its erasure leaves ledger ids that no tombstone holds. A plain rerun of
`dvc repro deletion` (DVC_STAGE set) must take that erasure as far as the batch's own would go inside `dvc
repro` (tombstones, ensemble cache, registry; the DVC-held stores recorded as pending for `unlearn erase`),
not leave it untouched. The decision is tasks.erasure.erase_pending's; `erase` itself is recorded here."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import tasks.erasure as er
from tasks.stores.base import ErasureSettings
from tests.helpers import make_project
from unlearning.config import load_params


@pytest.fixture
def project(tmp_path, monkeypatch):
    params = load_params(make_project(tmp_path, inbox_files=False))
    state = params.path("state_dir")
    state.mkdir(parents=True)
    (state / "ledger.jsonl").write_text("".join(json.dumps({"request_id": f"r{i}", "sample_id": f"s{i}",
                                                            "batch_id": "batch-k"}) + "\n" for i in range(2)))
    calls = []
    monkeypatch.setattr(er, "erase", lambda settings, batch, ids, salt, version, tracker, keys=None:
                        calls.append((batch, keys)) or {"batch_id": batch})
    monkeypatch.setattr(er, "load_prepared", lambda folder: SimpleNamespace(info={"name": "digits"}))
    monkeypatch.setattr(er, "_prepared_holds_tombstoned", lambda paths, deletion, salt: True)
    return params, calls


def _pending_report(params):
    er.reports_dir(params.project_paths).mkdir(parents=True, exist_ok=True)
    (er.reports_dir(params.project_paths) / "batch-old.json").write_text(json.dumps({"batch_id": "batch-old",
                                                                        "pending": ["prepared store"]}))


def test_a_rerun_inside_dvc_repro_tombstones_what_a_killed_batch_left(project, monkeypatch):
    params, calls = project
    monkeypatch.setenv("DVC_STAGE", "deletion")
    assert er.erase_pending(ErasureSettings.of(params)) == [{"batch_id": "batch-k"}]
    assert calls == [("batch-k", ["s0", "s1"])]


def test_inside_dvc_repro_a_pending_report_waits_for_unlearn_erase(project, monkeypatch):
    params, calls = project
    (params.path("tombstones")).parent.mkdir(parents=True, exist_ok=True)
    params.path("tombstones").write_text("s0\ns1\n")  # nothing missing: only the DVC-held stores are pending
    _pending_report(params)
    monkeypatch.setenv("DVC_STAGE", "deletion")
    assert er.erase_pending(ErasureSettings.of(params)) == [] and calls == []  # not a new "recovered" pass per repro
    monkeypatch.delenv("DVC_STAGE")
    assert er.erase_pending(ErasureSettings.of(params)) == [{"batch_id": "batch-old"}]  # `unlearn erase` finishes it
    assert calls == [("batch-old", None)]
