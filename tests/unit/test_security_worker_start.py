"""A lease worker never imports code from the daemon's working directory."""

import os
import secrets
import time

from gpuctl.datapath.launcher import start_worker


def test_worker_ignores_a_planted_module_in_the_daemons_cwd(tmp_path, monkeypatch):
    # a hostile `gpuctl` package in the directory gpuctld runs from
    evil = tmp_path / "gpuctl"
    evil.mkdir()
    marker = tmp_path / "pwned"
    (evil / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.chdir(tmp_path)
    h = start_worker(lease_id="L1", token=secrets.token_bytes(32), quota_bytes=1 << 20, compute_share=1.0,
                     executor="numpy", expires_at_s=time.time() + 30)
    try:
        assert h.alive()
        assert os.readlink(f"/proc/{h.pid}/cwd") != str(tmp_path)
    finally:
        h.stop()
    assert not marker.exists()
