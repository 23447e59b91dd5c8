"""Team-style model factories for the tests (`train.model.arch: custom`, factory "custom_modules:<fn>").

Importable with `search_paths=[<tests/unit>]` (the factory import puts the folder on sys.path)."""

from __future__ import annotations

import math

import torch
from torch import nn


def bn_mlp(in_shape, n_classes, hidden: int = 8):
    """Linear (no bias: BatchNorm follows) -> BatchNorm1d -> ReLU -> Linear: stacked buffers, no randomness."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(), nn.Linear(hidden, n_classes))


def bn_dropout_mlp(in_shape, n_classes, hidden: int = 8, p: float = 0.3):
    """Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear: buffers AND per-member randomness."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, n_classes))


class Tied(nn.Module):
    """Linear -> tanh -> Linear whose weight IS the first one's (tied, square), plus a head."""

    def __init__(self, d: int, n_classes: int):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
        self.b.weight = self.a.weight  # one tensor, two names
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x.flatten(1))))))


def tied(in_shape, n_classes):
    return Tied(math.prod(in_shape), n_classes)


def frozen_first(in_shape, n_classes, hidden: int = 4):
    """A frozen feature layer (requires_grad=False, e.g. pretrained) under a trained head."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden), nn.Tanh(), nn.Linear(hidden, n_classes))
    net[1].requires_grad_(False)
    return net


class NoLinear(nn.Module):
    """Logits from a raw parameter matmul: no nn.Linear anywhere (an Identity layer to name as feature layer)."""

    def __init__(self, d: int, n_classes: int):
        super().__init__()
        self.pre = nn.Identity()
        self.w = nn.Parameter(torch.randn(d, n_classes) * 0.1)

    def forward(self, x):
        return self.pre(x.flatten(1)) @ self.w


def no_linear(in_shape, n_classes):
    return NoLinear(math.prod(in_shape), n_classes)


class HeadFirst(nn.Module):
    """Registers its head BEFORE its body: the last Linear registered (body) is not the last one called (head)."""

    def __init__(self, d: int, n_classes: int, hidden: int = 4):
        super().__init__()
        self.head = nn.Linear(hidden, n_classes)
        self.body = nn.Linear(d, hidden)

    def forward(self, x):
        return self.head(torch.relu(self.body(x.flatten(1))))


def head_first(in_shape, n_classes):
    return HeadFirst(math.prod(in_shape), n_classes)


class ReturnsTuple(nn.Module):
    def __init__(self, d, n_classes, as_dict=False):
        super().__init__()
        self.lin, self.as_dict = nn.Linear(d, n_classes), as_dict

    def forward(self, x):
        z = self.lin(x.flatten(1))
        return {"logits": z, "features": x} if self.as_dict else (z, x)


def returns_tuple(in_shape, n_classes):
    return ReturnsTuple(math.prod(in_shape), n_classes)


def returns_dict(in_shape, n_classes):
    return ReturnsTuple(math.prod(in_shape), n_classes, as_dict=True)


def ignores_n_classes(in_shape, n_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), 10))  # hard-coded width


def raises_runtime_error(in_shape, n_classes):
    raise RuntimeError("CUDA is required for this model")


def raises_key_error(in_shape, n_classes, **kwargs):
    return nn.Linear(math.prod(in_shape), kwargs["width"])


def seeds_itself(in_shape, n_classes):
    """Calls torch.manual_seed itself: every member starts from the same weights."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), n_classes))


_SHARED: dict = {}


def shared_instance(in_shape, n_classes):
    """Returns one module for every call: every member starts from the same weights."""
    if "m" not in _SHARED:
        _SHARED["m"] = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), n_classes))
    return _SHARED["m"]


class SequenceRNN(nn.Module):
    """The features read as a sequence of 2-wide steps by an nn.LSTM / nn.GRU (a leaf returning a tuple)."""

    def __init__(self, in_shape, n_classes, cell: str = "lstm", hidden: int = 5):
        super().__init__()
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(2, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        out, _ = self.rnn(x.flatten(1).reshape(x.shape[0], -1, 2))
        return self.head(out[:, -1])


def lstm(in_shape, n_classes):
    return SequenceRNN(in_shape, n_classes, "lstm")


def gru(in_shape, n_classes):
    return SequenceRNN(in_shape, n_classes, "gru")


class Attention(nn.Module):
    """A TransformerEncoderLayer over 2-wide feature tokens (eval mode takes PyTorch's fused fast path)."""

    def __init__(self, in_shape, n_classes, width: int = 4):
        super().__init__()
        self.embed = nn.Linear(2, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, dim_feedforward=6, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        tokens = self.embed(x.flatten(1).reshape(x.shape[0], -1, 2))
        return self.head(self.layer(tokens).mean(1))


def attention(in_shape, n_classes):
    return Attention(in_shape, n_classes)


class ScaledByBuffer(nn.Module):
    """A non-persistent buffer (not in state_dict) that the forward reads."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.register_buffer("scale", torch.full((in_shape[0],), 0.5), persistent=False)
        self.lin = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.lin(x * self.scale)


def scaled_by_buffer(in_shape, n_classes):
    return ScaledByBuffer(in_shape, n_classes)


class MixedDtype(nn.Module):
    """A float64 parameter beside float32 ones."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(in_shape[0], n_classes, dtype=torch.float64))
        self.lin = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.lin(x) + (x.double() @ self.w).to(x.dtype)


def mixed_dtype(in_shape, n_classes):
    return MixedDtype(in_shape, n_classes)


class FunctionalDropout(nn.Module):
    """Dropout as a function call (F.dropout), no nn.Dropout module to find."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.hidden = nn.Linear(in_shape[0], 8)
        self.head = nn.Linear(8, n_classes)

    def forward(self, x):
        return self.head(nn.functional.dropout(torch.relu(self.hidden(x)), 0.3, self.training))


def functional_dropout(in_shape, n_classes):
    return FunctionalDropout(in_shape, n_classes)


class InputNoise(nn.Module):
    """Gaussian input noise while training (torch.randn_like): a random op that is no module at all."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.lin = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.lin(x + 0.1 * torch.randn_like(x) if self.training else x)


def input_noise(in_shape, n_classes):
    return InputNoise(in_shape, n_classes)


class NoisyInEval(nn.Module):
    """Noise in every mode: an eval forward that is not a function of its input."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.lin = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.lin(x + 0.1 * torch.randn_like(x))


def noisy_in_eval(in_shape, n_classes):
    return NoisyInEval(in_shape, n_classes)


def all_float64(in_shape, n_classes):
    """Every parameter float64 (a team that trains in double precision)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0], 8), nn.ReLU(), nn.Linear(8, n_classes)).double()


def weight_norm(in_shape, n_classes):
    """torch.nn.utils.parametrizations.weight_norm: its kernel has no forward-mode derivative."""
    from torch.nn.utils import parametrizations

    return nn.Sequential(parametrizations.weight_norm(nn.Linear(in_shape[0], 8)), nn.Tanh(), nn.Linear(8, n_classes))


def scripted_head(in_shape, n_classes):
    """A TorchScript submodule (torch.jit.script) inside a plain module."""
    return nn.Sequential(nn.Linear(in_shape[0], 8), nn.ReLU(), torch.jit.script(nn.Linear(8, n_classes)))


class UnusedHead(nn.Module):
    """An auxiliary head the forward never calls (a leftover of multi-task training)."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)
        self.aux = nn.Linear(in_shape[0], 2)

    def forward(self, x):
        return self.fc(x)


def unused_head(in_shape, n_classes):
    return UnusedHead(in_shape, n_classes)


class NoParameters(nn.Module):
    """Logits from a fixed slice of the input: nothing to train."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.n_classes = n_classes

    def forward(self, x):
        return x.flatten(1)[:, : self.n_classes]


def no_parameters(in_shape, n_classes):
    return NoParameters(in_shape, n_classes)


def all_frozen(in_shape, n_classes):
    return nn.Linear(in_shape[0], n_classes).requires_grad_(False)


class StoresActivation(nn.Module):
    """Keeps its last hidden activation as a plain attribute (for inspection): a common pattern."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], 5)
        self.out = nn.Linear(5, n_classes)
        self.last_hidden = None

    def forward(self, x):
        h = torch.relu(self.fc(x.flatten(1)))
        self.last_hidden = h
        return self.out(h)


def stores_activation(in_shape, n_classes):
    return StoresActivation(in_shape, n_classes)


def old_weight_norm(in_shape, n_classes):
    """The hook-based torch.nn.utils.weight_norm: a pre-hook sets `weight` as a plain attribute in each forward."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of parametrizations.weight_norm
        wn = torch.nn.utils.weight_norm(nn.Linear(in_shape[0], 5))
    return nn.Sequential(wn, nn.Tanh(), nn.Linear(5, n_classes))


class ReassignedBuffer(nn.Module):
    """A running mean kept by REASSIGNING its buffer in train mode (`self.mu = ...`), not in place."""

    def __init__(self, in_shape, n_classes, in_place=False):
        super().__init__()
        self.register_buffer("mu", torch.zeros(in_shape[0]))
        self.fc = nn.Linear(in_shape[0], n_classes)
        self.in_place = in_place

    def forward(self, x):
        if self.training:
            if self.in_place:
                self.mu.mul_(0.9).add_(0.1 * x.mean(0).detach())
            else:
                self.mu = 0.9 * self.mu + 0.1 * x.mean(0).detach()
        return self.fc(x - self.mu)


def reassigned_buffer(in_shape, n_classes):
    return ReassignedBuffer(in_shape, n_classes)


def in_place_buffer(in_shape, n_classes):
    return ReassignedBuffer(in_shape, n_classes, in_place=True)


class Hooked(nn.Module):
    """`fc` followed by a learned per-class scale, applied by a hook registered in one of several ways."""

    def __init__(self, in_shape, n_classes, how="module_arg"):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)
        self.scale = nn.Parameter(torch.full((n_classes,), 3.0))
        self.seen = []
        scale = self.scale
        if how == "module_arg":  # works: the hook's module argument is the member's template
            self.register_forward_hook(lambda m, i, o: o * m.scale)
        elif how == "bound":     # works: deepcopy binds the method to the copy
            self.fc.register_forward_hook(self._scale)
        elif how == "records":   # works: the closure holds self but reads no tensor through it
            self.fc.register_forward_hook(lambda m, i, o: self.seen.append(o.shape))
        elif how == "tensor_closure":
            self.fc.register_forward_hook(lambda m, i, o: o * scale)
        elif how == "self_closure":
            self.fc.register_forward_hook(lambda m, i, o: o * self.scale)
        elif how == "backward":
            self.fc.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.0,))
        elif how == "tensor_grad":
            self.fc.weight.register_hook(lambda g: g * 0.0)

    def _scale(self, m, i, o):
        return o * self.scale

    def forward(self, x):
        return self.fc(x)


def hooked(in_shape, n_classes, how="module_arg"):
    return Hooked(in_shape, n_classes, how)


def lazy(in_shape, n_classes):
    return nn.Sequential(nn.LazyLinear(5), nn.Tanh(), nn.Linear(5, n_classes))


def uninitialised(in_shape, n_classes):
    """skip_init without reset_parameters keeps whatever memory held: garbage like this, or zeros."""
    fc = torch.nn.utils.skip_init(nn.Linear, in_shape[0], n_classes)
    with torch.no_grad():
        fc.weight.fill_(3e34)
    return fc


class Checkpointed(nn.Module):
    """Activation checkpointing: the hidden layer is recomputed in backward."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], 5)
        self.out = nn.Linear(5, n_classes)

    def forward(self, x):
        import torch.utils.checkpoint as cp

        return self.out(cp.checkpoint(lambda t: torch.tanh(self.fc(t)), x, use_reentrant=False))


def checkpointed(in_shape, n_classes):
    return Checkpointed(in_shape, n_classes)


class MaxNormEmbedding(nn.Module):
    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.emb = nn.Embedding(10, 2, max_norm=0.5)
        self.out = nn.Linear(2 * in_shape[0], n_classes)

    def forward(self, x):
        return self.out(self.emb(x.abs().long().clamp(max=9)).flatten(1))


def max_norm_embedding(in_shape, n_classes):
    return MaxNormEmbedding(in_shape, n_classes)


def prelu(in_shape, n_classes):
    return nn.Sequential(nn.Linear(in_shape[0], 5), nn.PReLU(5), nn.Linear(5, n_classes))


def class_inside(in_shape, n_classes):
    class Net(nn.Module):  # a new class object on every call
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(in_shape[0], n_classes)

        def forward(self, x):
            return self.fc(x)

    return Net()


class BatchSizeBranch(nn.Module):
    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.fc(x) * (1.0 if x.shape[0] > 1 else 2.0)  # a single row is scaled: not a per-sample map


def batch_size_branch(in_shape, n_classes):
    return BatchSizeBranch(in_shape, n_classes)


class Squeezed(nn.Module):
    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.fc(x.unsqueeze(-1).mean(-1, keepdim=True).transpose(1, 2)).squeeze()  # [1, C] -> [C]


def squeezed(in_shape, n_classes):
    return Squeezed(in_shape, n_classes)


class NormalisesInPlace(nn.Module):
    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        return self.fc(x.sub_(0.5).mul_(2.0))  # per-sample, but it rewrites its input


def normalises_in_place(in_shape, n_classes):
    return NormalisesInPlace(in_shape, n_classes)


class Autocast(nn.Module):
    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.fc(x)


def autocast(in_shape, n_classes):
    return Autocast(in_shape, n_classes)


class ScalesIfNeeded(nn.Module):
    """Branches on the input's values: under vmap that works for a shared input, not for a batched one."""

    def __init__(self, in_shape, n_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0], n_classes)

    def forward(self, x):
        if x.max() > 1:
            x = x / 255
        return self.fc(x)


def scales_if_needed(in_shape, n_classes):
    return ScalesIfNeeded(in_shape, n_classes)


def batch_stats_only(in_shape, n_classes):
    return nn.Sequential(nn.Linear(in_shape[0], 5), nn.BatchNorm1d(5, track_running_stats=False), nn.ReLU(),
                         nn.Linear(5, n_classes))
