"""The leverage diagnostics run only when a candidate the batch could try reads them (flows/deletion_batch.py
diagnostics_unused), and their own poor error check is said on the console (unlearning/leverage/check.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tasks.batch_settings import BatchSettings
from unlearning.batch.rows import BatchRows
from unlearning.config import load_params
from unlearning.planning.plan import Timing

ROWS = BatchRows(before=np.arange(13), forget=np.arange(3), retain=np.arange(3, 13), adjacent_mask=np.zeros(10, bool),
                 validation=np.arange(2))
CHEAP = Timing(retrain_seconds=100.0, member_seconds=0.1, eval_seconds_per_member=0.01)  # 160 members < 1 retrain
DEAR = Timing(retrain_seconds=10.0, member_seconds=5.0, eval_seconds_per_member=0.01)  # a certificate: 80 retrains


def selection(params):
    """The batch's walk of the rules without the diagnostics (the facts a batch has before them)."""
    from unlearning.policy.selection import batch_facts, candidate_methods

    return candidate_methods(params.deletion, batch_facts(params.deletion, params.train.epochs,
                                                          "retrain_equivalence", ROWS, None))


def unused(deletion: dict, timing: Timing):
    from flows.deletion_batch import diagnostics_unused

    params = load_params(overrides={"deletion": deletion})
    batch = SimpleNamespace(probe=(timing, None), device="cpu")
    return diagnostics_unused(batch, BatchSettings.of(params), SimpleNamespace(model=object()), ROWS, "retrain_equivalence",
                              selection(params))


def test_an_exact_method_alone_skips_the_diagnostics_and_says_why():
    why = unused({"method": "retrain"}, CHEAP)
    assert why and "(retrain) are exact" in why


def test_auto_keeps_them_while_an_approximate_candidate_could_be_certified():
    # gap_below_noise_floor waits for the diagnostics: do_nothing might be tried, certified cheaply
    assert unused({"method": "auto"}, CHEAP) is None


def test_auto_skips_them_when_the_plan_goes_straight_to_retrain():
    # certifying do_nothing would cost far more than the retrain (deletion.weigh_cost): only retrain is left
    why = unused({"method": "auto"}, DEAR)
    assert why and "do_nothing" in why.split("considered:")[1] and "(retrain) are exact" in why
    assert unused({"method": "auto", "weigh_cost": False}, DEAR) is None


def test_an_explicit_approximate_method_keeps_them():
    assert unused({"method": "do_nothing"}, DEAR) is None


def test_a_retrain_forced_by_the_debt_skips_them():
    """The batch's selection says it all: the debt forced exact retrain alone, so no rule waits for a fact."""
    from flows.deletion_batch import diagnostics_unused

    params = load_params(overrides={"deletion": {"method": "auto"}})
    forced = selection(params).forced_retrain(["too many batches since the last exact retrain"])
    batch = SimpleNamespace(probe=(CHEAP, None), device="cpu")
    why = diagnostics_unused(batch, BatchSettings.of(params), SimpleNamespace(model=object()), ROWS, "retrain_equivalence", forced)
    assert why and "(retrain) are exact" in why and "do_nothing" not in why


def test_the_record_keeps_them_when_asked():
    from flows.deletion_batch import diagnostics_unused

    params = load_params(overrides={"deletion": {"method": "retrain"}, "diagnostics": {"record": True}})
    batch = SimpleNamespace(probe=(CHEAP, None), device="cpu")
    assert diagnostics_unused(batch, BatchSettings.of(params), SimpleNamespace(model=object()), ROWS, "retrain_equivalence",
                              selection(params)) is None


@pytest.mark.parametrize("approx,poor", [
    ({"predicted_gap_spearman": 0.23, "self_leverage_rel_err": 0.87, "self_leverage_max_rel_err": 3.0},
     ["predicted gap Spearman 0.23 < 0.5", "self leverage relative error 0.87 > 0.5"]),
    ({"predicted_gap_spearman": 0.9, "self_leverage_rel_err": 0.05, "self_leverage_spearman": None}, []),
    (None, [])])
def test_a_poor_error_check_is_named_with_its_numbers(approx, poor):
    from tasks.diagnostics import poor_check_line
    from unlearning.leverage.check import poor_check

    assert poor_check(approx) == poor
    line = poor_check_line(SimpleNamespace(approx_error=approx, solver="projected"))
    assert (line is None) == (not poor)
    if poor:
        assert "Spearman 0.23" in line and "solver projected" in line
