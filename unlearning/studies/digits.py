"""The digits problem of the studies and benches: dataset, model spec and recipe from params.yaml, and one
forget set judged exactly as the deletion flow judges a candidate (unlearning.certificate.equivalence + unlearning.certificate.gate).

Roles (unlearning.seeds, one SeedSequence stream each): the original (the study's seed), `shadows` (N shadow
originals on D), `oracles` (set A: the gate's oracles on R = D minus F) and `oracles_b` (set B: independent
retrains, the reference a method is measured against without being the gate's own sample).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from unlearning.config import method_traits
from unlearning.batch.rows import SPLITS, BatchRows
from unlearning.certificate import metric_keys as K
from unlearning.config import Gate, Params
from unlearning.data import load_dataset
from unlearning.sequential import Criterion, References, certify_logits
from unlearning.methods import run_method
from unlearning.methods.base import TrainRecipe, UnlearnContext
from unlearning.metrics import klom, klom_summary, margins
from unlearning.models import build_model, fit, predict_logits
from unlearning.models.training import recipe_from
from unlearning.models.zoo import spec_from
from unlearning.seeds import method_seed, original_seed, role_seeds


@dataclass
class DigitsProblem:
    X: torch.Tensor          # [n, 64] float32, every sample
    y: torch.Tensor          # [n] int64
    y_np: np.ndarray         # [n] int64
    train_rows: np.ndarray   # indices of the training split
    val_rows: np.ndarray     # indices of the validation split
    spec: dict               # the model spec params.yaml builds
    recipe: TrainRecipe      # the training recipe params.yaml declares


def digits_problem(params: Params) -> DigitsProblem:
    ds = load_dataset("digits", seed=params.base.seed, val_fraction=params.prepare.val_fraction)
    y_np = np.asarray(ds.label).astype(np.int64)
    spec = spec_from(params.train.model, ds.in_shape, ds.n_classes)
    recipe = recipe_from(params.train)
    split = np.asarray(ds.split)
    return DigitsProblem(X=torch.as_tensor(np.asarray(ds.X), dtype=torch.float32), y=torch.as_tensor(y_np), y_np=y_np,
                         train_rows=np.flatnonzero(split == "train"), val_rows=np.flatnonzero(split == "val"),
                         spec=spec, recipe=recipe)


def train_members(spec: dict, seeds, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe):
    """An ensemble with one member per seed, trained on (X, y) with the recipe."""
    model = build_model(spec, seeds)
    fit(model, X, y, recipe)
    return model


@dataclass
class Originals:
    """The production original (1 member) and N shadow originals, trained once on D for a whole study."""

    prob: DigitsProblem
    seed: int
    n_models: int
    original: object
    shadows: object
    seconds: float


def train_originals(prob: DigitsProblem, seed: int, n_models: int) -> Originals:
    t0 = time.perf_counter()
    XD, yD = prob.X[prob.train_rows], prob.y[prob.train_rows]
    original = train_members(prob.spec, [original_seed(seed)], XD, yD, prob.recipe)
    shadows = train_members(prob.spec, role_seeds(seed, "shadows", n_models), XD, yD, prob.recipe)
    return Originals(prob, seed, n_models, original, shadows, time.perf_counter() - t0)


@dataclass
class ForgetSet:
    """One forget set F with its oracles: A (the gate's) and B (independent), N each, trained on R."""

    name: str
    F: np.ndarray            # rows of prob.X
    R: np.ndarray
    rows: BatchRows
    eval_rows: np.ndarray    # [n_eval] rows evaluated (forget, adjacent, remote, validation)
    splits: np.ndarray       # [n_eval] split label per evaluated row
    labels: np.ndarray       # [n_eval]
    oracles_a: object
    oracles_b: object
    logits_a: torch.Tensor   # [N, n_eval, C]
    logits_b: torch.Tensor   # [N, n_eval, C]
    seconds_oracles: float   # training ONE oracle set (N models, vectorized)
    seconds_one_retrain: float  # training a single model on R: what an exact retrain of production costs
    results: dict = field(default_factory=dict)
    # Derived once per set (every candidate is compared with them): margins [N, n_eval] of A and B, A's mean
    # margin [n_eval], and the KLoM P95 of B against A per split (two independent N-vs-N sets of retrains).
    margins_a: np.ndarray = field(init=False)
    margins_b: np.ndarray = field(init=False)
    mean_margin_a: np.ndarray = field(init=False)
    floor_ab: dict = field(init=False)

    def __post_init__(self):
        self.margins_a = margins(self.logits_a.numpy(), self.labels)
        self.margins_b = margins(self.logits_b.numpy(), self.labels)
        self.mean_margin_a = self.margins_a.mean(axis=0)
        k = klom(self.margins_b, self.margins_a)
        self.floor_ab = {s: v["p95"] for s, v in klom_summary(k, self.splits).items()}


def adjacent_by_class(y: np.ndarray, F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """The group partition of the digits default (group = class, docs/design.md §4.4): a retain row is adjacent when
    its class occurs in the forget set."""
    return np.isin(y[R], np.unique(y[F]))


def make_forget_set(orig: Originals, name: str, F: np.ndarray) -> ForgetSet:
    prob = orig.prob
    F = np.sort(np.asarray(F))
    R = np.setdiff1d(prob.train_rows, F)
    rows = BatchRows(before=prob.train_rows, forget=F, retain=R, adjacent_mask=adjacent_by_class(prob.y_np, F, R),
                     validation=prob.val_rows)
    eval_rows, splits = rows.eval_rows()
    XR, yR = prob.X[R], prob.y[R]
    t0 = time.perf_counter()
    oracles_a = train_members(prob.spec, role_seeds(orig.seed, "oracles", orig.n_models), XR, yR, prob.recipe)
    seconds_oracles = time.perf_counter() - t0
    oracles_b = train_members(prob.spec, role_seeds(orig.seed, "oracles_b", orig.n_models), XR, yR, prob.recipe)
    t0 = time.perf_counter()
    train_members(prob.spec, role_seeds(orig.seed, "bench", 1), XR, yR, prob.recipe)
    seconds_one = time.perf_counter() - t0
    Xe = prob.X[eval_rows]
    return ForgetSet(name, F, R, rows, eval_rows, splits, prob.y_np[eval_rows], oracles_a, oracles_b,
                     predict_logits(oracles_a, Xe), predict_logits(oracles_b, Xe), seconds_oracles, seconds_one)


def margin_gap(margins_models: np.ndarray, fs: ForgetSet) -> dict[str, float]:
    """Mean |margin - oracle mean margin| per split, averaged over the models (margins [N, n_eval]): how far a
    method's outputs are from a retrain's, in margin units (the quantity "Loss is Not Behavior" compares with
    the predicted gap). The reference is oracle set A's mean: independent of every method's models, and of set B
    (the retrain's)."""
    d = np.abs(margins_models - fs.mean_margin_a[None, :]).mean(axis=0)
    return {s: float(d[fs.splits == s].mean()) for s in SPLITS if np.any(fs.splits == s)}


def judge(fs: ForgetSet, candidate: torch.Tensor, shadow_unlearned: torch.Tensor, gate: Gate, *,
          n_permutations: int, seed: int, is_retrain: bool = False) -> dict:
    """The flow's verdict on a candidate: the certificate in one look at full N, through the loop the deletion flow
    runs (unlearning/sequential.py certify_logits), at `gate` (retrain_equivalence) with `n_permutations`.
    candidate [1, n_eval, C]; shadow_unlearned [N, n_eval, C] (judged against oracle set A)."""
    criterion = Criterion.of(gate, [(shadow_unlearned.shape[0], fs.logits_a.shape[0])],
                             permutations=[n_permutations], exact=is_retrain)
    done = certify_logits(criterion, candidate, lambda spec: References(shadow_unlearned, fs.logits_a), fs.labels,
                          fs.splits, seed=seed)
    v, mets = done.verdict, K.of_measures(done.result.measures)
    floor = fs.floor_ab
    out = {"passed": bool(v.passed), "failures": list(v.failures)}
    for s in SPLITS:
        if f"klom_p95/{s}" not in mets:
            continue
        out[f"klom_p95/{s}"] = mets[f"klom_p95/{s}"]
        out[f"klom_pvalue/{s}"] = mets[f"klom_pvalue/{s}"]
        out[f"floor_p95/{s}"] = mets[f"noise_floor_p95/{s}"]        # median of the permutation null (calibrated)
        out[f"independent_floor_p95/{s}"] = floor[s]                # B vs A
        out[f"acc/{s}"] = mets[f"acc/{s}"]
        out[f"shadow_acc/{s}"] = mets[f"shadow_acc/{s}"]
        out[f"oracle_acc/{s}"] = mets[f"oracle_acc/{s}"]
    m_unl = margins(np.asarray(shadow_unlearned), fs.labels)   # [N, n_eval]
    out["gap"] = margin_gap(m_unl, fs)
    # Independent of the gate's own oracles: the candidate's KLoM P95 against oracle set B over the A-vs-B
    # floor, worst split. Above report.s3.far_ratio the candidate is truly far from a retrain; a pass there is a
    # false accept. For the retrain (set B itself) it is undefined.
    if not is_retrain:
        k = klom(m_unl, fs.margins_b)
        ratio = {s: v["p95"] / max(floor[s], 1e-12) for s, v in klom_summary(k, fs.splits).items()}
        out["independent_ratio"] = float(max(ratio.values()))
    return out


def run_candidate(orig: Originals, fs: ForgetSet, method: str, args: dict, gate: Gate, *, n_permutations: int,
                  label: str | None = None) -> dict:
    """Run `method` (with `args`) on the original and on the N shadows, then judge it. `retrain` is the
    independent retrain: member 0 of oracle set B as the candidate, B's N models as the shadow-unlearned side."""
    prob = orig.prob
    if method_traits(method).exact:
        res = judge(fs, fs.logits_b[:1], fs.logits_b, gate, n_permutations=n_permutations, seed=orig.seed,
                    is_retrain=True)
        res["seconds"] = fs.seconds_one_retrain
    else:
        XR, yR = prob.X[fs.R], prob.y[fs.R]

        def ctx(model):
            return UnlearnContext(model=model, X_forget=prob.X[fs.F], y_forget=prob.y[fs.F], X_retain=XR,
                                  y_retain=yR, adjacent_mask=torch.as_tensor(fs.rows.adjacent_mask),
                                  recipe=prob.recipe, seed=method_seed(orig.seed))

        t0 = time.perf_counter()
        cand = run_method(method, ctx(orig.original), args).model
        sh = run_method(method, ctx(orig.shadows), args).model
        seconds = time.perf_counter() - t0
        Xe = prob.X[fs.eval_rows]
        res = judge(fs, predict_logits(cand, Xe), predict_logits(sh, Xe), gate, n_permutations=n_permutations,
                    seed=orig.seed)
        res["seconds"] = seconds
    res.update({"method": method, "args": dict(args), "label": label or method})
    fs.results[res["label"]] = res
    return res


def setting_label(method: str, args: dict) -> str:
    """'gradient_ascent lr=0.0001 epochs=5' for a sweep point; the method's name at its defaults."""
    return method if not args else method + " " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                            for k, v in args.items())
