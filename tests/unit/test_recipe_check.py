"""The recipe check (unlearning/metrics/exchangeability.py): exact, in float64, on tiny pools."""

from __future__ import annotations

import numpy as np
import pytest

from unlearning.metrics.exchangeability import exchangeability_test, pool_scores


def test_scores_by_hand():
    # 3 models, 2 rows. Row 0: margins 0, 1, 2 (mean 1, std sqrt(2/3)); row 1: all 5 (no spread: left out).
    pool = np.array([[0.0, 5.0], [1.0, 5.0], [2.0, 5.0]])
    z2 = np.array([1.0, 0.0, 1.0]) / (2.0 / 3.0)
    np.testing.assert_allclose(pool_scores(pool), z2, rtol=0, atol=1e-15)


def test_an_outlier_is_last_of_the_pool():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(20, 50))
    out = exchangeability_test(ref.mean(0) + 3.0, ref)
    assert out["rank"] == 21 and out["n_pool"] == 21 and out["pvalue"] == pytest.approx(1 / 21)
    central = exchangeability_test(ref.mean(0), ref)
    assert central["rank"] == 1 and central["pvalue"] == 1.0


def test_each_member_in_turn_gives_every_rank_once():
    # Exchangeability made exact: scoring each member of one pool against the others yields the ranks 1..M,
    # each once, so p = k / M has probability exactly 1 / M under the null (the false-alarm rate of the check).
    rng = np.random.default_rng(1)
    pool = rng.normal(size=(9, 30)) * rng.uniform(0.5, 2.0, size=30)
    ranks = sorted(exchangeability_test(pool[j], np.delete(pool, j, axis=0))["rank"] for j in range(9))
    assert ranks == list(range(1, 10))


def test_ties_are_conservative():
    ref = np.tile(np.array([[0.0, 1.0]]), (4, 1))
    out = exchangeability_test(np.array([0.0, 1.0]), ref)  # identical to every reference: no spread at all
    assert out["pvalue"] == 1.0 and out["rank"] == 1


@pytest.mark.parametrize("bad,match", [
    (dict(model_margins=np.zeros((2, 3)), reference_margins=np.zeros((4, 3))), "expected shape"),
    (dict(model_margins=np.zeros(3), reference_margins=np.zeros((4, 2))), "3 rows but"),
    (dict(model_margins=np.array([np.nan, 0, 0]), reference_margins=np.zeros((4, 3))), "pool_margins"),
])
def test_bad_input_names_the_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        exchangeability_test(**bad)


def test_the_batch_scores_a_seeded_sample_of_a_large_table(monkeypatch):
    """tasks/stages.recipe_check: past RECIPE_CHECK_ROWS evaluated rows, a sample seeded by base.seed (N + 1
    forward passes over every row of a large table cost as much as a candidate's evaluation)."""
    from types import SimpleNamespace

    import torch

    import tasks.stages as S

    n, seen = 5000, []

    def fake_logits(model, prepared, rows):
        seen.append(np.asarray(rows))
        return torch.zeros(model.k, len(rows), 3) + torch.arange(model.k)[:, None, None] * 0.01

    monkeypatch.setattr(S, "eval_logits", fake_logits)
    prepared = SimpleNamespace(label=np.zeros(n, dtype=np.int64))
    model = SimpleNamespace(k=1, to=lambda device: model)
    state = SimpleNamespace(prepared=prepared, model=model)
    rows = SimpleNamespace(eval_rows=lambda: (np.arange(n), np.array(["remote"] * n)))
    shadows = SimpleNamespace(k=8)
    shadows.to = lambda device: shadows  # the shadows move to the batch's device, as the model does
    out = S.recipe_check(state, rows, shadows, "cpu", seed=3)
    assert out["n_pool"] == 9
    assert len(seen[0]) == S.RECIPE_CHECK_ROWS and np.array_equal(seen[0], seen[1])
    assert np.all(np.diff(seen[0]) > 0)
    S.recipe_check(state, rows, shadows, "cpu", seed=3)
    assert np.array_equal(seen[2], seen[0])  # the same sample for the same seed
