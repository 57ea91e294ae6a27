"""Tests of gpuctl.config: the fleet TOML loader, its error messages and render_config.

Covers the field cases toml-01 (tests/cases/config/bom.toml, gbk.toml) and toml-02
(redefine-*.toml, unicode-key.toml) of /work/shared/cases/README.md.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.config import (
    ConfigError,
    DepartmentConfig,
    FleetConfig,
    Location,
    NodeConfig,
    _toml_error,
    default_config_path,
    load_config,
    name_key,
    parse_config,
    render_config,
)

CASES = Path(__file__).resolve().parents[1] / "cases" / "config"

FULL = """\
# the fleet
theme = "gpuctl-dark"
refresh_s = 2
max_parallel = 4

[[department]]
name = "research"
priority = 10
color = "#FF8800"

[[department]]
name = "研究部"
color = "$dept-lab"

[[node]]
name = "gpu01"
host = "gpu01.example.com"
user = "admin"
port = 2222
identity_file = "~/.ssh/id_ed25519"
socket = "/run/gpuctld/other.sock"
gpuctld = "/opt/gpuctl/bin/gpuctld"
timeout_s = 2.5

[[node]]
name = "gpu02"
host = "gpu02"

[[node]]
name = "sim"
transport = "local"
socket = "/tmp/sim.sock"
"""


def parse(text: str, path: str = "fleet.toml") -> FleetConfig:
    return parse_config(text.encode("utf-8"), path)


def error(text: str | bytes, path: str = "fleet.toml") -> ConfigError:
    """The ConfigError that parsing `text` raises (and proof that nothing was returned)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    result = None
    with pytest.raises(ConfigError) as info:
        result = parse_config(data, path)
    assert result is None
    return info.value


# ---------------------------------------------------------------------------------------- valid files


def test_full_config_every_field():
    cfg = parse(FULL)
    assert cfg.path == "fleet.toml"
    assert cfg.theme == "gpuctl-dark"
    assert cfg.refresh_s == 2.0 and isinstance(cfg.refresh_s, float)
    assert cfg.max_parallel == 4
    assert cfg.departments == (
        DepartmentConfig(name="research", priority=10, color="#FF8800"),
        DepartmentConfig(name="研究部", priority=100, color="$dept-lab"),
    )
    assert cfg.nodes[0] == NodeConfig(
        name="gpu01",
        host="gpu01.example.com",
        user="admin",
        port=2222,
        identity_file="~/.ssh/id_ed25519",
        socket="/run/gpuctld/other.sock",
        transport="ssh",
        gpuctld="/opt/gpuctl/bin/gpuctld",
        timeout_s=2.5,
    )
    assert cfg.nodes[1] == NodeConfig(name="gpu02", host="gpu02")
    assert cfg.nodes[1].socket is None and cfg.nodes[1].socket_path == "/run/gpuctld/gpuctld.sock"
    assert cfg.nodes[1].gpuctld == "gpuctld" and cfg.nodes[1].timeout_s == 5.0
    assert cfg.nodes[2] == NodeConfig(name="sim", host=None, transport="local", socket="/tmp/sim.sock")
    # source lines: the line of each [[...]] header
    assert [d.source for d in cfg.departments] == [Location("fleet.toml", 6), Location("fleet.toml", 11)]
    assert [str(n.source) for n in cfg.nodes] == ["fleet.toml:15", "fleet.toml:25", "fleet.toml:29"]


def test_empty_file_is_an_empty_fleet_with_defaults():
    cfg = parse("")
    assert cfg == FleetConfig(path="fleet.toml")
    assert (cfg.nodes, cfg.departments, cfg.theme, cfg.refresh_s, cfg.max_parallel) == ((), (), None, 1.0, 16)


def test_table_form_names_from_keys():
    cfg = parse(
        '[department.research]\npriority = 5\n\n[department."研究部"]\ncolor = "teal"\n\n'
        '[node.gpu01]\nhost = "10.0.0.1"\n\n[node."sim-1"]\ntransport = "local"\nsocket = "/s"\n'
    )
    assert [(d.name, d.priority, d.color) for d in cfg.departments] == [("research", 5, None), ("研究部", 100, "teal")]
    assert [(d.source.line) for d in cfg.departments] == [1, 4]
    assert [(n.name, n.host, n.transport) for n in cfg.nodes] == [("gpu01", "10.0.0.1", "ssh"), ("sim-1", None, "local")]
    assert [n.source.line for n in cfg.nodes] == [7, 10]


def test_table_form_with_equal_name_key_is_accepted():
    cfg = parse('[node.gpu01]\nname = "gpu01"\nhost = "h"\n')
    assert cfg.nodes == (NodeConfig(name="gpu01", host="h"),)


def test_lookups():
    cfg = parse(FULL)
    assert cfg.node("gpu02") is cfg.nodes[1]
    assert cfg.department("研究部").color == "$dept-lab"
    assert cfg.node("gpu09") is None
    assert cfg.department("unassigned") is None
    assert FleetConfig(path="x").node("gpu01") is None


def test_load_config_reads_file(tmp_path):
    p = tmp_path / "fleet.toml"
    p.write_bytes(FULL.encode())
    cfg = load_config(p)
    assert cfg.path == str(p)
    assert [n.name for n in cfg.nodes] == ["gpu01", "gpu02", "sim"]
    assert cfg.nodes[0].source == Location(str(p), 15)


def test_load_config_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"{missing}: config file not found (create it, or pass --config PATH)"
    assert info.value.line is None and info.value.path == str(missing)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a regular file"


def test_default_config_path(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "gpuctl" / "fleet.toml"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert default_config_path() == tmp_path / "home" / ".config" / "gpuctl" / "fleet.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # ignored, as the XDG spec says
    assert default_config_path() == tmp_path / "home" / ".config" / "gpuctl" / "fleet.toml"


# ------------------------------------------------------------------------- field cases toml-01, toml-02


def test_case_bom_is_accepted():
    data = (CASES / "bom.toml").read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    cfg = load_config(CASES / "bom.toml")
    assert cfg.departments == (DepartmentConfig(name="research", priority=1),)
    assert cfg.departments[0].source.line == 1


def test_bom_error_columns_do_not_count_the_bom():
    e = error(b"\xef\xbb\xbfx = = 1\n")
    assert (e.line, e.column) == (1, 5)


def test_case_gbk_is_refused_naming_the_first_bad_byte():
    path = str(CASES / "gbk.toml")
    with pytest.raises(ConfigError) as info:
        load_config(CASES / "gbk.toml")
    e = info.value
    assert (e.path, e.line, e.column, e.key) == (path, 2, 9, None)
    assert e.message.startswith(f"config must be UTF-8 ({path}): byte 0xb2 at offset 23 (line 2, column 9)")
    assert str(e) == f"{path}:2:9: {e.message}"
    assert e.message.endswith("is not valid UTF-8; save the file as UTF-8")


def test_utf16_file_gets_its_own_hint():
    e = error('name = "x"\n'.encode("utf-16"))
    assert (e.line, e.column) == (1, 1)
    assert "byte 0xff at offset 0" in e.message
    assert e.message.endswith("the file looks like UTF-16: save it as UTF-8")


def test_bad_byte_after_multibyte_characters_counts_characters():
    e = error(b'a = "\xe7\xa0\x94"\nb = "x\xff"\n')  # line 1 holds a 3-byte character
    assert (e.line, e.column) == (2, 7)
    assert "byte 0xff at offset 16" in e.message


def test_case_department_defined_twice_names_both_places():
    path = str(CASES / "redefine-department.toml")
    with pytest.raises(ConfigError) as info:
        load_config(CASES / "redefine-department.toml")
    assert str(info.value) == f"{path}:3: department 'research' is defined twice (first at {path}:1)"
    assert (info.value.line, info.value.column, info.value.key) == (3, None, None)


def test_case_redefine_dotted():
    path = str(CASES / "redefine-dotted.toml")
    with pytest.raises(ConfigError) as info:
        load_config(CASES / "redefine-dotted.toml")
    e = info.value
    assert (e.path, e.line, e.column) == (path, 2, 6)
    assert str(e) == (
        f"{path}:2:6: invalid TOML: Cannot declare ('node',) twice; "
        "table [node] is defined twice (first at line 1); define it once"
    )


def test_case_redefine_value():
    path = str(CASES / "redefine-value.toml")
    with pytest.raises(ConfigError) as info:
        load_config(CASES / "redefine-value.toml")
    e = info.value
    assert (e.path, e.line, e.column) == (path, 4, 13)
    assert str(e) == (
        f"{path}:4:13: invalid TOML: Cannot overwrite a value; "
        "key 'department.priority' is defined twice (first at line 3); define it once"
    )


def test_case_unicode_bare_key_hint():
    path = str(CASES / "unicode-key.toml")
    with pytest.raises(ConfigError) as info:
        load_config(CASES / "unicode-key.toml")
    e = info.value
    assert (e.path, e.line, e.column) == (path, 1, 13)
    assert str(e) == (
        f"{path}:1:13: invalid TOML: Invalid initial character for a key part; "
        "bare keys must be ASCII letters, digits, '_' or '-': "
        'quote non-ASCII names, e.g. [department."研究部"]'
    )


def test_unicode_bare_key_at_line_start_gets_the_hint_too():
    e = error('[[department]]\nname = "a"\n研究 = 1\n')
    assert (e.line, e.column) == (3, 1)
    assert e.message.endswith('quote non-ASCII names, e.g. [department."研究部"]')


def test_redefined_array_table_and_key_into_value():
    e = error('[[department]]\nname = "a"\n\n[department]\npriority = 1\n')
    assert e.line == 4
    assert "table [department] is defined twice (first at line 1)" in e.message
    e = error('theme = "x"\n\n# a comment\ntheme.dark = 1\n')
    assert (e.line, e.message) == (
        4,
        "invalid TOML: Cannot overwrite a value; key 'theme' is defined twice (first at line 1); define it once",
    )


def test_redefinition_inside_array_element_names_the_element():
    e = error('[[node]]\nname = "a"\nhost = "h"\n[[node]]\nname = "b"\nhost = "h"\nhost = "i"\n')
    assert e.line == 7
    assert "key 'node[1].host' is defined twice (first at line 6)" in e.message


def test_other_syntax_errors_have_position_and_no_hint():
    e = error('[[node]]\nname = "a\n')
    assert (e.line, e.column) == (2, 10)
    assert e.message == "invalid TOML: Illegal character '\\n'; a string is not closed before the end of its line"
    e = error("x = [1, 2")
    assert e.line == 1 and e.message == "invalid TOML: Unclosed array"


def test_toml_error_reads_python_314_attributes():
    # Python 3.14 keeps the message and position in attributes; the text may or may not carry them.
    exc = tomllib.TOMLDecodeError("Cannot overwrite a value")
    exc.msg, exc.lineno, exc.colno = "Cannot overwrite a value", 2, 5
    text = "a = 1\na = 2\n"
    e = _toml_error(exc, text, "f.toml")
    assert str(e) == "f.toml:2:5: invalid TOML: Cannot overwrite a value; key 'a' is defined twice (first at line 1); define it once"


def test_toml_error_at_end_of_document():
    exc = tomllib.TOMLDecodeError("Unclosed array (at end of document)")
    e = _toml_error(exc, "a = 1\nx = [", "f.toml")
    assert (e.line, e.column, e.message) == (2, 6, "invalid TOML: Unclosed array")


# ---------------------------------------------------------------------------------------- value errors


@pytest.mark.parametrize(
    "body, key, message",
    [
        ('name = 5\nhost = "h"', "node[0].name", "must be a string, got 5"),
        ('name = ""\nhost = "h"', "node[0].name", "must not be empty"),
        ('name = "a b"\nhost = "h"', "node[0].name", "node name 'a b' must not contain spaces"),
        ('name = " a"\nhost = "h"', "node[0].name", "name ' a' must not start or end with spaces or hold control characters"),
        ('name = "a"\nhost = 1', "node[0].host", "must be a string, got 1"),
        ('name = "a"\nhost = ""', "node[0].host", "must not be empty"),
        ('name = "a"\nhost = "h"\nuser = ["x"]', "node[0].user", "must be a string, got an array"),
        ('name = "a"\nhost = "h"\nport = "abc"', "node[0].port", "must be an integer 1..65535, got 'abc'"),
        ('name = "a"\nhost = "h"\nport = 0', "node[0].port", "must be an integer 1..65535, got 0"),
        ('name = "a"\nhost = "h"\nport = 65536', "node[0].port", "must be an integer 1..65535, got 65536"),
        ('name = "a"\nhost = "h"\nport = true', "node[0].port", "must be an integer 1..65535, got true"),
        ('name = "a"\nhost = "h"\nport = 22.0', "node[0].port", "must be an integer 1..65535, got 22.0"),
        ('name = "a"\nhost = "h"\nidentity_file = {}', "node[0].identity_file", "must be a string, got a table"),
        ('name = "a"\nhost = "h"\nsocket = 3', "node[0].socket", "must be a string, got 3"),
        ('name = "a"\nhost = "h"\ntransport = "tcp"', "node[0].transport", "must be 'ssh' or 'local', got 'tcp'"),
        ('name = "a"\nhost = "h"\ngpuctld = false', "node[0].gpuctld", "must be a string, got false"),
        ('name = "a"\nhost = "h"\ntimeout_s = 0', "node[0].timeout_s", "must be a number of seconds > 0, got 0"),
        ('name = "a"\nhost = "h"\ntimeout_s = -1.5', "node[0].timeout_s", "must be a number of seconds > 0, got -1.5"),
        ('name = "a"\nhost = "h"\ntimeout_s = nan', "node[0].timeout_s", "must be a number of seconds > 0, got nan"),
        ('name = "a"\nhost = "h"\ntimeout_s = inf', "node[0].timeout_s", "must be a number of seconds > 0, got inf"),
        ('name = "a"\nhost = "h"\ntimeout_s = "5"', "node[0].timeout_s", "must be a number of seconds > 0, got '5'"),
    ],
)
def test_node_field_errors(body, key, message):
    text = '[[node]]\nname = "ok"\nhost = "h"\n\n[[node]]\n' + body + "\n"
    key = key.replace("node[0]", "node[1]")
    e = error(text)
    field_name = key.split(".")[-1]
    line = 6 + [ln.split(" ")[0] for ln in body.split("\n")].index(field_name)  # body starts at line 6
    assert (e.key, e.message, e.line, e.column) == (key, message, line, None)
    assert str(e) == f"fleet.toml:{line}: {key}: {message}"


@pytest.mark.parametrize(
    "body, key, message",
    [
        ("name = 1", "department[0].name", "must be a string, got 1"),
        ('name = "a"\npriority = "high"', "department[0].priority", "must be an integer >= 0, got 'high'"),
        ('name = "a"\npriority = -1', "department[0].priority", "must be an integer >= 0, got -1"),
        ('name = "a"\npriority = 1.5', "department[0].priority", "must be an integer >= 0, got 1.5"),
        ('name = "a"\ncolor = 255', "department[0].color", "must be a string, got 255"),
        ('name = "a"\ncolor = "#ff880"', "department[0].color", "must be a hex color '#rrggbb', got '#ff880'"),
        ('name = "a"\ncolor = "#gg8800"', "department[0].color", "must be a hex color '#rrggbb', got '#gg8800'"),
        ('name = "a"\ncolor = "rgb(1,2,3)"', "department[0].color", "must be '#rrggbb' or a color name like 'dodgerblue', got 'rgb(1,2,3)'"),
        ('name = "unassigned"', "department[0].name", "'unassigned' is reserved for slices given to no department; choose another name"),
        ('name = "Unassigned"', "department[0].name", "'unassigned' is reserved for slices given to no department; choose another name"),
    ],
)
def test_department_field_errors(body, key, message):
    e = error("\n[[department]]\n" + body + "\n")
    field_name = key.split(".")[-1]
    line = 3 + [ln.split(" ")[0] for ln in body.split("\n")].index(field_name)
    assert str(e) == f"fleet.toml:{line}: {key}: {message}"


@pytest.mark.parametrize(
    "text, line, key, message",
    [
        ('theme = 1\n', 1, "theme", "must be a string, got 1"),
        ('\nrefresh_s = 0\n', 2, "refresh_s", "must be a number of seconds > 0, got 0"),
        ('refresh_s = "1"\n', 1, "refresh_s", "must be a number of seconds > 0, got '1'"),
        ('max_parallel = 0\n', 1, "max_parallel", "must be an integer >= 1, got 0"),
        ('max_parallel = 2.0\n', 1, "max_parallel", "must be an integer >= 1, got 2.0"),
        ('node = "gpu01"\n', 1, "node", "must be [[node]] tables or [node.NAME] tables, got 'gpu01'"),
        ('node = ["gpu01"]\n', 1, "node[0]", "must be a table ([[node]] with keys below it), got 'gpu01'"),
    ],
)
def test_top_level_errors(text, line, key, message):
    assert str(error(text)) == f"fleet.toml:{line}: {key}: {message}"


def test_unknown_key_with_suggestion():
    e = error('[[node]]\nname = "a"\nhots = "gpu01"\n')
    assert str(e) == "fleet.toml:3: node[0].hots: unknown key 'hots' in [[node]] (did you mean 'host'?)"
    e = error('[department.research]\npriorty = 1\n')
    assert str(e) == (
        "fleet.toml:2: department.research.priorty: unknown key 'priorty' in [department.research] "
        "(did you mean 'priority'?)"
    )
    e = error('refresh = 2\n')
    assert str(e) == "fleet.toml:1: refresh: unknown key 'refresh' in the top level (did you mean 'refresh_s'?)"


def test_unknown_key_without_close_match_lists_the_known_keys():
    e = error('[[department]]\nname = "a"\nzzz = 1\n')
    assert str(e) == (
        "fleet.toml:3: department[0].zzz: unknown key 'zzz' in [[department]] (known keys: name, priority, color)"
    )


def test_missing_name_and_host():
    assert str(error('\n[[node]]\nhost = "h"\n')) == "fleet.toml:2: node[0]: missing required key 'name' in [[node]]"
    assert str(error('[[node]]\nname = "a"\nuser = "u"\n')) == (
        "fleet.toml:1: node[0]: missing required key 'host' in [[node]] (transport 'ssh' needs the SSH host)"
    )
    assert str(error('[node.gpu01]\nport = 22\n')) == (
        "fleet.toml:1: node.gpu01: missing required key 'host' in [node.gpu01] (transport 'ssh' needs the SSH host)"
    )
    assert str(error('[[department]]\npriority = 1\n')) == (
        "fleet.toml:1: department[0]: missing required key 'name' in [[department]]"
    )


def test_local_transport_needs_socket_and_refuses_ssh_keys():
    assert str(error('[[node]]\nname = "sim"\ntransport = "local"\n')) == (
        "fleet.toml:1: node[0]: missing required key 'socket' in [[node]] "
        "(transport 'local' needs the path of gpuctld's Unix socket)"
    )
    e = error('[[node]]\nname = "sim"\ntransport = "local"\nsocket = "/s"\nport = 22\n')
    assert str(e) == "fleet.toml:5: node[0].port: is only used with transport 'ssh' (this node's transport is 'local')"


def test_duplicate_node_names_both_places():
    e = error('[[node]]\nname = "gpu01"\nhost = "a"\n\n[[node]]\nname = "gpu02"\nhost = "b"\n\n[[node]]\nname = "gpu01"\nhost = "c"\n')
    assert str(e) == "fleet.toml:9: node 'gpu01' is defined twice (first at fleet.toml:1)"
    assert (e.line, e.key) == (9, None)


def test_table_form_errors():
    e = error('[node.gpu01]\nname = "gpu02"\nhost = "h"\n')
    assert str(e) == "fleet.toml:2: node.gpu01.name: the node's name is its table key 'gpu01'; remove 'name' or make it equal"
    e = error('[department."研究 部 "]\n')
    assert str(e) == (
        'fleet.toml:1: department."研究 部 ": name \'研究 部 \' must not start or end with spaces or hold control characters'
    )
    e = error("[department.unassigned]\npriority = 1\n")
    assert str(e) == (
        "fleet.toml:1: department.unassigned: 'unassigned' is reserved for slices given to no department; "
        "choose another name"
    )
    # the redefine-value.toml shape without the duplicate: [department] with keys, not [[department]]
    e = error('[department]\nname = "research"\n')
    assert str(e) == (
        "fleet.toml:2: department.name: must be a table [department.NAME] naming the department, got 'research' "
        "(for one department per block, write [[department]] and name = ...)"
    )


def test_lines_survive_multiline_values_and_comments():
    text = (
        '[[node]]  # first\n'
        'name = "a"\n'
        'host = """\nnot [[node]]\nport = 1"""\n'
        "user = '''x\n[[node]]'''\n"
        'gpuctld = "has # hash and \\" quote"\n'
        "identity_file = 'lit [[node]]'\n"
        '"port" = 0\n'
    )
    e = error(text)
    assert str(e) == "fleet.toml:10: node[0].port: must be an integer 1..65535, got 0"


def test_inline_tables_fall_back_to_the_enclosing_key_line():
    e = error('\nnode = [\n  {name = "a", host = "h"},\n  {name = "b", host = "h", port = -1},\n]\n')
    assert str(e) == "fleet.toml:2: node[1].port: must be an integer 1..65535, got -1"


def test_failed_parse_returns_nothing_and_leaves_later_parses_intact(tmp_path):
    p = tmp_path / "fleet.toml"
    p.write_bytes(b'[[node]]\nname = "a"\nhost = "h"\n[[node]]\nname = "b"\nport = 0\n')
    before = p.read_bytes()
    cfg = None
    with pytest.raises(ConfigError) as info:
        cfg = load_config(p)
    assert cfg is None
    # both problems of node[1], in file order (one pass reports every error)
    assert [e.key for e in info.value.errors] == ["node[1]", "node[1].port"]
    assert p.read_bytes() == before  # the loader never writes
    assert parse(FULL).node("gpu01").port == 2222


# ---------------------------------------------------------------------------------------- render


def test_render_round_trip_full():
    cfg = parse(FULL)
    text = render_config(cfg)
    again = parse(text)
    assert again == cfg
    assert again.nodes[2].host is None
    # source lines are not compared but are those of the new text
    assert again.nodes[0].source == Location("fleet.toml", text.split("\n").index("[[node]]") + 1)
    assert [d.source.line for d in again.departments] == [i + 1 for i, ln in enumerate(text.split("\n")) if ln == "[[department]]"]


def test_render_text_shape():
    cfg = FleetConfig(
        path="demo.toml",
        nodes=(NodeConfig(name="sim-0", host=None, transport="local", socket="/tmp/d/sim-0.sock"),),
        departments=(DepartmentConfig(name="ops", priority=1, color="#112233"),),
        refresh_s=0.5,
    )
    assert render_config(cfg) == (
        "refresh_s = 0.5\nmax_parallel = 16\n\n"
        '[[department]]\nname = "ops"\npriority = 1\ncolor = "#112233"\n\n'
        '[[node]]\nname = "sim-0"\nsocket = "/tmp/d/sim-0.sock"\ntransport = "local"\n'
    )
    assert parse_config(render_config(cfg).encode(), "demo.toml") == cfg


def test_render_escapes_awkward_strings():
    cfg = FleetConfig(
        path="fleet.toml",
        nodes=(NodeConfig(name='q"\\n', host="h\tx\x7f\x01é😀", gpuctld="C:\\gpuctl\\gpuctld.exe"),),
        departments=(DepartmentConfig(name="研究部 \"lab\""),),
        theme="a'b",
    )
    assert parse(render_config(cfg)) == cfg


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_name = _text.filter(lambda s: s == s.strip() and s.isprintable())


@settings(max_examples=60, deadline=None)
@given(
    dept_names=st.lists(_name.filter(lambda s: name_key(s) != "unassigned"), max_size=3, unique_by=name_key),
    node_names=st.lists(_name.filter(lambda s: not any(c.isspace() for c in s)), max_size=3, unique_by=name_key),
    host=_text,
    port=st.none() | st.integers(1, 65535),
    timeout_s=st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
    priority=st.integers(0, 2**40),
)
def test_render_round_trip_property(dept_names, node_names, host, port, timeout_s, priority):
    cfg = FleetConfig(
        path="fleet.toml",
        departments=tuple(DepartmentConfig(name=n, priority=priority) for n in dept_names),
        nodes=tuple(NodeConfig(name=n, host=host, port=port, timeout_s=timeout_s) for n in node_names),
    )
    assert parse(render_config(cfg)) == cfg


def test_dataclasses_are_frozen():
    cfg = parse(FULL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nodes[0].port = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_parallel = 1  # type: ignore[misc]


def test_crlf_line_endings_keep_line_numbers():
    cfg = parse(FULL.replace("\n", "\r\n"))
    assert cfg == parse(FULL)
    assert [n.source.line for n in cfg.nodes] == [15, 25, 29]
    e = error('[[node]]\r\nname = "a"\r\nhost = "h"\r\nport = 0\r\n')
    assert str(e) == "fleet.toml:4: node[0].port: must be an integer 1..65535, got 0"


@settings(max_examples=150, deadline=None)
@given(st.text(st.sampled_from(list('[]{}"\'=.#\\\n\r \tab1研')), max_size=60))
def test_scanner_never_raises_or_hangs_on_any_text(text):
    from gpuctl.config import _scan

    lines, last = _scan(text)
    assert all(isinstance(v, int) and v >= 1 for v in lines.values())
    assert last is None or last[1] >= 1
