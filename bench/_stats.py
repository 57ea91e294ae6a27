"""Statistics shared by the bench scripts (they run as `python bench/NAME.py`, so this imports as `_stats`)."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank (the ceil(q*n)-th smallest); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def median_of(values: list[float]) -> float:
    """The median of `values` (the mean of the middle two for an even count); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
