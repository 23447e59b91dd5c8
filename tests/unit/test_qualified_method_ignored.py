"""Qualified mode runs the method the qualification licenses (tasks/batch_path.py qualified_run): a
deletion.method other than `auto` is not run, and the batch says so in one warning line."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from unlearning.config import load_params


class _Tracker:
    def log_json(self, *a, **k):
        pass

    def set_tags(self, *a, **k):
        pass


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def qualified_batch(method: str, monkeypatch) -> list[str]:
    """One qualified batch with nothing licensed (the exact retrain runs and is accepted); the warnings it said."""
    import tasks.qualification
    import tasks.stages as S
    from tasks.batch_path import BatchCounts, qualified_run
    from tasks.batch_settings import BatchSettings
    from unlearning.certificate.qualification import EXACT, License

    q = SimpleNamespace(noise=0.1, tag=lambda: "qualification")
    monkeypatch.setattr(tasks.qualification, "license_for_batch",
                        lambda *a: (License(EXACT, None, "nothing licensed"), 0.5, q, {}))
    monkeypatch.setattr(S, "unlearn_and_certify", lambda *a: SimpleNamespace(method=a[1].method))
    monkeypatch.setattr(S, "accepted", lambda *a: True)
    params = load_params(overrides={"validation": {"mode": "qualified"}, "deletion": {"method": method}})
    batch = S.BatchRun(_Tracker(), "run-1", Path("a.csv"), "batch-x", "cpu", {})
    warned, logger = _Lines(), logging.getLogger("unlearning")  # run_logger outside a run (Prefect's config: no root)
    logger.addHandler(warned)
    try:
        out, licensing = qualified_run(batch, BatchSettings.of(params), None, None, "retrain_equivalence", None, BatchCounts(100, 0))
    finally:
        logger.removeHandler(warned)
    assert out.method == EXACT and licensing.method == EXACT
    return warned.lines


@pytest.mark.parametrize("method", ["do_nothing", "retrain"])
def test_an_explicit_method_in_qualified_mode_is_said_to_be_ignored(method, monkeypatch):
    (line,) = qualified_batch(method, monkeypatch)
    assert f"deletion.method = {method!r}" in line and "qualified mode" in line
    assert "the qualification's license decides" in line


def test_auto_in_qualified_mode_says_nothing(monkeypatch):
    assert qualified_batch("auto", monkeypatch) == []
