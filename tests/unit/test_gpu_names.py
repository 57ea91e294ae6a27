"""The compact GPU names of the fleet table (gpuctl.format.compact_gpu_name), on the names
nvidia-smi / NVML print for real GPUs and MIG devices (issue 9 item 11)."""

from __future__ import annotations

import pytest

from gpuctl import format as fmt


@pytest.mark.parametrize(
    "nvml_name, compact",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("GeForce GTX 1080 Ti", "GTX 1080 Ti"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("Quadro RTX 8000", "Quadro RTX 8000"),
        ("Tesla T4", "Tesla T4"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-SXM4-40GB MIG 1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "H100 80GB HBM3 MIG 3g.40gb"),
    ],
)
def test_compact_gpu_name_drops_brand_words_and_keeps_the_model(nvml_name, compact):
    assert fmt.compact_gpu_name(nvml_name) == compact


@pytest.mark.parametrize("name, compact", [("NVIDIA", "NVIDIA"), ("NVIDIA ", "NVIDIA"), ("  L4 ", "L4"),
                                           ("Generation", "Generation"), (" ", "N/A")])
def test_a_name_that_would_become_empty_stays_whole(name, compact):
    assert fmt.compact_gpu_name(name) == compact


@pytest.mark.parametrize("name", [None, "", "   ", 7, ["H100"], {"a": 1}, "\t\n"])
def test_a_missing_or_not_text_name_is_na_never_a_crash(name):
    assert fmt.compact_gpu_name(name) == "N/A"
    assert fmt.safe_gpu_name(name) == "N/A"


@pytest.mark.parametrize("name, compact", [
    ("NVIDIA H100\x1b[2J\x1b]0;pwned\x07", "H100?[2J?]0;pwned?"),  # ESC and BEL never reach the terminal
    ("NVIDIA A100\r\nL4", "A100??L4"),
    ("NVIDIA H100\u202eevil", "H100?evil"),  # bidi override
    ("NVIDIA [red]x[/]", "[red]x[/]"),  # markup stays text (the table appends it unparsed)
    ("NVIDIA 加速器 🚀", "加速器 🚀"),
])
def test_unprintable_characters_are_replaced(name, compact):
    assert fmt.compact_gpu_name(name) == compact
    assert all(ch.isprintable() for ch in fmt.safe_gpu_name(name))


def test_a_long_name_is_cut_with_an_ellipsis():
    name = "NVIDIA " + "X" * 200
    assert fmt.compact_gpu_name(name) == "X" * (fmt.GPU_NAME_MAX_CHARS - 1) + "…"
    assert fmt.safe_gpu_name("Y" * 500) == "Y" * (fmt.GPU_NAME_FULL_MAX_CHARS - 1) + "…"
