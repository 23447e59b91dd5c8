"""Bounded diagnostics: the cost model, solver auto under a budget, cross-leverage on a sample with its standard
errors, the spectral norm without a full eigendecomposition, and progress in planned work units."""

import io
import re

import numpy as np
import pytest
import torch

from unlearning.leverage import compute_diagnostics
from unlearning.leverage import cost
from unlearning.leverage.cost import Throughput
from unlearning.leverage.diagnostics import _top_eigenvalue_psd, cross_leverage_sampling
from unlearning.models import build_model

SPEC = {"arch": "mlp", "in_dim": 5, "hidden": [6], "n_classes": 3, "image_shape": None}  # p = 57


@pytest.fixture(scope="module")
def setup():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(160, 5, generator=g)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    model = build_model(SPEC, [2])
    return model, X, y


def test_estimates_grow_with_rows_and_rank_the_solvers():
    kw = dict(n_forget=100, n_params=25_450, n_outputs=10, seconds_per_sample_grad=3e-6, flops_per_second=3e10,
              feature_dim=32)
    small = {s: cost.estimate_diagnostics_seconds(2000, solver=s, **kw) for s in ("exact", "projected", "last_layer")}
    big = {s: cost.estimate_diagnostics_seconds(30_000, solver=s, **kw) for s in ("exact", "projected", "last_layer")}
    assert small["last_layer"] < small["projected"] < small["exact"]
    assert all(big[s] > small[s] for s in small)
    retrain = cost.estimate_retrain_seconds(2000, 30, 3e-6)
    assert retrain == pytest.approx(0.18)
    # 25k parameters: the projected solver costs far more than a retrain; the head fits, its error check
    # (full Jacobians and a Woodbury kernel over p = 25,450) is what costs
    assert small["projected"] > 10 * retrain
    assert cost.estimate_diagnostics_seconds(2000, solver="last_layer", check_subset=0, **kw) < retrain
    assert cost.estimate_check_seconds(64, **{k: kw[k] for k in ("n_forget", "n_params", "n_outputs",
                                                                 "seconds_per_sample_grad", "flops_per_second")}) > retrain
    with pytest.raises(ValueError, match="solver='newton' has no cost model"):
        cost.estimate_diagnostics_seconds(10, 1, 10, 2, "newton", 1e-6)


def test_choose_within_budget_falls_back_to_the_head():
    kw = dict(n_rows=2000, n_forget=100, n_params=25_450, n_outputs=10, seconds_per_sample_grad=3e-6,
              flops_per_second=3e10, feature_dim=32)
    assert cost.choose_within_budget("projected", None, **kw)[0] == "projected"       # no budget: by count
    picked, est = cost.choose_within_budget("projected", 0.2, **kw)
    assert picked == "last_layer" and set(est) == {"projected", "last_layer"}
    assert cost.choose_within_budget("projected", 10 * est["projected"], **kw)[0] == "projected"


def test_affordable_check_rows_halves_to_its_share_and_never_below_the_floor():
    kw = dict(n_forget=100, n_params=25_450, n_outputs=10, seconds_per_sample_grad=3e-6, flops_per_second=3e10)
    assert cost.affordable_check_rows(64, 1e6, **kw) == 64
    rows = cost.affordable_check_rows(64, cost.estimate_check_seconds(32, **kw) * 1.01, **kw)
    assert rows == 32
    assert cost.affordable_check_rows(64, 0.0, **kw) == cost.MIN_CHECK_ROWS


def test_auto_under_a_budget_reports_its_choice_and_estimates(setup):
    model, X, y = setup
    tp = Throughput(seconds_per_sample_grad=1e-6, flops_per_second=1e10)
    args = (model, X[:8], y[:8], X[8:140], y[8:140], X[140:], y[140:], 1.0)
    roomy = compute_diagnostics(*args, solver="auto", device="cpu", budget_seconds=1e6, throughput=tp)
    tight = compute_diagnostics(*args, solver="auto", device="cpu", budget_seconds=1e-9, throughput=tp,
                                check_subset=4, check_rows=32)
    assert roomy.solver == "exact" and roomy.solver_info["auto"]["picked"] == "exact"
    assert tight.solver == "last_layer"
    auto = tight.solver_info["auto"]
    assert auto["by_parameter_count"] == "exact" and auto["check_rows"] == cost.MIN_CHECK_ROWS
    assert set(auto["estimated_seconds"]) == {"exact", "last_layer"}
    assert tight.approx_error["retain_rows"] == cost.MIN_CHECK_ROWS  # the stated, reported check size
    # epochs + budget_retrains: the budget is that many retrains as the probe times them
    by_epochs = compute_diagnostics(*args, solver="auto", device="cpu", budget_retrains=1.0, epochs=30, throughput=tp)
    assert by_epochs.solver_info["auto"]["budget_seconds"] == pytest.approx(30 * 140 * 1e-6)


def test_cross_leverage_on_a_sample_is_the_full_value_at_those_rows(setup):
    model, X, y = setup
    args = (model, X[:8], y[:8], X[8:], y[8:], None, None, 1.0)
    full = compute_diagnostics(*args, solver="exact", device="cpu")
    sampled = compute_diagnostics(*args, solver="exact", device="cpu", cross_sample=40, seed=7)
    rows = sampled.cross_leverage_rows
    assert rows.shape == (40,) and np.all(np.diff(rows) > 0) and rows.max() < 152
    np.testing.assert_allclose(sampled.cross_leverage, full.cross_leverage[rows], rtol=1e-12)
    assert full.cross_leverage_rows is None
    assert full.cross_leverage_sampling["se_mean"] == 0.0 and full.cross_leverage_sampling["sampled"] == 152
    s = sampled.cross_leverage_sampling
    assert s["sampled"] == 40 and s["of"] == 152 and s["se_mean"] > 0 and s["se_p95"] > 0
    # the standard error covers the sampling error of the mean (a 4-sigma band: fails ~1 in 16,000 seeds)
    assert abs(s["mean"] - full.cross_leverage.mean()) < 4 * s["se_mean"]
    assert sampled.to_dict()["n_retain"] == 152 and sampled.to_dict()["cross_leverage_sampling"]["sampled"] == 40
    with pytest.raises(ValueError, match="cross_sample = 0 must be >= 1"):
        compute_diagnostics(*args, solver="exact", device="cpu", cross_sample=0)


def test_sampling_standard_error_matches_the_spread_over_samples():
    """The mean's standard error (finite-population corrected) against the spread of the mean over many
    independent samples of the same population."""
    pop = np.random.default_rng(0).lognormal(size=5000)
    means = [np.random.default_rng(s).choice(pop, 500, replace=False).mean() for s in range(300)]
    se = cross_leverage_sampling(np.random.default_rng(1).choice(pop, 500, replace=False), 5000)["se_mean"]
    assert se == pytest.approx(np.std(means), rel=0.25)


def test_top_eigenvalue_by_subspace_iteration_matches_eigvalsh():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(600, 40, generator=g, dtype=torch.float64)
    S = A @ A.T
    assert _top_eigenvalue_psd(S) == pytest.approx(float(torch.linalg.eigvalsh(S)[-1]), rel=1e-8)


@pytest.mark.parametrize("solver", ["exact", "projected", "last_layer"])
def test_progress_is_counted_in_planned_units_that_the_run_uses_up(setup, solver):
    """Every line's count is in the planned total, the last line reaches it exactly, and the lines come from
    the row chunks (not one per stage), so the ETA extrapolates over the work actually left."""
    model, X, y = setup
    out = io.StringIO()
    compute_diagnostics(model, X[:8], y[:8], X[8:140], y[8:140], X[140:], y[140:], 1.0, solver=solver,
                        device="cpu", proj_dim=20, check_subset=4, check_rows=16, exact_max_params=10, chunk=16,
                        progress="diag", progress_every_s=0.0, progress_stream=out)
    counts = [tuple(map(int, m)) for m in re.findall(r"(\d+)/(\d+) units", out.getvalue())]
    assert len(counts) >= 8
    assert all(done <= total for done, total in counts)
    assert counts[-1][0] == counts[-1][1] > 0
    assert [d for d, _ in counts] == sorted(d for d, _ in counts)
