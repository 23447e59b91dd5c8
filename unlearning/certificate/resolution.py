"""What a permutation test of a given size can resolve: its smallest p-value, whether it can reject at a level,
and the relabelings a level needs (docs/design.md §4.2). One rule, read by the params' validation (alpha
against n_permutations), the batch's warning (alpha at this batch's shadows and oracles) and the sequential
certificate's looks (unlearning/sequential.py permutations_for).

Standard library only: unlearning/config.py imports it.
"""

from __future__ import annotations

import math


def smallest_klom_pvalue(n_unlearned: int | None, n_oracles: int | None, n_permutations: int) -> float:
    """About the smallest p-value the KLoM permutation test can give (metrics/permutation.py): at least
    1 / (1 + n_permutations), and, with random relabelings drawn from only C(N_u + N_o, N_u) distinct ones, at
    least the chance that a draw repeats the observed labeling, times the draws: 1 + n_permutations / C over
    1 + n_permutations. Above the gate's alpha, the test cannot fail whatever the candidate did: 4 shadows and 4
    oracles have C = 70 relabelings, so about 0.019 with 200 permutations, above alpha = 0.01. `n_unlearned` or
    `n_oracles` None: sizes not known yet (the params alone), as if the relabelings were unlimited."""
    if n_unlearned is None or n_oracles is None:
        return 1 / (1 + n_permutations)
    distinct = math.comb(n_unlearned + n_oracles, n_unlearned)
    return (1 + n_permutations / distinct) / (1 + n_permutations)


def can_reject(alpha: float, n_permutations: int, n_unlearned: int | None = None,
               n_oracles: int | None = None) -> bool:
    """Whether the test can give a p-value below `alpha` at all (else it certifies nothing)."""
    return smallest_klom_pvalue(n_unlearned, n_oracles, n_permutations) <= alpha


def permutations_for(alpha_k: float, n_permutations: int) -> int:
    """Relabelings for a look at level alpha_k: at least the configured number, and the fewest at which the
    smallest p-value 1 / (1 + P) is at most alpha_k / 2 (else the look could never reject)."""
    return max(int(n_permutations), math.ceil(2 / alpha_k) - 1)


def permutations_needed(alpha: float) -> int:
    """The fewest relabelings at which `can_reject(alpha, P)` holds (the fix a refusal names)."""
    return max(math.ceil(1 / alpha) - 1, 1)
