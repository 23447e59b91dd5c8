"""The device-aware cost model (unlearning/planning/costs.py, unlearning/planning/plan.py): synthetic timing curves (a CPU's
linear one, a GPU's flat one, a stepped one where the device fills) driven through an injected step timer, and
the plans they give (chunk, predicted seconds, cost in retrains); chunks sized by injected device memory."""

import pytest

from unlearning.config import Gate, Validation
from unlearning.planning.costs import (CostCurve, DeviceMemory, choose_chunk, cuda_chunk_cap, measure_curve, method_retrains,
                              probe_sizes, sig, steady)
from unlearning.planning.plan import Footprint, Timing, balanced_chunks, fit_memory, plan_batch, plan_lines

G = Gate()
MB = 2**20
STEPS = 100  # optimizer steps of one retrain in these synthetic timings
WARMUP = 5.0  # the first step of every size: far slower, and never counted


def timer_of(step_seconds):
    """A step timer for `measure_curve`: a warm-up step, then the curve's value with a small jitter."""
    def time_steps(k):
        t = step_seconds(k)
        return [WARMUP, t, t * 1.1, t * 0.95, t]
    return time_steps


LINEAR = timer_of(lambda k: 0.0002 + 0.01 * k)  # a CPU: k members cost k times one
FLAT = timer_of(lambda k: 0.01)  # a GPU below its fill point: k members cost one
STEPPED = timer_of(lambda k: 0.01 if k <= 16 else 0.01 + 0.09 * (k - 16) / 64)  # full past 16 members


def timing(curve: CostCurve, **kw) -> Timing:
    one = curve.seconds(1) * STEPS
    return Timing(retrain_seconds=one, member_seconds=one, eval_seconds_per_member=0.0, curve=curve, steps=STEPS,
                  **kw)


def gpu(budget_mb: int = 80_000, member_bytes: int | None = None) -> DeviceMemory:
    return DeviceMemory("cuda", budget_mb * MB, "validation.gpu_memory_mb", member_bytes)


def footprint(**kw) -> Footprint:
    base = dict(n_params=100_000, activation_floats_per_row=20_000, data_bytes=60_000 * 784 * 4,
                baseline_bytes=700 * MB, batch_size=64, n_eval_rows=4_000, n_classes=10)
    return Footprint(**{**base, **kw})


def test_small_costs_keep_significant_figures():
    assert sig(0.0042) == "0.0042" and sig(0.00012345) == "0.00012" and sig(1.234) == "1.2"
    assert sig(0.0) == "0" and sig(132.5) in ("132", "133") and sig(62.8, 3) == "62.8"


def test_the_probe_is_the_median_after_a_warm_up_with_its_spread():
    med, spread = steady([WARMUP, 1.0, 1.2, 0.9, 1.0])
    assert med == pytest.approx(1.0) and spread == pytest.approx(0.225)  # interquartile range / median
    med, spread = steady([WARMUP, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 50.0])  # one step stalled by another process
    assert med == 1.0 and spread == pytest.approx(0.0)
    assert steady([WARMUP, 1.0, 1.5]) == (1.25, pytest.approx(0.4))  # too few steps for quartiles: the range
    curve = measure_curve(LINEAR, probe_sizes(8))
    assert curve.sizes == (1, 3, 8)
    assert curve.step_seconds[0] == pytest.approx(0.0102)  # the warm-up's 5 s are not in it
    assert all(s == pytest.approx(0.1125, abs=1e-9) for s in curve.spread)
    assert "spread 11%" in curve.lines()[0]


def test_a_smaller_chunk_timed_slower_than_a_larger_one_takes_the_larger_ones_time():
    stalled = timer_of(lambda k: {1: 0.01, 3: 0.05, 8: 0.02}[k])  # the 3-member chunk shared the machine
    assert measure_curve(stalled, [1, 3, 8]).step_seconds == (0.01, 0.02, 0.02)


def test_the_curve_reads_between_its_points_and_extrapolates_the_last_slope():
    curve = CostCurve((1, 4, 8), (1.0, 1.0, 3.0))
    assert curve.seconds(1) == 1.0 and curve.seconds(6) == pytest.approx(2.0)
    assert curve.seconds(16) == pytest.approx(7.0)  # slope 0.5 past 8
    a, b = CostCurve((1, 2, 4), (1.0, 2.0, 4.0)).affine()
    assert a == pytest.approx(0.0, abs=1e-12) and b == pytest.approx(1.0)
    with pytest.raises(ValueError, match="sizes must increase"):
        CostCurve((4, 1), (1.0, 1.0))


def test_a_linear_cpu_curve_prices_references_as_many_retrains_and_goes_straight_to_retrain():
    t = timing(measure_curve(LINEAR, probe_sizes(8)))
    plan = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=True,
                      explicit=False, timing=t, workers=2)
    assert plan.methods == ["retrain"] and plan.chunk_size == 32 and plan.workers == 2
    (_, why), = plan.skipped
    assert "80 oracles and 80 shadows" in why and "retrains to accept" in why and "straight to retrain" in why
    forced = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=False,
                        explicit=False, timing=t, workers=2)
    # 80 + 80 members at about one retrain each (the intercept is paid once per chunk, not per member)
    assert forced.steps[0].cost_retrains_accept == pytest.approx(160, rel=0.03)
    # 160 members on two workers side by side: 80 retrains of wall time
    assert forced.predicted_seconds["references"] == pytest.approx(80 * t.retrain_seconds, rel=0.03)


def test_a_flat_gpu_curve_trains_each_role_in_one_chunk_for_about_one_retrain():
    t = timing(measure_curve(FLAT, probe_sizes(80)))
    plan = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=False,
                      explicit=False, timing=t, footprint=footprint(), workers=2, device_memory=gpu())
    assert plan.chunk_size == 80 and plan.workers == 1  # one device: its chunks do not run side by side
    step = plan.steps[0]
    assert step.cost_retrains_accept == pytest.approx(2.0)  # one pass of 80 oracles, one of 80 shadows
    assert step.cost_retrains_reject == pytest.approx(2.0)  # the first look (16 + 16) costs as much: flat
    assert plan.predicted_seconds["references"] == pytest.approx(2 * t.retrain_seconds)
    text = "\n".join(plan_lines(plan))
    assert "cost curve" in text and "planned chunk 80" in text and "chunks sized by the device's memory" in text


def test_a_stepped_curve_picks_the_chunk_where_the_device_fills():
    t = timing(measure_curve(STEPPED, [1, 16, 80]))
    plan = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=False,
                      explicit=False, timing=t, footprint=footprint(), device_memory=gpu())
    assert max(balanced_chunks(80, plan.chunk_size, 1)) == 16  # 5 chunks of 16: 5 steps' worth, not 10
    assert plan.steps[0].cost_retrains_accept == pytest.approx(10.0)
    # on a CPU the largest chunk memory allows stands whatever the curve (each chunk is a task and a cache entry)
    cpu = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=False,
                     explicit=False, timing=t, footprint=footprint())
    assert cpu.chunk_size == 32
    # on a curve with no step the largest chunk memory allows stands
    assert choose_chunk(CostCurve((1, 80), (1.0, 1.0)), 80, 80, 1, balanced_chunks) == 80
    assert choose_chunk(None, 80, 24, 1, balanced_chunks) == 24


def test_a_method_is_priced_by_its_timed_run_not_by_counted_gradients():
    cheap_refs = timing(CostCurve((1, 8), (0.01, 0.01)))  # a flat device: references cost 2 retrains in all
    slow = Timing(**{**cheap_refs.__dict__, "method_retrains": {"newton_ggn": 3.0}})
    plan = plan_batch(["newton_ggn", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=False,
                      explicit=False, timing=slow, footprint=footprint(), device_memory=gpu())
    # 3 retrains on the original, 3 more on the 80 shadows at once (flat), 2 for the references
    assert plan.steps[0].cost_retrains_accept == pytest.approx(3.0 * 2 + 2.0)
    assert plan.predicted_seconds["unlearn"] == pytest.approx(6.0 * slow.retrain_seconds)
    assert "method newton_ggn: 3 retrain(s)" in "\n".join(plan_lines(plan))
    # timed at 13.6 s on a sample where its stop rule allows 1,000 gradient evaluations, 10,000 on the batch,
    # against a 40 s retrain: 3.4 retrains; a fixed-step method (the same budget on both) is not scaled
    assert method_retrains(13.6, 1_000, 10_000, 40.0) == pytest.approx(3.4)
    assert method_retrains(13.6, 2_560, 2_560, 40.0) == pytest.approx(0.34)
    assert method_retrains(0.01, 0, 0, 40.0) == pytest.approx(0.00025)  # do_nothing: no work to scale


def test_the_audited_retrain_trains_in_the_oracles_pass_with_no_shadows():
    t = timing(measure_curve(FLAT, probe_sizes(80)))
    plan = plan_batch(["retrain"], "retrain_equivalence", Validation(audit_retrain=True), G, weigh_cost=True,
                      explicit=False, timing=t, footprint=footprint(), device_memory=gpu())
    step = plan.steps[0]
    assert step.certificate == "audit" and step.looks == ((0, 80),)
    assert plan.models_to_train() == {"retrain": 0, "oracles": 80, "shadows": 0}
    assert step.cost_retrains_accept == pytest.approx(1.0)  # on a flat device the audit is the retrain's price
    assert "oracle member 0" in step.why and "no shadows" in step.why


def test_cuda_chunks_are_sized_from_device_memory_and_the_measured_footprint():
    fp = footprint()
    data = fp.data_bytes
    chunk, *_, refusal = fit_memory(fp, 4096, None, 160, gpu(budget_mb=1000, member_bytes=20 * MB))
    assert refusal is None and chunk == (1000 * MB - data) // (20 * MB)
    chunk, *_ = fit_memory(fp, 4096, None, 160, gpu(budget_mb=80_000, member_bytes=20 * MB))
    assert chunk == 160  # not a fixed 32: the device holds every member
    chunk, *_ = fit_memory(fp, 4096, 24, 160, gpu(budget_mb=80_000, member_bytes=20 * MB))
    assert chunk == 24  # an explicit validation.chunk_size still caps it
    *_, refusal = fit_memory(fp, 4096, None, 160, gpu(budget_mb=190, member_bytes=20 * MB))
    assert "validation.gpu_memory_mb = 190" in refusal and "raise validation.gpu_memory_mb" in refusal
    assert cuda_chunk_cap(gpu(budget_mb=100), 10 * MB, 30 * MB) == (3, None)
    # a CPU keeps validation.memory_mb and the fixed cap
    chunk, *_ = fit_memory(fp, 4096, None, 160)
    assert chunk == 32


def test_a_plan_that_cannot_fit_the_device_is_refused_before_anything_trains():
    plan = plan_batch(["retrain"], "retrain_equivalence", Validation(audit_retrain=True), G, weigh_cost=True,
                      explicit=False, footprint=footprint(), device_memory=gpu(budget_mb=200, member_bytes=50 * MB))
    assert plan.refusal and "validation.gpu_memory_mb" in plan.refusal


def test_small_costs_print_with_significant_figures_in_the_plan():
    t = timing(measure_curve(FLAT, probe_sizes(80)))
    plan = plan_batch(["sisa", "retrain"], "retrain_equivalence", Validation(), G, weigh_cost=True, explicit=False,
                      timing=t, sisa_cost=0.00042)
    text = "\n".join(plan_lines(plan))
    assert "cost 0.00042 retrains to accept" in text and "0.0 retrains" not in text
    from unlearning.certificate.qualification import advise_mode

    assert "about 0.3 retrains' worth" in advise_mode(0.3, 40.0, "per_batch")[1]
