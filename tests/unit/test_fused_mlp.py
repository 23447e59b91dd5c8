"""The hand-written MLP training kernel (unlearning/models/fused_mlp.py) against autograd."""

import pytest
import torch

from unlearning.models import build_model, flat_params, train_ensemble
from unlearning.models.fused_mlp import FlatAdamW, FusedMLP
from unlearning.models.training import per_member_loss

SPEC = {"arch": "mlp", "in_dim": 7, "hidden": [5, 4], "n_classes": 3}


def test_gradients_equal_autograd_in_float64():
    g = torch.Generator().manual_seed(0)
    model = build_model(SPEC, [1, 2, 3]).double()
    x = torch.randn(3, 6, 7, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (3, 6), generator=g)
    kernel = FusedMLP(model)
    loss = kernel.loss_and_grad(x, y, with_loss=True)
    ref = per_member_loss(model, x, y)
    ref.sum().backward()
    assert torch.allclose(loss, ref.detach(), atol=1e-14)
    params = dict(model.named_parameters())
    for name, gw, gb in zip(kernel.layer_names, kernel.grad_weights, kernel.grad_biases):
        key = name.replace(".", "__")
        assert torch.allclose(gw, params[f"{key}__weight"].grad, atol=1e-14)
        assert torch.allclose(gb.squeeze(2), params[f"{key}__bias"].grad, atol=1e-14)


def test_dead_relu_units_get_no_gradient():
    model = build_model({"arch": "mlp", "in_dim": 2, "hidden": [3], "n_classes": 2}, [0]).double()
    with torch.no_grad():
        model.body__0__bias[0, 1] = -100.0  # hidden unit 1 is off for every input below
    kernel = FusedMLP(model)
    kernel.loss_and_grad(torch.rand(1, 4, 2, dtype=torch.float64), torch.tensor([[0, 1, 0, 1]]))
    assert torch.all(kernel.grad_weights[0][0, 1] == 0) and kernel.grad_biases[0][0, 1, 0] == 0
    assert torch.all(kernel.grad_weights[1][0, :, 1] == 0)


def test_fused_training_equals_autograd_training():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(80, 7, generator=g)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.3).long()
    fused, auto = build_model(SPEC, [4, 5]), build_model(SPEC, [4, 5])
    train_ensemble(fused, X, y, epochs=3, batch_size=16, lr=1e-2, weight_decay=1e-3, kernel="fused")
    train_ensemble(auto, X, y, epochs=3, batch_size=16, lr=1e-2, weight_decay=1e-3, kernel="autograd")
    assert not torch.equal(flat_params(fused), flat_params(build_model(SPEC, [4, 5])))  # it trained
    assert torch.allclose(flat_params(fused), flat_params(auto), atol=1e-5)


def test_kernel_choice_is_validated():
    cnn = build_model({"arch": "cnn", "in_dim": 16, "channels": [2], "n_classes": 2, "image_shape": [4, 4]}, [0])
    X, y = torch.randn(4, 16), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="kernel='fused' supports MLP ensembles only.*autograd"):
        train_ensemble(cnn, X, y, epochs=1, batch_size=2, lr=1e-2, kernel="fused")
    with pytest.raises(ValueError, match=r"kernel='jit'.*allowed: \['auto', 'fused', 'autograd'\]"):
        train_ensemble(cnn, X, y, epochs=1, batch_size=2, lr=1e-2, kernel="jit")
    train_ensemble(cnn, X, y, epochs=1, batch_size=2, lr=1e-2)  # auto: autograd for the CNN


def test_flat_adamw_equals_torch_adamw_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(50, generator=g).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    flat = FlatAdamW(a, lr=1e-2, weight_decay=1e-3)
    ref = torch.optim.AdamW([b], lr=1e-2, weight_decay=1e-3, fused=True)
    for _ in range(5):
        grad = torch.randn(50, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        flat.step()
        ref.step()
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", [
    {"label_smoothing": 0.1},
    {"schedule": "cosine"},
    {"optimizer": "sgd", "momentum": 0.9, "schedule": "cosine", "label_smoothing": 0.05},
])
def test_fused_equals_autograd_for_every_recipe_option(recipe):
    g = torch.Generator().manual_seed(4)
    X = torch.randn(70, 7, generator=g)
    y = (X[:, 0] > 0).long() + (X[:, 2] > 0.3).long()
    fused, auto = build_model(SPEC, [6, 7]), build_model(SPEC, [6, 7])
    kw = {"epochs": 3, "batch_size": 16, "lr": 1e-2, "weight_decay": 1e-3, **recipe}
    train_ensemble(fused, X, y, kernel="fused", **kw)
    train_ensemble(auto, X, y, kernel="autograd", **kw)
    assert torch.allclose(flat_params(fused), flat_params(auto), atol=1e-5)


def test_label_smoothed_cross_entropy_matches_torch():
    from unlearning.models.training import cross_entropy

    g = torch.Generator().manual_seed(5)
    z, t = torch.randn(9, 4, generator=g, dtype=torch.float64), torch.randint(0, 4, (9,), generator=g)
    ref = torch.nn.functional.cross_entropy(z, t, reduction="none", label_smoothing=0.2)
    assert torch.allclose(cross_entropy(z, t, 0.2), ref, atol=1e-14)
