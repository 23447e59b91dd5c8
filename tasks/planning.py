"""The measurements the planner needs (unlearning/plan.py), taken on this model on this device, and the plan
itself for a batch: a short timing probe (one epoch of one member, and of a small vectorized chunk, on a sample
of the retain rows) and the memory footprint (parameters, activations per row, data, the process)."""

from __future__ import annotations

import dataclasses
import os
import resource
import time

import numpy as np
import torch

from tasks.training import build, recipe
from unlearning.batch import BatchRows, sampled_for_certificate
from unlearning.config import Params
from unlearning.models import fit, predict_logits
from unlearning.plan import Footprint, Plan, Timing, plan_batch
from unlearning.seeds import role_seeds

PROBE_MIN_ROWS = 512  # rows of the timing probe: at least this, at least 4 minibatches, at most the retain rows
PROBE_MEMBERS = 8  # members of the probe's vectorized chunk (at most validation.chunk_size)


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; the peak so far elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def activation_floats_per_row(module: torch.nn.Module, in_shape: list[int]) -> int:
    """Floats that the outputs of every leaf module hold for one input row (forward hooks on a plain member),
    plus the input itself: what one row's activations cost in memory, in float32 elements."""
    total = [int(np.prod(in_shape))]
    hooks = [m.register_forward_hook(lambda _m, _i, out: total.append(out.numel() if torch.is_tensor(out) else 0))
             for m in module.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            module.eval()
            module(torch.zeros(1, *in_shape))
    finally:
        for h in hooks:
            h.remove()
    return int(sum(total))


def _probe_rows(rows: BatchRows, batch_size: int, seed: int) -> np.ndarray:
    n = min(len(rows.retain), max(PROBE_MIN_ROWS, 4 * batch_size))
    return np.sort(np.random.default_rng(seed).choice(rows.retain, n, replace=False))


def probe(params: Params, state, rows: BatchRows, device: str) -> tuple[Timing, Footprint]:
    """Time one epoch of one member and of a chunk of PROBE_MEMBERS members on a sample of the retain rows,
    scaled to the recipe's epochs over every retain row; measure the memory footprint on member 0."""
    prepared = state.prepared
    sample = _probe_rows(rows, params.train.batch_size, params.base.seed)
    X = torch.as_tensor(prepared.X[sample], dtype=torch.float32).to(device)
    y = torch.as_tensor(prepared.label[sample], dtype=torch.long).to(device)
    one_epoch = dataclasses.replace(recipe(params), epochs=1)
    k = max(1, min(PROBE_MEMBERS, params.validation.chunk_size))
    seeds = role_seeds(params.base.seed, "bench", k)
    single = build(params, prepared, seeds[:1]).to(device)
    fit(single, X[: params.train.batch_size], y[: params.train.batch_size], one_epoch)  # warm-up: first-call costs
    t = time.perf_counter()
    fit(single, X, y, one_epoch)
    per_row_single = (time.perf_counter() - t) / len(sample)
    chunk = build(params, prepared, seeds).to(device)
    t = time.perf_counter()
    fit(chunk, X, y, one_epoch)
    per_row_member = (time.perf_counter() - t) / len(sample) / k
    t = time.perf_counter()
    predict_logits(chunk, X)
    eval_per_row_member = (time.perf_counter() - t) / len(sample) / k
    # the sequential certificate evaluates a stated sample of the retain and validation rows (the exact path's
    # two models every row: far less than the references' evaluation)
    eval_rows = len(sampled_for_certificate(rows, params.validation.certificate_rows, params.base.seed).eval_rows()[0])
    row_epochs = len(rows.retain) * params.train.epochs
    timing = Timing(retrain_seconds=per_row_single * row_epochs, member_seconds=per_row_member * row_epochs,
                    eval_seconds_per_member=eval_per_row_member * eval_rows,
                    source=f"probe: 1 epoch on {len(sample)} rows, 1 and {k} members, {device}")
    member = chunk.module_of(0)
    footprint = Footprint(n_params=sum(p.numel() for p in member.parameters()),
                          activation_floats_per_row=activation_floats_per_row(member, chunk.in_shape),
                          data_bytes=int(np.asarray(prepared.X).nbytes), baseline_bytes=rss_bytes(),
                          batch_size=params.train.batch_size, n_eval_rows=eval_rows, n_classes=prepared.n_classes)
    return timing, footprint


THREAD_WORKERS = 2  # the threads runner's pool (flows/common.py task_runner_for builds it with this many)


def workers_of(params: Params) -> int:
    """Workers the reference chunks run on: the thread pool's, or the Dask cluster's."""
    v = params.validation
    return v.dask_workers if v.task_runner == "dask" else THREAD_WORKERS


def batch_plan(params: Params, selection: dict, objective: str, timing: Timing | None, footprint: Footprint | None,
               diagnostics_seconds: float = 0.0, sisa_cost: float | None = None) -> Plan:
    """The plan for a batch's selection (unlearning/selection.py candidate_methods' dict); `sisa_cost`: the share
    of a retrain `sisa` costs for this batch (tasks/sharding.py sisa_share; None: not sharded)."""
    return plan_batch(selection["candidates"], objective, params.validation, params.gate,
                      weigh_cost=params.deletion.weigh_cost, explicit=params.deletion.method != "auto",
                      timing=timing, footprint=footprint, diagnostics_seconds=diagnostics_seconds,
                      workers=workers_of(params), sisa_cost=sisa_cost)
