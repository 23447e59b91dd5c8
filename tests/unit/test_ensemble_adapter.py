"""The generic ensemble adapter (unlearning/models/ensemble.py) against plain PyTorch.

Member k of an ensemble trained with `train_ensemble` is the module built under `torch.manual_seed(seed_k)` and
trained ALONE by an ordinary PyTorch loop written here (same data-order stream, same minibatches, the recipe's
optimizer, `module(x)` forward, dropout drawn from the member's own stream): parameters AND BatchNorm running
statistics, and the eval-mode outputs. Plus membership (select / concat), features, checkpoints, factory errors
and the choice of the fused MLP kernel.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from unlearning.models import build_model, fused_mlp, load_model, load_module_state, save_model, train_ensemble
from unlearning.models.ensemble import _rng_seed
from unlearning.models.training import batch_bounds, order_generator
from unlearning.models.zoo import MLP

HERE = Path(__file__).resolve().parent
MOD = Path(__file__).stem  # this file, imported by the factory as a module of the tests folder


# --- the team's own modules (factories receive in_shape, n_classes, **train.model.kwargs) -----------------
class Net(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear."""

    def __init__(self, d: int, n_classes: int, hidden: int = 6, p: float = 0.3):
        super().__init__()
        # no bias before BatchNorm: its gradient is ~0, and Adam would amplify the float noise of that zero
        self.fc1 = nn.Linear(d, hidden, bias=False)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(p)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.fc1(x.flatten(1))))))


def bn_dropout_net(in_shape, n_classes, **kwargs):
    return Net(math.prod(in_shape), n_classes, **kwargs)


def plain_mlp(in_shape, n_classes, hidden: int = 6):  # MLP-shaped, but not the project's MLP class
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


class TanhMLP(MLP):  # a subclass of the project's MLP with another activation: must not take the ReLU kernel
    def forward(self, x):
        h = x.flatten(1)
        for layer in self.body:
            h = torch.tanh(layer(h))
        return self.out(h)


def tanh_mlp(in_shape, n_classes):
    return TanhMLP(in_shape, n_classes, hidden=(4,))


def wrong_width(in_shape, n_classes):
    return nn.Linear(math.prod(in_shape), n_classes + 1)


def not_a_module(in_shape, n_classes):
    return "weights.pt"


NOT_CALLABLE = 3

D, C = 5, 3
SPEC = {"arch": "custom", "factory": f"{MOD}:bn_dropout_net", "in_shape": [D], "n_classes": C}
SEEDS = [3, 8, 21]
RECIPE = dict(epochs=3, batch_size=16, lr=0.05, weight_decay=0.01)


def data(n=49, shape=(D,), seed=0):
    """49 rows, batch 16: the last one-row batch joins the one before (BatchNorm)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, math.prod(shape), generator=g)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()


def reference(builder, seed: int, X, y, *, epochs, batch_size, lr, weight_decay=0.0, optimizer="adamw",
              momentum=0.9, schedule="constant", label_smoothing=0.0, in_shape=(D,)):
    """One member trained alone, plain PyTorch."""
    torch.manual_seed(seed)
    module = builder(tuple(in_shape), C)
    if optimizer == "sgd":
        opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    order = order_generator(seed)
    bounds = batch_bounds(len(y), batch_size, merge_single=True)
    total, step = epochs * len(bounds), 0
    torch.manual_seed(_rng_seed(seed))  # the member's dropout stream
    module.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=order)
        for lo, hi in bounds:
            if schedule == "cosine":
                for group in opt.param_groups:
                    group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / total))
            idx = perm[lo:hi]
            loss = F.cross_entropy(module(X[idx].view(-1, *in_shape)), y[idx], label_smoothing=label_smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    return module.eval()


def assert_state_equal(a: dict, b: dict, atol=1e-5):
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.fixture(scope="module")
def trained():
    X, y = data()
    ens = build_model(SPEC, SEEDS, search_paths=[HERE])
    train_ensemble(ens, X, y, **RECIPE)
    return ens, X, y


def test_custom_module_with_batchnorm_and_dropout_member_equals_plain_pytorch(trained):
    ens, X, y = trained
    assert ens.stochastic and ens.module_class == "Net" and not ens.training
    for k, seed in enumerate(SEEDS):
        ref = reference(bn_dropout_net, seed, X, y, **RECIPE)
        member = ens.module_of(k)
        assert isinstance(member, Net) and not member.training
        assert_state_equal(member.state_dict(), ref.state_dict())  # weights, running_mean/var, num_batches_tracked
        assert int(member.bn.num_batches_tracked) == 3 * 3  # 3 epochs x 3 batches (16, 16, 16 + 1)
        with torch.no_grad():
            torch.testing.assert_close(ens(X)[k], ref(X), atol=1e-5, rtol=0)
            torch.testing.assert_close(member(X), ref(X), atol=1e-5, rtol=0)
    # the members really differ (own init, own order, own dropout) and trained (running stats moved)
    assert not torch.allclose(ens.module_of(0).bn.running_mean, ens.module_of(1).bn.running_mean)


def test_dropout_streams_are_per_member():
    """Without dropout randomness of its own, member k would depend on its position: 2 members in a different
    order give the same members."""
    X, y = data()
    a = build_model(SPEC, [3, 8], search_paths=[HERE])
    b = build_model(SPEC, [8, 3], search_paths=[HERE])
    train_ensemble(a, X, y, **{**RECIPE, "epochs": 1})
    train_ensemble(b, X, y, **{**RECIPE, "epochs": 1})
    assert_state_equal(a.module_of(0).state_dict(), b.module_of(1).state_dict())


def test_resnet_member_equals_plain_pytorch_with_sgd_cosine_label_smoothing():
    spec = {"arch": "resnet", "in_shape": [1, 8, 8], "n_classes": C, "kwargs": {"widths": [4, 8]}}
    recipe = dict(epochs=2, batch_size=16, lr=0.05, weight_decay=5e-4, optimizer="sgd", momentum=0.9,
                  schedule="cosine", label_smoothing=0.1)
    X, y = data(33, (1, 8, 8), seed=1)
    ens = build_model(spec, [4, 9])
    assert not ens.stochastic
    train_ensemble(ens, X, y, **recipe)
    from unlearning.models.zoo import ResNet

    for k, seed in enumerate([4, 9]):
        ref = reference(lambda s, c: ResNet(s, c, widths=[4, 8]), seed, X, y, in_shape=(1, 8, 8), **recipe)
        assert_state_equal(ens.module_of(k).state_dict(), ref.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(ens(X)[k], ref(X.view(-1, 1, 8, 8)), atol=1e-5, rtol=0)
        # features: the input of the head (global average pool), as a hook on the plain module sees it
        seen = []
        handle = ref.out.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0]))
        with torch.no_grad():
            ref(X.view(-1, 1, 8, 8))
        handle.remove()
        torch.testing.assert_close(ens.features(X)[k], seen[0], atol=1e-5, rtol=0)


def test_select_and_concat_carry_buffers(trained):
    ens, X, _ = trained
    part = ens.select([2, 0])
    assert part.seeds == [SEEDS[2], SEEDS[0]] and part.stochastic
    for j, k in enumerate([2, 0]):
        assert_state_equal(part.module_of(j).state_dict(), ens.module_of(k).state_dict(), atol=0)
    one = ens.select(1)
    assert one.n_models == 1 and torch.equal(one.module_of(0).bn.running_var, ens.module_of(1).bn.running_var)
    back = type(ens).concat([one, part])
    assert back.seeds == [SEEDS[1], SEEDS[2], SEEDS[0]]
    assert {n: t.shape[0] for n, t in back.named_buffers()} == {n: 3 for n, _ in ens.named_buffers()}
    for j, k in enumerate([1, 2, 0]):
        assert_state_equal(back.module_of(j).state_dict(), ens.module_of(k).state_dict(), atol=0)
    with torch.no_grad():
        assert torch.equal(back(X), ens(X)[[1, 2, 0]])
    # copies, not views: training the selection leaves the source alone
    before = ens.module_of(2).bn.running_mean.clone()
    train_ensemble(part, X, (X[:, 0] > 0).long(), epochs=1, batch_size=16, lr=0.05)
    assert torch.equal(ens.module_of(2).bn.running_mean, before)


def hook_input(module: nn.Module, layer: str, X) -> torch.Tensor:
    seen = []
    handle = dict(module.named_modules())[layer].register_forward_hook(lambda _m, i, _o: seen.append(i[0]))
    with torch.no_grad():
        module(X)
    handle.remove()
    return seen[0].flatten(1)


def test_features_are_the_input_of_the_feature_layer(trained):
    ens, X, _ = trained
    assert ens.feature_layer == "head"  # the last nn.Linear
    feats = ens.features(X)
    assert feats.shape == (3, X.shape[0], 6)
    for k in range(3):
        torch.testing.assert_close(feats[k], hook_input(ens.module_of(k), "head", X), atol=1e-6, rtol=0)
    # another layer by name: the input of the BatchNorm (the first Linear's output)
    other = build_model({**SPEC, "feature_layer": "bn"}, SEEDS, search_paths=[HERE])
    other.load_state_dict(ens.state_dict())
    for k in range(3):
        torch.testing.assert_close(other.features(X)[k], hook_input(ens.module_of(k), "bn", X), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"feature_layer = 'fc9' is not a layer of Net; layers: \['fc1', 'bn'"):
        build_model({**SPEC, "feature_layer": "fc9"}, SEEDS, search_paths=[HERE])


def test_checkpoint_round_trip_with_buffers(trained, tmp_path):
    ens, X, _ = trained
    save_model(ens, tmp_path / "m.pt", {"note": 1})
    loaded, extra = load_model(tmp_path / "m.pt", search_paths=[HERE])
    assert extra == {"note": 1} and loaded.seeds == SEEDS and loaded.module_class == "Net"
    assert_state_equal(loaded.state_dict(), ens.state_dict(), atol=0)
    with torch.no_grad():
        assert torch.equal(loaded(X), ens(X))


def test_plain_state_dict_files(tmp_path):
    X, _ = data()
    torch.manual_seed(0)
    mine = Net(D, C)
    with torch.no_grad():  # a team's trained module: weights and running statistics of its own
        mine.bn.running_mean.uniform_(-1, 1)
        mine.bn.running_var.uniform_(0.5, 2)
        mine.bn.num_batches_tracked.fill_(7)
    path = tmp_path / "mine.pt"
    torch.save(mine.state_dict(), path)
    with pytest.raises(ValueError, match="not a pipeline checkpoint.*train.init_checkpoint"):
        load_model(path, search_paths=[HERE])
    one = load_module_state(build_model(SPEC, [5, 6], search_paths=[HERE]), path)
    assert one.n_models == 1 and one.seeds == [5] and not one.training
    assert_state_equal(one.module_of(0).state_dict(), mine.state_dict(), atol=0)
    with torch.no_grad():
        torch.testing.assert_close(one(X)[0], mine.eval()(X), atol=1e-6, rtol=0)
    torch.save(nn.Linear(D, C).state_dict(), tmp_path / "other.pt")
    with pytest.raises(ValueError, match="does not fit Net.*missing keys"):
        load_module_state(one, tmp_path / "other.pt")


@pytest.mark.parametrize("factory, message", [
    ("no_colon", r"expected 'module.path:callable'"),
    ("a:b:c", r"expected 'module.path:callable'"),
    ("no_such_module_xyz:build", r"cannot import module 'no_such_module_xyz'.*no_such_module_xyz.py"),
    (f"{MOD}:nope", rf"module '{MOD}' has no attribute 'nope'"),
    (f"{MOD}:NOT_CALLABLE", r"'NOT_CALLABLE' is not callable"),
    (f"{MOD}:not_a_module", r"returned str, expected a torch.nn.Module"),
    (f"{MOD}:wrong_width", r"Linear maps \[2, \*\[5\]\] to \[2, 4\]; the pipeline needs \[B, n_classes\] = \[2, 3\]"),
    (None, r"arch = 'custom' needs train.model.factory"),
])
def test_factory_errors_are_clear(factory, message):
    spec = {**SPEC, "factory": factory}
    with pytest.raises(ValueError, match=message):
        build_model(spec, [0], search_paths=[HERE])


def test_factory_kwargs_and_bad_kwargs():
    ens = build_model({**SPEC, "kwargs": {"hidden": 4}}, [0], search_paths=[HERE])
    assert ens.module_of(0).fc1.out_features == 4
    bad = r"bn_dropout_net\(in_shape, n_classes, \*\*train.model.kwargs=\{'width': 4\}\)"
    with pytest.raises(ValueError, match=bad):
        build_model({**SPEC, "kwargs": {"width": 4}}, [0], search_paths=[HERE])


def test_only_the_project_mlp_is_auto_fused(monkeypatch):
    """arch mlp trains on the fused kernel under kernel="auto"; an MLP-shaped custom module, or a subclass of
    the MLP with another activation, takes the generic path (and refuses kernel="fused")."""
    calls = []
    real = fused_mlp.FusedMLP
    monkeypatch.setattr(fused_mlp, "FusedMLP", lambda *a, **k: calls.append(1) or real(*a, **k))
    X, y = data()
    mlp = build_model({"arch": "mlp", "in_shape": [D], "n_classes": C, "kwargs": {"hidden": [6]}}, [0, 1])
    train_ensemble(mlp, X, y, epochs=1, batch_size=16, lr=0.05)
    assert calls == [1] and mlp.linear_chain() == ["body.0", "out"]
    for factory in ("plain_mlp", "tanh_mlp"):
        other = build_model({**SPEC, "factory": f"{MOD}:{factory}"}, [0, 1], search_paths=[HERE])
        assert other.linear_chain() is None and not fused_mlp.supports(other)
        train_ensemble(other, X, y, epochs=1, batch_size=16, lr=0.05)
        with pytest.raises(ValueError, match="kernel='fused' supports MLP ensembles only"):
            train_ensemble(other, X, y, epochs=1, batch_size=16, lr=0.05, kernel="fused")
    assert calls == [1]


class DataDependent(torch.nn.Module):
    """Python control flow on a tensor value: vmap cannot run it (`.item()` on a batched tensor)."""

    def __init__(self, d, c):
        super().__init__()
        self.lin = torch.nn.Linear(d, c)

    def forward(self, x):
        h = self.lin(x)
        return h * 2 if h.abs().max().item() > 1e9 else h


def data_dependent(in_shape, n_classes):
    return DataDependent(in_shape[0], n_classes)


def test_a_module_vmap_cannot_run_trains_member_by_member_with_the_same_numbers(caplog):
    import sys

    from unlearning.models import flat_params

    spec = {"arch": "custom", "factory": f"{__name__}:data_dependent", "in_shape": [4], "n_classes": 3}
    sys.modules.setdefault(__name__, sys.modules[__name__])
    ens = build_model(spec, [1, 2, 3])
    assert not ens.vectorized and "vmap" in caplog.text and ens.vmap_error
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,), generator=g)
    train_ensemble(ens, X, y, epochs=2, batch_size=8, lr=1e-2)
    single = build_model(spec, [2])
    train_ensemble(single, X, y, epochs=2, batch_size=8, lr=1e-2)
    assert torch.allclose(flat_params(ens)[1], flat_params(single)[0], atol=1e-6)
    assert ens.features(X[:5]).shape == (3, 5, 4) and ens.select([2, 0]).vectorized is False
