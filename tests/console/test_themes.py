"""Theme files: loading, validation errors naming the place, fallback, and CSS hygiene."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.color import Color

from gpuctl.app import build_app
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.themes import (
    DEFAULT_THEME,
    GPUCTL_VARIABLES,
    REPO_THEMES_DIR,
    ThemeFileError,
    load_theme_file,
    load_themes,
)

GOOD = """\
name = "mine"
dark = false
[colors]
primary = "#123456"
background = "#FFFFFF"
[variables]
dept-0 = "#0072B2"
footer-key-foreground = "#000000"
"""


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_repo_themes_load_and_define_every_gpuctl_variable():
    result = load_themes([REPO_THEMES_DIR])
    assert result.errors == []
    assert sorted(result.themes) == ["gpuctl-dark", "gpuctl-light", "high-contrast"]
    for theme in result.themes.values():
        assert set(GPUCTL_VARIABLES) <= set(theme.variables), theme.name
        depts = [theme.variables[f"dept-{i}"].upper() for i in range(8)]
        assert len(set(depts)) == 8, f"{theme.name}: department colors must differ"
    assert result.themes["gpuctl-light"].dark is False


def test_good_file(tmp_path):
    theme = load_theme_file(write(tmp_path, "x.toml", GOOD))
    assert theme.name == "mine" and theme.dark is False and theme.primary == "#123456"
    assert theme.variables == {"dept-0": "#0072B2", "footer-key-foreground": "#000000"}


def test_name_defaults_to_stem_and_bom_is_accepted(tmp_path):
    text = GOOD.replace('name = "mine"\n', "")
    theme = load_theme_file(write(tmp_path, "stem-name.toml", b"\xef\xbb\xbf" + text.encode()))
    assert theme.name == "stem-name"


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "x"\n[colors]\nprimary = \n', r"x\.toml: invalid TOML: .*\(at line 3, column 11\)"),
        (GOOD.replace('primary = "#123456"', 'primary = "nothex"'), r"x\.toml:4: colors\.primary: failed to parse 'nothex' as a color"),
        (GOOD.replace('dept-0 = "#0072B2"', 'dept-0 = "blurple"'), r"x\.toml:7: variables\.dept-0: failed to parse 'blurple'"),
        (GOOD.replace('primary = "#123456"\n', ""), r"x\.toml: colors\.primary is required"),
        (GOOD.replace('dark = false', 'dark = "no"'), r"x\.toml:2: dark: expected true or false, got 'no'"),
        ('colour = "red"\n' + GOOD, r"x\.toml:1: unknown key 'colour' \(known: colors, dark, "),
        (GOOD.replace("[variables]", 'shade = "#000000"\n[variables]'), r"x\.toml:6: colors\.shade: unknown color"),
        (GOOD.replace('footer-key-foreground = "#000000"', "footer-key-foreground = 3"), r"variables\.footer-key-foreground: expected a string, got 3"),
        ("luminosity_spread = 2\n" + GOOD, r"x\.toml:1: luminosity_spread: expected a number in 0\.\.1, got 2"),
    ],
)
def test_bad_file_names_file_line_and_field(tmp_path, text, message):
    with pytest.raises(ThemeFileError, match=message):
        load_theme_file(write(tmp_path, "x.toml", text))


def test_non_utf8_file(tmp_path):
    with pytest.raises(ThemeFileError, match=r"x\.toml: theme file must be UTF-8 \(byte 8 is not\)"):
        load_theme_file(write(tmp_path, "x.toml", 'name = "\xd1\xd0"\n'.encode("latin-1")))


def test_missing_file(tmp_path):
    with pytest.raises(ThemeFileError, match=r"nope\.toml: cannot read theme file"):
        load_theme_file(tmp_path / "nope.toml")


def test_bad_file_is_skipped_and_others_still_load(tmp_path):
    write(tmp_path, "a-good.toml", GOOD)
    write(tmp_path, "b-bad.toml", "[colors\n")
    result = load_themes([tmp_path, tmp_path / "missing-dir"])
    assert list(result.themes) == ["mine"]
    assert len(result.errors) == 1 and "b-bad.toml: invalid TOML" in result.errors[0]


def test_user_dir_overrides_repo_theme(tmp_path):
    write(tmp_path, "gpuctl-dark.toml", GOOD.replace('"mine"', '"gpuctl-dark"'))
    result = load_themes([REPO_THEMES_DIR, tmp_path])
    assert result.themes["gpuctl-dark"].primary == "#123456"


async def test_app_reports_bad_theme_once_and_uses_default(tmp_path, capsys):
    write(tmp_path, "broken.toml", "[colors]\nprimary = 7\n")
    src = SimulatedFleetSource(nodes=1, gpus_per_node=1, history_warmup_samples=0)
    app = build_app(src, theme_dirs=[REPO_THEMES_DIR, tmp_path], refresh_s=3600)
    err = capsys.readouterr().err
    assert err.count("broken.toml") == 1 and "colors.primary: expected a color string, got 7" in err
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.theme == DEFAULT_THEME
        flashes = [m for m in app.flash_log if "broken.toml" in m]
        assert len(flashes) == 1 and flashes[0].startswith("theme skipped: ")


async def test_theme_arg_and_theme_command_switch_palette():
    src = SimulatedFleetSource(nodes=1, gpus_per_node=2, history_warmup_samples=0)
    app = build_app(src, theme="gpuctl-light", theme_dirs=[REPO_THEMES_DIR], refresh_s=3600)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.theme == "gpuctl-light"
        light = load_themes([REPO_THEMES_DIR]).themes
        assert app.palette.get("gpu-util-high") == Color.parse(light["gpuctl-light"].variables["gpu-util-high"]).hex
        assert app.palette.department("research") == Color.parse(light["gpuctl-light"].variables["dept-0"]).hex
        assert app.run_command("theme high-contrast") is True
        await pilot.pause()
        assert app.palette.department("research") == Color.parse(light["high-contrast"].variables["dept-0"]).hex
        assert app.run_command("theme nope") is False
        assert app.flash_log[-1].startswith("unknown theme 'nope'; known: gpuctl-dark, gpuctl-light, high-contrast")
        assert app.theme == "high-contrast"


def test_stylesheets_use_variables_not_hex_codes():
    root = Path(__file__).resolve().parents[2] / "gpuctl"
    sheets = list(root.rglob("*.tcss"))
    assert any(p.name == "app.tcss" for p in sheets)
    hex_color = re.compile(r":[^;{}]*#[0-9a-fA-F]{3,8}\b")
    for path in sheets:
        text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        assert not hex_color.search(text), f"{path}: use theme variables, not hex colors"
