import torch

from unlearning.models import build_model, flat_params, load_model, predict_logits, save_model, train_ensemble

SPEC = {"arch": "mlp", "in_dim": 6, "hidden": [5], "n_classes": 3}


def data(n=64):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 6, generator=g)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()


def test_member_k_equals_single_run_with_seed_k():
    X, y = data()
    ens = build_model(SPEC, [3, 7, 11])
    train_ensemble(ens, X, y, epochs=4, batch_size=16, lr=0.05)
    for k, seed in enumerate([3, 7, 11]):
        single = build_model(SPEC, [seed])
        train_ensemble(single, X, y, epochs=4, batch_size=16, lr=0.05)
        assert torch.allclose(flat_params(ens)[k], flat_params(single)[0], atol=1e-5)


def test_ensemble_matches_plain_torch_reference():
    """Member k is the plain module built under torch.manual_seed(seed_k): same weights, same outputs."""
    X, _ = data(10)
    ens = build_model(SPEC, [0, 1])
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    params = dict(ens.named_parameters())
    assert torch.equal(params["body__0__weight"][1], ref[0].weight) and torch.equal(params["out__bias"][1], ref[2].bias)
    assert torch.allclose(ens(X)[1], ref(X), atol=1e-6)
    assert torch.allclose(ens.module_of(1)(X), ref(X), atol=1e-6)


def test_cnn_members_are_independent():
    spec = {"arch": "cnn", "in_dim": 64, "channels": [2, 3], "n_classes": 4, "image_shape": [8, 8]}
    X = torch.randn(5, 64)
    ens = build_model(spec, [0, 1, 2])
    single = build_model(spec, [1])
    assert torch.allclose(ens(X)[1], single(X)[0], atol=1e-6)


def test_select_concat_and_checkpoint(tmp_path):
    ens = build_model(SPEC, [0, 1, 2])
    part = ens.select([2, 0])
    assert part.seeds == [2, 0] and torch.equal(flat_params(part)[0], flat_params(ens)[2])
    back = type(ens).concat([ens.select([0]), ens.select([1, 2])])
    assert torch.equal(flat_params(back), flat_params(ens))
    save_model(ens, tmp_path / "m.pt", {"note": 1})
    loaded, extra = load_model(tmp_path / "m.pt")
    assert extra == {"note": 1} and torch.equal(predict_logits(loaded, data(4)[0]), predict_logits(ens, data(4)[0]))


def test_cross_entropy_matches_torch_in_float64():
    from torch.nn import functional as F

    from unlearning.models.training import cross_entropy

    g = torch.Generator().manual_seed(0)
    z = (torch.randn(3, 7, 5, generator=g, dtype=torch.float64) * 30).requires_grad_()
    y = torch.randint(0, 5, (3, 7), generator=g)
    ref = F.cross_entropy(z.reshape(21, 5), y.reshape(21), reduction="none").view(3, 7)
    got = cross_entropy(z, y)
    assert torch.allclose(got, ref, atol=1e-12)
    (g1,) = torch.autograd.grad(got.sum(), z)
    (g2,) = torch.autograd.grad(ref.sum(), z)
    assert torch.allclose(g1, g2, atol=1e-12)
