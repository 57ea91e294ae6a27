"""The headless core never imports textual (checked in a fresh interpreter per module)."""

import subprocess
import sys

import pytest

HEADLESS = [
    "gpuctl.model",
    "gpuctl.exit_codes",
    "gpuctl.config",
    "gpuctl.backends",
    "gpuctl.backends.simulated",
    "gpuctl.backends.nvml",
    "gpuctl.daemon.state",
    "gpuctl.daemon.telemetry",
    "gpuctl.daemon.api",
    "gpuctl.daemon.main",
    "gpuctl.daemon.bridge",
    "gpuctl.transport",
    "gpuctl.fleet.client",
    "gpuctl.fleet.reassign",
    "gpuctl.cli",
    "gpuctl.fleet.demo",
    "gpuctl.fleet.simulated",
]


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_module_does_not_import_textual(module):
    code = f"import sys, {module}; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"{module} pulls in textual"


def test_import_linter_contract_is_kept():
    """pyproject.toml's import-linter contract (headless modules never import textual directly)."""
    import shutil

    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter not installed (pip install -e '.[test]')")
    from pathlib import Path

    out = subprocess.run([exe], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout
