"""Times and durations as admins type them: ``+2h``, ``tomorrow 08:00``, ISO 8601, ``30m``.

Headless, stdlib only (datetime, zoneinfo). Every parser returns Unix seconds (UTC) or seconds, and
raises :class:`TimeError` whose message quotes the text and says what is accepted.
"""

from __future__ import annotations

import datetime as dt
import re

from gpuctl import durations

TIME_FORMS = ("+DURATION (e.g. +5s, +2h, +1d12h), 'today HH:MM', 'tomorrow HH:MM', "
              "ISO 8601 (2026-03-01T08:00, with or without a zone such as Z or +01:00)")


class TimeError(ValueError):
    """A time or duration that cannot be read; the message quotes it and lists the accepted forms."""


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"1d12h"``, ``"1.5h"`` -> seconds (> 0). Raises TimeError."""
    try:
        total = durations.parse_duration(text)  # the one reading of <number><unit>...
    except durations.DurationError:
        raise TimeError(f"{text!r} is not a duration: write a number and a unit (s, m, h, d, w), "
                        f"e.g. 30m, 2h, 1d12h") from None
    if total <= 0:
        raise TimeError(f"{text!r}: the duration must be more than 0 seconds")
    return total


def local_zone() -> dt.tzinfo:
    """The machine's local time zone (from the OS)."""
    tz = dt.datetime.now().astimezone().tzinfo
    assert tz is not None
    return tz


def system_zone() -> dt.tzinfo:
    """The machine's zone with its DST rules where it can be named: $TZ, else the /etc/localtime
    link (``.../zoneinfo/Europe/Paris``), as a ZoneInfo; else today's fixed offset (local_zone)."""
    import os
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    names = [os.environ.get("TZ", "").lstrip(":")]
    try:
        names.append(os.path.realpath("/etc/localtime").split("/zoneinfo/", 1)[1])
    except (IndexError, OSError):
        pass
    for name in names:
        if name:
            try:
                return ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    return local_zone()


def parse_time(text: str, now_s: float, tz: dt.tzinfo | None = None) -> float:
    """A point in time -> Unix seconds (UTC).

    Forms: ``+DURATION`` (from `now_s`), ``today HH:MM`` / ``tomorrow HH:MM`` (in `tz`), ISO 8601
    date or date-time with a zone (``Z``, ``+01:00``) or without one (then in `tz`; None: the
    system's local zone, DST included). Raises TimeError naming the text and the accepted forms.
    """
    t = text.strip()
    if t.startswith("+"):
        return now_s + parse_duration(t[1:])
    m = re.fullmatch(r"(today|tomorrow)\s+(\d{1,2}):(\d{2})", t, re.IGNORECASE)
    if m:
        day = dt.datetime.fromtimestamp(now_s, tz).date()  # tz None: the system's local date
        if m.group(1).lower() == "tomorrow":
            day += dt.timedelta(days=1)
        hh, mm = int(m.group(2)), int(m.group(3))
        if hh > 23 or mm > 59:
            raise TimeError(f"{text!r}: {hh:02d}:{mm:02d} is not a time of day")
        return _localize(dt.datetime(day.year, day.month, day.day, hh, mm), tz).timestamp()
    try:
        when = dt.datetime.fromisoformat(t)
    except ValueError:
        raise TimeError(f"{text!r} is not a time; use {TIME_FORMS}") from None
    if when.tzinfo is None:
        when = _localize(when, tz)
    return when.timestamp()


def _localize(naive: dt.datetime, tz: dt.tzinfo | None) -> dt.datetime:
    """`naive` wall-clock time in `tz` (the earlier one of an ambiguous hour, fold=0); with tz
    None, in the system's local zone with its own DST rules (datetime.astimezone)."""
    if tz is None:
        return naive.astimezone()
    return naive.replace(tzinfo=tz)


def parse_since(text: str, now_s: float, tz: dt.tzinfo | None = None) -> float:
    """``--since``: a duration back from now (``2h``) or a time as :func:`parse_time`. Unix s."""
    t = text.strip()
    if t and t[0].isdigit() and durations.is_duration(t):
        return now_s - parse_duration(t)
    return parse_time(t, now_s, tz)


def show_local(ts_s: float, tz: dt.tzinfo | None = None) -> str:
    """Unix seconds -> ``"2026-03-01 08:00:00 CET"`` in `tz` (the local zone by default)."""
    d = dt.datetime.fromtimestamp(ts_s, tz or local_zone())
    return d.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
