"""examples/mlp_train.py runs unchanged through gpuctl.remote and gives local NumPy's loss curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from gpuctl.datapath.testing import running_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GPUCTL_ATTACH"}
    env["PYTHONPATH"] = ROOT
    env.update(env_extra)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mlp_train.py"), "--epochs", "6", "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [ln.split()[:2] for ln in lines[:-1]] == [["epoch", str(i)] for i in range(1, 7)]
    return json.loads(lines[-1])


def test_mlp_loss_curve_matches_local_numpy():
    local = _run({})
    with running_worker() as (handle, url):
        remote = _run({"GPUCTL_ATTACH": url})
        stats = handle.stats()
    assert local["backend"] == "numpy" and remote["backend"] == "gpuctl.remote"
    np.testing.assert_allclose(remote["loss"], local["loss"], rtol=1e-5)
    assert remote["loss"][-1] < remote["loss"][0] * 0.5  # it learns
    assert stats is None or stats["lease_id"] == handle.lease_id
