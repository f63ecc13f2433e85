"""Interleaved wall-clock timing for the benchmark scripts (`benchmark.py`, `evaluate_int8.py`): contenders run in
turn, round after round, so that a slow spell of a noisy machine falls on all of them; results are the median and the
fastest and slowest run."""

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> float:
    """Seconds (wall clock, `time.perf_counter`) that `fn()` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(
    workers: dict[str, Callable[[], object]], repeats: int, between: Callable[[], None] | None = None
) -> dict[str, list[float]]:
    """Run `workers` (label -> callable) in turn, `repeats` times, calling `between()` before each round; the
    seconds of every run per label."""
    times = {label: [] for label in workers}
    for _ in range(repeats):
        if between is not None:
            between()
        for label, work in workers.items():
            times[label].append(timed(work))
    return times


def median_and_spread(seconds: list[float]) -> dict:
    """`{"seconds": median, "spread_seconds": [fastest, slowest]}` of repeated timings."""
    return {"seconds": statistics.median(seconds), "spread_seconds": [min(seconds), max(seconds)]}
