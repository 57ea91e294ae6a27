"""Durations and points in time as people type them: ``30d``, ``12h``, ``2w``, ``2026-01-31``.

Headless. :func:`parse_duration` turns ``<number><unit>`` (units s, m, h, d, w; several parts like
``1d12h`` allowed) into seconds; :func:`parse_time` turns an ISO 8601 date or date-time (UTC unless
it carries an offset), ``now``, or a duration meaning "that long before `now_s`" into Unix seconds.
Both raise :class:`DurationError` with a message that quotes the text and shows a good example.
"""

from __future__ import annotations

import datetime as _dt
import re

#: Seconds per unit letter.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


class DurationError(ValueError):
    """Text that is not a duration or a time; the message says what was expected."""


def parse_duration(text: str) -> float:
    """``"30d"`` -> 2592000.0 seconds; ``"1d12h"``, ``"90m"``, ``"2w"`` work too. A bare number is
    refused (the unit must be said). Raises DurationError."""
    t = text.strip().lower()
    pos, total = 0, 0.0
    for m in _PART.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if not t or pos != len(t):
        hint = " (add a unit: s, m, h, d or w)" if re.fullmatch(r"\d+(\.\d+)?", t) else ""
        raise DurationError(f"not a duration: {text!r}{hint}; e.g. 30d, 12h, 2w, 1d12h")
    return total


def is_duration(text: str) -> bool:
    """True when `text` reads as a duration (:func:`parse_duration` would not raise)."""
    try:
        parse_duration(text)
    except DurationError:
        return False
    return True


def parse_time(text: str, now_s: float) -> float:
    """A point in time as Unix seconds: ``now``; a duration ago (``30d`` = 30 days before
    `now_s`); or an ISO 8601 date / date-time (``2026-01-31``, ``2026-01-31T08:00``,
    ``2026-01-31 08:00+01:00``; UTC when no offset is given). Raises DurationError."""
    t = text.strip()
    if t.lower() == "now":
        return float(now_s)
    if t and (t[0].isdigit() and _PART.match(t.lower()) and not re.match(r"\d{4}-", t)):
        try:
            return float(now_s) - parse_duration(t)
        except DurationError:
            pass
    try:
        when = _dt.datetime.fromisoformat(t)
    except ValueError:
        raise DurationError(f"not a time: {text!r}; use a duration ago (30d, 12h), an ISO date "
                            f"(2026-01-31) or date-time (2026-01-31T08:00), or now") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()
