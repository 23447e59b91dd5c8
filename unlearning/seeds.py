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

ROLES: tuple[str, ...] = ("original", "shadows", "oracles", "oracles_b", "method", "bench")
ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
_LOW = 1 << 32  # role seeds are >= 2^32: never equal to a small base seed (the original's)


def role_seeds(base_seed: int, role: str, n: int) -> list[int]:
    """`n` member seeds of `role`, deterministic in (base_seed, role), disjoint across roles."""
    if role not in ROLE_INDEX:
        raise ValueError(f"role {role!r} is not known; allowed: {list(ROLES)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    ss = np.random.SeedSequence(int(base_seed), spawn_key=(ROLE_INDEX[role],))
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
