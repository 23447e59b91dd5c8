"""unlearning/stats.py: the statistics the gate, the qualification and `unlearn status` share, without torch.
Importing the gate or the qualification loads no torch (checked in a fresh interpreter), and the one
Clopper-Pearson serves the two-sided interval and the one-sided bounds alike."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import ROOT
from unlearning.stats import INTERVALS, SPLITS, clopper_pearson, normal_cdf, normal_quantile, wilson

PROBE = """
import json, sys
sys.path.insert(0, {root!r})
import {module}
print("LOADED " + json.dumps(sorted(m for m in ("torch", "prefect", "mlflow", "great_expectations") if m in sys.modules)))
"""


@pytest.mark.parametrize("module", ["unlearning.stats", "unlearning.certificate.gate", "unlearning.certificate.qualification",
                                    "unlearning.sequential"])
def test_the_gate_and_the_qualification_import_no_torch(module):
    res = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), module=module)], capture_output=True,
                         text=True, timeout=120)
    line = [x for x in res.stdout.splitlines() if x.startswith("LOADED ")]
    assert line, res.stdout[-2000:] + res.stderr[-2000:]
    assert json.loads(line[-1][len("LOADED "):]) == []


def _binom_sf(k, n, p):
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


@pytest.mark.parametrize("n", [1, 5, 23])
def test_one_clopper_pearson_for_both_uses_float64_reference(n):
    """Two-sided at 0.9: each tail 0.05; one-sided at 0.9: each bound's tail 0.1 (brute-force binomial sums).
    An array of counts answers element by element."""
    for two_sided, tail in ((True, 0.05), (False, 0.1)):
        lower, upper = clopper_pearson(np.arange(n + 1), n, 0.9, two_sided=two_sided)
        for k in range(n + 1):
            assert (lower[k], upper[k]) == clopper_pearson(k, n, 0.9, two_sided=two_sided)
            if k > 0:
                assert _binom_sf(k, n, lower[k]) == pytest.approx(tail, abs=1e-10)
            if k < n:
                assert 1 - _binom_sf(k + 1, n, upper[k]) == pytest.approx(tail, abs=1e-10)
        assert lower[0] == 0.0 and upper[n] == 1.0


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="k = 4 must lie in"):
        clopper_pearson(4, 3, 0.9)
    with pytest.raises(ValueError, match="confidence = 1.5"):
        clopper_pearson(1, 3, 1.5)
    assert clopper_pearson(0, 0, 0.9) == (0.0, 1.0) and wilson(0, 0, 0.9) == (0.0, 1.0)


def test_normal_cdf_and_quantile_invert_each_other():
    for p in (0.001, 0.025, 0.5, 0.9, 0.99975):
        assert normal_cdf(normal_quantile(p)) == pytest.approx(p, rel=1e-9)
    assert normal_cdf(1.959963984540054) == pytest.approx(0.975, abs=1e-12)


def test_the_intervals_by_name_and_the_splits():
    assert set(INTERVALS) == {"clopper_pearson", "wilson"} and INTERVALS["wilson"] is wilson
    assert SPLITS == ("forget", "adjacent", "remote", "validation")
