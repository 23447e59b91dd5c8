"""The figures' legends list only what they draw (adapters/plots.py): an exact retrain trains no oracles, so its
accuracy figure has no oracle entry; a history marks the exact methods' batches (by their traits: retrain and
sisa clear the retraining debt), and one without them has no marker entry."""

from __future__ import annotations

from adapters import plots
from unlearning.batch.rows import SPLITS


def legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def test_a_retrain_accuracy_figure_lists_no_oracles():
    metrics = {**{f"acc/{s}": 0.9 for s in SPLITS}, **{f"original_acc/{s}": 0.92 for s in SPLITS}}
    fig = plots.accuracy_bars(metrics, "retrain: accuracy per split", passed=True)
    assert legend_texts(fig.axes[0]) == ["original", "candidate"]
    plots.close(fig)
    limits = {f"acc/{s}": {"limit": [0.8, 0.95], "passed": s != SPLITS[-1]} for s in SPLITS[1:]}
    oracles = {f"oracle_acc/{s}": 0.9 for s in SPLITS}
    fig = plots.accuracy_bars({**metrics, **oracles}, "finetune", limits, passed=False)
    assert sorted(legend_texts(fig.axes[0])) == ["candidate (red: outside the gate interval)", "gate interval",
                                                 "oracles (min..max)", "original"]
    plots.close(fig)


def test_a_history_marks_the_exact_batches_and_none_without_them():
    point = {"forgotten_fraction": 0.01, "champion_validation_accuracy": 0.9, "champion_output_gap": 0.02}
    fig = plots.history([{"step": 1, "method": "finetune", **point}, {"step": 2, "method": "newton_ggn", **point}])
    assert all(legend_texts(ax) == [] for ax in fig.axes)
    plots.close(fig)
    for exact in ("retrain", "sisa"):
        fig = plots.history([{"step": 1, "method": "finetune", **point}, {"step": 2, "method": exact, **point}])
        assert legend_texts(fig.axes[0]) == ["exact retrain"]
        marked = [c for c in fig.axes[0].collections if c.get_label() == "exact retrain"]
        assert [tuple(xy) for xy in marked[0].get_offsets()] == [(2, 0.01)]  # the exact batch only
        plots.close(fig)
