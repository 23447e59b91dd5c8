"""The planner's probe measures what the batch will get (unlearning/planning/costs.py ProbeConditions, unlearning/planning/probe.py
ConditionsMeter, tasks/planning.py probe): the process's CPU share over the probe, rounds until they agree, a
cached figure taken again when it is old or was taken under another load, and the range the plan states. Known
values with fake clocks: nothing here depends on how loaded the machine is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from unlearning.planning.costs import CostCurve, ProbeConditions, contention, round_factors, steady_curve
from unlearning.planning.probe import ConditionsMeter, load_per_cpu


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def test_the_meter_reads_the_cpu_share_and_the_load_per_core():
    wall, cpu = Clock(100.0), Clock(7.0)
    meter = ConditionsMeter(wall=wall, cpu=cpu, load=lambda: load_per_cpu(lambda: (6.0, 5.0, 4.0), lambda: 2),
                            now=lambda: 1e9)
    with meter:
        wall.t += 4.0
        cpu.t += 1.0  # one CPU second in four of wall time: the probe had a quarter of a core
    assert meter.cpu_share == pytest.approx(0.25) and meter.load_per_cpu == pytest.approx(3.0)
    c = meter.conditions(rounds=2, low=0.9, high=1.1, max_spread=0.25)
    assert (c.threads, c.cpu_share, c.load_per_cpu, c.probed_at, c.rounds) == (1, 0.25, 3.0, 1e9, 2)
    assert c.spread == pytest.approx(0.2) and ProbeConditions.from_dict(c.to_dict()) == c
    assert "2 round(s), spread 20% (within the bound 25%" in c.line() and "CPU share 0.25 on 1 thread(s)" in c.line()
    assert load_per_cpu(lambda: (3.0, 0, 0), lambda: 4) == 0.75


def test_the_probe_times_with_the_batchs_training_threads(monkeypatch):
    """The probe's steps run with the thread count every training run uses (TRAIN_THREADS), not torch's default."""
    import torch

    import unlearning.planning.probe as probe_mod
    from unlearning.models import TrainRecipe, build_model
    from unlearning.models.training import TRAIN_THREADS
    from unlearning.planning.probe import StepTimer

    seen = []
    real_fit = probe_mod.fit
    monkeypatch.setattr(probe_mod, "fit", lambda *a, **kw: seen.append(kw.get("threads")) or real_fit(*a, **kw))
    X, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    StepTimer(lambda k: build_model({"arch": "mlp", "in_shape": [8], "n_classes": 3, "kwargs": {"hidden": [8]}},
                                    list(range(1, k + 1))), X, y, TrainRecipe(epochs=1, batch_size=16, lr=0.01),
              "cpu", min_seconds=0.0)(1)
    assert seen and set(seen) == {TRAIN_THREADS} == {1}


def curve(*t):
    return CostCurve((1, 3, 8), tuple(t), (0.0, 0.0, 0.0), "fake")


def test_rounds_repeat_until_they_agree_or_report_the_spread():
    rounds = iter([curve(1.0, 3.0, 8.0), curve(1.1, 3.3, 8.8), curve(9.0, 27.0, 72.0)])
    got, n, low, high = steady_curve(lambda: next(rounds), max_spread=0.25, max_rounds=3)
    assert n == 2 and got.step_seconds == pytest.approx((1.05, 3.15, 8.4))  # the second round agreed within 10 %
    assert (low, high) == pytest.approx((1.0 / 1.05, 1.1 / 1.05))
    # a stall in the second round (another process took the cores): a third round, then the spread as measured
    rounds = iter([curve(1.0, 3.0, 8.0), curve(4.0, 12.0, 32.0), curve(1.2, 3.6, 9.6)])
    got, n, low, high = steady_curve(lambda: next(rounds), max_spread=0.25, max_rounds=3)
    assert n == 3 and got.step_seconds == pytest.approx((1.2, 3.6, 9.6))  # the median round
    assert low == pytest.approx(1.0 / 1.2) and high == pytest.approx(4.0 / 1.2) and high - low > 0.25
    med, factors = round_factors([curve(1.0, 3.0, 8.0), curve(2.0, 6.0, 16.0)])
    assert med.step_seconds == (1.5, 4.5, 12.0) and factors == pytest.approx([2 / 3, 4 / 3])


def test_a_cached_probe_is_stale_when_old_or_taken_under_another_load():
    c = ProbeConditions(threads=1, cpu_share=0.2, load_per_cpu=4.3, probed_at=1000.0)  # the 8.6x slow figure
    day = 24 * 3600
    assert c.stale(1000.0 + 60, 4.0, day, 2.0) is None
    assert "probed 25.0 h ago" in c.stale(1000.0 + 25 * 3600, 4.3, day, 2.0)
    why = c.stale(1000.0 + 60, 0.5, day, 2.0)  # the machine went quiet: 4.3x less contention
    assert "4.3x the contention" in why and "validation.probe.max_load_ratio = 2" in why
    assert ProbeConditions(1, 1.0, 0.3, 1000.0).stale(1060.0, 0.9, day, 2.0) is None  # a free core either way
    assert contention(0.4) == 1.0 and contention(3.0) == 3.0


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A one-epoch digits MLP and a 10-row batch, its rows as the batch computes them (the group partition)."""
    from tasks.batch import partition_retain
    from tasks.training import build
    from tests.helpers import make_project
    from unlearning.batch.rows import batch_rows
    from unlearning.config import Partition, load_params
    from unlearning.data import load_dataset
    from unlearning.data.store import load_prepared, write_prepared

    params = load_params(make_project(tmp_path_factory.mktemp("probe"), {"train": {"epochs": 1}}, inbox_files=False))
    write_prepared(load_dataset("digits", seed=0, val_fraction=0.2, max_train=400), params.path("prepared_dir"))
    prepared = load_prepared(params.path("prepared_dir"))
    manifest = prepared.manifest.assign(status="retained")
    forget = manifest["sample_id"][manifest["split"] == "train"].head(10).tolist()
    model = build(params.train.model, params.root, prepared, [params.base.seed])
    rows = batch_rows(prepared, manifest, forget, partition_retain(Partition(mode="group"), prepared, manifest,
                                                                   forget, model))
    return params, SimpleNamespace(prepared=prepared, model=model, champion={"model_version": "3"}), rows


def test_the_batch_probes_again_when_the_cached_figure_is_stale(probed):
    from tasks.batch_settings import BatchSettings
    from tasks.planning import probe

    params, state, rows = probed
    inputs = BatchSettings.of(params).probe_inputs
    hour = 3600.0
    first, _ = probe(inputs, state, rows, "cpu", ["retrain"], clock=lambda: 1e6, load=lambda: 4.0)
    c = first.conditions
    assert c.probed_at == 1e6 and c.load_per_cpu == 4.0 and c.threads == 1 and 1 <= c.rounds <= 3
    assert 0 < c.cpu_share and c.low <= 1.0 <= c.high
    half = params.validation.probe.max_spread / 2  # the range: the rounds' own, at least half their allowed spread
    assert first.range == (min(c.low, 1 - half), max(c.high, 1 + half))
    same, _ = probe(inputs, state, rows, "cpu", ["retrain"], clock=lambda: 1e6 + hour, load=lambda: 3.0)
    assert "cached for this model version" in same.source and same.conditions == c
    quiet, _ = probe(inputs, state, rows, "cpu", ["retrain"], clock=lambda: 1e6 + hour, load=lambda: 0.5)
    assert "probed again: probed at load 4.0 per core, now 0.5" in quiet.source and quiet.conditions.load_per_cpu == 0.5
    old, _ = probe(inputs, state, rows, "cpu", ["retrain"], clock=lambda: 1e6 + 30 * hour, load=lambda: 0.5)
    assert "probed again: probed 29.0 h ago" in old.source
    # the plan states its range: the probe's rounds scale what it prices
    from tasks.planning import batch_plan, predicted_phases

    plan = batch_plan(params.validation, params.gate, params.deletion.weigh_cost, {"candidates": ["retrain"]},
                      "retrain_equivalence", old, None)
    point, ranges, line = predicted_phases(params.project_paths, plan, old)
    lo, hi = old.range
    assert ranges["candidates"][0] <= point["candidates"] <= ranges["candidates"][1]
    assert "range" in line and ranges["references"] == (0.0, 0.0)  # an exact retrain trains no references
    assert ranges["candidates"][0] >= plan.predicted_seconds["unlearn"] * lo
    assert ranges["candidates"][1] >= plan.predicted_seconds["unlearn"] * hi
