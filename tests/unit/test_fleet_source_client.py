"""FleetSource.fleet_client: each source says which FleetClient reaches its nodes' gpuctld (or
None), and the usage report asks that, never the source's attributes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.config import load_config
from gpuctl.fleet.client import FleetClient
from gpuctl.fleet.prometheus import PrometheusFleetSource
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.fleet.source import FleetSource, LiveFleetSource
from gpuctl.fleet.usage_report import NoUsageSource, gpu_history_from_source, report_from_source


@pytest.fixture
def client(tmp_path: Path):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[node]]\nname = "n1"\ntransport = "local"\nsocket = "{tmp_path}/nobody.sock"\n')
    c = FleetClient(load_config(cfg))
    yield c
    c.close()


def test_each_source_offers_its_client_or_none(client):
    live = LiveFleetSource(client)
    assert live.fleet_client() is client
    assert PrometheusFleetSource("http://127.0.0.1:9", ["n1"], control=live).fleet_client() is client
    assert PrometheusFleetSource("http://127.0.0.1:9", ["n1"]).fleet_client() is None
    sim = SimulatedFleetSource(nodes=1, gpus_per_node=1, history_warmup_samples=0)
    try:
        assert sim.fleet_client() is None
        for source in (live, sim):
            assert isinstance(source, FleetSource)
    finally:
        sim.close()


def test_report_asks_the_offered_client(client):
    """The client the source offers is the one asked (here its node does not answer: the report
    names it), also when the source holds other clients in its attributes."""

    class Offering:
        def __init__(self, offered):
            self.offered, self.asked = offered, 0
            self.client = self.control = client  # what the old attribute walk would have found

        def fleet_client(self):
            self.asked += 1
            return self.offered

    src = Offering(client)
    rep = report_from_source(src, 1_796_000_000, 1_796_003_600)
    assert src.asked == 1 and list(rep["unreachable_nodes"]) == ["n1"] and rep["total"]["incomplete"] is True
    none = Offering(None)
    with pytest.raises(NoUsageSource, match="this fleet source keeps no usage accounting"):
        report_from_source(none, 1_796_000_000, 1_796_003_600)
    with pytest.raises(NoUsageSource, match="this fleet source keeps no usage accounting"):
        gpu_history_from_source(none, "n1", "GPU-x", 1_796_000_000, 1_796_003_600, 3600)
    assert none.asked == 2


def test_simulated_fleet_has_no_usage_accounting():
    sim = SimulatedFleetSource(nodes=1, gpus_per_node=1, history_warmup_samples=0)
    try:
        with pytest.raises(NoUsageSource, match="only gpuctld nodes do"):
            report_from_source(sim, 1_796_000_000, 1_796_003_600)
    finally:
        sim.close()
