"""`newton_ggn`: one or a few GGN / Newton steps on the retain objective (DESIGN §4.1, §4.3 geometry P = G_R).

Per member k of the ensemble, in float64 on the model's device:

    L_R(theta) = sum_{i in R} loss_i(theta) + lam/2 ||theta||^2          (every parameter penalised, biases too)
    theta <- theta - step_size * (G_R(theta) + damping I)^-1 grad L_R(theta),
    G_R = sum_{i in R} J_i^T Lambda_i J_i + lam I.

The sum-of-losses scale matters: a mean loss with (coupled) weight decay wd, mean_R loss + wd/2 ||theta||^2,
is the same objective divided by |R|, so the default lam = recipe.weight_decay * |R|. (The recipe trains with
AdamW's decoupled decay, which is not exactly an L2 penalty: set `lam` explicitly to match another objective.)
For a model linear in theta with squared loss ("mse", e.g. StackedMLP(hidden=[], n_classes=1)) the GGN is
the Hessian, so one step with step_size = 1, damping = 0 lands exactly on the ridge solution on [X, 1] with
the bias penalised like the weights: theta_R = ([X_R, 1]^T [X_R, 1] + lam I)^-1 [X_R, 1]^T y_R.
This is Newton / influence removal: it lands on the oracle iff P = G_R and eta = 1 (DESIGN §4.1).
A backtracking (Armijo) line search on L_R keeps cross-entropy steps from overshooting; it accepts the full
step on a quadratic, so the ridge case stays exact. Stops after `steps` steps.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from unlearning.leverage.curvature import make_targets
from unlearning.leverage.functions import StackedMemberFunction
from unlearning.leverage.newton import newton_steps
from unlearning.leverage.solvers import EXACT_MAX_PARAMS
from unlearning.methods.base import MethodCost, UnlearnContext, UnlearnResult
from unlearning.methods.registry import register
from unlearning.models.training import clone_model


class NewtonGGNArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(1, ge=1, le=100, description="GGN / Newton steps per member")
    lam: float | None = Field(None, ge=0, description="L2 coefficient of the sum-of-losses retain objective; "
                              "None = recipe.weight_decay * |R|")
    damping: float = Field(0.0, ge=0, description="Levenberg-Marquardt term added to the matrix only")
    step_size: float = Field(1.0, gt=0, le=1.0, description="eta; 1 = full Newton step")
    line_search: bool = Field(True, description="backtrack eta (Armijo) so the retain objective decreases")
    solver: Literal["auto", "exact", "cg"] = "auto"
    cg_iters: int = Field(500, ge=1)
    cg_tol: float = Field(1e-10, gt=0)
    max_params: int = Field(EXACT_MAX_PARAMS, ge=1, description="auto: exact (dense float64) up to this many "
                            "parameters per member, CG beyond")


@register("newton_ggn", NewtonGGNArgs,
          "GGN/Newton steps on the retain objective per member (lands on the retrain for ridge)")
def run(ctx: UnlearnContext, args: NewtonGGNArgs) -> UnlearnResult:
    start = time.perf_counter()
    model = ctx.model
    n_retain = int(ctx.X_retain.shape[0])
    if n_retain == 0:
        raise ValueError("newton_ggn needs a non-empty retain set")
    lam = float(args.lam) if args.lam is not None else float(ctx.recipe.weight_decay) * n_retain
    solver = args.solver
    if solver == "auto":
        # choose here so that `max_params` decides between the two allowed solvers
        p = sum(prm[0].numel() for prm in model.parameters())
        solver = "exact" if p <= args.max_params else "cg"
    out = clone_model(model)  # never mutate ctx.model
    evals, per_member = 0, []
    for k in range(model.n_models):
        fn = StackedMemberFunction(model, k, dtype=torch.float64)
        t = make_targets(ctx.y_retain, fn.n_outputs, ctx.loss, torch.float64, fn.device)
        theta, info = newton_steps(fn, fn.theta0, ctx.X_retain, t, ctx.loss, lam, steps=args.steps,
                                   damping=args.damping, step_size=args.step_size,
                                   line_search=args.line_search, solver=solver,
                                   cg_iters=args.cg_iters, cg_tol=args.cg_tol)
        fn.write_into(out, k, theta)
        evals += int(info["gradient_evals"])
        per_member.append({"objective": info["objective"], "eta": info["eta"], "step_norm": info["step_norm"],
                           "grad_norm": info["grad_norm"], "solver": info["solver"]})
    out.eval()
    cost = MethodCost(gradient_evals=evals, steps=args.steps * model.n_models, seconds=time.perf_counter() - start)
    return UnlearnResult(model=out, cost=cost, info={"lam": lam, "solver": solver, "members": per_member})
