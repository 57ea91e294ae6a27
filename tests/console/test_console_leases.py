"""The leases screen against a real gpuctld (local socket): full lease ids, release and renew from
the console with confirmation (issue 9 item 7)."""

from __future__ import annotations

import time

import pytest
from textual.widgets import DataTable

from daemon_proc import start_daemon, uds_client
from fleet_fixtures import local_node, write_fleet_config

from gpuctl.config import load_config
from gpuctl.fleet.client import FleetClient
from gpuctl.fleet.reassign import ReassignRequest, new_request_id
from gpuctl.fleet.source import LiveFleetSource
from gpuctl.screens.confirm import ConfirmScreen
from gpuctl.screens.leases import LeasesScreen
from tests.support.console import make_app


@pytest.fixture
def leased(tmp_path):
    """A daemon with one research slice under a native lease: (daemon, source, lease JSON)."""
    d = start_daemon(tmp_path, gpus=2, seed=72, name="n1")
    cfg = tmp_path / "fleet.toml"
    write_fleet_config(cfg, {"n1": local_node(d.socket_path)}, {"research": 10})
    source = LiveFleetSource(FleetClient(load_config(cfg)))
    try:
        with uds_client(d.socket_path) as c:
            sid = sorted(s["id"] for s in c.get("/v1/slices").json()["slices"])[0]
        source.reassign(ReassignRequest(src="unassigned", dst="research", slice_ids=[sid], request_id=new_request_id()))
        with uds_client(d.socket_path) as c:
            r = c.post("/v1/leases", json={"request_id": "r-lease", "department": "research", "owner": "bob@ws7",
                                           "ttl_s": 600, "slice_ids": [sid], "attach": "native"})
            assert r.status_code == 201, r.text
        yield d, source, r.json()["lease"]
    finally:
        source.close()
        d.stop()


def node_leases(d) -> dict[str, dict]:
    with uds_client(d.socket_path) as c:
        return {x["id"]: x for x in c.get("/v1/leases").json()["leases"]}


async def settle(app, pilot):
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


async def confirm(app, pilot, key: str = "y"):
    assert isinstance(app.screen, ConfirmScreen), app.screen
    for _ in range(60):
        if app.screen.armed:
            break
        await pilot.pause(0.05)
    await pilot.press(key)
    await settle(app, pilot)


async def open_leases(app, pilot) -> LeasesScreen:
    await settle(app, pilot)
    app.run_command("leases")
    await settle(app, pilot)
    assert isinstance(app.screen, LeasesScreen)
    return app.screen


def lines(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_lease_ids_are_never_cut(leased, size):
    d, source, lease = leased
    assert len(lease["id"]) == 18  # "lease-" + 12 hex digits
    app = make_app(source)
    async with app.run_test(size=size) as pilot:
        screen = await open_leases(app, pilot)
        table = screen.query_one(DataTable)
        assert str(table.get_cell(lease["id"], "id")).strip() == lease["id"]
        assert any(lease["id"] in line for line in lines(app))


async def test_renew_then_release_from_the_console_after_confirmation(leased):
    d, source, lease = leased
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_leases(app, pilot)
        before = node_leases(d)[lease["id"]]["expires_s"]
        time.sleep(1.1)
        await pilot.press("e")
        await confirm(app, pilot, "n")  # cancelled: nothing renewed
        assert node_leases(d)[lease["id"]]["expires_s"] == before
        await pilot.press("e")
        await confirm(app, pilot)
        assert node_leases(d)[lease["id"]]["expires_s"] > before
        assert any(m.startswith(f"renewed {lease['id']} on n1: expires ") for m in app.flash_log)
        await pilot.press("x")
        assert "Release lease" in app.screen.title_text and "bob@ws7" in app.screen.text
        await confirm(app, pilot)
        assert lease["id"] not in node_leases(d)
        assert f"released {lease['id']} on n1: 1 slice free" in app.flash_log
        assert not app.screen.query_one(DataTable).row_count


async def test_release_of_a_lease_gone_meanwhile_says_so(leased):
    d, source, lease = leased
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_leases(app, pilot)
        with uds_client(d.socket_path) as c:
            assert c.delete(f"/v1/leases/{lease['id']}").status_code == 200
        await pilot.press("x")
        await confirm(app, pilot)
        assert any(m.startswith(f"release {lease['id']} on n1 failed: ") for m in app.flash_log), app.flash_log
        assert node_leases(d) == {}


async def test_readonly_offers_no_release_or_renew(leased):
    d, source, lease = leased
    app = make_app(source, readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_leases(app, pilot)
        shown = {a.binding.action for a in app.active_bindings.values() if a.binding.show and a.enabled}
        assert not {"release", "renew"} & shown
        await pilot.press("x")
        await pilot.press("e")
        await settle(app, pilot)
        assert app.screen is screen
        assert lease["id"] in node_leases(d)
