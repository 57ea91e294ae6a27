"""Fleet scale benchmark (issue 15 item 6): N simulated nodes behind one real sshd, and local.

    python bench/fleet_scale.py                          # N = 1, 8, 64, 256; 3 runs each
    python bench/fleet_scale.py --nodes 1 8 64 --runs 3 --json

What runs: max(N) real `gpuctld --backend simulated --gpus 8` processes (telemetry every
--interval-s, default 5 s, to keep 256 of them light), one real OpenSSH sshd on 127.0.0.1
(tests/sshd.py: its own host key, user key and known_hosts; every node is the same sshd, reached
with its own SSH connection and handshake, as separate hosts would be). For each N the first N
daemons make the fleet, in two configs: transport "ssh" (host test-sshd, socket = the daemon's)
and "local" (the Unix sockets directly). max_parallel 16, timeout_s 5 s, as shipped.

Measured, each a fresh `python -m gpuctl.cli` process (wall time, median of --runs):
  status      `gpuctl status --json`: also how many nodes answered (target: all, at every N)
  status-bridge  the same over SSH with GPUCTL_SSH_CHANNELS=bridge: the old node side, as a baseline
  status-cached  the same over SSH with GPUCTL_SSH_CACHE (the connection cache): the first run starts
              the cache and makes the handshakes, the others (median of runs 2..) reuse them
  reassign    `gpuctl reassign --from A --to B --gpus G --yes --json` moving every GPU of the fleet
              (so every node is touched), alternately unassigned -> research and back
In-process (this process, gpuctl.fleet.client.FleetClient kept open like the console's):
  poll        FleetClient.snapshot() on an open fleet: the console's poll of N nodes (median of --runs)
  node side   per channel kind (streamlocal, relay, bridge): seconds from asking for a new control
              channel on an open SSH connection to the channel being joined to the daemon
              (SshTransport.channel_open_s; median of 10): the node side of a command
And `bench/console.py --nodes 512 --no-baseline` (a child process): the console's UI tick at
4096 GPUs on the in-process simulated source (target p95 < 50 ms).
Ratios: status over SSH at N / at N = 1 (target at 64: <= 2x). With each status run also the
CLI's CPU seconds (getrusage of children) and sshd's (its per-connection children's CPU,
/proc/PID/stat cutime + cstime): client and server share this machine's CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests" / "support"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from sshd import Node, SshServer  # noqa: E402

from gpuctl.transport.uds_http import uds_client  # noqa: E402

GPUS = 8


def start_daemons(root: Path, n: int, interval_s: float) -> list[tuple[subprocess.Popen, Path]]:
    """Start n simulated gpuctld (8 GPUs) under root; wait for each socket's /v1/health."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    for k in range(n):
        d = root / f"n{k:03d}"
        d.mkdir(parents=True)
        sock = d / "s"
        log = open(d / "log", "wb")
        p = subprocess.Popen([sys.executable, "-m", "gpuctl.daemon", "serve", "--backend", "simulated",
                              "--gpus", str(GPUS), "--seed", str(k + 1), "--state-dir", str(d / "state"),
                              "--socket", str(sock), "--interval", str(interval_s)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        log.close()
        procs.append((p, sock))
    deadline = time.monotonic() + 60 + n
    for p, sock in procs:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"gpuctld {sock} exited with {p.returncode}")
            if sock.exists():
                try:
                    with uds_client(str(sock), 2.0) as c:
                        if c.get("/v1/health").status_code == 200:
                            break
                except Exception:  # noqa: BLE001 - not up yet
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gpuctld {sock} did not start")
            time.sleep(0.05)
    return procs


def write_config(path: Path, socks: list[Path], transport: str) -> None:
    lines = ["max_parallel = 16", "", "[[department]]", 'name = "research"', "priority = 1", ""]
    for k, sock in enumerate(socks):
        lines += ["[[node]]", f'name = "n{k:03d}"', f'transport = "{transport}"', f'socket = "{sock}"',
                  "timeout_s = 5.0"]
        if transport == "ssh":
            lines += ['host = "test-sshd"', f'gpuctld = "{sys.executable} -m gpuctl.daemon"']
        lines.append("")
    path.write_text("\n".join(lines))


#: The last cli() call's client CPU seconds (user + system of the CLI process: getrusage of children).
LAST_CLIENT_CPU_S = [0.0]


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sshd_children_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) of the exited children of sshd `pid` (its per-connection
    processes, reaped by the listener): /proc/PID/stat cutime + cstime. None when unreadable."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cli(args: list[str], env: dict[str, str] | None = None, timeout_s: float = 600) -> tuple[float, int, str, str]:
    """(wall seconds, exit status, stdout, stderr) of one `python -m gpuctl.cli ARGS`; its CPU
    seconds in LAST_CLIENT_CPU_S[0]."""
    full = dict(os.environ, PYTHONPATH=str(ROOT), SSH_AUTH_SOCK="", **(env or {}))
    c0 = _children_cpu_s()
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gpuctl.cli", *args], capture_output=True, text=True, env=full,
                       timeout=timeout_s, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    LAST_CLIENT_CPU_S[0] = _children_cpu_s() - c0
    return wall, p.returncode, p.stdout, p.stderr


def measure_status(base: list[str], runs: int, env: dict[str, str] | None = None, sshd_pid: int | None = None) -> dict:
    """`status --json` `runs` times: wall (median), nodes answered, exit codes, the CLI's CPU
    seconds (median) and, with sshd_pid, sshd's CPU seconds for the run's connections (median;
    read 0.3 s after the CLI exits, once sshd has reaped its children)."""
    times, answered, codes, client_cpu, server_cpu = [], [], [], [], []
    for _ in range(runs):
        s0 = sshd_children_cpu_s(sshd_pid)
        wall, rc, out, err = cli([*base, "status", "--json"], env)
        codes.append(rc)
        times.append(wall)
        client_cpu.append(LAST_CLIENT_CPU_S[0])
        if s0 is not None:
            time.sleep(0.3)
            s1 = sshd_children_cpu_s(sshd_pid)
            if s1 is not None:
                server_cpu.append(s1 - s0)
        try:
            answered.append(sum(1 for n in json.loads(out)["nodes"] if n["reachable"]))
        except (ValueError, KeyError):
            answered.append(0)
    res = {"median_s": round(statistics.median(times), 3), "runs_s": [round(t, 3) for t in times],
           "answered_min": min(answered), "exit_codes": codes,
           "client_cpu_s_median": round(statistics.median(client_cpu), 3)}
    if server_cpu:
        res["sshd_cpu_s_median"] = round(statistics.median(server_cpu), 3)
    return res


def measure_cached(base: list[str], runs: int, runtime: Path) -> dict:
    """status --json through the SSH connection cache (its own runtime dir); stops the cache after."""
    from gpuctl.transport.conncache import cache_stats

    runtime.mkdir(mode=0o700)
    res = measure_status(base, runs, {"GPUCTL_SSH_CACHE": "120", "XDG_RUNTIME_DIR": str(runtime)})
    sock = str(runtime / "gpuctl" / "ssh-cache.sock")
    try:
        stats = cache_stats(sock)
        os.kill(stats["pid"], 15)
        res["cache_connections_opened"] = stats["connections_opened"]
    except OSError as exc:
        res["cache_error"] = str(exc)
    res["first_s"] = res["runs_s"][0]
    res["median_s"] = round(statistics.median(res["runs_s"][1:]), 3) if len(res["runs_s"]) > 1 else res["first_s"]
    return res


def measure_reassign(base: list[str], n: int, runs: int) -> dict:
    times, codes = [], []
    src, dst = "unassigned", "research"
    for _ in range(runs):
        wall, rc, out, err = cli([*base, "reassign", "--from", src, "--to", dst, "--gpus", str(n * GPUS),
                                  "--yes", "--json"])
        times.append(wall)
        codes.append(rc)
        if rc != 0:
            print(f"    reassign exit {rc}: {err.strip()[-300:]}", file=sys.stderr)
        src, dst = dst, src
    return {"median_s": round(statistics.median(times), 3), "runs_s": [round(t, 3) for t in times],
            "exit_codes": codes}


def measure_poll(config_path: Path, sshd: SshServer | None, runs: int) -> dict:
    from gpuctl.fleet.client import FleetClient, default_transport_factory
    from gpuctl.config import load_config

    opts = {}
    if sshd is not None:
        opts = dict(ssh_config_path=str(sshd.ssh_config), known_hosts_path=str(sshd.known_hosts), use_agent=False)
    fleet = FleetClient(load_config(config_path), default_transport_factory(**opts))
    try:
        t0 = time.perf_counter()
        first = fleet.snapshot()
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            snap = fleet.snapshot()
            times.append(time.perf_counter() - t0)
        return {"first_s": round(first_s, 3), "median_s": round(statistics.median(times), 4),
                "answered_first": sum(n.reachable for n in first.nodes),
                "answered": sum(n.reachable for n in snap.nodes)}
    finally:
        fleet.close()


def measure_node_side(sshd: SshServer, sock: Path) -> dict:
    from gpuctl.transport import open_transport

    out = {}
    for kind in ("streamlocal", "relay", "bridge"):
        node = Node(name="n000", host="test-sshd", socket=str(sock))
        t = open_transport(node, ssh_config_path=str(sshd.ssh_config), known_hosts_path=str(sshd.known_hosts),
                           use_agent=False, channel_kinds=(kind,))
        try:
            t0 = time.perf_counter()
            t.connect()
            handshake_s = time.perf_counter() - t0
            xs = []
            for _ in range(10):
                ch = t._open_bridge_channel()
                xs.append(t.channel_open_s)
                ch.close()
            client = t.http_client()
            client.get("/v1/health")
            t0 = time.perf_counter()
            for _ in range(20):
                client.get("/v1/health")
            request_ms = (time.perf_counter() - t0) / 20 * 1000
        finally:
            t.close()
        out[kind] = {"channel_open_ms_median": round(statistics.median(xs) * 1000, 2),
                     "channel_open_ms_max": round(max(xs) * 1000, 2),
                     "handshake_ms": round(handshake_s * 1000, 1),
                     "request_ms_kept_alive": round(request_ms, 2)}
    return out


def console_tick(seconds: float) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "console.py"), "--nodes", "512", "--seconds",
                        str(seconds), "--no-baseline", "--json"], capture_output=True, text=True, timeout=seconds + 600)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    f = json.loads(p.stdout)["fleet"]
    return {"gpus": f["gpus"], "tick_ms_median": f["tick_ms_median"], "tick_ms_p95": f["tick_ms_p95"],
            "polls": f["polls"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--interval-s", type=float, default=5.0, help="the daemons' telemetry interval")
    ap.add_argument("--console-seconds", type=float, default=20.0, help="UI tick window at 4096 GPUs (0: skip)")
    ap.add_argument("--no-bridge-baseline", action="store_true", help="skip status over SSH via the bridge")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if min(a.nodes) < 1 or a.runs < 1:
        ap.error("--nodes and --runs must be >= 1")
    sizes = sorted(set(a.nodes))
    root = Path(tempfile.mkdtemp(prefix="gpuctl-scale-", dir="/tmp"))
    results: dict = {"command": "python bench/fleet_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "machine": f"{platform.node()}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start, "
                                f"Python {platform.python_version()}", "sizes": {}}
    procs = []
    try:
        t0 = time.monotonic()
        procs = start_daemons(root, max(sizes), a.interval_s)
        print(f"started {len(procs)} gpuctld in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        socks = [s for _, s in procs]
        with SshServer(session_env={"PYTHONPATH": str(ROOT)},
                       extra_config="MaxStartups 100:30:200\n") as sshd:
            ssh_opts = ["--ssh-config", str(sshd.ssh_config), "--known-hosts", str(sshd.known_hosts)]
            results["node_side"] = measure_node_side(sshd, socks[0])
            print(f"node side: {results['node_side']}", file=sys.stderr)
            for n in sizes:
                r: dict = {}
                for transport in ("ssh", "local"):
                    cfg = root / f"fleet-{transport}-{n}.toml"
                    write_config(cfg, socks[:n], transport)
                    base = ["--config", str(cfg), *(ssh_opts if transport == "ssh" else [])]
                    r[f"status_{transport}"] = measure_status(
                        base, a.runs, sshd_pid=sshd.proc.pid if transport == "ssh" else None)
                    if transport == "ssh" and not a.no_bridge_baseline:
                        r["status_ssh_bridge"] = measure_status(base, a.runs, {"GPUCTL_SSH_CHANNELS": "bridge"})
                    if transport == "ssh":
                        r["status_ssh_cached"] = measure_cached(base, a.runs + 1, root / f"run-{n}")
                    r[f"poll_{transport}"] = measure_poll(cfg, sshd if transport == "ssh" else None, a.runs)
                    r[f"reassign_{transport}"] = measure_reassign(base, n, 2)
                results["sizes"][str(n)] = r
                print(f"N={n}: {json.dumps(r)}", file=sys.stderr)
        if a.console_seconds > 0:
            results["console_tick_4096_gpus"] = console_tick(a.console_seconds)
    finally:
        for p, _ in procs:
            p.terminate()
        for p, _ in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)
    one = results["sizes"].get(str(sizes[0]), {})
    for n, r in results["sizes"].items():
        for key in ("status_ssh", "status_local"):
            r[key]["ratio_vs_smallest"] = round(r[key]["median_s"] / one[key]["median_s"], 2)
    results["loadavg_end"] = round(os.getloadavg()[0], 1)
    if a.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"fleet scale: {results['machine']}, load at end {results['loadavg_end']}")
    for kind, v in results["node_side"].items():
        print(f"  node side {kind:11}: channel open {v['channel_open_ms_median']:7.2f} ms median "
              f"(max {v['channel_open_ms_max']:.1f}), SSH handshake {v['handshake_ms']:.0f} ms, "
              f"request on a kept channel {v['request_ms_kept_alive']:.2f} ms")
    print(f"  {'N':>4} {'status ssh':>11} {'x N=' + str(sizes[0]):>7} {'answered':>9} {'via bridge':>11} {'cached':>8} "
          f"{'status local':>13} {'x':>6} {'poll ssh':>9} {'poll local':>11} {'reassign ssh':>13} {'reassign local':>15}")
    for n, r in results["sizes"].items():
        br = r.get("status_ssh_bridge", {}).get("median_s")
        print(f"  {n:>4} {r['status_ssh']['median_s']:>10.2f}s {r['status_ssh']['ratio_vs_smallest']:>6.2f}x "
              f"{r['status_ssh']['answered_min']:>4}/{n:<4} {(f'{br:.2f}s' if br else '-'):>11} "
              f"{r['status_ssh_cached']['median_s']:>7.2f}s "
              f"{r['status_local']['median_s']:>12.2f}s {r['status_local']['ratio_vs_smallest']:>5.2f}x "
              f"{r['poll_ssh']['median_s']:>8.3f}s {r['poll_local']['median_s']:>10.3f}s "
              f"{r['reassign_ssh']['median_s']:>12.2f}s {r['reassign_local']['median_s']:>14.2f}s")
    cores = os.cpu_count() or 1
    for n, r in results["sizes"].items():
        st = r["status_ssh"]
        if "sshd_cpu_s_median" in st:
            cpu = st["client_cpu_s_median"] + st["sshd_cpu_s_median"]
            print(f"  N={n}: status over SSH used {st['client_cpu_s_median']:.2f} s client CPU + "
                  f"{st['sshd_cpu_s_median']:.2f} s sshd CPU (both on this machine: >= {cpu / cores:.2f} s of wall "
                  f"on {cores} CPUs even perfectly parallel)")
    ct = results.get("console_tick_4096_gpus")
    if ct and "error" not in ct:
        print(f"  console UI tick at {ct['gpus']} GPUs (simulated source): median {ct['tick_ms_median']} ms, "
              f"p95 {ct['tick_ms_p95']} ms (target < 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
