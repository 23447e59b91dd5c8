"""What a team's module must satisfy for the ensemble, beyond its output shape (zoo.check_output_shape):
checked once at build, each breach refused by name with its fix.

The members run through `torch.func.functional_call` on a template module with stacked tensors swapped in, and
their gradients come from `torch.func` (vmap over grad) or from autograd on those swapped-in tensors. These
things then change the numbers SILENTLY (the module alone would train differently) or fail deep inside a
later stage:

- gradient hooks (`register_full_backward_hook`, `register_full_backward_pre_hook`, `param.register_hook`,
  `register_post_accumulate_grad_hook`) sit on the module's own tensors and modules, never on the members';
- a forward hook whose closure holds the module's parameters (or the module, and reads its parameters through
  it) reads the one tensor built first, not the member's: that parameter never trains. Forward hooks that use
  their `module` argument, or a bound method (`self._hook`), are copied with the module and work;
- a forward that rewrites its input, reassigns a buffer or rewrites a parameter in place (`check_forward_writes`);
- eval-mode outputs that depend on the other rows of the batch (`check_per_sample_outputs`).
"""

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


def check_forward_writes(module: nn.Module, in_shape, field: str) -> None:
    """Writes of the forward to its module that the members cannot follow, seen on a plain module (member 0's
    copy) in train and eval mode on zeros [2, *in_shape]:

    - the input changed in place (its version counter moves: `x.sub_(mean)`): the pipeline's stored rows would be
      rewritten by every forward;
    - a buffer the forward REASSIGNS (`self.mu = 0.9 * self.mu + ...`: the name holds another tensor object after
      the call) instead of updating it in place: functional_call puts back the buffers it was given, so the
      update would be lost silently (the module alone keeps it);
    - a parameter the forward changes in place (its version counter moves: nn.Embedding(max_norm=...)
      renormalises the rows it looks up): training, unlearning and the leverage diagnostics differentiate the
      forward with respect to the parameters, which it must not rewrite (vmap refuses the write).
    A forward that fails on zeros in train mode is left to the probes and training, which report it."""
    p = next(iter(module.parameters()))
    x = torch.zeros(2, *in_shape, dtype=p.dtype if p.is_floating_point() else None, device=p.device)
    reassigned: list[str] = []
    rewritten: list[str] = []
    input_version = x._version
    was_training = module.training
    try:
        with torch.no_grad():
            for mode in (True, False):
                before = dict(module.named_buffers())
                versions = {n: t._version for n, t in module.named_parameters()}
                module.train(mode)(x)
                after = dict(module.named_buffers())
                reassigned += [n for n, t in before.items() if after.get(n) is not t and n not in reassigned]
                rewritten += [n for n, t in module.named_parameters()
                              if t._version != versions.get(n) and n not in rewritten]
    except Exception:  # noqa: BLE001 - see the docstring
        return
    finally:
        module.train(was_training)
    cls = type(module).__name__
    if x._version != input_version:
        raise ModelError(
            f"{field}: {cls}'s forward changes its input in place (`x.sub_(...)`, `x /= 255`, an inplace=True op on "
            f"x); the pipeline passes its stored data (the prepared rows, the forget and retain sets) to the "
            f"forward, which would rewrite them for every later use. Use out-of-place ops on the input "
            f"(`x = (x - mean) / std`)")
    if reassigned:
        raise ModelError(
            f"{field}: {cls}'s forward reassigns {'buffer' if len(reassigned) == 1 else 'buffers'} "
            f"{', '.join(map(repr, reassigned))} (`self.name = new_tensor`); the pipeline runs every member on its "
            f"own stacked buffers and keeps only updates made in place, so this one would never change. Update it "
            f"in place: `self.name.copy_(new_value)` (or mul_/add_, as BatchNorm's running statistics do)")
    if rewritten:
        raise ModelError(
            f"{field}: {cls}'s forward changes {'parameter' if len(rewritten) == 1 else 'parameters'} "
            f"{', '.join(map(repr, rewritten[:4]))} in place (nn.Embedding(max_norm=...) does: it renormalises the "
            f"rows it looks up); training, unlearning and the leverage diagnostics differentiate the forward with "
            f"respect to the parameters, which it must not rewrite. Leave them to the optimiser: drop max_norm, or "
            f"renormalise out of place (`torch.renorm(rows, 2, 0, max_norm)` on the looked-up rows)")


_PER_SAMPLE_NEED = "the leverage diagnostics, KLoM and the oracles need row i's logits to depend on row i only"


def check_per_sample_outputs(module: nn.Module, in_shape, field: str) -> None:
    """Eval-mode outputs must be per-sample: row i of f(X) depends on x_i only. The per-sample Jacobians (one row
    at a time), KLoM and the oracles' outputs (any batch) all assume it; a forward that branches on the batch
    size (`if x.shape[0] > 1`) or mixes rows in eval mode made the leverage diagnostics disagree with the batched
    products silently. Checked on 3 fixed rows in [0, 1), together vs one by one. A probe the module cannot run
    (inputs it does not accept) leaves the check to the real data."""
    batch_stats = [n for n, m in module.named_modules()
                   if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]
    if batch_stats:  # by construction (the probe below may not even run: one row has no batch statistics)
        raise ModelError(
            f"{field}: {type(module).__name__}'s eval-mode outputs depend on the other rows of the batch; "
            f"{_PER_SAMPLE_NEED}. Cause: BatchNorm layers {batch_stats[:4]} have track_running_stats=False, so "
            f"they normalise with the batch's own statistics in eval mode too: build them with "
            f"track_running_stats=True (the default)")
    p = next(iter(module.parameters()))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, *in_shape, generator=g, dtype=p.dtype if p.is_floating_point() else None).to(p.device)
    was_training = module.training
    try:
        with torch.no_grad():
            module.eval()
            together = module(x.clone())  # clones: a forward may normalise its input in place
            each = [module(x[i:i + 1].clone()) for i in range(len(x))]
    except Exception:  # noqa: BLE001 - see the docstring
        return
    finally:
        module.train(was_training)
    if tuple(each[0].shape) != (1, together.shape[-1]):  # a squeeze() in forward: [1, C] became [C]
        raise ModelError(
            f"{field}: {type(module).__name__} maps one row [1, *in_shape] to {list(each[0].shape)}, not "
            f"[1, {together.shape[-1]}] (a `.squeeze()` in forward drops the batch dimension of a one-row batch); "
            f"a last minibatch, a one-row forget set and the per-sample Jacobians all run one row: squeeze only "
            f"the dimensions you mean (`.flatten(1)`, `.squeeze(-1)`)")
    alone = torch.cat(each)
    gap = (together - alone).abs().max().item()
    if gap > 1e-4 * (1.0 + together.abs().max().item()):
        raise ModelError(
            f"{field}: {type(module).__name__}'s eval-mode outputs depend on the other rows of the batch (3 rows "
            f"together and one by one differ by {gap:.3g}); {_PER_SAMPLE_NEED}. Cause: a branch on the batch size "
            f"(x.shape[0]) or an op across rows: make the eval forward per-sample")
