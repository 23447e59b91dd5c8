"""Where a stage's wall time goes: compute, tracking, and (by difference) orchestration.

- compute: the bodies of the pipeline's Prefect tasks (`@computes`): loading data, training, diagnostics,
  the ensembles, unlearning, the gate, Great Expectations' validation, writing the state;
- tracking: MLflow calls (every public `Tracker` method, `@tracks`) and the review figures made for them,
  also when they happen inside a task body (they are taken out of its compute time);
- orchestration: the rest of a stage's wall time, which `python -m flows.session` computes: process start
  and imports, the Prefect server, flow and task runs and their state changes, DVC's own work.

Sections are recorded as (start, end) intervals per kind; tasks running in parallel threads (the ensemble
chunks) overlap, so a kind's time is the length of the union of its intervals, not their sum, and compute
is counted only where no tracking interval covers it. With `UNLEARN_TIMINGS=<file>` set (flows.session
sets it), `write_record` appends one JSON line per process: {"label", "compute_s", "tracking_s"}.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import types

from unlearning.planning.intervals import clip, length, minus, union

ENV_FILE = "UNLEARN_TIMINGS"
_lock = threading.Lock()
_intervals: dict[str, list[tuple[float, float]]] = {"compute": [], "tracking": []}
_depth = threading.local()  # per thread and kind: how many sections are open (only the outermost is recorded)
_by_name: dict[str, float] = {}  # "kind:name" -> seconds of its outermost sections (UNLEARN_TIMING_DETAIL)


# the interval algebra lives in the core (the batch's phase accounting, unlearning/planning/overhead.py, uses it too)
_union, _length, _minus = union, length, minus


class section:
    """`with section("compute"):` records the wall time of the block under that kind (outermost block only)."""

    def __init__(self, kind: str, name: str = ""):
        if kind not in _intervals:
            raise ValueError(f"unknown timing kind {kind!r}; allowed: {sorted(_intervals)}")
        self.kind, self.name = kind, name

    def __enter__(self):
        depth = getattr(_depth, self.kind, 0)
        setattr(_depth, self.kind, depth + 1)
        self.outermost = depth == 0
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        end = time.perf_counter()
        setattr(_depth, self.kind, getattr(_depth, self.kind) - 1)
        if self.outermost:
            with _lock:
                _intervals[self.kind].append((self.start, end))
                key = f"{self.kind}:{self.name}"
                _by_name[key] = _by_name.get(key, 0.0) + end - self.start
        return False


def _timed(kind: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with section(kind, fn.__qualname__):
            return fn(*args, **kwargs)

    return wrapper


def elsewhere(kind: str, name: str, seconds: float) -> None:
    """Record `seconds` of `kind` that ran in another process (a Dask worker's task body, whose own intervals
    stay in that worker) as the interval ending now. The union of intervals keeps it from counting twice where
    the same work was timed in this process too (the threads runner)."""
    end = time.perf_counter()
    with _lock:
        _intervals[kind].append((end - max(seconds, 0.0), end))
        key = f"{kind}:{name}"
        _by_name[key] = _by_name.get(key, 0.0) + max(seconds, 0.0)


def computes(fn):
    """Decorator: the function's wall time is compute (put it under `@task`, on the task's body)."""
    return _timed("compute", fn)


def tracks(obj):
    """Decorator for a function, or a class (`__init__` and each public method): its wall time is tracking."""
    if isinstance(obj, type):
        for name, member in list(vars(obj).items()):
            if isinstance(member, types.FunctionType) and (name == "__init__" or not name.startswith("_")):
                setattr(obj, name, _timed("tracking", member))
        return obj
    return _timed("tracking", obj)


# --- a batch's phases (unlearning/planning/overhead.py PHASES): when each ran, for the plan-vs-actual line -------------
_phases: dict[str, list[tuple[float, float]]] = {}


class phase:
    """`@phase("validation")` on a function, or `with phase("erase"):`: records when the block ran under that
    phase of a batch (every interval: parallel ones are merged by `intervals`)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        end = time.perf_counter()
        with _lock:
            _phases.setdefault(self.name, []).append((self.start, end))
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with phase(self.name):
                return fn(*args, **kwargs)

        return wrapper


def intervals(kind: str, since: float, until: float) -> list[tuple[float, float]]:
    """The disjoint intervals of `kind` (compute, tracking, or a phase's name) inside [since, until]."""
    with _lock:
        raw = list(_intervals[kind] if kind in _intervals else _phases.get(kind, []))
    return union(clip(raw, since, until))


def forget_phases_before(t: float) -> None:
    """Drop the phase intervals that ended before `t` (a long-running process's batches are accounted once)."""
    with _lock:
        for name in list(_phases):
            _phases[name] = [(a, b) for a, b in _phases[name] if b >= t]


def totals() -> dict[str, float]:
    """Seconds of compute (not covered by tracking) and of tracking, so far in this process."""
    with _lock:
        tracking = _union(_intervals["tracking"])
        compute = _minus(_union(_intervals["compute"]), tracking)
    return {"compute_s": round(_length(compute), 3), "tracking_s": round(_length(tracking), 3)}


def reset() -> None:
    global _written_by
    _written_by = None
    with _lock:
        for v in _intervals.values():
            v.clear()
        _by_name.clear()
        _phases.clear()


def largest(n: int = 8) -> list[tuple[str, float]]:
    """The `n` functions with the most time, as ("kind:qualname", seconds) (outermost sections of a kind)."""
    with _lock:
        return sorted(((k, round(v, 3)) for k, v in _by_name.items()), key=lambda kv: -kv[1])[:n]


_written_by: int | None = None  # the pid that wrote this process's record (a forked child writes its own)


def stage_label(default: str) -> str:
    """The row of the session's table this process belongs to: the DVC stage, or the session's command."""
    return os.environ.get("DVC_STAGE") or os.environ.get("UNLEARN_TIMING_LABEL") or default


def write_record(label: str) -> None:
    """Append this process's totals to $UNLEARN_TIMINGS (one JSON line; nothing when it is not set), once per
    process: the first entry point that ends writes it (`unlearn` inside a warm child, then the child's runner)."""
    global _written_by
    path = os.environ.get(ENV_FILE)
    if not path or _written_by == os.getpid():
        return
    _written_by = os.getpid()
    line = json.dumps({"label": label, **totals(), "largest": largest()}) + "\n"
    with open(path, "a", encoding="utf-8") as f:  # one short write per process: O_APPEND keeps lines whole
        f.write(line)
