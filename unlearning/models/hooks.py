"""Hooks on a team's module that the ensemble cannot honour, refused at build by name.

The members run through `torch.func.functional_call` on a template module with stacked tensors swapped in, and
their gradients come from `torch.func` (vmap over grad) or from autograd on those swapped-in tensors. Two kinds
of hook then change the numbers SILENTLY (the module alone would train differently):

- gradient hooks (`register_full_backward_hook`, `register_full_backward_pre_hook`, `param.register_hook`,
  `register_post_accumulate_grad_hook`) sit on the module's own tensors and modules, never on the members';
- a forward hook whose closure holds the module's parameters (or the module, and reads its parameters through
  it) reads the one tensor built first, not the member's: that parameter never trains.

Forward hooks that use their `module` argument, or a bound method (`self._hook`), are copied with the module and
work."""

from __future__ import annotations

import functools

import torch
from torch import nn

from unlearning.models.zoo import ModelError


def _gradient_hooks(module: nn.Module) -> list[str]:
    found = []
    for name, m in module.named_modules():
        where = name or "(the module itself)"
        if m._backward_hooks or m._backward_pre_hooks:
            found.append(f"a backward hook on {where}")
    for name, p in module.named_parameters():
        if getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None):
            found.append(f"a gradient hook on parameter {name!r}")
    return found


def _captured(fn) -> list[object]:
    """What a hook function holds besides its arguments: closure cells and functools.partial arguments."""
    held = []
    while isinstance(fn, functools.partial):
        held += list(fn.args) + list(fn.keywords.values())
        fn = fn.func
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return held


def _tensor_attribute_names(module: nn.Module) -> set[str]:
    """Attribute names through which code reaches a parameter or buffer: every part of their dotted names."""
    names = set()
    for name, _ in list(module.named_parameters()) + list(module.named_buffers()):
        names.update(name.split("."))
    return names


def _closure_problems(module: nn.Module) -> list[str]:
    tensors = {id(t): n for n, t in list(module.named_parameters()) + list(module.named_buffers())}
    modules = {id(m) for m in module.modules()}
    reachable = _tensor_attribute_names(module)
    found = []
    for name, m in module.named_modules():
        where = name or "(the module itself)"
        for hook in list(m._forward_pre_hooks.values()) + list(m._forward_hooks.values()):
            fn = hook.func if isinstance(hook, functools.partial) else hook
            code = getattr(fn, "__code__", None)
            for obj in _captured(hook):
                if isinstance(obj, torch.Tensor) and id(obj) in tensors:
                    found.append(f"a forward hook on {where} holds {tensors[id(obj)]!r} in its closure")
                elif (isinstance(obj, nn.Module) and id(obj) in modules and code is not None
                      and reachable & set(code.co_names)):
                    used = sorted(reachable & set(code.co_names))
                    found.append(f"a forward hook on {where} reads {used} through a module in its closure")
    return found


def check_hooks(module: nn.Module, field: str) -> None:
    """ModelError naming every hook of `module` that the ensemble would ignore or misread (module docstring)."""
    grads, closures = _gradient_hooks(module), _closure_problems(module)
    problems = []
    if grads:
        problems.append(f"{'; '.join(grads[:4])}: the members' gradients are computed by torch.func on stacked "
                        f"copies of the parameters, so gradient hooks would be ignored; apply the change in the "
                        f"loss or the forward instead")
    if closures:
        problems.append(f"{'; '.join(closures[:4])}: every member would use the first-built module's tensor, "
                        f"which never trains; read it through the hook's module argument "
                        f"(`lambda m, inp, out: out * m.scale` on the module that owns it) or register a bound "
                        f"method (`self.fc.register_forward_hook(self._scale_hook)`)")
    if problems:
        raise ModelError(f"{field}: {type(module).__name__} has hooks the pipeline cannot honour: "
                         + " | ".join(problems))
