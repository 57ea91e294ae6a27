"""Native attach on a real GPU: gpuctld's own MPS caps, and ResNet-50 training in fractional leases.

    python bench/native.py --out $OUT/native.json        # on a GPU node (NVML, torch, torchvision)

Everything goes through gpuctl as a user would: this script starts its own gpuctld (``--backend
nvml --mps auto``, state and socket in a temporary directory; no MPS daemon started by hand), writes
a fleet config reaching it (``transport = "local"``), gives GPU ``--gpu`` to a department and runs
the clients with ``gpuctl run --native``. Then:

1. quota check: a PyTorch program in a 1/4 lease reads ``torch.cuda.mem_get_info()`` and
   allocates 1 GiB blocks until OutOfMemoryError: it must stop at the lease's quota (the
   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT gpuctld computed) and see the quota as its free memory.
2. fractional throughput: torchvision ResNet-50 training (synthetic ImageNet-size data, SGD with
   momentum, cudnn.benchmark, fp32, batch ``--batch`` per client) in 1 x full, 2 x 1/2 and 4 x 1/4
   native leases at once. The clients warm up, wait on a shared start file, then all train for
   ``--seconds``; images/s of each is summed. Ratio = aggregate of n x 1/n / one full lease; the
   target is >= 0.95. A nvidia-smi process list is taken while the 4 x 1/4 clients run (the MPS
   server should be there).

Needs on the node: torch, torchvision, numpy, and gpuctl's own dependencies (httpx, paramiko,
nvidia-ml-py, rich, ...; install their wheels first). Prints a table; writes JSON with every figure.
The clients are this file run with ``--client train|oom`` (they import torch only, never gpuctl).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
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

GiB = 1 << 30


# ---------------------------------------------------------------------------- clients (torch only)


def client_train(args: argparse.Namespace) -> None:
    """Train ResNet-50 on synthetic data: warm up, say ready, wait for the start file, train for
    `seconds`; print one JSON line {"images_per_s", "steps", "seconds", "batch", "env"}."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup_steps):
        step()
    torch.cuda.synchronize()
    Path(args.ready_file).touch()
    while not os.path.exists(args.start_file):
        time.sleep(0.01)
    steps = 0
    t0 = time.perf_counter()
    while True:
        step()
        steps += 1
        if steps % 5 == 0:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= args.seconds:
                break
    elapsed = time.perf_counter() - t0
    print(json.dumps({"images_per_s": steps * args.batch / elapsed, "steps": steps, "seconds": elapsed,
                      "batch": args.batch, "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
                      "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUCTL_"))}}), flush=True)


def client_oom(args: argparse.Namespace) -> None:
    """mem_get_info, then 1 GiB blocks until OutOfMemoryError; one JSON line with what it saw."""
    import torch

    free, total = torch.cuda.mem_get_info()
    blocks = []
    oom = error = None
    try:
        while len(blocks) < 1024:  # 1 TiB: no GPU has that, so the loop ends with OOM
            blocks.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
            blocks[-1].fill_(1)
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0][:300]
    except RuntimeError as e:  # not the error PyTorch should raise: recorded as such
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    print(json.dumps({"mem_get_info_free_bytes": free, "mem_get_info_total_bytes": total,
                      "allocated_gib_at_oom": len(blocks), "out_of_memory": oom, "other_error": error,
                      "quota_bytes": int(os.environ.get("GPUCTL_MEMORY_QUOTA_BYTES", "0")),
                      "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUCTL_"))}}), flush=True)


def client_fake(args: argparse.Namespace) -> None:
    """--backend simulated (a CPU check of this script's plumbing): no torch; figures from the env."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "GPUCTL_"))}
    if args.client == "fake-oom":
        quota = int(env["GPUCTL_MEMORY_QUOTA_BYTES"])
        print(json.dumps({"mem_get_info_free_bytes": quota, "mem_get_info_total_bytes": 4 * quota,
                          "allocated_gib_at_oom": quota // GiB, "out_of_memory": "simulated", "quota_bytes": quota,
                          "env": env}))
        return
    Path(args.ready_file).touch()
    while not os.path.exists(args.start_file):
        time.sleep(0.01)
    time.sleep(args.seconds)
    print(json.dumps({"images_per_s": 100.0 * float(env["GPUCTL_COMPUTE_SHARE"]), "steps": 1,
                      "seconds": args.seconds, "batch": args.batch, "env": env}))


# ---------------------------------------------------------------------------- driver


class Node(LocalGpuctld):
    """A gpuctld of our own on this machine (MPS auto), and the fleet config that reaches it; the
    bench's GPU is the one at `gpu_index`."""

    def __init__(self, tmp: Path, gpu_index: int, backend: str = "nvml"):
        super().__init__(tmp, backend, ["--mps", "auto"])
        self.backend = backend
        self.gpu_uuid = self._status()["gpus"][gpu_index]["identity"]["uuid"]

    def _status(self) -> dict[str, Any]:
        with self.client() as c:
            return c.get("/v1/status").json()

    def give(self, dept: str, parts: int) -> None:
        """Split our GPU into `parts` slices and give them all to `dept` (none may be leased)."""
        with self.client() as c:
            st = c.get("/v1/status").json()
            gen = st["generation"]
            r = c.post("/v1/split", json={"request_id": f"split-{parts}-{time.time()}", "generation": gen,
                                          "gpu_uuid": self.gpu_uuid, "parts": parts})
            if r.status_code != 200:
                raise SystemExit(f"split into {parts}: {r.text}")
            gen = r.json()["generation"]
            slices = c.get("/v1/slices").json()["slices"]
            moves = [{"slice_id": s["id"], "from": s["department"], "to": dept} for s in slices
                     if s["gpu_uuid"] == self.gpu_uuid and s["department"] != dept]
            if moves:
                r = c.post("/v1/assign", json={"request_id": f"give-{parts}-{time.time()}", "generation": gen,
                                               "moves": moves})
                if r.status_code != 200:
                    raise SystemExit(f"assign to {dept}: {r.text}")

    def run_native(self, fraction: float, client_args: list[str]) -> subprocess.Popen:
        if self.backend == "simulated":
            client_args = [a if a not in ("train", "oom") else f"fake-{a}" for a in client_args]
        return subprocess.Popen(
            [sys.executable, "-m", "gpuctl.cli", "--config", str(self.config), "run", "--native", "--dept", "bench",
             "--gpus", f"{fraction:g}", "--ttl", "60", "--", sys.executable, str(Path(__file__).resolve()),
             *client_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def oom_check(node: Node, res: dict[str, Any]) -> None:
    node.give("bench", 4)
    p = node.run_native(0.25, ["--client", "oom"])
    out, err = p.communicate(timeout=300)
    doc = _last_json(out) or {}
    doc.update(rc=p.returncode, gpuctl_stderr=err[-3000:],
               mps_warnings=[ln for ln in err.splitlines() if "warning:" in ln])
    quota = doc.get("quota_bytes") or 0
    doc["oom_at_or_below_quota"] = bool(doc.get("out_of_memory")) and doc.get("allocated_gib_at_oom", 1 << 20) * GiB <= quota
    doc["free_within_5pct_of_quota"] = bool(quota) and abs(doc.get("mem_get_info_free_bytes", 0) - quota) <= 0.05 * quota
    res["oom"] = doc
    print(f"OOM check (1/4 lease, quota {quota / GiB:.2f} GiB): mem_get_info free "
          f"{doc.get('mem_get_info_free_bytes', 0) / GiB:.2f} GiB of total {doc.get('mem_get_info_total_bytes', 0) / GiB:.1f} "
          f"GiB; OutOfMemoryError after {doc.get('allocated_gib_at_oom')} GiB -> "
          f"{'OK' if doc['oom_at_or_below_quota'] and doc['free_within_5pct_of_quota'] else 'NOT OK'}", flush=True)


def train_round(node: Node, n: int, args: argparse.Namespace, res: dict[str, Any]) -> float:
    node.give("bench", n)
    sync = Path(tempfile.mkdtemp(prefix=f"native-{n}-", dir=node.tmp))
    start = sync / "start"
    procs = [node.run_native(1.0 / n, ["--client", "train", "--batch", str(args.batch), "--seconds",
                                        str(args.seconds), "--warmup-steps", str(args.warmup_steps),
                                        "--ready-file", str(sync / f"ready-{k}"), "--start-file", str(start)])
             for k in range(n)]
    deadline = time.monotonic() + 600
    while sum((sync / f"ready-{k}").exists() for k in range(n)) < n:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            outs = [p.communicate(timeout=60) for p in procs]
            raise RuntimeError(f"{n} x 1/{n}: a client ended before it was ready: "
                               + " | ".join(e[-1500:] for _, e in outs))
        time.sleep(0.05)
    start.touch()
    smi = None
    if n == 4:
        time.sleep(min(5.0, args.seconds / 2))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                                  "--format=csv"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            smi = f"nvidia-smi: {e}"
    outs = [p.communicate(timeout=args.seconds + 600) for p in procs]
    docs = [_last_json(o) for o, _ in outs]
    if any(d is None for d in docs) or any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{n} x 1/{n}: client failed: " + " | ".join(e[-1500:] for _, e in outs))
    agg = sum(d["images_per_s"] for d in docs)
    res.setdefault("train", {})[f"{n}x1/{n}" if n > 1 else "1xfull"] = {
        "aggregate_images_per_s": agg, "clients": docs, "nvidia_smi_during": smi,
        "mps_warnings": [ln for _, e in outs for ln in e.splitlines() if "warning:" in ln],
        "gpuctl_stderr": [e[-800:] for _, e in outs]}
    print(f"ResNet-50 batch {args.batch}: {n} x {'1/' + str(n) if n > 1 else 'full'}: {agg:.1f} images/s "
          f"({', '.join('%.0f' % d['images_per_s'] for d in docs)})", flush=True)
    return agg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", choices=("train", "oom", "fake-train", "fake-oom"), help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=("nvml", "simulated"), default="nvml",
                    help="simulated: check this script's plumbing on a CPU machine (fake clients, no torch)")
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--start-file", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use (default 0)")
    ap.add_argument("--batch", type=int, default=64, help="batch per client (default 64)")
    ap.add_argument("--seconds", type=float, default=40.0, help="timed training per round, seconds (default 40)")
    ap.add_argument("--warmup-steps", type=int, default=15, help="untimed steps first (default 15)")
    ap.add_argument("--skip", default="", help="comma list: oom,train")
    ap.add_argument("--out", default=None, help="JSON file (default bench/native.json)")
    args = ap.parse_args()
    if args.client == "train":
        return client_train(args)
    if args.client == "oom":
        return client_oom(args)
    if args.client:
        return client_fake(args)
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out or REPO / "bench" / "native.json")
    res: dict[str, Any] = {"command": " ".join([sys.executable, *sys.argv]), "host": platform.node(),
                           "started_s": time.time(), "errors": {}}
    try:
        if args.backend == "simulated":
            raise ImportError("simulated backend: torch not used")
        import torch
        import torchvision

        res.update(torch=torch.__version__, torchvision=torchvision.__version__,
                   gpu_name=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception as e:  # noqa: BLE001 - recorded; the clients will say more
        res["errors"]["import"] = f"{type(e).__name__}: {e}"
    tmp = Path(tempfile.mkdtemp(prefix="gpuctl-native-"))
    node = Node(tmp, args.gpu, args.backend)
    try:
        if "oom" not in skip:
            try:
                oom_check(node, res)
            except Exception as e:  # noqa: BLE001 - one section failing must not lose the other
                res["errors"]["oom"] = f"{type(e).__name__}: {e}"
                print(f"oom: {res['errors']['oom']}", flush=True)
        if "train" not in skip:
            try:
                full = train_round(node, 1, args, res)
                for n in (2, 4):
                    agg = train_round(node, n, args, res)
                    res["train"][f"{n}x1/{n}"]["ratio_to_full"] = agg / full
            except Exception as e:  # noqa: BLE001
                res["errors"]["train"] = f"{type(e).__name__}: {e}"
                print(f"train: {res['errors']['train']}", flush=True)
    finally:
        node.stop()
        res["gpuctld_log_tail"] = node.log_text()[-4000:]
        left = subprocess.run(["pgrep", "-f", "nvidia-cuda-mps"], capture_output=True, text=True).stdout.split()
        res["mps_processes_left_after_gpuctld_stopped"] = left
        res["finished_s"] = time.time()
        out.write_text(json.dumps(res, indent=2))
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # the gpuctld log's tail is in the JSON
    print()
    print(f"{'figure':40} {'value':>22} {'target':>10}")
    if "oom" in res:
        o = res["oom"]
        print(f"{'1/4 lease: OOM at quota':40} {str(o.get('oom_at_or_below_quota')):>22} {'True':>10}")
        print(f"{'1/4 lease: mem_get_info free = quota':40} {str(o.get('free_within_5pct_of_quota')):>22} {'True':>10}")
    for n in (2, 4):
        t = res.get("train", {}).get(f"{n}x1/{n}")
        if t and "ratio_to_full" in t:
            print(f"{f'ResNet-50 {n} x 1/{n} vs 1 x full':40} {t['ratio_to_full']:>22.3f} {'>= 0.95':>10}")
    print(f"MPS processes left after gpuctld stopped: {left or 'none'}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
