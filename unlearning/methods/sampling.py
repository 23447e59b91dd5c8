"""Per-member minibatch streams over row pools (forget / retain / adjacent / remote).

Each member draws its own order from its own generator (see `memberwise.member_generators`), so
member k of an ensemble sees the batches a lone model with that member seed would see.
"""

from __future__ import annotations

from typing import Iterator

import torch

from unlearning.models.training import batch_bounds


class PoolStream:
    """Minibatches of row indices [N, b] from `rows` (indices into the term's source table).

    `epoch()` yields one pass in a fresh per-member permutation (the last batch may be short);
    `next()` cycles forever, drawing a new permutation whenever the current one runs out.
    `batch_size=None` means the whole pool every time (in pool order, identical for all members).
    `merge_single` folds a last epoch batch of one row into the previous batch (BatchNorm cannot normalise
    one row in train mode; as `batch_bounds` in training)."""

    def __init__(self, rows: torch.Tensor, batch_size: int | None, gens: list[torch.Generator],
                 merge_single: bool = False):
        self.rows, self.gens, self.merge_single = rows, gens, merge_single
        self.batch_size = len(rows) if batch_size is None else int(batch_size)
        self.full = batch_size is None or batch_size >= len(rows)
        self._perm: torch.Tensor | None = None
        self._pos = 0

    def __len__(self) -> int:
        return len(self.rows)

    def steps_per_epoch(self) -> int:
        return len(self._bounds())

    def _bounds(self) -> list[tuple[int, int]]:
        n = len(self.rows)
        return [] if n == 0 else batch_bounds(n, self.batch_size, self.merge_single)

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
        for start, stop in self._bounds():
            yield self._take(perm, start, stop - start)

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
