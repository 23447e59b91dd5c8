"""Ensembles built and run side by side in threads (validation.task_runner: threads trains oracle chunks
concurrently) get the members the contract promises: member k is the module built after
torch.manual_seed(seed_k), whatever another thread does with the process-wide RNG meanwhile. Before, two
chunks seeding and initialising at once drew from each other's RNG state: members of one chunk came out equal
to another chunk's (the default run warned "5 of 32 equal member 0's"), and the oracles were not reproducible."""

from __future__ import annotations

import threading

import torch

from unlearning.models import build_model, flat_params

SPEC = {"arch": "mlp", "in_shape": [64], "n_classes": 10, "kwargs": {"hidden": [64, 64]}}
DROPOUT_NET = '''
from torch import nn


def build(in_shape, n_classes):
    return nn.Sequential(nn.Linear(in_shape[0], 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, n_classes))
'''


def side_by_side(work, n: int) -> list:
    """work(i) for i < n, each in its own thread, all released at once; the results in order."""
    barrier = threading.Barrier(n)
    out = [None] * n

    def run(i):
        barrier.wait()
        out[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def build_side_by_side(spec, chunks, **kwargs):
    return side_by_side(lambda i: build_model(spec, chunks[i], **kwargs), len(chunks))


def test_members_built_in_threads_equal_the_ones_built_alone():
    chunks = [list(range(100 * i, 100 * i + 16)) for i in range(4)]
    for _attempt in range(3):  # a race shows up most of the time on one try; three make it near certain
        together = build_side_by_side(SPEC, chunks)
        for seeds, model in zip(chunks, together):
            alone = build_model(SPEC, seeds)
            assert torch.equal(flat_params(model), flat_params(alone)), f"seeds {seeds[0]}..: members differ"


def test_stochastic_forwards_in_threads_draw_each_members_own_stream(tmp_path):
    (tmp_path / "threaded_dropout_net.py").write_text(DROPOUT_NET)
    spec = {"arch": "custom", "factory": "threaded_dropout_net:build", "in_shape": [8], "n_classes": 3}
    X = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))

    def outputs(models):
        def work(i):
            models[i].train()
            with torch.no_grad():
                return torch.stack([models[i](X) for _ in range(20)])

        return side_by_side(work, len(models))

    seeds = [[1, 2], [3, 4], [5, 6]]
    together = outputs([build_model(spec, s, search_paths=[tmp_path]) for s in seeds])
    alone = [outputs([build_model(spec, s, search_paths=[tmp_path])])[0] for s in seeds]
    for a, b in zip(together, alone):
        assert torch.equal(a, b)
