"""The unlearner engine and its presets (docs/design.md §4.3).

Importing this package registers every preset in `REGISTRY`. `run_method(name, ctx, args)` validates
the args (pydantic, extra="forbid") and runs the method on a clone of ctx.model.
"""

from __future__ import annotations

from unlearning.methods import (  # noqa: F401  (imported to register the presets)
    al_wpgd, descent_ascent, do_nothing, finetune, gradient_ascent, newton_finetune, newton_ggn, noisy_finetune, retrain,
    salun, scrub, sisa,
)
from unlearning.methods.base import MethodCost, TrainRecipe, UnlearnContext, UnlearnResult
from unlearning.methods.registry import REGISTRY, get_method, parse_args, register, run_method


def _default_repr(field) -> object:
    if field.is_required():
        return "<required>"
    return field.get_default(call_default_factory=True)


def describe_methods() -> list[dict]:
    """One row per registered method, sorted by name: {"name", "summary", "args": {key: default}}
    (for the CLI's `unlearn methods` listing)."""
    rows = []
    for name in sorted(REGISTRY):
        spec = REGISTRY[name]
        args = {k: _default_repr(f) for k, f in spec.args_model.model_fields.items()}
        rows.append({"name": name, "summary": spec.summary, "args": args})
    return rows


__all__ = [
    "REGISTRY", "register", "get_method", "run_method", "parse_args", "describe_methods", "MethodCost",
    "TrainRecipe", "UnlearnContext", "UnlearnResult",
]
