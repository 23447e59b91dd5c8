"""Matplotlib figures logged to MLflow (headless Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SPLITS = ("forget", "adjacent", "remote", "validation")


def accuracy_bars(metrics: dict, title: str):
    """Per-split accuracy: original, candidate, and the oracle mean with its spread."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(SPLITS))
    for i, (key, label) in enumerate((("original_acc", "original"), ("acc", "candidate"), ("oracle_acc", "oracles"))):
        vals = [metrics.get(f"{key}/{s}", np.nan) for s in SPLITS]
        err = [metrics.get(f"oracle_acc_std/{s}", 0.0) for s in SPLITS] if key == "oracle_acc" else None
        ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=label, yerr=err, capsize=3)
    ax.set_xticks(x, SPLITS)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


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


def close(fig) -> None:
    plt.close(fig)


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


def spectrum(eigenvalues: np.ndarray, title: str):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.semilogy(np.arange(1, len(eigenvalues) + 1), np.clip(eigenvalues, 1e-12, None), marker=".")
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue")
    ax.set_title(title)
    fig.tight_layout()
    return fig
