"""Adversarial fleet configs: deep nesting, look-alike duplicate names, control characters in shown
strings, numbers that overflow timeouts. Each is a ConfigError naming file, line and key (exit 3
from the CLI), never a crash (exit 1).
"""

from __future__ import annotations

import pytest

from fleet_fixtures import json_error_or_nothing, run_cli
from gpuctl.config import ConfigError, parse_config

NODE = '[[node]]\nname = "{n}"\nhost = "h"\n'
DEPT = '[[department]]\nname = "{n}"\n'


def error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text.encode(), "fleet.toml")
    return info.value


@pytest.mark.parametrize("text", [
    "a = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
], ids=["deep-array", "deep-inline-table"])
def test_deep_nesting_is_a_config_error_not_a_recursion_crash(text):
    assert str(error(text)) == "fleet.toml: invalid TOML: arrays or inline tables are nested too deeply"


@pytest.mark.parametrize("first, second, kind, line", [
    ("Research", "research", "department", 3),
    ("caf\u00e9", "cafe\u0301", "department", 3),  # NFC and NFD spellings look identical
    ("\uff52\uff45\uff53\uff45\uff41\uff52\uff43\uff48", "research", "department", 3),  # fullwidth
    ("GPU01", "gpu01", "node", 4),
], ids=["case", "nfc-nfd", "fullwidth", "node-case"])
def test_names_differing_in_case_or_unicode_form_are_duplicates(first, second, kind, line):
    block = DEPT if kind == "department" else NODE
    e = error(block.format(n=first) + block.format(n=second))
    assert e.line == line
    assert f"{kind} {second!r} is defined twice (as {ascii(first)} and {ascii(second)}" in str(e)
    assert "(first at fleet.toml:1)" in str(e)


@pytest.mark.parametrize("name", ["UNASSIGNED", "\uff55\uff4e\uff41\uff53\uff53\uff49\uff47\uff4e\uff45\uff44"],
                         ids=["upper", "fullwidth"])
def test_unassigned_lookalikes_are_reserved(name):
    e = error(DEPT.format(n=name))
    assert (e.line, e.key) == (2, "department[0].name")
    assert "'unassigned' is reserved" in e.message


@pytest.mark.parametrize("text, key, line", [
    ('theme = "\\u001b]0;pwned\\u0007"\n', "theme", 1),
    (DEPT.format(n="re\\u200bsearch"), "department[0].name", 2),
    (DEPT.format(n="r") + 'color = "$x\\u0000"\n', "department[0].color", 3),
], ids=["theme-escape", "name-zero-width", "color-nul"])
def test_shown_strings_must_be_printable(text, key, line):
    e = error(text)
    assert (e.key, e.line) == (key, line)
    assert "must not hold control or invisible characters" in e.message


@pytest.mark.parametrize("text, key, message", [
    (NODE.format(n="a") + "timeout_s = 1e308\n", "node[0].timeout_s", "must be a number of seconds 0..1e+06, got 1e+308"),
    ("refresh_s = 1e-300\n", "refresh_s", "must be a number of seconds 0.1..1e+06, got 1e-300"),
    ("max_parallel = 9999999999999\n", "max_parallel", "must be an integer 1..1024, got 9999999999999"),
], ids=["timeout-huge", "refresh-tiny", "max-parallel-huge"])
def test_numbers_are_bounded(text, key, message):
    e = error(text)
    assert (e.key, e.message) == (key, message)


def test_cli_reports_overflowing_timeout_as_config_error(tmp_path):
    # Before: `status` died with "internal error: OverflowError" (exit 1).
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[[node]]\nname = "a"\ntransport = "local"\nsocket = "/nonexistent.sock"\ntimeout_s = 1e308\n')
    r = run_cli("--config", str(cfg), "status", "--json")
    assert r.code == 3
    assert json_error_or_nothing(r)["name"] == "CONFIG"  # --json: the error as a document too
    assert f"{cfg}:5: node[0].timeout_s: must be a number of seconds" in r.stderr


def test_crlf_and_bom_still_parse():
    text = "\ufeff" + (NODE.format(n="a") + DEPT.format(n="r")).replace("\n", "\r\n")
    cfg = parse_config(text.encode(), "fleet.toml")
    assert [n.name for n in cfg.nodes] == ["a"] and [d.name for d in cfg.departments] == ["r"]
    assert cfg.nodes[0].source.line == 1 and cfg.departments[0].source.line == 4
