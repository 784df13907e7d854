"""Median and spread of repeated measurements: the only summaries the report prints."""
from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary(values: Sequence[float]) -> dict[str, float | int]:
    """Median, min, max and relative spread ((max - min) / median) of raw repeats."""
    if not values:
        raise ValueError("summary: no values")
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {
        "n": len(values),
        "median": med,
        "min": lo,
        "max": hi,
        "spread": (hi - lo) / med if med else 0.0,
    }
