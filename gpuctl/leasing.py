"""Which slices a lease gets: the one rule shared by gpuctld (grant) and the CLI (node choice).

A lease holds slices of one department on one GPU (one data-path worker per lease, which sees
only that GPU). The request is either a number of slices or an amount in GPU-equivalents:

- ``slices=N``: N idle slices of the department on one GPU; the smallest ones of that GPU.
- ``gpus=X`` (0 < X <= 1): the idle slices of one GPU whose fractions add up to at least X with
  the smallest total (then the fewest slices), e.g. X = 0.25 takes a 1/4 slice if one is idle,
  else a 1/2, else a whole GPU.

Among GPUs (and, in the CLI, among nodes) the best fit wins: the smallest total fraction, then
the fewest slices, then the GPU with the least idle capacity of the department left (big free
blocks are kept for big requests), then the lowest GPU index. Pure functions, no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gpuctl.model import Slice

#: Tolerance when comparing sums of fractions (1/8 steps are exact in binary, but be safe).
FRACTION_EPS = 1e-9
#: Most slices one GPU can have (1/8 slices).
MAX_SLICES_PER_GPU = 8


@dataclass(frozen=True)
class Pick:
    """A candidate lease: the slices chosen on one GPU and its sort key (smaller is better).

    gpu_uuid, gpu_index: the GPU. slices: the chosen slices (slice-number order). key: (total
    fraction, slice count, idle GPU-equivalents of the department on that GPU, GPU index).
    """

    gpu_uuid: str
    gpu_index: int
    slices: tuple[Slice, ...]
    key: tuple[float, int, float, int]

    @property
    def gpu_equivalents(self) -> float:
        """Sum of the chosen slices' fractions (GPU-equivalents)."""
        return sum(s.fraction for s in self.slices)


def validate_amount(slices: int | None, gpus: float | None) -> None:
    """Check a lease amount: exactly one of `slices` (1..8) and `gpus` (0 < X <= 1).

    Raises ValueError with a message naming the field ("slices" / "gpus").
    """
    if (slices is None) == (gpus is None):
        raise ValueError("give exactly one of slices (a count) and gpus (GPU-equivalents)")
    if slices is not None and not 1 <= slices <= MAX_SLICES_PER_GPU:
        raise ValueError(f"slices must be 1..{MAX_SLICES_PER_GPU} (a lease holds slices of one GPU), got {slices}")
    if gpus is not None and not 0 < gpus <= 1 + FRACTION_EPS:
        raise ValueError(f"gpus must be > 0 and <= 1 (a lease holds slices of one GPU), got {gpus:g}")


def idle_slices(slices: list[Slice], department: str, usable_gpus: set[str] | None = None) -> list[Slice]:
    """The slices of `department` that no lease holds and that may be leased (see
    Slice.not_leasable_reason), and, when `usable_gpus` is given, whose GPU is in it (a GPU the
    backend no longer reports cannot run a worker)."""
    return [s for s in slices
            if s.department == department and s.lease_id is None and s.not_leasable_reason is None
            and (usable_gpus is None or s.gpu_uuid in usable_gpus)]


def _slice_number(s: Slice) -> int:
    tail = s.id.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def pick_on_gpu(idle: list[Slice], *, slices: int | None = None, gpus: float | None = None) -> tuple[Slice, ...] | None:
    """The best set of slices among `idle` (all of one GPU) for the amount, or None if they do
    not cover it. See the module docstring for the rule."""
    ordered = sorted(idle, key=_slice_number)
    if slices is not None:
        if len(ordered) < slices:
            return None
        chosen = sorted(ordered, key=lambda s: (s.fraction, _slice_number(s)))[:slices]
        return tuple(sorted(chosen, key=_slice_number))
    assert gpus is not None
    best: tuple[float, int, tuple[Slice, ...]] | None = None
    for n in range(1, len(ordered) + 1):
        for combo in itertools.combinations(ordered, n):
            total = sum(s.fraction for s in combo)
            if total + FRACTION_EPS < gpus:
                continue
            cand = (round(total, 9), n, combo)
            if best is None or cand[:2] < best[:2]:
                best = cand
    return best[2] if best else None


def best_pick(slices: list[Slice], department: str, gpu_index: dict[str, int], *,
              count: int | None = None, gpus: float | None = None) -> Pick | None:
    """The best lease for `department` among `slices` (one node's), or None when no single GPU
    has idle slices of it covering the amount.

    gpu_index: GPU UUID -> NVML index, for the GPUs that can run a worker (others are skipped).
    count / gpus: the amount (see :func:`validate_amount`, which this calls: ValueError).
    """
    validate_amount(count, gpus)
    idle = idle_slices(slices, department, set(gpu_index))
    by_gpu: dict[str, list[Slice]] = {}
    for s in idle:
        by_gpu.setdefault(s.gpu_uuid, []).append(s)
    best: Pick | None = None
    for uuid, group in by_gpu.items():
        chosen = pick_on_gpu(group, slices=count, gpus=gpus)
        if chosen is None:
            continue
        key = (round(sum(s.fraction for s in chosen), 9), len(chosen),
               round(sum(s.fraction for s in group), 9), gpu_index[uuid])
        if best is None or key < best.key:
            best = Pick(uuid, gpu_index[uuid], chosen, key)
    return best


def describe_amount(count: int | None, gpus: float | None) -> str:
    """Words for an amount: "2 slice(s)" or "0.25 GPU-equivalents"."""
    return f"{count} slice(s)" if count is not None else f"{gpus:g} GPU-equivalents"


def describe_idle(slices: list[Slice], department: str, gpu_index: dict[str, int]) -> str:
    """Idle capacity of `department` per GPU, for refusals: "GPU 0: 1, GPU 6: 1/4+1/4" or "none"."""
    by_gpu: dict[int, list[float]] = {}
    for s in idle_slices(slices, department, set(gpu_index)):
        by_gpu.setdefault(gpu_index[s.gpu_uuid], []).append(s.fraction)
    if not by_gpu:
        return "none"
    return ", ".join(f"GPU {i}: " + "+".join(_frac(f) for f in sorted(fs, reverse=True))
                     for i, fs in sorted(by_gpu.items()))


def _frac(f: float) -> str:
    if abs(f - 1) < FRACTION_EPS:
        return "1"
    for d in (2, 4, 8):
        if abs(f * d - round(f * d)) < FRACTION_EPS:
            return f"{round(f * d)}/{d}"
    return f"{f:g}"
