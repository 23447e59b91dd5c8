"""The memorization map of the production model (docs/design.md §4.9; docs/certificate.md, "The map"): trained once,
kept beside the model's state under hashed ids, reused while nothing it depends on changed, and its cuts.

- **Built** by `build_map`: N members of the model's architecture on complementary random halves of the retained
  training rows, trained with the recipe as one vectorized ensemble (in chunks), their margins read per row
  (unlearning/licensing/memorization.py). The members are dropped once read: no model trained on any row is kept, only
  each row's epsilon, its bounds, its Gaussian separation and the model's training loss.
- **Sized** by `map_plan`: `licensing.map.members`, or the most members (min_members..max_members) whose
  training costs at most `licensing.map.max_retrains` retrains of the model by the planner's probe
  (tasks/planning.py); none affordable: no map, nothing licensed. Its cost is stated in retrains, and per
  request over `licensing.map.stream_length` requests.
- **Reused** (`stale_reason` says when not) while unchanged: the same architecture and training recipe (the
  members learn as the model does), the same map settings (members, confidence, delta, seed), and the same data:
  every retained training row has an entry (a map never scores a row it did not see), and the rows erased
  since it was built (licensed or retrained) stay within its own debt, licensing.map.max_erased_fraction of its
  rows: exact retrains in between do not change it (a retrain on nearly the same rows memorizes the same rows);
  past that debt the next batch builds a new one, unless the last one did not pay for itself: it licensed fewer
  requests than it cost retrains (`map_paid`), and licensing does not pay on this data.
- **Its cuts** (`fit_map_cuts`): fitted on the map's rows when it is built, before any request, for the gate's
  budget and the audit's references and confidence (unlearning/licensing/decision.py); refitted (no training) when those
  settings change; lowered and saved again by a failed audit.
- **Stored** at <cache_dir>/memorization/map.json: ids as the ledger keys them (salted hashes), written to a
  temporary file and renamed. The erasure's "memorization map" store drops erased ids from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from tasks.id_key import IdKey
from tasks.reporting import run_logger
from tasks.training import build, model_spec
from unlearning.batch.rows import retained_train_rows
from unlearning.config import Gate, Licensing, ProjectPaths, Train, Validation
from unlearning.io import atomic_write_json
from unlearning.licensing.decision import (
    Cuts, audit_operating_characteristic, debiased_mu, fail_probability, fit_cuts, map_paid, operating_grid,
)
from unlearning.licensing.memorization import MemorizationMap, affordable_members, half_splits, member_rows, memorization_map
from unlearning.models import fit, predict_logits
from unlearning.models.training import recipe_from
from unlearning.planning.plan import CPU_CHUNK, sequential_step
from unlearning.seeds import role_seeds

FORMAT = "memorization-map/1"


@dataclass(frozen=True)
class MapSettings:
    """What the memorization map reads of the params: the licensing section, the gate (its epsilon budget and
    estimator), validation (the audit's references and looks, chunk_size), the recipe and the model (train),
    base.seed and base.progress, the project's folders (the cache, a custom model's factory) and how the ledger
    keys ids (the map's rows are ledger keys)."""

    licensing: Licensing
    gate: Gate
    validation: Validation
    train: Train
    seed: int
    progress: bool
    paths: ProjectPaths
    ids: IdKey



def map_path(paths: ProjectPaths) -> Path:
    return paths.path("cache_dir") / "memorization" / "map.json"


def oc_dir(paths: ProjectPaths) -> Path:
    return paths.path("cache_dir") / "memorization" / "operating"


@dataclass(frozen=True)
class MapPlan:
    """How large a map the planner builds, what it costs in retrains, and whether it is affordable."""

    members: int | None
    retrains: float
    affordable: bool
    reason: str

    def line(self, stream_length: int) -> str:
        if not self.affordable:
            return f"memorization map: not affordable ({self.reason}): nothing is licensed"
        return (f"memorization map: {self.members} members on random halves, {self.retrains:.2g} retrain(s) "
                f"({self.retrains / stream_length:.2g} per request over licensing.map.stream_length = "
                f"{stream_length}); {self.reason}")


def map_plan(cfg: MapSettings, timing, n_rows: int) -> MapPlan:
    """The map's size and cost (module docstring) from the probe's `timing` (unlearning/planning/plan.py Timing): a chunk
    of k members on half the rows costs the curve's k-member step times half the retrain's steps."""
    m = cfg.licensing.map
    half_steps = cfg.train.epochs * math.ceil((n_rows // 2) / cfg.train.batch_size)
    chunk = cfg.validation.chunk_size or CPU_CHUNK

    def retrains(k: int) -> float:
        full = timing.references_seconds(k, chunk)  # k members, one worker, the retrain's steps
        return full * half_steps / max(timing.steps, 1) / max(timing.retrain_seconds, 1e-9)

    if m.members is not None:
        return MapPlan(m.members, retrains(m.members), True, "licensing.map.members")
    n = affordable_members(m.max_retrains, retrains, m.min_members, m.max_members)
    if n is None:
        return MapPlan(None, retrains(m.min_members), False,
                       f"{m.min_members} members would cost {retrains(m.min_members):.2g} retrains, above "
                       f"licensing.map.max_retrains = {m.max_retrains:g}")
    return MapPlan(n, retrains(n), True, f"the most members within licensing.map.max_retrains = {m.max_retrains:g}")


def map_key(cfg: MapSettings, prepared, members: int) -> dict:
    """What a map's rows' scores depend on besides the rows themselves (module docstring, "Reused")."""
    m = cfg.licensing.map
    return {"format": FORMAT, "spec": model_spec(cfg.train.model, prepared),
            "recipe": dataclasses.asdict(recipe_from(cfg.train)),
            "dataset": prepared.info.get("name"), "members": int(members), "confidence": m.confidence,
            "n_bootstrap": m.n_bootstrap, "delta": cfg.gate.epsilon.delta, "seed": cfg.seed}


def cut_key(cfg: MapSettings) -> dict:
    """What the cuts depend on besides the map: the gate's budget and estimator, the audit's references and its
    final look's confidence, the licensing target and sizes."""
    g, lic = cfg.gate, cfg.licensing
    return {"budget": g.epsilon.max, "delta": g.epsilon.delta, "estimator": g.epsilon.estimator,
            "n_bootstrap": g.epsilon.n_bootstrap, "references": audit_references(cfg.validation),
            "confidence": audit_confidence(cfg.validation, g), "target": lic.target, "max_rows": lic.max_rows,
            "min_calibration_rows": lic.min_calibration_rows, "score": lic.score}


def audit_references(v: Validation) -> int:
    """References per role at the audit's final look."""
    return int(min(v.n_oracles, v.n_shadows))


def audit_confidence(v: Validation, gate: Gate) -> float:
    """The one-sided confidence of the audit's final look (1 - its share of the gate's alpha)."""
    return 1.0 - float(audit_step(v, gate).alphas[-1])


def audit_step(v: Validation, gate: Gate):
    """The sequential step an audit of the licensed model runs (unlearning/planning/plan.py), under gate.criterion epsilon."""
    from unlearning.config import LICENSED_INACTION

    return sequential_step(LICENSED_INACTION, v, epsilon_gate(gate), 1.0)


def epsilon_gate(gate):
    """The gate an audit judges by: the project's gate with criterion epsilon (a licence promises the budget)."""
    return gate.model_copy(update={"criterion": "epsilon"})


@dataclass
class MapRecord:
    """A map as stored: `ids` (ledger keys) in the map's row order, its arrays, what it was built from and for,
    its cuts and the audits that lowered them."""

    ids: list[str]
    map: MemorizationMap
    key: dict
    built: dict
    cuts: Cuts | None = None
    cut_key: dict = field(default_factory=dict)
    removed: int = 0  # rows erased since it was built (their entries dropped)
    audits: list[dict] = field(default_factory=list)
    decided: int = 0  # requests it decided, and how many it licensed: whether it paid for itself
    licensed: int = 0
    _index: dict | None = None

    def positions(self, keys: list[str]) -> np.ndarray:
        """Map positions of ledger keys, -1 for a key the map does not hold."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.ids)}
        return np.array([self._index.get(k, -1) for k in keys], dtype=np.int64)

    def scores(self, keys: list[str], kind: str) -> np.ndarray:
        """The rows' scores (NaN for a row without an entry)."""
        pos = self.positions(keys)
        s = self.map.score(kind)
        return np.where(pos >= 0, s[np.maximum(pos, 0)], np.nan)

    def to_json(self) -> dict:
        m = self.map
        arrays = {k: [round(float(x), 6) for x in getattr(m, k)] for k in ("point", "lower", "upper", "mu", "loss")}
        return {"format": FORMAT, "ids": self.ids, **arrays, "n_members": m.n_members, "delta": m.delta,
                "confidence": m.confidence, "key": self.key, "built": self.built, "removed": self.removed,
                "cuts": self.cuts.to_dict() if self.cuts is not None else None, "cut_key": self.cut_key,
                "audits": self.audits, "decided": self.decided, "licensed": self.licensed}

    @classmethod
    def from_json(cls, d: dict) -> "MapRecord":
        arr = {k: np.asarray(d[k], dtype=np.float64) for k in ("point", "lower", "upper", "mu", "loss")}
        m = MemorizationMap(**arr, n_members=int(d["n_members"]), delta=float(d["delta"]),
                            confidence=float(d["confidence"]))
        return cls(list(d["ids"]), m, d["key"], d["built"], Cuts.from_dict(d["cuts"]) if d.get("cuts") else None,
                   d.get("cut_key", {}), int(d.get("removed", 0)), list(d.get("audits", [])),
                   int(d.get("decided", 0)), int(d.get("licensed", 0)))

    @property
    def cost_retrains(self) -> float:
        """What building it cost, in retrains (the planner's prediction at its build)."""
        return float(self.built.get("predicted_retrains", 0.0))

    def without(self, keys: set[str]) -> "MapRecord":
        """The record with the entries of `keys` dropped (an erasure), counted in `removed`."""
        keep = np.array([k not in keys for k in self.ids], dtype=bool)
        if keep.all():
            return self
        m = self.map
        sub = dataclasses.replace(m, **{k: getattr(m, k)[keep] for k in ("point", "lower", "upper", "mu", "loss")})
        return dataclasses.replace(self, ids=[k for k, ok in zip(self.ids, keep) if ok], map=sub,
                                   removed=self.removed + int((~keep).sum()), _index=None)


def load_map(paths: ProjectPaths) -> MapRecord | None:
    path = map_path(paths)
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # unreadable: rebuilt (a cache, not a record)
    return MapRecord.from_json(d) if d.get("format") == FORMAT else None


def save_map(paths: ProjectPaths, record: MapRecord) -> None:
    atomic_write_json(map_path(paths), record.to_json())


def stale_reason(cfg: MapSettings, state, record: MapRecord | None, members: int | None) -> str | None:
    """Why the stored map cannot serve this state (None: it can; module docstring, "Reused")."""
    if record is None:
        return "no map yet"
    if members is None or record.key != map_key(cfg, state.prepared, members):
        return "built with another architecture, recipe or map setting"
    keys = cfg.ids.ledger_keys(state.manifest["sample_id"].to_numpy()[retained_train_rows(state.manifest)])
    missing = int((record.positions(keys) < 0).sum())
    if missing:
        return f"{missing} retained training row(s) have no entry"
    share = cfg.licensing.map.max_erased_fraction
    built_rows = int(record.built.get("rows", len(record.ids)))
    if record.removed > share * built_rows:
        return (f"{record.removed} of its {built_rows} rows were erased since it was built, more than its debt "
                f"(licensing.map.max_erased_fraction = {share:g})")
    return None


def build_map(cfg: MapSettings, state, device: str, members: int) -> tuple[MapRecord, float]:
    """Train the map's members on the retained training rows and read the map (module docstring, "Built");
    -> (record without cuts, seconds)."""
    t0 = time.perf_counter()
    prepared, lic = state.prepared, cfg.licensing
    rows = retained_train_rows(state.manifest)
    X = torch.as_tensor(np.asarray(prepared.X[rows]), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label[rows]), dtype=torch.long)
    m = map_from_tensors(lambda seeds: build(cfg.train.model, cfg.paths.root, prepared, seeds), state.model, X, y,
                         recipe_from(cfg.train), members, cfg.seed, cfg.gate.epsilon.delta, lic.map.confidence,
                         lic.map.n_bootstrap, cfg.validation.chunk_size or CPU_CHUNK, device, cfg.progress)
    seconds = time.perf_counter() - t0
    built = {"rows": int(len(rows)), "members": members, "seconds": round(seconds, 3),
             "model_version": str(state.champion.get("model_version")), "at": datetime.now(timezone.utc).isoformat()}
    ids = cfg.ids.ledger_keys(state.manifest["sample_id"].to_numpy()[rows])
    return MapRecord(ids, m, map_key(cfg, prepared, members), built), seconds


def map_from_tensors(make, model, X: torch.Tensor, y: torch.Tensor, train_recipe, members: int, seed: int,
                     delta: float, confidence: float, n_bootstrap: int, chunk: int, device: str = "cpu",
                     progress: bool = False) -> MemorizationMap:
    """The map of `model` (an N = 1 ensemble) trained on (X [n, ...], y [n]): `members` members built by
    `make(seeds)` train on complementary random halves (half_splits, seeded by `seed`) in chunks of at most
    `chunk` (even), their logits on every row are read, and the members are dropped."""
    in_mask = half_splits(len(X), members, seed)
    seeds = role_seeds(seed, "memorization", members)
    step = max(2, chunk // 2 * 2)
    X, y = X.to(device), y.to(device)
    logits = []
    for lo in range(0, members, step):
        hi = min(lo + step, members)
        ens = make(seeds[lo:hi]).to(device)
        label = f"memorization map, members {lo + 1}-{hi} of {members}" if progress else False
        fit(ens, X, y, train_recipe, rows=torch.as_tensor(member_rows(in_mask[lo:hi])).to(device), progress=label)
        logits.append(predict_logits(ens, X))  # [chunk, n, C] on the CPU
        del ens
    model_logits = predict_logits(model.to(device), X)[0]
    return memorization_map(torch.cat(logits, 0), y.cpu().numpy(), in_mask, model_logits, delta, confidence,
                            n_bootstrap=n_bootstrap, seed=seed)


def operating_characteristic(cfg: MapSettings) -> tuple[np.ndarray, np.ndarray, float]:
    """(mu grid, f(mu), seconds) of the audit's gate (unlearning/licensing/decision.py), cached on disk per gate setting:
    it depends on the gate and the audit's size only, not on the data."""
    k = cut_key(cfg)
    key = {x: k[x] for x in ("budget", "delta", "estimator", "n_bootstrap", "references", "confidence")}
    path = oc_dir(cfg.paths) / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20] + ".json")
    if path.exists():
        try:
            d = json.loads(path.read_text())
            return np.asarray(d["grid"]), np.asarray(d["f"]), 0.0
        except (OSError, ValueError, KeyError):
            pass
    t0 = time.perf_counter()
    grid = operating_grid(key["budget"], key["delta"])
    f = audit_operating_characteristic(grid, key["references"], key["budget"], key["delta"], key["confidence"],
                                       key["estimator"], n_bootstrap=key["n_bootstrap"], seed=cfg.seed)
    atomic_write_json(path, {"key": key, "grid": grid.tolist(), "f": f.tolist()})
    return grid, f, time.perf_counter() - t0


def null_row_failure(cfg: MapSettings, sims: int = 200) -> float:
    """f(0): how often the audit fails a row the model never memorized (the gate's own floor at the audit's size).
    At or above licensing.target no cut can license anything, and no map is worth building."""
    k = cut_key(cfg)
    return float(audit_operating_characteristic([0.0], k["references"], k["budget"], k["delta"], k["confidence"],
                                                 k["estimator"], n_bootstrap=k["n_bootstrap"], sims=sims,
                                                 seed=cfg.seed)[0])


def calibration_fail_probability(cfg: MapSettings, m: MemorizationMap) -> tuple[np.ndarray, float]:
    """Each map row's chance of failing an audit: f at its debiased separation (unlearning/licensing/decision.py)."""
    grid, f, seconds = operating_characteristic(cfg)
    half = m.n_members // 2
    return fail_probability(debiased_mu(m.mu, half, half), grid, f), seconds


def cuts_for(cfg: MapSettings, m: MemorizationMap) -> Cuts:
    """The cuts of map `m` for the current settings, fitted on its rows (unlearning/licensing/decision.py fit_cuts)."""
    p, _ = calibration_fail_probability(cfg, m)
    lic = cfg.licensing
    cap = cfg.gate.epsilon.max if lic.score != "loss" else None  # an epsilon score: a row's bound within the budget
    return fit_cuts(m.score(lic.score), p, lic.target, lic.max_rows, lic.min_calibration_rows, cap)


def fit_map_cuts(cfg: MapSettings, record: MapRecord) -> tuple[MapRecord, float]:
    """The record with its cuts fitted on its rows for the current settings (unchanged when they were fitted for
    them already); -> (record, seconds spent fitting)."""
    key = cut_key(cfg)
    if record.cuts is not None and record.cut_key == key:
        return record, 0.0
    t0 = time.perf_counter()
    cuts = cuts_for(cfg, record.map)
    return dataclasses.replace(record, cuts=cuts, cut_key=key, audits=[]), time.perf_counter() - t0


def stored_map(cfg: MapSettings, state, save: bool = True) -> tuple[MapRecord | None, str, bool]:
    """The stored map while it serves this state (its cuts refitted if the settings moved; `save`: keep them), or
    None and why not: no map or a stale one (`stale_reason`: a new one is worth building), or an audit too small
    for any cut to license (none is). -> (record or None, the line, whether building one is worth it)."""
    record = load_map(cfg.paths)
    members = cfg.licensing.map.members or (record.key.get("members") if record is not None else None)
    reason = stale_reason(cfg, state, record, members)
    if reason is None:
        record, fit_seconds = fit_map_cuts(cfg, record)
        if fit_seconds and save:
            save_map(cfg.paths, record)
        return record, (f"memorization map: reused ({record.map.n_members} members, built for v"
                        f"{record.built.get('model_version')}, {record.removed} row(s) erased since)"), False
    floor = null_row_failure(cfg)
    if floor >= cfg.licensing.target:
        return None, (f"memorization map: none: with {audit_references(cfg.validation)} references per role an audit "
                      f"fails a row the model never memorized with probability {floor:.2f}, not below "
                      f"licensing.target = {cfg.licensing.target:g}: no cut could license a request (raise "
                      f"validation.n_oracles and n_shadows)"), False
    if record is not None and not map_paid(record.licensed, record.decided, record.cost_retrains):
        return None, (f"memorization map: none: the last one licensed {record.licensed} of the {record.decided} "
                      f"request(s) it decided, less than its cost of {record.cost_retrains:.2g} retrains: licensing does "
                      f"not pay on this data; no new one is built"), False
    return None, f"memorization map: {reason}", True


def map_for_state(cfg: MapSettings, state, device: str, timing_of, tracker=None, run_id: str | None = None
                  ) -> tuple[MapRecord | None, str]:
    """The map this state licenses with: the stored one while it serves, else a new one where the planner finds it
    affordable (`timing_of()`: the probe's Timing, asked only then). -> (record or None, a line saying which and
    what it cost)."""
    record, why, worth_building = stored_map(cfg, state)
    if not worth_building:
        return record, why
    rows = len(retained_train_rows(state.manifest))
    plan = map_plan(cfg, timing_of(), rows)
    if not plan.affordable:
        return None, plan.line(cfg.licensing.map.stream_length)
    run_logger().info(f"{plan.line(cfg.licensing.map.stream_length)}: building ({why.split(': ', 1)[1]})")
    record, seconds = build_map(cfg, state, device, plan.members)
    record, fit_seconds = fit_map_cuts(cfg, record)
    record.built.update(predicted_retrains=round(plan.retrains, 3), fit_seconds=round(fit_seconds, 3))
    save_map(cfg.paths, record)
    if tracker is not None and run_id is not None:
        log_map(tracker, run_id, cfg.gate.epsilon.max, record)
    return record, f"memorization map: built ({plan.members} members, {seconds:.1f} s; {why.split(': ', 1)[1]})"


def log_map(tracker, run_id: str, budget: float, record: MapRecord) -> None:
    """The map on the batch run that built it: its histogram against the budget (gate.epsilon.max) and the cut,
    the share of rows above the budget, its size and cost."""
    from adapters import plots

    m = record.map
    cut = record.cuts.for_rows(1) if record.cuts is not None else None
    tracker.log_metrics(run_id, {"licensing/map_members": m.n_members, "licensing/map_rows": len(m),
                                 "licensing/map_seconds": float(record.built.get("seconds", 0.0)),
                                 "licensing/map_share_above_budget": m.share_above(budget),
                                 **({"licensing/cut_1_row": cut} if cut is not None else {})})
    fig = plots.memorization_map(m.upper, budget, cut, f"memorization map: {len(m)} rows, {m.n_members} members")
    tracker.log_figure(run_id, fig, "memorization_map.png")
    plots.close(fig)
