"""A team's own module that is unusual (tied or frozen weights, no nn.Linear) trains as the README promises,
and a team's model MISTAKE ends in one `error:` line and exit code 2 (flows/errors.py), not a traceback.

Factories live in tests/unit/custom_modules.py; model files with import-time mistakes are written to tmp_path.
float64 and tiny sizes: member k is compared with a plain PyTorch run to 1e-10."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F


from flows.errors import EXIT_BAD_INPUT, exit_code, one_line_errors
from unlearning.models import build_model, load_model, load_module_state, save_model, train_ensemble
from unlearning.models.training import (
    TrainingDiverged, batch_bounds, frozen_copy, order_generator, param_count, trainable_param_count,
)
from unlearning.models.zoo import ModelError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the module the factories "custom_modules:<fn>" import (search_paths=[HERE])
import custom_modules  # noqa: E402
D, C = 4, 3
RECIPE = dict(epochs=3, batch_size=8, lr=0.05, weight_decay=0.01)


def spec(factory: str, **extra) -> dict:
    return {"arch": "custom", "factory": f"custom_modules:{factory}", "in_shape": [D], "n_classes": C, **extra}


def data(n=27, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, D, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()


def alone(factory, seed: int, X, y, *, epochs, batch_size, lr, weight_decay):
    """Member `seed` trained ALONE by a plain PyTorch loop: built under torch.manual_seed(seed), AdamW, the
    member's data-order stream."""
    torch.manual_seed(seed)
    module = factory((D,), C).double()
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    order = order_generator(seed)
    module.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=order)
        for lo, hi in batch_bounds(len(y), batch_size):
            idx = perm[lo:hi]
            loss = F.cross_entropy(module(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return module.eval()


def assert_same_state(a: dict, b: dict, atol=1e-10):
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


# --- 1. tied weights ---------------------------------------------------------------------------------------
def test_tied_weights_train_vectorised_and_member_k_equals_the_module_trained_alone(tmp_path, caplog):
    X, y = data()
    seeds = [0, 5]
    ens = build_model(spec("tied"), seeds, search_paths=[HERE]).double()
    assert ens.vectorized and "vmap" not in caplog.text  # no fallback, no misleading warning
    assert "b__weight" not in dict(ens.named_parameters())  # one stacked tensor for the tie
    train_ensemble(ens, X, y, **RECIPE)
    for k, seed in enumerate(seeds):
        ref = alone(custom_modules.tied, seed, X, y, **RECIPE)
        member = ens.module_of(k)
        assert member.b.weight is member.a.weight  # the tie holds in the plain copy
        assert_same_state(member.state_dict(), ref.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(ens(X)[k], ref(X), atol=1e-10, rtol=0)
    save_model(ens, tmp_path / "m.pt")
    loaded, _ = load_model(tmp_path / "m.pt", search_paths=[HERE])  # rebuilt in float32, as the pipeline runs
    one = loaded.module_of(1)
    assert one.b.weight is one.a.weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(X.float()), ens(X).float(), atol=1e-6, rtol=0)
        torch.testing.assert_close(ens.select([1])(X)[0], ens(X)[1], atol=0, rtol=0)


# --- 2. frozen parameters ----------------------------------------------------------------------------------
def test_frozen_parameters_stay_frozen_and_the_count_says_so():
    X, y = data()
    ens = build_model(spec("frozen_first"), [1, 2], search_paths=[HERE]).double()
    params = dict(ens.named_parameters())
    assert not params["1__weight"].requires_grad and params["3__weight"].requires_grad
    assert ens.trainable_mask() == [False, False, True, True]
    before = {n: p.detach().clone() for n, p in params.items()}
    train_ensemble(ens, X, y, **RECIPE)
    assert torch.equal(params["1__weight"], before["1__weight"]) and torch.equal(params["1__bias"], before["1__bias"])
    assert not torch.equal(params["3__weight"], before["3__weight"])
    ref = alone(custom_modules.frozen_first, 2, X, y, **RECIPE)
    assert_same_state(ens.module_of(1).state_dict(), ref.state_dict())
    assert not ens.module_of(1)[1].weight.requires_grad
    assert (param_count(ens), trainable_param_count(ens)) == (4 * 4 + 4 + 4 * 3 + 3, 4 * 3 + 3)
    # a frozen copy (every parameter off) comes back to the module's own flags
    copy = frozen_copy(ens).restore_requires_grad()
    assert [p.requires_grad for p in copy.parameters()] == [False, False, True, True]



@pytest.mark.parametrize("method", ["finetune", "noisy_finetune", "gradient_ascent", "descent_ascent", "scrub", "salun",
                                    "al_wpgd"])
def test_the_engines_methods_never_move_a_frozen_parameter(method):
    from unlearning.methods import TrainRecipe, UnlearnContext, run_method

    X, y = data()
    ens = build_model(spec("frozen_first"), [1, 2], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    ctx = UnlearnContext(model=ens, X_forget=X[:4], y_forget=y[:4], X_retain=X[4:], y_retain=y[4:],
                         adjacent_mask=torch.arange(len(y) - 4) < 8, recipe=TrainRecipe(**RECIPE), loss="ce")
    out = run_method(method, ctx, {}).model
    new, old = dict(out.named_parameters()), dict(ens.named_parameters())
    assert torch.equal(new["1__weight"], old["1__weight"]) and torch.equal(new["1__bias"], old["1__bias"])
    assert not torch.equal(new["3__weight"], old["3__weight"])  # the trainable layer did move
    assert out.trainable_mask() == [False, False, True, True]
    assert [p.requires_grad for p in out.parameters()] == [False, False, True, True]

def _frozen_head_problem():
    """frozen_first trained, its fixed features phi = tanh(W1 x + b1) and the ridge design A = [phi, 1]."""
    X, y = data(n=40)
    ens = build_model(spec("frozen_first"), [1, 2], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    first = ens.module_of(1)[1]
    with torch.no_grad():
        phi = torch.tanh(first(X))
    return X, y, ens, torch.cat([phi, torch.ones(len(y), 1, dtype=torch.float64)], 1)


def test_newton_ggn_moves_only_the_trainable_head_and_lands_on_its_ridge_solution():
    """With the first layer frozen the model is linear in its TRAINABLE parameters (the head on fixed features
    phi), so with squared loss one Newton step is exact: each output's head row and bias become the ridge
    solution (A_R^T A_R + lam I)^-1 A_R^T Y_R, and the frozen layer is untouched (it used to move with the
    rest: the flat vector held every parameter)."""
    from unlearning.methods import TrainRecipe, UnlearnContext, run_method

    X, y, ens, A = _frozen_head_problem()
    forget, retain = torch.arange(0, 6), torch.arange(6, len(y))
    lam = 0.3
    ctx = UnlearnContext(model=ens, X_forget=X[forget], y_forget=y[forget], X_retain=X[retain],
                         y_retain=y[retain], adjacent_mask=torch.zeros(len(retain), dtype=torch.bool),
                         recipe=TrainRecipe(**RECIPE), loss="mse")
    out = run_method("newton_ggn", ctx, {"gradient": "retain", "lam": lam, "solver": "exact"}).model
    new, old = dict(out.named_parameters()), dict(ens.named_parameters())
    assert torch.equal(new["1__weight"], old["1__weight"]) and torch.equal(new["1__bias"], old["1__bias"])
    Y = F.one_hot(y[retain], C).double()
    gram = A[retain].T @ A[retain] + lam * torch.eye(A.shape[1], dtype=torch.float64)
    theta = torch.linalg.solve(gram, A[retain].T @ Y)  # [hidden + 1, C]: head rows, then the bias
    # member 1's frozen layer built A (member 0 has frozen features of its own)
    torch.testing.assert_close(new["3__weight"][1], theta[:-1].T, atol=1e-9, rtol=0)
    torch.testing.assert_close(new["3__bias"][1], theta[-1], atol=1e-9, rtol=0)
    assert out.trainable_mask() == [False, False, True, True]


def test_leverage_of_a_frozen_backbone_is_the_ridge_leverage_of_its_features():
    """Self-leverage in the trainable coordinates: for squared loss, J_i = I_C (x) a_i^T, so
    h_i = C * a_i^T (A_R^T A_R + lam I)^-1 a_i on the frozen features (docs/design.md §4.1)."""
    from unlearning.leverage import StackedMemberFunction, compute_diagnostics

    X, y, ens, A = _frozen_head_problem()
    forget, retain = torch.arange(0, 6), torch.arange(6, len(y))
    lam = 0.3
    fn = StackedMemberFunction(ens, 1, dtype=torch.float64, device="cpu")
    assert fn.p == 4 * 3 + 3 and fn.chain is None  # the head only; the MLP closed forms need every parameter
    rep = compute_diagnostics(ens, X[forget], y[forget], X[retain], y[retain], lam=lam, solver="exact",
                              device="cpu", loss="mse", member=1)
    assert rep.n_params == 15
    gram = A[retain].T @ A[retain] + lam * torch.eye(A.shape[1], dtype=torch.float64)
    H = A[forget] @ torch.linalg.solve(gram, A[forget].T)
    torch.testing.assert_close(torch.as_tensor(rep.self_leverage), C * H.diagonal(), atol=1e-10, rtol=1e-9)
    # write_into writes the head and leaves the frozen layer alone
    copy = ens.select([0, 1])
    frozen_before = copy.get_parameter("1__weight").detach().clone()
    fn.write_into(copy, 0, torch.zeros(fn.p, dtype=torch.float64))
    assert torch.equal(copy.get_parameter("1__weight"), frozen_before)
    assert torch.count_nonzero(copy.get_parameter("3__weight")[0]) == 0


def test_a_model_without_trainable_parameters_is_refused_by_the_leverage_function():
    from unlearning.leverage import StackedMemberFunction

    ens = build_model(spec("frozen_first"), [1], search_paths=[HERE]).double()
    for p in ens.parameters():
        p.requires_grad_(False)
    ens._trainable = dict.fromkeys(ens._trainable, False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        StackedMemberFunction(ens, 0)


# --- 3. feature layer, lazily --------------------------------------------------------------------------------
def test_a_module_without_linear_trains_and_only_features_need_a_feature_layer():
    X, y = data()
    ens = build_model(spec("no_linear"), [0, 1], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    assert ens(X).shape == (2, len(y), C)
    with pytest.raises(ModelError, match=r"train.model.feature_layer = null: NoLinear has no nn.Linear layer"):
        ens.features(X)
    named = build_model(spec("no_linear", feature_layer="pre"), [0], search_paths=[HERE]).double()
    torch.testing.assert_close(named.features(X)[0], X, atol=0, rtol=0)  # the input of `pre`


def test_the_default_feature_layer_is_the_last_linear_called_not_the_last_registered():
    X, _ = data()
    ens = build_model(spec("head_first"), [0, 1], search_paths=[HERE]).double()
    assert [n for n, m in ens.module_of(0).named_modules() if isinstance(m, torch.nn.Linear)][-1] == "body"
    assert ens.feature_layer == "head" and ens.select([1]).feature_layer == "head"
    seen = []
    member = ens.module_of(1)
    member.head.register_forward_hook(lambda _m, i, _o: seen.append(i[0]))
    with torch.no_grad():
        member(X)
    torch.testing.assert_close(ens.features(X)[1], seen[0], atol=1e-12, rtol=0)


# --- 4. the team's model mistakes: one line, exit 2 ----------------------------------------------------------
def model_file(tmp_path: Path, source: str) -> str:
    """A model file in a project folder of its own, under a fresh module name (no sys.modules reuse)."""
    name = f"team_model_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    return name


def assert_one_line_bad_input(e: BaseException, *needles: str):
    text = str(e)
    assert "\n" not in text and exit_code(e) == EXIT_BAD_INPUT, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"


@pytest.mark.parametrize("factory, kwargs, needles", [
    ("no_such_model_xyz:build", {}, ["train.model.factory = 'no_such_model_xyz:build'", "Put no_such_model_xyz.py"]),
    ("custom_modules:tied", {"width": 3}, ["train.model.kwargs = {'width': 3}", "width"]),
    ("custom_modules:raises_key_error", {}, ["train.model.factory", "raised KeyError: 'width'",
                                             "custom_modules.py, line"]),
    ("custom_modules:raises_runtime_error", {}, ["raised RuntimeError: CUDA is required", "fix the factory"]),
    ("custom_modules:ignores_n_classes", {}, ["maps [2, *[4]] to [2, 10]", "n_classes argument (here 3)"]),
    ("custom_modules:returns_tuple", {}, ["forward returned a tuple of 2, not a tensor", "return only the logits"]),
    ("custom_modules:returns_dict", {}, ["returned a dict with keys ['logits', 'features']"]),
])
def test_factory_mistakes_are_one_line_bad_input(factory, kwargs, needles):
    with pytest.raises(ModelError) as info:
        build_model({**spec("tied"), "factory": factory, "kwargs": kwargs}, [0], search_paths=[HERE])
    assert_one_line_bad_input(info.value, *needles)
    assert info.value.__cause__ is not None or "ignores" in factory or "returns" in factory


@pytest.mark.parametrize("source, needles, cause", [
    ("from torch import nn\ndef build(in_shape, n_classes)\n    return nn.Linear(4, 3)\n",
     ["importing", "failed with SyntaxError", "line 2", "fix the model file"], SyntaxError),
    ("from torch import nn\nLAYER = nn.Lineer\n", ["AttributeError", "'Lineer'", "line 2"], AttributeError),
    ("import not_installed_pkg_xyz\n", ["imports 'not_installed_pkg_xyz', which is not installed", "line 1"],
     ModuleNotFoundError),
    ("from torch import nn\nundefined_name\n", ["NameError: name 'undefined_name' is not defined", "line 2"],
     NameError),
])
def test_model_file_mistakes_at_import_name_the_failing_import(tmp_path, source, needles, cause):
    name = model_file(tmp_path, source)
    with pytest.raises(ModelError) as info:
        build_model({**spec("tied"), "factory": f"{name}:build"}, [0], search_paths=[tmp_path])
    assert_one_line_bad_input(info.value, f"train.model.factory = '{name}:build'", *needles)
    assert isinstance(info.value.__cause__, cause)
    assert "Put " not in str(info.value)  # the file IS there: never "put it in the folder"


def test_a_model_mistake_in_a_stage_is_one_error_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("UNLEARN_DEBUG", raising=False)  # an earlier `unlearn --debug` test may have set it
    with pytest.raises(SystemExit) as done, one_line_errors():
        build_model({**spec("returns_tuple")}, [0], search_paths=[HERE])
    assert done.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train.model.factory = 'custom_modules:returns_tuple'")


def test_init_checkpoint_mistakes_are_one_line_bad_input(tmp_path):
    model = build_model(spec("tied"), [0], search_paths=[HERE])
    module = model.module_of(0)
    cases = {
        "whole.pt": (lambda p: torch.save(module, p),
                     ["holds a pickled custom_modules.Tied object", "torch.save(model.state_dict(), path)"]),
        "keys.pt": (lambda p: torch.save({"x.weight": torch.zeros(2)}, p), ["missing keys", "unexpected keys"]),
        # every mismatched tensor named, with both shapes (torch's last line named only the last one)
        "shapes.pt": (lambda p: torch.save({**module.state_dict(), "head.weight": torch.zeros(5, 5),
                                            "head.bias": torch.zeros(5)}, p),
                      ["does not fit Tied", "2 shape mismatch(es), checkpoint vs module: head.weight [5, 5] vs [",
                       "head.bias [5] vs ["]),
        # PyTorch Lightning's checkpoint: the weights sit under 'state_dict', each name prefixed 'model.'
        "lightning.pt": (lambda p: torch.save({"epoch": 3, "global_step": 90, "state_dict": {
                             f"model.{k}": v for k, v in module.state_dict().items()}}, p),
                         ["a training checkpoint (entries ['epoch', 'global_step', 'state_dict'])",
                          "its 'state_dict' entry holds the weights (names prefixed 'model.')",
                          "sd = torch.load(path)['state_dict']; torch.save({k.removeprefix('model.'): v for k, v in "
                          "sd.items()}, path)"]),
        "junk.pt": (lambda p: p.write_text("not a checkpoint"), ["not a file torch.load can read"]),
        "wrapped.pt": (lambda p: torch.save({f"module.{k}": v for k, v in module.state_dict().items()}, p),
                       ["model.module.state_dict()"]),
        "nan.pt": (lambda p: torch.save({k: v * float("nan") for k, v in module.state_dict().items()}, p),
                   ["inf/NaN"]),
    }
    for file, (write, needles) in cases.items():
        write(tmp_path / file)
        with pytest.raises(ModelError) as info:
            load_module_state(model, tmp_path / file)
        assert_one_line_bad_input(info.value, f"train.init_checkpoint = {tmp_path / file}", *needles)


# --- 5. divergence ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_spec, kernel", [
    ({"arch": "mlp", "in_shape": [D], "n_classes": C, "kwargs": {"hidden": [4]}}, "fused"),
    ({"arch": "mlp", "in_shape": [D], "n_classes": C, "kwargs": {"hidden": [4]}}, "autograd"),
    (spec("frozen_first"), "autograd"),
])
def test_training_that_diverges_stops_with_a_clear_error(model_spec, kernel):
    X, y = data()
    ens = build_model(model_spec, [0, 1, 2], search_paths=[HERE]).double()
    with pytest.raises(TrainingDiverged) as info:  # float64 overflows at lr ~1e160 (float32 at ~1e6)
        train_ensemble(ens, X, y, epochs=4, batch_size=8, lr=1e200, optimizer="sgd", kernel=kernel)
    assert_one_line_bad_input(info.value, "diverged in epoch 1 of 4", "train.lr = 1e+200", "lower train.lr")
    train_ensemble(build_model(model_spec, [0], search_paths=[HERE]).double(), X, y, epochs=2, batch_size=8,
                   lr=0.05, optimizer="sgd", kernel=kernel)  # a sane lr trains


def test_the_train_stage_does_not_return_a_diverged_original(tmp_path):
    from tasks.training import prepare_dataset, train_original
    from tests.helpers import make_project
    from unlearning.config import load_params
    from unlearning.data import load_prepared

    params = load_params(make_project(tmp_path, {"train": {"model": {"hidden": [7]}, "epochs": 2, "optimizer": "sgd",
                                                           "lr": 1e12}}, inbox_files=False))
    prepare_dataset.fn(params)
    with pytest.raises(TrainingDiverged, match=r"train.lr = 1e\+12"):
        train_original.fn(params, load_prepared(params.path("prepared_dir")), "cpu")


# --- 6. identical members ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("factory, cause", [("seeds_itself", "calls torch.manual_seed itself"),
                                            ("shared_instance", "one shared module instance")])
def test_a_factory_that_ignores_the_seeding_is_warned_about_once(factory, cause, caplog):
    with caplog.at_level(logging.WARNING, logger="unlearning.models.ensemble"):
        build_model(spec(factory), [0, 1, 2], search_paths=[HERE])
        build_model(spec(factory), [3, 4], search_paths=[HERE])
    warned = [r.getMessage() for r in caplog.records if "start identical" in r.getMessage()]
    assert len(warned) == 1 and cause in warned[0] and f"custom_modules:{factory}" in warned[0]
    assert "2 of 3 equal member 0" in warned[0]


def test_members_built_by_a_well_behaved_factory_are_not_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        build_model(spec("tied"), [0, 1], search_paths=[HERE])
        build_model(spec("tied"), [4, 4], search_paths=[HERE])  # the same seed twice: equal on purpose
    assert "start identical" not in caplog.text


# --- a forward that writes to its module -------------------------------------------------------------------
@pytest.mark.parametrize("factory", ["stores_activation", "old_weight_norm"])
def test_a_forward_that_keeps_a_tensor_attribute_trains_and_copies(factory):
    # `self.last_hidden = h` (or the old weight_norm's pre-hook setting `weight`) left a BatchedTensor or a
    # non-leaf tensor on the ensemble's template: every later deepcopy (module_of, select, the methods) raised
    X, y = data()
    ens = build_model(spec(factory), [0, 5], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    ref = alone(getattr(custom_modules, factory), 5, X, y, **RECIPE)
    member = ens.module_of(1)
    assert_same_state(member.state_dict(), ref.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(member(X), ref(X), atol=1e-10, rtol=0)
        torch.testing.assert_close(ens.select([1])(X)[0], ens(X)[1], atol=0, rtol=0)


def test_a_buffer_reassigned_in_forward_is_refused_and_an_in_place_update_trains():
    # functional_call puts back the buffers it was given: `self.mu = ...` never reached the ensemble's state,
    # so the running mean stayed at zero while the plain module's moved (silently different from the module)
    with pytest.raises(ModelError, match=r"reassigns buffer 'mu'.*Update it in place"):
        build_model(spec("reassigned_buffer"), [0, 1], search_paths=[HERE])
    X, y = data()
    ens = build_model(spec("in_place_buffer"), [0, 1], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    ref = alone(custom_modules.in_place_buffer, 1, X, y, **RECIPE)
    assert ref.mu.abs().sum() > 0
    assert_same_state(ens.module_of(1).state_dict(), ref.state_dict())


@pytest.mark.parametrize("how", ["module_arg", "bound", "records"])
def test_forward_hooks_that_reach_the_members_tensors_train_as_the_module_alone(how):
    X, y = data()
    ens = build_model(spec("hooked", kwargs={"how": how}), [0, 3], search_paths=[HERE]).double()
    train_ensemble(ens, X, y, **RECIPE)
    ref = alone(lambda i, n: custom_modules.hooked(i, n, how), 3, X, y, **RECIPE)
    if how != "records":  # (that hook leaves the scale unused)
        assert not torch.equal(ref.scale, torch.full_like(ref.scale, 3.0))  # the scale trains
    assert_same_state(ens.module_of(1).state_dict(), ref.state_dict())


@pytest.mark.parametrize("how, needle", [
    ("tensor_closure", r"forward hook on fc holds 'scale' in its closure"),
    ("self_closure", r"forward hook on fc reads \['scale'\] through a module"),
    ("backward", r"a backward hook on fc.*gradient hooks would be ignored"),
    ("tensor_grad", r"a gradient hook on parameter 'fc.weight'"),
])
def test_hooks_the_members_cannot_honour_are_refused_by_name(how, needle):
    # each trained silently wrong: the scale stayed 3.0, or the hooked gradient was not scaled
    with pytest.raises(ModelError, match=needle):
        build_model(spec("hooked", kwargs={"how": how}), [0, 1], search_paths=[HERE])


def test_lazy_modules_are_materialised_from_each_members_seed():
    # nn.LazyLinear raised a bare ValueError at build (stacking an uninitialised parameter)
    X, y = data()
    ens = build_model(spec("lazy"), [0, 4], search_paths=[HERE]).double()
    assert not torch.equal(ens.module_of(0)[0].weight, ens.module_of(1)[0].weight)
    train_ensemble(ens, X, y, **RECIPE)

    def materialised(in_shape, n_classes):
        module = custom_modules.lazy(in_shape, n_classes)
        module(torch.zeros(2, *in_shape))
        return module

    assert_same_state(ens.module_of(1).state_dict(), alone(materialised, 4, X, y, **RECIPE).state_dict())


def test_uninitialised_parameters_are_refused_by_name():
    with pytest.raises(ModelError, match=r"uninitialised parameters: 'weight' \(max \|value\| 3e\+34\).*reset_parameters"):
        build_model(spec("uninitialised"), [0, 1], search_paths=[HERE])


def test_activation_checkpointing_is_refused_by_name_not_a_meta_device_error():
    # the recompute in backward ran after functional_call had put the template's meta tensors back
    with pytest.raises(ModelError, match=r"torch\.utils\.checkpoint"):
        build_model(spec("checkpointed"), [0, 1], search_paths=[HERE])


def test_a_forward_that_rewrites_a_parameter_in_place_is_refused_by_name():
    # nn.Embedding(max_norm=...) renormalises its weight in forward: the leverage diagnostics and newton_ggn
    # raised raw vmap / autograd errors on it (every deletion batch failed after training had passed)
    with pytest.raises(ModelError, match=r"changes parameter 'emb.weight' in place .*max_norm"):
        build_model(spec("max_norm_embedding"), [0, 1], search_paths=[HERE])


def test_a_class_defined_inside_the_factory_gets_the_fix_not_differ_in_structure():
    with pytest.raises(ModelError, match=r"defines the class class_inside\.<locals>\.Net inside itself.*module level"):
        build_model(spec("class_inside"), [0, 1], search_paths=[HERE])


def test_eval_outputs_that_depend_on_the_batch_are_refused():
    # the per-sample Jacobians (one row at a time) then disagreed with the batched J V silently (by 13.9)
    with pytest.raises(ModelError, match=r"eval-mode outputs depend on the other rows of the batch"):
        build_model(spec("batch_size_branch"), [0, 1], search_paths=[HERE])


def test_a_forward_that_squeezes_away_the_batch_of_one_row_is_refused():
    # `.squeeze()` mapped a one-row batch to [C]: jacobians came out [b, p] silently; a last minibatch of one
    # row, a one-row forget set and the leverage rows raised raw errors deep inside training and the methods
    with pytest.raises(ModelError, match=r"maps one row \[1, \*in_shape\] to \[3\], not \[1, 3\].*squeeze"):
        build_model(spec("squeezed"), [0, 1], search_paths=[HERE])


def test_a_forward_that_normalises_its_input_in_place_is_refused_for_that_reason():
    # it rewrote the caller's rows (ens(X) changed X for every later use); the batch check, reusing its input
    # after the first call, refused it for the wrong reason ("depends on the other rows")
    with pytest.raises(ModelError, match=r"changes its input in place"):
        build_model(spec("normalises_in_place"), [0, 1], search_paths=[HERE])


def test_autocast_inside_forward_is_refused_by_name():
    # torch.func ignores autocast: the members trained in float32 while module_of(k) computed in bfloat16
    with pytest.raises(ModelError, match=r"returns bfloat16 logits from float32 parameters \(torch\.autocast"):
        build_model(spec("autocast"), [0, 1], search_paths=[HERE])


def test_a_forward_that_branches_on_its_batched_input_trains_member_by_member():
    # the vmap probe shared one input between members; training maps a batch per member, where `if x.max() > 1`
    # is data-dependent control flow: train_ensemble raised a raw vmap error
    X, y = data()
    ens = build_model(spec("scales_if_needed"), [0, 2], search_paths=[HERE]).double()
    assert not ens.vectorized
    train_ensemble(ens, X, y, **RECIPE)
    assert_same_state(ens.module_of(1).state_dict(),
                      alone(custom_modules.scales_if_needed, 2, X, y, **RECIPE).state_dict())


def test_batchnorm_without_running_statistics_is_named_as_the_cause():
    with pytest.raises(ModelError, match=r"depend on the other rows of the batch.*BatchNorm layers \['1'\] have "
                                         r"track_running_stats=False"):
        build_model(spec("batch_stats_only"), [0, 1], search_paths=[HERE])
