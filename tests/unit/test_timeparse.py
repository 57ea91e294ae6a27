"""Times and durations as typed on the command line (gpuctl.timeparse), checked against datetime."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from gpuctl.timeparse import TimeError, parse_duration, parse_since, parse_time, show_local

PARIS = ZoneInfo("Europe/Paris")
# 2026-03-28 12:00 in Paris (UTC+1); the clocks go forward on 2026-03-29 at 02:00
NOW = dt.datetime(2026, 3, 28, 12, 0, tzinfo=PARIS).timestamp()


@pytest.mark.parametrize("text, seconds", [("5s", 5), ("30m", 1800), ("2h", 7200), ("1d12h", 129600),
                                           ("1.5h", 5400), ("1w", 604800)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "h", "5x", "-5s", "0s", "2h junk"])
def test_bad_durations_name_the_text(text):
    with pytest.raises(TimeError, match="duration"):
        parse_duration(text)


def test_relative_and_named_days_in_the_local_zone_across_dst():
    assert parse_time("+2h", NOW, PARIS) == NOW + 7200
    # tomorrow 08:00 is after the DST change: UTC+2, so 06:00 UTC
    want = dt.datetime(2026, 3, 29, 6, 0, tzinfo=dt.timezone.utc).timestamp()
    assert parse_time("tomorrow 08:00", NOW, PARIS) == want
    assert parse_time("today 18:30", NOW, PARIS) == dt.datetime(2026, 3, 28, 17, 30, tzinfo=dt.timezone.utc).timestamp()


def test_iso_with_and_without_zone():
    assert parse_time("2026-04-01T08:00", NOW, PARIS) == dt.datetime(2026, 4, 1, 6, 0, tzinfo=dt.timezone.utc).timestamp()
    assert parse_time("2026-04-01T08:00Z", NOW, PARIS) == dt.datetime(2026, 4, 1, 8, 0, tzinfo=dt.timezone.utc).timestamp()
    assert parse_time("2026-04-01T08:00+05:30", NOW, PARIS) == \
        dt.datetime(2026, 4, 1, 2, 30, tzinfo=dt.timezone.utc).timestamp()


@pytest.mark.parametrize("text", ["yesterday 08:00", "tomorrow 25:00", "2026-13-01", "next week", "08:00"])
def test_bad_times_list_the_accepted_forms(text):
    with pytest.raises(TimeError, match=repr(text).replace("(", r"\(")[:10]):
        parse_time(text, NOW, PARIS)


def test_since_takes_a_duration_back_or_a_time():
    assert parse_since("2h", NOW, PARIS) == NOW - 7200
    assert parse_since("2026-03-28T00:00Z", NOW, PARIS) == dt.datetime(2026, 3, 28, tzinfo=dt.timezone.utc).timestamp()


def test_show_local_names_the_zone():
    assert show_local(NOW, PARIS) == "2026-03-28 12:00:00 CET"


def test_system_local_zone_follows_its_dst_rules():
    """No zone given: the machine's own zone (TZ), with its DST change between today and tomorrow."""
    import os
    import subprocess
    import sys

    code = ("import datetime as dt; from gpuctl.timeparse import parse_time; "
            "now = dt.datetime(2026, 3, 28, 12, 0).astimezone().timestamp(); "
            "print(parse_time('tomorrow 08:00', now), parse_time('2026-03-28T08:00', now))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TZ="Europe/Paris"))
    assert out.returncode == 0, out.stderr
    tomorrow, today = map(float, out.stdout.split())
    assert tomorrow == dt.datetime(2026, 3, 29, 6, 0, tzinfo=dt.timezone.utc).timestamp()  # CEST, UTC+2
    assert today == dt.datetime(2026, 3, 28, 7, 0, tzinfo=dt.timezone.utc).timestamp()  # CET, UTC+1
