"""Progress of sharded training (unlearning/sharding.py train_slices): one line per progress step, naming the shard
and the slice in training, never one bar per (shard, slice) that says neither."""

from __future__ import annotations

import re

import numpy as np
import torch

from tests.unit.test_sharding import RECIPE, SPEC, _plan, data
from unlearning.sharding import sisa_unlearn, train_from_scratch


def lines_of(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_training_the_shards_prints_a_few_lines_that_name_the_shard_and_slice(capsys):
    X, y = data(dtype=torch.float32)
    plan = _plan(len(X), shards=5, slices=4)
    stored = {}
    original, _ = train_from_scratch(SPEC, plan, X, y, RECIPE, progress="train 5 shards",
                                     checkpoint=lambda k, r, m: stored.__setitem__((k, r), m.select(0)))
    lines = lines_of(capsys)
    # the start, at most one a decile (and one every 10 s), the end: not 2 x 20 (a start and an end per pass)
    assert 2 <= len(lines) <= 12, lines
    assert all(ln.startswith("train 5 shards") for ln in lines)
    assert lines[-1].split(": ", 1)[1].startswith("20/20 shard-slices (100%)")
    named = [ln for ln in lines[1:]]
    assert named and all(re.search(r"\[shard [1-5]/5, slice [1-4]/4\]", ln) for ln in named), named
    # a deletion's retraining names the shards it retrains, and counts only their slices
    f = np.flatnonzero((plan.shard == 2) & (plan.slice == 2))[:1]
    sisa_unlearn(original, lambda k, r: stored[(k, r)], plan, f, X, y, RECIPE, progress="sisa")
    lines = lines_of(capsys)
    assert lines[-1].startswith("sisa [shard 3/5, slice 4/4]: 2/2 shard-slices (100%)"), lines


def test_no_progress_prints_nothing(capsys):
    X, y = data(dtype=torch.float32)
    train_from_scratch(SPEC, _plan(len(X), shards=2, slices=2), X, y, RECIPE)
    assert lines_of(capsys) == []
