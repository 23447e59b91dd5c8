"""Independent seed streams per role (docs/design.md §4.2: "one independent stream per role; no seed shared
between roles").

Every member seed of every ensemble is derived from the one base seed (`base.seed`) through
`numpy.random.SeedSequence(base_seed, spawn_key=(ROLE_INDEX[role],))`, i.e. the child that
`SeedSequence(base_seed).spawn` returns at the role's index. Each role draws `n` 63-bit words from its
own child; collisions between roles (or inside a role) have probability ~n^2 / 2^63 and are checked in
tests/unit/test_seeds.py (disjoint for n up to 1000). The role list is append-only: changing a role's index
changes every seed of that role (and hence the ensemble cache keys, which include the seeds).

The original (production) model keeps `base.seed` itself, as the train stage has always used: a
`role_seeds` word is never that small (values are drawn in [2^32, 2^63)), so no shadow, oracle or method
seed equals the original's.
"""

from __future__ import annotations

import numpy as np

ROLES: tuple[str, ...] = ("original", "shadows", "oracles", "oracles_b", "method", "bench", "memorization")
ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
_LOW = 1 << 32  # role seeds are >= 2^32: never equal to a small base seed (the original's)


def role_seeds(base_seed: int, role: str, n: int) -> list[int]:
    """`n` member seeds of `role`, deterministic in (base_seed, role), disjoint across roles."""
    if role not in ROLE_INDEX:
        raise ValueError(f"role {role!r} is not known; allowed: {list(ROLES)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _stream_words(np.random.SeedSequence(int(base_seed), spawn_key=(ROLE_INDEX[role],)), n)


def _stream_words(ss: np.random.SeedSequence, n: int) -> list[int]:
    """`n` 63-bit seeds in [2^32, 2^63) drawn from one SeedSequence stream."""
    words = ss.generate_state(max(n, 1) * 2, dtype=np.uint32).astype(np.uint64).reshape(-1, 2)
    vals = (words[:, 0] << np.uint64(32)) | words[:, 1]
    vals = vals % np.uint64((1 << 63) - _LOW) + np.uint64(_LOW)
    return [int(v) for v in vals[:n]]


def original_seed(base_seed: int) -> int:
    """The production model's seed: `base.seed` itself (what the train stage uses)."""
    return int(base_seed)


def method_seed(base_seed: int) -> int:
    """The seed of a method's own randomness (minibatch order, projections) on the production model."""
    return role_seeds(base_seed, "method", 1)[0]


def batch_role_seeds(base_seed: int, role: str, n: int, batch_index: int) -> list[int]:
    """`n` member seeds of `role` for the batch at `batch_index` (0 = the first batch after the original): the
    child SeedSequence(base_seed, spawn_key=(ROLE_INDEX[role], 1 + batch_index)), its own stream per batch and
    disjoint from every `role_seeds` stream (those are the children of spawn_key (ROLE_INDEX[role],))."""
    if role not in ROLE_INDEX:
        raise ValueError(f"role {role!r} is not known; allowed: {list(ROLES)}")
    if batch_index < 0:
        raise ValueError(f"batch_index must be >= 0, got {batch_index}")
    return _stream_words(np.random.SeedSequence(int(base_seed), spawn_key=(ROLE_INDEX[role], 1 + int(batch_index))), n)


def reference_seeds(base_seed: int, batch_index: int, n_shadows: int, n_oracles: int) -> tuple[list[int], list[int]]:
    """(shadow seeds, oracle seeds) of the batch at `batch_index`.

    Oracles of batch t are retrains on R_t, which is D_{t+1}, the rows batch t+1's shadow originals train on:
    batch t+1's shadows ARE batch t's oracles (same seeds, same rows, same recipe: the ensemble cache finds
    them) and are not trained again. Each batch draws its oracles from its own stream, so within a batch no seed
    is shared between the two roles, nor with the original (`base_seed`). The first batch's shadows come from
    the `shadows` role."""
    oracles = batch_role_seeds(base_seed, "oracles", n_oracles, batch_index)
    shadows = (batch_role_seeds(base_seed, "oracles", n_shadows, batch_index - 1) if batch_index > 0
               else role_seeds(base_seed, "shadows", n_shadows))
    return shadows, oracles
