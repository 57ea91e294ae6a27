"""gpuctl.torch benchmark: PyTorch training on a leased slice through the data path vs local PyTorch.

    python3 bench/torch_remote.py                       # GPU node: gpuctld --backend nvml, full GPU
    python3 bench/torch_remote.py --backend simulated --quick   # CPU machine: the script itself

It starts its own gpuctld (``--backend nvml``, state and socket in a temporary directory), assigns
GPU 0 to a department, leases the whole GPU (``POST /v1/leases``, gpus=1) and attaches to the
lease's worker with gpuctl.torch over loopback TCP. In the same run, local PyTorch on the same GPU
is the baseline; every case runs local first, then remote, with the same model, data and steps:

* torchvision ResNet-50 (``--quick``/no torchvision: the torch.nn ResNet-18 of
  examples/resnet_train.py), synthetic ImageNet-shaped data (224x224, 1000 classes), SGD momentum,
  cross-entropy, cudnn.benchmark: fp32 batch 256, bf16 autocast + channels_last batch 256, fp32
  batch 64. Figure: images/s over the timed steps (warm-up steps excluded), ratio remote/local.
* a GPT-2-small-sized causal transformer from torch.nn (12 layers, d_model 768, 12 heads,
  sequence 1024, vocabulary 50257, pre-norm, GELU), batch 8, AdamW, bf16 autocast, 50 steps.
  Remote attention runs the math path (gpuctl.torch has no fused attention); local runs with
  PyTorch's default (flash) and with the math path, both reported.

Last, the client's own cost per step with nothing sent (``client alone``): where a ratio misses,
this says whether the client (meta inference, autograd, encoding) or the worker is the limit.

Timing: wall clock from before the first timed step to a synchronization after the last one
(``torch.cuda.synchronize()`` locally, ``loss.item()`` remotely). Prints a table and ratios, and
JSON with ``--out``. Needs torch (and torchvision for ResNet-50) plus gpuctl's dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402


# -- the node ----------------------------------------------------------------------------------------
def start_node(tmp: str, backend: str) -> tuple[subprocess.Popen, str]:
    """gpuctld in `tmp`; returns (process, socket path) once it answers /v1/health."""
    import httpx

    sock = os.path.join(tmp, "gpuctld.sock")
    log = open(os.path.join(tmp, "gpuctld.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpuctl.daemon", "serve", "--backend", backend, "--gpus", "1",
                             "--state-dir", os.path.join(tmp, "state"), "--socket", sock],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gpuctld exited {proc.returncode}: {open(log.name).read()[-2000:]}")
        if os.path.exists(sock):
            try:
                with _api(sock) as c:
                    if c.get("/v1/health").status_code == 200:
                        return proc, sock
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("gpuctld did not answer within 60 s")


def _api(sock: str) -> Any:
    import httpx

    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://gpuctld", timeout=60)


def lease_full_gpu(sock: str) -> tuple[str, str]:
    """Assign GPU 0's whole slice to department "bench" and lease it: (lease id, attach URL)."""
    with _api(sock) as c:
        status = c.get("/v1/status").raise_for_status().json()
        gpu = sorted(status["gpus"], key=lambda g: g["identity"]["index"])[0]
        sid = gpu["slices"][0]["id"]
        c.post("/v1/assign", json={"request_id": "bench-assign", "generation": status["generation"],
                                   "leased": "refuse",
                                   "moves": [{"slice_id": sid, "from": gpu["slices"][0]["department"],
                                              "to": "bench"}]}).raise_for_status()
        r = c.post("/v1/leases", json={"request_id": "bench-lease", "department": "bench",
                                       "owner": "bench@localhost", "ttl_s": 3600, "gpus": 1})
        r.raise_for_status()
        j = r.json()
        return j["lease"]["id"], j["attach"]


# -- workloads ---------------------------------------------------------------------------------------
def resnet(quick: bool) -> tuple[nn.Module, str]:
    if not quick:
        try:
            import torchvision

            return torchvision.models.resnet50(), "torchvision resnet50"
        except Exception:  # noqa: BLE001 - torchvision missing or built for another torch
            pass
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import resnet_train

    return resnet_train.resnet18(num_classes=1000, width=16 if quick else 64), "torch.nn resnet18"


class GPT(nn.Module):
    """A GPT-2-shaped causal language model from torch.nn (no download)."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        pos = torch.arange(n, device=idx.device)
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos), mask=mask, is_causal=True)
        return self.head(self.norm(x))


def timed_training(step: Callable[[], torch.Tensor], warmup: int, steps: int, sync: Callable[[torch.Tensor], Any]
                   ) -> tuple[float, float]:
    """(seconds for `steps` timed steps, last loss) after `warmup` steps and a sync."""
    loss = None
    for _ in range(warmup):
        loss = step()
    if loss is not None:
        sync(loss)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    last = float(sync(loss))
    return time.perf_counter() - t0, last


def resnet_case(device: torch.device, batch: int, bf16: bool, quick: bool, warmup: int, steps: int,
                sync: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    model, model_name = resnet(quick)
    size = 64 if quick else 224
    fmt = torch.channels_last if bf16 else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size).to(device, memory_format=fmt)
    y = torch.randint(0, 1000, (batch,)).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    dt, last = timed_training(step, warmup, steps, sync)
    return {"model": model_name, "images_per_s": batch * steps / dt, "ms_per_step": 1000 * dt / steps,
            "last_loss": last}


def gpt_case(device: torch.device, quick: bool, steps: int, sync: Callable[[torch.Tensor], Any],
             math_attention: bool = False) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    vocab, seq, d, heads, layers, batch = (512, 64, 64, 4, 2, 2) if quick else (50257, 1024, 768, 12, 12, 8)
    model = GPT(vocab, seq, d, heads, layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(0, vocab, (batch, seq + 1))
    x, y = idx[:, :-1].to(device), idx[:, 1:].to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    if math_attention:
        with sdpa_kernel(SDPBackend.MATH):
            dt, last = timed_training(step, 3, steps, sync)
    else:
        dt, last = timed_training(step, 3, steps, sync)
    return {"tokens_per_s": batch * seq * steps / dt, "ms_per_step": 1000 * dt / steps, "last_loss": last}


def client_overhead(device: torch.device, quick: bool, steps: int = 5) -> dict[str, Any]:
    """The client's own cost of a ResNet training step (meta inference, autograd, encoding), with
    nothing sent: the connection's enqueue is replaced by a counter for these steps, then the
    connection is closed (call last). Figure: ms per step and us per ATen op sent."""
    import gpuctl.torch as gt

    torch.manual_seed(0)
    model, name = resnet(quick)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2, 3, 64, 64).to(device)
    y = torch.randint(0, 1000, (2,)).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        step()
    step().item()
    conn = gt._tensor.conn()
    sent: list[str] = []
    conn.enqueue = lambda name, outs, args, kwargs=None: sent.append(name)
    conn._take_frees = lambda: conn._pending_free.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = (time.perf_counter() - t0) / steps
    gt.detach()
    ops = len(sent) / steps
    return {"model": name, "ms_per_step": 1000 * dt, "ops_per_step": ops, "us_per_op": 1e6 * dt / ops}


# -- main --------------------------------------------------------------------------------------------
class _Done(Exception):
    """The cases of this part are done: write the figures."""


def drive_parts(args: argparse.Namespace) -> None:
    """Start gpuctld and lease a whole GPU here, run the local part (this GPU, in a child process)
    and the remote part (a child process with no GPU of its own, attached to the lease), one after
    the other, and print the ratios of their figures."""
    tmp = tempfile.mkdtemp(prefix="gpuctl-bench-torch-")
    node, sock = start_node(tmp, args.backend)
    try:
        _, url = lease_full_gpu(sock)
        parts: dict[str, Any] = {}
        for part in ("local", "remote"):
            out = os.path.join(tmp, f"{part}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--attach", url, "--out", out,
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--gpt-steps", str(args.gpt_steps)]
            if args.only:
                cmd += ["--only", args.only]
            if args.quick:
                cmd += ["--quick"]
            env = dict(os.environ)
            if part == "remote":
                env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU-only client: only the worker touches the GPU
            subprocess.run(cmd, env=env, check=False)
            with open(out) as f:
                parts[part] = json.load(f)
        loc, rem = parts["local"], parts["remote"]
        results = {"machine": loc["machine"], "torch": loc["torch"], "attach_ms": rem["attach_ms"], "cases": {},
                   "client_overhead": rem.get("client_overhead"), "worker_stats": rem.get("worker_stats")}
        print(f"{'case':<16} {'local':>12} {'remote':>13} {'ratio':>7}")
        for name, lc in loc["cases"].items():
            rc = rem["cases"].get(name, {})
            if "error" in lc or "error" in rc:
                results["cases"][name] = {"local": lc, "remote": rc}
                print(f"{name:<16} failed: {lc.get('error') or rc.get('error')}"[:300])
                continue
            if name == "gpt":
                l, r = lc["local"]["tokens_per_s"], rc["remote"]["tokens_per_s"]
                lm = lc["local_math_attention"]["tokens_per_s"]
                results["cases"][name] = {**lc, **rc, "ratio": r / l, "ratio_vs_math": r / lm}
                print(f"{'gpt (tokens/s)':<16} {l:>12.0f} {r:>13.0f} {r / l:>7.3f}   (local math attention {lm:.0f}: "
                      f"ratio {r / lm:.3f})")
                continue
            l, r = lc["local"]["images_per_s"], rc["remote"]["images_per_s"]
            results["cases"][name] = {"local": lc["local"], "remote": rc["remote"], "ratio": r / l}
            print(f"{name:<16} {l:>12.1f} {r:>13.1f} {r / l:>7.3f}   (img/s; ms/step {lc['local']['ms_per_step']:.1f} "
                  f"vs {rc['remote']['ms_per_step']:.1f})", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        node.terminate()
        try:
            node.wait(10)
        except subprocess.TimeoutExpired:
            node.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("nvml", "simulated"), default="nvml")
    p.add_argument("--attach", default=None, help="use this lease instead of starting gpuctld (attach URL)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU check of the script)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed ResNet steps per case")
    p.add_argument("--gpt-steps", type=int, default=50)
    p.add_argument("--only", default=None, help="comma list of cases: fp32_b256,bf16_cl_b256,fp32_b64,gpt")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--part", choices=("all", "local", "remote"), default="all",
                   help="all (default): the local part in this process, the remote part in a child process "
                        "that sees no GPU (CUDA_VISIBLE_DEVICES='', a CPU-only client as in the seed's figure); "
                        "local / remote: that part alone (needs --attach for remote)")
    args = p.parse_args()
    if args.part == "all" and not args.attach:
        return drive_parts(args)

    import gpuctl.torch as gt

    local_dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if local_dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    node = None
    tmp = tempfile.mkdtemp(prefix="gpuctl-bench-torch-")
    try:
        if args.attach:
            url = args.attach
        else:
            node, sock = start_node(tmp, args.backend)
            _, url = lease_full_gpu(sock)
        t0 = time.perf_counter()
        remote_dev = gt.attach(url) if args.part != "local" else None
        attach_ms = 1000 * (time.perf_counter() - t0)
        do_local, do_remote = args.part != "remote", args.part != "local"

        def local_sync(loss: torch.Tensor) -> float:
            if local_dev.type == "cuda":
                torch.cuda.synchronize()
            return loss.item()

        def remote_sync(loss: torch.Tensor) -> float:
            return loss.item()

        batch_big, batch_small = (16, 4) if args.quick else (256, 64)
        cases = {
            f"fp32_b{batch_big}": dict(batch=batch_big, bf16=False),
            f"bf16_cl_b{batch_big}": dict(batch=batch_big, bf16=True),
            f"fp32_b{batch_small}": dict(batch=batch_small, bf16=False),
        }
        only = set(args.only.split(",")) if args.only else None
        results: dict[str, Any] = {"machine": platform.node(), "torch": torch.__version__,
                                   "local_device": str(local_dev), "attach_ms": round(attach_ms, 1), "cases": {}}
        print(f"torch {torch.__version__}, local {local_dev}, remote {remote_dev} (attach {attach_ms:.0f} ms)")
        print(f"{'case':<16} {'local img/s':>12} {'remote img/s':>13} {'ratio':>7}")
        for name, kw in cases.items():
            if only and name.replace(str(batch_big), "256").replace(str(batch_small), "64") not in only \
                    and name not in only:
                continue
            try:
                loc = resnet_case(local_dev, quick=args.quick, warmup=args.warmup, steps=args.steps, sync=local_sync,
                                  **kw) if do_local else None
                rem = resnet_case(remote_dev, quick=args.quick, warmup=args.warmup, steps=args.steps,
                                  sync=remote_sync, **kw) if do_remote else None
            except Exception as e:  # noqa: BLE001 - report and go on with the next case
                print(f"{name:<16} failed: {type(e).__name__}: {str(e)[:300]}")
                results["cases"][name] = {"error": f"{type(e).__name__}: {e}"}
                continue
            if loc is None or rem is None:
                results["cases"][name] = {"local": loc, "remote": rem}
                print(f"{name:<16} {args.part}: {(loc or rem)['images_per_s']:.1f} img/s", flush=True)
                if local_dev.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            ratio = rem["images_per_s"] / loc["images_per_s"]
            results["cases"][name] = {"local": loc, "remote": rem, "ratio": ratio}
            print(f"{name:<16} {loc['images_per_s']:>12.1f} {rem['images_per_s']:>13.1f} {ratio:>7.3f}"
                  f"   ({loc['model']}; ms/step {loc['ms_per_step']:.1f} vs {rem['ms_per_step']:.1f})", flush=True)
            if local_dev.type == "cuda":
                torch.cuda.empty_cache()
        if not only or "gpt" in only:
            try:
                if not (do_local and do_remote):
                    one = (dict(local=gpt_case(local_dev, args.quick, args.gpt_steps, local_sync),
                                local_math_attention=gpt_case(local_dev, args.quick, args.gpt_steps, local_sync,
                                                              math_attention=True)) if do_local
                           else dict(remote=gpt_case(remote_dev, args.quick, args.gpt_steps, remote_sync)))
                    results["cases"]["gpt"] = one
                    print(f"gpt {args.part}: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tokens/s" for k, v in one.items()))
                    raise StopIteration
                loc = gpt_case(local_dev, args.quick, args.gpt_steps, local_sync)
                loc_math = gpt_case(local_dev, args.quick, args.gpt_steps, local_sync, math_attention=True)
                rem = gpt_case(remote_dev, args.quick, args.gpt_steps, remote_sync)
                results["cases"]["gpt"] = {"local": loc, "local_math_attention": loc_math, "remote": rem,
                                           "ratio": rem["tokens_per_s"] / loc["tokens_per_s"],
                                           "ratio_vs_math": rem["tokens_per_s"] / loc_math["tokens_per_s"]}
                print(f"{'gpt (tokens/s)':<16} {loc['tokens_per_s']:>12.0f} {rem['tokens_per_s']:>13.0f} "
                      f"{results['cases']['gpt']['ratio']:>7.3f}   (local math attention "
                      f"{loc_math['tokens_per_s']:.0f}: ratio {results['cases']['gpt']['ratio_vs_math']:.3f})")
            except StopIteration:
                pass
            except Exception as e:  # noqa: BLE001
                print(f"gpt failed: {type(e).__name__}: {str(e)[:300]}")
                results["cases"]["gpt"] = {"error": f"{type(e).__name__}: {e}"}
        if not do_remote:
            raise _Done
        try:
            results["worker_stats"] = gt.stats()
        except Exception as e:  # noqa: BLE001
            results["worker_stats"] = {"error": str(e)}
        try:
            co = client_overhead(remote_dev, args.quick)  # last: it closes the connection
            results["client_overhead"] = co
            print(f"client alone ({co['model']}, nothing sent): {co['ms_per_step']:.1f} ms/step, "
                  f"{co['ops_per_step']:.0f} ops/step, {co['us_per_op']:.1f} us/op")
        except Exception as e:  # noqa: BLE001
            print(f"client overhead failed: {type(e).__name__}: {str(e)[:300]}")
        gt.detach()
        raise _Done
    except _Done:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        if node is not None:
            node.terminate()
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                node.kill()


if __name__ == "__main__":
    main()
