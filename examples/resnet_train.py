"""Plain PyTorch ResNet training; on a leased GPU slice with one changed line (``device = ...``).

    gpuctl run --dept research --gpus 1 -- python examples/resnet_train.py           # remote slice
    python examples/resnet_train.py                                                  # local CPU

Under ``gpuctl run`` (GPUCTL_ATTACH set) the model trains on the lease's worker through
gpuctl.torch; without it, on the local CPU: the same code, the same loss curve. Defaults are small
(a ResNet-18-shaped network at 32x32, batch 8, 5 steps) so that a simulated node (CPU torch in the
worker) answers in seconds; ``--size 224 --batch 256 --steps 50`` is the real thing on a GPU node.
Synthetic data, SGD with momentum, cross-entropy. ``--json`` prints the losses as JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with batch norm, identity or 1x1 shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.short(x))


def resnet18(num_classes: int = 10, width: int = 64) -> nn.Module:
    """A ResNet-18 (2-2-2-2 basic blocks) built from torch.nn; `width` channels in the first stage."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = width
    for i, cout in enumerate((width, width * 2, width * 4, width * 8)):
        for j in range(2):
            layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32, help="image side in pixels (default %(default)s)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=16, help="channels of the first stage (64 = ResNet-18)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", action="store_true", help="print the losses as JSON on the last line")
    args = p.parse_args()

    torch.manual_seed(0)
    if os.environ.get("GPUCTL_ATTACH"):
        import gpuctl.torch

        device = gpuctl.torch.device()  # the one changed line: the leased slice
    else:
        device = torch.device("cpu")
    model = resnet18(width=args.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    images = torch.randn(args.batch, 3, args.size, args.size)
    labels = torch.randint(0, 10, (args.batch,))
    x, y = images.to(device), labels.to(device)
    losses = []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.6f}", flush=True)
    dt = time.perf_counter() - t0
    print(f"{args.steps * args.batch / dt:.1f} images/s on {device}", flush=True)
    if args.json:
        print(json.dumps({"device": str(device), "loss": losses}))


if __name__ == "__main__":
    main()
