"""`newton_ggn`: one or a few GGN / Newton steps on the retain objective (docs/design.md §4.1, §4.3 geometry P = G_R).

Per member k of the ensemble, in float64 on the model's device:

    L_R(theta) = sum_{i in R} loss_i(theta) + lam/2 ||theta||^2          (every parameter penalised, biases too)
    theta <- theta - step_size * (G_R(theta) + damping I)^-1 grad L_R(theta),
    G_R = sum_{i in R} J_i^T Lambda_i J_i + lam I.

The sum-of-losses scale matters: a mean loss with (coupled) weight decay wd, mean_R loss + wd/2 ||theta||^2,
is the same objective divided by |R|, so the default lam = recipe.weight_decay * |R| (zero_decay_lam when
that is 0: no L2 term leaves the GGN of an overparameterised module singular). (The recipe trains with
AdamW's decoupled decay, which is not exactly an L2 penalty: set `lam` explicitly to match another objective.)
For a model linear in theta with squared loss ("mse", e.g. an MLP with hidden=[] and n_classes=1) the GGN is
the Hessian, so one step with step_size = 1, damping = 0 lands exactly on the ridge solution on [X, 1] with
the bias penalised like the weights: theta_R = ([X_R, 1]^T [X_R, 1] + lam I)^-1 [X_R, 1]^T y_R.
This is Newton / influence removal: it lands on the oracle iff P = G_R and eta = 1 (docs/design.md §4.1).
A backtracking (Armijo) line search on L_R keeps cross-entropy steps from overshooting; it accepts the full
step on a quadratic, so the ridge case stays exact. The influence step (gradient = forget) has no objective to
decrease: it backtracks while the outputs move farther from their linear prediction than
`max_linearization_error` allows (a model linear in theta keeps the full step, so ridge stays exact). Stops
after `steps` steps, or earlier when the next step's worst-case cost would pass `max_grad_evals` (per member;
0 steps leaves the model as it is).
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import torch
from pydantic import Field, model_validator

from unlearning.leverage.curvature import make_targets
from unlearning.leverage.functions import StackedMemberFunction
from unlearning.leverage.newton import LINE_SEARCH_TRIALS, influence_removal_step, newton_steps
from unlearning.leverage.solvers import EXACT_MAX_PARAMS
from unlearning.methods.args import DataSizes, MethodArgs
from unlearning.methods.base import MethodCost, UnlearnContext, UnlearnResult, method_progress
from unlearning.methods.registry import register
from unlearning.models.training import clone_model, trainable_param_count

log = logging.getLogger(__name__)


class NewtonGGNArgs(MethodArgs):
    # Default by bench/newton_removal.py: on 6 digits sets the forget gradient was closer to the
    # oracles than the retain gradient on 17 of 18 (set, split) pairs, and closer than do_nothing on the forget
    # split on 6 of 6; the retain gradient also undoes the recipe's unfinished training (2-3x the oracle spread).
    gradient: Literal["retain", "forget"] = Field(
        "forget", description="retain: Newton steps on the retain objective; forget: one influence-removal step "
                              "theta + (G_R + lam I)^-1 grad L_F (the same at a minimiser; bench/newton_removal.py)")
    steps: int = Field(1, ge=1, le=100, description="GGN / Newton steps per member (gradient = forget: 1)")
    lam: float | None = Field(None, ge=0, description="L2 coefficient of the sum-of-losses retain objective; "
                              "None = recipe.weight_decay * |R|, or zero_decay_lam when that is 0")
    # train.weight_decay = 0 made the default lam 0: the GGN of an overparameterised module is then singular
    # (rank 23-32 of p = 1391 on a small ResNet) and the step inverted noise-level eigenvalues (step norms 1e11,
    # NaN logits). 1.0 is the leverage diagnostics' floor (diagnostics.min_lam) for the same matrix.
    zero_decay_lam: float = Field(1.0, gt=0, description="the default lam when recipe.weight_decay is 0 (an "
                                  "explicit lam: 0 is kept)")
    # The influence step is a first-order prediction. On a small CIFAR-style ResNet (22 rows) its full step moved
    # the logits by 5e3 to 1e15 (relative linearization errors 19 to 6e10, with or without weight decay); on
    # digits' MLP the errors were 0.05-0.51 (forget sets of 10, 60 and a whole class), so 1.0 keeps those steps.
    max_linearization_error: float | None = Field(
        1.0, gt=0, description="gradient = forget: halve eta until ||f(theta + eta delta) - f(theta) - eta J delta|| "
                               "<= this x ||eta J delta|| on the retain and forget rows (no step if 21 "
                               "tries fail); null = always the full step")
    damping: float = Field(0.0, ge=0, description="Levenberg-Marquardt term added to the matrix only")
    step_size: float = Field(1.0, gt=0, le=1.0, description="eta; 1 = full Newton step")
    line_search: bool = Field(True, description="backtrack eta (Armijo) so the retain objective decreases")
    solver: Literal["auto", "exact", "cg"] = "auto"
    cg_iters: int = Field(500, ge=1)
    cg_tol: float = Field(1e-10, gt=0)
    max_params: int = Field(EXACT_MAX_PARAMS, ge=1, description="auto: exact (dense float64) up to this many "
                            "trainable parameters per member, CG beyond")
    max_grad_evals: int | None = Field(None, ge=0, description="per-member budget of per-sample gradient evals")

    def step_bound(self, n_retain: int, n_outputs: int, solver: str, n_forget: int = 0) -> int:
        """Worst-case per-member gradient evaluations of one step (newton_steps' and influence_removal_step's
        accounting): the Jacobians of the exact solver (n C) or CG's jvp + vjp per column (2 n cg_iters, plus
        n C for the Jacobi preconditioner); gradient = retain: the retain gradient (n) and the line search's
        objective evaluations (n each); gradient = forget: the forget gradient (n_forget) and the linearization
        test on the n + n_forget rows (a forward and a jvp, then a forward per halving)."""
        n = n_retain
        solve = n * n_outputs if solver == "exact" else 2 * n * self.cg_iters + n * n_outputs
        if self.gradient == "forget":
            trust = (LINE_SEARCH_TRIALS + 2) * (n + n_forget) if self.max_linearization_error is not None else 0
            return n_forget + solve + trust
        return n + solve + (LINE_SEARCH_TRIALS * n if self.line_search else 0)

    @model_validator(mode="after")
    def _one_influence_step(self) -> "NewtonGGNArgs":
        if self.gradient == "forget" and self.steps != 1:
            raise ValueError(f"newton_ggn: gradient = 'forget' is one influence-removal step; steps = {self.steps} "
                             f"is not allowed (use steps: 1, or gradient: retain for several Newton steps)")
        return self

    def steps_within_budget(self, n_retain: int, n_outputs: int, solver: str, n_forget: int = 0) -> int:
        if self.max_grad_evals is None:
            return self.steps
        return min(self.steps, self.max_grad_evals // max(1, self.step_bound(n_retain, n_outputs, solver,
                                                                              n_forget)))

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        worst = max(self.step_bound(sizes.n_retain, sizes.n_outputs, s, sizes.n_forget) for s in ("exact", "cg"))
        bound = self.steps * worst
        return bound if self.max_grad_evals is None else min(bound, self.max_grad_evals)


@register("newton_ggn", NewtonGGNArgs,
          "one GGN-Newton removal step per member: the influence of the forget rows (default gradient: forget), "
          "or Newton steps on the retain objective (gradient: retain); lands on the retrain for ridge")
def run(ctx: UnlearnContext, args: NewtonGGNArgs) -> UnlearnResult:
    start = time.perf_counter()
    model = ctx.model
    n_retain = int(ctx.X_retain.shape[0])
    if n_retain == 0:
        raise ValueError("newton_ggn needs a non-empty retain set")
    lam = float(args.lam) if args.lam is not None else float(ctx.recipe.weight_decay) * n_retain
    if args.lam is None and lam == 0.0:
        log.warning("newton_ggn: train.weight_decay is 0, so the retain objective has no L2 term and its GGN is "
                    "singular for an overparameterised module; using lam = %g (zero_decay_lam; set "
                    "deletion.method_args.newton_ggn.lam to choose)", args.zero_decay_lam)
        lam = float(args.zero_decay_lam)
    solver = args.solver
    if solver == "auto":
        # choose here so that `max_params` decides between the two allowed solvers
        solver = "exact" if trainable_param_count(model) <= args.max_params else "cg"
    out = clone_model(model)  # never mutate ctx.model
    n_outputs = int(model.n_classes)
    steps = args.steps_within_budget(n_retain, n_outputs, solver, int(ctx.X_forget.shape[0]))
    if steps == 0:  # the budget does not cover one step
        out.eval()
        return UnlearnResult(model=out, cost=MethodCost(0, 0, time.perf_counter() - start),
                             info={"lam": lam, "solver": solver, "stop": "budget", "members": []})
    evals, per_member = 0, []
    # progress: one unit per member and step; the solver's row and CG loops tick in between (10 s rule)
    with method_progress(ctx, "newton_ggn", model.n_models * steps) as bar:
        for k in range(model.n_models):
            bar.stage(f"member {k + 1}/{model.n_models}, {solver}")
            fn = StackedMemberFunction(model, k, dtype=torch.float64)
            t = make_targets(ctx.y_retain, fn.n_outputs, ctx.loss, torch.float64, fn.device, ctx.label_smoothing)
            if args.gradient == "forget":
                t_f = make_targets(ctx.y_forget, fn.n_outputs, ctx.loss, torch.float64, fn.device,
                                   ctx.label_smoothing)
                theta, info = influence_removal_step(fn, fn.theta0, ctx.X_retain, t, ctx.X_forget, t_f, ctx.loss,
                                                     lam, damping=args.damping, step_size=args.step_size,
                                                     solver=solver, cg_iters=args.cg_iters, cg_tol=args.cg_tol,
                                                     max_linearization_error=args.max_linearization_error)
                bar.update()
            else:
                theta, info = newton_steps(fn, fn.theta0, ctx.X_retain, t, ctx.loss, lam, steps=steps,
                                           damping=args.damping, step_size=args.step_size,
                                           line_search=args.line_search, solver=solver,
                                           cg_iters=args.cg_iters, cg_tol=args.cg_tol, on_step=bar.update)
            fn.write_into(out, k, theta)
            evals += int(info["gradient_evals"])
            per_member.append({"objective": info["objective"], "eta": info["eta"], "step_norm": info["step_norm"],
                               "grad_norm": info["grad_norm"], "solver": info["solver"],
                               "linearization_error": info.get("linearization_error", [])})
    out.eval()
    # steps: optimizer steps of the ensemble (every member takes `steps`), as the engine's presets count them
    cost = MethodCost(gradient_evals=evals, steps=steps, seconds=time.perf_counter() - start)
    stop = "steps" if steps == args.steps else "budget"
    return UnlearnResult(model=out, cost=cost, info={"lam": lam, "solver": solver, "stop": stop, "members": per_member})
