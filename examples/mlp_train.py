"""A small MLP trained with plain CuPy code: forward, backward and SGD written with array ops.

    GPUCTL_ATTACH=tcp://HOST:PORT?lease=ID&token=HEX python examples/mlp_train.py
    gpuctl run --dept research --gpus 0.25 -- python examples/mlp_train.py
    python examples/mlp_train.py            # no GPUCTL_ATTACH: local NumPy

With GPUCTL_ATTACH set the arrays live on the leased GPU slice (``import gpuctl.remote as cp``);
otherwise NumPy runs it locally. The data and initial weights are drawn on the host from a seeded
NumPy generator, so both runs start from the same numbers and give the same loss curve within
float tolerance. Prints one line per epoch: ``epoch N loss L``; ``--json`` prints the curve.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

if os.environ.get("GPUCTL_ATTACH"):
    import gpuctl.remote as cp
else:
    cp = np


def make_data(n: int, d_in: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points in `n_classes` Gaussian blobs (host arrays): x (n, d_in) float32, one-hot y (n, n_classes)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1, (n_classes, d_in))
    labels = rng.integers(0, n_classes, n)
    x = (centers[labels] + rng.normal(0, 1, (n, d_in))).astype(np.float32)
    y = np.eye(n_classes, dtype=np.float32)[labels]
    return x, y


def train(epochs: int = 20, batch: int = 64, hidden: int = 64, lr: float = 0.1, seed: int = 0) -> list[float]:
    """Train and return the mean loss (cross-entropy) of each epoch."""
    x_host, y_host = make_data(1024, 16, 4, seed)
    rng = np.random.default_rng(seed + 1)
    w1 = cp.asarray((rng.standard_normal((16, hidden)) * np.sqrt(2 / 16)).astype(np.float32))
    b1 = cp.zeros(hidden, dtype=cp.float32)
    w2 = cp.asarray((rng.standard_normal((hidden, 4)) * np.sqrt(2 / hidden)).astype(np.float32))
    b2 = cp.zeros(4, dtype=cp.float32)
    x_all, y_all = cp.asarray(x_host), cp.asarray(y_host)
    n = x_host.shape[0]
    curve = []
    for epoch in range(epochs):
        total = cp.zeros((), dtype=cp.float32)
        for start in range(0, n, batch):
            x, y = x_all[start:start + batch], y_all[start:start + batch]
            # forward
            h_pre = x @ w1 + b1
            h = cp.maximum(h_pre, 0)
            logits = h @ w2 + b2
            logits = logits - logits.max(axis=1, keepdims=True)
            e = cp.exp(logits)
            p = e / e.sum(axis=1, keepdims=True)
            loss = -(y * cp.log(p + 1e-9)).sum(axis=1).mean()
            total += loss * x.shape[0]
            # backward
            g_logits = (p - y) / x.shape[0]
            g_w2 = h.T @ g_logits
            g_b2 = g_logits.sum(axis=0)
            g_h = g_logits @ w2.T
            g_h_pre = cp.where(h_pre > 0, g_h, 0)
            g_w1 = x.T @ g_h_pre
            g_b1 = g_h_pre.sum(axis=0)
            # SGD, in place
            w1 -= lr * g_w1
            b1 -= lr * g_b1
            w2 -= lr * g_w2
            b2 -= lr * g_b2
        curve.append(float(total) / n)  # one synchronization per epoch
        print(f"epoch {epoch + 1} loss {curve[-1]:.6f}", flush=True)
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description="small MLP in plain CuPy code")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print the loss curve as JSON at the end")
    args = ap.parse_args()
    curve = train(args.epochs)
    if args.json:
        print(json.dumps({"backend": cp.__name__, "loss": curve}))


if __name__ == "__main__":
    main()
