import numpy as np

from unlearning.batch.rows import BatchRows, cross_entropy_losses, membership_metrics


def test_cross_entropy_losses_float64_reference():
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(3, 5, 4)), np.array([0, 1, 2, 3, 0])
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    assert np.allclose(cross_entropy_losses(z, y), -np.log(p[:, np.arange(5), y]), atol=1e-12)


def test_membership_metrics_on_a_memorizing_candidate():
    rng = np.random.default_rng(1)
    n_f, n_v, C = 30, 30, 3
    labels = rng.integers(0, C, n_f + n_v)
    splits = np.array(["forget"] * n_f + ["validation"] * n_v)
    oracle = rng.normal(size=(6, n_f + n_v, C))
    cand = oracle[:1].copy()
    cand[0, np.arange(n_f), labels[:n_f]] += 20.0  # memorized forget samples: far lower loss
    out = membership_metrics(cand, oracle, oracle, labels, splits)
    assert out["mia_auc/candidate"] == 1.0 and 0.2 < out["mia_auc/oracle"] < 0.8
    assert out["mia_epsilon_mean/forget"] == 0.0  # shadows identical to the oracles
    assert 0.0 <= out["forget_quality"] <= 1.0


def test_eval_rows_order_and_labels():
    rows = BatchRows(before=np.arange(6), forget=np.array([0]), retain=np.array([1, 2, 3]),
                     adjacent_mask=np.array([False, True, False]), validation=np.array([9]))
    r, s = rows.eval_rows()
    assert r.tolist() == [0, 2, 1, 3, 9] and s.tolist() == ["forget", "adjacent", "remote", "remote", "validation"]


def test_row_sets_of_the_live_manifest():
    import pandas as pd

    from unlearning.batch.rows import retain_rows, retained_train_rows, validation_rows

    m = pd.DataFrame({"sample_id": ["a", "b", "c", "d", "e"], "split": ["train", "train", "val", "train", "train"],
                      "status": ["retained", "deleted", "retained", "retained", "retained"]})
    assert retained_train_rows(m).tolist() == [0, 3, 4]
    assert retain_rows(m, ["d"]).tolist() == [0, 4]
    assert validation_rows(m).tolist() == [2]


def test_the_certificate_evaluates_every_forget_row_and_a_stated_sample_of_the_rest():
    import numpy as np

    from unlearning.batch.rows import BatchRows, sampled_for_certificate

    rows = BatchRows(before=np.arange(10_000), forget=np.arange(50), retain=np.arange(50, 10_000),
                     adjacent_mask=np.arange(50, 10_000) % 5 == 0, validation=np.arange(10_000, 13_000))
    s = sampled_for_certificate(rows, 2000, seed=0)
    assert np.array_equal(s.forget, rows.forget) and np.array_equal(s.before, rows.before)
    assert len(s.retain) == 2000 and len(s.validation) == 2000 and len(s.adjacent_mask) == 2000
    assert set(s.retain) <= set(rows.retain) and np.all(np.diff(s.retain) > 0)
    assert np.array_equal(s.adjacent_mask, s.retain % 5 == 0)  # each row keeps its own subset
    assert 300 <= s.adjacent_mask.sum() <= 500  # adjacent and remote in proportion (1 in 5)
    assert np.array_equal(sampled_for_certificate(rows, 2000, seed=0).retain, s.retain)  # seeded
    assert sampled_for_certificate(rows, None, seed=0) is rows
