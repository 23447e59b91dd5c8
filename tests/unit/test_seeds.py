"""Independent seed streams per role (unlearning/seeds.py, docs/design.md §4.2)."""

import itertools

import numpy as np
import pytest

from unlearning.seeds import ROLES, original_seed, role_seeds


@pytest.mark.parametrize("base", [0, 1, 12345])
def test_roles_disjoint_and_deterministic(base):
    n = 1000
    sets = {r: role_seeds(base, r, n) for r in ROLES}
    for r, s in sets.items():
        assert len(set(s)) == n, r  # no repeat inside a role
        assert s == role_seeds(base, r, n)  # deterministic
        assert role_seeds(base, r, 10) == s[:10]  # prefix-stable: N=10 members are the first of N=1000
        assert original_seed(base) not in s
    for a, b in itertools.combinations(ROLES, 2):
        assert not set(sets[a]) & set(sets[b]), (a, b)


def test_bases_differ_and_valid_torch_seeds():
    assert not set(role_seeds(0, "oracles", 100)) & set(role_seeds(1, "oracles", 100))
    s = np.array(role_seeds(0, "shadows", 1000), dtype=object)
    assert all(2**32 <= v < 2**63 for v in s)


def test_unknown_role():
    with pytest.raises(ValueError, match="role 'x' is not known"):
        role_seeds(0, "x", 3)


def test_batch_t_oracles_are_batch_t_plus_1_shadows_and_no_seed_is_shared_within_a_batch():
    from unlearning.seeds import batch_role_seeds, reference_seeds

    base, n = 0, 200
    previous_oracles = None
    for t in range(6):
        shadows, oracles = reference_seeds(base, t, n, n)
        assert not set(shadows) & set(oracles)  # within the batch: two roles, two streams
        assert original_seed(base) not in set(shadows) | set(oracles)
        assert len(set(oracles)) == n
        if previous_oracles is not None:
            assert shadows == previous_oracles  # reused from the cache, not trained again
        previous_oracles = oracles
    # per-batch streams are disjoint from the flat role streams and from each other
    flat = {s for r in ROLES for s in role_seeds(base, r, n)}
    per_batch = [set(batch_role_seeds(base, "oracles", n, t)) for t in range(6)]
    assert not flat & set().union(*per_batch)
    assert all(not a & b for i, a in enumerate(per_batch) for b in per_batch[i + 1:])
    assert batch_role_seeds(base, "oracles", 10, 3) == batch_role_seeds(base, "oracles", n, 3)[:10]
