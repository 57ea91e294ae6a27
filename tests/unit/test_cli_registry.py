"""The verb registry of gpuctl.cli (only the verb parsed is imported) and the one exit-code table
(gpuctl.cli.errors.exit_code_for)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuctl.cli import build_parser, main, verb_of
from gpuctl.cli.errors import NODE_CODE_EXIT, CliError, UsageError, exit_code_for
from gpuctl.cli.registry import VERBS, load
from gpuctl.exit_codes import ExitCode

VERB_MODULES = sorted({target.partition(":")[0] for target, _ in VERBS.values()})


def _modules_after(argv: list[str]) -> set[str]:
    """The gpuctl.cli.* modules a fresh interpreter has loaded after main(argv) (help exits)."""
    code = ("import sys, json\nfrom gpuctl.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpuctl'))), file=sys.stderr)" % argv)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stderr.strip().splitlines()[-1]))


def test_top_help_lists_every_verb_and_imports_no_verb_module():
    loaded = _modules_after(["--help"])
    assert not loaded & set(VERB_MODULES), sorted(loaded & set(VERB_MODULES))
    assert "gpuctl.fleet.client" not in loaded and "gpuctl.config" not in loaded
    help_text = build_parser().format_help()
    for name, (_, summary) in VERBS.items():
        assert name in help_text and summary.split()[0] in help_text


def test_verb_help_imports_only_that_verb_module():
    loaded = _modules_after(["status", "--help"])
    assert "gpuctl.cli.fleet" in loaded
    assert not loaded & (set(VERB_MODULES) - {"gpuctl.cli.fleet"})


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_registry_row_loads_and_adds_its_arguments(verb):
    v = load(verb)
    assert callable(v.add_arguments) and callable(v.run)
    parser = build_parser(verb)
    assert verb in parser.format_help()


@pytest.mark.parametrize("argv, verb", [
    (["status"], "status"),
    (["--json", "status", "--node", "a"], "status"),
    (["--config", "fleet.toml", "leases"], "leases"),
    (["--config=fleet.toml", "run", "--", "x"], "run"),
    (["--conf", "status", "departments"], "departments"),  # an argparse prefix takes a value too
    (["--theme", "gpuctl-light"], None),
    (["--", "status"], None),
    ([], None),
])
def test_verb_of_finds_the_verb_past_global_flags(argv, verb):
    assert verb_of(argv) == verb


def test_exit_code_for_is_one_table():
    from gpuctl.config import ConfigError
    from gpuctl.fleet.bootstrap import BootstrapError
    from gpuctl.fleet.client import NodeError
    from gpuctl.fleet.leases import AcquireError
    from gpuctl.fleet.reassign import ReassignError

    assert exit_code_for(CliError("x", ExitCode.CONFLICT)) == ExitCode.CONFLICT
    assert exit_code_for(UsageError("--node: x")) == ExitCode.USAGE
    assert exit_code_for(KeyboardInterrupt()) == ExitCode.INTERRUPTED
    assert exit_code_for(ConfigError("f.toml", "bad")) == ExitCode.CONFIG
    assert exit_code_for(ReassignError("unknown department")) == ExitCode.USAGE
    assert exit_code_for(BootstrapError("step failed", ExitCode.UNREACHABLE)) == ExitCode.UNREACHABLE
    assert exit_code_for(AcquireError("none idle", "insufficient_slices")) == ExitCode.NOTHING_TO_DO
    assert exit_code_for(AcquireError("none reached", "unreachable")) == ExitCode.UNREACHABLE
    for code, expected in NODE_CODE_EXIT.items():
        assert exit_code_for(NodeError("n1", "refused", code=code, status=409)) == expected
    assert exit_code_for(NodeError("n1", "odd", code="no_such_code", status=500)) == ExitCode.FAILURE
    # any other exception is an internal error, a FileNotFoundError included (not CONFIG)
    assert exit_code_for(FileNotFoundError("/etc/x")) == ExitCode.FAILURE
    assert exit_code_for(RuntimeError("bug")) == ExitCode.FAILURE


def test_missing_config_is_config_error_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "none.toml"
    assert main(["--config", str(missing), "status"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert f"no fleet config at {missing} (from --config)" in err and not missing.exists()


def test_an_unexpected_error_in_a_verb_is_an_internal_error(monkeypatch, capsys, tmp_path):
    import gpuctl.cli.configuration as configuration

    def boom(args):
        raise FileNotFoundError("/nowhere/x")

    monkeypatch.setattr(configuration, "run", boom)
    assert main(["config", "path"]) == ExitCode.FAILURE
    assert "internal error: FileNotFoundError: /nowhere/x" in capsys.readouterr().err
