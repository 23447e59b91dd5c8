"""The unlearner engine (docs/design.md §4.3): one loop, three swappable parts.

Every step of a phase computes, member-wise,

    theta <- theta - eta * P^-1 * Proj( w_R * grad L_R - w_F * grad L_F )

with geometry P (`geometry.py`), weighting w_R, w_F, per-sample weights and loss clipping
(`weighting.py`) and projection Proj (`projection.py`); eta and any momentum / Adam scaling come from a
member-wise optimizer (`optim.py`). A phase with `noise_std` > 0 then adds N(0, noise_std^2) to every trainable
weight of the active members (Langevin steps, `noise.py`; `noisy_finetune`). A method is a list of phases
(al_wpgd has two, SCRUB alternates).

Members never interact: the ensemble objective is the sum of the members' objectives, projections
and Gram solves are per member, optimizer states are per member, and each member draws its batches
from its own generator (seeded by the run seed and the member's seed). Stop rules are declared:
epochs or max_steps per phase (at least one finite bound per phase unless a budget is given), a
per-member budget of gradient evaluations for the whole method, and an optional target forget
accuracy that freezes a member for the rest of the phase once reached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from unlearning.methods.base import MethodCost, UnlearnContext, UnlearnResult, method_progress
from unlearning.methods.geometry import Geometry
from unlearning.methods.losses import correct, per_sample_loss
from unlearning.methods.memberwise import Vec, member_generators, member_view
from unlearning.methods.noise import add_member_noise
from unlearning.methods.optim import MemberOptimizer, OptimizerSpec
from unlearning.methods.projection import Projection
from unlearning.methods.sampling import PoolStream
from unlearning.methods.weighting import Weighting
from unlearning.models import Ensemble
from unlearning.models.training import batch_bounds, clone_model, has_batchnorm

POOLS = ("forget", "retain", "adjacent", "remote")

# (model, X [N, b, d], y [N, b], idx [N, b] rows of the source table) -> per-sample losses [N, b]
TermLoss = Callable[[Ensemble, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Term:
    """A loss term of a phase: minibatches of `batch_size` rows (None = the whole pool) from `pool`,
    scored by `loss` (default: the context's loss, "ce" or "mse", against the true labels)."""

    pool: str
    batch_size: int | None = 64
    loss: TermLoss | None = None

    def __post_init__(self):
        if self.pool not in POOLS:
            raise ValueError(f"term pool={self.pool!r} is not known; allowed: {list(POOLS)}")


@dataclass(frozen=True)
class StopRule:
    """Phase stop rule. epochs: passes over the primary term's pool; max_steps: optimizer steps;
    target_forget_acc: a member stops (freezes) once its accuracy on the whole forget set is <= this,
    checked before the first step and every `check_every` steps (a forward pass, not counted)."""

    epochs: int | None = 1
    max_steps: int | None = None
    target_forget_acc: float | None = None
    check_every: int = 1


@dataclass
class Phase:
    name: str
    retain: Term | None = None
    forget: Term | None = None
    primary: str = "retain"  # the term ("retain" or "forget") whose pool defines an epoch
    weighting: Weighting = field(default_factory=Weighting)
    projection: Projection = field(default_factory=Projection)
    geometry: Geometry = field(default_factory=Geometry)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    stop: StopRule = field(default_factory=StopRule)
    pre_momentum: float = 0.0  # momentum on the raw direction BEFORE projection (al_wpgd stage 2)
    param_mask: Vec | None = None  # per-member 0/1 masks shaped like the parameters (SalUn)
    noise_std: float = 0.0  # Gaussian weight noise added after every step (Langevin steps; noise.py)


def pool_rows(ctx: UnlearnContext, pool: str) -> torch.Tensor:
    """Row indices of a pool in its source table (X_forget for "forget", X_retain otherwise)."""
    if pool == "forget":
        return torch.arange(ctx.X_forget.shape[0], device=ctx.X_forget.device)
    n = ctx.X_retain.shape[0]
    if pool == "retain":
        return torch.arange(n, device=ctx.X_retain.device)
    mask = ctx.adjacent_mask.bool().to(ctx.X_retain.device)
    if mask.shape != (n,):
        raise ValueError(f"adjacent_mask has shape {tuple(mask.shape)}, expected ({n},)")
    return torch.nonzero(mask if pool == "adjacent" else ~mask).flatten()


def source(ctx: UnlearnContext, pool: str) -> tuple[torch.Tensor, torch.Tensor]:
    return (ctx.X_forget, ctx.y_forget) if pool == "forget" else (ctx.X_retain, ctx.y_retain)


def forget_accuracy(model: Ensemble, ctx: UnlearnContext) -> torch.Tensor:
    """[N] accuracy of each member on the whole forget set, in eval mode (BatchNorm running statistics, no
    dropout): a check that neither moves the running statistics nor draws from the dropout streams."""
    if ctx.loss != "ce":
        raise ValueError("a target forget accuracy needs loss='ce'")
    if ctx.X_forget.shape[0] == 0:
        return torch.zeros(model.n_models)
    was_training = model.training
    try:
        with torch.no_grad():
            return correct(model.eval()(ctx.X_forget), ctx.y_forget).float().mean(1).cpu()
    finally:
        model.train(was_training)


class FrozenBuffers:
    """Keeps the buffers (BatchNorm running statistics) of stopped members as they were: a train-mode forward
    pass updates every member's buffers, but a stopped member must end as a lone run that stopped there."""

    def __init__(self, model: Ensemble):
        self.buffers = list(model.buffers())  # stacked: [N, ...] each

    def snapshot(self) -> list[torch.Tensor] | None:
        return [b.clone() for b in self.buffers] if self.buffers else None

    def restore(self, saved: list[torch.Tensor] | None, stopped: torch.Tensor) -> None:
        if saved is None or not bool(stopped.any()):
            return
        with torch.no_grad():
            for b, old in zip(self.buffers, saved):
                b.copy_(torch.where(member_view(stopped.to(b.device), b).bool(), old, b))


def default_loss(ctx: UnlearnContext) -> TermLoss:
    return lambda model, X, y, idx: per_sample_loss(model(X), y, ctx.loss, ctx.label_smoothing)


def _phase_bound(ctx: UnlearnContext, phase: Phase, batchnorm: bool, max_grad_evals: int | None) -> int:
    """The most optimizer steps a phase can take (the progress total): the lesser of epochs x steps per epoch
    and max_steps; a budget-only phase, the budget over its per-step cost. A target accuracy or the budget
    may end it sooner (the bar then says so)."""
    terms = {k: t for k, t in (("retain", phase.retain), ("forget", phase.forget)) if t is not None}
    if phase.primary not in terms:
        return 0
    sizes = {k: len(pool_rows(ctx, t.pool)) for k, t in terms.items()}
    n = sizes[phase.primary]
    if n == 0:
        return 0
    bs = terms[phase.primary].batch_size
    bounds = []
    if phase.stop.epochs is not None:
        bounds.append(phase.stop.epochs * len(batch_bounds(n, min(bs or n, n), batchnorm)))
    if phase.stop.max_steps is not None:
        bounds.append(phase.stop.max_steps)
    if not bounds and max_grad_evals is not None:
        per_step = sum(min(terms[k].batch_size or m, m) for k, m in sizes.items()) + phase.projection.evals_per_step()
        bounds.append(max_grad_evals // max(per_step, 1))
    return max(min(bounds), 0) if bounds else 0


def _step_direction(ctx: UnlearnContext, model: Ensemble, params: list, phase: Phase, terms: dict, losses: dict,
                    batch: dict, buf: Vec | None, active: torch.Tensor) -> tuple[Vec, dict, Vec | None]:
    """One step's update direction (stacked, per member): the phase's weighted objective on this batch, its
    gradient, then pre-momentum (active members only), the projection, the geometry and the parameter mask.
    Returns (direction, the reduced per-term losses, the momentum buffer)."""
    reduced = {}
    for k, idx in batch.items():
        X, y = source(ctx, terms[k].pool)
        reduced[k] = phase.weighting.reduce(k, losses[k](model, X[idx], y[idx], idx), idx)
    grads = torch.autograd.grad(phase.weighting.objective(reduced), params, allow_unused=True)
    direction = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
    if phase.pre_momentum:
        if buf is None:
            buf = [torch.zeros_like(d) for d in direction]
        for b, d in zip(buf, direction):
            b.copy_(torch.where(member_view(active.to(b.device), b).bool(), b * phase.pre_momentum + d, b))
        direction = [b.clone() for b in buf]
    direction = phase.geometry.apply(phase.projection.project(model, direction))
    if phase.param_mask is not None:
        direction = [d * m for d, m in zip(direction, phase.param_mask)]
    return direction, reduced, buf


def _phase_optimizer(phase: Phase, shared: dict[str, MemberOptimizer], n_members: int) -> MemberOptimizer:
    """The phase's optimizer: a new one, or the one an earlier phase with the same `share_key` left (its
    momentum and Adam moments carry over)."""
    key = phase.optimizer.share_key
    opt = shared.get(key) if key else None
    if opt is None:
        opt = MemberOptimizer(phase.optimizer, n_members)
        if key:
            shared[key] = opt
    return opt


def _out_of_budget(evals_after: torch.Tensor, max_grad_evals: int, frozen: torch.Tensor,
                   out_of_budget: torch.Tensor, stops: list[str]) -> bool:
    """Stop for good (in place: `frozen`, `out_of_budget`, `stops`) every live member whose next step would
    exceed the per-member budget; True when no member is left to step."""
    over = ~frozen & (evals_after > max_grad_evals)
    for k in torch.nonzero(over).flatten().tolist():
        stops[k] = "budget"
    out_of_budget |= over
    frozen |= over
    return bool(frozen.all())


@dataclass
class _Run:
    """What the phases of one `run_phases` call share: the model being unlearned (a clone), whether it has
    BatchNorm, its parameters, the per-member budget (`evals` spent so far [N], `out_of_budget` [N]: stopped for good), the optimizers
    phases share by `share_key`, the keeper of frozen members' buffers, and the progress bar."""

    ctx: UnlearnContext
    model: Ensemble
    method: str
    max_grad_evals: int | None
    bar: object
    batchnorm: bool  # no one-row train-mode batches (a short last batch joins the one before)
    params: list = field(init=False)
    evals: torch.Tensor = field(init=False)
    out_of_budget: torch.Tensor = field(init=False)
    optimizers: dict[str, MemberOptimizer] = field(default_factory=dict)
    kept: FrozenBuffers = field(init=False)

    def __post_init__(self):
        self.params = list(self.model.parameters())
        n = self.model.n_models
        self.evals = torch.zeros(n, dtype=torch.long)
        self.out_of_budget = torch.zeros(n, dtype=torch.bool)
        self.kept = FrozenBuffers(self.model)

    def remaining(self) -> int | None:
        """Gradient evaluations the most-spent live member has left (None: no budget; 0: none left)."""
        if self.max_grad_evals is None:
            return None
        live = self.evals[~self.out_of_budget]
        return 0 if len(live) == 0 else int(self.max_grad_evals - live.max())


def _check_phase(phase: Phase, max_grad_evals: int | None) -> dict:
    """The phase's terms by name ("retain", "forget"); ValueError for a phase that could never stop or whose
    primary term is missing."""
    stop = phase.stop
    if stop.epochs is None and stop.max_steps is None and max_grad_evals is None:
        raise ValueError(f"phase {phase.name!r} has no finite stop rule (epochs, max_steps or a budget)")
    terms = {k: t for k, t in (("retain", phase.retain), ("forget", phase.forget)) if t is not None}
    if phase.primary not in terms:
        raise ValueError(f"phase {phase.name!r}: primary term {phase.primary!r} is not one of {list(terms)}")
    return terms


def _take_step(run: _Run, phase: Phase, terms: dict, losses: dict, opt: MemberOptimizer, batch: dict,
               buf: Vec | None, active: torch.Tensor, cost: int, noise_gens: list | None = None) -> Vec | None:
    """One optimizer step of the active members [N] bool on `batch` (term -> row indices [N, b]), then the
    phase's weight noise (`noise_gens`: one generator per member); the frozen members' parameters and buffers
    stay exactly as they were. Returns the momentum buffer."""
    saved = run.kept.snapshot()
    direction, reduced, buf = _step_direction(run.ctx, run.model, run.params, phase, terms, losses, batch, buf,
                                              active)
    update = opt.update(direction, active)
    if phase.param_mask is not None:  # exact zero outside the mask, whatever the optimizer does
        update = [u * m for u, m in zip(update, phase.param_mask)]
    with torch.no_grad():
        for p, u, trainable in zip(run.params, update, run.model.trainable_mask()):
            if trainable:  # a frozen parameter (requires_grad=False in the team's module) never moves
                p.sub_(u)
    if phase.noise_std > 0:
        add_member_noise(run.model, noise_gens, phase.noise_std, active)
    run.kept.restore(saved, ~active)
    run.evals[active] += cost
    phase.weighting.after_step({k: v.detach() for k, v in reduced.items()}, active)
    return buf


def _run_phase(run: _Run, phase: Phase, several: bool) -> dict:
    """Run one phase on `run.model`; returns its record {"name", "steps", "stop": a reason per member}."""
    ctx, stop, n = run.ctx, phase.stop, run.model.n_models
    terms = _check_phase(phase, run.max_grad_evals)
    p_info = {"name": phase.name, "steps": 0, "stop": ["epochs" if stop.epochs is not None else "max_steps"] * n}

    # Geometry and projection are set up at the phase's starting point (charged to the budget).
    rem = run.remaining()
    if rem is not None and rem <= 0:
        return {**p_info, "stop": ["budget"] * n}
    saved = run.kept.snapshot()
    prep = phase.geometry.prepare(run.model, ctx, rem) + phase.projection.start(run.model, ctx)
    run.kept.restore(saved, run.out_of_budget)
    run.evals[~run.out_of_budget] += prep

    streams = {k: PoolStream(pool_rows(ctx, t.pool), t.batch_size,
                             member_generators(ctx.seed, run.model.seeds, run.method, phase.name, k), run.batchnorm)
               for k, t in terms.items()}
    losses = {k: (t.loss or default_loss(ctx)) for k, t in terms.items()}
    opt = _phase_optimizer(phase, run.optimizers, n)
    frozen = run.out_of_budget.clone()  # [N]: members that take no more steps in this phase
    noise_gens = member_generators(ctx.seed, run.model.seeds, run.method, phase.name, "noise") \
        if phase.noise_std > 0 else None
    buf: Vec | None = None

    def check_target() -> None:
        if stop.target_forget_acc is None:
            return
        hit = (forget_accuracy(run.model, ctx) <= stop.target_forget_acc) & ~frozen
        for k in torch.nonzero(hit).flatten().tolist():
            p_info["stop"][k] = "target"
        frozen.logical_or_(hit)

    check_target()
    primary = streams[phase.primary]
    if several:
        run.bar.stage(phase.name)
    epoch, done = 0, False
    while not done and (stop.epochs is None or epoch < stop.epochs) and len(primary) > 0:
        epoch += 1
        for idx_primary in primary.epoch():
            if (stop.max_steps is not None and p_info["steps"] >= stop.max_steps) or bool(frozen.all()):
                done = True
                break
            batch = {k: idx_primary if k == phase.primary else streams[k].next()
                     for k in terms if len(streams[k]) > 0}
            cost = sum(int(i.shape[1]) for i in batch.values()) + phase.projection.evals_per_step()
            if run.max_grad_evals is not None and _out_of_budget(run.evals + cost, run.max_grad_evals, frozen,
                                                                 run.out_of_budget, p_info["stop"]):
                done = True
                break
            buf = _take_step(run, phase, terms, losses, opt, batch, buf, ~frozen, cost, noise_gens)
            p_info["steps"] += 1
            run.bar.update()
            if stop.target_forget_acc is not None and p_info["steps"] % stop.check_every == 0:
                check_target()
    if stop.max_steps is not None and p_info["steps"] >= stop.max_steps:
        p_info["stop"] = ["max_steps" if s in ("epochs", "max_steps") else s for s in p_info["stop"]]
    return p_info


def run_phases(ctx: UnlearnContext, phases: list[Phase], *, max_grad_evals: int | None = None,
               method: str = "") -> UnlearnResult:
    """Run the phases on a clone of ctx.model. `max_grad_evals` is a PER-MEMBER budget of per-sample
    gradient evaluations over the whole method (geometry preparation and projections included); a
    member whose next step would exceed it stops for good. The reported cost sums members."""
    start = time.perf_counter()
    model = clone_model(ctx.model)
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    info: dict = {"phases": []}
    batchnorm = has_batchnorm(model)
    total = sum(_phase_bound(ctx, ph, batchnorm, max_grad_evals) for ph in phases)
    with method_progress(ctx, method or "unlearn", total) as bar:
        run = _Run(ctx, model, method, max_grad_evals, bar, batchnorm)
        for phase in phases:
            info["phases"].append(_run_phase(run, phase, several=len(phases) > 1))
        steps = sum(ph["steps"] for ph in info["phases"])
        if steps < total:  # the bar says why the method ended before its bound
            reasons = [r for ph in info["phases"] for r in ph["stop"] if r in ("target", "budget")]
            if reasons:
                bar.stop(max(sorted(set(reasons)), key=reasons.count))

    model.restore_requires_grad().eval()  # every parameter required grad for autograd.grad; frozen again
    info["gradient_evals_per_member"] = run.evals.tolist()
    cost = MethodCost(gradient_evals=int(run.evals.sum()), steps=steps, seconds=time.perf_counter() - start)
    return UnlearnResult(model=model, cost=cost, info=info)
