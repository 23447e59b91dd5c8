"""The measurements the planner needs (unlearning/planning/plan.py), taken on this model on this device, and the plan
itself for a batch: a short timing probe and the memory footprint (parameters, activations per row, data, the
process; on CUDA the peak device memory of the probe's chunks).

The probe (docs/design.md §4.6, docs/gpu.md; unlearning/planning/costs.py) times training steps of chunks of 1, an
intermediate number and the planned number of members on a sample of the retain rows: each size's first step
is a warm-up, the median of the others counts, and their spread is reported. It times each approximate
candidate method once, on the original and a sample of the batch's rows, and carries the seconds to the batch's
size by the method's own budget of gradient evaluations (its stop rule). The result is cached per model version
and device (cache/costs/), so `unlearn plan` and the batch that follows it plan with the same estimate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from tasks.training import build, model_spec
from unlearning.batch.rows import BatchRows, sampled_for_certificate, unlearn_context
from unlearning.config import Gate, ProjectPaths, Train, Validation, method_traits
from unlearning.planning.costs import (PROBE_MIN_STEPS, CostCurve, DeviceMemory, ProbeConditions, method_retrains, probe_sizes,
                              steady_curve)
from unlearning.io import atomic_write_json
from unlearning.models import predict_logits
from unlearning.models.training import recipe_from
from unlearning.batch.records import Selection
from unlearning.planning.plan import CPU_CHUNK, Footprint, Plan, Timing, plan_batch
from unlearning.planning.probe import (ConditionsMeter, StepTimer, activation_floats_per_row, curve_within_memory,  # noqa: F401
                               load_per_cpu)
from unlearning.seeds import method_seed, role_seeds

if TYPE_CHECKING:
    from tasks.references import ReferenceTraining

PROBE_MIN_ROWS = 512  # rows of the timing probe: at least this, PROBE_MIN_STEPS minibatches, at most the retain rows
PROBE_MEMBERS = 8  # on a CPU, the largest chunk the probe times (the curve is affine there; larger ones extrapolate)
PROBE_FORGET_ROWS = 256  # forget rows at most in a method's timed run
PROBE_VERSION = 4  # bump when what the probe measures changes: older cache entries are ignored
MB = 1024 * 1024


@dataclass(frozen=True)
class ProbeInputs:
    """What the timing probe reads of the params: the recipe and the model (train), the references it sizes for
    (validation: n_oracles, n_shadows, chunk_size, gpu_memory_mb, certificate_rows, audit_retrain, probe), each
    method's arguments (deletion.method_args), base.seed, and the project's folders (the cache, a custom
    model's factory)."""

    train: Train
    validation: Validation
    method_args: dict
    seed: int
    paths: ProjectPaths

    def member(self, prepared, seeds: list[int]):
        """A fresh ensemble of the model for `seeds` (the probe's timed members)."""
        return build(self.train.model, self.paths.root, prepared, seeds)


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; the peak so far elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _probe_positions(n_retain: int, batch_size: int, seed: int) -> np.ndarray:
    """Positions in the retain rows of the probe's sample (sorted)."""
    n = min(n_retain, max(PROBE_MIN_ROWS, PROBE_MIN_STEPS * batch_size))
    return np.sort(np.random.default_rng(seed).choice(n_retain, n, replace=False))


def device_memory(v: Validation, device: str, member_bytes: int | None = None,
                  mem_get_info: Callable[[], tuple[int, int]] | None = None) -> DeviceMemory | None:
    """The CUDA device's budget for the reference chunks: validation.gpu_memory_mb, else 90% of the free memory
    `mem_get_info()` (torch.cuda.mem_get_info: (free, total) bytes) reports now; None on a CPU."""
    if torch.device(device).type != "cuda":
        return None
    if v.gpu_memory_mb is not None:
        return DeviceMemory("cuda", v.gpu_memory_mb * MB, "validation.gpu_memory_mb", member_bytes)
    free, _ = (mem_get_info or (lambda: torch.cuda.mem_get_info(torch.device(device))))()
    return DeviceMemory("cuda", int(0.9 * free), "validation.gpu_memory_mb (null: 90% of the free device memory)",
                        member_bytes)


def planned_probe_chunk(v: Validation, device: str, footprint: Footprint, mem: DeviceMemory | None) -> int:
    """The largest chunk the probe times: on a CPU PROBE_MEMBERS (the curve is affine); on CUDA the chunk the
    device memory holds for one role's references (the curve bends there: the probe must see it)."""
    n_role = max(v.n_oracles, v.n_shadows)
    cap = v.chunk_size or (n_role if mem is not None else CPU_CHUNK)
    if mem is None:
        return max(1, min(PROBE_MEMBERS, cap, n_role))
    fits = (mem.budget_bytes - footprint.data_bytes) // max(footprint.member_training_bytes(), 1)
    return int(max(1, min(cap, n_role, fits)))


def cache_path(inputs: ProbeInputs, state, device: str, sample_rows: int) -> Path:
    """cache/costs/<key>.json: the probe's measurements of this model version, recipe and architecture on this
    device (what decides them; no row and no id)."""
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    key = json.dumps({"v": PROBE_VERSION, "spec": model_spec(inputs.train.model, state.prepared),
                      "recipe": dataclasses.asdict(recipe_from(inputs.train)), "device": name,
                      "torch": torch.__version__, "version": str(state.champion.get("model_version")),
                      "rows": sample_rows, "chunk": inputs.validation.chunk_size,
                      "gpu_mb": inputs.validation.gpu_memory_mb, "args": inputs.method_args},
                     sort_keys=True, default=str)
    return inputs.paths.path("cache_dir") / "costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def method_work(inputs: ProbeInputs, method: str, sizes) -> int:
    """The method's stop rule as a budget of gradient evaluations (unlearning/methods/args.py) at `sizes`."""
    from unlearning.methods.registry import parse_args

    return int(parse_args(method, inputs.method_args.get(method, {})).budget(sizes, inputs.train.epochs))


def rows_sizes(rows: BatchRows, n_classes: int):
    from unlearning.methods.args import DataSizes

    n_adj = int(np.count_nonzero(rows.adjacent_mask))
    return DataSizes(len(rows.forget), len(rows.retain), n_adj, len(rows.retain) - n_adj, n_classes)


def time_method(inputs: ProbeInputs, state, rows: BatchRows, positions: np.ndarray, method: str, device: str
                ) -> tuple[float, int]:
    """(seconds, work) of one run of `method` on the original, on at most PROBE_FORGET_ROWS forget rows and the
    probe's sample of the retain rows; work: its budget of gradient evaluations there (`method_work`)."""
    from unlearning.methods import run_method

    forget = rows.forget[:PROBE_FORGET_ROWS]
    sample = BatchRows(before=rows.before, forget=forget, retain=rows.retain[positions],
                       adjacent_mask=rows.adjacent_mask[positions], validation=rows.validation[:0])
    ctx = unlearn_context(state.model.to(device), state.prepared, sample, recipe_from(inputs.train),
                          method_seed(inputs.seed), progress=False)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    run_method(method, ctx, inputs.method_args.get(method, {}))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t, method_work(inputs, method, rows_sizes(sample, state.prepared.n_classes))


def timed_methods(methods) -> list[str]:
    """The candidates whose run the plan times: the approximate ones (an exact method's cost is a retrain)."""
    return [m for m in dict.fromkeys(methods) if not method_traits(m).exact]


def probe(inputs: ProbeInputs, state, rows: BatchRows, device: str, methods=(), clock=time.time,
          load=load_per_cpu) -> tuple[Timing, Footprint]:
    """The cost curve of training chunks (1, an intermediate size, the planned chunk; one member alone when no
    candidate of `methods` needs references), the evaluation's cost, each of `methods`' timed run (the
    approximate ones), and the memory footprint; read from the cache when this model version was probed on this
    device before (`unlearn plan`, then its batch), unless that probe is stale (validation.probe: older than
    max_age_hours, or taken under a load per core max_load_ratio off today's). The curve is timed in rounds
    until they agree within validation.probe.max_spread (at most max_rounds), with the batch's training threads,
    and what it ran under is kept with it (ProbeConditions: the plan's range). `clock`/`load`: the wall clock and
    the load per core (the tests pass fakes)."""
    prepared, v, train, seed = state.prepared, inputs.validation, inputs.train, inputs.seed
    cfg = v.probe
    positions = _probe_positions(len(rows.retain), train.batch_size, seed)
    sample = rows.retain[positions]
    eval_rows = len(sampled_for_certificate(rows, v.certificate_rows, seed).eval_rows()[0])
    member = inputs.member(prepared, role_seeds(seed, "bench", 1)).module_of(0)
    footprint = Footprint(n_params=sum(p.numel() for p in member.parameters()),
                          activation_floats_per_row=activation_floats_per_row(member, list(prepared.in_shape)),
                          data_bytes=int(np.asarray(prepared.X).nbytes), baseline_bytes=rss_bytes(),
                          batch_size=train.batch_size, n_eval_rows=eval_rows, n_classes=prepared.n_classes)
    path = cache_path(inputs, state, device, len(sample))
    cached = _read_cache(path)
    stale = stale_probe(cached, clock(), load(), cfg)
    if stale:
        cached = {}
    wanted = timed_methods(methods)
    # only a plan with references needs the curve past one member (an exact retrain alone: its own cost)
    needs_curve = bool(wanted) or v.audit_retrain
    planned = planned_probe_chunk(v, device, footprint, device_memory(v, device)) if needs_curve else 1
    sizes = probe_sizes(planned)
    measure = not set(sizes) <= set(cached.get("curve", {}).get("sizes", []))
    fresh = measure or any(m not in cached.get("methods", {}) for m in wanted)
    if measure:
        X = torch.as_tensor(prepared.X[sample], dtype=torch.float32).to(device)
        y = torch.as_tensor(prepared.label[sample], dtype=torch.long).to(device)
        timer = StepTimer(lambda k: inputs.member(prepared, role_seeds(seed, "bench", k)), X, y,
                          recipe_from(train), device)
        with ConditionsMeter(now=clock, load=load) as meter:
            curve, rounds, low, high = steady_curve(lambda: curve_within_memory(timer, planned), cfg.max_spread,
                                                    cfg.max_rounds)
        what = "" if needs_curve else " (one member: no candidate needs references)"
        again = f"; probed again: {stale}" if stale else ""
        curve = dataclasses.replace(curve, source=f"probe on {device}: {len(sample)} rows, {timer.describe()}{what}"
                                                  f"{again}")
        t = time.perf_counter()
        predict_logits(timer.model, X)
        eval_per = (time.perf_counter() - t) / len(sample) / timer.model.n_models
        cached = {"curve": curve.to_dict(), "eval_seconds_per_row_member": eval_per,
                  "device_member_bytes": timer.member_bytes, "methods": cached.get("methods", {}),
                  "conditions": meter.conditions(rounds, low, high, cfg.max_spread).to_dict()}
    for m in wanted:
        if m not in cached["methods"]:
            seconds, work = time_method(inputs, state, rows, positions, m, device)
            cached["methods"][m] = {"seconds": seconds, "work": work}
    if fresh:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, cached)
    curve = CostCurve.from_dict(cached["curve"])
    if not fresh:
        curve = dataclasses.replace(curve, source=curve.source + "; cached for this model version")
    steps = train.epochs * math.ceil(len(rows.retain) / train.batch_size)
    retrain = curve.seconds(1) * steps
    full = rows_sizes(rows, prepared.n_classes)
    conditions = ProbeConditions.from_dict(cached["conditions"]) if cached.get("conditions") else None
    timing = Timing(retrain_seconds=retrain, member_seconds=curve.seconds(1) * steps,
                    eval_seconds_per_member=cached["eval_seconds_per_row_member"] * eval_rows,
                    source=curve.source, curve=curve, steps=steps, conditions=conditions,
                    method_retrains={m: method_retrains(cached["methods"][m]["seconds"], cached["methods"][m]["work"],
                                                        method_work(inputs, m, full), retrain) for m in wanted})
    footprint = dataclasses.replace(footprint, device_member_bytes=cached.get("device_member_bytes"))
    return timing, footprint


def stale_probe(cached: dict, now: float, load_now: float, cfg) -> str | None:
    """Why a cached probe must be taken again (validation.probe `cfg`), or None (nothing cached: nothing stale).
    A cache entry from before the probe recorded its conditions is stale."""
    if not cached:
        return None
    if not cached.get("conditions"):
        return "the cached probe does not say what it ran under"
    return ProbeConditions.from_dict(cached["conditions"]).stale(now, load_now, cfg.max_age_hours * 3600,
                                                                 cfg.max_load_ratio)


THREAD_WORKERS = 2  # the threads runner's pool (flows/common.py task_runner_for builds it with this many)


def workers_of(v: Validation, device: str = "cpu") -> int:
    """Workers the reference chunks run on (validation `v`: its task runner): the thread pool's, or the Dask
    cluster's; one on a local CUDA device (its chunks share the device: two side by side only split it)."""
    if v.task_runner == "dask":
        return v.dask_workers
    return 1 if torch.device(device).type == "cuda" else THREAD_WORKERS


def batch_plan(validation: Validation, gate: Gate, weigh_cost: bool, selection, objective: str,
               timing: Timing | None, footprint: Footprint | None, diagnostics_seconds: float = 0.0,
               sisa_cost: float | None = None, device: str = "cpu") -> Plan:
    """The plan for a batch's selection (unlearning/batch/records.py Selection: its candidates, and whether
    deletion.method named one, which the cost rule honours); `weigh_cost`: deletion.weigh_cost; `sisa_cost`: the
    share of a retrain `sisa` costs for this batch (tasks/sharding.py sisa_share; None: not sharded); `device`: where
    the references train (on CUDA the chunks are sized by its memory)."""
    member_bytes = footprint.device_member_bytes if footprint is not None else None
    selection = Selection.of(selection)
    return plan_batch(selection.candidates, objective, validation, gate,
                      weigh_cost=weigh_cost, explicit=selection.explicit,
                      timing=timing, footprint=footprint, diagnostics_seconds=diagnostics_seconds,
                      workers=workers_of(validation, device), sisa_cost=sisa_cost,
                      device_memory=device_memory(validation, device, member_bytes))


def reference_chunk(training: ReferenceTraining, prepared, device: str) -> int:
    """The chunk cap outside a batch's plan (the qualify stage): validation.chunk_size, else CPU_CHUNK on a CPU
    and what the device memory holds on CUDA (from the analytic footprint of one member)."""
    v = training.validation
    n_role = max(v.n_oracles, v.n_shadows)
    if v.chunk_size is not None:
        return max(1, min(v.chunk_size, n_role))
    mem = device_memory(v, device)
    if mem is None:
        return max(1, min(CPU_CHUNK, n_role))
    member = build(training.model, training.paths.root, prepared, role_seeds(training.seed, "bench", 1)).module_of(0)
    fp = Footprint(n_params=sum(p.numel() for p in member.parameters()),
                   activation_floats_per_row=activation_floats_per_row(member, prepared.in_shape),
                   data_bytes=int(np.asarray(prepared.X).nbytes), baseline_bytes=0,
                   batch_size=training.recipe.batch_size, n_eval_rows=0, n_classes=prepared.n_classes)
    return planned_probe_chunk(v, device, fp, mem)


# --- the batch's phases, predicted (unlearning/planning/overhead.py: the same phases its plan-vs-actual line measures) ------
def phase_history(paths: ProjectPaths):
    """The project's history of measured batch phases: cache/costs/phases.jsonl (seconds only)."""
    from unlearning.planning.overhead import History

    return History(paths.path("cache_dir") / "costs" / "phases.jsonl")


def model_phases(plan: Plan) -> dict[str, float]:
    """The plan's seconds of the phases that grow with the model (unlearning/planning/overhead.py MODEL_PHASES): its
    diagnostics, its references, and its first candidate's run and certificate."""
    ps = plan.predicted_seconds
    return {"diagnostics": ps.get("diagnostics", 0.0), "references": ps.get("references", 0.0),
            "candidates": ps.get("unlearn", 0.0) + ps.get("certify", 0.0)}


def predicted_phases(paths: ProjectPaths, plan: Plan, timing: Timing | None) -> tuple[dict, dict, str]:
    """(seconds per phase, (low, high) per phase, one line) of a batch following `plan`: the model phases from the
    plan's probe (diagnostics, references, the candidates' training and certificate), the others from this
    project's past batches; the range from the probe's rounds and the history's spread."""
    from unlearning.planning.overhead import predict, predicted_line

    fixed, ranges, source = phase_history(paths).fixed()
    point, spans = predict(model_phases(plan), fixed, ranges, timing.range if timing is not None else (1.0, 1.0))
    return point, spans, predicted_line(point, spans, source)
