"""Statistics shared by the bench scripts (they run as `python bench/NAME.py`, so this imports as `_stats`)."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank (the ceil(q*n)-th smallest); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]
