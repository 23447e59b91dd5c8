"""Matplotlib figures logged to MLflow (headless Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from adapters.clock import tracks  # noqa: E402
from unlearning.certificate import metric_keys as K
from unlearning.batch.rows import SPLITS  # noqa: E402
from unlearning.config import method_traits  # noqa: E402


def _verdict_word(passed: bool | None) -> str:
    return "" if passed is None else (": gate passed" if passed else ": gate FAILED")


def _drawn(values) -> bool:
    """Whether any value is finite: a series of NaNs draws nothing, so it gets no legend entry."""
    return bool(np.any(np.isfinite(np.asarray(values, dtype=float))))


def _legend(ax, **kwargs) -> None:
    """A legend of what the axes draw, none when nothing drawn carries a label (matplotlib warns otherwise)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


@tracks
def accuracy_bars(metrics: dict, title: str, checks: dict | None = None, passed: bool | None = None):
    """Per-split accuracy: original, candidate, and the oracle mean with the oracles' spread (min..max of
    the member accuracies) as error bars; the gate's accepted interval (checks["acc/<split>"]["limit"]) is
    drawn as a bracket, and a candidate bar is red where its split failed. The legend lists only what is drawn:
    an exact retrain trains no oracles, so it has no oracle bars and no oracle entry."""
    checks = checks or {}
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x = np.arange(len(SPLITS))
    w = 0.27
    original = [metrics.get(K.key("original_acc", s), np.nan) for s in SPLITS]
    if _drawn(original):
        ax.bar(x - w, original, w, label="original", color="tab:gray")
    cand = [metrics.get(K.key("acc", s), np.nan) for s in SPLITS]
    red = [not checks.get(K.key("acc", s), {}).get("passed", True) for s in SPLITS]
    ax.bar(x, cand, w, label="candidate (red: outside the gate interval)" if any(red) else "candidate",
           color=["tab:red" if r else "tab:blue" for r in red])
    mean = np.array([metrics.get(K.key("oracle_acc", s), np.nan) for s in SPLITS])
    lo = np.array([metrics.get(K.key("oracle_acc_min", s), m) for s, m in zip(SPLITS, mean)])
    hi = np.array([metrics.get(K.key("oracle_acc_max", s), m) for s, m in zip(SPLITS, mean)])
    if _drawn(mean):
        ax.bar(x + w, mean, w, label="oracles (min..max)", color="tab:green",
               yerr=np.vstack([np.clip(mean - lo, 0, None), np.clip(hi - mean, 0, None)]), capsize=3)
    labelled = False
    for i, s in enumerate(SPLITS):
        limit = checks.get(K.key("acc", s), {}).get("limit")
        if isinstance(limit, (list, tuple)) and len(limit) == 2:
            ax.plot([x[i] - w / 2, x[i] + w / 2], [limit[0]] * 2, color="k", lw=1)
            ax.plot([x[i] - w / 2, x[i] + w / 2], [limit[1]] * 2, color="k", lw=1,
                    label=None if labelled else "gate interval")
            labelled = True
    ax.set_xticks(x, SPLITS)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("accuracy")
    ax.set_title(title + _verdict_word(passed))
    _legend(ax, loc="lower right", fontsize=7)
    fig.tight_layout()
    return fig


@tracks
def klom_against_null(klom: np.ndarray, null_example: np.ndarray, splits: np.ndarray, null_p95: dict,
                      observed_p95: dict, pvalues: dict, alpha: float, title: str, passed: bool | None = None):
    """KLoM per sample per split (candidate: shadow-unlearned vs oracles) over the same picture for two sets
    of retrains of the same sizes (one relabeling of the pooled models), with the candidate's KLoM P95 (solid)
    and the gate's critical value (dashed: the 1 - alpha quantile of the permutation null of the P95)."""
    present = [s for s in SPLITS if np.any(splits == s)]
    fig, axes = plt.subplots(1, max(len(present), 1), figsize=(3.4 * max(len(present), 1), 3.2), squeeze=False)
    for ax, s in zip(axes[0], present):
        a = np.asarray(klom, float)[splits == s]
        b = np.asarray(null_example, float)[splits == s]
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
        both = np.concatenate([a, b]) if len(a) + len(b) else np.zeros(1)
        bins = np.linspace(0, max(float(both.max()), 1e-6) * 1.05, 30)
        for v, color, label in ((b, "tab:green", "retrains vs retrains"), (a, "tab:blue", "candidate vs oracles")):
            if len(v):  # as fractions of the split's samples (a split may have one sample, or none finite)
                ax.hist(v, bins=bins, alpha=0.5, color=color, weights=np.full(len(v), 1.0 / len(v)), label=label)
        if s in observed_p95 and np.isfinite(observed_p95[s]):
            ax.axvline(observed_p95[s], color="tab:blue", lw=1.5, label="candidate P95")
        if s in null_p95 and len(null_p95[s]):
            ax.axvline(float(np.quantile(null_p95[s], 1 - alpha)), color="k", ls="--", lw=1,
                       label=f"critical P95 (alpha {alpha:g})")
        p = pvalues.get(s)
        ok = p is not None and p >= alpha
        ax.set_title(f"{s}: p = {p:.3f} {'passed' if ok else 'FAILED'}" if p is not None else s, fontsize=9,
                     color="black" if ok or p is None else "tab:red")
        ax.set_xlabel("KLoM")
    axes[0][0].set_ylabel("fraction of samples")
    _legend(axes[0][0], fontsize=6)
    fig.suptitle(title + _verdict_word(passed))
    fig.tight_layout()
    return fig


@tracks
def history(points: list[dict], title: str = "champion across batches"):
    """The champion's history (unlearning/policy/history.py): cumulative forgotten fraction, validation accuracy and
    output gap to the oracles per batch; exact retrains are marked (they clear the retraining debt)."""
    steps = [p["step"] for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(axes, ("forgotten_fraction", "champion_validation_accuracy", "champion_output_gap"),
                              ("cumulative forgotten fraction", "champion validation accuracy",
                               "champion output gap to oracles")):
        ax.plot(steps, [p[key] for p in points], marker="o", color="tab:blue")
        retrains = [p for p in points if method_traits(p["method"]).exact]
        if retrains:  # no retrain yet: no marker, and no legend entry for one
            ax.scatter([p["step"] for p in retrains], [p[key] for p in retrains], marker="s", s=60,
                       facecolors="none", edgecolors="tab:red", label="exact retrain", zorder=3)
        ax.set_xlabel("batch")
        ax.set_title(label, fontsize=9)
        ax.set_xticks(steps)
    _legend(axes[0], fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@tracks
def histograms(values_by_split: dict[str, np.ndarray], xlabel: str, title: str):
    """One histogram panel per split (e.g. KLoM per sample, self-leverage)."""
    present = [s for s in values_by_split if len(values_by_split[s])]
    fig, axes = plt.subplots(1, max(len(present), 1), figsize=(3.2 * max(len(present), 1), 3), squeeze=False)
    for ax, s in zip(axes[0], present):
        ax.hist(np.asarray(values_by_split[s], dtype=float), bins=30, color="tab:blue", alpha=0.8)
        ax.set_title(s)
        ax.set_xlabel(xlabel)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@tracks
def margin_distributions(unlearned: np.ndarray, oracle: np.ndarray, sample_names: list[str], title: str):
    """Margins of the worst samples: unlearned members vs oracle members (unlearned/oracle [N, k])."""
    k = unlearned.shape[1]
    fig, axes = plt.subplots(1, k, figsize=(3 * k, 2.8), squeeze=False)
    for j, ax in enumerate(axes[0]):
        lo = min(unlearned[:, j].min(), oracle[:, j].min())
        hi = max(unlearned[:, j].max(), oracle[:, j].max())
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 21)
        ax.hist(oracle[:, j], bins=bins, alpha=0.6, label="oracles")
        ax.hist(unlearned[:, j], bins=bins, alpha=0.6, label="unlearned")
        ax.set_title(sample_names[j], fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@tracks
def memorization_map(upper: np.ndarray, budget: float, cut: float | None, title: str,
                     request: np.ndarray | None = None):
    """A memorization map's per-row epsilon upper bounds (log x axis) against the gate's budget and the
    one-row cut, with the share of rows above the budget; `request`: a request's rows, marked on the axis."""
    e = np.asarray(upper, dtype=float)
    e = e[np.isfinite(e)]
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    lo = max(float(e.min()) if e.size else 0.01, 1e-2)
    hi = max(float(e.max()) if e.size else 1.0, budget * 2, lo * 10)
    ax.hist(np.clip(e, lo, None), bins=np.geomspace(lo, hi, 40), color="tab:blue", alpha=0.8, label="rows")
    ax.set_xscale("log")
    share = float(np.mean(e > budget)) if e.size else 0.0
    ax.axvline(budget, color="tab:red", label=f"gate budget {budget:g} ({share:.0%} of rows above)")
    if cut is not None:
        ax.axvline(cut, color="tab:green", linestyle="--", label=f"cut for one row {cut:.3g}")
    if request is not None and np.size(request):
        r = np.asarray(request, dtype=float)
        ax.plot(np.clip(r[np.isfinite(r)], lo, None), np.zeros(int(np.isfinite(r).sum())), "v", color="black",
                markersize=9, label="this request's rows", clip_on=False)
    ax.set_xlabel("map epsilon upper bound per row (IN vs OUT members)")
    ax.set_ylabel("rows")
    _legend(ax, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@tracks
def close(fig) -> None:
    plt.close(fig)


@tracks
def by_group(df, value: str, title: str):
    """Box plot of `value` per `group` (e.g. cross-leverage of retain samples by declared group)."""
    groups = sorted(df["group"].unique())
    fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(groups) + 2), 3.2))
    ax.boxplot([df.loc[df["group"] == g, value].to_numpy() for g in groups], showfliers=False)
    ax.set_xticks(range(1, len(groups) + 1), groups, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(value)
    ax.set_title(title)
    fig.tight_layout()
    return fig


@tracks
def spectrum(eigenvalues: np.ndarray, title: str):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.semilogy(np.arange(1, len(eigenvalues) + 1), np.clip(eigenvalues, 1e-12, None), marker=".")
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue")
    ax.set_title(title)
    fig.tight_layout()
    return fig


@tracks
def sweep_scatter(s3: dict, title: str = "S3: forget KLoM against validation KLoM"):
    """One point per (setting, forget-set size), joined in size order: median KLoM P95 on the forget split (y)
    against the validation split (x); the retrain's points mark where a retrain sits."""
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    markers = {"gradient_ascent": "^", "descent_ascent": "v", "retrain": "*", "do_nothing": "o"}
    for label, row in s3["summary"].items():
        per_size = sorted(row["per_size"].items(), key=lambda kv: int(kv[0]))  # the JSON's keys are sorted as text
        xs = [v["klom_p95/validation"] for _, v in per_size]
        ys = [v["klom_p95/forget"] for _, v in per_size]
        ax.plot(xs, ys, linestyle="-" if len(xs) > 1 else "", marker=markers.get(row["method"], "s"), label=label,
                alpha=0.85)
        for (size, _), x, y in zip(per_size, xs, ys):
            ax.annotate(size, (x, y), fontsize=6, alpha=0.6, textcoords="offset points", xytext=(3, 2))
    ax.set_xlabel("KLoM P95 on validation (median over sets)")
    ax.set_ylabel("KLoM P95 on the forget set (median over sets)")
    ax.set_title(title + " (labels: forget-set size)")
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig


@tracks
def entanglement_bars(s4: dict, title: str = "S4: Fashion-MNIST, forget = Shirt"):
    """Per setting (targets x model): forget / adjacent / remote accuracy per method."""
    settings = s4["settings"]
    fig, axes = plt.subplots(len(settings), 1, figsize=(9, 2.6 * len(settings)), squeeze=False)
    for ax, st in zip(axes[:, 0], settings):
        rows = st["rows"]
        x = np.arange(len(rows))
        for k, split in enumerate(("forget", "adjacent", "remote")):
            ax.bar(x + (k - 1) * 0.27, [r[split] for r in rows], width=0.27, label=split)
        ax.set_xticks(x, [r["method"] for r in rows], fontsize=7, rotation=20)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{st['targets']} targets, {st['model']}", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@tracks
def predicted_against_realised(s5: dict, title: str = "S5: predicted gap against the realised gap"):
    """Per structure: the predicted gap (diagnostics before unlearning) against each method's forget gap."""
    fig, ax = plt.subplots(figsize=(7, 5))
    rows = s5["structures"]
    pred = [r["facts"]["predicted_gap"] for r in rows]
    for m in s5["methods"]:
        ax.scatter(pred, [r["gaps"][m] for r in rows], label=m, s=18)
    for r, p in zip(rows, pred):
        ax.annotate(r["structure"], (p, r["gaps"].get("do_nothing", 0)), fontsize=6, alpha=0.6)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_yscale("log")
    ax.set_xlabel("predicted gap (KL units, before unlearning)")
    ax.set_ylabel("realised gap: mean |margin - oracle mean| on the forget set")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@tracks
def qualification_rates(table: list, title: str):
    """The qualification table (unlearning/certificate/qualification.py Row): per method, the certificate's pass rate per
    bin of the predicted gap (noise units), with its interval as error bars and each bin's count of sets."""
    methods = list(dict.fromkeys(r.method for r in table))
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for j, m in enumerate(methods):
        rows = [r for r in table if r.method == m]
        x = np.arange(len(rows)) + (j - (len(methods) - 1) / 2) * 0.15
        rate = np.array([r.rate if r.n else np.nan for r in rows], dtype=float)
        lo = np.array([r.rate - r.lower if r.n else 0 for r in rows], dtype=float)
        hi = np.array([r.upper - r.rate if r.n else 0 for r in rows], dtype=float)
        ax.errorbar(x, rate, yerr=[lo, hi], fmt="o", capsize=3, label=m)
        for xi, r in zip(x, rows):
            if r.n:
                ax.annotate(f"{r.passes}/{r.n}", (xi, r.rate), textcoords="offset points", xytext=(4, 4), fontsize=7)
    edges = [r for r in table if r.method == methods[0]]
    ax.set_xticks(np.arange(len(edges)))
    ax.set_xticklabels([r.row_id.split(" gap ")[1] for r in edges], fontsize=8)
    ax.set_xlabel("predicted gap (noise units)")
    ax.set_ylabel("certificate pass rate")
    ax.set_ylim(-0.05, 1.1)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig
