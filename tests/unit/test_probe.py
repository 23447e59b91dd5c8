"""The planner's probe on a real (tiny) model (unlearning/probe.py, tasks/planning.py): a step timer that skips
its warm-up, a curve over the probed sizes, each approximate candidate timed, and one estimate shared through
the cache by `unlearn plan` and the batch that follows it."""

import json
import math
from types import SimpleNamespace

import numpy as np
import torch

from tests.helpers import make_project
from unlearning.batch import BatchRows
from unlearning.config import load_params
from unlearning.costs import PROBE_MIN_STEPS, measure_curve
from unlearning.data import load_dataset
from unlearning.data.store import load_prepared, write_prepared
from unlearning.models import TrainRecipe, build_model
from unlearning.probe import PROBE_MAX_STEPS, StepTimer

MLP = {"arch": "mlp", "in_shape": [8], "n_classes": 3, "kwargs": {"hidden": [8]}}


def test_the_step_timer_times_every_step_of_a_fresh_chunk():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    def make(k):
        return build_model(MLP, list(range(1, k + 1)))

    recipe = TrainRecipe(epochs=9, batch_size=32, lr=0.01)
    timer = StepTimer(make, X, y, recipe, "cpu", min_seconds=0.0)
    times = timer(4)
    assert timer.recipe.epochs == 2 and timer.steps == len(times) == 6 >= PROBE_MIN_STEPS  # 3 steps an epoch
    # steps too fast for the probe's minimum time: a second run, as many steps as it allows, one warm-up in all
    longer = StepTimer(make, X, y, recipe, "cpu", min_seconds=1e9)(2)
    assert len(longer) == 3 * math.ceil(PROBE_MAX_STEPS / 3)
    assert all(t > 0 for t in times) and timer.model.n_models == 4 and timer.member_bytes is None
    curve = measure_curve(timer, [1, 2, 4])
    assert curve.sizes == (1, 2, 4) and all(t > 0 for t in curve.step_seconds) and len(curve.spread) == 3


def test_unlearn_plan_and_its_batch_price_with_one_estimate(tmp_path):
    from tasks.planning import batch_plan, probe
    from unlearning.plan import plan_lines

    params = load_params(make_project(tmp_path, {"train": {"epochs": 2}, "validation": {
        "chunk_size": None, "n_oracles": 16, "n_shadows": 16}}, inbox_files=False))
    write_prepared(load_dataset("digits", seed=0, val_fraction=0.2, max_train=600), params.path("prepared_dir"))
    prepared = load_prepared(params.path("prepared_dir"))
    m = prepared.manifest
    train = np.flatnonzero((m["split"] == "train").to_numpy())
    rows = BatchRows(before=train, forget=train[:10], retain=train[10:], adjacent_mask=np.zeros(len(train) - 10, bool),
                     validation=np.flatnonzero((m["split"] != "train").to_numpy()))
    from tasks.training import build

    state = SimpleNamespace(prepared=prepared, model=build(params, prepared, [params.base.seed]),
                            champion={"model_version": "3"})
    first, _ = probe(params, state, rows, "cpu", ["do_nothing", "finetune", "retrain"])
    again, footprint = probe(params, state, rows, "cpu", ["do_nothing", "finetune", "retrain"])
    assert first.curve.step_seconds == again.curve.step_seconds and first.retrain_seconds == again.retrain_seconds
    assert "cached for this model version" in again.source and "cached" not in first.source
    assert set(first.method_retrains) == {"do_nothing", "finetune"}  # retrain's cost is a retrain: not timed
    assert first.method_retrains == again.method_retrains
    cached = list((params.path("cache_dir") / "costs").glob("*.json"))
    assert len(cached) == 1
    text = cached[0].read_text()
    assert not any(str(s) in text for s in m["sample_id"].head(50))  # costs only: no id
    assert json.loads(text)["curve"]["sizes"] == [1, 3, 8]  # 1, an intermediate size, the CPU's largest probe
    plan = batch_plan(params, {"candidates": ["do_nothing", "retrain"]}, "retrain_equivalence", again, footprint)
    text = "\n".join(plan_lines(plan))
    assert "cost curve" in text and "planned chunk" in text and "method do_nothing" in text
    # another model version probes again; a plan with the exact retrain alone times one member
    state.champion = {"model_version": "4"}
    later, _ = probe(params, state, rows, "cpu", ["retrain"])
    assert "cached" not in later.source and later.curve.sizes == (1,) and not later.method_retrains
    wider, _ = probe(params, state, rows, "cpu", ["do_nothing", "retrain"])  # then references: the whole curve
    assert wider.curve.sizes == (1, 3, 8) and "cached" not in wider.source


def test_a_planned_chunk_the_device_cannot_hold_is_halved_until_it_fits():
    from unlearning.probe import curve_within_memory

    class Tight:  # a device that holds 20 members in training
        counted = []

        def __call__(self, k):
            if k > 20:
                raise torch.cuda.OutOfMemoryError(f"{k} members")
            return [1.0, 0.01, 0.01, 0.01]

    curve = curve_within_memory(Tight(), 80)
    assert curve.sizes == (1, 4, 20)  # 80 and 40 ran out of memory
