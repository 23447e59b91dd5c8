"""Seeded random projections R^p -> R^k, generated in parameter blocks (TRAK, Park et al. 2023).

Pi [p, k] has i.i.d. N(0, 1/k) ("gaussian") or +-1/sqrt(k) ("rademacher") entries. Block b holds rows
[b*block, (b+1)*block) and is drawn from its own CPU generator seeded by (seed, b), so the same Pi comes
back on any device and the whole matrix never has to be in memory: it is cached only when p*k fits
`cache_bytes`, otherwise regenerated block by block on every use.
"""

from __future__ import annotations

from typing import Iterator

import torch

KINDS = ("gaussian", "rademacher")


class RandomProjection:
    def __init__(self, p: int, k: int, *, kind: str = "gaussian", seed: int = 0, dtype=torch.float64,
                 device="cpu", block: int = 8192, cache_bytes: int = 256 * 2**20):
        if kind not in KINDS:
            raise ValueError(f"projection kind={kind!r} is not known; allowed: {list(KINDS)}")
        if k < 1:
            raise ValueError(f"projection dimension k must be >= 1, got {k}")
        self.p, self.k, self.kind, self.seed = p, k, kind, int(seed)
        self.dtype, self.device, self.block = dtype, torch.device(device), int(block)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self._full = None
        if p * k * itemsize <= cache_bytes:
            self._full = torch.cat([blk for _, blk in self._generate()], 0)

    def _generate(self) -> Iterator[tuple[slice, torch.Tensor]]:
        for b, a in enumerate(range(0, self.p, self.block)):
            rows = slice(a, min(a + self.block, self.p))
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + b)
            shape = (rows.stop - rows.start, self.k)
            if self.kind == "gaussian":
                blk = torch.randn(shape, generator=gen, dtype=torch.float64)
            else:
                blk = torch.randint(0, 2, shape, generator=gen).to(torch.float64).mul_(2).sub_(1)
            yield rows, blk.div_(self.k ** 0.5).to(device=self.device, dtype=self.dtype)

    def blocks(self) -> Iterator[tuple[slice, torch.Tensor]]:
        if self._full is not None:
            yield slice(0, self.p), self._full
        else:
            yield from self._generate()

    def project(self, A: torch.Tensor) -> torch.Tensor:
        """A Pi: rows [..., p] -> [..., k]."""
        out = torch.zeros(*A.shape[:-1], self.k, dtype=A.dtype, device=A.device)
        for rows, blk in self.blocks():
            out += A[..., rows] @ blk
        return out

    def lift(self, Z: torch.Tensor) -> torch.Tensor:
        """Pi Z: [k, m] -> [p, m]."""
        out = torch.empty(self.p, Z.shape[1], dtype=Z.dtype, device=Z.device)
        for rows, blk in self.blocks():
            out[rows] = blk @ Z
        return out

    def gram(self) -> torch.Tensor:
        """Pi^T Pi [k, k]."""
        out = torch.zeros(self.k, self.k, dtype=self.dtype, device=self.device)
        for _, blk in self.blocks():
            out += blk.T @ blk
        return out
