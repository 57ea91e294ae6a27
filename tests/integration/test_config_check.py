"""`gpuctl config check`: every problem in one pass, the console's theme and colors, `--connect`,
and key suggestions by meaning (issue 9 item 14)."""

from __future__ import annotations

import pytest

from daemon_proc import start_daemon
from fleet_fixtures import run_cli
from gpuctl.config import ConfigErrors, parse_config, suggest_key

BROKEN = """\
theme = "no-such-theme"

[[department]]
name = "research"
color = "blurple"

[[department]]
name = "training"
priority = -1

[[node]]
name = "a"
hostname = "gpu-a"

[[node]]
name = "b"
host = "gpu-b"
port = 99999
"""


def test_every_problem_in_one_pass_with_theme_and_color(tmp_path):
    # Before: only the first problem was said, and an unknown theme or color passed the check.
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(BROKEN)
    r = run_cli("--config", str(cfg), "config", "check")
    assert r.code == 3, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    expected = [
        f"{cfg}:1: theme: unknown theme 'no-such-theme'; known themes: ",
        f"{cfg}:5: department[0].color: unknown color 'blurple': use '#rrggbb' or a CSS color name like 'dodgerblue'",
        f"{cfg}:9: department[1].priority: must be an integer >= 0, got -1",
        f"{cfg}:13: node[0].hostname: unknown key 'hostname' in [[node]] (did you mean 'host'?)",
        f"{cfg}:18: node[1].port: must be an integer 1..65535, got 99999",
    ]
    assert len(lines) == len(expected), r.stderr
    for line, want in zip(lines, expected):
        assert want in line, (line, want)
    assert "gpuctl-dark" in lines[0] and "missing required key 'host'" not in r.stderr  # said once, as the typo
    j = run_cli("--config", str(cfg), "--json", "config", "check")
    assert j.code == 3 and j.json["error"]["message"].count("\n") == 4


def test_status_reports_every_problem_too_but_not_console_checks(tmp_path):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(BROKEN)
    r = run_cli("--config", str(cfg), "status")
    assert r.code == 3
    assert "node[1].port" in r.stderr and "node[0].hostname" in r.stderr and "priority" in r.stderr


def test_key_suggestions_prefer_the_meaning():
    node_keys = ("name", "host", "port", "user", "identity_file", "transport", "socket", "gpuctld", "timeout_s")
    assert suggest_key("hostname", node_keys) == "host"  # difflib alone says 'name' as often
    assert suggest_key("username", node_keys) == "user"
    assert suggest_key("IdentityFile", node_keys) == "identity_file"
    assert suggest_key("timeout", node_keys) == "timeout_s"
    assert suggest_key("hots", node_keys) == "host"
    assert suggest_key("zzz", node_keys) is None
    with pytest.raises(ConfigErrors) as e:
        parse_config(b'[[node]]\nname = "a"\nhostname = "h"\nusername = "u"\n', "f.toml")
    assert [str(x) for x in e.value.errors] == [
        "f.toml:3: node[0].hostname: unknown key 'hostname' in [[node]] (did you mean 'host'?)",
        "f.toml:4: node[0].username: unknown key 'username' in [[node]] (did you mean 'user'?)"]


def test_connect_reaches_every_node_and_reports_each(tmp_path):
    d1 = start_daemon(tmp_path, gpus=1, seed=1, name="n1")
    d2 = start_daemon(tmp_path, gpus=1, seed=2, name="n2")
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'theme = "gpuctl-light"\n[[department]]\nname = "r"\ncolor = "dodgerblue"\n'
                   f'[[node]]\nname = "n1"\ntransport = "local"\nsocket = "{d1.socket_path}"\n'
                   f'[[node]]\nname = "n2"\ntransport = "local"\nsocket = "{d2.socket_path}"\n')
    try:
        ok = run_cli("--config", str(cfg), "--json", "config", "check", "--connect")
        assert ok.code == 0, ok.stderr
        assert [(x["name"], x["ok"]) for x in ok.json["connect"]] == [("n1", True), ("n2", True)]
        d2.stop()
        r = run_cli("--config", str(cfg), "config", "check", "--connect")
        assert r.code == 7, r.stderr
        assert "  connect n1: OK in " in r.stdout
        assert "  connect n2: FAILED: node n2: gpuctld is not running" in r.stdout
        assert "cannot reach 1 of 2 node(s): n2" in r.stderr
        plain = run_cli("--config", str(cfg), "config", "check")  # without --connect nothing is reached
        assert plain.code == 0 and "  connect " not in plain.stdout
    finally:
        d1.stop()
        d2.stop()


def test_console_blames_the_config_file_for_its_theme(tmp_path, monkeypatch):
    # Before: an unknown theme in the config was reported as a `--theme` flag never given (exit 2).
    import gpuctl.cli.console as console_cli
    from gpuctl.config import ConfigError
    from gpuctl.fleet.simulated import SimulatedFleetSource

    monkeypatch.setattr(console_cli, "require_terminal", lambda: None)
    with pytest.raises(ConfigError, match=r"fleet.toml: theme: unknown theme 'nope'; known themes: .*gpuctl-dark"):
        console_cli.run_console(SimulatedFleetSource(nodes=1, gpus_per_node=1), theme="nope", theme_from="fleet.toml")
    with pytest.raises(console_cli.UsageError, match="--theme: unknown theme 'nope'"):
        console_cli.run_console(SimulatedFleetSource(nodes=1, gpus_per_node=1), theme="nope")
