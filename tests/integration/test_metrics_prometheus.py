"""gpuctld --metrics-listen: the exposition parsed with prometheus-client's own parser against the
daemon's /v1/status, bad --metrics-listen values, and a real Prometheus server (the Debian
package's /usr/bin/prometheus) scraping two simulated gpuctld, read back by PrometheusFleetSource."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon_proc import start_daemon, uds_client
from gpuctl.fleet.prometheus import PrometheusFleetSource
from sshd import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _metrics(port: int) -> dict[str, list]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _assign(socket_path, dept_by_index: dict[int, str]) -> dict:
    with uds_client(socket_path) as c:
        st = c.get("/v1/status").json()
        moves = [{"slice_id": s["id"], "from": "unassigned", "to": dept_by_index[g["identity"]["index"]]}
                 for g in st["gpus"] for s in g["slices"] if g["identity"]["index"] in dept_by_index]
        c.post("/v1/assign", json={"request_id": "m1", "generation": st["generation"], "leased": "refuse",
                                   "moves": moves}).raise_for_status()
        return c.get("/v1/status").json()


def test_exposition_matches_status(tmp_path):
    port = free_port()
    # one sampling round at start only (interval 600 s): metrics and status show the same round
    d = start_daemon(tmp_path, gpus=3, seed=4, name="m1", interval_s=600,
                     extra_args=["--metrics-listen", f"127.0.0.1:{port}", "--metrics-node", "gpu-a"])
    try:
        st = _assign(d.socket_path, {0: "research", 1: "training"})
        fams = _metrics(port)
    finally:
        d.stop()
    util = {s.labels["gpu"]: s for s in fams["DCGM_FI_DEV_GPU_UTIL"]}
    assert len(util) == 3
    for g in st["gpus"]:
        s = util[g["identity"]["uuid"]]
        assert s.labels["node"] == "gpu-a" and s.labels["index"] == str(g["identity"]["index"])
        assert s.labels["department"] == {0: "research", 1: "training", 2: "unassigned"}[g["identity"]["index"]]
        assert s.value == pytest.approx(g["sample"]["sm_util_pct"])
        fb = next(x for x in fams["DCGM_FI_DEV_FB_USED"] if x.labels["gpu"] == g["identity"]["uuid"])
        assert fb.value == pytest.approx(g["sample"]["memory_used_bytes"] / 2**20)
        used = next(x for x in fams["gpuctl_gpu_memory_used_bytes"] if x.labels["gpu"] == g["identity"]["uuid"])
        assert used.value == g["sample"]["memory_used_bytes"]
        power = [x for x in fams["DCGM_FI_DEV_POWER_USAGE"] if x.labels["gpu"] == g["identity"]["uuid"]]
        # N/A is left out, never exported as zero
        assert (power[0].value == pytest.approx(g["sample"]["power_w"])) if g["sample"]["power_w"] is not None \
            else power == []
    slices = {s.labels["slice"]: s for s in fams["gpuctl_slice_leased"]}
    assert set(slices) == {sl["id"] for g in st["gpus"] for sl in g["slices"]}
    assert all(s.value == 0.0 and s.labels["lease"] == "" for s in slices.values())
    fr = {s.labels["slice"]: (s.labels["department"], s.value) for s in fams["gpuctl_slice_fraction"]}
    assert fr == {sl["id"]: (sl["department"], sl["fraction"]) for g in st["gpus"] for sl in g["slices"]}
    (gen,) = fams["gpuctl_node_generation"]
    assert gen.value == st["generation"]


@pytest.mark.parametrize("value, message", [
    ("9400", "must be ADDR:PORT"),
    ("127.0.0.1:http", "port must be a number"),
    ("127.0.0.1:70000", "port must be 0..65535"),
])
def test_bad_metrics_listen_is_refused(value, message):
    p = subprocess.run([sys.executable, "-m", "gpuctl.daemon", "--backend", "simulated", "--metrics-listen", value],
                       capture_output=True, text=True, timeout=30,
                       env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[2]), "PATH": "/usr/bin"})
    assert p.returncode == 2 and message in p.stderr


def test_metrics_port_in_use_is_a_clear_failure(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        d = start_daemon(tmp_path, gpus=1, name="busy", extra_args=["--metrics-listen", f"127.0.0.1:{port}"],
                         wait=False)
        try:
            assert d.proc.wait(timeout=30) == 1
            assert f"--metrics-listen 127.0.0.1:{port}: cannot listen" in d.stderr_text()
        finally:
            d.stop()


@pytest.fixture
def prometheus_with_two_nodes(tmp_path):
    if not shutil.which(PROMETHEUS):
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    ports = [free_port(), free_port()]
    daemons = [start_daemon(tmp_path, gpus=2, seed=20 + i, name=f"p{i}", interval_s=0.5,
                            extra_args=["--metrics-listen", f"127.0.0.1:{ports[i]}", "--metrics-node", f"gpu-{i}"])
               for i in range(2)]
    prom_port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                   "  - job_name: gpuctld\n    honor_labels: true\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        yield url, daemons
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        for d in daemons:
            d.stop()


def _wait(fn, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (httpx.HTTPError, ValueError, KeyError) as e:  # starting up: 503 "Service Unavailable", not JSON
            last = e
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {last!r}")


def test_real_prometheus_scrapes_two_gpuctld_and_the_console_source_reads_it(prometheus_with_two_nodes):
    url, (d0, d1) = prometheus_with_two_nodes
    st0 = _assign(d0.socket_path, {0: "research", 1: "training"})

    def both_up():
        r = httpx.get(f"{url}/api/v1/query", params={"query": "up"}, timeout=5).json()
        res = r["data"]["result"]
        return len(res) == 2 and all(x["value"][1] == "1" for x in res)

    _wait(both_up)

    def owners_scraped():
        r = httpx.get(f"{url}/api/v1/query",
                      params={"query": 'count by (node, department) (gpuctl_slice_fraction)'}, timeout=5).json()
        got = {(x["metric"]["node"], x["metric"]["department"]): int(x["value"][1]) for x in r["data"]["result"]}
        return got if ("gpu-0", "training") in got else None

    got = _wait(owners_scraped)
    assert got == {("gpu-0", "research"): 1, ("gpu-0", "training"): 1, ("gpu-1", "unassigned"): 2}
    util = httpx.get(f"{url}/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_UTIL"}, timeout=5).json()
    assert {(x["metric"]["node"], x["metric"]["index"]) for x in util["data"]["result"]} == {
        ("gpu-0", "0"), ("gpu-0", "1"), ("gpu-1", "0"), ("gpu-1", "1")}

    src = PrometheusFleetSource(url, ["gpu-0", "gpu-1", "gpu-9"])
    try:
        snap = src.snapshot()
        n0, n1, n9 = snap.nodes
        assert n0.reachable and n1.reachable and not n9.reachable and "gpu-9" in n9.error
        assert [g.uuid for g in n0.gpus] == [g["identity"]["uuid"] for g in st0["gpus"]]
        assert [(s.id, s.department, s.fraction, s.leased) for s in n0.slices()] == [
            (s["id"], s["department"], s["fraction"], False) for g in st0["gpus"] for s in g["slices"]]
        assert n0.generation == st0["generation"] and n0.backend == "simulated"
        for g in n0.gpus + n1.gpus:
            assert g.sample is not None and 0 <= g.sample.sm_util_pct <= 100
            assert g.sample.memory_total_bytes == g.identity.memory_total_bytes > 0
        # history: a range query gives several samples of one GPU, cursor moves on
        uuid = n0.gpus[0].uuid
        cursor, samples = _wait(lambda: (lambda r: r if len(r[1]) >= 3 else None)(src.history("gpu-0", uuid)))
        assert all(s.uuid == uuid for s in samples) and cursor == int(samples[-1].timestamp_s)
        assert [s.timestamp_s for s in samples] == sorted(s.timestamp_s for s in samples)
        # a node whose gpuctld stops is unreachable once Prometheus marks its series stale
        d1.stop()
        _wait(lambda: not src.snapshot().nodes[1].reachable, timeout_s=30)
    finally:
        src.close()


def test_prometheus_down_makes_every_node_unreachable():
    src = PrometheusFleetSource(f"http://127.0.0.1:{free_port()}", ["a", "b"], timeout_s=2)
    try:
        snap = src.snapshot()
    finally:
        src.close()
    assert [n.reachable for n in snap.nodes] == [False, False]
    assert all("Prometheus at http://127.0.0.1:" in n.error for n in snap.nodes)


def test_telemetry_config_and_its_errors(tmp_path):
    from gpuctl.config import ConfigError, TelemetryConfig, load_config, parse_config, render_config
    from gpuctl.fleet.prometheus import source_for

    node = '\n[[node]]\nname = "gpu-0"\nhost = "h0"\n'
    cfg = parse_config(b'[telemetry]\nsource = "prometheus"\nurl = "http://prom:9090"\n' + node.encode(), "f.toml")
    assert cfg.telemetry == TelemetryConfig("prometheus", "http://prom:9090", 5.0)
    assert parse_config(render_config(cfg).encode(), "f.toml") == cfg
    assert parse_config(node.encode(), "f.toml").telemetry.source == "nodes"
    src = source_for(cfg, control=None)
    assert src.url == "http://prom:9090" and src.nodes == ["gpu-0"]
    src.close()
    for text, message in [
        ('[telemetry]\nsource = "prometheus"\n', 'f.toml:1: telemetry: source = "prometheus" needs url'),
        ('[telemetry]\nsource = "graphite"\n', 'f.toml:2: telemetry.source: must be "nodes" or "prometheus"'),
        ('[telemetry]\nsource = "prometheus"\nurl = "prom:9090"\n', "f.toml:3: telemetry.url: must be an http"),
        ('[telemetry]\nsorce = "prometheus"\n', "did you mean 'source'?"),
        ('telemetry = "prometheus"\n', "f.toml:1: telemetry: must be a table [telemetry]"),
    ]:
        with pytest.raises(ConfigError) as e:
            parse_config((text + node).encode(), "f.toml")
        assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("args, message", [
    (["--history", "600"], "--history: not a duration: '600' (add a unit"),
    (["--history", "500d"], "--history: must be more than 0 and at most 400d, got 500d"),
    (["--telemetry-history", "0"], "--telemetry-history: must be > 0"),
])
def test_bad_usage_options_of_gpuctld(args, message):
    p = subprocess.run([sys.executable, "-m", "gpuctl.daemon", "--backend", "simulated", *args],
                       capture_output=True, text=True, timeout=30,
                       env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[2]), "PATH": "/usr/bin"})
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_bad_demo_history_is_refused_before_anything_starts():
    from fleet_fixtures import run_cli

    r = run_cli("demo", "--no-console", "--history", "soon")
    assert r.code == 2 and "--history: not a duration: 'soon'" in r.stderr and r.stdout == ""
    r = run_cli("demo", "--no-console", "--history", "401d")
    assert r.code == 2 and "--history must be more than 0 and at most 400d" in r.stderr
