"""Member-wise vector algebra on grouped-layer ensembles (docs/design.md §4.3).

Every parameter (and every gradient or update direction) is a tensor with a leading member dimension
N; a "member vector" is a list of such tensors, one per parameter. The helpers here never mix members:
an inner product gives one number per member [N], a flattening gives [N, p].
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

Vec = list[torch.Tensor]  # one tensor per parameter, each [N, ...]


def flatten(vec: Sequence[torch.Tensor]) -> torch.Tensor:
    """[N, p]: the member vectors side by side (parameter order of `model.parameters()`)."""
    n = vec[0].shape[0]
    return torch.cat([t.reshape(n, -1) for t in vec], 1)


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> Vec:
    """Inverse of `flatten`: [N, p] -> tensors shaped like `like` (dtype of `like`)."""
    out, i = [], 0
    for t in like:
        size = t[0].numel()
        out.append(flat[:, i : i + size].reshape(t.shape).to(t.dtype))
        i += size
    return out


def dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-member inner product <a_k, b_k> in float64: [N]."""
    return sum((x.double() * y.double()).reshape(x.shape[0], -1).sum(1) for x, y in zip(a, b))


def member_view(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a per-member tensor [N] so it broadcasts against a parameter-shaped tensor [N, ...]."""
    return t.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def scale(vec: Sequence[torch.Tensor], s: torch.Tensor) -> Vec:
    """Multiply member k of every tensor by s[k] (s [N])."""
    return [t * member_view(s, t) for t in vec]


def member_seed(*parts) -> int:
    """A 63-bit seed derived from the parts (e.g. run seed, member seed, stream name) by hashing, so
    streams of different members, phases and pools never collide by arithmetic accident."""
    digest = hashlib.blake2b(repr(tuple(parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def member_generators(run_seed: int, member_seeds: Sequence[int], *stream) -> list[torch.Generator]:
    """One generator per member. It depends on the run seed, the MEMBER's seed and the stream name only,
    never on the member's position, so member k of an ensemble draws what a lone model with that seed
    draws (the member-equivalence contract)."""
    return [torch.Generator().manual_seed(member_seed(int(run_seed), int(s), *stream)) for s in member_seeds]
