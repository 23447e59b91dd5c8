"""Registry of unlearning methods: name -> (pydantic args model, run function, one-line summary, traits).

A method's traits (`exact`, `needs_sharded_original`, `fallback`: unlearning/config.py MethodTraits) say what
the planner, the certificate and the debt need to know of it, so that no code outside a method's own module
compares method names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pydantic import BaseModel, ValidationError

from unlearning.config import MethodTraits, method_traits
from unlearning.methods.base import UnlearnContext, UnlearnResult


@dataclass(frozen=True)
class MethodSpec:
    name: str
    args_model: type[BaseModel]
    run: Callable[[UnlearnContext, BaseModel], UnlearnResult]
    summary: str

    @property
    def traits(self) -> MethodTraits:
        return method_traits(self.name)


REGISTRY: dict[str, MethodSpec] = {}


def register(name: str, args_model: type[BaseModel], summary: str):
    """Decorator: `@register("finetune", FinetuneArgs, "...")` on `def run(ctx, args) -> UnlearnResult`."""

    def deco(fn):
        if name in REGISTRY:
            raise ValueError(f"method {name!r} is registered twice")
        REGISTRY[name] = MethodSpec(name, args_model, fn, summary)
        return fn

    return deco


def get_method(name: str) -> MethodSpec:
    if name not in REGISTRY:
        raise KeyError(f"unknown unlearning method {name!r}; allowed: {sorted(REGISTRY)}")
    return REGISTRY[name]


def parse_args(name: str, args: dict | None) -> BaseModel:
    """Validate a method's args; errors name the method, the bad key and the allowed keys."""
    spec = get_method(name)
    try:
        return spec.args_model(**(args or {}))
    except ValidationError as e:
        allowed = sorted(spec.args_model.model_fields)
        raise ValueError(f"bad args for method {name!r}: {e.errors()[0]['loc']} -> {e.errors()[0]['msg']}; "
                         f"allowed keys: {allowed}") from None


def run_method(name: str, ctx: UnlearnContext, args: dict | None = None) -> UnlearnResult:
    spec = get_method(name)
    return spec.run(ctx, parse_args(name, args))
