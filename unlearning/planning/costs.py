"""What training costs on this device: a curve of one training step's seconds against the number of members
trained together, measured by a short probe, and the chunk size it implies (docs/design.md §4.6, docs/gpu.md).

On a CPU a chunk of k members costs about k times one member (the curve is affine, a + b k, with a small a).
On a GPU k members in one vectorized pass cost about one member until the device fills, then grow: 80 CNN
members on one H200 cost 1.31x one retrain (docs/gpu.md). A planner that times one chunk and scales it
linearly overprices references there about 8x, so the probe times chunks at a few sizes (1, an intermediate
size, the planned chunk), each the median of its steps after a warm-up step, and the planner reads the curve
between them (piecewise linear; past the largest size, the last segment's slope).

Everything here is pure: `measure_curve` takes the step timer as a function, so the tests drive it with
synthetic curves (linear, flat, stepped).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

PROBE_MIN_STEPS = 5  # timed steps per size: the first is the warm-up, the median of the others counts


def sig(x: float, digits: int = 2) -> str:
    """`x` with `digits` significant figures, never rounded to 0 (0.0042 -> "0.0042", 132.5 -> "130",
    0 -> "0"): small costs must not print as "0.0 retrains"."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{float(f'{x:.{digits}g}'):g}" if abs(x) < 10 ** digits else f"{round(x):d}"


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one training step (one minibatch, forward, backward, optimizer) of a chunk of k members.

    `sizes` increasing; `step_seconds[i]` the median step of a chunk of sizes[i] members; `spread[i]` the
    (max - min) / median of those steps (the warm-up step left out); `source` where the curve came from."""

    sizes: tuple[int, ...]
    step_seconds: tuple[float, ...]
    spread: tuple[float, ...] = ()
    source: str = "probe"

    def __post_init__(self):
        if not self.sizes or len(self.sizes) != len(self.step_seconds):
            raise ValueError(f"a cost curve needs one time per size, got sizes {self.sizes} and times "
                             f"{self.step_seconds}")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])) or self.sizes[0] < 1:
            raise ValueError(f"cost curve sizes must increase from 1 or more, got {self.sizes}")

    def seconds(self, k: int) -> float:
        """One step of a chunk of `k` members: piecewise linear between the measured sizes, flat below the
        smallest, and past the largest the last segment's slope (never negative: more members never cost less)."""
        s, t = self.sizes, self.step_seconds
        if k <= s[0] or len(s) == 1:
            return t[0] if k <= s[0] else t[0] * k / s[0]  # one size: linear from the origin
        for (k0, t0), (k1, t1) in zip(zip(s, t), zip(s[1:], t[1:])):
            if k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        slope = max(0.0, (t[-1] - t[-2]) / (s[-1] - s[-2]))
        return t[-1] + slope * (k - s[-1])

    def affine(self) -> tuple[float, float]:
        """The least-squares a + b k through the measured points (what the curve looks like in two numbers:
        on a CPU a ~ 0, on a GPU b ~ 0 until the device fills)."""
        n = len(self.sizes)
        if n == 1:
            return 0.0, self.step_seconds[0] / self.sizes[0]
        mk, mt = sum(self.sizes) / n, sum(self.step_seconds) / n
        var = sum((k - mk) ** 2 for k in self.sizes)
        b = sum((k - mk) * (t - mt) for k, t in zip(self.sizes, self.step_seconds)) / var
        return mt - b * mk, b

    def lines(self) -> list[str]:
        """The curve in words (`unlearn plan`, the batch's plan artifact)."""
        a, b = self.affine()
        pts = ", ".join(f"{k} member{'s' if k > 1 else ''} {sig(t * 1e3, 3)} ms"
                        + (f" (spread {sig(100 * sp)}%)" if i < len(self.spread) else "")
                        for i, (k, t, sp) in enumerate(zip(self.sizes, self.step_seconds,
                                                           self.spread or (0.0,) * len(self.sizes))))
        return [f"cost curve, one training step of a chunk: {pts}; fit {sig(a * 1e3, 3)} + {sig(b * 1e3, 3)} k ms "
                f"({self.source})"]

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "step_seconds": list(self.step_seconds), "spread": list(self.spread),
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        return cls(tuple(int(k) for k in d["sizes"]), tuple(float(t) for t in d["step_seconds"]),
                   tuple(float(s) for s in d.get("spread", ())), str(d.get("source", "probe")))


def probe_sizes(planned: int) -> list[int]:
    """The chunk sizes a probe times: 1, an intermediate size (the geometric mean), and the planned chunk."""
    planned = max(1, int(planned))
    mid = int(round(math.sqrt(planned)))
    return sorted({1, mid, planned})


def steady(step_times: Sequence[float]) -> tuple[float, float]:
    """(median, spread) of a probe's step times with the first (warm-up: allocation, kernel selection, lazy
    initialisation) left out; spread = the interquartile range / median of the counted steps ((max - min) /
    median below 4 steps): one step stalled by another process on the machine does not swing it."""
    counted = list(step_times[1:]) if len(step_times) > 1 else list(step_times)
    if not counted:
        raise ValueError("a probe timed no training step")
    med = statistics.median(counted)
    if len(counted) >= 4:
        q1, _, q3 = statistics.quantiles(counted, n=4)
        width = q3 - q1
    else:
        width = max(counted) - min(counted)
    return med, width / med if med > 0 else 0.0


@dataclass(frozen=True)
class ProbeConditions:
    """What a probe ran under and how far its rounds agreed (docs/design.md §4.6): the batch prices its training
    with the probe's seconds, so they must be taken as the batch will run, and their uncertainty said.

    `threads`: torch's intra-op threads during the timed steps (the batch's training uses the same,
    unlearning/models/training.py TRAIN_THREADS); `cpu_share`: the process's CPU seconds over the probe's wall
    seconds (1.0 on an idle core with one thread, less while other processes share the cores); `load_per_cpu`:
    the 1-minute load average per core when it began; `probed_at`: when it ended (seconds since the epoch);
    `rounds`: how often the whole curve was timed; `low`/`high`: the fastest and slowest round against their
    median (the plan's range); `spread` = high - low; `max_spread`: the bound the rounds stopped at."""

    threads: int
    cpu_share: float
    load_per_cpu: float
    probed_at: float
    rounds: int = 1
    low: float = 1.0
    high: float = 1.0
    max_spread: float = 0.25

    @property
    def spread(self) -> float:
        return self.high - self.low

    def stale(self, now: float, load_per_cpu: float, max_age_s: float, max_load_ratio: float) -> str | None:
        """Why a cached probe no longer prices a batch that runs now, or None: older than `max_age_s`, or taken
        under a load whose contention (`contention`) differs from now's by more than `max_load_ratio` either way
        (a probe under load 10 on 2 cores is 5x slower than on an idle machine, and the reverse)."""
        age = now - self.probed_at
        if age > max_age_s:
            return f"probed {age / 3600:.1f} h ago (validation.probe.max_age_hours = {max_age_s / 3600:g})"
        then, nowc = contention(self.load_per_cpu), contention(load_per_cpu)
        ratio = max(then, nowc) / min(then, nowc)
        if ratio > max_load_ratio:
            return (f"probed at load {self.load_per_cpu:.1f} per core, now {load_per_cpu:.1f}: {ratio:.1f}x the "
                    f"contention (validation.probe.max_load_ratio = {max_load_ratio:g})")
        return None

    def line(self) -> str:
        met = "within" if self.spread <= self.max_spread else "ABOVE"
        return (f"probe conditions: {self.rounds} round(s), spread {self.spread:.0%} ({met} the bound "
                f"{self.max_spread:.0%}: fastest {self.low:.2f}x, slowest {self.high:.2f}x the median), CPU share "
                f"{self.cpu_share:.2f} on {self.threads} thread(s), load {self.load_per_cpu:.1f} per core")

    def to_dict(self) -> dict:
        return {"threads": self.threads, "cpu_share": self.cpu_share, "load_per_cpu": self.load_per_cpu,
                "probed_at": self.probed_at, "rounds": self.rounds, "low": self.low, "high": self.high,
                "max_spread": self.max_spread}

    @classmethod
    def from_dict(cls, d: dict) -> "ProbeConditions":
        return cls(int(d["threads"]), float(d["cpu_share"]), float(d["load_per_cpu"]), float(d["probed_at"]),
                   int(d.get("rounds", 1)), float(d.get("low", 1.0)), float(d.get("high", 1.0)),
                   float(d.get("max_spread", 0.25)))


def contention(load_per_cpu: float) -> float:
    """How much slower a CPU-bound thread runs at this load per core than alone: 1 while a core is free."""
    return max(1.0, float(load_per_cpu))


def round_factors(curves: Sequence[CostCurve]) -> tuple[CostCurve, list[float]]:
    """(the per-size median curve of `curves`, each round's speed against it): a round's factor is the mean over
    the sizes of its step time over the median's (1.2: that round ran 20 % slower)."""
    sizes = curves[0].sizes
    med = tuple(statistics.median(c.step_seconds[i] for c in curves) for i in range(len(sizes)))
    factors = [statistics.fmean(c.step_seconds[i] / med[i] for i in range(len(sizes)) if med[i] > 0) if any(med)
               else 1.0 for c in curves]
    spread = tuple(statistics.median(c.spread[i] for c in curves) if all(len(c.spread) > i for c in curves) else 0.0
                   for i in range(len(sizes)))
    return CostCurve(sizes, med, spread, curves[0].source), factors


def steady_curve(measure_round: Callable[[], CostCurve], max_spread: float, max_rounds: int, min_rounds: int = 2
                 ) -> tuple[CostCurve, int, float, float]:
    """Time the curve in rounds until the rounds agree within `max_spread` (slowest minus fastest round, over their
    median) after at least `min_rounds`, or `max_rounds` were timed (then the spread stands as measured and the
    plan says so). Returns (the median curve, rounds, fastest factor, slowest factor)."""
    curves: list[CostCurve] = []
    while True:
        curves.append(measure_round())
        # a round whose sizes changed (a CUDA chunk halved to fit the device) starts the comparison again
        curves = [c for c in curves if c.sizes == curves[-1].sizes]
        curve, factors = round_factors(curves)
        done = len(curves) >= max(1, min_rounds) and max(factors) - min(factors) <= max_spread
        if done or len(curves) >= max_rounds:
            return curve, len(curves), min(factors), max(factors)


def measure_curve(time_steps: Callable[[int], Sequence[float]], sizes: Sequence[int], source: str = "probe"
                  ) -> CostCurve:
    """The curve from `time_steps(k)`: the seconds of each training step of a chunk of k members (the first a
    warm-up). tasks/planning.py passes a real timer; the tests pass synthetic curves."""
    sizes = sorted(set(int(k) for k in sizes))
    meds, spreads = zip(*(steady(time_steps(k)) for k in sizes))
    # more members never cost less: a smaller chunk timed slower than a larger one was slowed by something
    # else (another process: interference only adds time), so it takes the larger chunk's time
    meds = list(meds)
    for i in range(len(meds) - 2, -1, -1):
        meds[i] = min(meds[i], meds[i + 1])
    return CostCurve(tuple(sizes), tuple(meds), tuple(spreads), source)


def chunk_plan_seconds(curve: CostCurve, n: int, cap: int, workers: int, steps: int,
                       chunks_of: Callable[[int, int, int], list[int]]) -> float:
    """Seconds to train `n` members in chunks of at most `cap` (sized by `chunks_of(n, cap, workers)`), each
    chunk `steps` optimizer steps, the chunks shared by `workers` running side by side."""
    return sum(curve.seconds(k) for k in chunks_of(n, cap, workers)) * steps / max(workers, 1)


SMALLER_CHUNK_GAIN = 0.9  # a smaller chunk than memory allows only when it predicts at most 90% of the seconds


def choose_chunk(curve: CostCurve | None, n: int, cap: int, workers: int,
                 chunks_of: Callable[[int, int, int], list[int]]) -> int:
    """The chunk cap for `n` members: the largest memory allows (`cap`), unless the curve predicts a smaller
    one trains them in clearly fewer seconds (a stepped GPU curve past the point where the device fills)."""
    cap = max(1, int(cap))
    if curve is None or n <= 1:
        return cap
    largest = min(cap, n)
    seconds = {c: chunk_plan_seconds(curve, n, c, workers, 1, chunks_of) for c in range(1, largest + 1)}
    fastest = min(seconds, key=lambda c: (seconds[c], -c))
    return fastest if seconds[fastest] < seconds[largest] * SMALLER_CHUNK_GAIN else largest


@dataclass(frozen=True)
class DeviceMemory:
    """The memory a batch's training may use on its device. On CUDA: `validation.gpu_memory_mb`, or the free
    device memory (torch.cuda.mem_get_info) at the plan; on a CPU: `validation.memory_mb` (unlearning/planning/plan.py
    fit_memory keeps the CPU's accounting)."""

    kind: str  # "cuda" | "cpu"
    budget_bytes: int
    key: str  # the params key that sets it, named in a refusal
    member_bytes: int | None = None  # one member in training, measured on the device (peak allocated), if known


def cuda_chunk_cap(memory: DeviceMemory, fixed_bytes: int, member_bytes: int) -> tuple[int, str | None]:
    """(members that fit in one chunk on the device, refusal): the device holds the data once (`fixed_bytes`)
    and each member of a chunk `member_bytes` (weights, gradients, optimizer state, activations)."""
    free = memory.budget_bytes - fixed_bytes
    if free < member_bytes:
        mb = 1024 * 1024
        return 0, (f"{memory.key} = {memory.budget_bytes // mb} MB of device memory cannot hold the batch: the data "
                   f"takes {fixed_bytes / mb:.0f} MB and one member in training {member_bytes / mb:.0f} MB more; "
                   f"raise {memory.key} to at least {math.ceil((fixed_bytes + member_bytes) / mb * 1.1)}, free the "
                   f"device, or lower train.batch_size")
    return int(free // max(member_bytes, 1)), None


def method_retrains(sample_seconds: float, sample_work: float, full_work: float, retrain_seconds: float) -> float:
    """A method's cost in retrains from one timed run on a sample of the batch's rows: the measured seconds,
    carried to the batch's size by the method's own work measure (its stop rule's budget of gradient
    evaluations on the sample and on the batch: a method with a fixed number of steps costs the same on both,
    one with epochs over the retain rows grows with them). No work measured (do_nothing): the seconds as they are."""
    scale = full_work / sample_work if sample_work > 0 else 1.0
    return sample_seconds * scale / max(retrain_seconds, 1e-12)
