"""Team modules that the leverage code, `module_of` or the build check got wrong (found by a sweep of own
models): a recurrent leaf returning a tuple, attention on PyTorch's fused kernels (no forward-mode AD), a
non-persistent buffer, parameters of two dtypes. float64, tiny sizes: forward mode equals reverse mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from unlearning.leverage.functions import StackedMemberFunction
from unlearning.models import build_model
from unlearning.models.zoo import ModelError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
D, C = 6, 3


def spec(factory: str) -> dict:
    return {"arch": "custom", "factory": f"custom_modules:{factory}", "in_shape": [D], "n_classes": C}


@pytest.mark.parametrize("factory", ["lstm", "gru", "attention", "weight_norm"])
def test_leverage_functions_of_recurrent_and_attention_modules_agree_in_both_modes(factory):
    ens = build_model(spec(factory), [0, 1], search_paths=[HERE]).double()
    # building it probes every leaf's output size: an LSTM's (out, (h, c)) tuple raised AttributeError
    f = StackedMemberFunction(ens, member=1)
    assert f.n_outputs == C and f.activation_size() > 0
    g = torch.Generator().manual_seed(0)
    X = torch.randn(5, D, generator=g, dtype=torch.float64)
    V = torch.randn(f.p, 3, generator=g, dtype=torch.float64)
    # forward mode (the output gaps, the Newton step): the fused attention kernels raised NotImplementedError,
    # and weight_norm's kernel has no forward-mode derivative at all (J V then comes from reverse mode twice)
    forward = f.jvp(f.theta0, X, V)                                   # [m, b, C]
    reverse = torch.einsum("bcp,pm->mbc", f.jacobians(f.theta0, X), V)
    torch.testing.assert_close(forward, reverse, atol=1e-10, rtol=1e-8)
    # and the fused fast path is back on for everything else afterwards
    assert torch.backends.mha.get_fastpath_enabled()


def test_a_members_module_keeps_its_non_persistent_buffers():
    ens = build_model(spec("scaled_by_buffer"), [0, 1], search_paths=[HERE]).double().eval()
    X = torch.randn(4, D, dtype=torch.float64)
    member = ens.module_of(1).eval()
    torch.testing.assert_close(member.scale, torch.full((D,), 0.5, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(member(X), ens(X)[1], atol=1e-12, rtol=0)


def test_parameters_of_two_dtypes_are_refused_by_name():
    with pytest.raises(ModelError, match=r"more than one floating dtype \(.*float64: \['w'\].*float32: "
                                         r"\['lin.weight', 'lin.bias'\]"):
        build_model(spec("mixed_dtype"), [0], search_paths=[HERE])


@pytest.mark.parametrize("name", ["salun", "scrub", "newton_ggn"])
def test_engine_methods_run_on_an_attention_module(name):
    # SalUn's saliency differentiates an eval-mode forward with torch.func.grad, which hides requires_grad from
    # nn.TransformerEncoderLayer's check, so its fused fast path ran: "derivative for
    # aten::_transformer_encoder_layer_fwd is not implemented" (exit 1 on any attention model).
    from unlearning.methods import TrainRecipe, UnlearnContext, run_method
    from unlearning.models import train_ensemble

    g = torch.Generator().manual_seed(0)
    y = torch.arange(30) % C
    X = torch.randn(C, D, generator=g)[y] * 2 + torch.randn(30, D, generator=g)
    model = build_model(spec("attention"), [0, 1], search_paths=[HERE])
    train_ensemble(model, X, y, epochs=2, batch_size=10, lr=1e-2)
    adjacent = torch.zeros(24, dtype=torch.bool)
    adjacent[:6] = True
    ctx = UnlearnContext(model, X[:6], y[:6], X[6:], y[6:], adjacent, TrainRecipe(epochs=1, batch_size=10, lr=1e-2),
                         seed=3)
    result = run_method(name, ctx, {})
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
    assert torch.backends.mha.get_fastpath_enabled()  # inference keeps the fused kernels afterwards


@pytest.mark.parametrize("factory", ["functional_dropout", "input_noise"])
def test_random_draws_in_forward_without_a_dropout_module_train_member_by_member(factory):
    # F.dropout or torch.randn_like noise: no nn.Dropout module to find, so the members ran under vmap's
    # randomness="error" and training crashed ("vmap: called random operation while in randomness error mode").
    from unlearning.models import train_ensemble

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(30, D, generator=g), torch.arange(30) % C

    def trained(seeds):
        model = build_model(spec(factory), seeds, search_paths=[HERE])
        assert model.stochastic
        train_ensemble(model, X, y, epochs=2, batch_size=10, lr=1e-2)
        return model

    both, again, second = trained([1, 2]), trained([1, 2]), trained([2])
    for a, b, c in zip(both.parameters(), again.parameters(), second.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)       # the same seeds draw the same numbers
        torch.testing.assert_close(a[1], c[0], atol=1e-6, rtol=1e-5)  # and member 1 draws its own stream
    # eval mode is deterministic: the two members' outputs do not change between calls
    with torch.no_grad():
        torch.testing.assert_close(both.eval()(X), both(X), atol=0, rtol=0)


def test_a_forward_that_draws_random_numbers_in_eval_mode_is_refused_by_name():
    with pytest.raises(ModelError, match=r"custom_modules:noisy_in_eval.*NoisyInEval's forward draws random "
                                         r"numbers in eval mode.*conditional on self.training"):
        build_model(spec("noisy_in_eval"), [0], search_paths=[HERE])


def test_a_float64_module_trains_and_unlearns_on_the_float32_data():
    # Every parameter float64: training failed with torch's raw "expected scalar type Double but found Float",
    # which blames the team's forward for the pipeline's float32 data.
    from unlearning.methods import TrainRecipe, UnlearnContext, run_method
    from unlearning.models import train_ensemble

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(30, D, generator=g), torch.arange(30) % C
    model = build_model(spec("all_float64"), [0, 1], search_paths=[HERE])
    train_ensemble(model, X, y, epochs=2, batch_size=10, lr=1e-2)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    with torch.no_grad():
        out = model.eval()(X)
        torch.testing.assert_close(out[1], model.module_of(1)(X.double()), atol=1e-12, rtol=0)
    adjacent = torch.zeros(24, dtype=torch.bool)
    ctx = UnlearnContext(model, X[:6], y[:6], X[6:], y[6:], adjacent, TrainRecipe(epochs=1, batch_size=10, lr=1e-2),
                         seed=3)
    assert next(run_method("finetune", ctx, {}).model.parameters()).dtype == torch.float64


def test_the_reverse_mode_jvp_equals_forward_mode_in_float64():
    # the fallback for modules without forward-mode derivatives, checked where both modes exist
    ens = build_model(spec("gru"), [0], search_paths=[HERE]).double()
    f = StackedMemberFunction(ens, member=0)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4, D, generator=g, dtype=torch.float64)
    V = torch.randn(f.p, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(f._jvp_by_double_vjp(f.theta0, X, V), f.jvp(f.theta0, X, V), atol=1e-12, rtol=1e-10)
    assert f.forward_mode


def test_a_torchscript_submodule_is_refused_by_name():
    # stack_module_state failed on it with a bare AssertionError ("param must be a Parameter"), exit 1
    with pytest.raises(ModelError, match=r"custom_modules:scripted_head.*holds TorchScript modules \(\['2'\]\).*"
                                         r"return the plain nn.Module"):
        build_model(spec("scripted_head"), [0, 1], search_paths=[HERE])


def test_salun_gives_a_parameter_the_forward_never_uses_zero_saliency():
    # "The differentiated Tensor at index 2 appears to not have been used in the graph" (exit 1)
    from unlearning.methods.salun import saliency_mask

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(8, D, generator=g), torch.arange(8) % C
    model = build_model(spec("unused_head"), [0, 1], search_paths=[HERE])
    masks = saliency_mask(model, X, y, fraction=0.5)
    names = [n for n, _ in model.named_parameters()]
    unused = [m for n, m in zip(names, masks) if n.startswith("aux")]
    assert unused and all(not m.any() for m in unused)
    assert any(m.any() for n, m in zip(names, masks) if n.startswith("fc"))


@pytest.mark.parametrize("factory, cls", [("no_parameters", "NoParameters"), ("all_frozen", "Linear")])
def test_a_module_with_nothing_to_train_is_refused_at_build(factory, cls):
    # a bare StopIteration (module_of, training) or "element 0 of tensors does not require grad" (training)
    with pytest.raises(ModelError, match=rf"custom_modules:{factory}.*{cls} has no trainable parameter"):
        build_model(spec(factory), [0, 1], search_paths=[HERE])


def test_per_sample_jacobians_of_prelu_loop_where_the_nested_vmap_breaks(caplog):
    # torch 2.13: vmap over samples of jacrev through F.prelu raised "The size of tensor a (5) must match";
    # the leverage rows and newton_ggn failed on a model that trains fine
    ens = build_model(spec("prelu"), [0, 1], search_paths=[HERE]).double()
    f = StackedMemberFunction(ens, member=0)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4, D, generator=g, dtype=torch.float64)
    V = torch.randn(f.p, 2, generator=g, dtype=torch.float64)
    J = f.jacobians(f.theta0, X)                                        # [b, C, p]
    assert J.shape == (4, C, f.p) and not f.jacobians_vectorized and "looping over the samples" in caplog.text
    torch.testing.assert_close(torch.einsum("bcp,pm->mbc", J, V), f.jvp(f.theta0, X, V), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["gradient_ascent", "descent_ascent", "scrub", "salun", "al_wpgd"])
def test_a_one_row_forget_set_on_a_batchnorm_module_runs_every_engine_method(name):
    # one erasure request on the README's own module shape (Linear -> BatchNorm1d -> ...): torch raised "Expected
    # more than 1 value per channel when training" on the one-row forget batch, and the batch failed (exit 1)
    from unlearning.methods import TrainRecipe, UnlearnContext, run_method
    from unlearning.models import train_ensemble

    g = torch.Generator().manual_seed(0)
    y = torch.arange(30) % C
    X = torch.randn(30, D, generator=g, dtype=torch.float64) + y[:, None]
    ens = build_model(spec("bn_mlp"), [0, 1], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, epochs=2, batch_size=8, lr=0.01)
    stats = ens.state_dict()
    adjacent = torch.arange(29) % 3 == 0
    ctx = UnlearnContext(ens, X[:1], y[:1], X[1:], y[1:], adjacent, TrainRecipe(2, 8, 1e-2), seed=0)
    # al_wpgd's 100 + 300 default steps: 10 + 30 go through both stages on the one-row batch all the same
    args = {"stage1_steps": 10, "stage2_steps": 30} if name == "al_wpgd" else {}
    out = run_method(name, ctx, args).model
    assert all(torch.isfinite(p).all() for p in out.parameters())
    assert all(torch.equal(t, stats[k]) for k, t in ens.state_dict().items())  # the input model is untouched
