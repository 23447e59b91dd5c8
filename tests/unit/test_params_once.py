"""params.yaml is read and validated once per process and file content (unlearning/config.py load_params): a
stage's steps that ask for it again get a copy of the same result; a file that changed is read again."""

from __future__ import annotations

import unlearning.config as config


def _count_validations(monkeypatch) -> list[int]:
    calls = [0]
    real = config.parse_params

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(config, "parse_params", counting)
    return calls


def test_params_are_validated_once_per_file_content_and_overrides(tmp_path, monkeypatch):
    calls = _count_validations(monkeypatch)
    path = tmp_path / "params.yaml"
    path.write_text("base:\n  seed: 3\n")
    first, second = config.load_params(path), config.load_params(path)
    assert calls[0] == 1 and first == second and first is not second and second.base.seed == 3
    config.load_params(path, {"base": {"seed": 4}})  # other overrides: validated on their own
    assert calls[0] == 2 and config.load_params(path, {"base": {"seed": 4}}).base.seed == 4 and calls[0] == 2
    path.write_text("base:\n  seed: 5\n")  # the file changed: read and validated again
    assert config.load_params(path).base.seed == 5 and calls[0] == 3


def test_a_caller_changing_its_params_does_not_change_the_next_callers(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("gate:\n  criterion: difference\n")
    mine = config.load_params(path)
    mine.gate.criterion = "epsilon"  # a bench sets a section in place
    assert config.load_params(path).gate.criterion == "difference"


def test_a_bad_file_is_refused_each_time_it_is_asked_for(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("base:\n  sede: 3\n")
    for _ in range(2):
        try:
            config.load_params(path)
        except config.ConfigError as e:
            assert "sede" in str(e)
        else:
            raise AssertionError("a misspelt key was accepted")
