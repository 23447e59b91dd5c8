"""tasks/batch_settings.py: the record a deletion batch reads its params through, built once per batch."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.batch_settings import BatchSettings
from unlearning.config import EXACT_RETRAIN, parse_params


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = parse_params({"deletion": {"method": "do_nothing", "hash_sample_ids": False},
                           "validation": {"n_oracles": 6, "n_shadows": 4}, "base": {"seed": 7}}, root=tmp_path)
    return params, BatchSettings.of(params)


def test_it_holds_the_sections_the_batch_reads_and_nothing_it_does_not(settings):
    params, s = settings
    assert (s.deletion, s.validation, s.gate, s.train, s.seed) == (
        params.deletion, params.validation, params.gate, params.train, 7)
    names = {f.name for f in dataclasses.fields(s)}
    assert not names & {"report", "qualify", "quality"}  # no batch stage reads them
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 8


def test_the_records_are_made_of_the_same_sections_once_and_only_when_read(settings):
    params, s = settings
    assert "step_inputs" not in vars(s)  # nothing built until a stage reads it
    step = s.step_inputs
    assert step is s.step_inputs  # built once per batch
    assert step.training is s.reference_training and step.gate is params.gate
    assert step.training.validation.n_oracles == 6 and step.training.seed == 7
    assert s.probe_inputs.method_args is params.deletion.method_args
    assert s.map_settings.licensing is params.licensing and s.map_settings.ids.hashed is False
    assert s.diagnostics_settings.partition_mode == params.deletion.partition.mode


def test_a_failed_audit_goes_on_with_a_new_record_naming_the_exact_retrain(settings):
    params, s = settings
    exact = s.exact()
    assert exact.deletion.method == EXACT_RETRAIN and s.deletion.method == "do_nothing"  # the batch's is untouched
    assert exact.deletion.model_copy(update={"method": "do_nothing"}) == s.deletion  # nothing else changed
    assert exact.validation is s.validation and exact.erasing is s.erasing


def test_the_champion_records_a_project_store_by_its_path_inside_the_project(settings, tmp_path):
    _, s = settings
    assert s.tracking_store == "sqlite:mlflow.db"  # relative: a moved or copied project keeps its identity
    assert str(tmp_path) not in s.tracking_store
