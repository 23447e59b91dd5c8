"""Leverage diagnostics of a forget set, computed before any unlearning runs (docs/design.md §4.1,
"Loss is Not Behavior").

At the original parameters theta_D (D = R u F), with A_i = F_i J_i the Lambda-weighted Jacobian rows
(F_i^T F_i = Lambda_i, see `curvature`) and the retrain geometry G_R = G_D - sum_{i in F} J_i^T Lambda_i J_i:

- self-leverage S_F = A_F G_R^-1 A_F^T ([|F| r, |F| r]); per forget sample the trace of its diagonal
  block; the spectral norm and trace of S_F;
- cross-leverage C_RF = A_R G_R^-1 A_F^T; per retain sample the Frobenius norm of its block row, on every retain
  row or on a seeded random sample of them with the standard errors of its summary (`cross_leverage_sampling`);
- the Newton / influence prediction of the retrain, theta_R ~= theta_D - delta with
  delta = G_R^-1 grad L_R(theta_D), L_R = sum_{i in R} loss_i + lam/2 ||theta||^2 (the retain gradient, not
  the assumption that theta_D is stationary); predicted output gap (original minus retrained) on F, R and
  a validation set: d_i = J_i delta. Per sample the Fisher norm sqrt(d_i^T Lambda_i d_i) (invariant to a
  common logit shift; ~ sqrt(2 KL) to first order) and the output vector (centred logits for "ce");
- leakage ratio ||C_RF g_F|| / ||S_F g_F|| in the same weighting: ||A_R w|| / ||A_F w|| with
  w = G_R^-1 J_F^T g_F (the movement caused by removing F's own gradient, g = dloss/df); the per-sample
  Fisher norms of J_i w are reported too (`predicted_removal_gap_*`): they equal the predicted gap when
  theta_D is a stationary point of L_D, and differ from it by the drift of a non-converged original;
- the predicted gap of `do_nothing` (keeping theta_D): the largest mean predicted gap over the splits.

Leverage is reported Lambda-weighted: raw J G^-1 J^T blocks scale like 1/lam along the common logit shift
that softmax ignores. For ridge regression (Lambda = 1, J = X) every quantity reduces to §4.1's closed
forms, see `ridge.ridge_diagnostics`.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np
import torch

from unlearning.leverage import curvature
from unlearning.leverage.functions import OutputFunction, StackedMemberFunction, resolve_device
from unlearning.leverage.check import DEFAULT_CHECK_ROWS, subsample_check
from unlearning.leverage.rows import RowSet
from unlearning.leverage.cost import (
    CHECK_SHARE, MIN_CHECK_ROWS, Throughput, affordable_check_rows, choose_within_budget, estimate_retrain_seconds,
    measure_throughput,
)
from unlearning.leverage.head import HeadOf, LastLayerSolver
from unlearning.leverage.solvers import (
    EXACT_MAX_PARAMS, LAST_LAYER_ABOVE, PROJECTED_MAX_PARAMS, ExactSolver, GGNSolver, choose_solver, make_solver,
)
from unlearning.models import Ensemble
from unlearning.models.training import intra_op_threads
from unlearning.progress import Progress

SPLITS = ("forget", "retain", "validation")


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties); nan when either side is constant."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"spearman needs equal lengths, got {a.size} and {b.size}")
    if a.size < 2:
        return float("nan")

    def ranks(x):
        order = np.argsort(x, kind="mergesort")
        r = np.empty(x.size)
        r[order] = np.arange(x.size, dtype=np.float64)
        _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        sums = np.bincount(inv, weights=r)
        return (sums / counts)[inv]

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _stats(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)),
            "p95": float(np.quantile(x, 0.95)), "max": float(x.max())}


@dataclass
class LeverageReport:
    """Diagnostics of one member for one forget set. Arrays are numpy, in the order of the inputs.

    r = outputs per sample in the weighted rows (C - 1 for "ce", C for "mse")."""

    solver: str
    n_params: int
    n_outputs: int
    lam: float
    loss: str
    device: str
    self_leverage: np.ndarray                 # [nF]   trace of each forget sample's block of S_F
    self_leverage_matrix: np.ndarray          # [nF*r, nF*r] S_F (Lambda-weighted)
    cross_leverage: np.ndarray                # [nC]   Frobenius norm of each sampled retain row's block row of C_RF
    self_leverage_spectral_norm: float
    self_leverage_trace: float
    predicted_gap_forget: np.ndarray          # [nF]   Fisher norm of the predicted output gap
    predicted_gap_retain: np.ndarray          # [nR]
    predicted_gap_validation: np.ndarray      # [nV]
    predicted_output_gap_forget: np.ndarray   # [nF, C] original minus retrained outputs (centred for "ce")
    predicted_output_gap_retain: np.ndarray   # [nR, C]
    predicted_output_gap_validation: np.ndarray  # [nV, C]
    predicted_removal_gap_forget: np.ndarray  # [nF] Fisher norm of J_i G_R^-1 J_F^T g_F (removal of F only)
    predicted_removal_gap_retain: np.ndarray  # [nR]
    predicted_removal_gap_validation: np.ndarray  # [nV]
    leakage_ratio: float
    predicted_gap_do_nothing: float
    newton_step_norm: float
    retain_grad_norm: float
    newton_step: np.ndarray                   # [p] delta = G_R^-1 grad L_R(theta_D); theta_R ~= theta_D - delta
    solver_info: dict = field(default_factory=dict)
    approx_error: dict | None = None          # non-exact solvers: error vs a reference on a forget subset
    timings: dict = field(default_factory=dict)
    cross_leverage_matrix: np.ndarray | None = None  # [nC*r, nF*r] C_RF when requested
    cross_leverage_rows: np.ndarray | None = None    # [nC] positions in the retain rows; None = every retain row
    cross_leverage_sampling: dict | None = None      # summary statistics of cross-leverage and their standard errors

    @property
    def n_forget(self) -> int:
        return int(self.self_leverage.size)

    def predicted_gap_means(self) -> dict[str, float]:
        return {s: float(getattr(self, f"predicted_gap_{s}").mean()) if getattr(self, f"predicted_gap_{s}").size
                else float("nan") for s in SPLITS}

    def arrays(self) -> dict[str, np.ndarray]:
        """Every per-sample / matrix field (for np.savez)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary: scalars, solver info, approximation error and per-array statistics."""
        out: dict[str, Any] = {
            "solver": self.solver, "n_params": self.n_params, "n_outputs": self.n_outputs, "lam": self.lam,
            "loss": self.loss, "device": self.device,
            "n_forget": self.n_forget, "n_retain": int(self.predicted_gap_retain.size),
            "n_validation": int(self.predicted_gap_validation.size),
            "self_leverage_spectral_norm": self.self_leverage_spectral_norm,
            "self_leverage_trace": self.self_leverage_trace,
            "leakage_ratio": self.leakage_ratio,
            "predicted_gap_do_nothing": self.predicted_gap_do_nothing,
            "predicted_gap_mean": self.predicted_gap_means(),
            "newton_step_norm": self.newton_step_norm, "retain_grad_norm": self.retain_grad_norm,
            "self_leverage": _stats(self.self_leverage), "cross_leverage": _stats(self.cross_leverage),
            "cross_leverage_sampling": self.cross_leverage_sampling,
            **{f"predicted_gap_{s}": _stats(getattr(self, f"predicted_gap_{s}")) for s in SPLITS},
            **{f"predicted_removal_gap_{s}": _stats(getattr(self, f"predicted_removal_gap_{s}")) for s in SPLITS},
            "solver_info": self.solver_info, "approx_error": self.approx_error, "timings": self.timings,
        }
        return _json_safe(out)


def _json_safe(x):
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if np.isfinite(v) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, torch.Tensor):
        return _json_safe(x.tolist())
    return x


def _block_traces(S: torch.Tensor, n: int, r: int) -> torch.Tensor:
    """Traces of the n diagonal r x r blocks of S [n*r, n*r] -> [n]."""
    return S.diagonal().reshape(n, r).sum(1)


def _spectral_norm_psd(S: torch.Tensor) -> float:
    if S.numel() == 0:
        return 0.0
    if S.shape[0] <= 256:
        return float(torch.linalg.eigvalsh(S)[-1].clamp_min(0))
    if S.shape[0] <= 4000:
        return _top_eigenvalue_psd(S)
    v = torch.ones(S.shape[0], dtype=S.dtype, device=S.device) / S.shape[0] ** 0.5
    for _ in range(300):  # power iteration on a PSD matrix
        w = S @ v
        nrm = w.norm()
        if nrm == 0:
            return 0.0
        v = w / nrm
    return float(v @ (S @ v))


def _top_eigenvalue_psd(S: torch.Tensor, k: int = 8, iters: int = 60) -> float:
    """Largest eigenvalue of a PSD matrix by subspace iteration on k vectors with a Rayleigh-Ritz step (seeded):
    n^2 k per step, never the full eigendecomposition (LAPACK's eigvalsh on 900 x 900 took 5-14 s on two busy
    cores, against 0.1 s idle). Converges like (lambda_{k+1} / lambda_1)^iters."""
    g = torch.Generator(device="cpu").manual_seed(0)
    Q = torch.linalg.qr(torch.randn(S.shape[0], k, generator=g, dtype=S.dtype).to(S.device))[0]
    for _ in range(iters):
        Q = torch.linalg.qr(S @ Q)[0]
    return float(torch.linalg.eigvalsh(Q.T @ S @ Q)[-1].clamp_min(0))


def _spectral_norm(S_F: torch.Tensor, A_F: torch.Tensor, solver: GGNSolver) -> float:
    """||S_F||_2 with S_F = A_F G^-1 A_F^T [nF r, nF r]. A dense solver with p < nF r has the same nonzero
    eigenvalues on the smaller side: B^T B [p, p] with B = L^-1 A_F^T (G = L L^T), about (nF r / p)^3 cheaper."""
    chol = getattr(solver, "_chol", None)
    if solver.name in ("exact", "last_layer") and chol is not None and A_F.shape[1] < A_F.shape[0]:
        B = torch.linalg.solve_triangular(chol, A_F.T.to(chol.dtype), upper=False)  # [p, nF r]
        return _spectral_norm_psd(B @ B.T)
    return _spectral_norm_psd(S_F)


def _output_gaps(rs: RowSet, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted output changes of a set for parameter steps [p, m]: Fisher norms [m, n] and the output
    changes [m, n, C] (centred for "ce": softmax ignores the common shift)."""
    m = steps.shape[1]
    if rs.n == 0:
        return torch.zeros(m, 0, dtype=steps.dtype), torch.zeros(m, 0, rs.C, dtype=steps.dtype)
    d = rs.jvp(steps)                                                   # [m, n, C]
    f = rs.outputs()
    fisher = torch.stack([curvature.fisher_norm(f, d[j], rs.loss) for j in range(m)])
    if rs.loss == "ce":
        d = d - d.mean(-1, keepdim=True)
    return fisher, d


# The approximation check compares the solver with the dense float64 solve on every row up to
# exact_max_params. Past it the dense reference is unaffordable (and a matrix-free CG reference cost over 40 min
# on a 9,098-parameter CNN after 10 s of diagnostics), so the check runs exact on a row subsample instead
# (`check.subsample_check`: Woodbury in the subsample's row space, the solver under test on the same rows).


def cross_leverage_sampling(values: np.ndarray, population: int, seed: int = 0, n_boot: int = 200) -> dict:
    """Summary of cross-leverage on a simple random sample of `population` retain rows, with standard errors:
    the mean's from the sample variance with the finite-population correction, the median's and P95's by a
    seeded bootstrap (the max of a sample is only a lower bound of the population's: reported without one)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    out = {"sampled": n, "of": int(population), "fraction": n / population if population else 1.0}
    if n == 0:
        return out
    if n >= population:  # every row: the statistics are exact
        return {**out, "mean": float(x.mean()), "se_mean": 0.0, "median": float(np.median(x)), "se_median": 0.0,
                "p95": float(np.quantile(x, 0.95)), "se_p95": 0.0, "max": float(x.max())}
    fpc = (1 - n / population) ** 0.5
    boot = np.random.default_rng(seed).choice(x, size=(n_boot, n), replace=True)
    return {**out, "mean": float(x.mean()),
            "se_mean": float(x.std(ddof=1) / n ** 0.5 * fpc) if n > 1 else float("nan"),
            "median": float(np.median(x)), "se_median": float(np.median(boot, 1).std(ddof=1) * fpc),
            "p95": float(np.quantile(x, 0.95)), "se_p95": float(np.quantile(boot, 0.95, axis=1).std(ddof=1) * fpc),
            "max_of_sample": float(x.max())}


class _Work:
    """The diagnostics' progress in work units that track time: a row of a Jacobian pass counts C (one
    backward pass per output), a row of a product pass (gradient, jvp, GGN row block) counts 1. The plan is made
    before anything runs and only shrinks (a pass a cache serves is taken off), so the ETA does not grow from
    mis-planned stages; a line comes at least every 10 s (`Progress` and `tick`)."""

    def __init__(self, bar: Progress, n_outputs: int):
        self.bar, self.w_jac = bar, max(1, int(n_outputs))

    def units(self, rows: int, kind: str = "product") -> int:
        return int(rows) * (self.w_jac if kind == "jacobian" else 1)

    def plan(self, units: int) -> None:
        self.bar.total += int(units)
        if self.bar._bar is not None:
            self.bar._bar.total = self.bar.total

    def skip(self, units: int) -> None:
        self.plan(-int(units))

    def __call__(self, rows: int, kind: str = "product") -> None:
        self.bar.update(self.units(rows, kind))

    def watch(self, *sets: RowSet, off: bool = False) -> None:
        for rs in sets:
            rs.on_rows = None if off else self


def diagnose(fn: OutputFunction, theta: torch.Tensor, X_forget, t_forget, X_retain, t_retain, X_val, t_val,
             lam: float, loss: str, solver: GGNSolver, *, chunk: int | None = None, check_subset: int = 16,
             exact_max_params: int = EXACT_MAX_PARAMS, keep_cross_matrix: bool = False,
             progress: bool | str | None = False, cross_sample: int | None = None, seed: int = 0,
             check_rows: int = DEFAULT_CHECK_ROWS, check: Callable[[], dict] | None = None,
             check_units: int = 0, progress_every_s: float = 10.0, progress_stream=None,
             work: "_Work | None" = None) -> LeverageReport:
    """Leverage diagnostics for an output function at theta (the original parameters theta_D).

    Targets t_* are in `curvature.make_targets` form. `solver` is a fresh GGNSolver: it is fitted here on
    the downdated geometry G_R = G_D - G_F, in one pass over the rows. `cross_sample`: cross-leverage on that
    many retain rows drawn at random (seeded by `seed`), None = every retain row; the report gives the sample's
    positions and the standard errors of its summary statistics (`cross_leverage_sampling`). Non-exact solvers
    are checked against exact (`check_subset` forget rows): on every row up to `exact_max_params`, else on
    `check_rows` retain rows (`check.subsample_check`); `check` replaces that with the caller's own (the
    last-layer mode checks against the full model's GGN), `check_units` its planned work. `progress` (True, a
    label, or None = the process default): a line at least every `progress_every_s`, in work units (`_Work`);
    `work`: a caller's open bar whose plan already holds this run's units (`planned_units`)."""
    preplanned = work is not None
    if work is None:
        desc = progress if isinstance(progress, str) else "leverage diagnostics"
        work = _Work(Progress(0, desc, unit="units", enabled=None if progress is None else bool(progress),
                              every_s=progress_every_s, stream=progress_stream), fn.n_outputs)
    with ExitStack() as opened:  # the bar opens once the work is planned (its first line shows the total)
        return _diagnose(fn, theta, X_forget, t_forget, X_retain, t_retain, X_val, t_val, lam, loss, solver,
                         work, preplanned=preplanned, chunk=chunk, check_subset=check_subset,
                         exact_max_params=exact_max_params, keep_cross_matrix=keep_cross_matrix,
                         cross_sample=cross_sample, seed=seed, check_rows=check_rows, check=check,
                         check_units=check_units, opened=opened)


def planned_units(work: _Work, solver: str, p: int, nF: int, nR: int, nV: int, nC: int, *, check_subset: int,
                  check_rows: int, exact_max_params: int, check_units: int | None = None) -> tuple[int, int, int]:
    """(total, cross-leverage, check) work units of `diagnose`: the forget rows' Jacobians, the fit's pass over
    the retain rows (none for cg), gradient and forget products, the cross-leverage rows, the predicted gaps, and
    the error check (`check_units` when the caller brings its own check)."""
    checking = solver != "exact" and check_subset > 0
    if checking and check_units is None:  # dense reference on every row, or exact on a row subsample
        check_units = work.units(nR if p <= exact_max_params else min(check_subset, nF) + min(check_rows, nR),
                                 "jacobian")
    check_units = int(check_units or 0) if checking else 0
    fit_units = work.units(nR, "jacobian") if solver != "cg" else 0
    cross_units = work.units(nC, "jacobian")
    total = (work.units(nF, "jacobian") + fit_units + work.units(nR + nF) + cross_units + work.units(nF + nR + nV)
             + check_units)
    return total, cross_units, check_units


def _cross_set(rs_R: RowSet, cross_sample: int | None, seed: int) -> tuple[RowSet, np.ndarray | None]:
    """The retain rows whose cross-leverage is computed: all, or a seeded simple random sample (sorted)."""
    if cross_sample is None or cross_sample >= rs_R.n:
        return rs_R, None
    idx = np.sort(np.random.default_rng(seed).choice(rs_R.n, size=int(cross_sample), replace=False))
    return rs_R.subset(torch.as_tensor(idx)), idx


def _diagnose(fn, theta, X_forget, t_forget, X_retain, t_retain, X_val, t_val, lam, loss, solver, work: _Work, *,
              chunk, check_subset, exact_max_params, keep_cross_matrix, cross_sample, seed, check_rows, check,
              check_units, opened: ExitStack, preplanned: bool) -> LeverageReport:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    bar = work.bar
    loss = curvature.check_loss(loss)
    if X_forget.shape[0] == 0:
        raise ValueError("the forget set is empty: nothing to diagnose")
    if loss == "ce" and fn.n_outputs < 2:
        raise ValueError(f"loss='ce' needs at least 2 outputs, the model has {fn.n_outputs}")
    if cross_sample is not None and cross_sample < 1:
        raise ValueError(f"diagnostics cross_sample = {cross_sample} must be >= 1 (or null: every retain row)")
    rs_F = RowSet(fn, theta, X_forget, t_forget, loss, chunk=chunk)
    rs_R = RowSet(fn, theta, X_retain, t_retain, loss, chunk=chunk)
    rs_V = RowSet(fn, theta, X_val, t_val, loss, chunk=chunk)
    rs_C, cross_idx = _cross_set(rs_R, cross_sample, seed)
    if cross_idx is not None and hasattr(solver, "keep_rows"):
        solver.keep_rows = False  # the sampled rows are projected again; keeping every retain row buys nothing
    work.watch(rs_F, rs_R, rs_V, rs_C)
    nF, nR, nV, nC = rs_F.n, rs_R.n, rs_V.n, rs_C.n
    checking = solver.name != "exact" and check_subset > 0
    total, cross_units, check_units = planned_units(work, solver.name, fn.p, nF, nR, nV, nC, check_subset=check_subset,
                                                    check_rows=check_rows, exact_max_params=exact_max_params,
                                                    check_units=None if check is None else check_units)
    if not preplanned:
        work.plan(total)
        opened.enter_context(bar)

    t0 = time.perf_counter()
    bar.stage("forget Jacobians")
    # Forget rows, needed explicitly (|F| is small): outputs and weighted rows A_F [nF, r, p].
    f_F, A_F3 = rs_F.all_weighted()
    nF, r, p = A_F3.shape
    A_F = A_F3.reshape(nF * r, p)
    g_F = curvature.residual(f_F, rs_F.t, loss)                          # [nF, C]
    timings["forget_jacobians"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    bar.stage(f"fit {solver.name}")
    solver.fit(plus=[rs_R, rs_F], minus=[rs_F])                         # G_R = G_D - G_F (downdate)
    timings["fit"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    bar.stage("solve")
    grad_R = rs_R.gradient() + lam * theta                              # grad L_R(theta_D) [p]
    JtgF = rs_F.vjp_sum(g_F)                                            # J_F^T g_F [p]
    sol = solver.solve(torch.stack([grad_R, JtgF], 1))                  # [p, 2]
    delta, w = sol[:, 0], sol[:, 1]
    handle = solver.leverage_handle(A_F)
    S_F = solver.cross(A_F, handle)
    S_F = 0.5 * (S_F + S_F.T)
    timings["solve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    bar.stage("cross-leverage" if cross_idx is None else f"cross-leverage ({nC} of {nR} retain rows)")
    if rs_C._cache is not None or (hasattr(solver, "kept") and solver.kept(rs_C)):
        work.skip(cross_units)  # served from the fit's pass: no Jacobians again
    cross_norms, cross_rows = [], []
    if hasattr(solver, "cross_norms") and not keep_cross_matrix:      # the norms without the rows (head mode)
        cross_norms = [norms for _, norms in solver.cross_norms(rs_C, handle)]
    else:
        for sl, C_b in solver.cross_chunks(rs_C, handle):              # C_b [b*r, nF*r]
            b = sl.stop - sl.start
            cross_norms.append(C_b.reshape(b, -1).norm(dim=1))
            if keep_cross_matrix:
                cross_rows.append(C_b)
    cross = torch.cat(cross_norms) if cross_norms else torch.zeros(0, dtype=theta.dtype)
    timings["cross"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    bar.stage("predicted gaps")
    sets = (("forget", rs_F), ("retain", rs_R), ("validation", rs_V))
    # columns: delta (predicted retrain gap) and w (removal-only movement J w: what removing F's own
    # gradient does, without the drift of a non-converged theta_D)
    gaps = {name: _output_gaps(rs, sol) for name, rs in sets}
    removal = {name: g[0][1] for name, g in gaps.items()}
    # leakage: Fisher-weighted movement of R vs F caused by removing F's gradient (ridge: ||C_RF e||/||S_F e||)
    move_F, move_R = removal["forget"].norm(), removal["retain"].norm()
    leakage = float(move_R / move_F) if float(move_F) > 0 else float("nan")
    timings["gaps"] = time.perf_counter() - t0

    self_lev = _block_traces(S_F, nF, r)
    means = [float(g[0][0].mean()) for g in gaps.values() if g[0].shape[1]]
    approx = None
    if checking:
        t0 = time.perf_counter()
        bar.stage("approximation check")
        work.watch(rs_F, rs_R, rs_V, rs_C, off=True)  # counted as planned, in one step below
        if check is not None:
            approx = check()
        elif p <= exact_max_params:
            approx = _approx_check(solver, rs_R, rs_F, A_F3, self_lev, delta, grad_R, check_subset)
        else:
            approx = subsample_check(fn, theta, rs_F.X, rs_F.t, rs_R.X, rs_R.t, loss, lam, solver.name,
                                     make_solver=solver.clone, check_subset=check_subset, check_rows=check_rows,
                                     seed=seed, spearman=spearman)
        bar.update(check_units)
        timings["approx_check"] = time.perf_counter() - t0

    bar.stage("spectral norm")
    spectral = _spectral_norm(S_F, A_F, solver)
    np_ = lambda x: x.detach().cpu().numpy()  # noqa: E731
    timings["total"] = time.perf_counter() - start
    return LeverageReport(
        solver=solver.name, n_params=p, n_outputs=fn.n_outputs, lam=float(lam), loss=loss, device=str(fn.device),
        self_leverage=np_(self_lev), self_leverage_matrix=np_(S_F), cross_leverage=np_(cross),
        self_leverage_spectral_norm=spectral, self_leverage_trace=float(self_lev.sum()),
        predicted_gap_forget=np_(gaps["forget"][0][0]), predicted_gap_retain=np_(gaps["retain"][0][0]),
        predicted_gap_validation=np_(gaps["validation"][0][0]),
        predicted_output_gap_forget=np_(gaps["forget"][1][0]), predicted_output_gap_retain=np_(gaps["retain"][1][0]),
        predicted_output_gap_validation=np_(gaps["validation"][1][0]),
        predicted_removal_gap_forget=np_(removal["forget"]), predicted_removal_gap_retain=np_(removal["retain"]),
        predicted_removal_gap_validation=np_(removal["validation"]),
        leakage_ratio=leakage, predicted_gap_do_nothing=max(means) if means else 0.0,
        newton_step_norm=float(delta.norm()), retain_grad_norm=float(grad_R.norm()), newton_step=np_(delta),
        solver_info=dict(solver.info), approx_error=approx, timings=timings,
        cross_leverage_matrix=np_(torch.cat(cross_rows)) if keep_cross_matrix and cross_rows else None,
        cross_leverage_rows=cross_idx, cross_leverage_sampling=cross_leverage_sampling(np_(cross), nR, seed),
    )


def _approx_check(solver, rs_R, rs_F, A_F3, self_lev, delta, grad_R, m) -> dict:
    """Error of a non-exact solver against the dense float64 reference on up to m forget samples (evenly
    spaced) and on the Newton step."""
    nF, r, p = A_F3.shape
    ref = ExactSolver(solver.lam)  # p <= exact_max_params (the caller skips the check past it)
    idx = np.unique(np.linspace(0, nF - 1, min(m, nF)).round().astype(int))
    ref.fit(plus=[rs_R, rs_F], minus=[rs_F])
    A_sub = A_F3[torch.as_tensor(idx, device=A_F3.device)].reshape(-1, p)
    S_ref = ref.cross(A_sub, ref.leverage_handle(A_sub))
    ref_lev = _block_traces(S_ref, len(idx), r).cpu().numpy()
    got = self_lev.detach().cpu().numpy()[idx]
    d_ref = ref.solve(grad_R)
    return {
        "reference": ref.name, "subset_size": int(len(idx)),
        "reference_info": {k: v for k, v in ref.info.items() if k != "solver"},
        "self_leverage_rel_err": float(np.linalg.norm(got - ref_lev) / max(np.linalg.norm(ref_lev), 1e-300)),
        "self_leverage_max_rel_err": float(np.max(np.abs(got - ref_lev) / np.maximum(np.abs(ref_lev), 1e-300))),
        "self_leverage_spearman": spearman(got, ref_lev) if len(idx) > 1 else None,
        "newton_step_rel_err": float((delta - d_ref).norm() / d_ref.norm().clamp_min(1e-300)),
    }


def compute_diagnostics(model_member: Ensemble, X_forget: torch.Tensor, y_forget: torch.Tensor,
                        X_retain: torch.Tensor, y_retain: torch.Tensor, X_val: torch.Tensor | None = None,
                        y_val: torch.Tensor | None = None, lam: float = 1.0, *, solver: str = "auto",
                        device: str | torch.device = "auto", loss: str = "ce", member: int = 0,
                        dtype: torch.dtype = torch.float64, proj_dim: int = 2048, proj_kind: str = "gaussian",
                        cg_iters: int = 500, cg_tol: float = 1e-10, check_subset: int = 16,
                        exact_max_params: int = EXACT_MAX_PARAMS, chunk: int | None = None, seed: int = 0,
                        keep_cross_matrix: bool = False, progress: bool | str | None = False,
                        label_smoothing: float = 0.0, cross_sample: int | None = None,
                        check_rows: int = DEFAULT_CHECK_ROWS, last_layer_above: int | None = LAST_LAYER_ABOVE,
                        budget_seconds: float | None = None, budget_retrains: float | None = None,
                        epochs: int | None = None, throughput: Throughput | None = None,
                        head_rank: int | None = None, threads: int | None = None, progress_every_s: float = 10.0,
                        progress_stream=None) -> LeverageReport:
    """Leverage diagnostics (docs/design.md §4.1) of member `member` of `model_member` for a forget set.

    The model was trained on D = retain u forget. `lam` is the L2 coefficient of the sum-of-losses
    objective L = sum_i loss_i + lam/2 ||theta||^2 (for a mean loss with weight decay wd: lam = n * wd).
    `solver`: "exact" | "projected" | "cg" | "last_layer" | "auto": by parameter count (`solvers.choose_solver`,
    last_layer past `last_layer_above`), and with `budget_seconds` (e.g. one retrain) the last-layer mode when
    the full-model choice's estimated cost (`cost.estimate_diagnostics_seconds`, from `throughput` or a probe)
    exceeds half of it; `budget_retrains` x one retrain (`epochs` over the retain and forget rows, timed by the
    same probe: `cost.estimate_retrain_seconds`) when no `budget_seconds` is given. "last_layer" diagnoses the head over the penultimate features in float64 (the report's
    newton_step is then in head space, `head.HeadFunction` order; `head_rank`: the head moves only within that many
    principal feature directions, `head.HeadOf.reduce`) and checks its agreement with the full GGN on
    a row subsample. Non-exact solvers report `approx_error` (see `diagnose`). `dtype`: the full model's
    Jacobians (float32 in production; sums and factorizations are float64 either way). `device`: "auto" uses
    CUDA when present. `cross_sample`, `check_rows`, `progress`: see `diagnose`. `label_smoothing`: the recipe's,
    so the gradients are those of the loss the model was trained on. `threads`: intra-op threads while they run
    on CPU (None = as set; 1 is what training uses: these are many mid-sized ops, and on two shared cores one
    thread ran the Fashion-MNIST diagnostics 3-6x faster than two). The model is never modified."""
    with intra_op_threads(threads if torch.device(resolve_device(device)).type == "cpu" else None):
        return _compute(model_member, X_forget, y_forget, X_retain, y_retain, X_val, y_val, lam, solver=solver,
                        device=device, loss=loss, member=member, dtype=dtype, proj_dim=proj_dim,
                        proj_kind=proj_kind, cg_iters=cg_iters, cg_tol=cg_tol, check_subset=check_subset,
                        exact_max_params=exact_max_params, chunk=chunk, seed=seed,
                        keep_cross_matrix=keep_cross_matrix, progress=progress, label_smoothing=label_smoothing,
                        cross_sample=cross_sample, check_rows=check_rows, last_layer_above=last_layer_above,
                        budget_seconds=budget_seconds, budget_retrains=budget_retrains, epochs=epochs,
                        throughput=throughput, head_rank=head_rank, progress_every_s=progress_every_s,
                        progress_stream=progress_stream)


def _compute(model_member, X_forget, y_forget, X_retain, y_retain, X_val, y_val, lam, *, solver, device, loss,
             member, dtype, proj_dim, proj_kind, cg_iters, cg_tol, check_subset, exact_max_params, chunk, seed,
             keep_cross_matrix, progress, label_smoothing, cross_sample, check_rows, last_layer_above,
             budget_seconds, budget_retrains, epochs, throughput, head_rank, progress_every_s,
             progress_stream) -> LeverageReport:
    fn = StackedMemberFunction(model_member, member, dtype=dtype, device=device)
    C = fn.n_outputs
    if X_val is None:
        X_val = X_forget[:0]
        y_val = y_forget[:0]
    auto = None
    name = solver
    if solver == "auto":
        name = choose_solver(fn.p, exact_max_params, PROJECTED_MAX_PARAMS, last_layer_above)
        n_rows = X_retain.shape[0] + X_forget.shape[0]
        tp = None
        if budget_seconds is None and budget_retrains is not None and epochs is not None:
            tp = throughput or measure_throughput(fn, X_retain, model=model_member.select(member), y=y_retain)
            budget_seconds = budget_retrains * estimate_retrain_seconds(n_rows, epochs, tp.seconds_per_sample_grad)
        auto = {"by_parameter_count": name, "budget_seconds": budget_seconds}
        if budget_seconds is not None:
            tp = tp or throughput or measure_throughput(fn, X_retain, model=model_member.select(member), y=y_retain)
            head_d = HeadOf(fn).fn.d if name != "last_layer" else None
            name, est = choose_within_budget(
                name, budget_seconds, n_rows=n_rows, n_forget=X_forget.shape[0],
                n_params=fn.p, n_outputs=C, seconds_per_sample_grad=tp.seconds_per_sample_grad,
                flops_per_second=tp.flops_per_second, feature_dim=head_d, head_rank=head_rank, proj_dim=proj_dim,
                cross_sample=cross_sample, check_rows=check_rows, check_subset=check_subset,
                n_validation=X_val.shape[0], loss=loss)
            if check_rows > MIN_CHECK_ROWS:  # the check's share of the budget bounds its rows (stated below)
                check_rows = affordable_check_rows(
                    check_rows, CHECK_SHARE * budget_seconds, n_forget=X_forget.shape[0], n_params=fn.p,
                    n_outputs=C, seconds_per_sample_grad=tp.seconds_per_sample_grad,
                    flops_per_second=tp.flops_per_second, check_subset=check_subset, loss=loss)
            auto.update(estimated_seconds=est, seconds_per_sample_grad=tp.seconds_per_sample_grad,
                        flops_per_second=tp.flops_per_second, check_rows=check_rows)
        auto["picked"] = name
    if name == "last_layer":
        rep = _last_layer(fn, X_forget, y_forget, X_retain, y_retain, X_val, y_val, lam, loss, label_smoothing,
                          chunk=chunk, check_subset=check_subset, keep_cross_matrix=keep_cross_matrix,
                          progress=progress, cross_sample=cross_sample, seed=seed, check_rows=check_rows,
                          progress_every_s=progress_every_s, progress_stream=progress_stream, head_rank=head_rank)
    else:
        tg = lambda y: curvature.make_targets(y, C, loss, dtype, fn.device, label_smoothing)  # noqa: E731
        slv = make_solver(name, lam, p=fn.p, proj_dim=proj_dim, proj_kind=proj_kind, seed=seed, cg_iters=cg_iters,
                          cg_tol=cg_tol, exact_max_params=exact_max_params)
        rep = diagnose(fn, fn.theta0, X_forget, tg(y_forget), X_retain, tg(y_retain), X_val, tg(y_val), lam, loss,
                       slv, chunk=chunk, check_subset=check_subset, exact_max_params=exact_max_params,
                       keep_cross_matrix=keep_cross_matrix, progress=progress, cross_sample=cross_sample, seed=seed,
                       check_rows=check_rows, progress_every_s=progress_every_s, progress_stream=progress_stream)
    if auto is not None:
        rep.solver_info["auto"] = auto
    return rep


def _last_layer(fn: StackedMemberFunction, X_forget, y_forget, X_retain, y_retain, X_val, y_val, lam, loss,
                label_smoothing, *, check_subset, check_rows, seed, head_rank, **kw) -> LeverageReport:
    """The head's diagnostics over the penultimate features (float64), checked against the full model's GGN
    on a row subsample (`check.subsample_check`). One progress bar plans the feature pass and the diagnostics."""
    head = HeadOf(fn, X_retain)
    C = fn.n_outputs
    nF, nR, nV = X_forget.shape[0], X_retain.shape[0], X_val.shape[0]
    progress, cross_sample = kw.get("progress", False), kw.get("cross_sample")
    work = _Work(Progress(0, progress if isinstance(progress, str) else "leverage diagnostics", unit="units",
                          enabled=None if progress is None else bool(progress), every_s=kw.pop("progress_every_s"),
                          stream=kw.pop("progress_stream")), C)
    units = (min(check_subset, nF) + min(check_rows, nR)) * C
    nC = nR if cross_sample is None else min(cross_sample, nR)
    total = planned_units(work, "last_layer", 0, nF, nR, nV, nC, check_subset=check_subset, check_rows=check_rows,
                          exact_max_params=0, check_units=units)[0]
    work.plan(nF + nR + nV + total)  # the feature pass, then the diagnostics
    with work.bar:
        work.bar.stage("features")
        raw = {k: head.raw_features(X, on_rows=work) for k, X in (("F", X_forget), ("R", X_retain), ("V", X_val))}
        head.reduce(raw["R"], head_rank)
        return _head_diagnostics(fn, head, raw, y_forget, y_retain, y_val, X_forget, X_retain, lam, loss,
                                 label_smoothing, work, check_subset=check_subset, check_rows=check_rows, seed=seed,
                                 check_units=units, **kw)


def _head_diagnostics(fn, head, raw, y_forget, y_retain, y_val, X_forget, X_retain, lam, loss, label_smoothing, work,
                      *, check_subset, check_rows, seed, check_units, **kw) -> LeverageReport:
    hf = head.fn
    C = fn.n_outputs
    tg = lambda y, dt: curvature.make_targets(y, C, loss, dt, fn.device, label_smoothing)  # noqa: E731
    H = {k: hf.inputs(h) for k, h in raw.items()}

    def check() -> dict:
        return subsample_check(fn, fn.theta0, X_forget, tg(y_forget, fn.dtype), X_retain, tg(y_retain, fn.dtype), loss,
                               lam, "last_layer", head=head, check_subset=check_subset, check_rows=check_rows,
                               seed=seed, spearman=spearman)

    rep = diagnose(hf, hf.theta0, H["F"], tg(y_forget, hf.dtype), H["R"], tg(y_retain, hf.dtype), H["V"],
                   tg(y_val, hf.dtype), lam, loss, LastLayerSolver(lam, work_dtype=fn.dtype), check_subset=check_subset,
                   check_rows=check_rows, seed=seed, check=check if check_subset > 0 else None,
                   check_units=check_units, work=work, **kw)
    rep.solver_info.update(full_params=fn.p, head_params=hf.p, features=hf.d, head_rank=hf.k if hf.basis is not None
                           else None, layer=head.layer)
    return rep
