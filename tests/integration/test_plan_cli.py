"""`gpuctl plan check/show/apply` against two real simulated gpuctld (local sockets), with a
recurring window."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from daemon_proc import uds_client
from fleet_fixtures import local_fleet, run_cli


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def fleet(tmp_path):
    with local_fleet(tmp_path, {"n1": 51, "n2": 52}, departments={"research": 10, "inference": 30}) as (cfg, (d1, d2)):
        yield cfg, d1, d2


def _plan(tmp_path, gpus_b: int = 1):
    now = time.time()
    p = tmp_path / "night.toml"
    p.write_text(f"""
[plan]
name = "night"
zone = "UTC"

[[window]]
department = "inference"
gpus = 2
start = "{_iso(now - 3600)}"
end = "{_iso(now + 86400)}"
every = "0 * * * *"
duration = "30m"

[[window]]
department = "research"
gpus = {gpus_b}
start = "{_iso(now + 7200)}"
end = "{_iso(now + 9000)}"
""")
    return p


def _entries(d) -> list[dict]:
    with uds_client(d.socket_path) as c:
        return c.get("/v1/schedule").json()["entries"]


def test_check_show_apply_and_apply_again_changes_nothing(fleet, tmp_path):
    cfg, d1, d2 = fleet
    plan = _plan(tmp_path)
    r = run_cli("plan", "check", str(plan), "--to", "+4h", "--json", "--config", str(cfg))
    assert r.code == 0, r.stderr
    assert r.json["ok"] is True and r.json["capacity_gpus"] == 4  # 4 unassigned GPUs in the fleet
    show = run_cli("plan", "show", str(plan), "--to", "+4h", "--config", str(cfg), env={"COLUMNS": "200"})
    assert show.code == 0, show.stderr
    assert "inference" in show.stdout and "█" in show.stdout
    sj = run_cli("plan", "show", str(plan), "--to", "+4h", "--json", "--config", str(cfg)).json
    assert any(seg["gpus"].get("research") == 1 for seg in sj["segments"])
    a = run_cli("plan", "apply", str(plan), "--to", "+4h", "--yes", "--json", "--config", str(cfg))
    assert a.code == 0, a.stderr
    added = a.json["add"]
    assert added and all(e["request_id"].startswith("plan:night:") for e in added)
    installed = _entries(d1) + _entries(d2)
    assert {e["plan"] for e in installed} == {"night"}
    assert len({e["request_id"] for e in installed}) == len(added)
    again = run_cli("plan", "apply", str(plan), "--to", "+4h", "--yes", "--json", "--config", str(cfg))
    assert again.code == 0, again.stderr
    assert again.json["add"] == [] and again.json["cancel"] == {}
    assert sorted(again.json["unchanged"]) == sorted(e["request_id"] for e in added)
    assert _entries(d1) + _entries(d2) == installed


def test_over_commitment_is_named_and_apply_dry_run_installs_nothing(fleet, tmp_path):
    cfg, d1, d2 = fleet
    plan = _plan(tmp_path, gpus_b=3)
    r = run_cli("plan", "check", str(plan), "--to", "+4h", "--config", str(cfg))
    assert r.code == 6
    assert "over-committed at" in r.stderr and "want 5 of 4 GPU-equivalents" in r.stderr
    assert "inference) short by 1" in r.stderr  # research has the better priority
    show = run_cli("plan", "show", str(plan), "--to", "+4h", "--json", "--config", str(cfg))
    assert {"inference": 1.0} in [seg["short_gpus"] for seg in show.json["segments"]]
    dry = run_cli("plan", "apply", str(plan), "--to", "+4h", "--dry-run", "--json", "--config", str(cfg))
    assert dry.code == 0 and dry.json["add"]
    assert _entries(d1) == [] and _entries(d2) == []


def test_bad_plan_is_refused_with_file_line_key_and_nothing_installed(fleet, tmp_path):
    cfg, d1, d2 = fleet
    bad = tmp_path / "bad.toml"
    bad.write_text('[[window]]\ndepartment = "research"\ngpus = 1\nstart = "2026-05-02T00:00"\nend = "2026-05-01T00:00"\n')
    for action in ("check", "show", "apply"):
        r = run_cli("plan", action, str(bad), "--yes", "--config", str(cfg)) if action == "apply" else \
            run_cli("plan", action, str(bad), "--config", str(cfg))
        assert r.code == 3 and f"{bad}:5: window[0].end:" in r.stderr, (action, r.stderr)
    assert _entries(d1) == [] and _entries(d2) == []
