"""The planner's probe on a real (tiny) model (unlearning/planning/probe.py, tasks/planning.py): on a scripted clock (known
step times), the step timer reports each step and one warm-up, and the curve holds the median step per size;
each approximate candidate timed, and one estimate shared through the cache by `unlearn plan` and the batch that
follows it."""

import json
import math
from types import SimpleNamespace

import numpy as np
import torch

from tests.helpers import make_project
from unlearning.batch.rows import BatchRows
from unlearning.config import load_params
from unlearning.planning.costs import PROBE_MIN_STEPS, measure_curve
from unlearning.data import load_dataset
from unlearning.data.store import load_prepared, write_prepared
from unlearning.models import TrainRecipe, build_model
from unlearning.planning.probe import PROBE_MAX_STEPS, StepTimer

MLP = {"arch": "mlp", "in_shape": [8], "n_classes": 3, "kwargs": {"hidden": [8]}}


class ScriptedClock:
    """A fake `time.perf_counter` for unlearning/planning/probe.py: each call returns the time, then moves it on by the
    next interval of the script (exact binary fractions, so sums and medians are exact)."""

    def __init__(self, intervals: list[float]):
        self.now, self.intervals, self.calls = 0.0, list(intervals), 0

    def perf_counter(self) -> float:
        now = self.now
        self.now += self.intervals[self.calls]
        self.calls += 1
        return now


def timer_on(clock: ScriptedClock, monkeypatch, min_seconds: float) -> StepTimer:
    """A StepTimer of a tiny MLP on 96 rows in batches of 32 (3 steps an epoch) reading `clock`."""
    import unlearning.planning.probe as probe

    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    recipe = TrainRecipe(epochs=9, batch_size=32, lr=0.01)
    return StepTimer(lambda k: build_model(MLP, list(range(1, k + 1))), X, y, recipe, "cpu", min_seconds=min_seconds)


A, B, WARM = 2.0 ** -6, 2.0 ** -5, 0.5  # step times of the script, and its warm-up


def test_the_step_timer_reports_each_steps_time_on_a_known_clock(monkeypatch):
    # one call before the first step, one after each of the 6 steps (2 epochs of 3: PROBE_MIN_STEPS = 5 at least)
    clock = ScriptedClock([WARM, A, B, A, B, A, 0.0])
    timer = timer_on(clock, monkeypatch, min_seconds=0.0)
    assert timer(4) == [WARM, A, B, A, B, A] and clock.calls == 7
    assert timer.recipe.epochs == 2 and timer.steps == 6 >= PROBE_MIN_STEPS and timer.counted == [5]
    assert timer.model.n_models == 4 and timer.member_bytes is None
    # steps too fast for the probe's minimum time (5 counted steps of 1/64 and 1/32 s = 0.109 s < 1 s): a second
    # run of ceil(1 s / the median 1/64 s) = 64 steps, 22 epochs of 3 = 66, its first step a warm-up again, and
    # the first run counted into that warm-up (one warm-up in all)
    first_run = WARM + 3 * A + 2 * B
    second_warm, steady_step = 0.25, 2.0 ** -7
    clock = ScriptedClock([WARM, A, B, A, B, A, 1.0, second_warm] + [steady_step] * 65 + [0.0])
    timer = timer_on(clock, monkeypatch, min_seconds=1.0)
    times = timer(2)
    assert len(times) == 66 == 3 * math.ceil(64 / 3) and clock.calls == 1 + 6 + 1 + 66
    assert times[0] == first_run + second_warm and times[1:] == [steady_step] * 65 and timer.counted == [65]
    # ... and never more than PROBE_MAX_STEPS steps, however slow the minimum time makes it
    cap = 3 * math.ceil(PROBE_MAX_STEPS / 3)
    clock = ScriptedClock([WARM, A, B, A, B, A, 1.0, second_warm] + [steady_step] * (cap - 1) + [0.0])
    assert len(timer_on(clock, monkeypatch, min_seconds=1e9)(1)) == cap


def test_the_cost_curve_is_the_median_step_per_size_on_a_known_clock(monkeypatch):
    """Sizes 1, 2 and 4 timed at k/64 s a step (after a 0.5 s warm-up): the curve holds those medians, spread
    0; a smaller chunk timed slower than a larger one (another process's stall) takes the larger one's time."""
    per_size = {1: [A, A, B, A, A], 2: [B, B, B, B, B], 4: [4 * A, 4 * A, 4 * A, 5 * A, 4 * A]}
    clock = ScriptedClock([x for k in (1, 2, 4) for x in [WARM, *per_size[k], 0.0]])
    curve = measure_curve(timer_on(clock, monkeypatch, min_seconds=0.0), [4, 1, 2])
    assert curve.sizes == (1, 2, 4) and curve.step_seconds == (A, B, 4 * A)
    # spread: the interquartile range over the median (statistics.quantiles, exclusive): [A, A, A, A, B] has
    # q1 = A, q3 = A + (B - A) / 2, so (A / 2) / A
    assert curve.spread == (0.5, 0.0, 0.125)
    stalled = {1: [3 * A] * 5, 2: [B] * 5, 4: [4 * A] * 5}
    clock = ScriptedClock([x for k in (1, 2, 4) for x in [WARM, *stalled[k], 0.0]])
    assert measure_curve(timer_on(clock, monkeypatch, min_seconds=0.0), [1, 2, 4]).step_seconds == (B, B, 4 * A)


def test_unlearn_plan_and_its_batch_price_with_one_estimate(tmp_path):
    from tasks.batch_settings import BatchSettings
    from tasks.planning import batch_plan, probe
    from unlearning.planning.plan import plan_lines

    params = load_params(make_project(tmp_path, {"train": {"epochs": 2}, "validation": {
        "chunk_size": None, "n_oracles": 16, "n_shadows": 16}}, inbox_files=False))
    write_prepared(load_dataset("digits", seed=0, val_fraction=0.2, max_train=600), params.path("prepared_dir"))
    prepared = load_prepared(params.path("prepared_dir"))
    m = prepared.manifest
    train = np.flatnonzero((m["split"] == "train").to_numpy())
    rows = BatchRows(before=train, forget=train[:10], retain=train[10:], adjacent_mask=np.zeros(len(train) - 10, bool),
                     validation=np.flatnonzero((m["split"] != "train").to_numpy()))
    from tasks.training import build

    model = build(params.train.model, params.root, prepared, [params.base.seed])
    state = SimpleNamespace(prepared=prepared, model=model, champion={"model_version": "3"})
    inputs = BatchSettings.of(params).probe_inputs
    first, _ = probe(inputs, state, rows, "cpu", ["do_nothing", "finetune", "retrain"])
    again, footprint = probe(inputs, state, rows, "cpu", ["do_nothing", "finetune", "retrain"])
    assert first.curve.step_seconds == again.curve.step_seconds and first.retrain_seconds == again.retrain_seconds
    assert "cached for this model version" in again.source and "cached" not in first.source
    assert set(first.method_retrains) == {"do_nothing", "finetune"}  # retrain's cost is a retrain: not timed
    assert first.method_retrains == again.method_retrains
    cached = list((params.path("cache_dir") / "costs").glob("*.json"))
    assert len(cached) == 1
    text = cached[0].read_text()
    assert not any(str(s) in text for s in m["sample_id"].head(50))  # costs only: no id
    assert json.loads(text)["curve"]["sizes"] == [1, 3, 8]  # 1, an intermediate size, the CPU's largest probe
    plan = batch_plan(params.validation, params.gate, params.deletion.weigh_cost,
                      {"candidates": ["do_nothing", "retrain"]}, "retrain_equivalence", again, footprint)
    text = "\n".join(plan_lines(plan))
    assert "cost curve" in text and "planned chunk" in text and "method do_nothing" in text
    # another model version probes again; a plan with the exact retrain alone times one member
    state.champion = {"model_version": "4"}
    later, _ = probe(inputs, state, rows, "cpu", ["retrain"])
    assert "cached" not in later.source and later.curve.sizes == (1,) and not later.method_retrains
    wider, _ = probe(inputs, state, rows, "cpu", ["do_nothing", "retrain"])  # then references: the whole curve
    assert wider.curve.sizes == (1, 3, 8) and "cached" not in wider.source


def test_a_planned_chunk_the_device_cannot_hold_is_halved_until_it_fits():
    from unlearning.planning.probe import curve_within_memory

    class Tight:  # a device that holds 20 members in training
        counted = []

        def __call__(self, k):
            if k > 20:
                raise torch.cuda.OutOfMemoryError(f"{k} members")
            return [1.0, 0.01, 0.01, 0.01]

    curve = curve_within_memory(Tight(), 80)
    assert curve.sizes == (1, 4, 20)  # 80 and 40 ran out of memory
