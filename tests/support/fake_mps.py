"""A fake `nvidia-cuda-mps-control` for CPU tests of gpuctld's MPS manager.

`install_fake_mps(dir)` writes an executable named nvidia-cuda-mps-control into ``dir/bin`` and
returns (bin dir, calls log). Put the bin dir first on PATH. What the fake does, like the real one:

- ``-d``: needs CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY; creates ``<pipe>/control``
  (the real daemon's control pipe) holding the CUDA_VISIBLE_DEVICES it was started with, exits 0.
  With FAKE_MPS_FAIL set in its environment it prints that text to stderr and exits 1 instead.
- no argument: reads commands on stdin; ``quit`` removes ``<pipe>/control`` (exit 0); with no
  control pipe it says so and exits 1.

Every call appends one JSON line to the calls log: {"argv", "visible", "pipe", "log", "stdin"}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FAKE = r'''#!{python}
import json, os, sys
log_path = {log!r}
argv = sys.argv[1:]
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
logd = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
stdin = "" if "-d" in argv else sys.stdin.read()
with open(log_path, "a") as f:
    f.write(json.dumps({{"argv": argv, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "pipe": pipe,
                        "log": logd, "stdin": stdin}}) + "\n")
if "-d" in argv:
    if os.environ.get("FAKE_MPS_FAIL"):
        print(os.environ["FAKE_MPS_FAIL"], file=sys.stderr)
        sys.exit(1)
    os.makedirs(pipe, exist_ok=True)
    with open(os.path.join(pipe, "control"), "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    sys.exit(0)
control = os.path.join(pipe, "control")
if not os.path.exists(control):
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
if "quit" in stdin.split():
    os.remove(control)
sys.exit(0)
'''


def install_fake_mps(directory: Path) -> tuple[Path, Path]:
    """Write the fake into ``directory/bin``; returns (bin dir, calls log path)."""
    bin_dir = Path(directory) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = Path(directory) / "mps-calls.jsonl"
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE.format(python=sys.executable, log=str(log)))
    exe.chmod(0o755)
    return bin_dir, log


def calls(log: Path) -> list[dict]:
    """The fake's calls so far, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def path_with(bin_dir: Path) -> str:
    """PATH with `bin_dir` first."""
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
