"""Model registry (MLP, small CNN) as grouped-layer ensembles, and their deterministic training."""

from unlearning.models.stacked import ARCHITECTURES, StackedCNN, StackedMLP, StackedModel, build_model
from unlearning.models.training import (
    TrainCost, accuracy, clone_model, flat_params, load_model, param_count, per_member_loss, predict_logits,
    save_model, seeds_for, train_ensemble,
)

__all__ = [
    "ARCHITECTURES", "StackedCNN", "StackedMLP", "StackedModel", "build_model", "TrainCost", "accuracy",
    "clone_model", "flat_params", "load_model", "param_count", "per_member_loss", "predict_logits",
    "save_model", "seeds_for", "train_ensemble",
]
