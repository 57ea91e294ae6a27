"""Issue 12's acceptance, as written: `gpuctl demo --no-console --write-config F`, then
`gpuctl schedule add --at +5s --from unassigned --to research --count 1 --yes`, then no gpuctl
process for 10 s, then `gpuctl status --json` shows the slice with research and `gpuctl audit
--json` lists the move with its who and request id. (Real time: this test waits 10 s.)"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import time

from daemon_proc import REPO_ROOT
from fleet_fixtures import run_cli


def test_done_when_schedule_runs_on_the_demo_fleet_with_no_gpuctl_running(tmp_path):
    cfg = tmp_path / "demo.toml"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    demo = subprocess.Popen([sys.executable, "-m", "gpuctl.cli", "demo", "--no-console", "--write-config", str(cfg)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while not cfg.exists() and time.monotonic() < deadline and demo.poll() is None:
            time.sleep(0.1)
        assert cfg.exists(), demo.stderr.read().decode() if demo.poll() is not None else "no config written"
        time.sleep(0.5)  # the file is written in one go; let the demo finish its layout
        r = run_cli("schedule", "add", "--at", "+5s", "--from", "unassigned", "--to", "research", "--count", "1",
                    "--yes", "--json", "--config", str(cfg))
        assert r.code == 0, r.stderr
        (node,) = r.json["nodes"]
        (sid,) = r.json["nodes"][node]["slice_ids"]
        rid = r.json["request_id"]
        time.sleep(10)  # no gpuctl process runs now
        st = run_cli("status", "--json", "--config", str(cfg))
        assert st.code == 0, st.stderr
        owner = {s["id"]: s["department"] for n in st.json["nodes"] if n["name"] == node
                 for g in n["gpus"] for s in g["slices"]}
        assert owner[sid] == "research"
        au = run_cli("audit", "--json", "--config", str(cfg))
        assert au.code == 0, au.stderr
        (move,) = [x for x in au.json["records"] if x.get("request_id") == rid and x.get("moved")]
        assert move["node_name"] == node
        assert move["moved"] == [{"slice_id": sid, "from": "unassigned", "to": "research"}]
        assert move["who"]["internal"] == "schedule"
        assert move["who"]["scheduled_by"]["ssh_user"] == getpass.getuser()
        assert move["who"]["scheduled_by"]["reported"].startswith(getpass.getuser() + "@")
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(10)
