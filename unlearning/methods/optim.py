"""Member-wise optimizers for the unlearner engine.

Like torch.optim's SGD and Adam (same formulas, eps outside the square root, bias correction), but
every member has its own step count and a step only touches the ACTIVE members: a member that met
its target or spent its budget keeps its weights and its optimizer state, exactly as a lone run of
that member that stopped there. That is what makes member k of an ensemble equal a lone run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from unlearning.methods.memberwise import Vec, member_view


@dataclass(frozen=True)
class OptimizerSpec:
    """kind "sgd" (heavy-ball momentum as torch.optim.SGD, dampening 0) or "adam"; phases that give the
    same `share_key` continue one optimizer state (e.g. SCRUB's alternating max/min passes)."""

    kind: Literal["sgd", "adam"] = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    share_key: str | None = None


class MemberOptimizer:
    def __init__(self, spec: OptimizerSpec, n_members: int):
        if spec.kind not in ("sgd", "adam"):
            raise ValueError(f"optimizer kind={spec.kind!r} is not known; allowed: ['adam', 'sgd']")
        self.spec = spec
        self.t = torch.zeros(n_members, dtype=torch.long)  # steps taken, per member
        self.state: list[tuple[torch.Tensor, ...]] | None = None

    def update(self, direction: Vec, active: torch.Tensor) -> Vec:
        """The step to SUBTRACT from the parameters for this direction (zero for inactive members).
        active: [N] bool."""
        s = self.spec
        act = active.to(self.t.device)
        self.t += act.long()
        if self.state is None:
            self.state = [tuple(torch.zeros_like(d) for _ in range(1 if s.kind == "sgd" else 2)) for d in direction]
        out = []
        for d, st in zip(direction, self.state):
            mask = member_view(active.to(d.device), d).bool()  # [N, 1, ...]
            if s.kind == "sgd":
                (buf,) = st
                new = buf * s.momentum + d if s.momentum else d
                buf.copy_(torch.where(mask, new, buf))
                step = s.lr * buf
            else:
                m, v = st
                b1, b2 = s.betas
                m.copy_(torch.where(mask, m * b1 + (1 - b1) * d, m))
                v.copy_(torch.where(mask, v * b2 + (1 - b2) * d * d, v))
                # the bias corrections in float64, as torch.optim.Adam computes them (Python floats): in bfloat16,
                # 0.999 rounds to 1.0, so 1 - b2**t was exactly 0 and every step inf or NaN
                t = self.t.to(d.device).clamp_min(1).double()
                bc1, bc2 = 1 - b1**t, 1 - b2**t  # [N]
                denom = v.sqrt() / member_view(bc2.sqrt().to(d.dtype), v) + s.eps
                step = member_view((s.lr / bc1).to(d.dtype), m) * m / denom
            out.append(torch.where(mask, step, torch.zeros_like(step)))
        return out
