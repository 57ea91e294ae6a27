"""Units and N/A in console cells (gpuctl.format)."""

from __future__ import annotations

import pytest

from gpuctl import format as fmt
from gpuctl.widgets.fleet_rows import _wrap_into


# -- formatting ---------------------------------------------------------------------------------


def test_format_units_and_na():
    assert fmt.human_bytes(None) == "N/A"
    assert fmt.human_bytes(512) == "512 B"
    assert fmt.human_bytes(615 * fmt.MIB) == "615 MiB"
    assert fmt.human_bytes(80 * fmt.GIB) == "80.0 GiB"
    assert fmt.memory_label(41 * fmt.GIB + fmt.GIB // 5, 80 * fmt.GIB) == "41.2/80.0 GiB"
    assert fmt.memory_label(300 * fmt.MIB, 1000 * fmt.MIB) == "300/1000 MiB"
    assert fmt.memory_label(None, 80 * fmt.GIB) == "N/A / 80.0 GiB"
    assert fmt.memory_label(None, None) == "N/A"
    assert fmt.percent(None) == "N/A" and fmt.percent(0.0) == "0%"
    assert fmt.power(None) == "N/A" and fmt.power(0.0) == "0 W"
    assert fmt.temperature(float("nan")) == "N/A"
    assert fmt.sparkline([0, 50, 100, None], 6) == "  ▁▅█ "
    assert fmt.bar(0.5, 4) == "██  "
    assert fmt.bar(0.5, 1) == "▌"
    assert fmt.department_shares([("a", 0.25), ("a", 0.25), ("b", 0.5)]) == [("a", "¼×2"), ("b", "½")]
    assert fmt.department_shares([("a", 0.5), ("a", 0.25)]) == [("a", "¾")]
    assert [fmt.ops_rate(v) for v in (None, 0, 850, 999.6, 1234, 9960, 12345, 999_999, 3.4e6)] == [
        "N/A", "0 op/s", "850 op/s", "1.0k op/s", "1.2k op/s", "10k op/s", "12k op/s", "1.0M op/s", "3.4M op/s"
    ]


def test_wrap_reason_across_columns():
    assert _wrap_into("ssh: connect to host node-04 port 22", [20, 5, 6, 16]) == [
        "ssh: connect to host",
        "",
        "",
        "node-04 port 22",
    ]
    assert _wrap_into("a verylongword", [3, 4]) == ["a", "verylongword"]


def test_bench_console_rejects_bad_arguments():
    """bench/console.py: a bad --size or --seconds is refused with the flag named (exit 2)."""
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "console.py"
    spec = importlib.util.spec_from_file_location("bench_console", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench._size("80x24") == (80, 24)
    with pytest.raises(argparse.ArgumentTypeError, match=r"--size: expected WIDTHxHEIGHT like 200x60, got 'wide'"):
        bench._size("wide")
    with pytest.raises(argparse.ArgumentTypeError, match="--size: width and height must be >= 1, got '0x5'"):
        bench._size("0x5")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--seconds", "0"])
    assert exit_info.value.code == 2
    assert bench.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert bench.percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
