"""A batch's fixed costs: what its wall time holds beside the training the plan predicts (docs/design.md §4.8).

`unlearning.plan.predicted_seconds` predicts the batch's training and certification from a probe of the model
(diagnostics, references, unlearn, certify). A batch's wall time also holds costs that do not grow with the
model: starting the stage (DVC, joining the session, the Prefect flow and task runs), loading the state,
validating the request file, promoting (registering the model, writing the state), the MLflow calls, and the
erasure (`unlearn erase` after `dvc repro`). With a one-second model these are most of the batch.

They are measured, not modelled: bench/session_overhead.py runs one batch of a project scaffolded by
`unlearn init` through `unlearn repro` and writes them (seconds) to `.unlearning/fixed_costs.json` of that
project, or prints them; `fixed_costs` reads that file when the project has one, else `DEFAULT_FIXED_S`
(from `make run`'s session on a quieter day, docs/evidence.md "`make run`'s wall time": the deletion stage's
wall time less its training, and `unlearn erase`; on a loaded machine both are several times larger, which
the project's own measured file then says). Pure: json and pathlib only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

FILE = Path(".unlearning") / "fixed_costs.json"  # relative to the project folder (the one holding params.yaml)
# the parts, by name (bench/session_overhead.py measures them on `unlearn repro` of one 20-row batch)
PARTS = {
    "stage": "the deletion stage minus its training: DVC, the session, Prefect runs, loading the state, "
             "validating the file, promoting, MLflow",
    "erase": "`unlearn erase` after `dvc repro` (rewrites the prepared store and the original, dvc commit, dvc gc)",
}
DEFAULT_FIXED_S = {"stage": 12.0, "erase": 4.0}


def fixed_costs(root: str | Path | None = None) -> tuple[dict[str, float], str]:
    """(seconds per part, where they come from): the project's measured file when it holds every part as a
    finite number >= 0, else the defaults."""
    if root is not None:
        path = Path(root) / FILE
        try:
            data = json.loads(path.read_text())
            costs = {k: float(data[k]) for k in PARTS}
            if all(math.isfinite(v) and v >= 0 for v in costs.values()):
                return costs, str(path)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return dict(DEFAULT_FIXED_S), "defaults (bench/session_overhead.py on digits; unlearning/overhead.py)"


def write_fixed_costs(root: str | Path, costs: dict[str, float]) -> Path:
    """The bench's measurement, for `fixed_costs` (only the known parts, rounded to 0.1 s)."""
    path = Path(root) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: round(float(costs[k]), 1) for k in PARTS}, indent=1) + "\n")
    return path


def batch_wall_seconds(training_s: float, costs: dict[str, float]) -> dict[str, float]:
    """The batch's predicted wall time: training (the plan's `total`) plus every fixed part."""
    fixed = sum(costs[k] for k in PARTS)
    return {"training": round(training_s, 3), **{k: round(costs[k], 3) for k in PARTS},
            "fixed": round(fixed, 3), "wall": round(training_s + fixed, 3)}


def wall_time_line(wall: dict[str, float], source: str) -> str:
    """One line for `unlearn plan`."""
    parts = " + ".join(f"{k} {wall[k]:.1f} s" for k in PARTS)
    return (f"predicted wall time of the batch: {wall['wall']:.1f} s = training {wall['training']:.1f} s + fixed "
            f"{wall['fixed']:.1f} s ({parts}; fixed costs from {source})")
