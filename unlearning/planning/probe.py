"""The planner's timing probe on a real model (docs/design.md §4.6, docs/gpu.md): each optimizer step of a fresh chunk
of k members, timed on a sample of rows (synchronized on CUDA, where it also records the chunk's peak device
memory per member). unlearning/planning/costs.py measure_curve turns these into the cost curve; tasks/planning.py and
bench/gpu_batch.py both time with it, so the batch and the bench price alike."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable

import numpy as np
import torch

from unlearning.planning.costs import PROBE_MIN_STEPS, ProbeConditions
from unlearning.models import Ensemble, TrainRecipe, fit
from unlearning.models.training import TRAIN_THREADS

PROBE_MIN_SECONDS = 0.1  # counted step time per size at least (more steps when they are fast)
PROBE_MAX_STEPS = 400  # steps per size at most


class ConditionsMeter:
    """`with ConditionsMeter() as m: ...` measures what the block ran under: the process's CPU seconds over its
    wall seconds (every thread of the process counts, as they share the batch's cores), and the load per core
    when it began. The clocks are arguments so the tests drive them (tests/unit/test_probe_conditions.py)."""

    def __init__(self, wall=time.perf_counter, cpu=time.process_time, load=None, now=time.time):
        self.wall, self.cpu, self.now = wall, cpu, now
        self.load = load if load is not None else load_per_cpu  # () -> the load average per core now
        self.cpu_share = self.load_per_cpu = 0.0

    def __enter__(self) -> "ConditionsMeter":
        self.load_per_cpu = float(self.load())
        self._w, self._c = self.wall(), self.cpu()
        return self

    def __exit__(self, *exc) -> bool:
        self.cpu_share = (self.cpu() - self._c) / max(self.wall() - self._w, 1e-9)
        return False

    def conditions(self, rounds: int, low: float, high: float, max_spread: float) -> ProbeConditions:
        return ProbeConditions(TRAIN_THREADS, round(self.cpu_share, 3), round(self.load_per_cpu, 2),
                               round(self.now(), 1), rounds, round(low, 4), round(high, 4), max_spread)


def load_per_cpu(load=os.getloadavg, cores=os.cpu_count) -> float:
    """The 1-minute load average per core now (0 where the platform has none)."""
    try:
        return float(load()[0]) / max(int(cores() or 1), 1)
    except OSError:
        return 0.0


class StepTimer:
    """`timer(k)`: the seconds of each optimizer step of `make(k)` (a fresh chunk of k members) trained on
    (X, y) with `recipe`, for enough epochs to take PROBE_MIN_STEPS steps and PROBE_MIN_SECONDS (the first
    is the warm-up);
    `member_bytes`: on CUDA, the largest chunk's peak device memory per member (the data was there before);
    `model`: the last chunk timed (the evaluation's timing reuses it)."""

    def __init__(self, make: Callable[[int], Ensemble], X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe,
                 device: str | torch.device, min_seconds: float = PROBE_MIN_SECONDS):
        self.make, self.X, self.y, self.device = make, X, y, torch.device(device)
        self.min_seconds = min_seconds
        self.steps_per_epoch = steps_per_epoch = math.ceil(len(X) / recipe.batch_size)
        self.recipe = dataclasses.replace(recipe, epochs=max(1, math.ceil(PROBE_MIN_STEPS / steps_per_epoch)))
        self.steps = self.recipe.epochs * steps_per_epoch  # at least: fast steps are timed longer
        self.cuda = self.device.type == "cuda"
        self.member_bytes: int | None = None
        self.model: Ensemble | None = None
        self.counted: list[int] = []  # steps counted per size timed (the warm-up left out)

    def describe(self) -> str:
        """How many steps the medians are of, for the curve's source."""
        lo, hi = min(self.counted, default=0), max(self.counted, default=0)
        return f"the median of {lo}{'' if lo == hi else f'-{hi}'} steps after a warm-up per size"

    def __call__(self, k: int) -> list[float]:
        model = self.make(k).to(self.device)
        times: list[float] = []
        before = 0
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        last = [time.perf_counter()]

        def on_step():
            if self.cuda:
                torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now

        fit(model, self.X, self.y, self.recipe, on_step=on_step, threads=TRAIN_THREADS)  # the batch's threads
        counted = sorted(times[1:])
        if counted and sum(counted) < self.min_seconds:
            # fast steps: a few of them are a few milliseconds, which one stall of another process on the
            # machine swings; time more (a second run, its first step a warm-up again: its setup is in it)
            more = min(PROBE_MAX_STEPS, math.ceil(self.min_seconds / max(counted[len(counted) // 2], 1e-9)))
            again = dataclasses.replace(self.recipe, epochs=max(1, math.ceil(more / self.steps_per_epoch)))
            first = sum(times)
            times.clear()
            last[0] = time.perf_counter()
            fit(model, self.X, self.y, again, on_step=on_step, threads=TRAIN_THREADS)
            times[0] += first  # one warm-up: the first run and the second's first step
        if self.cuda:
            peak = (torch.cuda.max_memory_allocated(self.device) - before) // k
            self.member_bytes = max(self.member_bytes or 0, int(peak))
        self.model = model
        self.counted.append(len(times) - 1)
        return times


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


def curve_within_memory(timer: StepTimer, planned: int, source: str = "probe"):
    """measure_curve over probe_sizes(planned), halving the planned chunk while the device runs out of memory on
    it (the analytic footprint that planned it undercounts some modules' activations under vmap)."""
    from unlearning.planning.costs import measure_curve, probe_sizes

    while True:
        try:
            return measure_curve(timer, probe_sizes(planned), source)
        except torch.cuda.OutOfMemoryError:
            if planned <= 1:
                raise
            torch.cuda.empty_cache()
            planned //= 2
            timer.counted.clear()
