"""How much host memory one NumPy-executor lease may hold (simulated nodes, ``--executor numpy``).

A NumPy worker keeps a lease's arrays in the host's RAM, while the slices' quotas come from the
GPU sizes the backend reports (a simulated GPU has 80 GiB): an authenticated client of a 1/2
slice could otherwise allocate 40 GiB of host memory. So a NumPy lease's quota is the smaller of
its slices' quota and :class:`HostMemoryCap` ``cap_bytes``: ``gpuctld --numpy-quota-cap-bytes``,
else :data:`DEFAULT_FRACTION` of MemAvailable (/proc/meminfo) when the daemon started. The
grant's answer says when a quota was cut (``quota_cap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Share of MemAvailable (at daemon start) one NumPy lease may hold when no cap is given.
DEFAULT_FRACTION = 0.5
#: Cap used where /proc/meminfo cannot be read (bytes).
FALLBACK_CAP_BYTES = 1 << 30
#: Smallest cap accepted by --numpy-quota-cap-bytes (bytes).
MIN_CAP_BYTES = 1 << 20


def mem_available_bytes(path: str = "/proc/meminfo") -> int | None:
    """MemAvailable of /proc/meminfo in bytes (the kernel's estimate of memory that can be
    allocated without swapping); None when the file or the line is missing or unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    if len(parts) >= 2 and parts[1].isdigit():
                        return int(parts[1]) * 1024  # the kernel writes kB (KiB)
                    return None
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class HostMemoryCap:
    """The most bytes of quota one NumPy-executor lease gets. `source` says where the figure
    came from, in words (shown in the grant's answer and the daemon's log)."""

    cap_bytes: int
    source: str

    @classmethod
    def from_options(cls, cap_bytes: int | None, meminfo_path: str = "/proc/meminfo") -> "HostMemoryCap":
        """`cap_bytes` (``--numpy-quota-cap-bytes``) when given, else DEFAULT_FRACTION of
        MemAvailable now, else FALLBACK_CAP_BYTES when /proc/meminfo says nothing."""
        if cap_bytes is not None:
            return cls(cap_bytes, "gpuctld --numpy-quota-cap-bytes")
        available = mem_available_bytes(meminfo_path)
        if available is None:
            return cls(FALLBACK_CAP_BYTES, f"{meminfo_path} unreadable: fallback of {FALLBACK_CAP_BYTES} bytes")
        return cls(max(MIN_CAP_BYTES, int(available * DEFAULT_FRACTION)),
                   f"{DEFAULT_FRACTION:g} x MemAvailable ({available} bytes) when gpuctld started")

    def apply(self, quota_bytes: int) -> tuple[int, dict[str, Any] | None]:
        """The quota a NumPy lease gets for slices worth `quota_bytes`, and the note for the
        grant's answer (None when nothing was cut): ``{"requested_bytes", "cap_bytes", "reason"}``."""
        if quota_bytes <= self.cap_bytes:
            return quota_bytes, None
        return self.cap_bytes, {
            "requested_bytes": quota_bytes, "cap_bytes": self.cap_bytes,
            "reason": (f"the NumPy executor holds arrays in host memory: quota cut from {quota_bytes} to "
                       f"{self.cap_bytes} bytes ({self.source})"),
        }
