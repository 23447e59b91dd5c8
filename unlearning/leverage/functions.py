"""Output functions f(theta, X) -> [b, C] of ONE model, with theta a flat parameter vector [p].

The leverage machinery (docs/design.md §4.1) only needs a model as a map from a flat parameter vector to
outputs, plus its per-sample Jacobians J_i = d f(x_i) / d theta [C, p] and Jacobian-vector products.
`StackedMemberFunction` wraps one member of any ensemble (`unlearning.models.Ensemble`) with `torch.func`;
`LinearFunction` is the ridge-regression special case f(x) = x . theta (J_i = x_i, closed form).
"""

from __future__ import annotations

import logging

import torch
from torch.func import functional_call, jacrev, jvp, vjp

from unlearning.devices import resolve_device  # noqa: F401  (re-exported: unlearning.leverage.resolve_device)
from unlearning.models import Ensemble, vmap_or_loop

log = logging.getLogger(__name__)


def _tensor_numel(output) -> int:
    """Elements of a layer's output: a tensor, or the tensors inside the tuple / list / dict a layer such as
    nn.LSTM (out, (h, c)) or nn.MultiheadAttention (out, weights) returns; anything else counts 0."""
    if isinstance(output, torch.Tensor):
        return output.numel()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return sum(_tensor_numel(o) for o in output)
    return 0


class OutputFunction:
    """f(theta [p], X [b, d]) -> outputs [b, C]; derivatives via torch.func unless overridden."""

    p: int
    n_outputs: int
    dtype: torch.dtype
    device: torch.device
    theta0: torch.Tensor  # [p] the parameters the function was built from
    vectorized: bool = True  # False for a module that does not run under vmap (nn.LSTM, nn.GRU): loop instead
    forward_mode: bool = True  # False once an op of the module turned out to have no forward-mode derivative
    # False once jacrev under a vmap over samples failed (torch 2.13's batching rule of F.prelu's backward)
    jacobians_vectorized: bool = True

    def _map(self, fn, in_dims: tuple, *args: torch.Tensor) -> torch.Tensor:
        return vmap_or_loop(fn, in_dims, self.vectorized)(*args)

    def outputs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _single(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # x [d] -> f(x) [C]
        return self.outputs(theta, x.unsqueeze(0))[0]

    def jacobians(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """Per-sample Jacobians [b, C, p]: reverse mode per output, vectorized over samples. Where an op's
        batching rule breaks under the two nested vmaps (nn.PReLU: "The size of tensor a must match"), a loop over
        the samples gives the same numbers (each sample's jacrev still vmaps over its C outputs)."""
        single = jacrev(self._single)
        if self.vectorized and self.jacobians_vectorized:
            try:
                return self._map(single, (None, 0), theta, X)
            except RuntimeError as e:
                log.warning("per-sample Jacobians do not run vectorized over samples (%s); looping over the "
                            "samples instead (slower, same numbers)", str(e)[:160])
                self.jacobians_vectorized = False  # for this function's life: the ops do not change
        return vmap_or_loop(single, (None, 0), False)(theta, X)

    def weighted_jacobians(self, theta: torch.Tensor, X: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
        """Per-sample left [b, r, C] times J [b, C, p] -> [b, r, p] (the Lambda-weighted rows)."""
        return torch.bmm(left, self.jacobians(theta, X))

    def jvp(self, theta: torch.Tensor, X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        """J V for all samples: V [p, m] -> [m, b, C] (forward mode, one pass per column, vectorized). A module
        with an op that has no forward-mode derivative (torch.nn.utils.parametrizations.weight_norm's
        `_weight_norm_interface`) gets the same product by reverse over reverse mode (`_jvp_by_double_vjp`)."""
        if self.forward_mode:
            f = lambda t: self.outputs(t, X)  # noqa: E731
            try:
                return self._map(lambda v: jvp(f, (theta,), (v,))[1], (0,), V.T.contiguous())
            except NotImplementedError as e:
                if "forward AD" not in str(e):
                    raise
                self.forward_mode = False  # for the rest of this function's life: the ops do not change
        return self._jvp_by_double_vjp(theta, X, V)

    def _jvp_by_double_vjp(self, theta: torch.Tensor, X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        """J V without forward mode: u -> J^T u is linear, so its own vjp with cotangent v is (J^T)^T v = J v.
        Two reverse passes per column instead of one forward pass."""
        out, pull = vjp(lambda t: self.outputs(t, X), theta)                # out [b, C]
        _, pull_back = vjp(lambda u: pull(u)[0], torch.zeros_like(out))     # u [b, C] -> J^T u [p]
        return self._map(lambda v: pull_back(v)[0], (0,), V.T.contiguous())  # each [b, C]

    def vjp(self, theta: torch.Tensor, X: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        """J^T U summed over samples: U [m, b, C] -> [m, p]."""
        _, pull = vjp(lambda t: self.outputs(t, X), theta)
        return self._map(lambda u: pull(u)[0], (0,), U)

    def cast(self, X: torch.Tensor) -> torch.Tensor:
        return X.to(device=self.device, dtype=self.dtype)

    def activation_size(self) -> int:
        """Rough number of intermediate values per sample (sizes the row chunks of multi-column products)."""
        return int(self.p ** 0.5) + self.n_outputs


class StackedMemberFunction(OutputFunction):
    """Member `member` of an ensemble as a function of its own flat parameters (any module).

    A private single-member copy (`model.select(member)`) in `dtype` on `device`, in eval mode (BatchNorm
    uses its running statistics, dropout is off), is used, so the caller's model is never touched. theta
    holds the TRAINABLE parameters only (`model.trainable_mask()`): a frozen parameter (the module's own
    requires_grad=False, e.g. a pretrained backbone) is a constant of f, like a buffer, because neither
    training nor a retrain moves it; so the GGN, the leverage and a Newton step live in the trainable
    coordinates. Flat order = `model.parameters()` order of the trainable parameters, each without its
    leading member dimension. For ReLU MLPs (`Ensemble.linear_chain()`) with every parameter trainable the
    Jacobian products have closed forms (plain batched matmuls, no torch.func overhead per call)."""

    def __init__(self, model: Ensemble, member: int = 0, *, dtype: torch.dtype = torch.float64,
                 device: str | torch.device | None = None):
        if not 0 <= member < model.n_models:
            raise ValueError(f"member={member} is out of range for an ensemble of {model.n_models} models")
        self.device = resolve_device(device if device is not None else next(model.parameters()).device)
        self.dtype = dtype
        self.module = model.select(member).to(device=self.device, dtype=dtype).eval()
        self.vectorized = self.module.vectorized
        params, buffers = self.module.member_state(0)
        self.trainable = model.trainable_mask()  # per parameter, in parameters() order
        trainable = dict(zip(params, self.trainable))
        if not any(self.trainable):
            raise ValueError("the model has no trainable parameter (every parameter has requires_grad=False): "
                             "leverage and Newton steps need at least one")
        self.names = [n for n in params if trainable[n]]
        self.shapes = [tuple(params[n].shape) for n in self.names]  # without the member dimension
        self.sizes = [params[n].numel() for n in self.names]
        # frozen parameters enter f as constants (like the buffers)
        self.constants = {**{n: b.detach() for n, b in buffers.items()},
                          **{n: p.detach() for n, p in params.items() if not trainable[n]}}
        self.p = sum(self.sizes)
        self.theta0 = torch.cat([params[n].detach().reshape(-1) for n in self.names]).clone()
        # the closed forms differentiate every Linear of the chain: only when nothing is frozen
        self.chain = self.module.linear_chain() if all(self.trainable) else None
        # one forward pass on a zero sample: output width, and every layer's output size (activation_size)
        sizes: list[int] = []
        hooks = [mod.register_forward_hook(lambda _m, _i, o: sizes.append(_tensor_numel(o)))
                 for mod in self.module._base.modules() if not list(mod.children())]
        try:
            with torch.no_grad():
                out = self.outputs(self.theta0, torch.zeros(1, model.in_dim, device=self.device, dtype=dtype))
            self.n_outputs = int(out.shape[-1])
        finally:
            for h in hooks:
                h.remove()
        self._activation_size = max(1, sum(sizes))

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.view(s) for n, t, s in zip(self.names, torch.split(theta, self.sizes), self.shapes)}

    def activation_size(self) -> int:
        return self._activation_size

    def outputs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return self.module.call_member(self.unflatten(theta), self.constants, X)  # [b, C]

    # --- closed forms for ReLU MLPs -------------------------------------------------------------------
    def _layers(self, theta: torch.Tensor) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(name, W [in, out], c [out]) per Linear of the chain (nn.Linear stores W^T [out, in])."""
        P = self.unflatten(theta)
        return [(n, P[f"{n}.weight"].T, P[f"{n}.bias"]) for n in self.chain]

    def weighted_jacobians(self, theta: torch.Tensor, X: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
        if self.chain is None:
            return super().weighted_jacobians(theta, X, left)
        return _mlp_weighted_jacobians(self._layers(theta), self.names, self.sizes, X, left)

    def jvp(self, theta: torch.Tensor, X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        if self.chain is None:
            return super().jvp(theta, X, V)
        return _mlp_jvp(self._layers(theta), self._split_columns(V), X)

    def vjp(self, theta: torch.Tensor, X: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        if self.chain is None:
            return super().vjp(theta, X, U)
        grads = _mlp_vjp(self._layers(theta), X, U)
        return torch.cat([grads[n].reshape(U.shape[0], -1) for n in self.names], 1)

    def _split_columns(self, V: torch.Tensor) -> dict[str, torch.Tensor]:
        # V [p, m] -> per parameter [m, *shape]
        m = V.shape[1]
        return {n: v.T.reshape(m, *s) for n, v, s in zip(self.names, torch.split(V, self.sizes), self.shapes)}

    def write_into(self, model: Ensemble, member: int, theta: torch.Tensor) -> None:
        """Copy a flat (trainable) parameter vector into member `member` of `model` (in the model's
        dtype/device); frozen parameters are left as they are."""
        trainable = [p for p, t in zip(model.parameters(), model.trainable_mask()) if t]
        with torch.no_grad():
            for p, t in zip(trainable, torch.split(theta, self.sizes), strict=True):
                p[member].copy_(t.view(p.shape[1:]).to(device=p.device, dtype=p.dtype))


class LinearFunction(OutputFunction):
    """f(x) = x . theta, one output (ridge regression): J_i = x_i, so everything is in closed form."""

    def __init__(self, theta: torch.Tensor):
        self.theta0 = theta.detach().clone()
        self.p, self.n_outputs = theta.numel(), 1
        self.dtype, self.device = theta.dtype, theta.device

    def outputs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return (X @ theta).unsqueeze(1)

    def jacobians(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return X.unsqueeze(1).clone()

    def jvp(self, theta: torch.Tensor, X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        return (X @ V).T.unsqueeze(2)

    def vjp(self, theta: torch.Tensor, X: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        return U[:, :, 0] @ X


def _shared_times_batched(a: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """a [r, k] times each B[j] [k, o] -> [m, r, o] as ONE matmul (broadcasting matmul would first copy a
    m times, which dominates for many columns)."""
    m, k, o = B.shape
    return (a @ B.permute(1, 0, 2).reshape(k, m * o)).reshape(a.shape[0], m, o).permute(1, 0, 2)


Layers = list[tuple[str, torch.Tensor, torch.Tensor]]  # (name, W [in, out], c [out]) per Linear, in order


def _mlp_jvp(layers: Layers, tangents: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
    """J V for m tangent columns by forward propagation: z = a W + c gives dz = da W + a dW + dc;
    ReLU passes dz where z > 0. tangents: name -> [m, *parameter shape] (nn.Linear: weight [out, in]);
    returns [m, b, C]."""
    a, da = X, None
    for i, (name, W, c) in enumerate(layers):
        dW = tangents[f"{name}.weight"].transpose(1, 2)                            # [m, in, out]
        dc = tangents[f"{name}.bias"].unsqueeze(1)                                 # [m, 1, out]
        dz = _shared_times_batched(a, dW) + dc                                   # [m, b, out]
        if da is not None:
            dz = dz + da @ W
        z = a @ W + c
        if i == len(layers) - 1:
            return dz
        mask = (z > 0).to(z.dtype)
        a, da = torch.relu(z), dz * mask
    raise AssertionError("unreachable")


def _mlp_vjp(layers: Layers, X: torch.Tensor, U: torch.Tensor) -> dict[str, torch.Tensor]:
    """J^T u summed over samples for m cotangents U [m, b, C] by backpropagation;
    name -> [m, *parameter shape] (nn.Linear: weight [out, in], bias [out])."""
    acts, masks, a = [X], [], X
    for name, W, c in layers[:-1]:
        z = a @ W + c
        masks.append((z > 0).to(z.dtype))
        a = torch.relu(z)
        acts.append(a)
    grads: dict[str, torch.Tensor] = {}
    delta = U                                                                     # [m, b, out]
    for i in range(len(layers) - 1, -1, -1):
        name, W, _ = layers[i]
        grads[f"{name}.weight"] = _shared_times_batched(acts[i].T, delta).transpose(1, 2)  # [m, out, in]
        grads[f"{name}.bias"] = delta.sum(1)                                      # [m, out]
        if i > 0:
            delta = (delta @ W.T) * masks[i - 1]
    return grads


def _mlp_weighted_jacobians(layers: Layers, names: list[str], sizes: list[int], X: torch.Tensor,
                            left: torch.Tensor) -> torch.Tensor:
    """left_i J_i for one ReLU MLP member, by backpropagating the r rows of left [b, r, C] by hand.

    Layer z = a W + c, stored as nn.Linear's weight W^T [out, in] (row-major) and bias c [out]:
    d(left z)/dW^T = delta (x) a with delta the back-propagated rows [b, r, out]; ReLU passes delta
    where z > 0 (torch's convention at 0)."""
    b, r, _ = left.shape
    acts, pre = [X], []
    h = X
    for _, W, c in layers[:-1]:
        z = h @ W + c
        pre.append(z)
        h = torch.relu(z)
        acts.append(h)
    out = torch.empty(b, r, sum(sizes), dtype=X.dtype, device=X.device)
    offsets = dict(zip(names, torch.cumsum(torch.tensor([0, *sizes]), 0).tolist()))
    delta = left  # [b, r, out] of the current layer
    for l in range(len(layers) - 1, -1, -1):
        name, W, _ = layers[l]
        a = acts[l]                                       # a [b, in]
        wo, bo = offsets[f"{name}.weight"], offsets[f"{name}.bias"]
        n_in, n_out = a.shape[1], delta.shape[2]
        # written in place (mul with out=): a temporary plus copy is ~4x slower on CPU
        block = out[:, :, wo:wo + n_out * n_in].view(b, r, n_out, n_in)
        torch.mul(delta[:, :, :, None], a[:, None, None, :], out=block)
        out[:, :, bo:bo + n_out] = delta
        if l > 0:
            delta = (delta @ W.T) * (pre[l - 1] > 0).to(X.dtype)[:, None, :]
    return out
