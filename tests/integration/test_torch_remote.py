"""gpuctl.torch against a real worker process (CPU torch executor), differential against local CPU
torch: training steps equal, errors at the right place, quota, tokens, bad frames, a lost worker."""

from __future__ import annotations

import copy
import gc
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import gpuctl.torch as gt  # noqa: E402
from gpuctl.datapath.protocol import FrameReader, FrameType, hello_meta, send_frame  # noqa: E402
from gpuctl.datapath.testing import running_worker  # noqa: E402
from gpuctl.remote._connection import AttachError, WorkerLostError, parse_attach  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("resnet_train", os.path.join(ROOT, "examples", "resnet_train.py"))
resnet_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resnet_train)

QUOTA = 256 << 20


@pytest.fixture(scope="module")
def worker():
    with running_worker(quota_bytes=QUOTA) as (handle, url):
        yield handle, url


@pytest.fixture
def dev(worker):
    d = gt.attach(worker[1])
    yield d
    gt.detach()


def _close(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(a.cpu() if a.device.type != "cpu" else a, b, rtol=rtol, atol=atol)


def _step(model, opt, x, y, clip=None):
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return out, loss


def _compare_training(local_model, make_opt, x, y, dev, steps=2, clip=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    remote_model = copy.deepcopy(local_model).to(dev)
    lopt, ropt = make_opt(local_model.parameters()), make_opt(remote_model.parameters())
    for _ in range(steps):
        with sdpa_kernel(SDPBackend.MATH):  # attention as gpuctl.torch runs it (math, no fused kernel)
            lout, lloss = _step(local_model, lopt, x, y, clip)
        rout, rloss = _step(remote_model, ropt, x.to(dev), y.to(dev), clip)
        _close(rout.detach(), lout.detach())
        assert rloss.item() == pytest.approx(lloss.item(), rel=1e-5)
    for (name, lp), rp in zip(local_model.named_parameters(), remote_model.parameters()):
        assert rp.device.type == "gpuctl"
        _close(rp.grad, lp.grad, rtol=1e-4, atol=1e-5)
        _close(rp.detach(), lp.detach())
        for k, v in lopt.state[lp].items():
            rv = ropt.state[rp][k]
            _close(rv, v, rtol=1e-4, atol=1e-5) if isinstance(v, torch.Tensor) else None
    for (name, lb), rb in zip(local_model.named_buffers(), remote_model.buffers()):
        _close(rb, lb, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("foreach", [False, True])
def test_resnet18_step_equals_local(dev, foreach):
    torch.manual_seed(1)
    model = resnet_train.resnet18(width=8)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    _compare_training(model, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=foreach), x, y, dev)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, seq=12):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True,
                                                 activation="gelu")
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        n = idx.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=idx.device)
        return self.head(self.body(self.tok(idx) + self.pos[:n], mask=mask, is_causal=True))


@pytest.mark.parametrize("foreach", [False, True])
def test_transformer_step_equals_local(dev, foreach):
    torch.manual_seed(2)
    model = TinyLM()
    idx = torch.randint(0, 50, (3, 12))
    _compare_training(model, lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=foreach), idx, idx.roll(-1, 1), dev,
                      clip=0.5)


def test_views_inplace_indexing_and_host_copies(dev):
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    r = a.to(dev)
    a[1:, ::2] += 1
    r[1:, ::2] += 1
    _close(r, a)
    _close(r.t().contiguous(), a.t().contiguous())
    _close(r[torch.tensor([2, 0])], a[torch.tensor([2, 0])])
    _close(r[r > 10], a[a > 10])  # data-dependent shape: asked of the worker
    _close(r.view(2, 12).sum(1), a.view(2, 12).sum(1))
    assert r.tolist() == a.tolist() and r[1, 2].item() == a[1, 2].item()
    assert f"{r.sum():.1f}" == f"{a.sum():.1f}"
    assert repr(r).startswith("tensor([[") and "device='gpuctl:0'" in repr(r)
    h = torch.randn(3, 3, device=dev, dtype=torch.bfloat16)
    assert h.cpu().dtype == torch.bfloat16 and h.device == dev


def test_numbers_from_the_worker_and_common_ops_equal_local(dev):
    a = torch.arange(6.0).reshape(2, 3)
    r = a.to(dev)
    assert torch.equal(r, r.clone()) and not torch.equal(r, r + 1)
    assert bool(r.sum() > 3) and torch.allclose(r, r + 1e-9) and not torch.allclose(r, r + 1)
    assert r.max().item() == 5.0 and r.argmax(1).tolist() == a.argmax(1).tolist()
    assert r.topk(2, dim=1).values.tolist() == a.topk(2, dim=1).values.tolist()
    _close(r.mean(0), a.mean(0))
    _close(r.std(), a.std())
    assert (r / 0).isinf().any().item() is True
    assert [t.shape for t in torch.cat([r, r]).split(2)] == [torch.Size([2, 3])] * 2
    _close(torch.where(r > 2, r, torch.zeros_like(r)), torch.where(a > 2, a, torch.zeros_like(a)))
    assert r.unsqueeze(0).expand(3, 2, 3).sum().item() == 45.0
    idx = torch.tensor([0, 2])
    r[:, idx] = 5.0
    a[:, idx] = 5.0
    _close(r, a)


def test_factories_that_size_their_output(dev):
    assert torch.arange(5, device=dev).tolist() == list(range(5))
    assert torch.arange(1, 2, 0.25, device=dev).tolist() == [1.0, 1.25, 1.5, 1.75]
    _close(torch.linspace(0, 1, 7, device=dev), torch.linspace(0, 1, 7))
    _close(torch.eye(3, device=dev), torch.eye(3))
    out = torch.empty(2, device=dev)
    with pytest.raises(NotImplementedError, match=r"out= tensor of shape \(2,\) would be resized to \(3, 4\)"):
        torch.add(torch.ones(3, 4, device=dev), 1, out=out)


def test_many_tensors_freed_at_once_leave_the_worker(dev):
    base = gt.stats()["handles"]
    many = [torch.ones(1, device=dev) for _ in range(5000)]  # more than one op's 4096 arguments
    assert gt.stats()["handles"] == base + 5000
    del many
    torch.ones(1, device=dev).sum().item()
    assert gt.stats()["handles"] == base


def test_manual_seed_reaches_the_worker(dev):
    torch.manual_seed(7)
    r = torch.randn(5, device=dev).cpu()
    torch.manual_seed(7)
    assert torch.equal(r, torch.randn(5))


def test_autocast_bf16_runs_linear_in_bf16(dev):
    torch.manual_seed(3)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    rlin = copy.deepcopy(lin).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = rlin(x.to(dev))
        sm = torch.softmax(out, -1)
    assert out.dtype == torch.bfloat16 and sm.dtype == torch.float32
    want = torch.nn.functional.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
    _close(out, want, rtol=0, atol=0)


def test_grad_scaler_with_autocast_trains(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    local = copy.deepcopy(model)
    model.to(dev)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    out = []
    for m, d in ((local, torch.device("cpu")), (model, dev)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(d.type, init_scale=1024.0)
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast(d.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x.to(d)), y.to(d))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        out.append((loss.item(), scaler.get_scale()))
    # CPU autocast and gpuctl's (CUDA's op lists) differ a little in which ops run in bf16
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-2) and out[1][1] == out[0][1] == 1024.0


def test_deepcopy_of_a_model_and_channels_last_copies(dev):
    torch.manual_seed(5)
    m = torch.nn.Linear(3, 2).to(dev)
    m(torch.ones(1, 3, device=dev)).sum().backward()
    m2 = copy.deepcopy(m)
    assert isinstance(m2.weight, torch.nn.Parameter) and m2.weight.device == dev and m2.weight.requires_grad
    assert torch.equal(m2.weight.cpu(), m.weight.cpu()) and torch.equal(m2.weight.grad.cpu(), m.weight.grad.cpu())
    with torch.no_grad():
        m2.weight.add_(1)  # a copy, not the same remote storage
    assert torch.equal(m2.weight.cpu(), m.weight.cpu() + 1)
    x = torch.randn(2, 3, 4, 4)
    r = x.to(dev, memory_format=torch.channels_last)
    back = r.cpu()
    assert back.is_contiguous(memory_format=torch.channels_last) and torch.equal(back, x)


def test_state_dict_save_and_load(dev, tmp_path):
    torch.manual_seed(4)
    m = torch.nn.Linear(3, 2).to(dev)
    path = tmp_path / "m.pt"
    torch.save(m.state_dict(), path)
    sd = torch.load(path)
    assert sd["weight"].device.type == "cpu"
    _close(m.weight.detach(), sd["weight"])
    m2 = torch.nn.Linear(3, 2).to(dev)
    m2.load_state_dict(sd)
    _close(m2.weight.detach(), sd["weight"])


def test_shape_error_raises_at_the_call(dev):
    a, b = torch.ones(2, 3, device=dev), torch.ones(4, 5, device=dev)
    sent = gt._tensor.conn().ops_sent + len(gt._tensor.conn()._ops)
    with pytest.raises(RuntimeError, match=r"\[2, 3\] X \[4, 5\]"):  # the meta kernel's words for local's error
        a @ b
    assert gt._tensor.conn().ops_sent + len(gt._tensor.conn()._ops) == sent
    assert (a + 1).sum().item() == 12.0  # nothing was sent; the connection goes on


def test_unsupported_op_names_it(dev):
    with pytest.raises(NotImplementedError, match=r"aten\.linalg_qr\.default is not supported on gpuctl:0"):
        torch.linalg.qr(torch.ones(3, 3, device=dev))


def test_oom_past_the_quota_and_the_lease_stays_usable(dev, worker):
    keep = torch.ones(1000, device=dev)
    before = gt.stats()["memory_in_use_bytes"]
    big = torch.empty(QUOTA // 4 + 1, device=dev)  # float32: just over the quota
    with pytest.raises(torch.OutOfMemoryError, match=r"slice memory quota exceeded"):
        big.sum().item()
    del big
    assert gt.stats()["memory_in_use_bytes"] == before
    assert keep.sum().item() == 1000.0


@pytest.mark.parametrize("make", [
    lambda d: torch.ones(40000, 1, device=d) * torch.ones(1, 40000, device=d),  # 6.4 GB from 320 KB: a view-free outer product
    lambda d: torch.ones(40000, 1, device=d) @ torch.ones(1, 40000, device=d),
    lambda d: torch.empty_strided((2, 2), (1 << 31, 1), device=d),  # 4 elements, 8 GiB of storage
    lambda d: torch.arange(0, 1 << 32, device=d),
])
def test_ops_past_the_quota_refused_before_they_allocate(dev, make):
    keep = torch.ones(10, device=dev)
    gc.collect()  # tensors of earlier tests still waiting for the collector would be freed in between
    gt.synchronize()
    before = gt.stats()
    with pytest.raises(torch.OutOfMemoryError, match=r"slice memory quota exceeded: needs \d+ bytes"):
        make(dev).sum().item()
    after = gt.stats()
    assert after["memory_in_use_bytes"] == before["memory_in_use_bytes"]
    assert after["peak_memory_bytes"] <= QUOTA
    assert keep.sum().item() == 10.0


def test_tensors_of_an_earlier_attachment_refused(worker):
    d = gt.attach(worker[1])
    old = torch.ones(3, device=d)
    gt.attach(worker[1])  # a new connection: its handle numbers start again from 1
    try:
        fresh = torch.zeros(3, device=d)
        with pytest.raises(RuntimeError, match=r"a tensor of an earlier attachment was used in aten\.add\.Tensor"):
            old + fresh
        with pytest.raises(RuntimeError, match="earlier attachment"):
            old.cpu()
        assert fresh.sum().item() == 0.0
    finally:
        gt.detach()


def test_wrong_token_refused(worker):
    spec = parse_attach(worker[1])
    bad = worker[1].replace(spec.token.hex(), "00" * len(spec.token))
    with pytest.raises(AttachError, match="lease token refused"):
        gt.attach(bad)
    assert not gt.is_attached()


def test_expired_lease_refused():
    import time

    with running_worker(quota_bytes=QUOTA, ttl_s=1.0) as (handle, url):
        time.sleep(1.5)  # the worker ends at its lease's expiry
        with pytest.raises(AttachError, match=r"(cannot connect to the worker of lease test-|has expired)"):
            gt.attach(url)
        assert not gt.is_attached()


def _raw_torch_conn(url):
    spec = parse_attach(url)
    s = socket.create_connection((spec.host, spec.port), timeout=10)
    send_frame(s, FrameType.HELLO, {**hello_meta(spec.lease_id), "executor": "torch"}, [memoryview(spec.token)])
    r = FrameReader(s)
    hdr = r.header()
    assert hdr.ftype == FrameType.WELCOME and r.meta(hdr)["executor"] == "torch"
    return s, r


def test_unknown_executor_in_hello_refused(worker):
    spec = parse_attach(worker[1])
    s = socket.create_connection((spec.host, spec.port), timeout=10)
    try:
        send_frame(s, FrameType.HELLO, {**hello_meta(spec.lease_id), "executor": "jax"}, [memoryview(spec.token)])
        r = FrameReader(s)
        hdr = r.header()
        meta = r.meta(hdr)
        assert hdr.ftype == FrameType.ERROR and meta["code"] == "executor"
        assert meta["message"] == "hello.executor: 'jax' is not served here (torch or numpy)"
    finally:
        s.close()


def _sync_batch(s, r, ops):
    send_frame(s, FrameType.BATCH, {"ops": ops + [["sync", [], []]]}, flags=1)
    hdr = r.header()
    assert hdr.ftype == FrameType.REPLY
    return r.meta(hdr)["error"]


@pytest.mark.parametrize("op, etype, message", [
    (["aten.from_file.default", [1], ["/etc/passwd"]], "UnknownOpError", "not in gpuctl.torch's allow-list"),
    (["os.system", [], ["id"]], "UnknownOpError", "not in gpuctl.torch's allow-list"),
    (["aten.add.Tensor", [1], [{"h": 99}, {"h": 98}]], "RemoteError", "unknown handle h99"),
    (["aten.ones.default", [1], [[2]], {"dtype": {"dt": "object"}}], "ValueError", "dtype 'object' is not allowed"),
    (["aten.ones.default", [1], [[2]], {"device": {"dev": "cuda:7"}}], "ValueError", "device 'cuda:7' is not allowed"),
    (["aten.ones.default", [1], [{"py": "__import__"}]], "ValueError", "unknown tagged value 'py'"),
    (["aten.empty.memory_format", [1], [[1 << 40]]], "ValueError", "elements (limit"),
    (["aten.ones.default", [1], [{"hv": [100, [["aten.add.Tensor", [1]]]]}]], "ValueError", "is not a view op"),
])
def test_bad_ops_refused_and_worker_serves_others(worker, dev, op, etype, message):
    s, r = _raw_torch_conn(worker[1])
    try:
        err = _sync_batch(s, r, [["aten.ones.default", [100], [[2]]], op])
        assert err["type"] == etype and message in err["message"] and err["op"] == 2, err
        assert _sync_batch(s, r, [["aten.ones.default", [5], [[3]]]]) is None  # the same connection goes on
        send_frame(s, FrameType.BATCH, b"{not json")  # a broken frame ends this connection only
        hdr = r.header()
        assert hdr.ftype == FrameType.ERROR and "not valid JSON" in r.meta(hdr)["message"]
    finally:
        s.close()
    assert (torch.ones(3, device=dev) * 2).sum().item() == 6.0  # the other client is served


def test_worker_killed_mid_step_gives_a_clear_error():
    with running_worker(quota_bytes=QUOTA) as (handle, url):
        dev = gt.attach(url)
        try:
            model = resnet_train.resnet18(width=8).to(dev)
            x = torch.randn(2, 3, 32, 32, device=dev)
            loss = model(x).sum()
            handle.proc.kill()
            handle.proc.wait()
            loss.backward()  # queued: a lost connection inside backward waits for the next sync point
            with pytest.raises(gt.WorkerLost, match=r"lost the connection to the worker of lease test-.*"
                                                    r"\(worker ended, lease expired or revoked, or network failure\)"):
                loss.item()
            with pytest.raises(gt.WorkerLost, match=r"lost the connection to the worker of lease "):
                torch.ones(2, device=dev) + 1
        finally:
            gt.detach()


def _train(env_extra, steps):
    env = {k: v for k, v in os.environ.items() if k != "GPUCTL_ATTACH"}
    env["PYTHONPATH"] = ROOT
    env.update(env_extra)
    return env, [sys.executable, os.path.join(ROOT, "examples", "resnet_train.py"), "--steps", str(steps), "--json"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from gpuctl.fleet.demo import start_demo_fleet

    fleet = start_demo_fleet(nodes=1, gpus=8, seed=0, root=tmp_path_factory.mktemp("demo"))
    try:
        yield fleet
    finally:
        fleet.stop()


def _leases(demo):
    from daemon_proc import uds_client

    with uds_client(demo.nodes[0].socket) as c:
        return c.get("/v1/leases").json()["leases"]


def test_example_20_steps_through_gpuctl_run_matches_local(demo):
    env, argv = _train({}, 20)
    local = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    r = subprocess.run([sys.executable, "-m", "gpuctl.cli", "--config", str(demo.config_path), "run", "--dept",
                        "research", "--gpus", "0.5", "--", *argv], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lo, re_ = json.loads(local.stdout.splitlines()[-1]), json.loads(r.stdout.splitlines()[-1])
    assert lo["device"] == "cpu" and re_["device"] == "gpuctl:0"
    assert len(re_["loss"]) == 20
    torch.testing.assert_close(torch.tensor(re_["loss"]), torch.tensor(lo["loss"]), rtol=1e-5, atol=0)
    assert re_["loss"][-1] < re_["loss"][0]
    assert _leases(demo) == []


def test_worker_killed_under_gpuctl_run_frees_the_slice(demo):
    import signal
    import time

    env, argv = _train({}, 100000)
    p = subprocess.Popen([sys.executable, "-m", "gpuctl.cli", "--config", str(demo.config_path), "run", "--dept",
                          "research", "--gpus", "0.5", "--", *argv], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("step 1 loss")
        (lease,) = _leases(demo)
        os.kill(lease["worker_pid"], signal.SIGKILL)  # mid-training
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert f"WorkerLost: lost the connection to the worker of lease {lease['id']}" in err
    deadline = time.monotonic() + 10
    while _leases(demo) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leases(demo) == []  # the slice is free again
