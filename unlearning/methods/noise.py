"""Member-wise Gaussian weight noise: the noise term of Langevin steps (Chien et al. 2024, "Langevin Unlearning")
and the output perturbation of "Descent-to-Delete" (Neel et al. 2021), docs/design.md §4.3.

Each member draws from its own generator (memberwise.member_generators: the run seed, the MEMBER's seed and the
stream name), parameter by parameter in `parameters()` order, so member k of an ensemble draws exactly what a
lone run of that member draws. Draws are on the CPU (a torch.Generator is), then moved to the parameter's device.
"""

from __future__ import annotations

import torch

from unlearning.models import Ensemble


def add_member_noise(model: Ensemble, gens: list[torch.Generator], std: float, active: torch.Tensor) -> None:
    """In place: every trainable parameter [N, ...] of the active members [N] bool gets N(0, std^2) noise per
    entry; frozen parameters (the module's requires_grad=False) and inactive members stay as they are and draw
    nothing."""
    if std <= 0:
        return
    with torch.no_grad():
        for p, trainable in zip(model.parameters(), model.trainable_mask()):
            if not trainable:
                continue
            for k, g in enumerate(gens):
                if bool(active[k]):
                    z = torch.randn(p.shape[1:], generator=g, dtype=torch.float64)  # [...], one member's shape
                    p[k].add_((z * std).to(device=p.device, dtype=p.dtype))
