"""Plain-text formatting of telemetry for the console and the CLI (no textual import; pure functions).

Bytes in, human units out (binary: KiB, MiB, GiB = 1024**n bytes); N/A (None) is always shown as
"N/A", never as 0.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable, Sequence

NA = "N/A"

#: Sparkline glyphs, lowest to highest (8 levels).
SPARK_GLYPHS = "▁▂▃▄▅▆▇█"
#: Partial-block glyphs for bars (1/8 .. 7/8 of a cell).
_PARTIAL = " ▏▎▍▌▋▊▉"

_FRACTION_GLYPHS = {1.0: "1", 0.5: "½", 0.25: "¼", 0.125: "⅛"}

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4


def is_na(value: float | int | None) -> bool:
    """True when a figure is N/A: None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def na(value: object, fmt: str = "{}") -> str:
    """`value` through `fmt` ("{:.0f} W"), or "N/A" when it is N/A (None or NaN): the one N/A rule
    of the CLI's tables and the console's cells (never a made-up zero)."""
    return NA if is_na(value) else fmt.format(value)  # type: ignore[arg-type]


def fraction_label(fraction: float) -> str:
    """A slice fraction in ASCII for tables and messages: 1 -> "1", 0.5 -> "1/2", 0.25 -> "1/4",
    0.125 -> "1/8"; other values as "%g" ("0.3")."""
    if abs(fraction - 1) < 1e-9:
        return "1"
    for d in (2, 4, 8):
        if abs(fraction * d - round(fraction * d)) < 1e-9:
            return f"{round(fraction * d)}/{d}"
    return f"{fraction:g}"


#: Brand words dropped from the front of a GPU name by compact_gpu_name (in this order).
GPU_NAME_BRANDS = ("NVIDIA ", "GeForce ")
#: Words dropped from the end of a GPU name by compact_gpu_name.
GPU_NAME_TAILS = (" Generation",)


#: Most characters of a compact GPU name; a longer one is cut and ends in "…" (NVML's names fit in
#: 96 bytes, NVML_DEVICE_NAME_V2_BUFFER_SIZE; a daemon may send anything).
GPU_NAME_MAX_CHARS = 64
#: Most characters of a whole GPU name shown (safe_gpu_name).
GPU_NAME_FULL_MAX_CHARS = 200
#: What replaces each character of a GPU name that is not printable (str.isprintable: control
#: characters such as ESC, bidi and zero-width controls): one cell, never a terminal escape.
GPU_NAME_UNPRINTABLE = "?"


def printable_text(text: str, max_chars: int) -> str:
    """`text` safe to print on a terminal: every character that is not printable (str.isprintable:
    control characters such as ESC and CR, bidi and zero-width controls) replaced by
    GPU_NAME_UNPRINTABLE, cut to `max_chars` characters (the last one then "…")."""
    out = "".join(ch if ch.isprintable() else GPU_NAME_UNPRINTABLE for ch in text)
    return out if len(out) <= max_chars else out[: max_chars - 1] + "…"


def safe_gpu_name(name: object) -> str:
    """A GPU's whole name as a node's daemon reported it, safe to print (the CLI's status table,
    the node screen): "N/A" when not a string, empty or blank; else stripped, through
    printable_text (at most GPU_NAME_FULL_MAX_CHARS characters)."""
    if not isinstance(name, str) or not name.strip():
        return NA
    return printable_text(name.strip(), GPU_NAME_FULL_MAX_CHARS)


def compact_gpu_name(name: object) -> str:
    """The GPU name NVML reports (nvmlDeviceGetName, what nvidia-smi prints), short enough for a
    table column and still naming the model: the brand words "NVIDIA " and "GeForce " are dropped
    from the front, and " Generation" from the end; everything else stays (memory size, form
    factor, a MIG profile). "NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3", "NVIDIA GeForce RTX 4090"
    -> "RTX 4090", "NVIDIA RTX 6000 Ada Generation" -> "RTX 6000 Ada", "NVIDIA A100-SXM4-40GB MIG
    1g.5gb" -> "A100-SXM4-40GB MIG 1g.5gb", "Tesla T4" -> "Tesla T4". Surrounding blanks are
    stripped; a name that would become empty is returned stripped but whole. The name comes from a
    node's daemon, so it is made safe to print: not a string, empty or blank -> "N/A"; every
    character that is not printable (ESC, CR, bidi controls) -> GPU_NAME_UNPRINTABLE; more than
    GPU_NAME_MAX_CHARS characters -> cut, ending in "…". Rich markup ("[red]") stays plain text
    (the table appends it unparsed)."""
    if not isinstance(name, str):  # None, a number, a list: from a daemon's JSON
        return NA
    return _compact_gpu_name(name)


@functools.lru_cache(maxsize=1024)  # a fleet has few distinct names; called per GPU per poll
def _compact_gpu_name(name: str) -> str:
    out = safe_gpu_name(name)
    if out == NA:
        return out
    for brand in GPU_NAME_BRANDS:
        if out.startswith(brand) and out[len(brand):].strip():
            out = out[len(brand):].lstrip()
    for tail in GPU_NAME_TAILS:
        if out.endswith(tail) and out[: -len(tail)].strip():
            out = out[: -len(tail)].rstrip()
    return printable_text(out, GPU_NAME_MAX_CHARS)


def human_bytes(n: int | None) -> str:
    """`n` bytes as "512 B", "1.5 KiB", "615 MiB", "79.4 GiB", "1.2 TiB" (binary units); "N/A"
    for None. Below 10 units one decimal is kept, above it none for MiB/KiB."""
    if is_na(n):
        return NA
    assert n is not None
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            value = n / size
            if unit in ("GiB", "TiB") or value < 10:
                return f"{value:.1f} {unit}"
            return f"{value:.0f} {unit}"
    return f"{n} B"


def memory_label(used_bytes: int | None, total_bytes: int | None) -> str:
    """"used/total unit" with one unit chosen from the total: "41.2/80.0 GiB", "615/1024 MiB";
    "N/A/80.0 GiB" style halves are written "N/A / 80.0 GiB"; both missing: "N/A"."""
    if is_na(used_bytes) and is_na(total_bytes):
        return NA
    if is_na(total_bytes):
        return f"{human_bytes(used_bytes)} / {NA}"
    assert total_bytes is not None
    unit, size = ("GiB", GIB) if total_bytes >= GIB else ("MiB", MIB)
    total = f"{total_bytes / size:.1f}" if unit == "GiB" else f"{total_bytes / size:.0f}"
    if is_na(used_bytes):
        return f"{NA} / {total} {unit}"
    assert used_bytes is not None
    used = f"{used_bytes / size:.1f}" if unit == "GiB" else f"{used_bytes / size:.0f}"
    return f"{used}/{total} {unit}"


def percent(value: float | None) -> str:
    """"93%" (rounded), "N/A" for None/NaN."""
    return na(value, "{:.0f}%")


def temperature(value_c: float | None) -> str:
    """"71°C", "N/A"."""
    return na(value_c, "{:.0f}°C")


def power(value_w: float | None) -> str:
    """"640 W", "N/A"."""
    return na(value_w, "{:.0f} W")


def ops_rate(ops_per_s: float | None) -> str:
    """A rate of array operations per second, short: "0 op/s", "850 op/s", "1.2k op/s",
    "12k op/s", "3.4M op/s"; "N/A" for None/NaN."""
    if is_na(ops_per_s):
        return NA
    assert ops_per_s is not None
    value, suffix = float(ops_per_s), ""
    for next_suffix in ("k", "M", "G"):
        if round(value) < 1000:
            break
        value, suffix = value / 1000.0, next_suffix
    if not suffix:
        return f"{value:.0f} op/s"
    return f"{value:.1f}{suffix} op/s" if round(value, 1) < 10 else f"{value:.0f}{suffix} op/s"


def bar(fraction: float, width: int) -> str:
    """A bar `width` cells wide filled to `fraction` (clamped to 0..1) with eighth-cell
    resolution; the unfilled part is spaces."""
    if width <= 0:
        return ""
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_PARTIAL[part] if part else "")
    return text.ljust(width)


def sparkline(values: Sequence[float | None], width: int, maximum: float = 100.0) -> str:
    """The last `width` values as ▁..█ glyphs scaled to 0..`maximum`, right-aligned (padded on the
    left with spaces); an N/A value (None, NaN) is a space."""
    if width <= 0:
        return ""
    n = len(values)
    tail = [values[i] for i in range(max(0, n - width), n)]
    scale = 8.0 / maximum if maximum > 0 else 0.0
    glyphs = SPARK_GLYPHS
    out = "".join(
        " " if v is None or v != v else glyphs[min(7, max(0, int(v * scale)))] for v in tail
    )
    return out.rjust(width)


def fraction_glyph(fraction: float) -> str:
    """"1", "½", "¼", "⅛" for the allowed slice fractions, else e.g. "0.3"."""
    return _FRACTION_GLYPHS.get(fraction, f"{fraction:g}")


def department_shares(slices: Iterable[tuple[str, float]]) -> list[tuple[str, str]]:
    """(department, fraction) pairs grouped by department in order of first appearance, as
    (department, label): [("research", "½"), ("training", "¼×2")]; mixed fractions of one
    department are summed ("¾")."""
    order: dict[str, list[float]] = {}
    for dept, fraction in slices:
        order.setdefault(dept, []).append(fraction)
    out = []
    for dept, fractions in order.items():
        if len(set(fractions)) == 1 and len(fractions) > 1:
            out.append((dept, f"{fraction_glyph(fractions[0])}×{len(fractions)}"))
        else:
            total = sum(fractions)
            out.append((dept, {0.75: "¾", 0.375: "⅜"}.get(total, fraction_glyph(total))))
    return out


def utc_time(unix_s: float) -> str:
    """"HH:MM:SS UTC" of a Unix time (seconds); UTC so it reads the same on every machine."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(unix_s))
