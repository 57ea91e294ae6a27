"""The package the tests exercise is the installed one, importable from any working directory.

Run from the repository root, `import gpuctl` finds ./gpuctl through sys.path[0] even when the
installation is broken or is another copy (shadowing): the suite would pass while `gpuctl` and
`gpuctld` run by a user, from their own directory, fail or run other code. These tests import and
run from a temporary directory, with no PYTHONPATH, and require this checkout's code.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from daemon_proc import REPO_ROOT


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}


def test_installed_package_imports_from_another_directory(tmp_path):
    code = ("import gpuctl, gpuctl.cli, gpuctl.daemon.main, gpuctl.remote; "
            "print(gpuctl.__file__); print(gpuctl.__version__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env=_clean_env(), timeout=60)
    assert p.returncode == 0, f"gpuctl does not import outside the repository (is it installed?): {p.stderr}"
    where, version = p.stdout.split()
    assert Path(where).resolve() == (REPO_ROOT / "gpuctl" / "__init__.py").resolve(), (
        f"the installed gpuctl is {where}, not this checkout's: run pip install -e . here")
    assert version == md.version("gpuctl")


def _script(name: str) -> Path:
    for d in (sysconfig.get_path("scripts"), os.path.join(site.USER_BASE or "", "bin")):
        if (Path(d) / name).is_file():
            return Path(d) / name
    raise AssertionError(f"no {name} console script next to {sys.executable} or in the user scripts dir")


def test_console_scripts_run_from_another_directory(tmp_path):
    for name, usage in (("gpuctl", "usage: gpuctl"), ("gpuctld", "usage: gpuctld")):
        p = subprocess.run([str(_script(name)), "--help"], capture_output=True, text=True, cwd=tmp_path,
                           env=_clean_env(), timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(usage), p.stdout[:200]
