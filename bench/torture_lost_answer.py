"""Reliability loop: lost answers during reassignments, and re-runs with the same request id.

    python bench/torture_lost_answer.py                    # 60 s, prints counts as JSON
    python bench/torture_lost_answer.py --duration-s 300 --seed 7

bench/torture.py (the kill -9, conflicting-admins and connection-abuse loops) imports
`lost_answer_loop` from here when present; this file also runs on its own.

What runs: three real `gpuctld --backend simulated` daemons (tests/daemon_proc.py) n1, n2, n3;
n3 is reached through a LossyProxy (tests/support/lossy_proxy.py) and has timeout_s = 1 s. Before each
round, research owns 1 slice on n1, 1 on n2 and 2 on n3 (so `--count 2` is planned on n3 alone).
Each round asks for `reassign --from research --to training --count 2` with a fresh request id,
through the library the CLI uses (gpuctl.fleet.reassign.prepare/execute), with one fault on n3 drawn at
random: none, the answer lost, the answer delayed past the timeout, the request lost, or n3's
daemon frozen (SIGSTOP) mid-request and continued after the client gave up. Then it re-runs the
same request id until it is settled (exit 0), and in half of the rounds first re-runs once while
n3 is down (which must refuse with UNREACHABLE and move nothing).

Counts printed: rounds; fault_<kind> (rounds per fault drawn); lost (rounds whose first run had an
unknown outcome); reruns_while_down and refused_while_down (re-runs while n3 was down, and those
refused with exit 7 and nothing moved: the two must be equal);
moved_while_down (re-runs that moved something while n3 was down: must be 0); doubled (rounds
that ended with more than 2 slices moved); short (fewer than 2 after settling); late_refused and
late_applied (the thawed daemon's answer to the frozen request: 409 deadline_passed, or 200, which
must be 0 since the proxy forwards the request only once every thread of the daemon is stopped);
reruns; seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from daemon_proc import start_daemon, uds_client  # noqa: E402
from lossy_proxy import LossyProxy  # noqa: E402

from gpuctl.fleet.client import FleetClient  # noqa: E402
from gpuctl.config import load_config  # noqa: E402
from gpuctl.exit_codes import ExitCode  # noqa: E402
from gpuctl.fleet.reassign import ReassignRequest, execute, prepare  # noqa: E402

FAULT_CHOICES = ("none", "lose_answer", "delay_answer", "lose_request", "freeze")
N3_TIMEOUT_S = 1.0
OWNED = {"n1": 1, "n2": 1, "n3": 2}

CONFIG = """
[[department]]
name = "research"

[[department]]
name = "training"
""" + "".join(f"""
[[node]]
name = "{n}"
transport = "local"
socket = "{{{n}}}"
timeout_s = {{t_{n}}}
""" for n in OWNED)


def _reset(sockets: dict[str, str], round_no: int) -> None:
    """Give each node's slices back: OWNED[n] to research, the rest unassigned (straight through the API)."""
    for name, sock in sockets.items():
        with uds_client(sock, timeout_s=10) as c:
            st = c.get("/v1/slices").json()
            slices = sorted(st["slices"], key=lambda s: s["id"])
            moves = []
            for i, s in enumerate(slices):
                want = "research" if i < OWNED[name] else "unassigned"
                if s["department"] != want:
                    moves.append({"slice_id": s["id"], "from": s["department"], "to": want})
            if moves:
                r = c.post("/v1/assign", json={"request_id": f"reset-{round_no}-{name}",
                                               "generation": st["generation"], "moves": moves})
                if r.status_code != 200:
                    raise RuntimeError(f"reset of {name} failed: {r.text}")


def _training(sockets: dict[str, str]) -> int:
    total = 0
    for sock in sockets.values():
        with uds_client(sock, timeout_s=10) as c:
            total += sum(1 for s in c.get("/v1/slices").json()["slices"] if s["department"] == "training")
    return total


def _run(cfg_path: Path, rid: str):
    fleet = FleetClient(load_config(cfg_path))
    try:
        req = ReassignRequest(src="research", dst="training", count=2, request_id=rid)
        return execute(fleet, prepare(fleet, req))
    finally:
        fleet.close()


def lost_answer_loop(duration_s: float = 60.0, *, seed: int = 0, work_dir: Path | None = None,
                     log=None) -> dict[str, float | int]:
    """Run lost-answer rounds for about `duration_s` seconds (a round in flight finishes); returns the
    counts described in this module's docstring. Starts and stops its own daemons and proxy."""
    rng = random.Random(seed)
    own_dir = work_dir is None
    base = Path(tempfile.mkdtemp(prefix="gpuctl-lost-", dir="/tmp")) if work_dir is None else Path(work_dir)
    daemons = {n: start_daemon(base, gpus=2, seed=40 + i, name=n) for i, n in enumerate(OWNED)}
    proxy = LossyProxy(base / "n3-proxy.sock", daemons["n3"].socket_path, daemon_pid=daemons["n3"].pid).up()
    sockets = {n: str(d.socket_path) for n, d in daemons.items()}
    cfg_path = base / "fleet.toml"
    cfg_path.write_text(CONFIG.format(n1=sockets["n1"], n2=sockets["n2"], n3=proxy.socket_path,
                                      t_n1=5, t_n2=5, t_n3=N3_TIMEOUT_S))
    counts = {"rounds": 0, "lost": 0, "reruns_while_down": 0, "refused_while_down": 0, "moved_while_down": 0,
              "doubled": 0, "short": 0, "late_refused": 0, "late_applied": 0, "reruns": 0,
              **{f"fault_{f}": 0 for f in FAULT_CHOICES}}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < duration_s:
            n = counts["rounds"]
            _reset(sockets, n)
            fault = rng.choice(FAULT_CHOICES)
            counts[f"fault_{fault}"] += 1
            if fault != "none":
                proxy.arm(fault, delay_s=N3_TIMEOUT_S + 2.0)
            late_before = len(proxy.late_answers)
            rid = f"torture-{seed}-{n}"
            first = _run(cfg_path, rid)
            if first.unknown:
                counts["lost"] += 1
            proxy.thaw()
            if fault == "freeze":
                wait_until = time.monotonic() + 5
                while len(proxy.late_answers) == late_before and time.monotonic() < wait_until:
                    time.sleep(0.05)
                time.sleep(0.05)  # the rest of the answer, if it came in two reads
                late = b"".join(proxy.late_answers[late_before:])
                if log:
                    log(f"late answer: {late[:60]!r}")
                if b"deadline_passed" in late:
                    counts["late_refused"] += 1
                elif late.startswith(b"HTTP/1.1 200"):
                    counts["late_applied"] += 1
            if rng.random() < 0.5:
                proxy.down()
                down = _run(cfg_path, rid)
                counts["reruns"] += 1
                counts["reruns_while_down"] += 1
                if down.exit_code == ExitCode.UNREACHABLE and not down.moved:
                    counts["refused_while_down"] += 1
                if down.moved or down.pending:
                    counts["moved_while_down"] += 1
                proxy.up()
            for _ in range(10):
                result = _run(cfg_path, rid)
                counts["reruns"] += 1
                if result.exit_code == ExitCode.OK:
                    break
                time.sleep(0.2)
            moved = _training(sockets)
            if moved > 2:
                counts["doubled"] += 1
            elif moved < 2:
                counts["short"] += 1
            if fault == "delay_answer":  # let its held answer come out now, not in a later round's window
                wait_until = time.monotonic() + N3_TIMEOUT_S + 4.0
                while len(proxy.late_answers) == late_before and time.monotonic() < wait_until:
                    time.sleep(0.05)
            counts["rounds"] += 1
            if log:
                log(f"round {n}: fault {fault}, first exit {int(first.exit_code)}, training {moved}")
    finally:
        proxy.close()
        for d in daemons.values():
            d.stop()
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)
    counts["seconds"] = round(time.monotonic() - t0, 1)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=60.0, help="how long to loop (default 60)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault choices (default 0)")
    ap.add_argument("--verbose", action="store_true", help="one line per round on stderr")
    args = ap.parse_args(argv)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
    counts = lost_answer_loop(args.duration_s, seed=args.seed, log=log)
    print(json.dumps(counts, indent=2))
    bad = counts["doubled"] + counts["short"] + counts["moved_while_down"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
