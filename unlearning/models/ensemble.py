"""One ensemble adapter over any `nn.Module`: N independent members evaluated in one pass (torch.func).

The members' parameters AND buffers are stacked with a leading member dimension N
(`torch.func.stack_module_state`); the forward pass is `vmap(functional_call(base, ...))` over that
dimension, so any module mapping [B, *in_shape] -> [B, C] becomes an ensemble [N, B, C] with no rewrite.
A single model is the case N = 1.

Contract (tested): member k is the module built with `torch.manual_seed(seed_k)` and trained alone,
whatever N is. Members never mix: the ensemble loss is the sum of the members' losses, so each member's
gradient and optimizer state is its own; BatchNorm running statistics are stacked buffers, so each member
keeps its own; `select` / `concat` carry parameters and buffers. Modules with dropout train member by
member in train mode, each drawing from its own generator (seeded from its seed), so member k draws
exactly what the lone run draws; in eval mode (and for modules without dropout) one vmapped call serves
all members.

Inputs are flat features [B, d] (shared by all members) or [N, B, d] (one batch per member); they are
reshaped to in_shape before the module sees them. Outputs are logits [N, B, C].
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from unlearning.models import zoo
from unlearning.models import contract

log = logging.getLogger(__name__)

# (builder, spec) -> (vectorized, vmap error): whether an architecture runs under vmap does not depend on
# the members' seeds or weights.
_VMAP_PROBES: dict[tuple, tuple[bool, str | None]] = {}
# (builder, spec) -> whether the train-mode forward draws random numbers (the eval-mode one must not).
_RANDOM_PROBES: dict[tuple, bool] = {}
# architectures whose member-by-member training step was probed
_LOOP_PROBES: set[tuple] = set()

_SPEC_KEYS = ("arch", "in_shape", "n_classes", "kwargs", "factory", "feature_layer")


def normalize_spec(spec: dict) -> dict:
    """The canonical spec: {arch, in_shape, n_classes, kwargs, factory, feature_layer}.

    Also accepts the flat legacy form {"arch", "in_dim", "image_shape", "n_classes", <arch kwargs>}:
    in_dim d gives in_shape [d]; image_shape [H, W] gives [1, H, W]."""
    spec = dict(spec)
    out = {"arch": spec.pop("arch", "mlp"), "n_classes": int(spec.pop("n_classes")),
           "factory": spec.pop("factory", None), "feature_layer": spec.pop("feature_layer", None)}
    in_shape, in_dim, image_shape = spec.pop("in_shape", None), spec.pop("in_dim", None), spec.pop("image_shape", None)
    if in_shape is None:
        if image_shape and (in_dim is None or int(in_dim) == int(image_shape[0]) * int(image_shape[1])) \
                and out["arch"] != "mlp":
            in_shape = [1, *image_shape]
        elif in_dim is not None:
            in_shape = [int(in_dim)]
        else:
            raise ValueError("model spec needs in_shape (the shape of one input sample)")
    out["in_shape"] = [int(s) for s in in_shape]
    kwargs = dict(spec.pop("kwargs", None) or {})
    kwargs.update(spec)  # legacy flat arch kwargs (hidden, channels, ...)
    out["kwargs"] = kwargs
    return {k: out[k] for k in _SPEC_KEYS}


def _key(name: str) -> str:
    # parameter names of the wrapped module ("body.0.weight") as attribute names of the ensemble
    return name.replace(".", "__")


def _is_stochastic(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in module.modules())


def _rng_seed(seed: int) -> int:
    """The dropout stream of a member: independent of its initialisation and data-order streams."""
    return (int(seed) * 2_654_435_761 + 91) % (2**63)


# (builder) whose identical-members warning was given: once per factory and process.
_WARNED_IDENTICAL: set = set()
# torch's default CPU generator is one per process: seeding it and drawing from it (a member's initialisation,
# a stochastic forward) must not interleave with another thread doing the same, or members draw each other's
# numbers (validation.task_runner: threads builds and trains oracle chunks side by side). Reentrant: a
# factory may build an Ensemble itself.
_GLOBAL_RNG = threading.RLock()

# Fused attention kernels have no derivative for torch.func: nn.TransformerEncoderLayer's and
# nn.MultiheadAttention's eval-mode fast path has none at all (it checks `requires_grad`, which a torch.func.grad
# transform hides, so SalUn's saliency raised "derivative for aten::_transformer_encoder_layer_fwd is not
# implemented"), and CPU flash attention has no forward-mode one (`call_member` under jvp: the leverage
# diagnostics, the Newton step). Neither has a vmap batching rule (torch falls back to a slow per-sample loop,
# with a warning). They are switched off while a forward may be differentiated or runs under vmap: the math
# kernels compute the same function. Process-wide flags, so counted across threads: the first caller switches
# them off, the last one restores them.
_KERNELS_LOCK = threading.Lock()
_kernels_state: dict = {"fastpath_depth": 0, "fastpath": None, "sdpa_depth": 0, "sdpa": None}


@contextlib.contextmanager
def _transform_safe_kernels(forward_mode: bool = True):
    """No fused attention fast path; with forward_mode also scaled-dot-product attention on its math kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with _KERNELS_LOCK:
        if _kernels_state["fastpath_depth"] == 0:
            _kernels_state["fastpath"] = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
        _kernels_state["fastpath_depth"] += 1
        if forward_mode:
            if _kernels_state["sdpa_depth"] == 0:
                _kernels_state["sdpa"] = sdpa_kernel(SDPBackend.MATH)
                _kernels_state["sdpa"].__enter__()
            _kernels_state["sdpa_depth"] += 1
    try:
        yield
    finally:
        with _KERNELS_LOCK:
            if forward_mode:
                _kernels_state["sdpa_depth"] -= 1
                if _kernels_state["sdpa_depth"] == 0:
                    _kernels_state["sdpa"].__exit__(None, None, None)
            _kernels_state["fastpath_depth"] -= 1
            if _kernels_state["fastpath_depth"] == 0:
                torch.backends.mha.set_fastpath_enabled(_kernels_state["fastpath"])


def _if_differentiated():
    """`_transform_safe_kernels` (reverse mode) when grad mode is on, else nothing: a member-by-member inference
    keeps the fast path."""
    return _transform_safe_kernels(forward_mode=False) if torch.is_grad_enabled() else contextlib.nullcontext()


@contextlib.contextmanager
def _batchnorm_on_running_stats(module: nn.Module, on: bool):
    """BatchNorm layers in eval mode (normalising with their running statistics, which they do not update) for
    a batch of ONE row in training: it has no batch statistics (torch raises "Expected more than 1 value per
    channel when training" for a BatchNorm over features), and a one-row forget set is the commonest erasure
    request. The training loops fold a one-row last batch into the one before; a pool of one row has none."""
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training] if on else []
    for m in layers:
        m.training = False
    try:
        yield
    finally:
        for m in layers:
            m.training = True


def vmap_or_loop(fn: Callable, in_dims: tuple, vectorized: bool) -> Callable:
    """`vmap(fn, in_dims)`, or, for a module without batching rules (`Ensemble.vectorized` False: nn.LSTM,
    nn.GRU), the same map as a Python loop over the mapped dimension: the same numbers, slower. fn returns a
    tensor or a dict of tensors; the loop stacks them along a new leading dimension, as vmap does."""
    if vectorized:
        return vmap(fn, in_dims=in_dims)

    def looped(*args):
        n = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
        outs = [fn(*[a if d is None else a.select(d, i) for a, d in zip(args, in_dims)]) for i in range(n)]
        if isinstance(outs[0], dict):
            return {k: torch.stack([o[k] for o in outs]) for k in outs[0]}
        return torch.stack(outs)

    return looped


class Ensemble(nn.Module):
    """N members of one architecture. `parameters()` / `buffers()` are the stacked tensors [N, ...].

    A parameter keeps the module's own `requires_grad` (a frozen parameter stays frozen: training leaves it
    as built), and weights tied in the module (`b.weight = a.weight`) are ONE stacked tensor, tied again in
    every member's forward and in `module_of`."""

    def __init__(self, spec: dict, seeds: Sequence[int], *, builder: Callable[..., nn.Module] | None = None,
                 search_paths: Sequence[str | Path] = (), modules: Sequence[nn.Module] | None = None):
        super().__init__()
        self._spec = normalize_spec(spec)
        self.seeds = [int(s) for s in seeds]
        s = self._spec
        self._builder = builder or zoo.builder_for(s["arch"], s["factory"], search_paths)
        if modules is None:
            modules = [self._build_member(seed) for seed in self.seeds]
        elif len(modules) != len(self.seeds):
            raise ValueError(f"{len(modules)} modules for {len(self.seeds)} seeds")
        field = zoo.model_field(self._builder)
        self._called_linears = zoo.check_output_shape(modules[0], s["in_shape"], s["n_classes"], field)
        contract.check_hooks(modules[0], field)
        if not any(p.requires_grad for p in modules[0].parameters()):  # a bare StopIteration or autograd error later
            raise zoo.ModelError(f"{field}: {type(modules[0]).__name__} has no trainable parameter (none at all, or "
                                 f"every one requires_grad=False); the oracles and shadows are trained from scratch "
                                 f"with it, and unlearning changes parameters: give it at least one trainable one")
        try:
            params, buffers = stack_module_state(list(modules))
        except RuntimeError as e:  # members of different classes, modes or requires_grad flags
            local = {type(m).__qualname__ for m in modules if "<locals>" in type(m).__qualname__}
            if local and len({type(m).__qualname__ for m in modules}) == 1:  # one class statement, run per call
                raise zoo.ModelError(f"{field}: the factory defines the class {local.pop()} inside itself, so every "
                                     f"call makes a new class and the members cannot be stacked as one "
                                     f"architecture; define the class at module level (the factory only "
                                     f"instantiates it)") from e
            raise zoo.ModelError(f"{field}: the members it builds differ in structure ({zoo.one_line(e)}); the "
                                 f"factory must build the same architecture for every seed") from e
        self._param_names = list(params)
        self._buffer_names = list(buffers)
        for name in self._param_names:
            # stack_module_state stacks requires_grad as the members declare it: keep it (frozen stays frozen)
            self.register_parameter(_key(name), nn.Parameter(params[name].detach().clone(),
                                                             requires_grad=params[name].requires_grad))
        for name in self._buffer_names:
            self.register_buffer(_key(name), buffers[name].detach().clone())
        self._trainable = {n: bool(params[n].requires_grad) for n in self._param_names}
        # The template the members are called through: no storage of its own (meta device), never registered
        # as a submodule, so it adds nothing to parameters() / state_dict(). `.to("meta")` gives every
        # parameter a new Parameter per module, which unties shared weights; functional_call maps every alias
        # of a tied tensor only while the template still shares it, so the ties are put back.
        self._ties = _alias_groups(modules[0])
        object.__setattr__(self, "_base", _tie(copy.deepcopy(modules[0]).to("meta"), self._ties))
        # A forward may write plain attributes on the module it runs on (`self.last_hidden = h`, the hook-based
        # torch.nn.utils.weight_norm's `weight`): on `_base` that leaves a BatchedTensor or a tensor holding a
        # graph, which deepcopy refuses. Copies are made from this template, which is never called.
        object.__setattr__(self, "_pristine", copy.deepcopy(self._base))
        # The feature layer is resolved when features are first needed (`feature_layer`): a module without
        # nn.Linear trains and serves; only the embedding partition needs it. A named one must exist now.
        self._feature_layer = s["feature_layer"] or None  # "" like null: the default, as before
        if self._feature_layer is not None and self._feature_layer not in dict(self._base.named_modules()):
            raise zoo.ModelError(
                f"train.model.feature_layer = {self._feature_layer!r} is not a layer of {type(self._base).__name__}; "
                f"layers: {[n for n, _ in self._base.named_modules() if n]}")
        self._rng_states: list[torch.Tensor] | None = None
        if self.n_models > 1:
            self._warn_if_identical(modules, params)
        key = (self._builder, json.dumps(s, sort_keys=True, default=str))
        if key not in _RANDOM_PROBES:  # one probe per architecture and process: every cached ensemble loads again
            plain = self.module_of(0)  # one copy for both checks (each check leaves its mode as it found it)
            self._on_plain_member(plain, contract.check_forward_writes)
            _RANDOM_PROBES[key] = self._probe_randomness()  # eval-mode draws are refused by their own message
            self._on_plain_member(plain, contract.check_per_sample_outputs)
        # nn.Dropout modules, and any other random draw in forward (F.dropout, torch.randn_like noise, nn.LSTM's
        # dropout between layers): such members run one by one, each on its own stream
        self.stochastic = _is_stochastic(self._base) or _RANDOM_PROBES[key]
        if key not in _VMAP_PROBES:
            _VMAP_PROBES[key] = self._probe_vmap()
        self.vectorized, self.vmap_error = _VMAP_PROBES[key]
        if not self.vectorized and key not in _LOOP_PROBES:  # the member-by-member path must then train
            self._refuse_if_backward_leaves_the_member()
            _LOOP_PROBES.add(key)
        self.eval()

    @property
    def feature_layer(self) -> str:
        """The layer whose INPUT is the penultimate feature: `train.model.feature_layer`, or by default the last
        nn.Linear the forward pass calls (ModelError, when first needed, for a module without one)."""
        if self._feature_layer is None:
            self._feature_layer = zoo.feature_layer_of(self._base, self._called_linears)
        return self._feature_layer

    def _warn_if_identical(self, modules: Sequence[nn.Module], params: dict[str, torch.Tensor]) -> None:
        """Members with different seeds but equal initial parameters: the factory ignores the pipeline's
        seeding (it calls torch.manual_seed itself, or returns one shared instance), so the N oracles / shadows
        would be N copies of one model and their spread, which the certificate measures, would be zero."""
        distinct = {}
        for k, seed in enumerate(self.seeds):
            distinct.setdefault(seed, k)
        members = list(distinct.values())
        if len(members) < 2 or not params:
            return
        same = [k for k in members[1:] if all(torch.equal(t[k], t[members[0]]) for t in params.values())]
        if not same or self._builder in _WARNED_IDENTICAL:
            return
        _WARNED_IDENTICAL.add(self._builder)
        shared = any(modules[k] is modules[members[0]] for k in same)
        cause = ("it returns one shared module instance on every call; build a new module in each call" if shared
                 else "it probably calls torch.manual_seed itself (or loads fixed weights); leave the seeding to "
                      "the pipeline, which seeds each member with torch.manual_seed(seed_k) before calling it")
        log.warning("%s: members with different seeds start identical (%d of %d equal member %d's initial "
                    "parameters): %s. The ensembles of oracles and shadows would be copies of one model",
                    zoo.model_field(self._builder), len(same), len(members), members[0], cause)

    def _on_plain_member(self, module: nn.Module, check) -> None:
        """Run a contract check (unlearning/models/contract.py) on `module`, a plain copy of member 0, on a forked
        generator: no member's stream or state moves."""
        p = next(iter(module.parameters()))
        devices = [p.device] if p.device.type == "cuda" else []
        with _GLOBAL_RNG, torch.random.fork_rng(devices=devices, device_type=p.device.type):
            check(module, self.in_shape, zoo.model_field(self._builder))

    def _probe_randomness(self) -> bool:
        """Does member 0's forward draw from torch's random generator, in train mode (allowed: the members then run
        one by one, as with nn.Dropout) or in eval mode (refused: oracles, KLoM and leverage compare eval outputs,
        which must be a function of the input)? Seen as a change of the generator's state, whatever op draws.
        On forked generators and copied buffers: no member's stream or state moves."""
        params, buffers = _member(*self._stacked(), 0)
        buffers = {n: t.clone() for n, t in buffers.items()}  # train mode writes BatchNorm's running statistics
        p = next(iter(params.values()), None)
        device = p.device if p is not None else torch.device("cpu")
        x = torch.zeros(2, *self.in_shape, dtype=p.dtype if p is not None and p.is_floating_point() else None,
                        device=device)
        devices = [device] if device.type == "cuda" else []
        draws = {}
        was_training = self._base.training
        try:
            with _GLOBAL_RNG, torch.random.fork_rng(devices=devices, device_type=device.type), torch.no_grad():
                for mode in (True, False):
                    self._base.train(mode)
                    before = _get_rng_state(device)
                    functional_call(self._base, (params, buffers), (x,))
                    draws[mode] = not torch.equal(before, _get_rng_state(device))
        finally:
            self._base.train(was_training)
        if draws[False]:
            raise zoo.ModelError(
                f"{zoo.model_field(self._builder)}: {type(self._base).__name__}'s forward draws random numbers in eval "
                f"mode; the oracles, KLoM and the leverage diagnostics compare eval-mode outputs, which must depend on "
                f"the input only. Make the randomness conditional on self.training (as nn.Dropout and "
                f"F.dropout(x, p, self.training) are)")
        return draws[True]

    def _probe_vmap(self) -> tuple[bool, str | None]:
        """Does the module run under vmap, forward and backward, in train and eval mode? Some modules do not
        (an op without a batching rule, `.item()` or data-dependent Python control flow in forward); their
        ensembles then run member by member: slower, same numbers. Probed on copies: no state changes."""
        params, buffers = self._stacked()
        k = min(2, self.n_models)
        p = {n: t[:k].detach().clone().requires_grad_(t.is_floating_point()) for n, t in params.items()}
        b = {n: t[:k].detach().clone() for n, t in buffers.items()}
        x = torch.zeros(2, *self.in_shape, dtype=next(iter(p.values())).dtype) if p else torch.zeros(2, *self.in_shape)

        def call(pp, bb, xx):
            return functional_call(self._base, (pp, bb), (xx,))

        was_training = self._base.training
        try:
            # a dropout probe draws: not from a member's stream; the kernels the vmapped forward runs on
            with _GLOBAL_RNG, torch.random.fork_rng(devices=[]), _transform_safe_kernels():
                self._probe_modes(call, p, b, x)
        except Exception as e:  # noqa: BLE001 - any failure under vmap means: run member by member
            log.warning("%s does not run under torch.func.vmap (%s: %s); its ensembles run member by member "
                        "(slower, same numbers)", type(self._base).__name__, type(e).__name__, str(e)[:200])
            return False, f"{type(e).__name__}: {e}"
        finally:
            self._base.train(was_training)
        return True, None

    def _refuse_if_backward_leaves_the_member(self) -> None:
        """One train-mode forward and backward of member 0, member by member as the loop path trains. A forward
        whose backward reads the module's tensors again (torch.utils.checkpoint recomputes its segment there)
        runs after functional_call has put the template's own tensors back: torch's error is then about the meta
        device. Other failures are left to training, which reports them with their context."""
        params, buffers = _member(*self._stacked(), 0)
        p = {n: t.detach().clone().requires_grad_(self._trainable[n]) for n, t in params.items()}
        b = {n: t.detach().clone() for n, t in buffers.items()}
        x = self._as_model_dtype(torch.zeros(2, *self.in_shape, device=next(iter(p.values())).device))
        was_training = self._base.training
        try:
            with _GLOBAL_RNG, torch.random.fork_rng(devices=[]), _if_differentiated():
                self._base.train(True)
                functional_call(self._base, (p, b), (x,)).sum().backward()
        except RuntimeError as e:
            if "meta" not in str(e):
                return
            raise zoo.ModelError(
                f"{zoo.model_field(self._builder)}: {type(self._base).__name__}'s backward reads the module's own "
                f"tensors after its forward returned (torch.utils.checkpoint does: it recomputes its segment in "
                f"backward; so does an autograd.Function that keeps the module rather than tensors); the pipeline runs "
                f"every member on stacked copies that exist only during the forward ({zoo.one_line(e, 120)}). "
                f"Remove activation checkpointing from the forward") from e
        finally:
            self._base.train(was_training)

    def _probe_modes(self, call, p, b, x) -> None:
        """Both ways the forward is mapped: one batch shared by every member (evaluation) and a batch per member
        (training, the methods): with a batched input, ops that query its layout (`x.is_contiguous(memory_format=
        ...)`) or branch on its values (`if x.max() > 1`) fail under vmap where a shared input did not."""
        k = next(iter(p.values())).shape[0]
        per_member = x.unsqueeze(0).expand(k, *x.shape).clone()
        for mode in (True, False):
            self._base.train(mode)
            for xs, x_dim in ((x, None), (per_member, 0)):
                out = vmap(call, in_dims=(0, 0, x_dim), randomness="different")(p, b, xs)
                if mode and any(t.requires_grad for t in p.values()):
                    out.sum().backward()

    # --- identity ------------------------------------------------------------------------------------
    def _build_member(self, seed: int) -> nn.Module:
        s = self._spec
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            return zoo.checked_module(self._builder, s["in_shape"], s["n_classes"], s["kwargs"])

    @property
    def arch(self) -> str:
        return self._spec["arch"]

    @property
    def n_models(self) -> int:
        return len(self.seeds)

    @property
    def n_classes(self) -> int:
        return self._spec["n_classes"]

    @property
    def in_shape(self) -> list[int]:
        return list(self._spec["in_shape"])

    @property
    def in_dim(self) -> int:
        """Flat feature width d of an input row."""
        n = 1
        for s in self._spec["in_shape"]:
            n *= s
        return n

    @property
    def module_class(self) -> str:
        return type(self._base).__name__

    def spec(self) -> dict:
        """Everything needed to rebuild the architecture (not the seeds, not the weights)."""
        return copy.deepcopy(self._spec)

    def linear_chain(self) -> list[str] | None:
        """The Linear layers of a ReLU MLP in order (fast paths), else None."""
        return zoo.linear_chain(self._base)

    # --- train / eval reach the template, which functional_call runs --------------------------------
    def train(self, mode: bool = True) -> "Ensemble":
        super().train(mode)
        self._base.train(mode)
        return self

    def trainable_mask(self) -> list[bool]:
        """Per parameter, in `parameters()` order: does the module train it (its own requires_grad)?"""
        return [self._trainable[n] for n in self._param_names]

    def restore_requires_grad(self) -> "Ensemble":
        """Set every parameter's requires_grad back to the module's own flag (after e.g. `frozen_copy`)."""
        for n in self._param_names:
            getattr(self, _key(n)).requires_grad_(self._trainable[n])
        return self

    def _stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params = {n: getattr(self, _key(n)) for n in self._param_names}
        buffers = {n: getattr(self, _key(n)) for n in self._buffer_names}
        return params, buffers

    def member_state(self, k: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Member k's parameters and buffers (views, no member dimension), keyed by the module's names."""
        return _member(*self._stacked(), k)

    def call_member(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    x: torch.Tensor) -> torch.Tensor:
        """The wrapped module on one member's state: flat x [B, d] -> [B, C] (attention on its math kernels:
        this call is differentiated in forward mode)."""
        with _transform_safe_kernels():
            return functional_call(self._base, (params, buffers),
                                   (self._as_model_dtype(x).reshape(x.shape[0], *self.in_shape),))

    def _template(self) -> nn.Module:
        """A fresh meta-device copy of the module, as built (deepcopy keeps the ties)."""
        return copy.deepcopy(self._pristine)

    def module_of(self, k: int) -> nn.Module:
        """A plain, standalone copy of member k (the team's own module class, with its weights, its tied
        weights tied and its frozen parameters frozen)."""
        p = next(self.parameters())
        module = _tie(self._template().to_empty(device=p.device).to(p.dtype), self._ties)
        params, buffers = self.member_state(k)
        # copied tensor by tensor, not by load_state_dict: that skips non-persistent buffers, which then
        # kept to_empty's uninitialised memory
        targets = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        with torch.no_grad():
            for name, t in {**params, **buffers}.items():
                targets[name].copy_(t)
        return module.train(self.training)

    # --- forward -------------------------------------------------------------------------------------
    def _as_model_dtype(self, x: torch.Tensor) -> torch.Tensor:
        """Floating inputs in the parameters' dtype: the data are float32, a team's module may be float64 (or
        bfloat16) throughout. Integer inputs (token ids) stay as they are."""
        p = next((t for t in self.parameters() if t.is_floating_point()), None)
        return x.to(p.dtype) if p is not None and x.is_floating_point() and x.dtype != p.dtype else x

    def _per_member(self, x: torch.Tensor) -> tuple[torch.Tensor, int | None]:
        x = self._as_model_dtype(x)
        if x.dim() == 2:
            return x.reshape(x.shape[0], *self.in_shape), None
        if x.dim() != 3:
            raise ValueError(f"ensemble input must be [B, d] or [N, B, d], got shape {list(x.shape)}")
        if x.shape[0] != self.n_models:
            raise ValueError(f"input has {x.shape[0]} member batches but the ensemble has {self.n_models} models")
        return x.reshape(x.shape[0], x.shape[1], *self.in_shape), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs, x_dim = self._per_member(x)
        one_row = xs.shape[0 if x_dim is None else 1] == 1
        with _batchnorm_on_running_stats(self._base, self.training and one_row):
            return self._forward(xs, x_dim)

    def _forward(self, xs: torch.Tensor, x_dim: int | None) -> torch.Tensor:
        params, buffers = self._stacked()
        if (self.training and self.stochastic) or not self.vectorized:
            with _if_differentiated():
                return self._forward_each(params, buffers, xs, x_dim)

        def call(p, b, xx):
            return functional_call(self._base, (p, b), (xx,))

        with _transform_safe_kernels():  # under vmap too: the fused kernels have no batching rule (a slow fallback)
            return vmap(call, in_dims=(0, 0, x_dim))(params, buffers, xs)

    def _forward_each(self, params: dict, buffers: dict, xs, x_dim) -> torch.Tensor:
        """Member by member, each with its own dropout generator (exact per-member randomness)."""
        device = xs.device
        if self._rng_states is None:
            self._rng_states = [torch.Generator(device=device).manual_seed(_rng_seed(s)).get_state()
                                for s in self.seeds]
        outs = []
        devices = [device] if device.type == "cuda" else []
        for k in range(self.n_models):
            with _GLOBAL_RNG, torch.random.fork_rng(devices=devices, device_type=device.type):
                _set_rng_state(device, self._rng_states[k])
                outs.append(functional_call(self._base, _member(params, buffers, k),
                                            (xs if x_dim is None else xs[k],)))
                self._rng_states[k] = _get_rng_state(device)
        return torch.stack(outs)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features [N, B, H]: the input of `feature_layer` (a forward hook), flattened."""
        xs, x_dim = self._per_member(x)
        params, buffers = self._stacked()
        layer = dict(self._base.named_modules())[self.feature_layer]

        def call(p, b, xx):
            store = []
            handle = layer.register_forward_hook(lambda _m, inputs, _o: store.append(inputs[0]))
            try:
                functional_call(self._base, (p, b), (xx,))
            finally:
                handle.remove()
            return store[-1].flatten(1)

        if not self.vectorized:
            return torch.stack([call(*_member(params, buffers, k), xs if x_dim is None else xs[k])
                                for k in range(self.n_models)])
        with _transform_safe_kernels():
            return vmap(call, in_dims=(0, 0, x_dim))(params, buffers, xs)

    # --- membership ---------------------------------------------------------------------------------
    def _like(self, seeds: Sequence[int], params: dict, buffers: dict) -> "Ensemble":
        out = copy.copy(self)  # shallow: share builder and spec; fresh module state below
        nn.Module.__init__(out)
        out._spec, out.seeds, out._builder = copy.deepcopy(self._spec), [int(s) for s in seeds], self._builder
        out._param_names, out._buffer_names = list(self._param_names), list(self._buffer_names)
        out._feature_layer, out._called_linears = self._feature_layer, list(self._called_linears)
        out._trainable, out._ties = dict(self._trainable), [list(g) for g in self._ties]
        out.stochastic, out._rng_states = self.stochastic, None
        out.vectorized, out.vmap_error = self.vectorized, self.vmap_error
        object.__setattr__(out, "_base", self._template())
        for n in out._param_names:
            out.register_parameter(_key(n), nn.Parameter(params[n], requires_grad=getattr(self, _key(n)).requires_grad))
        for n in out._buffer_names:
            out.register_buffer(_key(n), buffers[n])
        return out.train(self.training)

    def select(self, members: Sequence[int] | int) -> "Ensemble":
        """A new ensemble holding copies of the given members (parameters and buffers; an int gives one)."""
        idx = [members] if isinstance(members, int) else list(members)
        params, buffers = self._stacked()
        index = torch.tensor(idx, dtype=torch.long, device=next(self.parameters()).device)
        with torch.no_grad():
            return self._like([self.seeds[i] for i in idx],
                              {n: t.detach().index_select(0, index.to(t.device)).clone() for n, t in params.items()},
                              {n: t.detach().index_select(0, index.to(t.device)).clone() for n, t in buffers.items()})

    @staticmethod
    def concat(models: Sequence["Ensemble"]) -> "Ensemble":
        """Join ensembles of one architecture into a larger ensemble (parameters and buffers)."""
        first = models[0]
        states = [m._stacked() for m in models]
        with torch.no_grad():
            params = {n: torch.cat([s[0][n].detach() for s in states]) for n in first._param_names}
            buffers = {n: torch.cat([s[1][n].detach() for s in states]) for n in first._buffer_names}
        return first._like([s for m in models for s in m.seeds], params, buffers)

    def fresh(self, seeds: Sequence[int] | None = None) -> "Ensemble":
        """Newly initialised members of the same architecture (the retrain / oracle starting point)."""
        out = Ensemble(self._spec, self.seeds if seeds is None else seeds, builder=self._builder)
        p = next(self.parameters())
        return out.to(device=p.device, dtype=p.dtype)


def _alias_groups(module: nn.Module) -> list[list[str]]:
    """Names that share one tensor (tied weights, shared buffers), first name first (the name
    `named_parameters()` / `stack_module_state` keeps); only groups of two or more."""
    groups: dict[int, list[str]] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        if t is not None:
            groups.setdefault(id(t), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _tie(module: nn.Module, groups: list[list[str]]) -> nn.Module:
    """Make every alias in `groups` the same tensor as the group's first name again (in place)."""
    for first, *aliases in groups:
        owner, leaf = _split(module, first)
        tensor = owner._parameters.get(leaf) if leaf in owner._parameters else owner._buffers.get(leaf)
        for alias in aliases:
            sub, name = _split(module, alias)
            if name in sub._parameters:
                sub._parameters[name] = tensor
            else:
                sub._buffers[name] = tensor
    return module


def _split(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (module.get_submodule(path) if path else module), leaf


def _member(params: dict, buffers: dict, k: int) -> tuple[dict, dict]:
    """Member k's slices (views) of stacked parameters and buffers."""
    return {n: t[k] for n, t in params.items()}, {n: t[k] for n, t in buffers.items()}


def _get_rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def build_model(spec: dict, seeds: Sequence[int], search_paths: Sequence[str | Path] = ()) -> Ensemble:
    """An ensemble of the architecture in `spec` with one member per seed (see `normalize_spec`)."""
    return Ensemble(spec, seeds, search_paths=search_paths)


def from_modules(spec: dict, modules: Sequence[nn.Module], seeds: Sequence[int],
                 search_paths: Sequence[str | Path] = (), builder: Callable[..., nn.Module] | None = None) -> Ensemble:
    """Wrap existing modules (e.g. a team's own trained checkpoint) as an ensemble, one per seed."""
    return Ensemble(spec, seeds, modules=modules, search_paths=search_paths, builder=builder)
