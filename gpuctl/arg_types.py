"""argparse `type=` callables shared by the `gpuctl` CLI and the `gpuctld` daemon's options.

Headless (stdlib only), so both sides import it without pulling in the other.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def seconds_arg(low_s: float, high_s: float, *, low_exclusive: bool = False) -> Callable[[str], float]:
    """An argparse type for a number of seconds in [low_s, high_s] (or (low_s, high_s] with
    `low_exclusive`). The callable returns the value as a float (seconds) and raises
    argparse.ArgumentTypeError ``not a number of seconds: 'x'`` or ``must be 1..86400 seconds, got
    0`` (``must be > 0 and <= 3600 seconds, got 0`` when the low end is exclusive), which argparse
    prints after the option's name."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if low_exclusive:
            if not low_s < value <= high_s:
                raise argparse.ArgumentTypeError(f"must be > {low_s:g} and <= {high_s:g} seconds, got {text}")
        elif not low_s <= value <= high_s:
            raise argparse.ArgumentTypeError(f"must be {low_s:g}..{high_s:g} seconds, got {text}")
        return value

    return seconds
