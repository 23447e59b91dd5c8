"""Models: the architectures (`zoo`), ONE ensemble adapter over any nn.Module (`ensemble`), the fused MLP
fast path, and deterministic training with the declared recipe. Nothing outside this package names a
concrete architecture."""

from unlearning.models.ensemble import Ensemble, build_model, from_modules, normalize_spec, vmap_or_loop
from unlearning.models.training import (
    TrainCost, TrainRecipe, accuracy, clone_model, fit, flat_params, load_model, load_module_state, param_count,
    per_member_loss, predict_logits, save_model, seeds_for, train_ensemble,
)
from unlearning.models.zoo import ARCHITECTURES, import_factory

__all__ = [
    "ARCHITECTURES", "Ensemble", "build_model", "from_modules", "import_factory", "normalize_spec", "TrainCost",
    "TrainRecipe", "accuracy", "clone_model", "fit", "flat_params", "load_model", "load_module_state",
    "param_count", "per_member_loss", "predict_logits", "save_model", "seeds_for", "train_ensemble",
]
