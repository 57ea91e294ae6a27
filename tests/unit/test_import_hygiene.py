"""The headless core never imports textual, and gpuctl's modules import each other without circles.

The headless modules are one list, pyproject.toml's import-linter contract: lint-imports checks
their imports statically, and each of them (every module of each listed package) is imported here
in a fresh interpreter with textual then looked for in sys.modules.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.modules import REPO_ROOT, circles, expand, headless_modules, import_graph

#: Modules of the headless packages that need an optional accelerator library to import at all.
NEEDS_OPTIONAL = {"gpuctl.datapath.executor_cupy": "cupy"}

HEADLESS = expand(headless_modules())


def test_the_headless_list_covers_the_cores_named_in_the_design():
    listed = set(headless_modules())
    for core in ("gpuctl.model", "gpuctl.config", "gpuctl.backends", "gpuctl.transport", "gpuctl.daemon",
                 "gpuctl.fleet", "gpuctl.cli", "gpuctl.remote", "gpuctl.datapath", "gpuctl.leasing",
                 "gpuctl.format"):
        assert core in listed, core
    for module in ("gpuctl.fleet.bootstrap", "gpuctl.fleet.simulated", "gpuctl.cli.leases", "gpuctl.remote.cuda"):
        assert module in HEADLESS, module


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_module_does_not_import_textual(module):
    code = f"import sys, {module}; print('textual' in sys.modules, 'textual_plotext' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    if out.returncode != 0 and module in NEEDS_OPTIONAL and f"No module named '{NEEDS_OPTIONAL[module]}'" in out.stderr:
        pytest.skip(f"{module} needs {NEEDS_OPTIONAL[module]}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], f"{module} pulls in textual"


def test_import_linter_contract_is_kept():
    """pyproject.toml's import-linter contract (headless modules never import textual, directly or
    through another module; the one ignored import is the CLI opening the console)."""
    import shutil

    exe = Path(sys.executable).parent / "lint-imports"
    found = str(exe) if exe.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.skip("import-linter not installed (pip install -e '.[test]')")
    out = subprocess.run([found], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_no_import_circles_among_gpuctl_modules():
    graph = import_graph()
    assert len(graph) > 80 and "gpuctl.cli.registry" in graph
    assert graph["gpuctl.cli.leases"] >= {"gpuctl.cli.context", "gpuctl.cli.output", "gpuctl.cli.errors"}
    assert circles(graph) == []


def test_circle_finder_finds_a_circle():
    """The finder itself: a -> b -> c -> a and d -> d's neighbour without a way back."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
