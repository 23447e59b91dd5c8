"""Leverage diagnostics as a task, and their MLflow logging (report JSON, per-sample tables, plots)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from prefect import task

from adapters import plots
from adapters.clock import computes
from unlearning.batch.rows import retain_rows, validation_rows
from unlearning.config import Diagnostics
from unlearning.data.store import Prepared
from unlearning.leverage import LeverageReport, compute_diagnostics
from unlearning.models import Ensemble


@task(name="leverage-diagnostics")
@computes
def leverage_diagnostics(cfg: Diagnostics, weight_decay: float, seed: int, progress: bool, prepared: Prepared,
                         state_manifest: pd.DataFrame, forget_ids: list[str], model: Ensemble,
                         device: str, label_smoothing: float = 0.0, *, epochs: int | None = None,
                         cross_every_row: bool = False) -> tuple[LeverageReport, dict[str, pd.DataFrame]]:
    """Diagnostics of the production model for this forget set; retain = retained training rows minus F.
    `cfg`: params.diagnostics; `weight_decay`: train.weight_decay (the damping); `seed`, `progress`: base.*;
    `label_smoothing`: train.label_smoothing (the loss the model was trained on); `epochs`: train.epochs, so that
    solver auto keeps within diagnostics.max_retrains retrains (None: by parameter count only);
    `cross_every_row`: cross-leverage on every retain row whatever diagnostics.cross_sample says (the leverage
    partition ranks every retain row by it)."""
    m = state_manifest
    f_rows, r_rows, v_rows = prepared.rows(forget_ids), retain_rows(m, forget_ids), validation_rows(m)
    X = prepared.tensor()
    y = torch.as_tensor(prepared.label, dtype=torch.long)
    home = next(model.parameters()).device  # the state's model goes back there: later stages compute on it
    report = compute_diagnostics(model.cpu(), X[f_rows], y[f_rows], X[r_rows], y[r_rows], X[v_rows], y[v_rows],
                                 lam=cfg.damping(len(f_rows) + len(r_rows), weight_decay), solver=cfg.solver,
                                 device=device, proj_dim=cfg.proj_dim, check_subset=cfg.check_subset, seed=seed,
                                 progress="leverage diagnostics" if progress else False,
                                 label_smoothing=label_smoothing, dtype=getattr(torch, cfg.dtype),
                                 cross_sample=None if cross_every_row else cfg.cross_sample, check_rows=cfg.check_rows,
                                 last_layer_above=cfg.last_layer_above, budget_retrains=cfg.max_retrains,
                                 head_rank=cfg.head_rank, threads=cfg.threads,
                                 epochs=epochs)
    model.to(home)
    ids = m["sample_id"].to_numpy()
    cross = np.full(len(r_rows), np.nan)  # NaN: a retain row outside the cross-leverage sample
    cross[report.cross_leverage_rows if report.cross_leverage_rows is not None else slice(None)] = report.cross_leverage
    tables = {
        "forget": pd.DataFrame({"sample_id": ids[f_rows], "group": m["group"].to_numpy()[f_rows],
                                "self_leverage": report.self_leverage,
                                "predicted_gap": report.predicted_gap_forget}),
        "retain": pd.DataFrame({"sample_id": ids[r_rows], "group": m["group"].to_numpy()[r_rows],
                                "cross_leverage": cross,
                                "predicted_gap": report.predicted_gap_retain}),
        "validation": pd.DataFrame({"sample_id": ids[v_rows], "predicted_gap": report.predicted_gap_validation}),
    }
    return report, tables


def log_diagnostics(tracker, run_id: str, report: LeverageReport, tables: dict[str, pd.DataFrame]) -> None:
    summary = report.to_dict()
    tracker.log_json(run_id, summary, "leverage_report.json")
    for name, df in tables.items():
        tracker.log_table(run_id, df, f"leverage_{name}.json")
    tracker.log_metrics(run_id, {
        "self_leverage_spectral_norm": report.self_leverage_spectral_norm,
        "self_leverage_trace": report.self_leverage_trace, "leakage_ratio": report.leakage_ratio,
        "predicted_gap_do_nothing": report.predicted_gap_do_nothing,
        **{f"predicted_gap_mean/{k}": v for k, v in report.predicted_gap_means().items()},
        **{f"cross_leverage/{k}": v for k, v in (report.cross_leverage_sampling or {}).items()
           if isinstance(v, (int, float)) and np.isfinite(v)},
        **{f"approx_error/{k}": v for k, v in (report.approx_error or {}).items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)},
        **{f"seconds/{k}": v for k, v in report.timings.items() if isinstance(v, (int, float))}})
    tracker.log_params(run_id, {"solver": report.solver, "n_params": report.n_params, "lam": report.lam,
                                "device": report.device})
    fig = plots.histograms({"forget self-leverage": report.self_leverage,
                            "retain cross-leverage": report.cross_leverage}, "leverage", "Leverage per sample")
    tracker.log_figure(run_id, fig, "leverage_histograms.png"); plots.close(fig)
    sampled = tables["retain"].dropna(subset=["cross_leverage"])  # the rows of the cross-leverage sample
    fig = plots.by_group(sampled, "cross_leverage", "Retain cross-leverage by group")
    tracker.log_figure(run_id, fig, "cross_leverage_by_group.png"); plots.close(fig)
    eig = np.linalg.eigvalsh(report.self_leverage_matrix) if report.self_leverage_matrix.size else np.zeros(0)
    fig = plots.spectrum(eig[::-1], "Spectrum of the forget self-leverage S_F")
    tracker.log_figure(run_id, fig, "self_leverage_spectrum.png"); plots.close(fig)


def poor_check_line(report: LeverageReport) -> str | None:
    """One console line when the diagnostics' own error check against exact is poor (unlearning/leverage/check.py
    POOR_SPEARMAN, POOR_REL_ERR): the rules reading the predicted gap would then decide on noise."""
    from unlearning.leverage.check import poor_check

    poor = poor_check(report.approx_error)
    if not poor:
        return None
    return (f"diagnostics' error check against exact is poor ({'; '.join(poor)}; solver {report.solver}): the "
            f"predicted gaps the selection rules read are unreliable for this model; try diagnostics.solver exact or "
            f"a larger diagnostics.proj_dim, or leave the choice to the certificate (deletion.method auto still "
            f"certifies whatever it picks)")

