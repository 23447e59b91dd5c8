"""Deterministic minibatch training of ensembles, with the declared training recipe.

Every member has its own data order, drawn from its own seed, so training N members in one pass
gives the same members as N separate runs (up to float summation order). The recipe (optimizer,
lr schedule, weight decay, epochs, batch size, label smoothing) is the one the originals, the oracles
and the shadows all train with.
"""

from __future__ import annotations

import math
import pickle
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

import torch

from unlearning.models import fused_mlp
from unlearning.models.ensemble import Ensemble
from unlearning.models.losses import cross_entropy  # callers import it from here too
from unlearning.models.zoo import ModelError, one_line
from unlearning.progress import Progress, tick

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class TrainRecipe:
    """How the originals were trained; `retrain`, the oracles and the shadows use the same recipe.

    optimizer: "adamw" (decoupled weight decay) or "sgd" (with `momentum`, L2 weight decay);
    schedule: "constant" or "cosine" (lr * (1 + cos(pi * step / total)) / 2 per optimizer step)."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    momentum: float = 0.9
    schedule: str = "constant"
    label_smoothing: float = 0.0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"train.optimizer = {self.optimizer!r} is not known; allowed: {list(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule = {self.schedule!r} is not known; allowed: {list(SCHEDULES)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing = {self.label_smoothing!r} must be in [0, 1)")

    def lr_at(self, step: int, total_steps: int) -> float:
        if self.schedule == "cosine" and total_steps > 0:
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
        return self.lr


class TrainingDiverged(ModelError):
    """The declared recipe drove the loss or the weights to inf / NaN: the recipe is the team's input
    (train.lr, train.optimizer, ...), so this is bad input (exit code 2, one line) and nothing is registered
    or cached."""


def order_generator(seed: int) -> torch.Generator:
    """The data-order stream of a member: independent of its initialisation stream."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + 17) % (2**63))


@dataclass
class TrainCost:
    """Compute a training run spent: gradient evaluations are per-sample, summed over members."""

    epochs: int
    steps: int
    gradient_evals: int
    seconds: float


TRAIN_THREADS = 1  # intra-op threads of every training run (and of the planner's probe, which times the same steps)


class intra_op_threads:
    """Temporarily set torch's intra-op thread count (process-wide, reference-counted across threads).

    Ensemble steps are many small ops: with 2 intra-op threads on a 2-core machine they spin and wait
    (measured 4 ms/step with 1 thread vs 30-120 ms with 2 when another process shares the cores), so
    training runs single-threaded and scales out across chunks (concurrent tasks) instead."""

    _lock = threading.Lock()
    _depth = 0
    _saved: int | None = None

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        if self.n is not None:
            with intra_op_threads._lock:
                if intra_op_threads._depth == 0:
                    intra_op_threads._saved = torch.get_num_threads()
                    torch.set_num_threads(self.n)
                intra_op_threads._depth += 1
        return self

    def __exit__(self, *exc):
        if self.n is not None:
            with intra_op_threads._lock:
                intra_op_threads._depth -= 1
                if intra_op_threads._depth == 0:
                    torch.set_num_threads(intra_op_threads._saved)
        return False


def per_member_loss(model: Ensemble, x: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy of each member on its own batch: x [N, B, d], y [N, B] -> [N]."""
    return cross_entropy(model(x), y, label_smoothing).mean(1)


def train_ensemble(
    model: Ensemble,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
    optimizer: str = "adamw",
    momentum: float = 0.9,
    schedule: str = "constant",
    label_smoothing: float = 0.0,
    progress: bool | str = False,
    threads: int | None = TRAIN_THREADS,
    kernel: str = "auto",
    rows: torch.Tensor | None = None,
    order_seeds: Sequence[int] | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainCost:
    """Train every member of `model` in place on (X [n, d], y [n]) with the recipe given by the keywords.

    Member k shuffles with `order_generator(model.seeds[k])`; the ensemble loss is the sum of the members'
    mean losses, so members never interact. `threads`: intra-op threads while training (None = as set).
    `kernel`: "fused" (hand-written forward/backward, `fused_mlp.py`; MLP ensembles), "autograd" (the
    generic torch.func path, any module), or "auto" (fused where supported). Both give the same members up
    to float summation order. With BatchNorm, a last minibatch of a single row joins the one before it
    (batch statistics of one row are undefined).

    `rows` [N, m] (long): per-member data, member k trains on X[rows[k]] (every member m rows; the sharded
    constituents of unlearning/sharding.py, each on its own shard); None = every member on all of X.
    `order_seeds`: the members' data-order streams (default: their seeds), so a slice of a sliced training run
    has an order stream of its own. `on_step`: called after every optimizer step (the planner's probe times
    each step with it: tasks/planning.py)."""
    recipe = TrainRecipe(epochs, batch_size, lr, weight_decay, optimizer, momentum, schedule, label_smoothing)
    if kernel not in ("auto", "fused", "autograd"):
        raise ValueError(f"kernel={kernel!r} is not known; allowed: ['auto', 'fused', 'autograd']")
    # the fused kernel updates one flat tensor of every parameter: frozen parameters need the generic path
    fused = kernel == "fused" or (kernel == "auto" and fused_mlp.supports(model) and all(model.trainable_mask()))
    if fused and not fused_mlp.supports(model):
        raise ValueError(f"kernel='fused' supports MLP ensembles only, got {model.module_class}; use 'autograd'")
    with intra_op_threads(threads if X.device.type == "cpu" else None), flush_denormals(X.device.type == "cpu"):
        return _train(model, X, y, recipe, progress, fused, rows, order_seeds, on_step)


def recipe_from(train_cfg) -> TrainRecipe:
    """The recipe of params.yaml's `train:` section (unlearning/config.py): the original, the oracles, the
    shadows and `retrain` all train with it."""
    t = train_cfg
    return TrainRecipe(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                       optimizer=t.optimizer, momentum=t.momentum, schedule=t.schedule,
                       label_smoothing=t.label_smoothing)


def fit(model: Ensemble, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe, **kwargs) -> TrainCost:
    """`train_ensemble` with a `TrainRecipe` (kwargs: progress, threads, kernel, epochs override)."""
    return train_ensemble(model, X, y, **{**asdict(recipe), **kwargs})


class flush_denormals:
    """Flush float denormals to zero on this thread while training on the CPU (the flag is per thread).

    Adam's second moment of near-zero gradients drifts into the denormal range, where CPU arithmetic is
    ~100x slower: measured, the AdamW step of a 100-member digits ensemble went from 0.27 ms to 2.2 ms
    within 600 steps. Values below 1.2e-38 become 0: no visible change to the trained members."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        if self.on:
            torch.set_flush_denormal(True)
        return self

    def __exit__(self, *exc):
        if self.on:
            torch.set_flush_denormal(False)
        return False


def batch_bounds(n: int, batch_size: int, merge_single: bool = False) -> list[tuple[int, int]]:
    """Minibatch [start, stop) ranges of one epoch; `merge_single` folds a last batch of one row into the
    previous batch (BatchNorm cannot normalise one row in train mode)."""
    bounds = [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if merge_single and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def has_batchnorm(model: Ensemble) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model._base.modules())


def make_optimizer(params: Iterable, recipe: TrainRecipe, fused_ok: bool = True) -> torch.optim.Optimizer:
    """The recipe's optimizer over `params` (fused kernels where torch has them)."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay, fused=fused_ok)


def _train(model: Ensemble, X, y, recipe: TrainRecipe, progress, fused, rows=None, order_seeds=None,
           on_step=None) -> TrainCost:
    start = time.perf_counter()
    device = next(model.parameters()).device
    X, y = X.to(device), y.to(device)
    if rows is not None and (rows.dim() != 2 or rows.shape[0] != model.n_models):
        raise ValueError(f"rows must be [n_models={model.n_models}, m] row indices, got shape {list(rows.shape)}")
    n = X.shape[0] if rows is None else rows.shape[1]
    seeds = model.seeds if order_seeds is None else list(order_seeds)
    if len(seeds) != model.n_models:
        raise ValueError(f"order_seeds has {len(seeds)} seeds for {model.n_models} members")
    gens = [order_generator(s) for s in seeds]
    member_rows = None if rows is None else rows.to(device=device, dtype=torch.long)
    kernel = fused_mlp.FusedMLP(model, recipe.label_smoothing) if fused else None
    # fused: one kernel per parameter tensor instead of ~10 elementwise passes (CPU and CUDA); with the
    # fused MLP kernel all parameters are one flat tensor, so one kernel per step and no optimizer wrapper.
    if fused and recipe.optimizer == "adamw":
        opt = fused_mlp.FlatAdamW(kernel.theta, lr=recipe.lr, weight_decay=recipe.weight_decay)
    else:
        opt = make_optimizer([kernel.theta] if fused else model.parameters(), recipe)
    bounds = batch_bounds(n, recipe.batch_size, merge_single=has_batchnorm(model))
    total_steps, steps = recipe.epochs * len(bounds), 0
    desc = progress if isinstance(progress, str) else f"train x{model.n_models}"
    model.train()
    with Progress(total_steps, desc, unit="steps", enabled=bool(progress)) as bar:
        for epoch in range(recipe.epochs):
            # the epoch's per-member loss sum, on the device: one finiteness check (one sync) per epoch
            epoch_loss = torch.zeros(model.n_models, device=device) if kernel is None else None
            perms = torch.stack([torch.randperm(n, generator=g) for g in gens]).to(device)  # [N, n]
            if member_rows is not None:  # member k's order over its own rows, as indices into X
                perms = member_rows.gather(1, perms)
            for lo, hi in bounds:
                if recipe.schedule != "constant":
                    _set_lr(opt, recipe.lr_at(steps, total_steps))
                idx = perms[:, lo:hi]  # [N, b]
                flat = idx.reshape(-1)
                yb = y.index_select(0, flat).view(idx.shape)
                if kernel is not None:
                    kernel.loss_and_grad(kernel.gather(X, flat, model.n_models), yb)  # overwrites theta.grad
                else:
                    xb = X.index_select(0, flat).view(*idx.shape, -1)  # [N, b, d]; faster than X[idx]
                    member_loss = per_member_loss(model, xb, yb, recipe.label_smoothing)
                    epoch_loss += member_loss.detach()
                    opt.zero_grad(set_to_none=True)
                    member_loss.sum().backward()
                opt.step()
                steps += 1
                bar.update()
                if on_step is not None:
                    on_step()
            _stop_if_diverged(model, kernel, epoch_loss, epoch, recipe)
    if kernel is not None:
        kernel.write_back(model)
    model.eval()
    return TrainCost(epochs=recipe.epochs, steps=steps, gradient_evals=recipe.epochs * n * model.n_models,
                     seconds=time.perf_counter() - start)


def nonfinite_members(model: Ensemble, losses: torch.Tensor | None = None) -> list[int]:
    """The members whose parameters, floating buffers (BatchNorm statistics) or `losses` [N] hold inf or NaN."""
    n = model.n_models
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point() and t.numel()]
    if not tensors and losses is None:
        return []
    flags = [~torch.isfinite(t.detach().reshape(n, -1)).all(1) for t in tensors]
    if losses is not None:
        flags.append(~torch.isfinite(losses.detach().to(tensors[0].device if tensors else losses.device)))
    bad = torch.stack(flags).any(0)
    return torch.nonzero(bad).flatten().tolist() if bool(bad.any()) else []


def _stop_if_diverged(model: Ensemble, kernel, epoch_loss: torch.Tensor | None, epoch: int,
                      recipe: TrainRecipe) -> None:
    """Raise TrainingDiverged when the epoch left a non-finite loss or weight: a NaN model must not go on to
    be registered as the champion (or cached as an oracle) with exit code 0."""
    if kernel is not None:  # the fused kernel's weights live in one flat tensor until write_back
        if bool(torch.isfinite(kernel.theta).all()):
            return
        kernel.write_back(model)
        members = nonfinite_members(model) or list(range(model.n_models))
    else:
        members = nonfinite_members(model, epoch_loss)
        if not members:
            return
    which = (f"member{'s' if len(members) > 1 else ''} {members[:8]} of {model.n_models} (seeds "
             f"{[model.seeds[k] for k in members[:8]]})" if model.n_models > 1 else f"seed {model.seeds[0]}")
    raise TrainingDiverged(
        f"training diverged in epoch {epoch + 1} of {recipe.epochs}: the loss or the weights of {which} became "
        f"inf/NaN with train.optimizer = {recipe.optimizer!r}, train.lr = {recipe.lr:g}, train.schedule = "
        f"{recipe.schedule!r}; lower train.lr (e.g. to {recipe.lr / 10:g}), or check the model for operations that "
        f"overflow")


def _set_lr(opt, lr: float) -> None:
    if isinstance(opt, fused_mlp.FlatAdamW):
        opt.lr = lr
    else:
        for group in opt.param_groups:
            group["lr"] = lr


@torch.no_grad()
def predict_logits(model: Ensemble, X: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """Logits of every member on every row: [N, n, C] (on the CPU)."""
    device = next(model.parameters()).device
    model.eval()
    outs = []
    for i in range(0, X.shape[0], batch_size):
        outs.append(model(X[i : i + batch_size].to(device)).cpu())
        tick()  # the innermost progress bar of this thread prints a line past its 10 s (unlearning/progress.py)
    return torch.cat(outs, 1)


def accuracy(model: Ensemble, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-member accuracy [N]."""
    if X.shape[0] == 0:
        return torch.full((model.n_models,), float("nan"))
    return (predict_logits(model, X).argmax(-1) == y.cpu()).float().mean(1)


def seeds_for(base_seed: int, n: int, offset: int = 0) -> list[int]:
    """A reproducible list of n member seeds derived from a base seed (offset separates roles)."""
    return [int(base_seed) * 10_007 + offset + k for k in range(n)]


def save_model(model: Ensemble, path, extra: dict | None = None) -> None:
    """Checkpoint: architecture spec, seeds and stacked weights + buffers (written by the caller atomically)."""
    from unlearning.models.aggregate import Aggregate, aggregate_payload

    if isinstance(model, Aggregate):  # a sharded original's constituents and their aggregation rule
        torch.save({**aggregate_payload(model), "extra": extra or {}}, path)
        return
    torch.save({"format": "unlearning-ensemble/1", "spec": model.spec(), "seeds": model.seeds,
                "state_dict": model.state_dict(), "extra": extra or {}}, path)


def load_model(path, device: str | torch.device = "cpu", search_paths: Sequence = ()) -> tuple[Ensemble, dict]:
    """Load a checkpoint written by `save_model` (`search_paths`: where a custom factory's module lives)."""
    from unlearning.io import load_checkpoint
    from unlearning.models.ensemble import build_model

    ckpt = load_checkpoint(path)  # StateCorrupt (one line: the file and how to restore it) when unreadable
    if not isinstance(ckpt, dict) or "spec" not in ckpt or "state_dict" not in ckpt:
        raise ValueError(f"{path}: not a pipeline checkpoint (no 'spec'/'state_dict'). To start from a model you "
                         f"trained yourself, save its state_dict (torch.save(module.state_dict(), path)) and set "
                         f"train.init_checkpoint: {path}")
    model = build_model(ckpt["spec"], ckpt["seeds"], search_paths=search_paths).to(device)
    from unlearning.models.aggregate import AGGREGATE_FORMAT, aggregate_from

    if ckpt.get("format") == AGGREGATE_FORMAT:  # a sharded original: the aggregate of its constituents
        return aggregate_from(ckpt, model).to(device), ckpt.get("extra", {})
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, ckpt.get("extra", {})


def load_module_state(model: Ensemble, path, device: str | torch.device = "cpu") -> Ensemble:
    """An N = 1 ensemble holding a team's own trained module: `path` is a `state_dict` of the module the
    architecture builds (`torch.save(module.state_dict(), path)`). Every misfit is a ModelError naming
    train.init_checkpoint, the file and the fix."""
    from unlearning.models.ensemble import from_modules

    field = f"train.init_checkpoint = {path}"
    state = _read_state_dict(path, field)
    module = model._build_member(model.seeds[0])
    name = type(module).__name__
    mismatched = _shape_mismatches(module, state)
    if mismatched:  # torch's own error lists them over many lines; its last line named only the last one
        raise ModelError(f"{field} does not fit {name} built from train.model: {len(mismatched)} shape "
                         f"mismatch(es), checkpoint vs module: {'; '.join(mismatched[:5])}"
                         f"{' ...' if len(mismatched) > 5 else ''}; save the state_dict of the module that "
                         f"train.model builds (same factory, same train.model.kwargs: a width or a class count?)")
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # anything the shape check above did not foresee
        raise ModelError(f"{field} does not fit {name} built from train.model: "
                         f"{one_line(str(e).splitlines()[-1].strip())}; save the state_dict of the module that "
                         f"train.model builds (same factory, same train.model.kwargs)") from e
    if missing or unexpected:
        hint = ("; its keys start with 'module.' (saved from a DataParallel / DistributedDataParallel wrapper): save "
                "model.module.state_dict()" if unexpected and all(k.startswith("module.") for k in state)
                else "; save the state_dict of the module that train.model builds (same factory, same kwargs)")
        raise ModelError(f"{field} does not fit {name} built from train.model: missing keys {missing[:5]}, "
                         f"unexpected keys {unexpected[:5]}{hint}")
    out = from_modules(model.spec(), [module], model.seeds[:1], builder=model._builder).to(device)
    if nonfinite_members(out):
        raise ModelError(f"{field}: the checkpoint holds inf/NaN weights or buffers; save a state_dict of a "
                         f"model that trained without diverging")
    return out


def _shape_mismatches(module: torch.nn.Module, state: dict) -> list[str]:
    """'name [checkpoint shape] vs [module shape]' for every tensor the two hold under one name with two shapes."""
    own = module.state_dict()
    return [f"{k} {list(v.shape)} vs {list(own[k].shape)}" for k, v in state.items()
            if isinstance(v, torch.Tensor) and isinstance(own.get(k), torch.Tensor) and v.shape != own[k].shape]


def _nested_state_dict(state: dict) -> tuple[str, str] | None:
    """(key, common prefix) of the entry that holds the weights in a training checkpoint (PyTorch Lightning's
    {'state_dict': {'model.layer.weight': ...}, 'epoch': ...}, or {'model_state_dict': ..., 'optimizer_state_dict':
    ...}): the largest dict of tensors in it; the prefix is the first name component all its keys share."""
    nested = [(k, v) for k, v in state.items()
              if isinstance(v, dict) and v and all(isinstance(t, torch.Tensor) for t in v.values())]
    if not nested:
        return None
    key, inner = max(nested, key=lambda kv: sum(t.numel() for t in kv[1].values()))
    heads = {str(k).split(".", 1)[0] for k in inner}
    prefix = f"{heads.pop()}." if len(heads) == 1 and all("." in str(k) for k in inner) else ""
    return str(key), prefix


def _read_state_dict(path, field: str) -> dict:
    """torch.load(weights_only=True): a plain state_dict, never code. A whole pickled module (torch.save(model))
    or any other file is a ModelError saying how to save a state_dict."""
    fix = "save a state_dict: torch.save(model.state_dict(), path)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a pickled object, or not a torch.save file at all (truncated, text)
        # torch's own advice for a pickled object (add_safe_globals / weights_only=False) would run its code
        found = isinstance(e, pickle.UnpicklingError) and re.search(r"GLOBAL (\S+) was not an allowed global", str(e))
        if found:
            raise ModelError(f"{field}: the file holds a pickled {found.group(1)} object (torch.save(model) saves "
                             f"the whole module), not a state_dict; {fix}") from e
        raise ModelError(f"{field}: not a file torch.load can read as a state_dict ({type(e).__name__}: "
                         f"{one_line(e, 120)}); {fix}") from e
    if not isinstance(state, dict) or "state_dict" in state and "spec" in state:
        got = "a pipeline checkpoint (models/*.pt); take its module with Ensemble.module_of(0)" \
            if isinstance(state, dict) else f"a {type(state).__name__}"
        raise ModelError(f"{field}: expected a module state_dict, got {got}; {fix}")
    # a module's get_extra_state() may store a non-tensor under "<prefix>_extra_state": that is a state_dict too
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor) and not str(k).endswith("_extra_state")][:5]
    if bad:
        found = _nested_state_dict(state)
        if found:
            key, prefix = found
            strip = f"{{k.removeprefix({prefix!r}): v for k, v in sd.items()}}" if prefix else "sd"
            raise ModelError(f"{field}: a training checkpoint (entries {bad}), not a module state_dict; its "
                             f"{key!r} entry holds the weights" + (f" (names prefixed {prefix!r})" if prefix else "")
                             + f": sd = torch.load(path)[{key!r}]; torch.save({strip}, path)")
        raise ModelError(f"{field}: expected a module state_dict (names -> tensors), but {bad} are not tensors "
                         f"(a training checkpoint with optimizer state?); {fix}")
    return state


def clone_model(model: Ensemble) -> Ensemble:
    return model.select(list(range(model.n_models)))


def frozen_copy(model: Ensemble) -> Ensemble:
    """A copy in eval mode with gradients off: a fixed reference (teacher, theta_0) beside the trained model."""
    out = clone_model(model).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


def flat_params(model: Ensemble) -> torch.Tensor:
    """Parameters per member, flattened: [N, p]."""
    return torch.cat([p.detach().reshape(model.n_models, -1) for p in model.parameters()], 1)


def param_count(model: Ensemble) -> int:
    """Parameters of one member (all of them, frozen ones included; see `trainable_param_count`)."""
    return sum(p[0].numel() for p in model.parameters())


def trainable_param_count(model: Ensemble) -> int:
    """Parameters of one member that training changes (the module's own requires_grad)."""
    return sum(p[0].numel() for p, t in zip(model.parameters(), model.trainable_mask()) if t)


__all__: Sequence[str] = [
    "TrainRecipe", "fit", "load_module_state", "make_optimizer", "batch_bounds", "TrainCost", "train_ensemble", "predict_logits", "accuracy", "seeds_for", "save_model", "load_model",
    "per_member_loss", "order_generator", "clone_model", "frozen_copy", "flat_params", "param_count",
    "trainable_param_count", "nonfinite_members", "TrainingDiverged",
]
