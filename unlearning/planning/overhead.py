"""One accounting of a batch's wall time, for its plan and its "plan vs actual" line (docs/design.md §4.6, §4.8).

A batch's wall time (from the moment it starts loading the state to the end of its erasure) splits into seven
phases that never overlap and sum to it:

- validation: the request file's checks (pandera, the Great Expectations suite);
- diagnostics: the leverage diagnostics (0 when no candidate the plan could try reads them);
- references: training oracles and shadows (wall time: chunks in parallel count once);
- candidates: selecting, planning (the timing probe), running and certifying the candidates, promoting the
  accepted one, less the references and the MLflow calls inside;
- tracking: every MLflow call and review figure, wherever it happens;
- erase: the erasure from every store the stage may touch;
- orchestration: the rest: loading the state, the partition, Prefect's task runs, the summary.

`account` computes them from the intervals adapters/clock.py records; the plan predicts the same phases
(`predict`): diagnostics, references and candidates from the probe of this model on this device (unlearning/planning/plan.py
predicted_seconds), the others (which do not grow with the model) from this project's past batches (`History`: the
median of the last ones, their range; defaults before the first). The plan's range: the model phases scaled by the
probe's fastest and slowest round (unlearning/planning/costs.py ProbeConditions), the others by their history's.

Outside the batch, a command also pays for its stage's start and end and, under `dvc repro`, the `unlearn erase`
after it: `outside_costs` (measured by bench/session_overhead.py into .unlearning/fixed_costs.json, else defaults).
Pure: json, statistics and pathlib only.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from unlearning.planning.intervals import Interval, clip, length, minus, union

PHASES = ("validation", "diagnostics", "references", "candidates", "tracking", "erase", "orchestration")
MODEL_PHASES = ("diagnostics", "references", "candidates")  # predicted from the probe (they grow with the model)
FIXED_PHASES = ("validation", "tracking", "erase", "orchestration")  # predicted from past batches
# Which phase an interval counts under where two overlap (an MLflow call inside a candidate is tracking; the
# references trained inside a candidate's certificate are references); orchestration is what none covers.
PRECEDENCE = ("tracking", "references", "erase", "validation", "diagnostics", "candidates")
# Before a project's first batch: one 20-row digits batch (MLP, exact retrain) of `unlearn repro` with a resident
# server (`unlearn up`), load 5-15 on 2 cores (docs/evidence.md); the range below covers a quiet machine to that.
DEFAULT_FIXED_S = {"validation": 0.8, "tracking": 3.0, "erase": 0.8, "orchestration": 2.5}
DEFAULT_CANDIDATES_EXTRA_S = 1.5  # promoting (the state's write), selecting and the gate, beside the training
DEFAULT_RANGE = (0.5, 2.0)  # the fixed phases' range without a history: half to twice the defaults
# The fixed phases' range with a history: at least this around the median, however alike the last batches were
# (one or two batches say little of the machine's own variation)
MIN_RANGE = (0.75, 1.33)
HISTORY_KEEP = 20  # the last batches a project's history keeps
HISTORY_USE = 5  # the last batches a prediction reads


def account(start: float, end: float, intervals: dict[str, list[Interval]]) -> dict[str, float]:
    """Seconds per phase of the batch that ran from `start` to `end`, from the intervals each phase ran in
    (clipped to the batch; overlaps go to the first phase of PRECEDENCE, the rest of the time to orchestration).
    The phases sum to `end - start` exactly (to float rounding) and none is negative."""
    taken: list[Interval] = []
    out = {}
    for name in PRECEDENCE:
        mine = minus(union(clip(intervals.get(name, []), start, end)), taken)
        out[name] = length(mine)
        taken = union(taken + mine)
    out["orchestration"] = max(0.0, (end - start) - length(taken))
    return {k: out[k] for k in PHASES}


def total(phases: dict[str, float]) -> float:
    return sum(phases.get(k, 0.0) for k in PHASES)


# --- the history of a project's batches (seconds only: no id, no row) ------------------------------------------
class History:
    """The measured phases of a project's last batches (a JSON line each; `path`: cache/costs/phases.jsonl), with
    what the plan predicted for the model phases, so the residual of `candidates` (what surrounds the training)
    is learned too."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def records(self) -> list[dict]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and _finite_phases(rec.get("actual")):
                out.append(rec)
        return out

    def add(self, actual: dict[str, float], predicted_model: dict[str, float] | None, n_forget: int) -> None:
        """Append one batch (the file keeps the last HISTORY_KEEP), written whole to a temporary file first."""
        keep = self.records()[-(HISTORY_KEEP - 1):]
        keep.append({"at": round(time.time(), 1), "n_forget": int(n_forget),
                     "actual": {k: round(float(actual.get(k, 0.0)), 3) for k in PHASES},
                     "predicted_model": {k: round(float(v), 3) for k, v in (predicted_model or {}).items()}})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
        tmp.replace(self.path)

    def fixed(self) -> tuple[dict[str, float], dict[str, tuple[float, float]], str]:
        """(seconds per fixed phase, their (low, high), where from): the median of the last HISTORY_USE batches and
        their min and max; the defaults (and DEFAULT_RANGE) before the first batch."""
        recs = self.records()[-HISTORY_USE:]
        if not recs:
            lo, hi = DEFAULT_RANGE
            extra = {"candidates_extra": DEFAULT_CANDIDATES_EXTRA_S}
            return ({**DEFAULT_FIXED_S, **extra},
                    {k: (v * lo, v * hi) for k, v in {**DEFAULT_FIXED_S, **extra}.items()},
                    "defaults (no batch of this project yet; unlearning/planning/overhead.py)")
        out, ranges = {}, {}
        for k in FIXED_PHASES:
            out[k], ranges[k] = _median_and_range([r["actual"][k] for r in recs])
        extra = [max(0.0, r["actual"]["candidates"] - r["predicted_model"]["candidates"]) for r in recs
                 if "candidates" in r.get("predicted_model", {})]
        if extra:
            out["candidates_extra"], ranges["candidates_extra"] = _median_and_range(extra)
        else:
            out["candidates_extra"] = DEFAULT_CANDIDATES_EXTRA_S
            ranges["candidates_extra"] = tuple(DEFAULT_CANDIDATES_EXTRA_S * f for f in DEFAULT_RANGE)
        return out, ranges, f"the median of this project's last {len(recs)} batch(es) ({self.path.name})"


def _median_and_range(vals: list[float]) -> tuple[float, tuple[float, float]]:
    """(median, (low, high)): the values' min and max, widened to at least MIN_RANGE around the median."""
    med = statistics.median(vals)
    return med, (min(min(vals), med * MIN_RANGE[0]), max(max(vals), med * MIN_RANGE[1]))


def _finite_phases(d) -> bool:
    return isinstance(d, dict) and all(isinstance(d.get(k), (int, float)) and math.isfinite(d[k]) and d[k] >= 0
                                       for k in PHASES)


# --- the plan's prediction ------------------------------------------------------------------------------------
def predict(model: dict[str, float], fixed: dict[str, float], fixed_range: dict[str, tuple[float, float]],
            model_range: tuple[float, float] = (1.0, 1.0)) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """(seconds per phase, (low, high) per phase) of a batch. `model`: diagnostics, references and candidates from
    the probe (unlearning/planning/plan.py predicted_seconds: candidates = unlearn + certify); `fixed`/`fixed_range`:
    History.fixed; `model_range`: the probe's fastest and slowest round against its median."""
    lo, hi = model_range
    point, ranges = {}, {}
    for k in MODEL_PHASES:
        v = float(model.get(k, 0.0))
        point[k], ranges[k] = v, (v * lo, v * hi)
    ex, (ex_lo, ex_hi) = fixed.get("candidates_extra", 0.0), fixed_range.get("candidates_extra", (0.0, 0.0))
    point["candidates"] += ex
    ranges["candidates"] = (ranges["candidates"][0] + ex_lo, ranges["candidates"][1] + ex_hi)
    for k in FIXED_PHASES:
        point[k], ranges[k] = float(fixed[k]), tuple(fixed_range[k])
    return {k: point[k] for k in PHASES}, {k: ranges[k] for k in PHASES}


def phases_text(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {phases.get(k, 0.0):.1f}" for k in PHASES)


def predicted_line(point: dict[str, float], ranges: dict[str, tuple[float, float]], source: str) -> str:
    """The plan's prediction in one line (`unlearn plan`, the batch's plan)."""
    lo, hi = sum(r[0] for r in ranges.values()), sum(r[1] for r in ranges.values())
    return (f"predicted batch wall time {total(point):.1f} s (range {lo:.1f}-{hi:.1f} s): {phases_text(point)} s "
            f"(validation, tracking, erase and orchestration from {source})")


def plan_vs_actual_line(point: dict[str, float] | None, ranges: dict[str, tuple[float, float]] | None,
                        actual: dict[str, float]) -> str:
    """One line, seconds only, the same phases on both sides, each side summing to its total."""
    took = total(actual)
    if point is None:
        return f"plan vs actual: no plan (qualified mode or no candidate), took {took:.1f} s ({phases_text(actual)} s)"
    pred = total(point)
    lo, hi = sum(r[0] for r in ranges.values()), sum(r[1] for r in ranges.values())
    ratio = took / pred if pred > 0 else float("inf")
    inside = "inside" if lo <= took <= hi else "outside"
    return (f"plan vs actual: predicted {pred:.1f} s (range {lo:.1f}-{hi:.1f} s; {phases_text(point)} s), took "
            f"{took:.1f} s ({phases_text(actual)} s): actual/predicted {ratio:.2f}, {inside} the range")


# --- outside the batch: its stage's start and end, and `unlearn erase` after a `dvc repro` --------------------------
FILE = Path(".unlearning") / "fixed_costs.json"  # relative to the project folder (the one holding params.yaml)
PARTS = {
    "stage": "the deletion stage outside its batch: the process and the flow run's start, the reconcile, the metrics",
    "erase": "`unlearn erase` after `dvc repro` (rewrites the prepared store and the original, dvc commit, dvc gc)",
}
DEFAULT_OUTSIDE_S = {"stage": 4.0, "erase": 4.0}


def outside_costs(root: str | Path | None = None) -> tuple[dict[str, float], str]:
    """(seconds per part outside the batch, where from): the project's measured file when it holds every part as a
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
    return dict(DEFAULT_OUTSIDE_S), "defaults (unlearning/planning/overhead.py)"


def write_fixed_costs(root: str | Path, costs: dict[str, float]) -> Path:
    """bench/session_overhead.py's measurement of the parts outside the batch (rounded to 0.1 s)."""
    path = Path(root) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: round(float(costs[k]), 1) for k in PARTS}, indent=1) + "\n")
    return path


def command_line(batch_s: float, outside: dict[str, float], source: str) -> str:
    """What `unlearn repro` of this batch takes in all: the batch plus the parts outside it."""
    parts = " + ".join(f"{k} {outside[k]:.1f} s" for k in PARTS)
    return (f"predicted `unlearn repro` of it: {batch_s + sum(outside.values()):.1f} s = the batch {batch_s:.1f} s + "
            f"{parts} (outside the batch; from {source})")
