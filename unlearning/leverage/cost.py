"""What the leverage diagnostics cost, before they run, in seconds comparable to one retrain.

Both a retrain and the diagnostics are counted in two measured units of this model on this device:
`seconds_per_sample_grad` (one row's forward + backward inside a batched training step) and
`flops_per_second` (dense float32 matmul throughput). One retrain ~ epochs x rows x seconds_per_sample_grad.
The diagnostics (docs/design.md §4.1) add, per solver:

- every solver: the gradient (one vjp per row) and the predicted gaps (two jvp columns per row), ~ 2 sample grads;
- full-model solvers: per-sample Jacobians of every row, C backward passes each (x JACOBIAN_OVERHEAD for the
  per-sample vmap), then exact: n r p^2 flops (+ p^3 / 3), projected: 2 n r p k (projection) + n r k^2 (Gram),
  cg: `CG_ITERATIONS` GGN products of (2 + |F| r) columns over every row;
- last_layer: one forward pass for the features, C (C + 1) / 2 products of n (d + 1)^2 for the head GGN,
  p_h^3 / 3 for its Cholesky;
- cross-leverage on the sampled rows: 2 n_cross r k |F| r flops (k = p_h, k or p);
- the subsample error check: full Jacobians of (check_rows + check_subset) rows and two kernel products.

`choose_within_budget` is `solver: auto` under a budget: the solver picked by parameter count when its estimate
fits, else the last-layer mode. The estimate is an order-of-magnitude model (bench/diagnostics_cost.py prints it
beside the measured seconds), so the budget test keeps a safety factor.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

JACOBIAN_OVERHEAD = 2.0   # a per-sample Jacobian row costs ~2 batched backward passes (vmap over samples and outputs)
CG_ITERATIONS = 100       # typical iterations of the CG solver to 1e-10 on the project's models (bench/leverage.py)
SAFETY = 0.5              # auto picks a full-model solver only when its estimate is within half the budget
CHECK_SHARE = 0.25        # the error check's share of the budget (its retain rows shrink to fit, down to MIN_CHECK_ROWS)
MIN_CHECK_ROWS = 16


@dataclass(frozen=True)
class Throughput:
    """This model on this device: seconds per row of a batched forward + backward, and matmul flop/s."""

    seconds_per_sample_grad: float
    flops_per_second: float


def estimate_retrain_seconds(n_rows: int, epochs: int, seconds_per_sample_grad: float) -> float:
    """One plain retrain of the model: epochs x rows x seconds per row of a training step."""
    return float(epochs) * n_rows * seconds_per_sample_grad


def estimate_diagnostics_seconds(n_rows: int, n_forget: int, n_params: int, n_outputs: int, solver: str,
                                 seconds_per_sample_grad: float, *, flops_per_second: float = 2e10,
                                 feature_dim: int | None = None, head_rank: int | None = None, proj_dim: int = 2048,
                                 cross_sample: int | None = 2000, check_rows: int = 64, check_subset: int = 16,
                                 n_validation: int = 0, loss: str = "ce") -> float:
    """Predicted seconds of `diagnose` for `solver` in exact | projected | cg | last_layer (see the module
    docstring). `n_rows`: training rows (retain + forget); `feature_dim`: the head's input width (last_layer;
    default sqrt(n_params)); `head_rank`: its principal directions kept (None = all); `cross_sample`: retain rows sampled for cross-leverage (None = every row)."""
    n, nF, p, C = int(n_rows), int(n_forget), int(n_params), int(n_outputs)
    r = C - 1 if loss == "ce" and C > 1 else C
    sg, fl = float(seconds_per_sample_grad), float(flops_per_second)
    jac = C * JACOBIAN_OVERHEAD * sg                        # one row's weighted Jacobian [r, p]
    nc = n if cross_sample is None else min(int(cross_sample), n)
    common = 2.0 * (n + n_validation) * sg                  # gradient + predicted-gap jvps
    check = 0.0
    if solver != "exact" and check_subset > 0:
        q, m = check_rows * r, min(check_subset, nF) * r
        check = (check_rows + min(check_subset, nF)) * jac + 2.0 * (q * q + q * m) * p / fl
    if solver == "exact":
        return common + (n + nF) * jac + (n * r * p * p + p ** 3 / 3 + 2.0 * nc * r * p * nF * r) / fl
    if solver == "projected":
        k = min(proj_dim, p)
        cross_rows = 0 if nc >= n else nc                   # kept from the fit when every row is sampled
        return (common + check + (n + nF + cross_rows) * jac
                + (2.0 * (n + nF + cross_rows) * r * p * k + n * r * k * k + k ** 3 / 3 + 2.0 * nc * r * k * nF * r) / fl)
    if solver == "cg":
        columns = 2 + nF * r
        return common + check + nF * jac + CG_ITERATIONS * n * columns * 2.0 * sg + nc * jac
    if solver == "last_layer":
        d1 = (feature_dim if feature_dim is not None else int(p ** 0.5)) + 1
        d1 = d1 if head_rank is None else min(d1, int(head_rank))
        ph = C * d1
        return (common + check + (n + n_validation) * sg / 3
                + (n * C * (C + 1) * d1 * d1 + ph ** 3 / 3 + 2.0 * ph * ph * nF * r + 2.0 * (nc + nF) * ph * nF * r)
                / fl)
    raise ValueError(f"solver={solver!r} has no cost model; allowed: exact, projected, cg, last_layer")


def estimate_check_seconds(check_rows: int, n_forget: int, n_params: int, n_outputs: int,
                           seconds_per_sample_grad: float, *, flops_per_second: float = 2e10, check_subset: int = 16,
                           loss: str = "ce") -> float:
    """The subsample error check (`check.subsample_check`): full Jacobians of its rows, then the Woodbury kernel
    B B^T and the products with the forget rows, q = check_rows r and m = check_subset r rows of p columns."""
    C = int(n_outputs)
    r = C - 1 if loss == "ce" and C > 1 else C
    q, m = check_rows * r, min(check_subset, n_forget) * r
    jac = C * JACOBIAN_OVERHEAD * seconds_per_sample_grad
    return (check_rows + min(check_subset, n_forget)) * jac + 2.0 * (q * q + 2 * q * m) * n_params / flops_per_second


def affordable_check_rows(check_rows: int, seconds: float, **estimate_kwargs) -> int:
    """The most retain rows, at most `check_rows` (halving, down to MIN_CHECK_ROWS), whose check is estimated
    to take at most `seconds`: the check keeps a stated size at every model size and stays within its share."""
    rows = int(check_rows)
    while rows > MIN_CHECK_ROWS and estimate_check_seconds(rows, **estimate_kwargs) > seconds:
        rows = max(MIN_CHECK_ROWS, rows // 2)
    return rows


def choose_within_budget(by_count: str, budget_seconds: float | None, **estimate_kwargs) -> tuple[str, dict]:
    """`solver: auto` under a budget: `by_count` (the parameter-count choice) when its estimate is within
    SAFETY x budget (or no budget is given), else "last_layer". Returns (solver, {solver: estimated seconds})."""
    names = [by_count] if by_count == "last_layer" else [by_count, "last_layer"]
    est = {s: estimate_diagnostics_seconds(solver=s, **estimate_kwargs) for s in names}
    if budget_seconds is None or by_count == "last_layer" or est[by_count] <= SAFETY * budget_seconds:
        return by_count, est
    return "last_layer", est


def measure_throughput(fn, X: torch.Tensor, rows: int = 64, repeats: int = 5, *, model=None,
                       y: torch.Tensor | None = None) -> Throughput:
    """Seconds per row of a training step and float32 matmul flop/s on fn's device (best of `repeats`: the
    machine, not its noise). With `model` (an Ensemble) and labels `y`: one epoch of the real training path
    (`train_ensemble`, its fused kernel and optimizer, one intra-op thread) over 4 x `rows` rows of X in
    batches of `rows`, on a copy of one member; else a forward + backward of `fn` on `rows` rows."""
    from unlearning.models.training import intra_op_threads, train_ensemble

    if model is not None and y is not None and X.shape[0] >= rows:
        n = min(4 * rows, X.shape[0])
        copy_ = copy.deepcopy(model.select(0)).to(device=fn.device, dtype=torch.float32)
        Xc, yc = X[:n].to(fn.device, torch.float32), y[:n].to(fn.device)
        best = min(train_ensemble(copy_, Xc, yc, epochs=1, batch_size=rows, lr=1e-4).seconds for _ in range(repeats))
        return Throughput(seconds_per_sample_grad=best / n, flops_per_second=_matmul_flops(fn.device, repeats))
    module = copy.deepcopy(fn.module).to(torch.float32)  # a private float32 copy: fn stays as it is
    Xb = fn.cast(X[:rows]).to(torch.float32)
    theta = fn.theta0.to(torch.float32).clone().requires_grad_(True)
    consts = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in fn.constants.items()}
    best = float("inf")
    with intra_op_threads(1 if Xb.device.type == "cpu" else None):
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = module.call_member(fn.unflatten(theta), consts, Xb)   # [b, C]
            out.logsumexp(1).sum().backward()
            best = min(best, time.perf_counter() - t0)
            theta.grad = None
    return Throughput(seconds_per_sample_grad=best / max(1, Xb.shape[0]),
                      flops_per_second=_matmul_flops(Xb.device, repeats))


def _matmul_flops(device, repeats: int) -> float:
    a = torch.randn(512, 512, device=device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        (a @ a).sum().item()
        best = min(best, time.perf_counter() - t0)
    return 2 * 512 ** 3 / max(best, 1e-9)
