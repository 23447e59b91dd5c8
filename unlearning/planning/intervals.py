"""Wall-clock intervals as (start, end) pairs in seconds: their union, difference, length and clipping. Tasks that run
in parallel threads overlap, so the time a kind of work took is the length of the union of its intervals, not the
sum of their lengths (adapters/clock.py, unlearning/planning/overhead.py `account`). Pure, stdlib only."""

from __future__ import annotations

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    """Disjoint, sorted intervals covering exactly what `intervals` cover."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def minus(intervals: list[Interval], cut: list[Interval]) -> list[Interval]:
    """The parts of (disjoint, sorted) `intervals` that no interval of (disjoint, sorted) `cut` covers."""
    out = []
    for a, b in intervals:
        pieces = [(a, b)]
        for c, d in cut:
            pieces = [p for s, e in pieces for p in ((s, min(e, c)), (max(s, d), e)) if p[1] > p[0]]
        out.extend(pieces)
    return out


def clip(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    """The parts of `intervals` inside [start, end]."""
    return [(max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start)]
