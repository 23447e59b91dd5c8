"""GGN / Newton steps on a retain objective (docs/design.md §4.1 and §4.3 geometry P = G_R).

    L_R(theta) = sum_{i in R} loss_i(theta) + lam/2 ||theta||^2
    theta <- theta - eta (G_R(theta) + damping I)^-1 grad L_R(theta),  G_R = sum_R J^T Lambda J + lam I.

For squared loss and a model linear in theta the GGN is the Hessian, so one step with eta = 1 and
damping = 0 lands exactly on the minimiser (ridge: theta_R = H_R^-1 X_R^T y_R) from any start.
`damping` (Levenberg-Marquardt) only enters the matrix, so it does not move the fixed point.
Far from a minimum a full GGN step on cross-entropy can overshoot; `line_search` backtracks
(eta, eta/2, ...) until the Armijo condition L(theta - eta delta) <= L(theta) - 1e-4 eta grad^T delta holds
(Nocedal & Wright, Numerical Optimization, §3.1), and takes no step if 20 halvings fail. A quadratic
objective accepts the full Newton step at once, so exactness on ridge regression is kept.
"""

from __future__ import annotations

import time

import torch

from unlearning.leverage.functions import OutputFunction
from unlearning.leverage.rows import RowSet
from unlearning.leverage.solvers import make_solver


LINE_SEARCH_TRIALS = 21  # backtracking halvings tried per step before the step is rejected (eta = 0)


def newton_steps(fn: OutputFunction, theta: torch.Tensor, X: torch.Tensor, t: torch.Tensor, loss: str, lam: float,
                 *, steps: int = 1, damping: float = 0.0, step_size: float = 1.0, line_search: bool = False,
                 solver: str = "auto",
                 cg_iters: int = 500, cg_tol: float = 1e-10, exact_max_params: int | None = None,
                 chunk: int | None = None, on_step=None) -> tuple[torch.Tensor, dict]:
    """Run `steps` GGN steps from theta [p] on the rows (X, t); returns (theta, info).

    info: per-step gradient and step norms, accepted step sizes, the objective after each step (first entry:
    before), the solver's info, and `gradient_evals` (per-sample gradient-equivalents: 1 per sample for the
    gradient, C per sample for the Jacobians of exact/projected, 2 per sample and CG column for jvp + vjp,
    C per sample for the Jacobi preconditioner, 1 per sample per line-search objective evaluation).
    `on_step()` is called after each step (a progress bar's update)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if lam < 0 or damping < 0:
        raise ValueError(f"lam and damping must be >= 0, got lam={lam}, damping={damping}")
    kw = {} if exact_max_params is None else {"exact_max_params": exact_max_params}
    theta = theta.detach().clone()
    info: dict = {"grad_norm": [], "step_norm": [], "eta": [], "objective": [], "solver": None,
                  "gradient_evals": 0, "seconds": 0.0}
    start = time.perf_counter()
    n, C = X.shape[0], fn.n_outputs

    def objective(th: torch.Tensor) -> float:
        return RowSet(fn, th, X, t, loss, chunk=chunk).loss_sum() + 0.5 * lam * float(th @ th)

    current = objective(theta)
    info["objective"].append(current)
    for _ in range(steps):
        rs = RowSet(fn, theta, X, t, loss, chunk=chunk)
        grad = rs.gradient() + lam * theta
        slv = make_solver(solver, lam + damping, p=fn.p, cg_iters=cg_iters, cg_tol=cg_tol, **kw)
        slv.fit(plus=[rs])
        delta = slv.solve(grad)
        eta, evals = step_size, 0
        if line_search:
            slope = float(grad @ delta)  # > 0: delta is a descent direction for a PSD geometry
            for _ in range(LINE_SEARCH_TRIALS):
                trial = objective(theta - eta * delta)
                evals += n
                if trial <= current - 1e-4 * eta * slope:
                    break
                eta /= 2
            else:
                eta, trial = 0.0, current
            current = trial
        theta = theta - eta * delta
        if not line_search:
            current = objective(theta)
        info["objective"].append(current)
        info["eta"].append(eta)
        info["grad_norm"].append(float(grad.norm()))
        info["step_norm"].append(float(eta * delta.norm()))
        info["solver"] = dict(slv.info)
        evals += n  # the gradient
        if slv.name in ("exact", "projected"):
            evals += n * C
        else:
            evals += 2 * n * slv.info.get("matvec_columns", 0)
            evals += n * C if slv.info.get("preconditioner") == "jacobi" else 0
        info["gradient_evals"] += evals
        if on_step is not None:
            on_step()
    info["seconds"] = time.perf_counter() - start
    return theta, info


def influence_removal_step(fn: OutputFunction, theta: torch.Tensor, X_retain: torch.Tensor, t_retain: torch.Tensor,
                           X_forget: torch.Tensor, t_forget: torch.Tensor, loss: str, lam: float, *,
                           damping: float = 0.0, step_size: float = 1.0, solver: str = "auto",
                           cg_iters: int = 500, cg_tol: float = 1e-10, exact_max_params: int | None = None,
                           max_linearization_error: float | None = None,
                           chunk: int | None = None) -> tuple[torch.Tensor, dict]:
    """One influence-removal step (Koh & Liang 2017, §2; docs/design.md §4.1):

        theta <- theta + eta (G_R(theta) + (lam + damping) I)^-1 grad sum_{i in F} loss_i(theta).

    At the minimiser theta_D of L_D = L_R + L_F + lam/2 ||theta||^2, grad (L_R + lam/2 ||.||^2)(theta_D) =
    -grad L_F(theta_D), so this is the same step as a Newton step on the retain objective, and exact on ridge.
    Away from a minimiser (a recipe stopped early, decoupled weight decay) the two differ: the retain gradient
    also carries the residual of the unfinished training, which moves the model toward the retain optimum,
    where the oracles (trained by the same recipe) are not; the forget gradient moves only by the removed
    samples' contribution. No line search: there is no objective the step must decrease.

    The step is a first-order (influence) prediction, valid while the outputs move linearly in theta: the GGN is
    the Hessian of the loss of the model linearised at theta (Martens 2020, "New insights and perspectives on
    the natural gradient method", JMLR 21, its GGN section). With `max_linearization_error` = tau, eta is halved
    until the outputs on the retain and forget rows satisfy
        ||f(theta + eta delta) - f(theta) - eta J delta|| <= tau ||eta J delta||   (Frobenius, over rows and outputs),
    and no step is taken (eta = 0) if 21 tries (down to eta / 2^20) fail. A model linear in theta has error 0
    and keeps the full step (ridge stays exact); a deep net whose full step would move its logits by 1e8 gets a
    step where the influence prediction still holds."""
    if lam < 0 or damping < 0:
        raise ValueError(f"lam and damping must be >= 0, got lam={lam}, damping={damping}")
    start = time.perf_counter()
    kw = {} if exact_max_params is None else {"exact_max_params": exact_max_params}
    theta = theta.detach().clone()
    n, C = X_retain.shape[0], fn.n_outputs
    g_forget = RowSet(fn, theta, X_forget, t_forget, loss, chunk=chunk).gradient()
    slv = make_solver(solver, lam + damping, p=fn.p, cg_iters=cg_iters, cg_tol=cg_tol, **kw)
    slv.fit(plus=[RowSet(fn, theta, X_retain, t_retain, loss, chunk=chunk)])
    delta = slv.solve(g_forget)
    evals = X_forget.shape[0] + (n * C if slv.name in ("exact", "projected")
                                 else 2 * n * slv.info.get("matvec_columns", 0)
                                 + (n * C if slv.info.get("preconditioner") == "jacobi" else 0))
    eta, trust = step_size, {}
    if max_linearization_error is not None:
        rows = RowSet(fn, theta, torch.cat([X_retain, X_forget]), torch.cat([t_retain.to(fn.device),
                      t_forget.to(fn.device)]), loss, chunk=chunk)
        eta, trust = _linearization_trust(rows, delta, step_size, max_linearization_error)
        evals += trust["gradient_evals"]
    theta = theta + eta * delta
    return theta, {"grad_norm": [float(g_forget.norm())], "step_norm": [float(eta * delta.norm())],
                   "eta": [eta], "objective": [], "solver": dict(slv.info), "gradient_evals": evals,
                   "linearization_error": trust.get("errors", []), "seconds": time.perf_counter() - start}


def _linearization_trust(rows: RowSet, delta: torch.Tensor, eta: float, tol: float) -> tuple[float, dict]:
    """The largest eta / 2^k (k < LINE_SEARCH_TRIALS) whose relative linearization error on `rows` (at their
    theta) is at most tol, or 0.0; info: the error of each trial and the gradient-equivalents spent (one forward
    and one jvp, then one forward a trial). J delta is computed once: a step eta delta predicts eta J delta."""
    f0 = rows.outputs()                                  # [n, C]
    lin = rows.jvp(delta[:, None])[0]                    # [n, C]: J delta
    lin_norm = float(lin.norm())
    errors: list[float] = []
    evals = 2 * rows.n
    for _ in range(LINE_SEARCH_TRIALS):
        moved = RowSet(rows.fn, rows.theta + eta * delta, rows.X, rows.t, rows.loss, chunk=rows.chunk).outputs()
        evals += rows.n
        err = float((moved - f0 - eta * lin).norm())
        rel = err / (eta * lin_norm) if lin_norm > 0 else (0.0 if err == 0 else float("inf"))
        errors.append(rel)
        if rel <= tol:  # a NaN error (non-finite outputs) fails the test too
            return eta, {"errors": errors, "gradient_evals": evals}
        eta /= 2
    return 0.0, {"errors": errors, "gradient_evals": evals}
