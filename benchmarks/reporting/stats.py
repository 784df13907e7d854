"""Median and spread of repeated measurements: the only summaries the report prints."""
from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary(values: Sequence[float]) -> dict[str, float | int]:
    """Median, quartiles (inclusive method), min, max and relative spread ((max - min) / median) of raw repeats."""
    if not values:
        raise ValueError("summary: no values")
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (med, med, med)
    return {
        "n": len(values),
        "median": med,
        "q1": q1,
        "q3": q3,
        "min": lo,
        "max": hi,
        "spread": (hi - lo) / med if med else 0.0,
    }
