"""Issue 17 item 4: ResNet-50 DDP training images/s, launched by `gpuctl run --native` vs by hand.

    python bench/ddp.py --gpus 1 --out $OUT/ddp.json     # one GPU: the single-GPU NCCL path
    python bench/ddp.py --gpus 2 --out $OUT/ddp.json     # a machine of 2+ GPUs: the 2-GPU figure
    python bench/ddp.py --backend simulated --gpus 2     # CPU plumbing check (gloo, a tiny model)

One run, one machine, the same GPUs both ways. The script starts its own gpuctld (``--backend
nvml``, state and socket in a temporary directory), writes a fleet config reaching it
(``transport = "local"``) and gives the node's GPUs whole to department ``bench``. Then it asks
gpuctl for the placement (``gpuctl run --native --gpus K --per-node K --dry-run --json``: the GPUs
the job gets, NVLink first) and alternates, ``--rounds`` times each:

- by hand: ``CUDA_VISIBLE_DEVICES=<those GPU UUIDs> python -m torch.distributed.run --nnodes 1
  --nproc-per-node K --master-addr 127.0.0.1 --master-port P bench/ddp.py --worker ...``;
- through gpuctl: ``gpuctl run --native --dept bench --gpus K --per-node K -- python -m
  torch.distributed.run bench/ddp.py --worker ...`` (no torchrun flags: NNODES, NPROC_PER_NODE,
  MASTER_ADDR/PORT come from gpuctl's environment; ``--per-node`` makes even K = 1 a job).

The worker (this file, ``--worker``) trains torchvision ResNet-50 under DistributedDataParallel
(NCCL; synthetic ImageNet-size data, SGD with momentum, cudnn.benchmark, fp32, ``--batch`` per
GPU): ``--warmup-steps`` untimed, a barrier, then ``--seconds`` timed, a barrier; rank 0 prints
one JSON line: images/s of the whole job = batch x steps x world size / elapsed. The figure is the
median of gpuctl's rounds / the median of the hand rounds; the target is >= 0.98.

Needs on the node: torch, torchvision, numpy, and gpuctl's own dependencies (httpx, paramiko,
nvidia-ml-py, rich, ...; install their wheels first). Prints a table; writes JSON with every
round's figure, the placement and the gpuctld log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "bench") not in sys.path:  # bench/_gpuctld.py, also when loaded by file path
    sys.path.insert(0, str(REPO / "bench"))

from _gpuctld import LocalGpuctld  # noqa: E402

DEPT = "bench"


# ---------------------------------------------------------------------------- the worker (torch only)


def worker(args: argparse.Namespace) -> None:
    """One DDP rank (started by torchrun): train, then rank 0 prints the job's images/s as JSON."""
    import torch
    import torch.distributed as dist

    cpu = args.backend == "simulated"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group("gloo" if cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cpu:
        dev = torch.device("cpu")
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.LazyLinear(1000))
        size = 32
    else:
        import torchvision

        torch.cuda.set_device(local_rank)
        torch.backends.cudnn.benchmark = True
        dev = torch.device("cuda", local_rank)
        model = torchvision.models.resnet50()
        size = 224
    x = torch.randn(args.batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    model = model.to(dev)
    model(x)  # materialise lazy modules before DDP
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if cpu else [local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()

    def sync() -> None:
        if not cpu:
            torch.cuda.synchronize()
        dist.barrier()

    for _ in range(args.warmup_steps):
        step()
    sync()
    steps = 0
    t0 = time.perf_counter()
    done = torch.zeros(1, device=dev)
    while True:
        step()
        steps += 1
        if steps % 5 == 0:  # every rank stops at the same step: rank 0's clock decides
            done.fill_(1.0 if rank == 0 and time.perf_counter() - t0 >= args.seconds else 0.0)
            dist.broadcast(done, 0)
            if done.item():
                break
    sync()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"images_per_s": args.batch * steps * world / elapsed, "steps": steps, "world": world,
                          "seconds": elapsed, "batch_per_gpu": args.batch,
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                          "nccl": None if cpu else ".".join(map(str, torch.cuda.nccl.version()))}), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- the driver


class Node(LocalGpuctld):
    """A gpuctld of our own on this machine (`gpus` simulated GPUs on the simulated backend), and
    the fleet config that reaches it."""

    def __init__(self, tmp: Path, backend: str, gpus: int):
        super().__init__(tmp, backend, ["--gpus", str(gpus)] if backend == "simulated" else [])

    def give_all(self) -> list[str]:
        """Give every whole GPU of the node to DEPT; returns the GPU UUIDs."""
        with self.client() as c:
            st = c.get("/v1/status").json()
            slices = c.get("/v1/slices").json()["slices"]
            moves = [{"slice_id": s["id"], "from": s["department"], "to": DEPT} for s in slices
                     if s["department"] != DEPT]
            if moves:
                r = c.post("/v1/assign", json={"request_id": f"give-{time.time()}", "generation": st["generation"],
                                               "moves": moves})
                if r.status_code != 200:
                    raise SystemExit(f"assign to {DEPT}: {r.text}")
            return [g["identity"]["uuid"] for g in st["gpus"]]

    def gpuctl(self, *argv: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuctl.cli", "--config", str(self.config), *argv],
                              capture_output=True, text=True, env=self.env, timeout=timeout_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _figure(stdout: str) -> dict[str, Any] | None:
    """The worker's JSON line (gpuctl prefixes it with ``[node] ``)."""
    for line in reversed(stdout.splitlines()):
        if '"images_per_s"' in line:
            return json.loads(line[line.index("{"):])
    return None


def worker_argv(args: argparse.Namespace) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", "--backend", args.backend, "--batch", str(args.batch),
            "--seconds", str(args.seconds), "--warmup-steps", str(args.warmup_steps)]


def by_hand(node: Node, uuids: list[str], args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    env = {k: v for k, v in node.env.items() if not k.startswith(("PET_", "CUDA_MPS_"))}
    env.update(CUDA_VISIBLE_DEVICES=",".join(uuids), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
                        "--nproc-per-node", str(args.gpus), "--master-addr", "127.0.0.1", "--master-port",
                        str(_free_port()), *worker_argv(args)], capture_output=True, text=True, env=env, timeout=900)
    return _figure(p.stdout), f"exit {p.returncode}\n{p.stderr[-3000:]}"


def through_gpuctl(node: Node, args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    p = node.gpuctl("run", "--native", "--dept", DEPT, "--gpus", str(args.gpus), "--per-node", str(args.gpus),
                    "--ttl", "60", "--", sys.executable, "-m", "torch.distributed.run", *worker_argv(args))
    return _figure(p.stdout), f"exit {p.returncode}\n{p.stderr[-3000:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=("nvml", "simulated"), default="nvml",
                    help="simulated: check this script's plumbing on a CPU machine (gloo, a tiny model)")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs of the job, all on this node (default 2)")
    ap.add_argument("--batch", type=int, default=64, help="batch per GPU (default 64)")
    ap.add_argument("--seconds", type=float, default=30.0, help="timed training per round, seconds (default 30)")
    ap.add_argument("--warmup-steps", type=int, default=15, help="untimed steps first (default 15)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each launch, alternated (default 2)")
    ap.add_argument("--out", default=None, help="JSON file (default bench/ddp.json)")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    out = Path(args.out or REPO / "bench" / "ddp.json")
    res: dict[str, Any] = {"command": " ".join([sys.executable, *sys.argv]), "host": platform.node(),
                           "gpus": args.gpus, "started_s": time.time(), "rounds": [], "errors": []}
    try:
        import torch

        res["torch"] = torch.__version__
        if args.backend == "nvml":
            import torchvision

            res.update(torchvision=torchvision.__version__, gpu_name=torch.cuda.get_device_name(0),
                       cuda_device_count=torch.cuda.device_count())
    except Exception as e:  # noqa: BLE001 - recorded; the workers will say more
        res["errors"].append(f"import: {type(e).__name__}: {e}")
    tmp = Path(tempfile.mkdtemp(prefix="gpuctl-ddp-"))
    node = Node(tmp, args.backend, args.gpus)
    try:
        res["node_gpus"] = node.give_all()
        dry = node.gpuctl("run", "--native", "--dept", DEPT, "--gpus", str(args.gpus), "--per-node", str(args.gpus),
                          "--dry-run", "--json")
        if dry.returncode != 0:
            raise SystemExit(f"placement: exit {dry.returncode}: {dry.stderr}")
        res["placement"] = json.loads(dry.stdout)
        uuids = res["placement"]["nodes"][0]["gpu_uuids"]
        for r in range(args.rounds):
            for how, fn in (("hand", lambda: by_hand(node, uuids, args)), ("gpuctl", lambda: through_gpuctl(node, args))):
                fig, tail = fn()
                res["rounds"].append({"round": r, "launch": how, **(fig or {})})
                if fig is None:
                    res["errors"].append(f"round {r} {how}: no figure; {tail}")
                print(f"round {r} {how:6}: {fig['images_per_s']:.1f} images/s" if fig else f"round {r} {how}: FAILED\n{tail}",
                      flush=True)
        hand = [x["images_per_s"] for x in res["rounds"] if x["launch"] == "hand" and "images_per_s" in x]
        ours = [x["images_per_s"] for x in res["rounds"] if x["launch"] == "gpuctl" and "images_per_s" in x]
        if hand and ours:
            res["hand_images_per_s"] = statistics.median(hand)
            res["gpuctl_images_per_s"] = statistics.median(ours)
            res["ratio"] = res["gpuctl_images_per_s"] / res["hand_images_per_s"]
        leases = node.gpuctl("leases", "--json")
        res["leases_left"] = json.loads(leases.stdout)["leases"] if leases.returncode == 0 else leases.stderr
    finally:
        node.stop()
        res["gpuctld_log_tail"] = node.log_text()[-4000:]
        res["finished_s"] = time.time()
        out.write_text(json.dumps(res, indent=2))
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{'figure':48} {'value':>12} {'target':>10}")
    if "ratio" in res:
        print(f"{'by hand: images/s (median)':48} {res['hand_images_per_s']:>12.1f}")
        print(f"{'gpuctl run --native: images/s (median)':48} {res['gpuctl_images_per_s']:>12.1f}")
        model = "tiny CNN (simulated, CPU)" if args.backend == "simulated" else "ResNet-50"
        print(f"{f'{model} DDP on {args.gpus} GPU(s): gpuctl / by hand':48} {res['ratio']:>12.3f} {'>= 0.98':>10}")
    print(f"placement: {res.get('placement', {}).get('nodes')}")
    print(f"leases left after the runs: {res.get('leases_left')}")
    for e in res["errors"]:
        print(f"error: {e}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
