"""`gpuctl report` against real simulated gpuctld processes with a 30-day simulated past
(`gpuctl demo --history 30d`'s fleet): GPU-hours add up to the fleet's GPU count x hours, a node
that does not answer is named and its rows marked incomplete, CSV/JSON shapes, bad options, the
usage routes' errors, lease refusals recorded, and "what to move"."""

from __future__ import annotations

import csv
import io
import shutil
import time

import httpx
import pytest

from daemon_proc import start_daemon, uds_client
from fleet_fixtures import run_cli
from gpuctl.cli import report as report_cli
from gpuctl.fleet.demo import start_demo_fleet
from gpuctl.fleet.usage_report import FIGURES, build_report, suggest, FleetUsage


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    fleet = start_demo_fleet(nodes=2, gpus=4, seed=3, root=root / "fleet", history="30d")
    down = root / "with-down.toml"
    down.write_text(fleet.config_path.read_text() + '\n[[node]]\nname = "sim-down"\ntransport = "local"\n'
                    f'socket = "{root}/nobody.sock"\n')
    try:
        yield fleet, down
    finally:
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)


def fixed_period(days: int) -> list[str]:
    """``--since`` / ``--until`` as fixed times (`days` before a few seconds ago, and then): reports
    compared with each other must cover the same period; "30d" and "now" move when a command
    starts after a minute (or an hour) has turned."""
    import datetime as dt

    until = dt.datetime.fromtimestamp(int(time.time()) - report_cli.WRITE_DELAY_S, dt.timezone.utc)
    since = until - dt.timedelta(days=days)
    return ["--since", since.strftime("%Y-%m-%dT%H:%M:%S"), "--until", until.strftime("%Y-%m-%dT%H:%M:%S")]


def test_demo_history_report_adds_up_to_gpus_times_hours(demo):
    fleet, _ = demo
    period = fixed_period(30)
    r = run_cli("--config", str(fleet.config_path), "report", *period, "--by", "department", "--json")
    assert r.code == 0, r.stderr
    rep = r.json
    assert rep["fleet_gpus"] == 8 and rep["unreachable_nodes"] == {}
    assert 720 <= rep["hours"] <= 721  # 30 days, started at the hour (minutes are gone there)
    owned = sum(row["owned_gpu_h"] for row in rep["rows"])
    assert owned == pytest.approx(rep["fleet_gpu_hours"], rel=1e-7)
    assert rep["total"]["owned_gpu_h"] == pytest.approx(owned)
    depts = {row["department"] for row in rep["rows"]}
    assert depts <= {"research", "training", "inference", "unassigned"} and len(depts) >= 2
    for row in rep["rows"]:
        assert row["incomplete"] is False
        assert 0 <= row["leased_gpu_h"] <= row["owned_gpu_h"] + 1e-9
        assert 0 <= row["used_gpu_h"] <= row["owned_gpu_h"] + 1e-9
        assert 0 <= row["idle_owned_gpu_h"] <= row["owned_gpu_h"] - row["leased_gpu_h"] + 1e-9
        assert row["mean_sm_util_pct"] == pytest.approx(100 * row["used_gpu_h"] / row["owned_gpu_h"], rel=1e-6)
    assert sum(row["leased_gpu_h"] for row in rep["rows"]) > 10  # the past has leases in it
    # the same period by node and by GPU gives the same owned total; each GPU is owned for the whole period
    by_node = run_cli("--config", str(fleet.config_path), "report", *period, "--by", "node", "--json").json
    assert [row["node"] for row in by_node["rows"]] == ["sim-01", "sim-02"]
    assert by_node["total"]["owned_gpu_h"] == pytest.approx(owned, rel=1e-9)
    by_gpu = run_cli("--config", str(fleet.config_path), "report", *period, "--by", "gpu", "--json").json
    assert [(row["node"], row["index"]) for row in by_gpu["rows"]] == [(n, i) for n in ("sim-01", "sim-02")
                                                                       for i in range(4)]
    for row in by_gpu["rows"]:
        assert row["owned_gpu_h"] == pytest.approx(by_gpu["hours"], rel=1e-7)


def test_every_day_rows_add_up_to_the_period(demo):
    fleet, _ = demo
    period = fixed_period(10)
    one = run_cli("--config", str(fleet.config_path), "report", *period, "--json").json
    daily = run_cli("--config", str(fleet.config_path), "report", *period, "--every", "day", "--json").json
    assert (one["since_s"], one["until_s"]) == (daily["since_s"], daily["until_s"])
    assert len({row["bucket"] for row in daily["rows"]}) in (10, 11)
    for dept in {row["department"] for row in one["rows"]}:
        total = sum(row["owned_gpu_h"] for row in daily["rows"] if row["department"] == dept)
        assert total == pytest.approx(next(r["owned_gpu_h"] for r in one["rows"] if r["department"] == dept))


def test_unreachable_node_is_named_and_rows_incomplete(demo):
    _, down = demo
    r = run_cli("--config", str(down), "report", "--since", "7d", "--json")
    assert r.code == 7
    rep = r.json
    assert list(rep["unreachable_nodes"]) == ["sim-down"]
    assert rep["rows"] and all(row["incomplete"] for row in rep["rows"]) and rep["total"]["incomplete"] is True
    assert rep["fleet_gpus"] == 8  # the silent node's GPUs are not counted as zero-use GPUs
    assert "node sim-down did not answer" in r.stderr
    by_node = run_cli("--config", str(down), "report", "--since", "7d", "--by", "node", "--json").json
    last = by_node["rows"][-1]
    assert last["node"] == "sim-down" and last["incomplete"] is True
    assert all(last[f] is None for f in FIGURES)
    assert all(not row["incomplete"] for row in by_node["rows"][:-1])


def test_csv_shape(demo):
    _, down = demo
    r = run_cli("--config", str(down), "report", "--since", "2d", "--by", "node", "--every", "day", "--csv")
    assert r.code == 7
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == ["bucket", "node", *FIGURES, "incomplete"]
    assert rows[-1][1] == "total" and rows[-1][-1] == "True"
    down_row = next(row for row in rows if row[1] == "sim-down")
    assert down_row[2:8] == [""] * 6 and down_row[-1] == "True"  # unknown, not zero
    data = [row for row in rows[1:-1] if row[1] != "sim-down"]
    assert {row[1] for row in data} == {"sim-01", "sim-02"}
    assert sum(float(row[2]) for row in data) == pytest.approx(float(rows[-1][2]), abs=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "--since: not a time: 'yesterday'"),
    (["--since", "30"], "--since: not a time: '30'"),
    (["--since", "1d", "--until", "2d"], "must be at least a minute before --until"),
    (["--until", "2099-01-01"], "--until '2099-01-01' is in the future"),
    (["--since", "500d"], "a report covers at most 400 days"),
    (["--since", "2026-13-45"], "--since: not a time: '2026-13-45'"),
    (["--suggest", "--by", "node"], "--suggest works on one period by department"),
])
def test_bad_options_are_named(demo, args, message):
    fleet, _ = demo
    r = run_cli("--config", str(fleet.config_path), "report", *args)
    assert r.code == 2
    assert message in r.stderr and r.stdout == ""


def test_usage_route_errors(demo):
    fleet, _ = demo
    with uds_client(fleet.nodes[0].socket) as c:
        for query, field in [("since=abc&until=1796106000", "since"), ("until=1796106000", "since"),
                             ("since=1796106000&until=1796106000", "until"),
                             ("since=1796006000&until=1796106000&every=month", "every"),
                             ("since=1&until=1796106000", "since")]:
            r = c.get(f"/v1/usage?{query}")
            assert r.status_code == 400 and r.json()["error"]["field"] == field, (query, r.text)
        r = c.get("/v1/usage/history?since=1795006000&until=1796106000&step_s=60")
        assert r.status_code == 400 and "more than 2000 points" in r.json()["error"]["message"]
        r = c.get("/v1/usage/history?since=1796006000&until=1796106000&step_s=3600&gpu=GPU-nope")
        assert r.status_code == 404 and r.json()["error"]["field"] == "gpu"


def test_history_route_gives_hourly_means(demo):
    fleet, _ = demo
    import time

    now = int(time.time()) // 3600 * 3600
    with uds_client(fleet.nodes[0].socket) as c:
        uuid = c.get("/v1/node").json()["gpus"][0]["uuid"]
        r = c.get(f"/v1/usage/history?since={now - 7 * 86400}&until={now}&step_s=3600&gpu={uuid}").json()
    pts = r["points"]
    assert len(pts) == 7 * 24
    assert all(p["gpu_uuid"] == uuid and 0 <= p["sm_util_pct"] <= 100 and p["sampled_s"] == 3600 for p in pts)


def test_lease_refusal_is_recorded_and_suggested(tmp_path):
    d = start_daemon(tmp_path, gpus=2, seed=5, name="n1", extra_args=["--history", "1d"])
    try:
        with uds_client(d.socket_path) as c:
            # research owns nothing on this node: its lease request is refused
            r = c.post("/v1/leases", json={"request_id": "l1", "department": "research", "owner": "a@b",
                                           "gpus": 1.0, "ttl_s": 60})
            assert r.status_code == 409 and r.json()["error"]["code"] == "insufficient_slices"
            import time

            now = int(time.time())
            u = c.get(f"/v1/usage?since={now - 600}&until={now + 60}").json()
        assert u["refusals"] == [{"department": "research", "count": 1, "gpu_equivalents": 1.0}]
        cfg = tmp_path / "fleet.toml"
        cfg.write_text('[[department]]\nname = "research"\npriority = 10\n\n'
                       f'[[node]]\nname = "n1"\ntransport = "local"\nsocket = "{d.socket_path}"\n')
        time.sleep(report_cli.WRITE_DELAY_S + 1)  # the report ends a few seconds before now
        r = run_cli("--config", str(cfg), "report", "--since", "1h", "--suggest", "--json")
        assert r.code == 0, r.stderr
        assert len(r.json["suggestions"]) == 1, (r.json["refusals"], r.json["rows"])
        (s,) = r.json["suggestions"]
        # the node's GPUs are unassigned: they are the donor, 1 GPU as asked
        assert s["to"] == "research" and s["from"] == "unassigned" and s["refusals"] == 1
        assert s["command"] == "gpuctl reassign --from unassigned --to research --gpus 1"
    finally:
        d.stop()


def _report(rows, refusals, hours=100.0):
    u = FleetUsage(0, int(hours * 3600), None, answers={"n": {"gpus": [], "rows": rows, "refusals": refusals}})
    return build_report(u)


def _row(dept, owned_h, idle_h):
    return {"bucket_s": 0, "gpu_uuid": "G", "department": dept, "owned_gpu_s": owned_h * 3600, "leased_gpu_s": 0.0,
            "used_gpu_s": 0.0, "sm_known_gpu_s": owned_h * 3600, "idle_gpu_s": idle_h * 3600, "outside_gpu_s": 0.0}


def test_suggest_orders_by_priority_and_takes_from_least_important_idle():
    rep = _report([_row("a", 400, 50), _row("b", 200, 190), _row("c", 300, 290), _row("d", 100, 100)],
                  [{"department": "a", "count": 3, "gpu_equivalents": 3.0},
                   {"department": "c", "count": 1, "gpu_equivalents": None}])
    got = suggest(rep, {"a": 1, "b": 2, "c": 3, "d": 4})
    # a (priority 1) first: d is the least important idle department: 1 GPU idle on average
    assert [(s["to"], s["from"], s["gpus"]) for s in got] == [("a", "d", 1.0), ("c", None, None)]
    # c is short too but b (priority 2) is more important than c: not a donor for it; d is used up
    assert got[0]["command"] == "gpuctl reassign --from d --to a --gpus 1"
    with pytest.raises(ValueError):
        suggest(build_report(FleetUsage(0, 3600, None), by="node"), {})


def test_history_and_report_from_a_fleet_client(demo):
    """The console's path: report_from_source / gpu_history_from_source on a real FleetClient."""
    import time

    from gpuctl.fleet.client import FleetClient, default_transport_factory
    from gpuctl.config import load_config
    from gpuctl.fleet.source import LiveFleetSource
    from gpuctl.fleet.usage_report import gpu_history_from_source, report_from_source

    fleet, _ = demo
    client = FleetClient(load_config(fleet.config_path), default_transport_factory())
    try:
        now = time.time()
        rep = report_from_source(client, now - 7 * 86400, now)
        assert rep["fleet_gpus"] == 8 and rep["total"]["owned_gpu_h"] > 0
        # the console's LiveFleetSource offers that client (FleetSource.fleet_client)
        via = report_from_source(LiveFleetSource(client), now - 7 * 86400, now)
        assert via["fleet_gpus"] == 8 and via["total"]["owned_gpu_h"] == pytest.approx(rep["total"]["owned_gpu_h"])
        uuid = client.snapshot().nodes[1].gpus[0].uuid
        pts = gpu_history_from_source(client, "sim-02", uuid, now - 86400, now, 900)
        assert 95 <= len(pts) <= 97 and all(p["gpu_uuid"] == uuid for p in pts)
        assert all(0 <= p["sm_util_pct"] <= 100 for p in pts)
    finally:
        client.close()


def _header_cells(table_text: str) -> list[str]:
    header = next(line for line in table_text.splitlines() if line.startswith("┃"))
    return [c.strip() for c in header.strip("┃").split("┃")]


def test_table_names_every_column_and_notes_only_incomplete_rows(demo):
    fleet, down = demo
    env = {"COLUMNS": "200"}
    ok = run_cli("--config", str(fleet.config_path), "report", "--since", "7d", env=env)
    assert ok.code == 0, ok.stderr
    cells = _header_cells(ok.stdout)
    assert all(cells), cells  # no unnamed column (there was one, always empty, for "incomplete")
    assert cells[0] == "department" and "note" not in cells and "incomplete" not in ok.stdout
    bad = run_cli("--config", str(down), "report", "--since", "7d", env=env)
    assert bad.code == 7
    cells = _header_cells(bad.stdout)
    assert all(cells) and cells[-1] == "note"
    assert "incomplete" in bad.stdout
