"""Leverage diagnostics (docs/design.md §4.1): per-sample Jacobians, the Lambda-weighted GGN, exact / projected /
matrix-free solvers, the head's GGN over the penultimate features (last_layer), the downdated retrain geometry
G_R = G_D - G_F, and the Newton prediction of the retrain; `cost` predicts their seconds against one retrain.
CUDA is used when present (device="auto")."""

from unlearning.leverage.cost import (
    Throughput, choose_within_budget, estimate_diagnostics_seconds, estimate_retrain_seconds, measure_throughput,
)
from unlearning.leverage.curvature import LOSSES, make_targets
from unlearning.leverage.head import HeadFunction, HeadOf, LastLayerSolver
from unlearning.leverage.diagnostics import LeverageReport, compute_diagnostics, diagnose, spearman
from unlearning.leverage.functions import LinearFunction, OutputFunction, StackedMemberFunction, resolve_device
from unlearning.leverage.newton import newton_steps
from unlearning.leverage.projection import RandomProjection
from unlearning.leverage.ridge import RidgeLeverage, ridge_diagnostics
from unlearning.leverage.rows import RowSet
from unlearning.leverage.solvers import (
    EXACT_MAX_PARAMS, LAST_LAYER_ABOVE, PROJECTED_MAX_PARAMS, SOLVERS, CGSolver, ExactSolver, GGNSolver, ProjectedSolver,
    choose_solver, make_solver,
)

__all__ = [
    "LOSSES", "make_targets", "LeverageReport", "compute_diagnostics", "diagnose", "spearman", "LinearFunction",
    "OutputFunction", "StackedMemberFunction", "resolve_device", "newton_steps", "RandomProjection",
    "RidgeLeverage", "ridge_diagnostics", "RowSet", "EXACT_MAX_PARAMS", "PROJECTED_MAX_PARAMS", "SOLVERS",
    "CGSolver", "ExactSolver", "GGNSolver", "ProjectedSolver", "choose_solver", "make_solver", "LAST_LAYER_ABOVE",
    "HeadFunction", "HeadOf", "LastLayerSolver", "Throughput", "choose_within_budget", "estimate_diagnostics_seconds",
    "estimate_retrain_seconds", "measure_throughput",
]
