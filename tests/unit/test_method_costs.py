"""The qualification's method timing measures like with like (docs/design.md §4.6): the method at the probe's one
intra-op thread, warm (its first, cold run left out), against the probe's retrain."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import torch

from unlearning.batch.rows import BatchRows
from unlearning.config import parse_params
from unlearning.planning.plan import Timing


def test_method_costs_time_the_method_warm_at_the_probes_thread(monkeypatch):
    import tasks.planning as planning
    from tasks.batch_settings import BatchSettings
    from tasks.qualification import method_costs

    calls = []

    def fake_time_method(inputs, state, rows, positions, method, device):
        calls.append(torch.get_num_threads())
        return (10.0 if len(calls) == 1 else 1.0), 1000  # a cold first run, then warm ones

    monkeypatch.setattr(planning, "time_method", fake_time_method)
    monkeypatch.setattr(planning, "probe", lambda *a, **k: (Timing(retrain_seconds=2.0, member_seconds=2.0,
                                                                  eval_seconds_per_member=0.0), None))
    monkeypatch.setattr(planning, "method_work", lambda inputs, m, sizes: 1000)
    torch.set_num_threads(2)
    params = parse_params({})
    rows = BatchRows(before=np.arange(100), forget=np.arange(5), retain=np.arange(5, 100),
                     adjacent_mask=np.zeros(95, bool), validation=np.arange(0))
    state = NS(prepared=NS(n_classes=10))
    costs = method_costs(BatchSettings.of(params).probe_inputs, state, rows, "cpu", ["finetune"])
    assert calls == [1, 1]  # both runs at the probe's one thread (torch's default here is 2)
    assert costs == {"finetune": 0.5}  # the warm 1.0 s against the 2.0 s retrain, not the cold 10 s
    assert torch.get_num_threads() == 2  # restored
