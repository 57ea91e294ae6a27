"""Plan files (gpuctl.fleet.plan, gpuctl.fleet.plan_apply): errors with file:line: key, recurring windows across a
daylight-saving change (croniter + zoneinfo), over-commitment decided by department priority."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from gpuctl.config import ConfigError
from gpuctl.fleet.plan import conflicts, load_plan, occurrences, segments
from gpuctl.fleet.plan_apply import PoolSlice, plan_entries

PARIS = ZoneInfo("Europe/Paris")
PRIO = {"research": 10, "training": 20, "inference": 30}
UTC = dt.timezone.utc


def _ts(*a, tz=UTC) -> float:
    return dt.datetime(*a, tzinfo=tz).timestamp()


def _write(tmp_path, text: str):
    p = tmp_path / "plan.toml"
    p.write_text(text)
    return p


RECURRING = """
[plan]
name = "day-night"
zone = "Europe/Paris"
capacity_gpus = 4

[[window]]
department = "inference"
gpus = 3
start = "2026-03-27T00:00"
end = "2026-04-05T00:00"
every = "0 8 * * *"
duration = "12h"

[[window]]
department = "research"
gpus = 2
start = "2026-03-29T06:30Z"
end = "2026-03-29T07:00Z"
"""


def test_recurring_window_keeps_local_time_across_dst(tmp_path):
    plan = load_plan(_write(tmp_path, RECURRING), PRIO)
    occ = [o for o in occurrences(plan, _ts(2026, 3, 28), _ts(2026, 3, 30)) if o.window.index == 0]
    starts = [dt.datetime.fromtimestamp(o.start_s, UTC).strftime("%m-%d %H:%M") for o in occ]
    # 08:00 in Paris is 07:00 UTC before the change (2026-03-29 02:00) and 06:00 UTC after it
    assert starts == ["03-28 07:00", "03-29 06:00"]
    assert all(o.end_s - o.start_s == 12 * 3600 for o in occ)


def test_conflict_only_after_dst_names_instant_windows_and_shortfall(tmp_path):
    plan = load_plan(_write(tmp_path, RECURRING), PRIO)
    found = conflicts(plan, segments(plan, _ts(2026, 3, 28), _ts(2026, 3, 30), 4, PRIO), 4)
    # research's window 06:30-07:00 UTC overlaps inference's 08:00 Paris only once the clocks went forward
    assert len(found) == 1
    c = found[0]
    assert (c.at_s, c.until_s) == (_ts(2026, 3, 29, 6, 30), _ts(2026, 3, 29, 7, 0))
    assert c.demand == 5 and c.capacity == 4
    # research (priority 10) comes first: inference (30) is short by 1
    assert c.short == {"window[0] (line 7, inference)": 1.0}


def test_priority_decides_who_is_short(tmp_path):
    plan = load_plan(_write(tmp_path, RECURRING), {"research": 50, "training": 20, "inference": 5})
    (c,) = conflicts(plan, segments(plan, _ts(2026, 3, 28), _ts(2026, 3, 30), 4, {"research": 50, "inference": 5}), 4)
    assert c.short == {"window[1] (line 15, research)": 1.0}


@pytest.mark.parametrize("body, where", [
    ('[[window]]\ndepartment = "marketing"\ngpus = 1\nstart = "2026-01-01T00:00"\nend = "2026-01-02T00:00"\n',
     "plan.toml:2: window[0].department: unknown department 'marketing'"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-02T00:00"\nend = "2026-01-01T00:00"\n',
     "plan.toml:5: window[0].end: 2026-01-01T00:00 is not after start"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "soon"\nend = "2026-01-01T00:00"\n',
     "plan.toml:4: window[0].start: 'soon' is not an ISO 8601 time"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-01T00:00"\nend = "2026-02-01T00:00"\n'
     'every = "0 25 * * *"\nduration = "1h"\n', "plan.toml:6: window[0].every: '0 25 * * *' is not a cron expression"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-01T00:00"\nend = "2026-02-01T00:00"\n'
     'every = "0 8 * * *"\n', "plan.toml:1: window[0].duration: is required with every"),
    ('[[window]]\ndepartment = "research"\ngpus = -1\nstart = "2026-01-01T00:00"\nend = "2026-02-01T00:00"\n',
     "plan.toml:3: window[0].gpus: must be a number of GPU-equivalents > 0"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-01T00:00"\nend = "2026-02-01T00:00"\n'
     'on_conflict = "wait"\n', "plan.toml:6: window[0].on_conflict: must be drain or revoke"),
    ('[plan]\nzone = "Mars/Olympus"\n[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-01T00:00"\n'
     'end = "2026-02-01T00:00"\n', "plan.toml:2: plan.zone: unknown time zone 'Mars/Olympus'"),
    ('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-01-01T00:00"\nend = "2026-02-01T00:00"\n'
     'nodes = ["gpu-99"]\n', "plan.toml:6: window[0].nodes: unknown node 'gpu-99'"),
    ('[[window]\n', "plan.toml:1"),
])
def test_bad_plans_name_file_line_and_key(tmp_path, body, where):
    with pytest.raises(ConfigError) as ei:
        load_plan(_write(tmp_path, body), PRIO, {"gpu-01"})
    assert where in str(ei.value)


def _pool(n_nodes=2, per_node=2) -> list[PoolSlice]:
    return [PoolSlice(f"n{k}", f"GPU-{k}{i}/0", i, 1.0) for k in range(1, n_nodes + 1) for i in range(per_node)]


def test_apply_plans_start_and_end_moves_with_stable_request_ids(tmp_path):
    plan = load_plan(_write(tmp_path, RECURRING), PRIO)
    now = _ts(2026, 3, 28, 0, 0)
    ap = plan_entries(plan, _pool(), {}, now, _ts(2026, 3, 30), PRIO)
    starts = [e for e in ap.entries if e.request_id.endswith(":start")]
    assert [(e.src, e.dst, e.count) for e in starts] == [("unassigned", "inference", 3)] * 2 + \
        [("unassigned", "research", 1)]
    assert ap.warnings == ["window[1] (line 15, research): at its start the pool (unassigned) can give 1 of 2 "
                           "GPU-equivalents"]
    ends = {e.request_id: e for e in ap.entries if e.request_id.endswith(":end")}
    first = starts[0]
    back = ends[first.request_id.replace(":start", ":end")]
    assert (back.src, back.dst, back.slices) == ("inference", "unassigned", first.slices)
    # the same plan applied again, with its entries installed: nothing to add, nothing to cancel
    existing = {e.request_id: {"slices": e.slices, "status": "planned",
                               "entry_ids": {n: "s-" + e.request_id for n in e.slices}} for e in ap.entries}
    again = plan_entries(plan, _pool(), existing, now, _ts(2026, 3, 30), PRIO)
    assert again.to_add == [] and again.cancel == {}
    # a shorter horizon no longer produces the second day's entries: they are cancelled
    shorter = plan_entries(plan, _pool(), existing, now, _ts(2026, 3, 29), PRIO)
    cancelled = {eid for ids in shorter.cancel.values() for eid in ids}
    assert cancelled and all(":w0:" in c or ":w1:" in c for c in cancelled)
    assert shorter.to_add == []
