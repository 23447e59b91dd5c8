"""Per-member minibatch streams over row pools (forget / retain / adjacent / remote).

Each member draws its own order from its own generator (see `memberwise.member_generators`), so
member k of an ensemble sees the batches a lone model with that member seed would see.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch


class PoolStream:
    """Minibatches of row indices [N, b] from `rows` (indices into the term's source table).

    `epoch()` yields one pass in a fresh per-member permutation (the last batch may be short);
    `next()` cycles forever, drawing a new permutation whenever the current one runs out.
    `batch_size=None` means the whole pool every time (in pool order, identical for all members)."""

    def __init__(self, rows: torch.Tensor, batch_size: int | None, gens: list[torch.Generator]):
        self.rows, self.gens = rows, gens
        self.batch_size = len(rows) if batch_size is None else int(batch_size)
        self.full = batch_size is None or batch_size >= len(rows)
        self._perm: torch.Tensor | None = None
        self._pos = 0

    def __len__(self) -> int:
        return len(self.rows)

    def steps_per_epoch(self) -> int:
        return 0 if len(self.rows) == 0 else math.ceil(len(self.rows) / self.batch_size)

    def _permutation(self) -> torch.Tensor:
        """[N, n_pool] positions into rows: one permutation per member."""
        return torch.stack([torch.randperm(len(self.rows), generator=g) for g in self.gens])

    def _take(self, perm: torch.Tensor, start: int, size: int) -> torch.Tensor:
        return self.rows[perm[:, start : start + size].to(self.rows.device)]

    def _whole(self) -> torch.Tensor:
        return self.rows.unsqueeze(0).expand(len(self.gens), -1)

    def epoch(self) -> Iterator[torch.Tensor]:
        if len(self.rows) == 0:
            return
        if self.full:
            yield self._whole()
            return
        perm = self._permutation()
        for start in range(0, len(self.rows), self.batch_size):
            yield self._take(perm, start, self.batch_size)

    def next(self) -> torch.Tensor:
        if len(self.rows) == 0:
            raise ValueError("cannot draw a batch from an empty pool")
        if self.full:
            return self._whole()
        if self._perm is None or self._pos + self.batch_size > len(self.rows):
            self._perm, self._pos = self._permutation(), 0
        out = self._take(self._perm, self._pos, self.batch_size)
        self._pos += self.batch_size
        return out
